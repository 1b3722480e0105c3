"""What a consumer exposes to operators: Prometheus metrics and a health endpoint, as the watcher does.

The metrics live on a private ``CollectorRegistry`` (two consumers in one process never share a
series) and are prefixed ``deltamirror_consumer_``, so that a watcher and a consumer scraped by one
Prometheus never collide. Per-table series are labelled by ``table`` (the table's normalized URI,
redacted, as the watcher labels it), per-partition ones by ``topic`` and ``partition``:

============================================================== =============================================
``deltamirror_consumer_last_applied_version``                  last version applied to the table's state
``deltamirror_consumer_last_commit_timestamp_seconds``         commit timestamp of that version (epoch
                                                               seconds)
``deltamirror_consumer_milliseconds_behind_commit``            apply time minus commit time of that version,
                                                               as Debezium's MilliSecondsBehindSource: the
                                                               whole path's latency (commit, watcher, Kafka,
                                                               consumer) when caught up, the backlog when
                                                               catching up
``deltamirror_consumer_last_apply_timestamp_seconds``          wall time of the last apply (``time() - x``
                                                               alerts on a table that stopped moving)
``deltamirror_consumer_versions_behind``                       versions the watcher announced on the commits
                                                               topic (commit summaries, heartbeats) and not
                                                               applied yet; only when the commits topic is
                                                               read
``deltamirror_consumer_versions_applied_total``                versions (and snapshots) applied
``deltamirror_consumer_actions_applied_total``                 actions of those versions (``rate()`` =
                                                               applied actions/second)
``deltamirror_consumer_records_behind``                        offsets between the consumer's position and
                                                               the partition's last stable offset: records
                                                               not read yet (a transaction's marker counts
                                                               too; 0 at the end)
``deltamirror_consumer_records_read_total``                    records read from Kafka, every topic
``deltamirror_consumer_last_broker_contact_timestamp_seconds`` last time the broker answered (epoch seconds)
``deltamirror_consumer_errors_total``                          times the consumer stopped on an error
``deltamirror_consumer_records_skipped_total``                 records passed over, by ``topic`` and
                                                               ``reason``: ``refused`` (a record the
                                                               boundary refused, with ``on_bad_record``
                                                               skip or dead-letter), ``unknown-kind`` (a
                                                               commits-topic kind this version does not
                                                               know, skipped as the contract says)
``deltamirror_consumer_healthy``                               1 when ``/healthz`` answers 200
============================================================== =============================================

``GET /healthz`` answers 200 ``{"status": "ok", ...}`` while the consumer is consuming, and 503
with the reason otherwise: ``starting`` until its first batch (waiting for the topics included),
``stopped`` once it returned, ``unhealthy`` when it stopped on an error (the error, redacted) or
when the broker has not answered for ``unreachable_after_s`` (60 s by default). The body lists
each table's last applied version and lag, and the records behind in total.

Measuring the records behind asks the broker for the partitions' end offsets: at most every
``lag_interval_s`` (5 s), from the consumer's own thread, between two batches. Those answers are
also how a quiet consumer knows its broker is there.

A consumer's loop reports through :class:`MetricsSink`: ``version_applied`` for each version it
applied (or delivered), ``version_published`` for each commit summary or heartbeat it read,
``batch_read`` after each batch (with its MirrorConsumer, asked for the lag), ``stopped`` when it
returns. ``SnapshotConsumer(..., metrics=ConsumerMetrics())`` does; with metrics, it decodes the
commits topic's summaries and heartbeats too, held to the contract as every reader of them is.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge

from deltamirror.core.redact import redact
from deltamirror.mirror.errors import KafkaError
from deltamirror.ops import DEFAULT_HOST, ServerHandle
from deltamirror.ops import serve as _serve

#: the consumers' port: the watcher's (9464) + 1, so that both run on one host with their defaults
DEFAULT_PORT = 9465
PREFIX = "deltamirror_consumer_"
DEFAULT_UNREACHABLE_AFTER_S = 60.0
DEFAULT_LAG_INTERVAL_S = 5.0


class LagSource(Protocol):
    """What can say how far behind its partitions a reader is (a MirrorConsumer)."""

    def lag(self, timeout_s: float = ...) -> Mapping[tuple[str, int], int]: ...


class MetricsSink(Protocol):
    """What a consumer's loop reports as it goes (``ConsumerMetrics``, a bench's recorder)."""

    def version_applied(self, table: str, version: int, commit_ts_ms: int, actions: int) -> None: ...

    def version_published(self, table: str, version: int) -> None: ...

    def records_skipped(self, topic: str, reason: str, records: int = 1) -> None: ...

    def batch_read(self, records: int, reader: LagSource | None = None) -> None: ...

    def stopped(self, error: BaseException | None = None) -> None: ...


@dataclass
class _Table:
    label: str
    version: int | None = None
    behind_ms: int | None = None
    published: int | None = None


class ConsumerMetrics:
    """A consumer's measurements; see the module docstring. Thread-safe; cheap enough per batch."""

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        clock: Callable[[], float] = time.time,
        unreachable_after_s: float = DEFAULT_UNREACHABLE_AFTER_S,
        lag_interval_s: float = DEFAULT_LAG_INTERVAL_S,
        lag_timeout_s: float = 2.0,
    ) -> None:
        if not 0 < lag_interval_s < unreachable_after_s:
            raise ValueError(
                f"lag_interval_s ({lag_interval_s}) must be > 0 and below unreachable_after_s "
                f"({unreachable_after_s}): a quiet consumer learns that its broker answers by it"
            )
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        self.unreachable_after_s = unreachable_after_s
        self.lag_interval_s = lag_interval_s
        self.lag_timeout_s = lag_timeout_s
        self._clock = clock
        self._lock = threading.Lock()
        self._tables: dict[str, _Table] = {}
        self._lag: dict[tuple[str, int], int] = {}
        self._started = False
        self._stopped = False
        self._error: str | None = None
        self._last_contact: float | None = None
        self._broker_reason: str | None = None
        self._next_lag_check = 0.0

        def gauge(name: str, doc: str, labels: tuple[str, ...] = ("table",)) -> Gauge:
            return Gauge(PREFIX + name, doc, labels, registry=self.registry)

        def counter(name: str, doc: str, labels: tuple[str, ...] = ("table",)) -> Counter:
            return Counter(PREFIX + name, doc, labels, registry=self.registry)

        self._version = gauge("last_applied_version", "Last Delta version applied to the table's state.")
        self._commit_ts = gauge(
            "last_commit_timestamp_seconds", "Commit timestamp of the last applied version (epoch s)."
        )
        self._behind_ms = gauge(
            "milliseconds_behind_commit",
            "Apply time minus commit time of the last applied version, in milliseconds.",
        )
        self._apply_ts = gauge(
            "last_apply_timestamp_seconds", "Wall time when the last version was applied (epoch s)."
        )
        self._versions_behind = gauge(
            "versions_behind", "Versions announced on the commits topic and not applied yet."
        )
        self._versions = counter("versions_applied", "Versions (and snapshots) applied.")
        self._actions = counter("actions_applied", "Actions of the applied versions.")
        self._records_behind = gauge(
            "records_behind",
            "Offsets between the consumer's position and the partition's last stable offset.",
            ("topic", "partition"),
        )
        self._records = counter("records_read", "Records read from Kafka.", ())
        self._contact = gauge(
            "last_broker_contact_timestamp_seconds", "Last time the broker answered (epoch s).", ()
        )
        self._errors = counter("errors", "Times the consumer stopped on an error.", ())
        self._skipped = counter(
            "records_skipped",
            "Records passed over: refused (skipped by choice) or of an unknown kind.",
            ("topic", "reason"),
        )
        healthy = gauge("healthy", "1 when /healthz answers 200.", ())
        healthy.set_function(lambda: 1.0 if self.health()[0] else 0.0)

    # --- what the loop reports -----------------------------------------------------------------

    def _table(self, table: str) -> _Table:
        state = self._tables.get(table)
        if state is None:
            with self._lock:
                state = self._tables.get(table)
                if state is None:
                    label = redact(table)
                    self._versions.labels(label)  # counters start at 0: rate() needs it
                    self._actions.labels(label)
                    state = self._tables[table] = _Table(label)
        return state

    def version_applied(self, table: str, version: int, commit_ts_ms: int, actions: int) -> None:
        """A version (or snapshot) of ``table`` (its URI) is in the state, ``actions`` actions long."""
        if actions < 0:
            raise ValueError(f"action count must be >= 0, got {actions}")
        now = self._clock()
        state = self._table(table)
        behind_ms = max(0, round(now * 1000) - commit_ts_ms)
        with self._lock:
            state.version, state.behind_ms = version, behind_ms
            published = state.published
        self._version.labels(state.label).set(version)
        self._commit_ts.labels(state.label).set(commit_ts_ms / 1000)
        self._behind_ms.labels(state.label).set(behind_ms)
        self._apply_ts.labels(state.label).set(now)
        self._versions.labels(state.label).inc()
        self._actions.labels(state.label).inc(actions)
        if published is not None:
            self._versions_behind.labels(state.label).set(max(0, published - version))

    def version_published(self, table: str, version: int) -> None:
        """The watcher says ``table`` stands at ``version`` (a commit summary, a heartbeat)."""
        state = self._table(table)
        with self._lock:
            state.published = version
            applied = state.version
        self._versions_behind.labels(state.label).set(max(0, version - (-1 if applied is None else applied)))

    def records_skipped(self, topic: str, reason: str, records: int = 1) -> None:
        """``records`` of ``topic`` were passed over: ``refused`` or ``unknown-kind``."""
        self._skipped.labels(topic, reason).inc(records)

    def batch_read(self, records: int, reader: LagSource | None = None) -> None:
        """A batch (maybe empty) was read and taken; ``reader`` is asked for the lag now and then."""
        now = self._clock()
        with self._lock:
            # the first batch comes right after the broker gave the topics' partitions
            contact = records > 0 or not self._started
            self._started, self._stopped, self._error = True, False, None
            if contact:
                self._last_contact = now
        if contact:
            self._records.inc(records)
            self._contact.set(now)
        if reader is None or now < self._next_lag_check:
            return
        self._next_lag_check = now + self.lag_interval_s
        try:
            lag = dict(reader.lag(self.lag_timeout_s))
        except KafkaError as exc:
            with self._lock:
                self._broker_reason = redact(str(exc))
            return
        answered = self._clock()
        with self._lock:
            self._lag = lag
            self._last_contact, self._broker_reason = answered, None
        self._contact.set(answered)
        for (topic, partition), n in lag.items():
            self._records_behind.labels(topic, str(partition)).set(n)

    def stopped(self, error: BaseException | None = None) -> None:
        """The consumer returned (``error``: it stopped on that error); /healthz says so."""
        reason = None if error is None else redact(" ".join(str(error).split()) or type(error).__name__)
        with self._lock:
            self._stopped, self._error = True, reason
        if reason is not None:
            self._errors.inc()

    # --- what operators see --------------------------------------------------------------------

    def health(self) -> tuple[bool, dict[str, Any]]:
        """(healthy, the JSON body of /healthz)."""
        now = self._clock()
        with self._lock:
            tables: dict[str, Any] = {}
            for _, state in sorted(self._tables.items()):
                entry: dict[str, Any] = {
                    "lastAppliedVersion": state.version,
                    "millisecondsBehindCommit": state.behind_ms,
                }
                if state.published is not None:
                    applied = -1 if state.version is None else state.version
                    entry["versionsBehind"] = max(0, state.published - applied)
                tables[state.label] = entry
            body: dict[str, Any] = {"status": "ok", "tables": tables}
            if self._lag:
                body["recordsBehind"] = sum(self._lag.values())
            silent = None if self._last_contact is None else now - self._last_contact
            if self._error is not None:
                status, reason = "unhealthy", f"stopped on an error: {self._error}"
            elif self._stopped:
                status, reason = "stopped", "the consumer stopped"
            elif not self._started:
                status, reason = "starting", "starting: waiting for the topics"
            elif silent is not None and silent > self.unreachable_after_s:
                why = f": {self._broker_reason}" if self._broker_reason else ""
                status, reason = "unhealthy", f"Kafka has not answered for {silent:.0f} s{why}"
            else:
                return True, body
        body["status"], body["reason"] = status, reason
        return False, body


def serve(metrics: ConsumerMetrics, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT) -> ServerHandle:
    """Serve the consumer's ``GET /metrics`` and ``GET /healthz`` (:func:`deltamirror.ops.serve`)."""
    return _serve(metrics, host, port=port)


__all__ = [
    "DEFAULT_HOST",
    "DEFAULT_PORT",
    "ConsumerMetrics",
    "LagSource",
    "MetricsSink",
    "ServerHandle",
    "serve",
]
