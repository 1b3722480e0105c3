"""The ``deltamirror`` command: a thin layer over the library.

Each subcommand imports what it needs when it runs, so ``--help`` is fast and works without the
optional extras, and core never sees Kafka or Spark. A DeltaMirrorError becomes one line on stderr
and its exit code (2 for bad input); anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

# each command and the module whose PARSERS add it, in the order --help lists them; the modules are
# imported lazily, and a command run imports and builds only its own parser (build_parser)
COMMANDS = {
    "snapshot": "deltamirror.cli.table_cmds",
    "read": "deltamirror.cli.table_cmds",
    "history": "deltamirror.cli.table_cmds",
    "changes": "deltamirror.cli.changes_cmd",
    "watch": "deltamirror.cli.producer_cmds",
    "events": "deltamirror.cli.producer_cmds",
    "schema": "deltamirror.cli.producer_cmds",
    "demo": "deltamirror.cli.producer_cmds",
    "consume-snapshot": "deltamirror.cli.consumer_cmds",
    "invalidate": "deltamirror.cli.consumer_cmds",
    "local": "deltamirror.cli.local_kafka_cmd",
    "signal": "deltamirror.cli.signal_cmd",
}
PLUGINS = tuple(dict.fromkeys(COMMANDS.values()))


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # one line, exit 2, as for every bad input
        self.exit(2, f"{self.prog}: error: {message}\n")


class _Version(argparse._VersionAction):
    """``--version``: the installed version, read from the package's metadata when asked (parsing
    it costs every command ~15 ms)."""

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        from importlib.metadata import version

        self.version = f"deltamirror {version('deltamirror')}"
        super().__call__(parser, *args, **kwargs)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser. With ``command`` (a name in COMMANDS) only that command's parser
    is built, and only its module imported: what ``deltamirror COMMAND ...`` parses with (building
    all ~20, with the metadata read for --version, took 21-28 ms of CPU of the restart); its help,
    defaults and errors are those of the full parser, which the top-level ``--help``,
    ``--version`` and a wrong command get."""
    parser = _Parser(
        prog="deltamirror",
        description="Mirror Delta Lake tables into Kafka; read snapshots, history and change data feeds.",
    )
    one = command if command in COMMANDS else None
    if one is None:  # --version comes before a command: a command's own parse never sees it
        from importlib.metadata import PackageNotFoundError, distribution

        with contextlib.suppress(PackageNotFoundError):  # a bare checkout has no metadata
            distribution("deltamirror")  # found, not read: _Version reads it when asked
            parser.add_argument("--version", action=_Version)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name, module_name in COMMANDS.items():
        if one is not None and name != one:
            continue
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            continue
        module.PARSERS[name](sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    # the signals are taken first, before anything else runs (deltamirror.ops.stopping): a short
    # command unwinds on SIGTERM like Ctrl-C, so an -o file being written is removed, never left
    # half done; a long-running one (watch, consume-snapshot, invalidate, demo) stops cleanly
    # within the deadline however many signals arrive
    from deltamirror.ops.stopping import StopSignals

    in_main_thread = threading.current_thread() is threading.main_thread()
    stops = StopSignals(mode="unwind").install() if in_main_thread else None
    # what the process holds when main() starts is frozen for the command's run, so the cyclic
    # collector's full passes skip it; unfrozen when the command returns. From the command line
    # that is the interpreter's and this module's objects (about 10,000): the modules a command
    # imports as it runs (pyarrow, pydantic, the consumer) come after and are not frozen. Not when
    # the process froze objects of its own: those stay as they are.
    froze = in_main_thread and gc.get_freeze_count() == 0
    if froze:
        gc.freeze()
    try:
        return _main(argv, stops)
    finally:
        if froze:
            gc.unfreeze()
        if stops is not None:
            stops.uninstall()


def _main(argv: Sequence[str] | None, stops: Any) -> int:
    from deltamirror.core.compute import keep_numpy_out_of_pyarrow
    from deltamirror.core.errors import DeltaMirrorError

    # before any command module imports pyarrow: it loads without NumPy (most of its import's cost;
    # no command hands it a NumPy array)
    keep_numpy_out_of_pyarrow()

    argv = list(sys.argv[1:] if argv is None else argv)
    # the command first (no option before it): only its parser is built
    parser = build_parser(argv[0] if argv and argv[0] in COMMANDS else None)
    args = parser.parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = args.handler
    if stops is not None and getattr(args, "long_running", False):
        stops.use_stop_mode()
    try:
        if getattr(args, "output", None) is not None:
            from .output import check_output_path

            check_output_path(args.output)  # before any work: not after an hour of it
        return handler(args) or 0
    except DeltaMirrorError as exc:
        print(f"deltamirror: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
