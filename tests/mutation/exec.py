"""Running one command of the mutation suite: the CLI in-process or a library call, never raising.

The CLI runs in-process (``deltamirror.cli.main.main(argv)`` with stdout/stderr and log records
captured, the exit code taken from its return value or SystemExit), far cheaper than a process per
command. Linux inotify (ctypes, no package) tells which files outside a table root were opened.
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import json
import logging
import os
import signal
import struct
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LIB_COMMANDS = ("lib.snapshot", "lib.read", "lib.history", "lib.changes")


# --- inotify ----------------------------------------------------------------------------------

_IN_ACCESS, _IN_OPEN, _IN_ISDIR = 0x1, 0x20, 0x40000000
_IN_NONBLOCK, _IN_CLOEXEC = 0o4000, 0o2000000


class OpenWatch:
    """Linux inotify over files and folders outside a table root: which of them got opened or read."""

    def __init__(self, paths: list[Path]) -> None:
        self._libc = ctypes.CDLL(None, use_errno=True)
        self.fd = self._libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        self.wds: dict[int, Path] = {}
        for p in paths:
            wd = self._libc.inotify_add_watch(self.fd, os.fsencode(p), _IN_OPEN | _IN_ACCESS)
            if wd >= 0:
                self.wds[wd] = p

    def drain(self) -> list[str]:
        """Files opened or read since the last drain (folders opened for listing are not counted)."""
        seen: list[str] = []
        while True:
            try:
                buf = os.read(self.fd, 65536)
            except BlockingIOError:
                return sorted(set(seen))
            i = 0
            while i < len(buf):
                wd, mask, _cookie, size = struct.unpack_from("iIII", buf, i)
                name = buf[i + 16 : i + 16 + size].rstrip(b"\0").decode(errors="replace")
                i += 16 + size
                if mask & _IN_ISDIR:
                    continue
                base = self.wds.get(wd)
                seen.append(str(base / name) if name and base else str(base))

    def close(self) -> None:
        os.close(self.fd)


# --- running one command ----------------------------------------------------------------------


class CommandTimeout(BaseException):
    """Raised by the alarm; a BaseException so that no ``except Exception`` in the code swallows it."""


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    def on_alarm(signum: int, frame: Any) -> None:
        raise CommandTimeout

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        with contextlib.suppress(Exception):
            self.lines.append(f"{record.levelname} {record.name}: {record.getMessage()}")


@dataclass
class Result:
    command: str
    exit: int | None  # None: an exception escaped (traceback) or the command timed out
    stdout: bytes = b""
    stderr: str = ""
    error: str = ""  # exception type and message, one line
    tb: str = ""
    logs: list[str] = field(default_factory=list)
    seconds: float = 0.0
    timed_out: bool = False
    opened_outside: list[str] = field(default_factory=list)


def _jsonable(obj: Any) -> Any:
    for attr in ("to_dict", "model_dump"):
        fn = getattr(obj, attr, None)
        if callable(fn):
            with contextlib.suppress(Exception):
                return fn()
    return obj


def dump_json(obj: Any) -> str:
    return json.dumps(obj, default=str, sort_keys=True, separators=(",", ":"))


def _rows(table: Any) -> list[str]:
    return sorted(dump_json(r) for r in table.to_pylist())


def _lib(command: str, uri: str, options: dict[str, str], cdf_start: int | None) -> bytes:
    """One library call, reduced to JSON text to compare (the library's own results, not the CLI's)."""
    from deltamirror.core import open_table

    table = open_table(uri, options)
    if command == "lib.snapshot":  # a header line, then one line per file (as the CLI prints it)
        snap = table.snapshot()
        ts = getattr(snap.timestamp, "timestamp", snap.timestamp)
        header = {
            "version": snap.version,
            "timestamp": ts,
            "metaData": _jsonable(snap.metadata),
            "protocol": _jsonable(snap.protocol),
        }
        return "\n".join([dump_json(header), *_rows(snap.files)]).encode()
    if command == "lib.read":
        return "\n".join(_rows(table.snapshot().to_arrow())).encode()
    if command == "lib.history":
        entries = [
            {
                "version": e.version,
                "timestamp": getattr(e.timestamp, "timestamp", e.timestamp),
                "source": str(getattr(e.timestamp, "source", "")),
                "operation": e.operation,
                "counts": e.action_counts,
                "commitInfo": _jsonable(e.commit_info),
            }
            for e in table.history()
        ]
        return "\n".join(dump_json(e) for e in entries).encode()
    from deltamirror.core.changes import read_changes

    feed = read_changes(table, starting_version=cdf_start)
    rows: list[str] = []
    for batch in feed:
        rows += (dump_json(r) for r in batch.to_pylist())
    return "\n".join(sorted(rows)).encode()


def run_command(
    command: str,
    argv: list[str],
    uri: str,
    options: dict[str, str],
    cdf_start: int | None,
    cwd: Path,
    timeout_s: float,
) -> Result:
    """One CLI command in-process (``argv``) or one library call (``lib.*``), never raising."""
    from deltamirror.cli.main import main
    from deltamirror.core.errors import DeltaMirrorError

    out, err = io.BytesIO(), io.BytesIO()
    so = io.TextIOWrapper(out, encoding="utf-8", errors="backslashreplace", write_through=True)
    se = io.TextIOWrapper(err, encoding="utf-8", errors="backslashreplace", write_through=True)
    records = _Records()
    root_logger = logging.getLogger()
    old_level = root_logger.level
    root_logger.addHandler(records)
    root_logger.setLevel(logging.INFO)
    old_cwd = os.getcwd()
    os.chdir(cwd)
    result = Result(command, None)
    start = time.perf_counter()
    try:
        with contextlib.redirect_stdout(so), contextlib.redirect_stderr(se), deadline(timeout_s):
            if command.startswith("lib."):
                try:
                    result.stdout = _lib(command, uri, options, cdf_start)
                    result.exit = 0
                except DeltaMirrorError as exc:
                    result.exit = exc.exit_code
                    result.error = f"{type(exc).__name__}: {exc}"
            else:
                try:
                    code = main(argv)
                except SystemExit as exc:
                    code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
                result.exit = int(code or 0)
    except CommandTimeout:
        result.timed_out = True
        result.error = f"timed out after {timeout_s:.0f} s"
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # a traceback: anything the code did not turn into a DeltaMirrorError
        result.exit = None
        result.error = f"{type(exc).__name__}: {str(exc)[:300]}"
        result.tb = traceback.format_exc(limit=-6)
    finally:
        os.chdir(old_cwd)
        root_logger.removeHandler(records)
        root_logger.setLevel(old_level)
        result.seconds = time.perf_counter() - start
    if not command.startswith("lib."):
        result.stdout = out.getvalue()
        result.stderr = err.getvalue().decode("utf-8", "backslashreplace")
    result.logs = records.lines
    return result
