"""The watcher's commit scan against the protocol, on generated commit files.

The scan takes shortcuts (a split at add-line boundaries, runs of plain add/remove bodies checked
together, whole-line decoding for the rest, streaming in buffers). Whatever the lines, it must
publish exactly what a JSON parser reads from the valid ones, summarize them as their values say,
and stop at the first line that is not a valid action, naming it. Each generated line knows
whether it is valid: the expectations come from the generator, not from the code under test.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from deltamirror.core import actions as actions_module
from deltamirror.core.errors import CorruptLogError
from deltamirror.core.storage import TableStorage
from deltamirror.core.timestamps import CommitTimestamp, TimestampSource
from deltamirror.producer.tailing import work as watcher_module
from deltamirror.producer.tailing.work import CommitWork, scan_version

# --- generated lines: (text, valid) -------------------------------------------------------------

_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
_PARTITIONS = st.dictionaries(st.sampled_from(["d", "p", "région"]), st.one_of(st.none(), _TEXT), max_size=2)


def _stats(text: str) -> str:
    return json.dumps({"numRecords": 3, "minValues": {"s": text}, "maxValues": {"s": text + "z"}})


@st.composite
def _file_body(draw: st.DrawFn, kind: str) -> dict[str, Any]:
    body: dict[str, Any] = {"path": draw(_TEXT) or "f", "dataChange": draw(st.booleans())}
    if kind != "remove" or draw(st.booleans()):
        body["partitionValues"] = draw(_PARTITIONS)
    if kind != "remove" or draw(st.booleans()):
        body["size"] = draw(st.integers(0, 2**63 - 1))
    if kind == "add":
        body["modificationTime"] = draw(st.integers(-(2**63), 2**63 - 1))
    if kind != "cdc" and draw(st.booleans()):
        body["stats"] = _stats(draw(_TEXT))
    return body


def _dump(value: Any, spaced: bool) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": ") if spaced else (",", ":"))


#: ways to break a valid file action; each makes the line invalid
_BREAKS = [
    ("size", True),
    ("size", 1.5),
    ("size", "5"),
    ("size", -1),
    ("size", 2**64),
    ("path", ""),
    ("path", None),
    ("partitionValues", [1, 2]),
    ("partitionValues", {"d": ["x"]}),
    ("partitionValues", {"d": 1}),
    ("dataChange", "yes"),
]


@st.composite
def _line(draw: st.DrawFn) -> tuple[bytes, bool]:
    kind = draw(
        st.sampled_from(
            ["add"] * 6
            + ["remove"] * 3
            + ["cdc", "commitInfo", "txn", "unknown", "blank", "odd", "broken", "invalid"]
        )
    )
    spaced = draw(st.integers(0, 4)) == 0
    if kind in ("add", "remove", "cdc"):
        return _dump({kind: draw(_file_body(kind))}, spaced).encode(), True
    if kind == "commitInfo":
        info = {"operation": draw(_TEXT), "readVersion": draw(st.integers(0, 9))}
        return _dump({"commitInfo": info}, spaced).encode(), True
    if kind == "txn":
        return _dump(
            {"txn": {"appId": draw(_TEXT), "version": draw(st.integers(0, 9))}}, spaced
        ).encode(), True
    if kind == "unknown":  # a newer writer's action, alone or beside a known one
        extra = {"x": draw(st.integers(-(2**63), 2**63 - 1)), "y": [draw(_TEXT)]}
        if draw(st.booleans()):
            return _dump({"futureAction": extra}, spaced).encode(), True
        body = _dump(draw(_file_body("add")), spaced)
        return ('{"add":' + body + ',"futureAction":' + _dump(extra, spaced) + "}").encode(), True
    if kind == "blank":
        return draw(st.sampled_from(["", " ", "\t", "  "])).encode(), True
    if kind == "odd":  # valid JSON a fast path must not misread
        body = _dump(draw(_file_body("add")), spaced)
        text = draw(
            st.sampled_from(
                [
                    '  {"add":' + body + "}  ",
                    '{"add" : ' + body + "}",
                    '{"add":' + body[:-1] + ',"x":' + "[" * 150 + "]" * 150 + "}}",
                    '{"add":' + body[:-1] + ',"newField":1e300}}',
                    '{"add":' + body + " }",
                    '{"\\u0061dd":' + body + "}",
                ]
            )
        )
        return text.encode(), True
    if kind == "invalid":  # well-formed JSON, not a valid action
        action = draw(st.sampled_from(["add", "remove", "cdc"]))
        body = draw(_file_body(action))
        field, value = draw(st.sampled_from(_BREAKS))
        if field not in body and action == "remove":
            field, value = "path", ""
        body[field] = value
        return _dump({action: body}, spaced).encode(), False
    body = _dump(draw(_file_body("add")), spaced)  # what a strict JSON parser refuses
    text = draw(
        st.sampled_from(
            [
                ('{"add":' + body + "}]").encode(),
                ('{"add":' + body + "}x").encode(),
                ('{"add":' + body[:-1] + ',"s":"\xff"}}').encode("latin-1", errors="replace")
                if body.isascii()
                else b'{"add":{"s":"\xff"}}',
                b'{"add":{"s":"\xc3\x28"}}',
                ('{"add":' + body[:-1] + ",}}").encode(),
                ('{"add":' + body[:-1] + ',"size":NaN}}').encode(),
                ('{"add":' + body[:-1] + ',"x":Infinity}}').encode(),
                ('{"add":' + body[:-1] + ',"x":"\\ud800"}}').encode(),
                ('{"add":' + body[:-1] + ',"x":' + "[" * 250 + "]" * 250 + "}}").encode(),
                ('{"add":' + body + ',"remove":' + body + "}").encode(),
                ('{"add":' + body + ',"add":' + body + "}").encode(),
                b'{"add":null}',
                b"[1, 2]",
                b'"just a string"',
                b"{}",
                ('{"add":' + body).encode(),
            ]
        )
    )
    return text, False


@st.composite
def _commit(draw: st.DrawFn) -> tuple[bytes, list[tuple[bytes, bool]]]:
    lines = draw(st.lists(_line(), min_size=1, max_size=40))
    ending = draw(st.sampled_from([b"\n", b"\r\n"]))
    data = ending.join(text for text, _ in lines)
    return (data + ending if draw(st.booleans()) else data), lines


# --- the expectation, from what the generator knows ----------------------------------------------


def _expected(lines: list[tuple[bytes, bool]]) -> tuple[list[tuple[str, Any]], dict[str, Any]] | int:
    """(actions, summary) of the valid lines, or the number of the first invalid line."""
    actions: list[tuple[str, Any]] = []
    summary: dict[str, Any] = {"adds": 0, "removes": 0, "cdc": 0, "bytes_added": 0, "bytes_removed": 0}
    partitions: dict[str, Any] = {}
    for lineno, (text, valid) in enumerate(lines, 1):
        if not valid:
            return lineno
        if not text.strip():
            continue
        for name, body in json.loads(text).items():
            actions.append((name, body))
            if name not in ("add", "remove", "cdc"):
                continue
            summary[{"add": "adds", "remove": "removes", "cdc": "cdc"}[name]] += 1
            if name != "cdc" and "size" in body:
                summary["bytes_added" if name == "add" else "bytes_removed"] += body["size"]
            values = body.get("partitionValues")
            if values:
                partitions.setdefault(json.dumps(sorted(values.items())), values)
    summary["partitions"] = list(partitions.values())
    return actions, summary


def _scan_file(tmp_path: Path, data: bytes) -> tuple[TableStorage, Any]:
    log = tmp_path / "_delta_log"
    log.mkdir(exist_ok=True)
    (log / f"{1:020d}.json").write_bytes(data)
    storage = TableStorage(str(tmp_path))
    return storage, storage.info(storage.log_file(f"{1:020d}.json"))


# --- the properties ------------------------------------------------------------------------------


@pytest.mark.parametrize("streamed", [False, True], ids=["read-whole", "streamed"])
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(commit=_commit())
@example(  # two sizes whose sum is past a long: the summary was refused by its own model
    commit=(
        b'{"add":{"path":"f","dataChange":false,"partitionValues":{},"size":1338,"modificationTime":0}}\n'
        b'{"add":{"path":"g","dataChange":false,"partitionValues":{},"size":9223372036854774470,'
        b'"modificationTime":0}}',
        [
            (
                b'{"add":{"path":"f","dataChange":false,"partitionValues":{},"size":1338,"modificationTime":0}}',
                True,
            ),
            (
                b'{"add":{"path":"g","dataChange":false,"partitionValues":{},"size":9223372036854774470,'
                b'"modificationTime":0}}',
                True,
            ),
        ],
    )
)
def test_the_scan_publishes_the_valid_lines_and_refuses_the_first_invalid_one(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    streamed: bool,
    commit: tuple[bytes, list[tuple[bytes, bool]]],
) -> None:
    data, lines = commit
    if streamed:  # large-commit path, in buffers that cut lines anywhere
        monkeypatch.setattr(watcher_module, "SMALL_COMMIT_BYTES", 0)
        monkeypatch.setattr(actions_module, "STREAM_CHUNK", 97)
    storage, info = _scan_file(tmp_path, data)
    expected = _expected(lines)
    if isinstance(expected, int):
        with pytest.raises(CorruptLogError) as caught:
            scan_version(storage, 1, info)
        assert caught.value.line == expected and "\n" not in str(caught.value)
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
        assert isinstance(body, bytes)
        assert json.loads(body) == want  # the log's bytes (or the value's own JSON): one JSON value
    summary = work.summary()
    assert summary.action_count == len(want_actions) == scan.count
    assert (summary.adds, summary.removes, summary.cdc_files) == (
        want_summary["adds"],
        want_summary["removes"],
        want_summary["cdc"],
    )
    # the sums are longs: past 2^63-1 (two sizes of a forged log can get there) they stop there
    assert (summary.bytes_added, summary.bytes_removed) == (
        min(want_summary["bytes_added"], 2**63 - 1),
        min(want_summary["bytes_removed"], 2**63 - 1),
    )
    assert summary.partitions_touched == want_summary["partitions"]


def _published(
    storage: TableStorage, info: Any
) -> list[tuple[str, Any]] | tuple[type[CorruptLogError], int | None]:
    try:
        scan = scan_version(storage, 1, info)
    except CorruptLogError as exc:
        return CorruptLogError, exc.line
    work = CommitWork(storage, "id", 1, CommitTimestamp(1, 0, TimestampSource.FILE_TIME), scan)
    return [(name, body) for batch in work.batches(7) for name, body in batch]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(commit=_commit())
@example(
    commit=(
        b'{"add":{"path":"a","partitionValues":{},"size":1,"modificationTime":1,"dataChange":true}}\n',
        [],
    )
)
def test_a_commit_read_whole_or_streamed_publishes_the_same_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, commit: tuple[bytes, list[tuple[bytes, bool]]]
) -> None:
    """Whichever path a commit takes (its size decides), the records are byte for byte the same and
    a refusal names the same line: a restart may finish a version on the other path."""
    storage, info = _scan_file(tmp_path, commit[0])
    whole = _published(storage, info)
    monkeypatch.setattr(watcher_module, "SMALL_COMMIT_BYTES", 0)
    monkeypatch.setattr(actions_module, "STREAM_CHUNK", 7)  # about a line per buffer
    assert _published(storage, info) == whole
