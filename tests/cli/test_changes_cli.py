"""``deltamirror changes``: rows as jsonl/parquet/csv, and one-line errors with exit code 2."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from deltamirror.cli.main import main
from support.tables import EXPECTED, TABLES

SIMPLE = str(TABLES / "krs__cdf-table-simple")
EXPECTED_SIMPLE = EXPECTED / "cdf" / "krs__cdf-table-simple__simple_cdf_version_ranges__0-2.json"


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_changes_jsonl(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, "changes", SIMPLE, "--starting-version", "0")
    assert code == 0 and err == ""
    records = [json.loads(line) for line in out.splitlines()]
    assert list(records[0]) == ["id", "_change_type", "_commit_version", "_commit_timestamp"]
    expected = json.loads(EXPECTED_SIMPLE.read_text())["rows"]  # id, _change_type, _commit_version as text
    assert Counter((str(r["id"]), r["_change_type"], str(r["_commit_version"])) for r in records) == Counter(
        tuple(row) for row in expected
    )
    assert all(r["_commit_timestamp"].endswith("Z") for r in records)
    versions = [r["_commit_version"] for r in records]
    assert versions == sorted(versions)


def test_changes_range_and_columns(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(
        capsys, "changes", SIMPLE, "--starting-version", "1", "--ending-version", "1", "--columns", "id"
    )
    assert code == 0
    records = [json.loads(line) for line in out.splitlines()]
    assert len(records) == 10 and {r["_commit_version"] for r in records} == {1}


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_changes_to_file(capsys: pytest.CaptureFixture[str], tmp_path: Path, fmt: str) -> None:
    target = tmp_path / f"out.{fmt}"
    code, out, _ = _run(
        capsys, "changes", SIMPLE, "--starting-version", "0", "--format", fmt, "-o", str(target)
    )
    assert code == 0 and out == ""
    table = pq.read_table(target) if fmt == "parquet" else pacsv.read_csv(target)
    assert table.num_rows == 25
    assert table.column_names == ["id", "_change_type", "_commit_version", "_commit_timestamp"]


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--starting-version", "9"], "DELTA_CDC_START_VERSION_AFTER_LATEST"),
        (["--starting-version", "2", "--ending-version", "1"], "DELTA_INVALID_CDC_RANGE"),
        (["--starting-timestamp", "2999-01-01"], "DELTA_TIMESTAMP_GREATER_THAN_COMMIT"),
        (["--starting-timestamp", "not a time"], "invalid timestamp"),
        (["--starting-version", "0", "--columns", "nope"], "no column 'nope'"),
    ],
)
def test_changes_errors_are_one_line(
    capsys: pytest.CaptureFixture[str], argv: list[str], needle: str
) -> None:
    code, out, err = _run(capsys, "changes", SIMPLE, *argv)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("deltamirror: error: ") and needle in err


def test_changes_unknown_column_names_it_and_the_table(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    target = tmp_path / "out.parquet"
    argv = ["--starting-version", "0", "--columns", "id,Nope", "--format", "parquet", "-o", str(target)]
    code, out, err = _run(capsys, "changes", SIMPLE, *argv)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "no column 'Nope'" in err
    assert f"table=file://{SIMPLE}," in err and "column=Nope" in err
    assert not target.exists()


def test_changes_columns_in_the_order_given_with_a_partition_column(
    capsys: pytest.CaptureFixture[str],
) -> None:
    table = str(TABLES / "gen__long-log-cdf")  # partitioned by part
    code, out, err = _run(
        capsys, "changes", table, "--starting-version", "3", "--ending-version", "5", "--columns", "n,part"
    )
    assert code == 0 and err == ""
    records = [json.loads(line) for line in out.splitlines()]
    assert records and all(
        list(r) == ["n", "part", "_change_type", "_commit_version", "_commit_timestamp"] for r in records
    )


def test_changes_cdf_not_enabled(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(
        capsys, "changes", str(TABLES / "krs__cdf-column-mapping-name-mode"), "--starting-version", "0"
    )
    assert code == 2 and "[DELTA_MISSING_CHANGE_DATA]" in err and "version=0" in err


def test_changes_needs_a_start(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["changes", SIMPLE])
    assert info.value.code == 2
    assert capsys.readouterr().err.count("\n") == 1
    with pytest.raises(SystemExit):
        main(["changes", SIMPLE, "--starting-version", "0", "--starting-timestamp", "2020-01-01"])
