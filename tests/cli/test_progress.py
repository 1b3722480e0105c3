"""Progress on a terminal, silence when piped: the library's callbacks and the CLI's renderer."""

from __future__ import annotations

import io
import os
import pty
import re
import select
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from deltamirror.cli.main import main
from deltamirror.cli.progress import ProgressLine
from deltamirror.core.changes import read_changes
from deltamirror.core.table import open_table
from deltamirror.producer.tailing.snapshot_events import ProgressBar
from support.tables import TABLES, copy_table

CDF = str(TABLES / "krs__cdf-table-simple")
MULTIPART = TABLES / "krs__v1-multi-part-struct-stats-only"  # a 3-part checkpoint at version 5
SIDECARS = TABLES / "krs__v2-parquet-sidecars-struct-stats-only"  # a V2 checkpoint with a sidecar


# --- the library's callbacks --------------------------------------------------------------------


def _log_files(table: Path, version: int) -> int:
    """Checkpoint parts (and sidecars) of the last checkpoint at or before ``version``, plus the
    commits after it: what a replay must read, counted from the folder."""
    log = table / "_delta_log"
    checkpoints: dict[int, list[str]] = {}
    for f in log.glob("[0-9]*.checkpoint*"):
        checkpoints.setdefault(int(f.name[:20]), []).append(f.name)
    cp = max((v for v in checkpoints if v <= version), default=-1)
    parts = len(checkpoints.get(cp, []))
    if parts and (log / "_sidecars").is_dir():
        parts += len(list((log / "_sidecars").glob(f"{cp:020d}*.parquet")))
    return parts + sum(1 for f in log.glob("[0-9]*.json") if cp < int(f.name[:20]) <= version)


@pytest.mark.parametrize(
    ("table", "version"),
    [(MULTIPART, 5), (MULTIPART, 4), (SIDECARS, 5), (TABLES / "krs__cdf-table-simple", 2)],
    ids=["multipart-checkpoint", "commits-only", "v2-sidecars", "small"],
)
def test_snapshot_progress_counts_the_log_files_read(table: Path, version: int) -> None:
    calls: list[tuple[int, int]] = []
    open_table(str(table)).snapshot(version, progress=lambda done, total: calls.append((done, total)))
    expected = _log_files(table, version)
    assert calls[0][0] == 0 and calls[-1] == (expected, expected)
    dones = [d for d, _ in calls]
    assert dones == sorted(dones) and all(d <= t for d, t in calls)
    assert len(calls) >= expected  # told before each file, and once at the end


def test_snapshot_without_progress_is_unchanged() -> None:
    with_calls = open_table(str(MULTIPART)).snapshot(progress=lambda d, t: None)
    plain = open_table(str(MULTIPART)).snapshot()
    assert with_calls.files.equals(plain.files)


def test_changes_progress_counts_versions_as_rows_go_out() -> None:
    calls: list[tuple[int, int]] = []
    feed = read_changes(open_table(CDF), starting_version=0, progress=lambda d, t: calls.append((d, t)))
    assert calls == []  # planning reports nothing: only the read does
    rows = sum(b.num_rows for b in feed)
    assert rows == 25
    assert calls[0] == (0, 3) and calls[-1] == (3, 3)
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)


# --- the renderer ---------------------------------------------------------------------------------


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_line_is_redrawn_at_most_five_times_a_second_and_cleared() -> None:
    stream = io.StringIO()
    clock = _Clock()
    with ProgressLine(True, stream, clock=clock) as line:
        report = line.callback("changes", "versions")
        assert report is not None
        for done in range(1000):
            report(done, 1000)
            clock.now += 0.001  # 1000 reports in one second
        report(1000, 1000)
    text = stream.getvalue()
    draws = text.split("\r")[1:-1]
    assert 2 <= len(draws) <= 8
    assert draws[0].startswith("changes: 0/1000 versions (0%)")
    assert draws[-2].startswith("changes: 1000/1000 versions (100%)")
    assert draws[-1].strip() == "" and text.endswith("\r") and "\n" not in text


def test_a_shorter_line_covers_the_longer_one() -> None:
    stream = io.StringIO()
    clock = _Clock()
    line = ProgressLine(True, stream, clock=clock)
    line.draw("reading the log: 10/10 files")
    clock.now += 1
    line.draw("writing: 1/2 files")
    assert stream.getvalue().split("\r")[-1] == "writing: 1/2 files" + " " * 10


def test_disabled_draws_nothing_and_gives_no_callback() -> None:
    stream = io.StringIO()
    with ProgressLine(False, stream) as line:
        assert line.callback("changes", "versions") is None
        line.draw("x")
    assert stream.getvalue() == ""


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_watchers_snapshot_bar(monkeypatch: pytest.MonkeyPatch) -> None:
    # the default; a `watch --no-progress` run in this process (another test) turns it off
    monkeypatch.setattr(ProgressBar, "shown", True)
    stream = _Terminal()
    bar = ProgressBar("snapshot v3 of file:///t", 10, stream)
    bar.advance(4)
    bar.advance(6)
    bar.close()
    text = stream.getvalue()
    assert "4/10 actions published (40%)" in text and "10/10 actions published (100%)" in text
    assert text.endswith("\r") and "\n" not in text  # erased, not left above the next log line

    monkeypatch.setattr(ProgressBar, "shown", False)
    quiet = _Terminal()
    bar = ProgressBar("snapshot v3 of file:///t", 10, quiet)
    bar.advance(10)
    bar.close()
    assert quiet.getvalue() == ""


def test_watch_no_progress_turns_the_bar_off(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from deltamirror.producer import service

    seen: list[bool] = []
    monkeypatch.setattr(service, "run_watch", lambda cfg: seen.append(ProgressBar.shown) or 0)
    monkeypatch.setattr(ProgressBar, "shown", True)
    assert main(["watch", "--bootstrap-servers", "k:9092", str(tmp_path), "--no-progress"]) == 0
    assert main(["watch", "--bootstrap-servers", "k:9092", str(tmp_path)]) == 0
    assert seen == [False, True]


# --- on a pseudo-terminal, and piped --------------------------------------------------------------


def _run(argv: list[str], *, stderr_tty: bool, stdout_tty: bool = False) -> tuple[int, bytes, bytes]:
    """The command in a fresh process; stderr (and stdout) on a pseudo-terminal or a pipe."""
    command = [sys.executable, "-m", "deltamirror.cli.main", *argv]
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=slave if stdout_tty else subprocess.PIPE,
        stderr=slave if stderr_tty else subprocess.PIPE,
    )
    os.close(slave)
    terminal = b""
    while True:
        ready, _, _ = select.select([master], [], [], 60)
        if not ready:
            proc.kill()
            raise AssertionError(f"no output from {shlex.join(argv)}")
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: every holder of the terminal has closed it
            break
        if not chunk:
            break
        terminal += chunk
    os.close(master)
    out = proc.stdout.read() if proc.stdout else b""
    err = proc.stderr.read() if proc.stderr else b""
    code = proc.wait(60)
    return code, out if not stdout_tty else terminal, err if not stderr_tty else terminal


LINE = re.compile(rb"\r(changes|reading the log|writing): \d+/\d+ (versions|files) \(\d+%\)")


@pytest.mark.parametrize(
    ("argv", "labels"),
    [
        (["changes", CDF, "--starting-version", "0"], [b"changes: 3/3 versions (100%)"]),
        (["snapshot", str(MULTIPART)], [b"reading the log: 3/3 files (100%)", b"writing: "]),
        (["read", str(MULTIPART)], [b"reading the log: 3/3 files (100%)"]),
    ],
    ids=["changes", "snapshot", "read"],
)
def test_progress_on_a_terminal_and_nothing_when_piped(
    tmp_path: Path, argv: list[str], labels: list[bytes]
) -> None:
    on_tty = tmp_path / "tty.out"
    code, _, err = _run([*argv, "-o", str(on_tty)], stderr_tty=True)
    assert code == 0, err
    assert LINE.search(err) and all(label in err for label in labels)
    assert err.endswith(b"\r") and b"\n" not in err  # redrawn in place, then cleared

    piped = tmp_path / "piped.out"
    code, _, err = _run([*argv, "-o", str(piped)], stderr_tty=False)
    assert code == 0 and err == b""
    assert piped.read_bytes() == on_tty.read_bytes()

    code, out, err = _run(argv, stderr_tty=False)
    assert code == 0 and err == b"" and out == on_tty.read_bytes()

    code, _, err = _run([*argv, "-o", str(tmp_path / "quiet.out"), "--no-progress"], stderr_tty=True)
    assert code == 0 and err == b""


def test_no_progress_when_the_rows_go_to_the_same_terminal() -> None:
    code, terminal, _ = _run(["changes", CDF, "--starting-version", "0"], stderr_tty=True, stdout_tty=True)
    assert code == 0 and b"_change_type" in terminal
    assert not LINE.search(terminal)


def test_an_error_after_progress_starts_on_a_clean_line(tmp_path: Path) -> None:
    table = copy_table("krs__cdf-table-simple", tmp_path / "copy")
    for data in table.rglob("*.parquet"):
        data.unlink()
    code, _, err = _run(
        ["changes", str(table), "--starting-version", "0", "-o", str(tmp_path / "x")], stderr_tty=True
    )
    assert code == 2
    assert LINE.search(err)
    last = err.removesuffix(b"\r\n").split(b"\r")[-1]  # a terminal ends lines with \r\n
    assert last.startswith(b"deltamirror: error: ") and b"\n" not in last


@pytest.mark.parametrize("command", ["snapshot", "read", "changes", "watch"])
def test_help_names_no_progress(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main([command, "--help"])
    assert "--no-progress" in capsys.readouterr().out
