"""A progress line on stderr for long commands, redrawn in place and cleared at the end.

The library reports progress through plain ``progress(done, total)`` callbacks and never prints;
this is the command line's renderer for them. It draws only where a person watches: stderr is a
terminal and the output is not written to that same terminal (a row printed after a ``\\r`` line
would land in the middle of it). Piped or redirected, a command prints exactly what it printed
before, so scripts see no difference.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from types import TracebackType
from typing import IO

#: at most this many redraws per second, whatever the caller reports
REDRAWS_PER_SECOND = 5

Progress = Callable[[int, int], None]


def add_progress_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress line on stderr (it is only drawn when stderr is a terminal)",
    )


def _isatty(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # closed or not a real stream
        return False


def wanted(args: argparse.Namespace, stream: IO[str] | None = None) -> bool:
    """Whether a command given ``args`` should draw progress on ``stream`` (stderr)."""
    stream = stream if stream is not None else sys.stderr
    if getattr(args, "no_progress", False) or not _isatty(stream):
        return False
    output = getattr(args, "output", None)
    to_stdout = output is None or output == "-"
    return not (to_stdout and _isatty(sys.stdout))


class ProgressLine:
    """One status line, ``label: done/total unit (pct%)``, redrawn with ``\\r``.

    Use as a context manager: the line is cleared on the way out, on success or failure, so an
    error message starts on a clean line.
    """

    def __init__(
        self,
        enabled: bool,
        stream: IO[str] | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self._clock = clock
        self._last = float("-inf")
        self._width = 0

    def __enter__(self) -> ProgressLine:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.clear()

    def callback(self, label: str, unit: str) -> Progress | None:
        """A ``progress(done, total)`` for the library, or None when nothing is drawn."""
        if not self.enabled:
            return None

        started = False

        def report(done: int, total: int) -> None:
            nonlocal started
            pct = f" ({100 * done // total}%)" if total else ""
            # a new stage shows at once, and its end is not skipped for the rate
            self.draw(f"{label}: {done}/{total} {unit}{pct}", now=not started or done >= total)
            started = True

        return report

    def draw(self, text: str, *, now: bool = False) -> None:
        """Show ``text``; unless ``now``, only if the last redraw is old enough."""
        if not self.enabled:
            return
        at = self._clock()
        if at - self._last < 1 / REDRAWS_PER_SECOND and not now:
            return
        self._last = at
        text = text[: self._columns() - 1]
        self._stream.write("\r" + text + " " * max(0, self._width - len(text)))
        self._stream.flush()
        self._width = len(text)

    def clear(self) -> None:
        if self._width:
            self._stream.write("\r" + " " * self._width + "\r")
            self._stream.flush()
            self._width = 0

    def _columns(self) -> int:
        """The terminal's width: a longer line would wrap, and ``\\r`` redraws only the last row."""
        try:
            return os.get_terminal_size(self._stream.fileno()).columns or 80
        except (AttributeError, ValueError, OSError):
            return 80
