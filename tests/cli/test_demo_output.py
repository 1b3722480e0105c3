"""``deltamirror demo`` says where it left its table, with commands that run as printed, on that table.

The commands are checked on the demo's own table (built by the demo's own functions), in a shell
with the PATH a user has after ``make``: the demo once suggested ``changes`` on a table without a
change data feed (exit 2), and ``deltamirror`` itself, which ``make`` does not put on PATH.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from deltamirror.cli.producer_cmds import commit_demo_changes, demo_epilogue, write_demo_table

VENV_BIN = str(Path(sys.executable).parent)


def _commands(text: str) -> list[str]:
    """The command lines of the epilogue, as printed (indented, after its first line)."""
    return [line.strip() for line in text.splitlines()[1:] if line.startswith("  ")]


def _path_without_the_venv() -> str:
    return os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != VENV_BIN)


def _run_as_printed(line: str, path: str) -> subprocess.CompletedProcess[str]:
    """``line`` run by a shell as a user would paste it, with ``path`` as PATH, from this directory."""
    return subprocess.run(
        ["sh", "-c", line], capture_output=True, text=True, timeout=120, env={**os.environ, "PATH": path}
    )


def _check_commands(text: str, table: Path, path: str) -> None:
    commands = _commands(text)
    assert all(str(table) in shlex.split(c) for c in commands)  # one shell word, however it is spelled
    assert [next(w for w in ("history", "changes", "events") if f" {w} " in c) for c in commands] == [
        "history",
        "changes",
        "events",
    ]
    for line in commands:
        result = _run_as_printed(line, path)
        assert result.returncode == 0, f"{line}: {result.stderr}"
        assert result.stdout.strip()
        if " changes " in line:  # the feed of the demo's own commits
            kinds = {row.split(",")[-3].strip('"') for row in result.stdout.splitlines()[1:]}
            assert kinds == {"insert", "update_preimage", "update_postimage", "delete"}, result.stdout


@pytest.fixture(scope="module")
def demo_table(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo's table, made by the demo's own functions (no broker): a folder with a space."""
    table = tmp_path_factory.mktemp("demo") / "my demo" / "orders"
    write_demo_table(table)
    commit_demo_changes(table)
    return table


def test_the_epilogue_runs_as_printed_when_deltamirror_is_not_on_path(demo_table: Path) -> None:
    """After ``make`` the command is .venv/bin/deltamirror: the epilogue names it so, and says how
    to put it on PATH."""
    path = _path_without_the_venv()
    env_before = os.environ.get("PATH")
    os.environ["PATH"] = path
    try:
        text = demo_epilogue(str(demo_table))
    finally:
        os.environ["PATH"] = env_before or ""
    assert str(demo_table) in text.splitlines()[0]
    assert all(not c.startswith("deltamirror ") for c in _commands(text))
    assert "/bin/activate" in text.splitlines()[-1]
    _check_commands(text, demo_table, path)


def test_the_epilogue_says_deltamirror_when_it_is_on_path(demo_table: Path) -> None:
    path = os.pathsep.join([VENV_BIN, _path_without_the_venv()])
    env_before = os.environ.get("PATH")
    os.environ["PATH"] = path
    try:
        text = demo_epilogue(str(demo_table))
    finally:
        os.environ["PATH"] = env_before or ""
    assert all(c.startswith("deltamirror ") for c in _commands(text))
    _check_commands(text, demo_table, path)


@pytest.mark.kafka
@pytest.mark.timeout(180)
def test_the_demo_ends_with_commands_that_run_on_its_table(
    kafka_bootstrap: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from deltamirror.cli.main import main

    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", kafka_bootstrap)
    monkeypatch.setenv("PATH", _path_without_the_venv())  # as after `make`
    assert main(["demo", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    (table,) = [p for p in tmp_path.iterdir() if (p / "_delta_log").is_dir()]
    epilogue = out[out.index(f"the demo table is left at {table}") :]
    _check_commands(epilogue, table, os.environ["PATH"])
