"""Reading the next versions while a transaction drains: order, bounds, and errors in their turn.

Without Kafka: the pipeline's watcher and producer are stand-ins that hand out numbered units,
fail where told, and say how many records are still on their way to the broker.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from deltamirror.core.errors import CorruptLogError
from deltamirror.mirror import KafkaSettings
from deltamirror.producer import TableConfig, WatchConfig
from deltamirror.producer import pipeline as pipeline_module
from deltamirror.producer.metrics import WatcherMetrics
from deltamirror.producer.pipeline import TablePipeline
from deltamirror.producer.tailing.work import CommitWork
from support.tables import TABLES


class _Scan:
    def __init__(self, size: int) -> None:
        self.file = type("Info", (), {"size": size})()


class _Unit(CommitWork):
    """A CommitWork in name only: the drain reads its number and its file size."""

    def __init__(self, n: int, size: int = 1000) -> None:  # no super().__init__: nothing else is read
        self.version = n
        self.scan = _Scan(size)  # type: ignore[assignment]


class _Watcher:
    """Hands out units 1, 2, ... and raises ``fail_at`` instead of that unit."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.n = 0
        self.fail_at = fail_at
        self.calls = 0

    def next_work(self) -> Any:
        self.calls += 1
        self.n += 1
        if self.n == self.fail_at:
            raise CorruptLogError("broken line", version=self.n, line=3)
        return _Unit(self.n)

    def next_commit_size(self) -> int:
        return 0


class _Publisher:
    def __init__(self, in_flight: list[int]) -> None:
        self._in_flight = in_flight  # answers of in_flight(), in turn (0 once they run out)

    def in_flight(self) -> int:
        return self._in_flight.pop(0) if self._in_flight else 0


@pytest.fixture
def pipe() -> TablePipeline:
    table = TABLES / "drs__checkpoints"
    cfg = WatchConfig(
        kafka=KafkaSettings(bootstrap_servers="127.0.0.1:1"),
        tables=[TableConfig(uri=str(table))],
        use_notifications=False,
    )
    return TablePipeline(cfg, cfg.tables[0], metrics=WatcherMetrics(), stop=threading.Event())


def _versions(p: TablePipeline, n: int) -> list[int]:
    out = []
    for _ in range(n):
        work = p._next_work()
        assert isinstance(work, _Unit)
        out.append(work.version)
    return out


def test_units_read_while_draining_come_out_first_in_order(pipe: TablePipeline) -> None:
    watcher = _Watcher()
    pipe.watcher = watcher  # type: ignore[assignment]
    pipe.txns.pub = _Publisher([5, 5, 5])  # type: ignore[assignment]
    pipe._read_while_draining()
    assert watcher.calls == 3  # as long as records were on their way, no longer
    assert _versions(pipe, 5) == [1, 2, 3, 4, 5]


def test_reading_ahead_stops_at_its_unit_and_byte_bounds(
    pipe: TablePipeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    watcher = _Watcher()
    pipe.watcher = watcher  # type: ignore[assignment]
    pipe.txns.pub = _Publisher([1] * 100)  # type: ignore[assignment]
    monkeypatch.setattr(pipeline_module, "DRAIN_AHEAD_UNITS", 4)
    pipe._read_while_draining()
    assert watcher.calls == 4
    pipe._drained.clear()
    monkeypatch.setattr(pipeline_module, "DRAIN_AHEAD_UNITS", 100)
    monkeypatch.setattr(pipeline_module, "DRAIN_AHEAD_BYTES", 2500)  # units of 1000 bytes
    pipe._read_while_draining()
    assert watcher.calls == 4 + 3


def test_an_error_met_while_draining_is_raised_after_the_units_before_it(pipe: TablePipeline) -> None:
    watcher = _Watcher(fail_at=3)
    pipe.watcher = watcher  # type: ignore[assignment]
    pipe.txns.pub = _Publisher([9] * 10)  # type: ignore[assignment]
    pipe._read_while_draining()
    assert watcher.calls == 3  # nothing is read past the error
    assert _versions(pipe, 2) == [1, 2]
    with pytest.raises(CorruptLogError, match="broken line"):
        pipe._next_work()
    assert isinstance(pipe._next_work(), _Unit)  # then the watcher again (restarted, in real life)


def test_nothing_is_read_ahead_once_a_stop_is_requested(pipe: TablePipeline) -> None:
    watcher = _Watcher()
    pipe.watcher = watcher  # type: ignore[assignment]
    pipe.txns.pub = _Publisher([9] * 10)  # type: ignore[assignment]
    pipe.stop.set()
    pipe._read_while_draining()
    assert watcher.calls == 0
