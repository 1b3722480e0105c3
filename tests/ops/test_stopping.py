"""StopSignals: the handler takes no lock, the signals are acted on off the handler, and the
process is ended within the deadline whatever the command does."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator

import pytest

from deltamirror.ops.stopping import StopSignals, installed


class Exits:
    def __init__(self) -> None:
        self.codes: list[int] = []
        self.called = threading.Event()

    def __call__(self, code: int) -> None:
        self.codes.append(code)
        self.called.set()


@pytest.fixture
def exits() -> Iterator[Exits]:
    yield Exits()


def test_signals_while_its_own_lock_is_held_are_handled_once_it_is_released(exits: Exits) -> None:
    stops = StopSignals(deadline_s=60, exit_process=exits).install()
    calls: list[bool] = []
    seen = threading.Event()

    def on_stop(now: bool) -> None:
        calls.append(now)
        if len(calls) == 2:
            seen.set()

    try:
        stops.on_stop(on_stop)
        assert installed() is stops
        with stops._lock:  # the reader thread's lock: a handler that took it would hang here
            signal.raise_signal(signal.SIGTERM)
            signal.raise_signal(signal.SIGTERM)
            assert stops.handler_calls == 2  # both ran in this thread, inside the lock
        assert seen.wait(10)
        assert calls == [False, True]  # the first finishes what is open, the second stops now
        assert stops.requested.is_set() and not exits.called.is_set()
    finally:
        stops.uninstall()
    assert installed() is None
    assert signal.getsignal(signal.SIGTERM) is not stops._handler


def test_a_command_that_does_not_end_in_time_is_ended(exits: Exits) -> None:
    stops = StopSignals(deadline_s=0.2, exit_process=exits).install()
    try:
        stops.on_stop(lambda now: None)  # a command stuck somewhere: it does not end
        signal.raise_signal(signal.SIGTERM)
        assert exits.called.wait(10)
        assert exits.codes == [1]
    finally:
        stops.uninstall()


def test_a_signal_while_starting_ends_the_process_at_once_and_cleanly(exits: Exits) -> None:
    stops = StopSignals(deadline_s=60, exit_process=exits).install()
    try:
        signal.raise_signal(signal.SIGTERM)
        assert exits.called.wait(10)
        assert exits.codes == [0]
    finally:
        stops.uninstall()


def test_a_callback_registered_after_the_signal_is_called_at_once() -> None:
    stops = StopSignals(deadline_s=60, exit_process=lambda code: None).install()
    try:
        signal.raise_signal(signal.SIGTERM)
        assert stops.requested.wait(10)
        calls: list[bool] = []
        stops.on_stop(calls.append)
        assert calls == [False]
    finally:
        stops.uninstall()


def test_unwind_mode_raises_in_the_main_thread_as_a_short_command_expects() -> None:
    stops = StopSignals(mode="unwind").install()
    try:
        with pytest.raises(SystemExit) as info:
            signal.raise_signal(signal.SIGTERM)
        assert info.value.code == 128 + signal.SIGTERM
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
    finally:
        stops.uninstall()


def test_the_process_is_ended_even_when_its_last_line_cannot_be_written(
    exits: Exits, monkeypatch: pytest.MonkeyPatch
) -> None:
    """stderr blocked (a pipe nobody reads, a handler lock held by the stuck main thread): the line
    said before the exit must not hold the exit up."""
    import sys

    unblock = threading.Event()

    class Blocked:
        def write(self, text: str) -> int:
            unblock.wait(30)
            return len(text)

        def flush(self) -> None:
            unblock.wait(30)

    monkeypatch.setattr(sys, "stderr", Blocked())
    stops = StopSignals(deadline_s=0.2, exit_process=exits).install()
    try:
        stops.on_stop(lambda now: None)  # a command stuck somewhere: it does not end
        signal.raise_signal(signal.SIGTERM)
        assert exits.called.wait(5), "the exit waited for stderr"
        assert exits.codes == [1]
    finally:
        unblock.set()
        stops.uninstall()
