"""The watcher's commit scan against a plain JSON parser, on generated commit files.

The scan takes shortcuts (a split at add-line boundaries, msgspec for plain add/remove bodies,
orjson for other bodies, whole-line decoding for the rest). Whatever the lines, it must publish
what a JSON parser reads from them, summarize them as that parser's values say, and stop at the
first line such a parser refuses, naming it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from deltamirror.core.errors import CorruptLogError
from deltamirror.core.storage import TableStorage
from deltamirror.core.timestamps import CommitTimestamp, TimestampSource
from deltamirror.producer import watcher as watcher_module
from deltamirror.producer.watcher import CommitWork, scan_version

# --- generated lines ----------------------------------------------------------------------------

_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
_PARTITIONS = st.one_of(
    st.dictionaries(st.sampled_from(["d", "p", "région"]), st.one_of(st.none(), _TEXT), max_size=2),
    st.just({"d": ["not", "a", "string"]}),
    st.just({"d": {"nested": 1}}),
    st.just([1, 2]),
    st.none(),
)
_SIZES = st.one_of(
    st.integers(-(2**63), 2**63 - 1),  # a long, as Delta has it
    st.just(True),
    st.just(1.5),
    st.just("5"),
    st.none(),
)


def _stats(text: str) -> str:
    return json.dumps({"numRecords": 3, "minValues": {"s": text}, "maxValues": {"s": text + "z"}})


@st.composite
def _file_body(draw: st.DrawFn) -> dict[str, Any]:
    body: dict[str, Any] = {"path": draw(_TEXT) or "f"}
    if draw(st.booleans()):
        body["partitionValues"] = draw(_PARTITIONS)
    if draw(st.booleans()):
        body["size"] = draw(_SIZES)
    if draw(st.booleans()):
        body["stats"] = _stats(draw(_TEXT))
    body["dataChange"] = draw(st.booleans())
    return body


def _dump(value: Any, spaced: bool) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": ") if spaced else (",", ":"))


@st.composite
def _line(draw: st.DrawFn) -> bytes:
    kind = draw(
        st.sampled_from(
            ["add"] * 6 + ["remove"] * 3 + ["cdc", "commitInfo", "txn", "two", "blank", "odd", "corrupt"]
        )
    )
    spaced = draw(st.integers(0, 4)) == 0
    if kind in ("add", "remove", "cdc"):
        text = _dump({kind: draw(_file_body())}, spaced)
    elif kind == "commitInfo":
        text = _dump(
            {"commitInfo": {"operation": draw(_TEXT), "readVersion": draw(st.integers(0, 9))}}, spaced
        )
    elif kind == "txn":
        text = _dump({"txn": {"appId": draw(_TEXT), "version": draw(st.integers(0, 9))}}, spaced)
    elif kind == "two":  # two actions on one line, or the same key twice
        first, second = draw(_file_body()), draw(_file_body())
        if draw(st.booleans()):
            text = '{"add":' + _dump(first, spaced) + ',"remove":' + _dump(second, spaced) + "}"
        else:
            text = '{"add":' + _dump(first, spaced) + ',"add":' + _dump(second, spaced) + "}"
    elif kind == "blank":
        text = draw(st.sampled_from(["", " ", "\t", "  "]))
    elif kind == "odd":  # valid JSON a fast path must not misread
        body = _dump(draw(_file_body()), spaced)
        text = draw(
            st.sampled_from(
                [
                    '  {"add":' + body + "}  ",
                    '{"add" : ' + body + "}",
                    '{"add":' + body[:-1] + ',"size":NaN}}',
                    '{"add":' + body[:-1] + ',"modificationTime":1e999}}',
                    '{"add":' + body[:-1] + ',"x":' + "[" * 300 + "]" * 300 + "}}",
                    '{"remove":' + body + " }",
                    '{"add":' + body + "}\r",
                ]
            )
        )
    else:  # what a JSON parser refuses
        body = _dump(draw(_file_body()), spaced)
        return draw(
            st.sampled_from(
                [
                    ('{"add":' + body + "}]").encode(),
                    ('{"add":' + body + "}x").encode(),
                    ('{"add":' + body[:-1] + ',"s":"\xff"}}').encode("latin-1", errors="replace")
                    if body.isascii()
                    else b'{"add":{"s":"\xff"}}',
                    b'{"add":{"s":"\xc3\x28"}}',
                    ('{"add":' + body[:-1] + ",}}").encode(),
                    b"[1, 2]",
                    b'"just a string"',
                    b"{}",
                    ('{"add":' + body).encode(),
                ]
            )
        )
    return text.encode()


@st.composite
def _commit(draw: st.DrawFn) -> bytes:
    lines = draw(st.lists(_line(), min_size=1, max_size=40))
    ending = draw(st.sampled_from([b"\n", b"\r\n"]))
    data = ending.join(lines)
    return data + ending if draw(st.booleans()) else data


# --- the reference: a plain JSON parser, line by line -------------------------------------------


def _reference(lines: list[bytes]) -> tuple[list[tuple[str, Any]], dict[str, Any]] | int:
    """(actions, summary) as ``json.loads`` reads each line, or the number of the first line it refuses."""
    actions: list[tuple[str, Any]] = []
    summary: dict[str, Any] = {"adds": 0, "removes": 0, "cdc": 0, "bytes_added": 0, "bytes_removed": 0}
    partitions: dict[str, Any] = {}
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except ValueError:
            return lineno
        if not isinstance(value, dict) or not value:
            return lineno
        for name, body in value.items():
            actions.append((name, body))
            if name not in ("add", "remove", "cdc"):
                continue
            summary[{"add": "adds", "remove": "removes", "cdc": "cdc"}[name]] += 1
            if not isinstance(body, dict):
                continue
            size = body.get("size")
            if type(size) is int and size >= 0 and name != "cdc":
                summary["bytes_added" if name == "add" else "bytes_removed"] += size
            values = body.get("partitionValues")
            if isinstance(values, dict) and values:  # values other than strings are listed as JSON text
                listed = {
                    k: v if v is None or isinstance(v, str) else json.dumps(v, separators=(",", ":"))
                    for k, v in values.items()
                }
                partitions.setdefault(json.dumps(sorted(listed.items())), listed)
    summary["partitions"] = list(partitions.values())
    return actions, summary


def _same(a: Any, b: Any) -> bool:
    """Equal as JSON values, NaN equal to NaN."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


# --- the property ----------------------------------------------------------------------------


@pytest.mark.parametrize("streamed", [False, True], ids=["read-whole", "streamed"])
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=_commit())
def test_the_scan_reads_what_a_json_parser_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, streamed: bool, data: bytes
) -> None:
    if streamed:  # large-commit path, in buffers that cut lines anywhere
        monkeypatch.setattr(watcher_module, "SMALL_COMMIT_BYTES", 0)
        monkeypatch.setattr(watcher_module, "_STREAM_CHUNK", 97)
    log = tmp_path / "_delta_log"
    log.mkdir(exist_ok=True)
    (log / f"{1:020d}.json").write_bytes(data)
    storage = TableStorage(str(tmp_path))
    info = storage.info(storage.log_file(f"{1:020d}.json"))
    # a file read whole is split as bytes.splitlines() does; a streamed one at newlines only
    lines = data.split(b"\n")[: -1 if data.endswith(b"\n") else None] if streamed else data.splitlines()
    expected = _reference(lines)
    if isinstance(expected, int):
        with pytest.raises(CorruptLogError) as caught:
            scan_version(storage, 1, info)
        assert caught.value.line == expected
        return
    if not expected[0]:  # only blank lines: an empty commit, refused
        with pytest.raises(CorruptLogError):
            scan_version(storage, 1, info)
        return
    scan = scan_version(storage, 1, info)
    work = CommitWork(storage, "id", 1, CommitTimestamp(1, 0, TimestampSource.FILE_TIME), scan)
    published = [(name, body) for batch in work.batches(5) for name, body in batch]
    want_actions, want_summary = expected
    assert [name for name, _ in published] == [name for name, _ in want_actions]
    for (_, body), (_, want) in zip(published, want_actions, strict=True):
        got = json.loads(body) if isinstance(body, bytes) else body  # the log's bytes: one JSON value
        assert _same(got, want)
    summary = work.summary()
    assert summary.action_count == len(want_actions) == scan.count
    assert (summary.adds, summary.removes, summary.cdc_files) == (
        want_summary["adds"],
        want_summary["removes"],
        want_summary["cdc"],
    )
    assert (summary.bytes_added, summary.bytes_removed) == (
        want_summary["bytes_added"],
        want_summary["bytes_removed"],
    )
    assert _same(summary.partitions_touched, want_summary["partitions"])


def _published(storage: TableStorage, info: Any) -> list[tuple[str, Any]] | type[CorruptLogError]:
    try:
        scan = scan_version(storage, 1, info)
    except CorruptLogError:
        return CorruptLogError
    work = CommitWork(storage, "id", 1, CommitTimestamp(1, 0, TimestampSource.FILE_TIME), scan)
    return [(name, body) for batch in work.batches(7) for name, body in batch]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=_commit())
@example(data=b'{"add":{"path":"a"}}\n{"add": {"path": "b"} }\n{"add":{"path":"c"}}\n')
def test_a_commit_read_whole_or_streamed_publishes_the_same_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, data: bytes
) -> None:
    """Whichever path a commit takes (its size decides), the records are byte for byte the same:
    a restart may finish a version on the other path. (A lone CR ends a line only when the file is
    read whole, so such files are left out.)"""
    data = data.replace(b"\r", b"")
    log = tmp_path / "_delta_log"
    log.mkdir(exist_ok=True)
    (log / f"{1:020d}.json").write_bytes(data)
    storage = TableStorage(str(tmp_path))
    info = storage.info(storage.log_file(f"{1:020d}.json"))
    whole = _published(storage, info)
    monkeypatch.setattr(watcher_module, "SMALL_COMMIT_BYTES", 0)
    monkeypatch.setattr(watcher_module, "_STREAM_CHUNK", 7)  # about a line per buffer: taken line by line
    streamed = _published(storage, info)
    if whole is CorruptLogError or streamed is CorruptLogError:
        assert whole is streamed
        return
    assert isinstance(whole, list) and isinstance(streamed, list)
    assert [name for name, _ in whole] == [name for name, _ in streamed]
    for (_, a), (_, b) in zip(whole, streamed, strict=True):
        assert type(a) is type(b)
        assert a == b if isinstance(a, bytes) else _same(a, b)  # decoded lines: NaN equals NaN
