"""``deltamirror COMMAND ...`` builds only COMMAND's parser and imports only its module (building all
~20 took 21-28 ms of CPU of every start, consume-snapshot's restart included); what it parses,
its help, defaults and errors are those of the full parser, which the top-level ``--help``,
``--version`` and an unknown command still get."""

from __future__ import annotations

import argparse
import subprocess
import sys
from typing import Any

import pytest

from deltamirror.cli.main import COMMANDS, PLUGINS, build_parser, main


def _subparsers(parser: argparse.ArgumentParser) -> argparse._SubParsersAction[Any] | None:
    found = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return found[0] if found else None


def _tree(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> dict[tuple[str, ...], Any]:
    """Per (sub)command path: its help text, its defaults and what each of its arguments is."""
    actions = [
        (a.dest, tuple(a.option_strings), a.default, a.type, a.choices, a.required, a.nargs, a.const, a.help)
        for a in parser._actions
        if not isinstance(a, argparse._SubParsersAction)
    ]
    found = {path: (parser.prog, parser.format_help(), dict(parser._defaults), actions)}
    sub = _subparsers(parser)
    for name, child in sub.choices.items() if sub is not None else ():
        found.update(_tree(child, (*path, name)))
    return found


def test_commands_table_names_every_command_and_the_module_that_adds_it() -> None:
    full = _subparsers(build_parser())
    assert full is not None
    assert list(full.choices) == list(COMMANDS)  # same names, in the order --help lists them
    for command in COMMANDS:
        handlers = {p._defaults.get("handler") for p in _walk(full.choices[command])}
        modules = {h.__module__ for h in handlers if h is not None}
        assert modules <= {COMMANDS[command], "deltamirror.cli.local_registry_cmd"}, command


def test_each_module_adds_exactly_the_commands_the_table_gives_it() -> None:
    """A module's PARSERS is what build_parser calls: a command missing from it would vanish from
    the command line, one it adds beyond the table would never be built."""
    import importlib

    for module_name in PLUGINS:
        parsers = importlib.import_module(module_name).PARSERS
        assert list(parsers) == [c for c, m in COMMANDS.items() if m == module_name], module_name


def _walk(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    sub = _subparsers(parser)
    return [parser] + [p for child in (sub.choices.values() if sub else ()) for p in _walk(child)]


@pytest.mark.parametrize("command", list(COMMANDS))
def test_one_command_parser_builds_that_command_only_and_as_the_full_one(command: str) -> None:
    one = _subparsers(build_parser(command))
    full = _subparsers(build_parser())
    assert one is not None and full is not None
    assert list(one.choices) == [command]
    assert _tree(one.choices[command], (command,)) == _tree(full.choices[command], (command,))


@pytest.mark.parametrize("command", ["consume-snapshot", "schema", "local", "signal"])
def test_one_command_imports_no_other_command_module(command: str) -> None:
    code = (
        "import sys\n"
        "from deltamirror.cli.main import COMMANDS, PLUGINS, build_parser\n"
        f"build_parser({command!r})\n"
        f"print(','.join(m for m in PLUGINS if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == COMMANDS[command]
    assert len(PLUGINS) > 1  # the others were there to import


@pytest.mark.parametrize(
    "argv",
    [["--help"], ["consume-snapshot", "--help"], ["local", "kafka", "start", "--help"], ["signal", "--help"]],
)
def test_help_through_main_is_the_full_parsers(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 0
    shown = capsys.readouterr().out
    parser = build_parser()
    for name in argv[:-1]:  # down to the command asked about
        sub = _subparsers(parser)
        assert sub is not None
        parser = sub.choices[name]
    assert shown == parser.format_help()
    if argv == ["--help"]:
        assert all(name in shown for name in COMMANDS)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["no-such-command"], "invalid choice: 'no-such-command'"),
        (["consume-snapshot", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
        (["signal"], "the following arguments are required: SIGNAL"),
    ],
)
def test_errors_through_main_are_the_full_parsers(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    with pytest.raises(SystemExit):
        build_parser().parse_args(argv)
    assert capsys.readouterr().err == err


def test_version_is_read_when_asked(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"deltamirror {version('deltamirror')}\n"


def test_a_command_runs_with_what_the_process_held_at_its_start_frozen(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """main() freezes (gc.freeze) what is alive when the command starts, so the collector's full
    passes during the command skip the process's modules and classes, and unfreezes it when the
    command returns. Seen from a command of the test's own, registered as the CLI's modules are."""
    import gc
    import types

    import deltamirror.cli.main as cli_main

    seen: list[int] = []

    def add_gc_probe(sub: Any) -> None:
        parser = sub.add_parser("gc-probe")
        parser.set_defaults(handler=lambda args: seen.append(gc.get_freeze_count()) or 0)

    probe = types.ModuleType("gc_probe_cmd")
    probe.PARSERS = {"gc-probe": add_gc_probe}  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "gc_probe_cmd", probe)
    monkeypatch.setitem(cli_main.COMMANDS, "gc-probe", "gc_probe_cmd")
    monkeypatch.setattr(cli_main, "PLUGINS", (*cli_main.PLUGINS, "gc_probe_cmd"))
    assert gc.get_freeze_count() == 0  # this process froze nothing of its own
    assert main(["gc-probe"]) == 0
    assert len(seen) == 1 and seen[0] > 10_000  # the modules and classes of the whole test session
    assert gc.get_freeze_count() == 0
