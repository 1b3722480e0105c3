"""What tells an operator that ``watch`` works: a periodic status line and the broker's health.

**The status line.** One info line every ``status_interval_s`` (default 60 s), whatever the number
of tables: what was published since the last line (versions, events, tables), how many tables are
behind and the most behind ones, how many are stopped on an error. One line per published version
would be what a watcher of one table wants and a flood at thousands of tables; the summary says
the same for one table (``lastPublished`` names each table's version while there are at most
:data:`NAMED_TABLES`) and stays one line at any scale. Each version is also logged at debug.

**The broker.** A thread asks the brokers for metadata every :data:`PROBE_INTERVAL_S`; once none
has answered for ``broker_timeout_s`` (default 30 s) ``/healthz`` says unhealthy with the reason,
and one error line says so (one info line when it answers again).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from deltamirror.core.redact import redact

from .metrics import Metrics

log = logging.getLogger("deltamirror.watch")

#: tables named one by one in the status line (beyond: counts only)
NAMED_TABLES = 10
#: the most behind tables the status line names
MOST_BEHIND = 3
#: how often the brokers are asked whether they answer
PROBE_INTERVAL_S = 5.0


class StatusLog:
    """Counts what the tables publish (called from every table's thread) and logs a summary line."""

    def __init__(self, interval_s: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._versions = 0
        self._events = 0
        self._published: dict[str, int] = {}  # since the last line
        self._last: dict[str, int] = {}
        self._behind: dict[str, int] = {}
        self._failing: set[str] = set()
        self._thread: threading.Thread | None = None

    # --- Metrics: what the tables report ---------------------------------------------------------

    def published_version(self, table: str, version: int, commit_ts_ms: int) -> None:
        lag_ms = max(0, int(time.time() * 1000) - commit_ts_ms)
        log.debug("published", extra={"table": table, "version": version, "lagMs": lag_ms})
        with self._lock:
            self._versions += 1
            self._published[table] = version
            self._last[table] = version

    def versions_behind(self, table: str, n: int) -> None:
        with self._lock:
            if n:
                self._behind[table] = n
            else:
                self._behind.pop(table, None)

    def event_published(self, table: str, n: int = 1) -> None:
        with self._lock:
            self._events += n

    def transaction_committed(self, table: str) -> None:
        pass

    def transaction_aborted(self, table: str) -> None:
        pass

    def table_error(self, table: str, reason: str) -> None:
        with self._lock:
            self._failing.add(table)

    def schema_refused(self, table: str) -> None:
        pass

    def table_ok(self, table: str) -> None:
        with self._lock:
            self._failing.discard(table)

    def forget_table(self, table: str) -> None:
        with self._lock:
            for known in (self._published, self._last, self._behind):
                known.pop(table, None)
            self._failing.discard(table)

    def retention_headroom(self, table: str, seconds: float) -> None:
        pass

    def hanging_transactions(self, table: str, partitions: int) -> None:
        pass

    def set_healthy(self, ok: bool, reason: str = "") -> None:
        pass

    # --- the line ---------------------------------------------------------------------------------

    def line(self, tables: int) -> tuple[str, dict[str, Any]]:
        """The summary since the last one (and resets the counts): the message and its fields."""
        with self._lock:
            versions, events, published = self._versions, self._events, self._published
            self._versions, self._events, self._published = 0, 0, {}
            behind = sorted(self._behind.items(), key=lambda item: -item[1])
            failing = len(self._failing)
            last = dict(self._last)
        fields: dict[str, Any] = {
            "tables": tables,
            "versionsPublished": versions,
            "eventsPublished": events,
            "tablesPublished": len(published),
            "tablesBehind": len(behind),
            "tablesFailing": failing,
        }
        if behind:
            fields["mostBehind"] = ", ".join(f"{redact(t)} ({n} versions)" for t, n in behind[:MOST_BEHIND])
        if len(last) <= NAMED_TABLES:
            fields["lastPublished"] = ", ".join(f"{redact(t)} v{v}" for t, v in sorted(last.items()))
        message = (
            f"status: {versions} versions ({events} events) of {len(published)} tables published in the "
            f"last {self.interval_s:g} s; {len(behind)} of {tables} tables behind, {failing} stopped on an error"
        )
        return message, fields

    def start(self, tables: Callable[[], int], stop: threading.Event) -> None:
        def run() -> None:
            while not stop.wait(self.interval_s):
                message, fields = self.line(tables())
                log.info(message, extra=fields)

        self._thread = threading.Thread(target=run, name="watch-status", daemon=True)
        self._thread.start()


class Tee:
    """Every report to each of ``targets`` (the served metrics, the status line)."""

    def __init__(self, *targets: Metrics) -> None:
        self.targets = targets

    def __getattr__(self, name: str) -> Callable[..., None]:
        methods = [getattr(target, name) for target in self.targets]

        def call(*args: Any, **kwargs: Any) -> None:
            for method in methods:
                method(*args, **kwargs)

        # kept: the next report of this kind finds it without building it again (every table's
        # idle turn reports; 10,000 tables made ~330 such closures a second)
        setattr(self, name, call)
        return call


@runtime_checkable
class BrokerHealth(Protocol):
    """Where the brokers' silence is reported (:class:`~.metrics.WatcherMetrics`)."""

    def kafka_unreachable(self, reason: str | None) -> None: ...


class BrokerWatch:
    """Asks the brokers for metadata now and then; reports a silence longer than ``timeout_s``."""

    def __init__(
        self,
        probe: Callable[[float], bool],
        servers: str,
        timeout_s: float,
        health: BrokerHealth | None,
        *,
        interval_s: float = PROBE_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.probe = probe
        self.servers = servers
        self.timeout_s = timeout_s
        self.health = health
        self.interval_s = interval_s
        self._clock = clock
        self.silent_since: float | None = None
        self.reported = False

    def check(self) -> None:
        """One probe (one second at most: a stop is never held up), and what follows from it."""
        now = self._clock()
        if self.probe(min(1.0, self.timeout_s)):
            if self.reported:
                log.info("Kafka at %s answers again", self.servers)
                if self.health is not None:
                    self.health.kafka_unreachable(None)
            self.silent_since, self.reported = None, False
            return
        if self.silent_since is None:
            self.silent_since = now
        silent = self._clock() - self.silent_since
        if silent >= self.timeout_s and not self.reported:
            self.reported = True
            reason = f"Kafka at {self.servers} has not answered for {silent:.0f} s"
            log.error("%s: /healthz reports unhealthy until it answers", reason)
            if self.health is not None:
                self.health.kafka_unreachable(reason)


__all__ = ["NAMED_TABLES", "PROBE_INTERVAL_S", "BrokerHealth", "BrokerWatch", "StatusLog", "Tee"]
