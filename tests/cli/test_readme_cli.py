"""README's "Command line" block and the commands' ``--help`` name the same flags."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from deltamirror.cli.main import main

README = Path(__file__).resolve().parents[2] / "README.md"


def _usage_lines() -> dict[str, set[str]]:
    text = README.read_text()
    section = text[text.index("## Command line") :]
    block = section[section.index("```text") : section.index("```", section.index("```text") + 7)]
    flags: dict[str, set[str]] = {}
    command = ""
    for line in block.splitlines()[1:]:
        words = line.split("#")[0].split()
        if words and words[0] == "deltamirror":
            command = words[1]
        usage = line.split("#")[0]
        found = set(re.findall(r"(?<![\w-])--[a-z][a-z-]+", usage))
        flags.setdefault(command, set()).update(found | ({"--output"} if "-o PATH" in usage else set()))
    return flags


@pytest.mark.parametrize("command", ["snapshot", "read", "history", "changes", "events", "watch", "demo"])
def test_readme_flags_are_in_the_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    documented = _usage_lines()[command]
    assert documented
    with pytest.raises(SystemExit):
        main([command, "--help"])
    help_text = capsys.readouterr().out
    assert {f for f in documented if f not in help_text} == set()
    assert ("--output" in documented) == ("--output" in help_text)
    assert ("--no-progress" in documented) == ("--no-progress" in help_text)
