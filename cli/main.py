"""The ``deltamirror`` command: a thin layer over the library.

Each subcommand imports what it needs when it runs, so ``--help`` is fast and works without the
optional extras, and core never sees Kafka or Spark. A DeltaMirrorError becomes one line on stderr
and its exit code (2 for bad input); anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

# subcommand modules that add themselves with register(subparsers); imported lazily
PLUGINS = (
    "deltamirror.cli.table_cmds",
    "deltamirror.cli.changes_cmd",
    "deltamirror.cli.producer_cmds",
    "deltamirror.cli.consumer_cmds",
    "deltamirror.cli.local_kafka_cmd",
    "deltamirror.cli.signal_cmd",
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # one line, exit 2, as for every bad input
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="deltamirror",
        description="Mirror Delta Lake tables into Kafka; read snapshots, history and change data feeds.",
    )
    from importlib.metadata import PackageNotFoundError, version

    with contextlib.suppress(PackageNotFoundError):  # a bare checkout has no metadata
        parser.add_argument("--version", action="version", version=f"deltamirror {version('deltamirror')}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name in PLUGINS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    # the signals are taken first, before anything else runs (deltamirror.ops.stopping): a short
    # command unwinds on SIGTERM like Ctrl-C, so an -o file being written is removed, never left
    # half done; a long-running one (watch, consume-snapshot, invalidate, demo) stops cleanly
    # within the deadline however many signals arrive
    from deltamirror.ops.stopping import StopSignals

    in_main_thread = threading.current_thread() is threading.main_thread()
    stops = StopSignals(mode="unwind").install() if in_main_thread else None
    try:
        return _main(argv, stops)
    finally:
        if stops is not None:
            stops.uninstall()


def _main(argv: Sequence[str] | None, stops: Any) -> int:
    from deltamirror.core.errors import DeltaMirrorError

    parser = build_parser()
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
