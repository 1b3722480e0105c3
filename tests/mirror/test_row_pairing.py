"""Pairing update images in bounded memory: spilled to several buckets, the records are those of the
in-memory pairing, in the same order; the spill files go after success, an error and a stop."""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from deltamirror.mirror.errors import RecordTooLargeError
from deltamirror.mirror.records.record import Record
from deltamirror.mirror.records.row_changes import RowChangesOptions, VersionRows, skip_records

PAIRS = 6000


def _options() -> RowChangesOptions:
    return RowChangesOptions("t.changes", "t.transaction", "t", "tid", key_columns=("id",))


def _rows() -> list[tuple[int, str, str]]:
    """A version as delta-rs writes one: every post-image before the pre-images, inserts and deletes
    among them, and one key updated twice (never paired: ``d`` + ``c``)."""
    posts = [(i, f"new-{i}", "update_postimage") for i in range(PAIRS)]
    pres = [(i, f"old-{i}", "update_preimage") for i in range(PAIRS)]
    random.Random(7).shuffle(pres)
    twice = [(-1, "a", "update_preimage"), (-1, "b", "update_postimage")] * 2
    others = [(PAIRS + i, f"ins-{i}", "insert") for i in range(300)] + [
        (-2 - i, "gone", "delete") for i in range(300)
    ]
    rows = posts + twice + pres
    for n, row in enumerate(others):  # spread through the version
        rows.insert(n * 41 % len(rows), row)
    return rows


def _batches(rows: list[tuple[int, str, str]], size: int = 1000) -> list[pa.RecordBatch]:
    return [
        pa.record_batch(
            {
                "id": pa.array([r[0] for r in rows[i : i + size]], pa.int64()),
                "name": pa.array([r[1] for r in rows[i : i + size]]),
                "_change_type": pa.array([r[2] for r in rows[i : i + size]]),
            }
        )
        for i in range(0, len(rows), size)
    ]


def _version(batches: Any, spill: Path, memory: int) -> VersionRows:
    return VersionRows(
        _options(), batches, version=3, ts_ms=1000, pairing_memory_bytes=memory, spill_dir=str(spill)
    )


def _all(rows: VersionRows) -> list[Record]:
    return [r for chunk in rows.records() for r in chunk]


def _expected(rows: list[tuple[int, str, str]]) -> list[tuple[str, Any, Any]]:
    """(op, before, after) per event, worked out here: the ``u`` at the later image of a key seen
    once as each image, everything else as it comes."""
    kinds: dict[int, list[str]] = {}
    for key, _, kind in rows:
        kinds.setdefault(key, []).append(kind)
    paired = {k for k, v in kinds.items() if sorted(v) == ["update_postimage", "update_preimage"]}
    waiting: dict[int, str] = {}
    out: list[tuple[str, Any, Any]] = []
    for key, name, kind in rows:
        if key in paired:
            if key not in waiting:
                waiting[key] = name
                continue
            old, new = (name, waiting[key]) if kind == "update_preimage" else (waiting[key], name)
            out.append(("u", {"id": key, "name": old}, {"id": key, "name": new}))
        elif kind in ("delete", "update_preimage"):
            out.append(("d", {"id": key, "name": name}, None))
        else:
            out.append(("c", None, {"id": key, "name": name}))
    return out


def _events(records: list[Record]) -> list[tuple[str, Any, Any]]:
    values = [json.loads(r.value) for r in records if r.topic == "t.changes" and r.value is not None]
    assert [v["source"]["index"] for v in values] == list(range(len(values)))
    return [(v["op"], v["before"], v["after"]) for v in values]


def test_spilled_to_several_buckets_the_records_are_the_in_memory_ones(tmp_path: Path) -> None:
    rows = _rows()
    batches = _batches(rows)
    in_memory = _version(lambda: batches, tmp_path, 1 << 30)
    expected = _all(in_memory)
    assert in_memory.buckets == 0
    assert _events(expected) == _expected(rows)
    spilled = _version(lambda: batches, tmp_path, 1)  # the smallest budget: buckets of 64 KiB
    assert _all(spilled) == expected
    assert spilled.buckets > 2
    assert os.listdir(tmp_path) == []


def test_a_restart_skipping_any_prefix_gets_the_rest_exactly(tmp_path: Path) -> None:
    batches = _batches(_rows())
    full = _all(_version(lambda: batches, tmp_path, 1 << 30))
    for cut in (0, 1, 999, 1000, 3456, len(full) - 1):
        rows = _version(lambda: batches, tmp_path, 1)
        assert [r for chunk in skip_records(rows.records(), cut) for r in chunk] == full[cut:]
    assert os.listdir(tmp_path) == []


def test_spill_files_go_after_an_error_and_a_stop(tmp_path: Path) -> None:
    batches = _batches(_rows())
    reads = 0

    def failing() -> Iterator[pa.RecordBatch]:
        nonlocal reads
        reads += 1
        for n, batch in enumerate(batches):
            if reads == 2 and n == 5:
                raise OSError("storage went away")
            yield batch

    with pytest.raises(OSError):
        _all(_version(failing, tmp_path, 1))
    assert os.listdir(tmp_path) == []
    stream = skip_records(_version(lambda: batches, tmp_path, 1).records(), 10)
    next(stream)
    assert os.listdir(tmp_path) != []  # spilled, in use
    stream.close()  # what a stop does
    assert os.listdir(tmp_path) == []


def test_rows_changed_between_the_reads_stop_the_table(tmp_path: Path) -> None:
    batches = _batches(_rows())
    reads = []

    def changing() -> list[pa.RecordBatch]:
        reads.append(1)
        return batches if len(reads) == 1 else batches[:-2]

    with pytest.raises(Exception, match="changed while it was read"):
        _all(_version(changing, tmp_path, 1))
    assert os.listdir(tmp_path) == []


def test_a_row_larger_than_the_topic_accepts_is_refused_in_one_line(tmp_path: Path) -> None:
    rows = [(1, "small", "insert"), (2, "x" * 5000, "insert")]
    version = _version(lambda: _batches(rows), tmp_path, 1 << 20)
    version.max_record_bytes = 4096
    with pytest.raises(RecordTooLargeError) as info:
        _all(version)
    text = str(info.value)
    assert "\n" not in text and info.value.exit_code == 2
    assert '{"id":2}' in text and "t.changes" in text and "version" in text and "4096" in text
