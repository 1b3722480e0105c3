"""``deltamirror demo`` says where it left its table, with commands that work when pasted."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from deltamirror.cli.producer_cmds import demo_epilogue
from support.tables import copy_table


def _commands(text: str) -> list[list[str]]:
    return [shlex.split(line) for line in text.splitlines() if line.strip().startswith("deltamirror ")]


def test_the_epilogue_names_the_table_and_its_commands_run_as_pasted(tmp_path: Path) -> None:
    """A folder with a space: the printed commands must still be one shell word per argument."""
    table = copy_table("krs__cdf-table-simple", tmp_path / "my demo")
    text = demo_epilogue(str(table))
    assert str(table) in text.splitlines()[0]
    commands = _commands(text)
    assert [c[1] for c in commands] == ["history", "changes", "events"]
    for argv in commands:
        assert argv[2] == str(table)
        result = subprocess.run(
            [sys.executable, "-m", "deltamirror.cli.main", *argv[1:]],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip()


@pytest.mark.kafka
@pytest.mark.timeout(120)
def test_the_demo_ends_with_where_its_table_is(
    kafka_bootstrap: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from deltamirror.cli.main import main

    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", kafka_bootstrap)
    assert main(["demo", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    (table,) = [p for p in tmp_path.iterdir() if (p / "_delta_log").is_dir()]
    assert f"the demo table is left at {table}" in out
    history = _commands(out)[0]
    assert history == ["deltamirror", "history", str(table)]
    assert main(history[1:]) == 0
    assert "DELETE" in capsys.readouterr().out
