"""How every long-running command stops on SIGTERM and SIGINT: bounded, however many arrive.

A Python signal handler runs in the main thread between two bytecodes, wherever that thread is:
inside ``threading.Event.set`` holding the Event's lock, or blocked in a C call (a Kafka poll, a
commit) that returns only later. A handler that sets that Event deadlocks in the first case, and
does nothing until the call returns in the second. So the handlers here do no work at all:

- the signal's number is written by the interpreter's own C handler to a pipe
  (:func:`signal.set_wakeup_fd`) the moment it arrives, whatever the main thread is doing;
- the Python-level handler only counts (no lock, no I/O), or in ``unwind`` mode raises
  ``SystemExit`` as a short command expects (an ``-o`` file being written is removed);
- a thread of its own (``deltamirror-signals``) reads the pipe and acts: the first signal calls
  every stop callback with ``now=False`` (finish what is open, then exit), each later one with
  ``now=True`` (stop at once). A callback registered after the first signal is called at once.

Bounds: a signal that arrives while the command is still starting (no stop callback registered
yet: nothing has been published or taken) ends the process at once, exit 0 after one line. Once
running, the command has :data:`DEADLINE_S` from the first signal: if it is still running then,
one line says so and the process exits 1 (everything committed is kept; what was open is done
again by the next start, as after a crash). :meth:`StopSignals.install` is the first thing a
long-running command does (``deltamirror.cli.main`` does it before the command's own code).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable
from types import FrameType

log = logging.getLogger("deltamirror.stop")

#: from the first signal, how long a command has to end before the process is ended for it
DEADLINE_S = 9.5
#: how long the line said before the process is ended may hold the exit up
SAY_TIMEOUT_S = 1.0
#: what the signals do: ``unwind`` raises SystemExit in the main thread (a short command),
#: ``stop`` hands them to the stop callbacks (a long-running one)
Mode = str

StopCallback = Callable[[bool], None]

_installed: StopSignals | None = None


def installed() -> StopSignals | None:
    """The process's installed :class:`StopSignals`, if any."""
    return _installed


class StopSignals:
    """SIGTERM/SIGINT handled off the signal handler; see the module docstring."""

    def __init__(
        self,
        signals: Iterable[signal.Signals] = (signal.SIGTERM, signal.SIGINT),
        *,
        mode: Mode = "stop",
        deadline_s: float = DEADLINE_S,
        exit_process: Callable[[int], None] = os._exit,
    ) -> None:
        self.signals = tuple(signals)
        self.mode = mode
        self.deadline_s = deadline_s
        self._exit_process = exit_process
        self._callbacks: list[StopCallback] = []
        self._lock = threading.Lock()  # taken by the reader thread and callers, never by a handler
        #: signals received so far (counted by the reader thread)
        self.received = 0
        #: times the Python-level handler ran (it does nothing else)
        self.handler_calls = 0
        #: set (by the reader thread) once a stop was asked
        self.requested = threading.Event()
        self.first_at: float | None = None
        self._previous: dict[signal.Signals, object] = {}
        self._previous_fd = -1
        self._pipe: tuple[int, int] | None = None
        self._thread: threading.Thread | None = None
        self._done = threading.Event()

    # --- installing ---------------------------------------------------------------------------

    def install(self) -> StopSignals:
        """Take over the signals (main thread only); the reader thread starts."""
        global _installed
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)
        self._pipe = (read_fd, write_fd)
        self._previous_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        for sig in self.signals:
            self._previous[sig] = signal.signal(sig, self._handler)
        self._thread = threading.Thread(target=self._read, name="deltamirror-signals", daemon=True)
        self._thread.start()
        _installed = self
        return self

    def uninstall(self) -> None:
        """Give the signals back (main thread only); the reader thread ends."""
        global _installed
        if self._pipe is None:
            return
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)  # type: ignore[arg-type]
        signal.set_wakeup_fd(self._previous_fd)
        write_fd = self._pipe[1]
        self._done.set()
        with contextlib.suppress(OSError):
            os.write(write_fd, b"\0")  # wakes the reader, which closes the read end
        if self._thread is not None:
            self._thread.join(5.0)
        os.close(write_fd)
        self._pipe = None
        if _installed is self:
            _installed = None

    def __enter__(self) -> StopSignals:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.uninstall()

    # --- what a command registers -------------------------------------------------------------

    def on_stop(self, callback: StopCallback) -> None:
        """``callback(now)`` on each signal from now on (``now``: a signal after the first). Signals
        already received call it at once, once. The command is running from here on (see the
        module docstring: before this, a signal ends the process at once)."""
        with self._lock:
            self._callbacks.append(callback)
            received = self.received
        if received:
            callback(received > 1)

    def use_stop_mode(self) -> None:
        """From now on the signals are handed to the stop callbacks (a long-running command)."""
        self.mode = "stop"

    # --- the handler: nothing that takes a lock -------------------------------------------------

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        self.handler_calls += 1
        if self.mode == "unwind":  # a short command: unwind like Ctrl-C (an -o file is removed)
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            raise SystemExit(128 + signum)

    # --- the reader thread ----------------------------------------------------------------------

    def _read(self) -> None:
        assert self._pipe is not None
        read_fd = self._pipe[0]
        try:
            while True:
                try:
                    data = os.read(read_fd, 64)
                except InterruptedError:
                    continue
                if not data or self._done.is_set():
                    return
                for signum in data:
                    if signum and signum in {int(s) for s in self.signals}:
                        self._received(signal.Signals(signum))
        finally:
            os.close(read_fd)

    def _received(self, sig: signal.Signals) -> None:
        if self.mode != "stop":
            return  # unwind: the Python-level handler raises in the main thread
        with self._lock:
            self.received += 1
            first = self.received == 1
            callbacks = list(self._callbacks)
        if first:
            self.first_at = time.monotonic()
            self.requested.set()
            if not callbacks:  # still starting: nothing taken or published yet
                self._say(f"stop requested ({sig.name}) while starting: exiting")
                self._exit_process(0)
                return
            threading.Thread(target=self._deadline, name="deltamirror-stop-deadline", daemon=True).start()
        elif not callbacks:
            return
        for callback in callbacks:
            try:
                callback(not first)
            except Exception:  # a callback's bug must not end the signal handling
                log.exception("stop callback failed")

    def _deadline(self) -> None:
        if self._done.wait(self.deadline_s):
            return
        self._say(
            f"did not stop within {self.deadline_s:g} s of the stop request: exiting now "
            "(what is committed is kept; what was open is done again by the next start)"
        )
        self._exit_process(1)

    def _say(self, text: str) -> None:
        """One line before the process is ended, waited for at most :data:`SAY_TIMEOUT_S`.

        Said from a thread of its own: the stream may be blocked (a pipe nobody reads, a handler's
        lock held by the stuck main thread), and the exit must not wait on it. stdout is not
        flushed here: its writers flush each whole line, and a flush from this thread while the
        main one is in the middle of a long line would put half of it out.
        """

        def say() -> None:
            with contextlib.suppress(Exception):
                if log.hasHandlers():
                    log.warning(text)
                else:
                    print(f"deltamirror: {text}", file=sys.stderr, flush=True)
                sys.stderr.flush()

        sayer = threading.Thread(target=say, name="deltamirror-stop-say", daemon=True)
        sayer.start()
        sayer.join(SAY_TIMEOUT_S)


__all__ = ["DEADLINE_S", "StopCallback", "StopSignals", "installed"]
