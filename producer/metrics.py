"""What the watcher exposes to operators: Prometheus metrics and a health endpoint.

The metrics live on a private ``CollectorRegistry`` so that two watchers in one process (tests, a
library user) never share or double-register series. Every metric is labelled by ``table`` (the
table's normalized URI) and prefixed ``deltamirror_``:

=============================================== =====================================================
``deltamirror_last_published_version``          last version whose records are committed to Kafka
``deltamirror_last_commit_timestamp_seconds``   commit timestamp of that version (epoch seconds)
``deltamirror_milliseconds_behind_commit``      publish time minus commit time of that version, as
                                                Debezium's MilliSecondsBehindSource: it measures
                                                latency when caught up and the backlog when catching up
``deltamirror_last_publish_timestamp_seconds``  wall time of the last publish: ``time() - x`` alerts on
                                                a watcher that stopped publishing
``deltamirror_versions_behind``                 versions in the log not yet published
``deltamirror_events_published_total``          action records published (``rate()`` = events/second)
``deltamirror_transactions_committed_total``    Kafka transactions committed
``deltamirror_transactions_aborted_total``      Kafka transactions aborted
``deltamirror_table_up``                        1 while the table is mirrored, 0 while it is stopped
                                                on an error
``deltamirror_table_errors_total``              times the table stopped on an error
``deltamirror_schema_registry_refusals_total``  times the table stopped because the Schema Registry
                                                refused a schema its row changes need (format
                                                ``avro``: incompatible under the subject's
                                                compatibility level, not registered with
                                                ``auto_register`` off, unauthorized): an operator
                                                decides (the log line and /healthz name the version
                                                and the subject); nothing of the version is published
``deltamirror_healthy``                         1 when the watcher reports itself healthy
``deltamirror_log_retention_headroom_seconds``  ``delta.logRetentionDuration`` minus the age of the
                                                last version published while the table is behind
                                                (the whole retention when caught up): near 0, log
                                                cleanup may delete versions before they are published
``deltamirror_kafka_reachable``                 0 once no broker answered for ``broker_timeout_s``
``deltamirror_hanging_transactions``            partitions the table needs that a transaction nobody
                                                ends holds (``producer/publishing/hanging.py``): the
                                                table publishes nothing until an operator aborts it
=============================================== =====================================================

In a group of watchers (``watch --group``), per instance and without a ``table`` label:

=============================================== =====================================================
``deltamirror_group_owned_tables``              tables running here now
``deltamirror_group_owned_shards``              shards of the assignment topic assigned here now
``deltamirror_group_shards_assigned_total``     shards this instance gained (``rate()``: moves in)
``deltamirror_group_shards_revoked_total``      shards it handed over or lost (``rate()``: moves out)
``deltamirror_group_tables_released_total``     tables stopped here while the instance goes on
                                                (label ``reason``: ``revoked``, ``lost``, ``fenced``
                                                when another instance's producer took it over, or
                                                the reason a table was removed)
``deltamirror_group_rebalance_seconds``         how long the last rebalance took here: from the
                                                callback until the revoked tables stopped, or the
                                                assigned ones resumed from their progress
=============================================== =====================================================

With ``discover`` prefixes, per prefix (label ``prefix``, the prefix's URI redacted):

=============================================== =====================================================
``deltamirror_discovery_tables``                tables the last successful scan found under the prefix
``deltamirror_discovery_scans_total``           scans of the prefix (failed ones included)
``deltamirror_discovery_scan_errors_total``     scans that failed (the prefix could not be listed)
``deltamirror_discovery_last_scan_seconds``     how long the last scan of the prefix took
``deltamirror_discovery_tables_dropped_total``  tables of the prefix announced dropped and forgotten
=============================================== =====================================================

The per-table lag is ``deltamirror_versions_behind`` (versions in the log not yet published). A
table that no longer runs here (dropped, removed, or moved to another member of its group) keeps
no series on ``/metrics`` and no entry on ``/healthz`` (:meth:`WatcherMetrics.forget_table`).

``GET /healthz`` has a ``group`` member in group mode: ``{"id", "state": "joined" | "rebalancing"
| "not joined", "assignments", "ownedShards": [...]}``; an instance that is not joined is unhealthy.

``GET /healthz`` answers 200 ``{"status": "ok", ...}`` when the watcher said it is healthy, no
table is stopped on an error and a broker answered within ``broker_timeout_s``, else 503 with the
reason; the watcher starts unhealthy ("starting")
until it calls ``set_healthy(True)``, so a container is not marked healthy before it has resumed.
Both endpoints are served by :func:`deltamirror.ops.serve` (re-exported here as :func:`serve`, on
port 9464 by default), bound to 127.0.0.1 unless told otherwise: they describe the tables being
mirrored.

A table URI may hold credentials (``s3://key:secret@bucket/t``): the ``table`` label, the table
names and the reasons of ``/healthz`` are redacted (``s3://***@bucket/t``, core/redact.py).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from prometheus_client import CollectorRegistry, Counter, Gauge

from deltamirror.core.redact import redact
from deltamirror.ops import DEFAULT_HOST, Served, ServerHandle
from deltamirror.ops import serve as _serve

#: the watcher's port (the OpenTelemetry Prometheus exporter's); the consumers default to 9465
DEFAULT_PORT = 9464
PREFIX = "deltamirror_"


class Metrics(Protocol):
    """What the tables and the service report as they go (``WatcherMetrics``, ``NullMetrics``, a
    bench's recorder): called on the hot path, from every table's thread."""

    def published_version(self, table: str, version: int, commit_ts_ms: int) -> None: ...

    def versions_behind(self, table: str, n: int) -> None: ...

    def event_published(self, table: str, n: int = 1) -> None: ...

    def transaction_committed(self, table: str) -> None: ...

    def transaction_aborted(self, table: str) -> None: ...

    def table_error(self, table: str, reason: str) -> None: ...

    def schema_refused(self, table: str) -> None: ...

    def table_ok(self, table: str) -> None: ...

    def forget_table(self, table: str) -> None: ...

    def retention_headroom(self, table: str, seconds: float) -> None: ...

    def hanging_transactions(self, table: str, partitions: int) -> None: ...

    def set_healthy(self, ok: bool, reason: str = "") -> None: ...


@runtime_checkable
class GroupMetrics(Protocol):
    """What a watcher in a group reports besides the tables' own figures."""

    def group_status(self, group_id: str, state: str, assignments: int, shards: frozenset[int]) -> None: ...

    def shards_moved(self, assigned: int = 0, revoked: int = 0) -> None: ...

    def rebalance_took(self, seconds: float) -> None: ...

    def owned_tables(self, n: int) -> None: ...

    def table_released(self, table: str, reason: str) -> None: ...


@runtime_checkable
class DiscoveryMetrics(Protocol):
    """What the discovery of tables under prefixes reports, per prefix (its URI, not yet redacted)."""

    def discovery_scanned(self, prefix: str, seconds: float, tables: int | None) -> None: ...

    def discovery_table_dropped(self, prefix: str) -> None: ...


@runtime_checkable
class ServedMetrics(Metrics, Served, Protocol):
    """Metrics that :func:`serve` can expose: a Prometheus registry and the body of ``/healthz``."""


class NullMetrics:
    """Measures nothing: for an embedding that has its own monitoring (it cannot be served)."""

    def published_version(self, table: str, version: int, commit_ts_ms: int) -> None:
        pass

    def versions_behind(self, table: str, n: int) -> None:
        pass

    def event_published(self, table: str, n: int = 1) -> None:
        pass

    def transaction_committed(self, table: str) -> None:
        pass

    def transaction_aborted(self, table: str) -> None:
        pass

    def table_error(self, table: str, reason: str) -> None:
        pass

    def schema_refused(self, table: str) -> None:
        pass

    def table_ok(self, table: str) -> None:
        pass

    def forget_table(self, table: str) -> None:
        pass

    def retention_headroom(self, table: str, seconds: float) -> None:
        pass

    def hanging_transactions(self, table: str, partitions: int) -> None:
        pass

    def set_healthy(self, ok: bool, reason: str = "") -> None:
        pass


@dataclass
class _TableHealth:
    #: the table's name as shown (label, /healthz): its URI, redacted
    label: str = ""
    up: bool = True
    reason: str = ""
    last_published_version: int | None = None


class WatcherMetrics:
    """The watcher's measurements; every method is cheap and thread-safe (call it on the hot path)."""

    def __init__(
        self, registry: CollectorRegistry | None = None, *, clock: Callable[[], float] = time.time
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        self._clock = clock
        self._lock = threading.Lock()
        self._healthy = False
        self._reason = "starting"
        self._tables: dict[str, _TableHealth] = {}

        #: every metric labelled by table: what forget_table removes
        self._per_table: list[Gauge | Counter] = []

        def gauge(name: str, doc: str, labels: tuple[str, ...] = ("table",)) -> Gauge:
            metric = Gauge(PREFIX + name, doc, labels, registry=self.registry)
            if "table" in labels:
                self._per_table.append(metric)
            return metric

        def counter(name: str, doc: str) -> Counter:
            metric = Counter(PREFIX + name, doc, ("table",), registry=self.registry)
            self._per_table.append(metric)
            return metric

        self._version = gauge("last_published_version", "Last Delta version committed to Kafka.")
        self._commit_ts = gauge(
            "last_commit_timestamp_seconds", "Commit timestamp of the last published version (epoch s)."
        )
        self._behind_ms = gauge(
            "milliseconds_behind_commit",
            "Publish time minus commit time of the last published version, in milliseconds.",
        )
        self._publish_ts = gauge(
            "last_publish_timestamp_seconds", "Wall time when the last version was published (epoch s)."
        )
        self._versions_behind = gauge("versions_behind", "Versions in the log not yet published.")
        self._events = counter("events_published", "Action records published to Kafka.")
        self._commits = counter("transactions_committed", "Kafka transactions committed.")
        self._aborts = counter("transactions_aborted", "Kafka transactions aborted.")
        self._table_up = gauge("table_up", "1 while the table is mirrored, 0 while stopped on an error.")
        self._table_errors = counter("table_errors", "Times the table stopped on an error.")
        self._refusals = counter(
            "schema_registry_refusals",
            "Times the table stopped because the Schema Registry refused a schema its row changes need.",
        )
        self._healthy_gauge = gauge("healthy", "1 when the watcher reports itself healthy.", ())
        self._healthy_gauge.set(0)
        self._headroom = gauge(
            "log_retention_headroom_seconds",
            "Log retention left before the oldest unpublished version may be cleaned up.",
        )
        self._hanging = gauge(
            "hanging_transactions",
            "Partitions the table needs that a transaction nobody ends holds (an operator must abort it).",
        )
        self._kafka_reachable = gauge("kafka_reachable", "0 while the brokers do not answer.", ())
        self._kafka_reachable.set(1)
        #: why the brokers count as unreachable (None: they answer)
        self._kafka_problem: str | None = None
        self._group: dict[str, Any] | None = None
        self._owned_tables = gauge("group_owned_tables", "Tables running on this instance.", ())
        self._owned_shards = gauge("group_owned_shards", "Shards assigned to this instance.", ())
        self._shards_assigned = Counter(
            PREFIX + "group_shards_assigned", "Shards this instance gained.", registry=self.registry
        )
        self._shards_revoked = Counter(
            PREFIX + "group_shards_revoked",
            "Shards this instance handed over or lost.",
            registry=self.registry,
        )
        self._released = Counter(
            PREFIX + "group_tables_released",
            "Tables stopped here while the instance goes on (moved, fenced, removed).",
            ("reason",),
            registry=self.registry,
        )
        self._rebalance_s = gauge("group_rebalance_seconds", "Duration of the last rebalance here.", ())
        self._found = gauge("discovery_tables", "Tables the last scan found under the prefix.", ("prefix",))
        self._scans = Counter(
            PREFIX + "discovery_scans", "Scans of the prefix.", ("prefix",), registry=self.registry
        )
        self._scan_errors = Counter(
            PREFIX + "discovery_scan_errors", "Scans that failed.", ("prefix",), registry=self.registry
        )
        self._scan_s = gauge("discovery_last_scan_seconds", "Duration of the last scan.", ("prefix",))
        self._dropped = Counter(
            PREFIX + "discovery_tables_dropped",
            "Tables of the prefix announced dropped and forgotten.",
            ("prefix",),
            registry=self.registry,
        )

    # --- per table --------------------------------------------------------------------------

    def _table(self, table: str) -> _TableHealth:
        """The table's state; on first sight, every per-table series starts at 0 (rate() needs it)."""
        state = self._tables.get(table)
        if state is None:
            with self._lock:
                state = self._tables.get(table)
                if state is None:
                    label = redact(table)
                    for counter in (
                        self._events,
                        self._commits,
                        self._aborts,
                        self._table_errors,
                        self._refusals,
                    ):
                        counter.labels(label)
                    self._table_up.labels(label).set(1)
                    self._hanging.labels(label).set(0)
                    state = self._tables[table] = _TableHealth(label=label)
        return state

    def published_version(self, table: str, version: int, commit_ts_ms: int) -> None:
        """A version's last transaction committed: record where the table stands."""
        now = self._clock()
        state = self._table(table)
        state.last_published_version = version
        self._version.labels(state.label).set(version)
        self._commit_ts.labels(state.label).set(commit_ts_ms / 1000)
        self._behind_ms.labels(state.label).set(max(0, round(now * 1000) - commit_ts_ms))
        self._publish_ts.labels(state.label).set(now)

    def versions_behind(self, table: str, n: int) -> None:
        self._versions_behind.labels(self._table(table).label).set(n)

    def event_published(self, table: str, n: int = 1) -> None:
        if n < 0:
            raise ValueError(f"event count must be >= 0, got {n}")
        self._events.labels(self._table(table).label).inc(n)

    def transaction_committed(self, table: str) -> None:
        self._commits.labels(self._table(table).label).inc()

    def transaction_aborted(self, table: str) -> None:
        self._aborts.labels(self._table(table).label).inc()

    def table_error(self, table: str, reason: str) -> None:
        """The table stopped on an error (others go on); /healthz reports it until ``table_ok``."""
        state = self._table(table)
        with self._lock:
            was_up, state.up, state.reason = state.up, False, redact(reason)
        self._table_up.labels(state.label).set(0)
        if was_up:
            self._table_errors.labels(state.label).inc()

    def schema_refused(self, table: str) -> None:
        """The Schema Registry refused a schema of the table: counted when it stops the table (call it
        before :meth:`table_error`; the retries that stop on it again count nothing)."""
        state = self._table(table)
        if state.up:
            self._refusals.labels(state.label).inc()

    def table_ok(self, table: str) -> None:
        state = self._table(table)
        with self._lock:
            state.up, state.reason = True, ""
        self._table_up.labels(state.label).set(1)

    def forget_table(self, table: str) -> None:
        """The table no longer runs here (dropped, removed, moved): its health and every per-table
        series (each metric labelled ``table``, found in the registry) leave this instance."""
        with self._lock:
            state = self._tables.pop(table, None)
        if state is None:
            return
        for metric in self._per_table:
            with contextlib.suppress(KeyError):
                metric.remove(state.label)

    def retention_headroom(self, table: str, seconds: float) -> None:
        self._headroom.labels(self._table(table).label).set(seconds)

    def hanging_transactions(self, table: str, partitions: int) -> None:
        self._hanging.labels(self._table(table).label).set(partitions)

    def kafka_unreachable(self, reason: str | None) -> None:
        """The brokers have not answered for too long (``reason``), or answer again (None)."""
        with self._lock:
            self._kafka_problem = None if reason is None else redact(reason)
        self._kafka_reachable.set(1 if reason is None else 0)

    # --- the group ----------------------------------------------------------------------------

    def group_status(self, group_id: str, state: str, assignments: int, shards: frozenset[int]) -> None:
        with self._lock:
            self._group = {
                "id": group_id,
                "state": state,
                "assignments": assignments,
                "ownedShards": sorted(shards),
            }
        self._owned_shards.set(len(shards))

    def shards_moved(self, assigned: int = 0, revoked: int = 0) -> None:
        self._shards_assigned.inc(assigned)
        self._shards_revoked.inc(revoked)

    def rebalance_took(self, seconds: float) -> None:
        self._rebalance_s.set(seconds)

    def owned_tables(self, n: int) -> None:
        self._owned_tables.set(n)

    def table_released(self, table: str, reason: str) -> None:
        self._released.labels(reason).inc()
        self.forget_table(table)

    # --- discovery ------------------------------------------------------------------------------

    def discovery_scanned(self, prefix: str, seconds: float, tables: int | None) -> None:
        """One scan of ``prefix`` ended: ``tables`` found, or None when it failed."""
        label = redact(prefix)
        self._scans.labels(label).inc()
        self._scan_errors.labels(label).inc(0 if tables is not None else 1)
        self._scan_s.labels(label).set(seconds)
        if tables is not None:
            self._found.labels(label).set(tables)
        self._dropped.labels(label)  # at 0 from the first scan on (rate() needs it)

    def discovery_table_dropped(self, prefix: str) -> None:
        self._dropped.labels(redact(prefix)).inc()

    # --- the process ------------------------------------------------------------------------

    def set_healthy(self, ok: bool, reason: str = "") -> None:
        with self._lock:
            self._healthy, self._reason = ok, redact(reason)
        self._healthy_gauge.set(1 if ok else 0)

    def health(self) -> tuple[bool, dict[str, Any]]:
        """(healthy, the JSON body of /healthz)."""
        with self._lock:
            tables = {
                state.label: {
                    "status": "ok" if state.up else "error",
                    **({"reason": state.reason} if not state.up else {}),
                    "lastPublishedVersion": state.last_published_version,
                }
                for _, state in sorted(self._tables.items())
            }
            failing = [state.label for _, state in sorted(self._tables.items()) if not state.up]
            healthy, reason = self._healthy, self._reason
            group = None if self._group is None else dict(self._group)
            kafka_problem = self._kafka_problem
        if kafka_problem is not None:
            healthy, reason = False, kafka_problem
        if group is not None and healthy and group["state"] == "not joined":
            healthy, reason = False, f"not joined to group {group['id']}"
        if failing:  # said while starting too: a table may be held up before the watcher is healthy
            stopped = f"{len(failing)} table(s) stopped on an error: {', '.join(failing)}"
            reason = stopped if healthy else f"{reason}; {stopped}"
        ok = healthy and not failing
        if ok:
            status = "ok"
        elif not healthy and reason == "starting":
            status = "starting"
        else:
            status = "unhealthy"
        body: dict[str, Any] = {"status": status, "tables": tables}
        if group is not None:
            body["group"] = group
        if not ok:
            body["reason"] = reason or "unhealthy"
        return ok, body


# --- the HTTP server: deltamirror.ops, with the watcher's default port --------------------------


def serve(metrics: ServedMetrics, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT) -> ServerHandle:
    """Serve the watcher's ``GET /metrics`` and ``GET /healthz`` (:func:`deltamirror.ops.serve`)."""
    return _serve(metrics, host, port=port)


__all__ = [
    "DEFAULT_HOST",
    "DEFAULT_PORT",
    "DiscoveryMetrics",
    "GroupMetrics",
    "Metrics",
    "NullMetrics",
    "ServedMetrics",
    "ServerHandle",
    "WatcherMetrics",
    "serve",
]
