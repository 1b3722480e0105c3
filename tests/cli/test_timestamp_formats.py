"""One timestamp layout everywhere: ``2026-01-01T00:00:05.500Z`` (README), the same in jsonl, csv,
parquet metadata, history, snapshot headers, watch logs and the demo.

Expected strings are built here from datetime fields, never by the function under test.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import logging
import random
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from deltamirror.cli.main import main
from deltamirror.cli.output import format_timestamp, format_timestamp_array, to_json_value
from deltamirror.core.timestamps import format_iso
from support.tables import TABLES

#: milliseconds, then microseconds only when the value has them; Z for UTC, nothing for NTZ
UTC_LAYOUT = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}(\d{3})?Z$")
NTZ_LAYOUT = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}(\d{3})?$")
ALL_TYPES = str(TABLES / "golden__parquet-all-types")
CDF = str(TABLES / "krs__cdf-table-simple")
SIMPLE = str(TABLES / "golden__snapshot-data2-deleted")


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def _expected(value: dt.datetime, utc: bool) -> str:
    """The documented layout, from the datetime's own fields."""
    if value.tzinfo is not None:
        value = value.astimezone(dt.UTC)
    ms, us = divmod(value.microsecond, 1000)
    text = (
        f"{value.year:04d}-{value.month:02d}-{value.day:02d}T"
        f"{value.hour:02d}:{value.minute:02d}:{value.second:02d}.{ms:03d}"
    )
    if us:
        text += f"{us:03d}"
    return text + ("Z" if utc else "")


def test_the_readme_example() -> None:
    epoch_ms = 1767225605500  # 2026-01-01T00:00:05.500Z
    assert format_iso(epoch_ms) == "2026-01-01T00:00:05.500Z"
    assert format_timestamp(epoch_ms * 1000) == "2026-01-01T00:00:05.500Z"
    assert format_timestamp(epoch_ms * 1000 + 7) == "2026-01-01T00:00:05.500007Z"
    assert format_timestamp(epoch_ms * 1000, utc=False) == "2026-01-01T00:00:05.500"


def test_columns_values_and_commit_timestamps_agree() -> None:
    """The column formatter, the value formatter and core's format_iso print the same text."""
    rng = random.Random(10)
    edges = [0, -1, -1500, 999, -62135596800000000, 253402300799999999]
    micros = edges + [rng.randint(-62135596800000000, 253402300799999999) for _ in range(3000)]
    for tz in ("UTC", None):
        column = format_timestamp_array(pa.array(micros, pa.timestamp("us", tz))).to_pylist()
        utc = tz is not None
        expected = [_expected(dt.datetime(1970, 1, 1) + dt.timedelta(microseconds=m), utc) for m in micros]
        assert column == expected
        values = pa.array(micros[3:], pa.timestamp("us", tz)).to_pylist()
        assert [to_json_value(v, pa.timestamp("us", tz)) for v in values] == expected[3:]
    for ms in [0, 1, 999, *(rng.randint(0, 4_102_444_800_000) for _ in range(2000))]:
        assert format_iso(ms) == format_timestamp(ms * 1000)


def _csv_rows(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


@pytest.mark.parametrize(("column", "utc"), [("TimestampType", True), ("TimestampNTZType", False)])
def test_row_timestamps_are_the_same_in_jsonl_and_csv(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, column: str, utc: bool
) -> None:
    columns = f"{column},LongType"  # a row of one null cell would be a blank line, which csv skips
    jsonl = [
        json.loads(line)[column]
        for line in _run(capsys, "read", ALL_TYPES, "--columns", columns).splitlines()
    ]
    csv_text = _run(capsys, "read", ALL_TYPES, "--columns", columns, "--format", "csv")
    cells = [r[column] for r in _csv_rows(csv_text)]
    assert [c or None for c in cells] == jsonl
    target = tmp_path / "rows.parquet"
    _run(capsys, "read", ALL_TYPES, "--columns", column, "--format", "parquet", "-o", str(target))
    stored = pq.read_table(target)[column].to_pylist()
    assert jsonl == [None if v is None else _expected(v, utc) for v in stored]
    present = [s for s in jsonl if s is not None]
    layout = UTC_LAYOUT if utc else NTZ_LAYOUT
    assert present and all(layout.match(s) for s in present)
    if not utc:  # this column's values carry microseconds, which are kept
        assert any(len(s) == len("1970-01-03T17:03:54.000200") for s in present)


def test_edge_timestamps_in_jsonl_and_csv(capsys: pytest.CaptureFixture[str]) -> None:
    table = str(TABLES / "drs__table_with_edge_timestamps")
    rows = [json.loads(line) for line in _run(capsys, "read", table).splitlines()]
    cells = _csv_rows(_run(capsys, "read", table, "--format", "csv"))
    schema = pq.read_schema(next((TABLES / "drs__table_with_edge_timestamps").rglob("*.parquet")))
    stamp_columns = [f.name for f in schema if pa.types.is_timestamp(f.type)]
    assert stamp_columns
    for name in stamp_columns:
        from_json = sorted(str(r[name]) for r in rows if r[name] is not None)
        from_csv = sorted(c[name] for c in cells if c[name])
        assert from_json == from_csv and from_json
        assert all(UTC_LAYOUT.match(s) or NTZ_LAYOUT.match(s) for s in from_json)


def test_commit_timestamps_agree_across_commands_and_formats(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    history = {
        h["version"]: h["timestamp"]
        for h in map(json.loads, _run(capsys, "history", CDF, "--format", "jsonl").splitlines())
    }
    assert all(UTC_LAYOUT.match(ts) for ts in history.values())
    table_lines = _run(capsys, "history", CDF).splitlines()[1:]
    assert {int(line.split()[0]): line.split()[1] for line in table_lines} == history

    changes = [
        json.loads(line) for line in _run(capsys, "changes", CDF, "--starting-version", "0").splitlines()
    ]
    assert {(r["_commit_version"], r["_commit_timestamp"]) for r in changes} == set(history.items())
    cells = _csv_rows(_run(capsys, "changes", CDF, "--starting-version", "0", "--format", "csv"))
    assert [(int(c["_commit_version"]), c["_commit_timestamp"]) for c in cells] == [
        (r["_commit_version"], r["_commit_timestamp"]) for r in changes
    ]
    target = tmp_path / "changes.parquet"
    _run(capsys, "changes", CDF, "--starting-version", "0", "--format", "parquet", "-o", str(target))
    stored = pq.read_table(target).to_pylist()
    assert {(r["_commit_version"], _expected(r["_commit_timestamp"], True)) for r in stored} == set(
        history.items()
    )

    for version, ts in history.items():
        header = json.loads(_run(capsys, "snapshot", CDF, "--version", str(version)).splitlines()[0])
        assert header["timestamp"] == ts
    target = tmp_path / "files.parquet"
    _run(capsys, "snapshot", CDF, "--format", "parquet", "-o", str(target))
    meta = pq.read_schema(target).metadata
    assert meta[b"deltamirror.timestamp"].decode() == history[max(history)]
    assert meta[b"deltamirror.timestampSource"] in (b"ict", b"file-time", b"adjusted-file-time")


def test_watch_logs_and_the_demo_print_the_same_layout() -> None:
    from deltamirror.cli.producer_cmds import _describe_event
    from deltamirror.producer.log_format import JsonLogFormatter

    record = logging.LogRecord("deltamirror.test", logging.INFO, __file__, 1, "hello", None, None)
    record.created = 1767225605.5
    assert json.loads(JsonLogFormatter().format(record))["ts"] == "2026-01-01T00:00:05.500Z"
    event = {"version": 0, "index": 0, "count": 1, "type": "txn", "commitTimestamp": 1767225605500}
    assert _describe_event(event).endswith("@2026-01-01T00:00:05.500Z")
