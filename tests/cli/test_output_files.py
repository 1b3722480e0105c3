"""``-o`` and ``--format csv``: refused before any work when they cannot succeed, and a failure
midway never leaves a file that looks complete."""

from __future__ import annotations

import json
import os
import signal
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from deltamirror.cli import output
from deltamirror.cli.main import main
from support.tables import TABLES, copy_table

SIMPLE = str(TABLES / "golden__snapshot-data2-deleted")
CDF = str(TABLES / "krs__cdf-table-simple")
NESTED_CDF = str(TABLES / "krs__cdf-table-backtick-column-names")

#: every command that takes -o, with its arguments minus the table
WRITERS = [
    ["snapshot", SIMPLE],
    ["read", SIMPLE],
    ["history", SIMPLE],
    ["changes", CDF, "--starting-version", "0"],
    ["events", SIMPLE],
]


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _one_line_error(err: str) -> None:
    assert err.count("\n") == 1 and err.startswith("deltamirror: error: ") and "Traceback" not in err


# --- -o that cannot be written --------------------------------------------------------------------


@pytest.mark.parametrize("argv", WRITERS, ids=lambda a: a[0])
@pytest.mark.parametrize(
    ("target", "needle"),
    [
        ("missing/out.jsonl", "does not exist"),
        ("", "is a directory"),
        ("newdir/", "is a directory"),
        ("afile/out.jsonl", "is not a directory"),
    ],
    ids=["missing-dir", "a-directory", "trailing-slash", "parent-is-a-file"],
)
def test_unwritable_output_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], target: str, needle: str
) -> None:
    (tmp_path / "afile").write_text("x")
    path = f"{tmp_path}/{target}" if target else str(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    code, out, err = _run(capsys, *argv, "-o", path)
    assert code == 2 and out == ""
    _one_line_error(err)
    assert needle in err and path in err
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_read_only_directory_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    if os.geteuid() == 0:  # root may write anywhere: the check is what is under test
        real_access = os.access
        monkeypatch.setattr(output.os, "access", lambda p, mode: p != str(locked) and real_access(p, mode))
    try:
        code, _, err = _run(capsys, "snapshot", SIMPLE, "-o", str(locked / "out.jsonl"))
    finally:
        locked.chmod(0o700)
    assert code == 2 and "not writable" in err
    _one_line_error(err)
    assert list(locked.iterdir()) == []


def test_output_is_checked_before_the_table_is_opened(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bad -o is reported even when the table does not exist: nothing was read before."""
    code, _, err = _run(capsys, "snapshot", "/definitely/not/here", "-o", str(tmp_path / "no" / "x"))
    assert code == 2 and "-o" in err and "not a Delta table" not in err


def test_dev_null_and_stdout_dash_still_work(capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(capsys, "snapshot", SIMPLE, "-o", os.devnull)[0] == 0
    code, out, _ = _run(capsys, "snapshot", SIMPLE, "-o", "-")
    assert code == 0 and json.loads(out.splitlines()[0])["version"] == 4


# --- csv and nested columns -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "columns"),
    [
        (["read", str(TABLES / "golden__data-reader-map")], ["a (map)", "f (map)"]),
        (["read", str(TABLES / "golden__data-reader-nested-struct")], ["(struct)"]),
        (["read", str(TABLES / "golden__data-reader-array-primitives")], ["(array)"]),
        (["changes", NESTED_CDF, "--starting-version", "0"], ["struct_col (struct)"]),
    ],
    ids=["map", "struct", "array", "changes-struct"],
)
def test_csv_refuses_nested_columns_before_writing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], columns: list[str]
) -> None:
    target = tmp_path / "rows.csv"
    code, out, err = _run(capsys, *argv, "--format", "csv", "-o", str(target))
    assert code == 2 and out == ""
    _one_line_error(err)
    assert "--format csv" in err and "jsonl" in err and "parquet" in err
    assert all(c in err for c in columns)
    assert list(tmp_path.iterdir()) == []


def test_csv_of_the_flat_columns_of_a_nested_table(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(
        capsys, "changes", NESTED_CDF, "--starting-version", "0", "--format", "csv", "--columns", "id.num"
    )
    assert code == 0 and err == ""
    assert out.splitlines()[0] == '"id.num","_change_type","_commit_version","_commit_timestamp"'


def test_csv_writes_binary_as_base64_like_jsonl(capsys: pytest.CaptureFixture[str]) -> None:
    table = str(TABLES / "golden__parquet-all-types")
    code, out, _ = _run(capsys, "read", table, "--columns", "BinaryType")
    rows = [json.loads(line)["BinaryType"] for line in out.splitlines()]
    code_csv, out_csv, err = _run(capsys, "read", table, "--columns", "BinaryType", "--format", "csv")
    assert code == code_csv == 0 and err == ""
    cells = [line.strip('"') for line in out_csv.splitlines()[1:]]
    assert cells == ["" if r is None else r for r in rows]


# --- a failure midway leaves no file ---------------------------------------------------------------


def _table_missing_its_last_file(tmp_path: Path) -> Path:
    """A table whose last active file (in snapshot order) is gone: rows are written, then it fails."""
    path = copy_table("golden__snapshot-data2-deleted", tmp_path / "copy")
    from deltamirror.core.table import open_table

    last = open_table(str(path)).snapshot().files["path"][-1].as_py()
    (path / last).unlink()
    return path


def test_a_failed_read_leaves_no_output_and_keeps_the_old_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    table = _table_missing_its_last_file(tmp_path)
    code, out, err = _run(capsys, "read", str(table))
    assert code == 2 and out.count("\n") > 0  # rows went out before the error: a failure midway
    _one_line_error(err)

    out_dir = tmp_path / "out"
    out_dir.mkdir()
    fresh = out_dir / "rows.jsonl"
    assert _run(capsys, "read", str(table), "-o", str(fresh))[0] == 2
    assert list(out_dir.iterdir()) == []

    kept = out_dir / "old.jsonl"
    kept.write_text("previous contents\n")
    assert _run(capsys, "read", str(table), "-o", str(kept))[0] == 2
    assert kept.read_text() == "previous contents\n"
    assert [p.name for p in out_dir.iterdir()] == ["old.jsonl"]


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_ctrl_c_and_sigterm_midway_leave_no_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, fmt: str
) -> None:
    real = output.write_batches

    def interrupted(signum: int | None) -> Any:
        def write_batches(batches: Any, schema: Any, f: str, out: Any) -> int:
            def some() -> Iterator[Any]:
                for i, batch in enumerate(batches):
                    if i == 1:
                        out.flush()
                        assert out.tell() > 0 or f == "parquet"
                        if signum is None:
                            raise KeyboardInterrupt
                        os.kill(os.getpid(), signum)
                    yield batch

            return real(some(), schema, f, out)

        return write_batches

    target = tmp_path / f"rows.{fmt}"
    argv = ["changes", CDF, "--starting-version", "0", "--format", fmt, "-o", str(target)]
    monkeypatch.setattr(output, "write_batches", interrupted(None))
    assert main(argv) == 130
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setattr(output, "write_batches", interrupted(signal.SIGTERM))
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 128 + signal.SIGTERM
    assert list(tmp_path.iterdir()) == []
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL or callable(signal.getsignal(signal.SIGTERM))


def test_a_complete_output_replaces_the_old_one_with_its_mode(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fresh = tmp_path / "files.parquet"
    assert _run(capsys, "snapshot", SIMPLE, "--format", "parquet", "-o", str(fresh))[0] == 0
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o666 & ~umask
    assert pq.read_table(fresh).num_rows == 3

    old = tmp_path / "history.jsonl"
    old.write_text("stale\n")
    old.chmod(0o640)
    assert _run(capsys, "history", SIMPLE, "--format", "jsonl", "-o", str(old))[0] == 0
    assert stat.S_IMODE(old.stat().st_mode) == 0o640
    assert [json.loads(line)["version"] for line in old.read_text().splitlines()] == [0, 1, 2, 3, 4]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["files.parquet", "history.jsonl"]


def test_a_symlinked_output_is_written_through(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    real = tmp_path / "real.jsonl"
    real.write_text("old\n")
    link = tmp_path / "link.jsonl"
    link.symlink_to(real)
    assert _run(capsys, "events", SIMPLE, "-o", str(link))[0] == 0
    assert link.is_symlink() and real.read_text().startswith("{")


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_columns_come_out_in_the_order_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fmt: str
) -> None:
    """--columns in another order than the table's: each value stays under its own header."""
    table = str(TABLES / "golden__parquet-all-types")
    target = tmp_path / f"rows.{fmt}"
    assert (
        _run(capsys, "read", table, "--columns", "StringType,LongType", "--format", fmt, "-o", str(target))[0]
        == 0
    )
    if fmt == "parquet":
        got = pq.read_table(target)
        assert got.column_names == ["StringType", "LongType"]
        pairs = list(zip(got["StringType"].to_pylist(), got["LongType"].to_pylist(), strict=True))
    elif fmt == "csv":
        lines = target.read_text().splitlines()
        assert lines[0] == '"StringType","LongType"'
        pairs = [
            (s.strip('"') or None, int(n) if n else None) for s, n in (line.split(",") for line in lines[1:])
        ]
    else:
        rows = [json.loads(line) for line in target.read_text().splitlines()]
        assert all(list(r) == ["StringType", "LongType"] for r in rows)
        pairs = [(r["StringType"], r["LongType"]) for r in rows]
    # in this table LongType = StringType + 1 on every row that has both
    assert len(pairs) == 200 and all(n == int(s) + 1 for s, n in pairs if s is not None and n is not None)
