"""The CLI's contract for scripts: jsonl shapes, exit codes, one-line errors, --help everywhere."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from deltamirror.cli.main import main
from support.tables import TABLES, copy_table

SIMPLE = str(TABLES / "golden__snapshot-data2-deleted")


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _jsonl(text: str) -> list[dict]:  # type: ignore[type-arg]
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_snapshot_jsonl_contract(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "snapshot", SIMPLE, "--format", "jsonl")
    assert code == 0
    header, *files = _jsonl(out)
    assert isinstance(header["version"], int) and header["version"] == 4
    assert header["timestamp"].endswith("Z") and len(header["timestamp"]) == 24
    assert header["timestampSource"] in {"ict", "file-time", "adjusted-file-time"}
    assert header["metaData"]["id"] and header["protocol"]["minReaderVersion"] == 1
    # paths exactly as in the log, one record per active file
    log_adds = set()
    log_removes = set()
    for f in sorted((TABLES / "golden__snapshot-data2-deleted" / "_delta_log").glob("0*.json")):
        for line in f.read_text().splitlines():
            obj = json.loads(line)
            if "add" in obj:
                log_adds.add(obj["add"]["path"])
                log_removes.discard(obj["add"]["path"])
            if "remove" in obj:
                log_removes.add(obj["remove"]["path"])
                log_adds.discard(obj["remove"]["path"])
    assert {f["path"] for f in files} == log_adds
    assert all(isinstance(f["size"], int) for f in files)


def test_snapshot_at_version_and_timestamp(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = _run(capsys, "history", SIMPLE, "--format", "jsonl")
    history = _jsonl(out)
    assert [h["version"] for h in history] == [0, 1, 2, 3, 4]
    v2 = history[2]
    code, out, _ = _run(capsys, "snapshot", SIMPLE, "--timestamp", v2["timestamp"])
    assert code == 0 and _jsonl(out)[0]["version"] == 2
    code, out, _ = _run(capsys, "snapshot", SIMPLE, "--version", "1")
    assert code == 0 and _jsonl(out)[0]["version"] == 1


def test_snapshot_parquet(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "files.parquet"
    code, _, _ = _run(capsys, "snapshot", SIMPLE, "--format", "parquet", "-o", str(target))
    assert code == 0
    table = pq.read_table(target)
    assert table.num_rows == 3
    assert table.schema.metadata[b"deltamirror.version"] == b"4"


def test_history_table_and_jsonl(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "history", SIMPLE)
    assert code == 0 and "DELETE" in out and "VERSION" in out.splitlines()[0]
    _, out, _ = _run(capsys, "history", SIMPLE, "--format", "jsonl")
    entries = _jsonl(out)
    assert entries[-1]["operation"] == "DELETE"
    assert all({"version", "timestamp", "timestampSource", "operation"} <= e.keys() for e in entries)
    stamps = [e["timestamp"] for e in entries]
    assert stamps == sorted(stamps) and len(set(stamps)) == len(stamps)


def test_read_formats(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "read", SIMPLE)
    assert code == 0
    rows = _jsonl(out)
    expected = pq.read_table(
        Path(__file__).parents[1] / "data" / "expected" / "golden_snapshot" / "snapshot-data2-deleted"
    )
    assert sorted(json.dumps(r, sort_keys=True) for r in rows) == sorted(
        json.dumps(r, sort_keys=True) for r in expected.to_pylist()
    )
    code, out, _ = _run(capsys, "read", SIMPLE, "--format", "csv", "--columns", "col2")
    assert code == 0 and out.splitlines()[0] == '"col2"' and len(out.splitlines()) == len(rows) + 1
    target = tmp_path / "rows.parquet"
    assert _run(capsys, "read", SIMPLE, "--format", "parquet", "-o", str(target))[0] == 0
    assert pq.read_table(target).num_rows == len(rows)


def test_read_value_encodings(capsys: pytest.CaptureFixture[str]) -> None:
    """Dates as YYYY-MM-DD, timestamps ISO-8601, decimals as strings, binary as base64."""
    code, out, _ = _run(capsys, "read", str(TABLES / "golden__parquet-all-types"))
    assert code == 0
    rows = _jsonl(out)
    dates = [r["DateType"] for r in rows if r["DateType"] is not None]
    assert dates and all(len(d) == 10 and d[4] == d[7] == "-" for d in dates)
    decimals = [r["decimal"] for r in rows if r["decimal"] is not None]
    assert decimals and all(isinstance(d, str) and float(d) == float(d) for d in decimals)
    stamps = [r["TimestampType"] for r in rows if r["TimestampType"] is not None]
    assert stamps and all(s.endswith("Z") and "T" in s for s in stamps)
    ntz = [r["TimestampNTZType"] for r in rows if r["TimestampNTZType"] is not None]
    assert ntz and all("T" in s and not s.endswith("Z") for s in ntz)
    binary = [r["BinaryType"] for r in rows if r["BinaryType"] is not None]
    assert binary and all(base64.b64decode(b) is not None for b in binary)
    code, out, _ = _run(capsys, "read", str(TABLES / "golden__data-reader-map"))
    maps = [v for r in _jsonl(out) for k, v in r.items() if k != "i" and v is not None]
    assert code == 0 and maps and all(isinstance(m, dict) for m in maps)


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["snapshot", "/definitely/not/here"], "not a Delta table"),
        (["snapshot", SIMPLE, "--version", "99"], "version 99"),
        (["snapshot", SIMPLE, "--timestamp", "not-a-time"], "invalid timestamp"),
        (["snapshot", SIMPLE, "--timestamp", "2999-01-01T00:00:00Z"], "after the latest commit"),
        (["read", SIMPLE, "--columns", "nope"], "no column 'nope' in the table"),
        (["read", str(TABLES / "krs__table-with-geo")], "geospatial"),
        (["read", str(TABLES / "kj__bench-basic_catalog_managed")], "catalogManaged"),
        (["snapshot", "nosuchproto://x/y"], "unknown storage protocol"),
        (["snapshot", SIMPLE, "-S", "novalue"], "NAME=VALUE"),
    ],
)
def test_user_errors_are_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], argv: list[str], needle: str
) -> None:
    code, _, err = _run(capsys, *argv)
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("deltamirror: error:")
    assert needle in err
    assert "Traceback" not in err


def test_corrupt_line_names_file_and_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = copy_table("golden__snapshot-data1", tmp_path)
    f = path / "_delta_log" / f"{1:020d}.json"
    f.chmod(0o644)
    f.write_text(f.read_text() + "{broken\n")
    code, _, err = _run(capsys, "snapshot", str(path))
    assert code == 2 and f.name in err and "line=" in err


def test_gap_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(capsys, "snapshot", str(TABLES / "drs__err_table_c"))
    assert code == 2 and "missing" in err


def test_bad_arguments_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["snapshot", SIMPLE, "--version", "1", "--timestamp", "2020-01-01"])
    assert info.value.code == 2


@pytest.mark.parametrize("cmd", [[], ["snapshot"], ["read"], ["history"], ["local", "kafka"]])
def test_help_works_in_a_fresh_process(cmd: list[str]) -> None:
    """`--help` needs neither pyspark nor a broker, and is quick."""
    result = subprocess.run(
        [sys.executable, "-m", "deltamirror.cli.main", *cmd, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "usage: deltamirror" in result.stdout


def test_a_storage_option_without_a_name_is_not_echoed(capsys: pytest.CaptureFixture[str]) -> None:
    """A bare ``-S`` value is most often a secret pasted without its name."""
    code, _, err = _run(capsys, "snapshot", SIMPLE, "-S", "anon=true", "-S", "AKIAs3cr3tvalue")
    assert code == 2 and "#2" in err and "s3cr3t" not in err


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["read", "{table}", "--columns", "id,id"], "--columns names the column id twice"),
        (["read", "{table}", "--columns", "id,part,ID"], "--columns names the column ID twice"),
        (
            ["changes", "{table}", "--starting-version", "0", "--columns", "id,id"],
            "--columns names the column id",
        ),
        (
            ["changes", "{table}", "--starting-version", "0", "--net", "--key", "id,id"],
            "--key names the column id",
        ),
    ],
)
def test_a_column_named_twice_is_refused(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Audit: ``--columns id,id`` printed the column once, without a word."""
    table = str(TABLES / "krs__cdf-table-partitioned")
    assert main([a.replace("{table}", table) for a in argv]) == 2
    err = capsys.readouterr().err
    assert said in err and len(err.splitlines()) == 1, err
