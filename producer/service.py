"""``deltamirror watch``: many tables in one process, each published exactly once and in order.

Each table runs in its own thread with its own transactional producer, whose ``transactional.id``
is ``<prefix>-<first 16 hex digits of sha1(normalized table URI)>``: one id per table, so a second
watcher on the same table fences the first (which then exits non-zero), whatever process or host
it runs on, while tables never block each other.

Resume order, per table (see docs/events.md): ``init_transactions()`` first, which aborts or
completes whatever an earlier incarnation left open; then the progress topic is read with
``read_committed`` to its end; only then does publishing start, after the recorded position. A
version that was only partly published is completed first.

A transaction holds whole versions until ``txn_max_records``/``txn_max_bytes``/``txn_max_ms`` is
reached or the table has nothing more to publish; a larger version is split at batch boundaries
into several transactions. Each transaction ends with the table's progress record, and a version's
summary goes to the commits topic in the transaction of its last chunk.

Failures: a table error (corrupt commit, unsupported feature, storage failure, gap) commits what
was already produced, stops the table, and retries with backoff from the committed position; an
aborted transaction is published again from the committed position; a broken producer is
replaced (``init_transactions`` again, progress read again); a fenced producer stops everything.
SIGTERM/SIGINT set one stop flag: the open transaction is finished at the next batch boundary,
the producers flushed, and the process exits 0. A stop has a budget (``STOP_BUDGET_S``): every
broker call made while stopping is bounded by the time left, and a table that cannot finish in
time (the broker is gone) is abandoned with one line saying what was left, e.g. ``stopping:
abandoned the open transaction of table file:///t version 7; nothing committed is lost`` (the broker
aborts that transaction, or the next start does; it is published again from the committed
position). A second signal stops at once, with the same report.

Logs: JSON lines, redacted (core/redact.py); librdkafka's own lines go to the
``deltamirror.librdkafka`` logger at DEBUG, and a broker that cannot be reached is reported by
:class:`~deltamirror.core.kafka_connection.KafkaConnectionReporter`, one warning at most every 30 s.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import operator
import signal
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Iterable, Iterator
from itertools import repeat
from types import FrameType
from typing import IO, Any

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka import KafkaError as _RdKafkaError

from deltamirror.core.errors import (
    ConfigError,
    DeltaMirrorError,
    InvalidArgumentError,
    KafkaError,
    LogGapError,
    ProducerFencedError,
    VersionNotFoundError,
)
from deltamirror.core.events import (
    HEADER_CLAMPED_FROM,
    HEADER_FRAGMENT,
    HEADER_INDEX,
    HEADER_KIND,
    HEADER_TYPE,
    HEADER_VERSION,
    INDEX_TEXT,
    SCHEMA_VERSION,
    EnvelopeEncoder,
    Heartbeat,
    ProgressRecord,
    TableReplaced,
)
from deltamirror.core.kafka_connection import KafkaConnectionReporter
from deltamirror.core.redact import RedactingFilter, redact
from deltamirror.core.storage import normalize_table_uri
from deltamirror.core.timestamps import CommitTimestamp, TimestampSource, format_iso

from .config import TableConfig, WatchConfig, redacted
from .publisher import (
    Headers,
    RetriableKafkaError,
    StopRequested,
    TimestampRefusedError,
    TransactionAbortableError,
    TransactionalPublisher,
)
from .snapshot_events import ActionBatch, ProgressBar, SnapshotWork
from .topics import TableTopics, TopicLimits, TopicManager, default_topics
from .watcher import (
    CommitWork,
    LogWaker,
    Position,
    PositionWork,
    PublishUnit,
    TableReplacedWork,
    TableWatcher,
    position_after,
)

log = logging.getLogger("deltamirror.watch")

BATCH = 1000
#: an idle table re-writes its progress this often, in a transaction: a fenced watcher learns it
LIVENESS_INTERVAL_S = 15.0
BACKOFF_MIN_S = 0.5
#: a commit file this big is read with no transaction open (its scan may be slow)
LARGE_COMMIT_BYTES = 8 * 1024 * 1024
BACKOFF_MAX_S = 30.0
#: how long a stop may take: tables still waiting on the broker after it are abandoned (said so)
STOP_BUDGET_S = 7.0
#: the main thread's extra wait after the budget, for tables that are just finishing
STOP_GRACE_S = 0.5
#: how long one metadata request waits while connecting (a stop is noticed within it)
CONNECT_SLICE_S = 1.0


class RecordTooLargeError(DeltaMirrorError):
    """A record larger than max_record_bytes with oversize_policy ``fail``."""


def transactional_id(prefix: str, uri: str) -> str:
    """``<prefix>-<sha1(normalized uri)[:16]>``: the one producer identity of a table."""
    digest = hashlib.sha1(normalize_table_uri(uri).encode(), usedforsecurity=False).hexdigest()
    return f"{prefix}-{digest[:16]}"


def table_topics(table: TableConfig) -> TableTopics:
    default = default_topics(table.uri)
    return TableTopics(table.actions_topic or default.actions, table.commits_topic or default.commits)


#: the ``type`` header of each action type, one pair shared by all its records (no encode per record)
_TYPE_HEADERS: dict[str, tuple[str, bytes]] = {}
#: the ``index`` headers of the first actions of a version (most versions have fewer), made once
_INDEX_HEADERS: tuple[tuple[str, bytes], ...] = tuple((HEADER_INDEX, text) for text in INDEX_TEXT)


_TYPE_OF = operator.itemgetter(0)


def _type_header(action_type: str) -> tuple[str, bytes]:
    header = _TYPE_HEADERS.get(action_type)
    if header is None:
        header = (HEADER_TYPE, action_type.encode())
        if len(_TYPE_HEADERS) < 1024:
            _TYPE_HEADERS[action_type] = header
    return header


def action_headers(
    version_header: tuple[str, bytes], start: int, batch: ActionBatch, extra: Headers
) -> Iterator[Headers]:
    """The headers of consecutive actions, the first at index ``start``: version, index, type, ``extra``.

    Header pairs are immutable tuples, so they are shared by every record that has them: per
    record only its list is new (and its index pair past the first few thousand actions). The
    lists are made as they are produced, each freed right after: made all at once, a batch of
    them kept the garbage collector busy.
    """
    stop = start + len(batch)
    indexes = (
        _INDEX_HEADERS[start:stop]
        if stop <= len(_INDEX_HEADERS)
        else [(HEADER_INDEX, str(i).encode()) for i in range(start, stop)]
    )
    types = set(map(_TYPE_OF, batch))
    for action_type in types:
        _type_header(action_type)  # remembered from now on (up to 1024 types)
    if not extra and all(t in _TYPE_HEADERS for t in types):
        return map(  # C-level: no Python step per record
            list,
            zip(
                repeat(version_header),
                indexes,
                map(_TYPE_HEADERS.__getitem__, map(_TYPE_OF, batch)),
                strict=False,  # repeat() is endless
            ),
        )
    return (
        [version_header, index, _type_header(t), *extra] for index, (t, _) in zip(indexes, batch, strict=True)
    )


def encoder_for(unit: PublishUnit) -> EnvelopeEncoder:
    return EnvelopeEncoder(
        table_id=unit.table_id,
        table_uri=unit.table_uri,
        version=unit.version,
        commit_timestamp=unit.timestamp.timestamp,
        commit_timestamp_source=str(unit.timestamp.source),
        count=unit.count,
        snapshot=unit.snapshot,
    )


# --- structured logs ------------------------------------------------------------------------------

_STANDARD_ATTRS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


class JsonLogFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, and the record's extra fields (table, version...).

    Every text is redacted (URL userinfo, values of secret-named keys), whoever attached this
    formatter: a table URI or a library's error message may carry credentials.
    """

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": format_iso(int(record.created * 1000)),  # the one timestamp layout of every output
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": redact(record.getMessage()),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD_ATTRS and not key.startswith("_"):
                out[key] = value if isinstance(value, int | float | bool | type(None)) else redact(str(value))
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            out["error"] = redact(str(exc))
            out["errorType"] = type(exc).__name__
            if not isinstance(exc, DeltaMirrorError):
                out["traceback"] = redact("".join(traceback.format_exception(*record.exc_info)))
        return json.dumps(out, default=str)


def configure_logging(level: int = logging.INFO, stream: IO[str] | None = None) -> None:
    """JSON lines on stderr for the ``deltamirror`` loggers (librdkafka's go through them too)."""
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonLogFormatter())
    handler.addFilter(RedactingFilter())
    root = logging.getLogger("deltamirror")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False


# --- progress -------------------------------------------------------------------------------------


def position_from_record(record: ProgressRecord) -> Position:
    ts = CommitTimestamp(
        record.version, record.commit_timestamp, TimestampSource(record.commit_timestamp_source)
    )
    return Position(record.table_id, record.version, record.index, record.count, ts, record.snapshot)


def progress_record(position: Position, uri: str, txn_id: str | None) -> ProgressRecord:
    return ProgressRecord(
        schema_version=SCHEMA_VERSION,
        table_uri=uri,
        table_id=position.table_id,
        version=position.version,
        index=position.index,
        count=position.count,
        snapshot=position.snapshot,
        commit_timestamp=position.timestamp.timestamp,
        commit_timestamp_source=str(position.timestamp.source),  # type: ignore[arg-type]
        transactional_id=txn_id,
        updated_at=int(time.time() * 1000),
    )


def read_progress(
    kafka: dict[str, Any],
    topic: str,
    uri: str,
    timeout_s: float = 60.0,
    *,
    stop: threading.Event | None = None,
) -> Position | None:
    """The last committed progress of ``uri``: the progress topic read with read_committed to its end.

    With ``stop``, raises StopRequested once it is set (the metadata is asked for in short slices).
    """
    consumer = Consumer(
        {
            # the end of a partition is known only when a fetch returns, and the broker holds a
            # fetch that finds nothing new for fetch.wait.max.ms (500 ms by default)
            "fetch.wait.max.ms": 10,
            **kafka,
            "group.id": f"deltamirror-progress-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
        }
    )
    key = uri.encode()
    last: bytes | None = None
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            try:
                slice_s = CONNECT_SLICE_S if stop is not None else timeout_s
                metadata = consumer.list_topics(
                    topic, timeout=max(0.1, min(slice_s, deadline - time.monotonic()))
                )
                break
            except KafkaException:
                if stop is not None and stop.is_set():
                    raise StopRequested("stop requested") from None
                if time.monotonic() >= deadline:
                    raise
        partitions = metadata.topics[topic].partitions if topic in metadata.topics else {}
        if not partitions:
            raise KafkaError(f"progress topic {topic} has no partitions", topic=topic)
        consumer.assign([TopicPartition(topic, p, -2) for p in partitions])  # -2: OFFSET_BEGINNING
        at_end: set[int] = set()
        while len(at_end) < len(partitions):
            if stop is not None and stop.is_set():
                raise StopRequested("stop requested")
            if time.monotonic() > deadline:
                raise KafkaError(
                    f"could not read the progress topic {topic} to its end within {timeout_s:.0f} s",
                    topic=topic,
                )
            # consume(n, timeout) returns only once n records came or the timeout passed: a short
            # timeout, or every (re)start waits ~1 s on a small progress topic
            for msg in consumer.consume(1000, timeout=0.05):
                err = msg.error()
                if err is not None:
                    if err.code() == _RdKafkaError._PARTITION_EOF:
                        at_end.add(msg.partition() or 0)
                        continue
                    raise KafkaError(f"reading progress topic {topic}: {err.str()}", topic=topic)
                at_end.discard(msg.partition() or 0)
                if msg.key() == key:
                    last = msg.value()
    except KafkaException as exc:
        raise KafkaError(f"reading progress topic {topic}: {exc.args[0].str()}", topic=topic) from exc
    finally:
        consumer.close()
    if last is None:  # never published, or a tombstone: start as the snapshot mode says
        return None
    return position_from_record(ProgressRecord.model_validate_json(last))


# --- one table ------------------------------------------------------------------------------------


class _Backoff:
    def __init__(self) -> None:
        self.delay = BACKOFF_MIN_S

    def next(self) -> float:
        delay = self.delay
        self.delay = min(BACKOFF_MAX_S, self.delay * 2)
        return delay

    def reset(self) -> None:
        self.delay = BACKOFF_MIN_S


class TablePipeline:
    """Watcher -> records -> transactions for one table, until the stop flag is set."""

    def __init__(
        self,
        cfg: WatchConfig,
        table: TableConfig,
        *,
        metrics: Any,
        stop: threading.Event,
        batch_size: int = BATCH,
        reporter: KafkaConnectionReporter | None = None,
        stop_budget_s: float = STOP_BUDGET_S,
    ) -> None:
        self.cfg = cfg
        self.table = table
        self.uri = table.normalized_uri
        self.metrics = metrics
        self.stop = stop
        #: when a stop must be done (monotonic); set by the service, or by the table when it sees the flag
        self.stop_deadline: float | None = None
        self.stop_budget_s = stop_budget_s
        #: True once this table said what it abandoned on stop
        self.abandoned = False
        #: what the table is doing, for the report of a stop that could not wait for it
        self.phase = "connecting to Kafka"
        self.batch_size = max(1, min(batch_size, cfg.txn_max_records))
        self.topics = table_topics(table)
        self.reporter = reporter or KafkaConnectionReporter(cfg.kafka.bootstrap_servers)
        # every client of this table routes librdkafka's logs and errors to the reporter
        self.kafka: dict[str, Any] = {**cfg.kafka.librdkafka_config(), **self.reporter.client_config()}
        self.txn_id = transactional_id(cfg.transactional_id_prefix, self.uri)
        self.ready = threading.Event()
        self.watcher = TableWatcher(
            table.uri,
            table.storage_options_plain(),
            mode=table.snapshot_mode,
            from_version=table.from_version,
            from_timestamp=table.from_timestamp,
            allowed_path_prefixes=table.allowed_path_prefixes,
        )
        self.waker = LogWaker(self.watcher.storage, enabled=cfg.use_notifications)
        self._log_extra = {"table": self.uri}
        self._pub: TransactionalPublisher | None = None
        self._limits: dict[str, TopicLimits] = {}
        self.committed: Position | None = None
        self._produced: Position | None = None
        self._completed: list[tuple[int, int]] = []
        self._events_in_txn = 0
        self._last_txn_end = time.monotonic()
        #: last transaction that published events, or last heartbeat: heartbeats count from it
        self._last_activity = self._last_txn_end
        self._needs_start = True
        self._table_failing = False
        #: first version with records in the open transaction (for the report of an abandoned one)
        self._txn_first_version: int | None = None
        #: a stop cut a batch: the open transaction holds records its progress record would not cover
        self._cut_mid_batch = False

    # --- stopping -----------------------------------------------------------------------------

    def time_left(self) -> float:
        """Seconds left before the stop must be done; infinite while no stop was requested."""
        if self.stop_deadline is None:
            if not self.stop.is_set():
                return float("inf")
            self.stop_deadline = time.monotonic() + self.stop_budget_s
        return self.stop_deadline - time.monotonic()

    def unfinished_work(self) -> str:
        """What a stop now would leave undone, in words."""
        pub = self._pub
        if pub is not None and pub.in_transaction:
            first = self._txn_first_version
            last = self._produced.version if self._produced is not None else None
            if first is None or last is None or last < first:
                versions = ""
            elif first == last:
                versions = f" version {first}"
            else:
                versions = f" versions {first} to {last}"
            return f"the open transaction of table {self.uri}{versions}"
        return f"{self.phase} for table {self.uri}"

    def say_abandoned(self, what: str | None = None) -> None:
        """The one line a stop that could not finish this table's work prints (once)."""
        if self.abandoned:
            return
        self.abandoned = True
        log.warning(
            "stopping: abandoned %s; nothing committed is lost",
            what or self.unfinished_work(),
            extra=self._log_extra,
        )

    # --- the outer loop: producer sessions ------------------------------------------------------

    def run(self) -> None:
        """Publish until stopped. Raises ProducerFencedError or ConfigError (the process must stop)."""
        backoff = _Backoff()
        try:
            while not self.stop.is_set():
                try:
                    self._open()
                    backoff.reset()
                    self._loop()
                    return
                except StopRequested:
                    self.say_abandoned()
                    return
                except (ProducerFencedError, ConfigError):
                    raise
                except KafkaError as exc:
                    log.warning("kafka failure; reconnecting", exc_info=exc, extra=self._log_extra)
                    self._close_publisher()
                    self.stop.wait(backoff.next())
        finally:
            self._close_publisher()
            self.waker.close()
            self.watcher.close()

    def _open(self) -> None:
        self.phase = "connecting to Kafka"
        pub = TransactionalPublisher(
            self.kafka, self.txn_id, max_message_bytes=self.cfg.max_record_bytes, stop=self.stop
        )
        self._pub = pub
        self._wait_for_brokers(pub)
        self.phase = "resuming"
        manager = TopicManager(self.kafka, max_record_bytes=self.cfg.max_record_bytes)
        for name in (self.topics.actions, self.topics.commits):
            self._limits[name] = manager.ensure_event_topic(name)
        manager.ensure_progress_topic(self.cfg.progress_topic)
        pub.init()  # fences older producers of this table before the progress is read
        self.committed = read_progress(self.kafka, self.cfg.progress_topic, self.uri, stop=self.stop)
        self.phase = "publishing"
        self._produced = self.committed
        self._needs_start = True
        log.info(
            "resuming table",
            extra={
                **self._log_extra,
                "transactionalId": self.txn_id,
                "actionsTopic": self.topics.actions,
                "commitsTopic": self.topics.commits,
                "resumeAfter": None
                if self.committed is None
                else f"v{self.committed.version}#{self.committed.index}/{self.committed.count}",
            },
        )
        self.ready.set()

    def _wait_for_brokers(self, pub: TransactionalPublisher) -> None:
        """Until a broker answers: the reporter says why not (now and then), a stop ends the wait.

        The admin calls that follow wait up to 30 s each on a broker that does not answer, and
        librdkafka would print each failed attempt; asking for metadata in short slices first
        keeps both the stop and the log under control.
        """
        while not pub.reachable(CONNECT_SLICE_S):
            self.reporter.check()  # wrong credentials: no retry
            if self.reporter.last_reason is None:  # no transport error: the broker is silent
                self.reporter.unreachable(f"no answer within {CONNECT_SLICE_S:.0f} s")
            if self.stop.is_set():
                raise StopRequested("stop requested")
        self.reporter.check()
        self.reporter.reachable()

    def _close_publisher(self) -> None:
        pub = self._pub
        if pub is None:
            return
        self._pub = None
        left = self.time_left()
        if pub.in_transaction and left > 0:
            with contextlib.suppress(KafkaError):
                pub.abort(min(5.0, left))
        if pub.in_transaction and self.stop.is_set():
            self._pub = pub  # for the report
            self.say_abandoned()
            self._pub = None
        pub.close(max(0.0, min(5.0, self.time_left())))

    # --- the inner loop: one unit of work at a time --------------------------------------------

    def _loop(self) -> None:
        backoff = _Backoff()
        while not self.stop.is_set():
            try:
                if self._needs_start:
                    self.watcher.start(self.committed)
                    self._needs_start = False
                self._step()
                if self._table_failing:
                    self._table_failing = False
                    self.metrics.table_ok(self.uri)
                    log.info("table resumed", extra=self._log_extra)
                backoff.reset()
            except StopRequested:
                self._cut_mid_batch = True  # the queue was full (broker gone) in the middle of a batch
                break
            except (ProducerFencedError, ConfigError):
                raise
            except TransactionAbortableError as exc:
                log.warning("transaction aborted; publishing again", exc_info=exc, extra=self._log_extra)
                self._abort()
                if isinstance(exc, TimestampRefusedError):
                    topic = exc.context.get("topic")
                    if isinstance(topic, str) and topic in self._limits:
                        self._limits[topic].always_clamp = True
                self.stop.wait(backoff.next() / 4)
            except RetriableKafkaError as exc:
                log.warning("kafka busy; publishing again", exc_info=exc, extra=self._log_extra)
                self._abort()
                self.stop.wait(backoff.next())
            except KafkaError:
                raise
            except (DeltaMirrorError, OSError) as exc:
                self._table_error(exc)
                self.stop.wait(backoff.next())
            except Exception as exc:  # a bug: keep the other tables going, retry this one
                log.error("unexpected error", exc_info=exc, extra=self._log_extra)
                self._table_error(exc)
                self.stop.wait(backoff.next())
        self._finish()

    def _table_error(self, exc: BaseException) -> None:
        """Keep what was published before the error, stop the table, retry later from there."""
        if self._pub is not None and self._pub.in_transaction:
            try:
                self._commit()
            except (ProducerFencedError, ConfigError):
                raise
            except KafkaError:
                self._abort()
        self._needs_start = True
        self._table_failing = True
        self.metrics.table_error(self.uri, str(exc))
        log.error("table stopped: %s", exc, exc_info=exc, extra=self._log_extra)

    def _finish(self) -> None:
        """Stop requested: commit the open transaction (it holds only whole batches) and flush.

        Within the stop budget: what cannot be committed in time is aborted, and what cannot be
        aborted either (the broker is gone) is abandoned, said in one line. Either way the
        committed progress is where the next start resumes: nothing is lost or published twice.
        """
        pub = self._pub
        if pub is not None and pub.in_transaction:
            what = self.unfinished_work()
            try:
                if self._cut_mid_batch:  # records past the last batch boundary: never commit them
                    raise RetriableKafkaError("a batch was cut by the stop")
                self._commit(timeout_s=max(0.0, self.time_left()))
            except ProducerFencedError:
                raise
            except KafkaError as exc:
                if not self._cut_mid_batch:
                    log.warning("could not commit on stop; aborting", exc_info=exc, extra=self._log_extra)
                try:
                    left = self.time_left()
                    if left <= 0:
                        raise RetriableKafkaError("no time left to abort") from None
                    self._abort(timeout_s=left)
                except KafkaError:
                    self.say_abandoned(what)
        if not self.abandoned:
            log.info("table stopped cleanly", extra=self._log_extra)

    def _step(self) -> None:
        assert self._pub is not None
        if self._pub.in_transaction and self.watcher.next_commit_size() > LARGE_COMMIT_BYTES:
            # reading a big commit may outlast transaction.timeout.ms: do not keep a transaction open
            self._commit()
        work = self.watcher.next_work()
        if work is None:
            if self._pub.in_transaction:
                self._commit()
            self.metrics.versions_behind(self.uri, 0)
            self._idle_duties()
            self.waker.wait(self.table.poll_interval_s, self.stop)
            return
        if not self._pub.in_transaction:
            self._pub.begin()
        if isinstance(work, CommitWork | SnapshotWork):
            self._publish(work)
            self.metrics.versions_behind(self.uri, self.watcher.versions_ahead)
        elif isinstance(work, TableReplacedWork):
            self._announce_replaced(work)
            return  # the new table's first work goes in the same transaction
        elif isinstance(work, PositionWork):
            self._produced = work.position
        # _publish may have committed its last chunk already (a stop mid-version): no txn, no commit
        if self._pub.in_transaction and self._bounds_reached():
            self._commit()

    def _bounds_reached(self) -> bool:
        pub = self._pub
        assert pub is not None
        return (
            pub.records >= self.cfg.txn_max_records
            or pub.bytes >= self.cfg.txn_max_bytes
            or (time.monotonic() - pub.started_at) * 1000 >= self.cfg.txn_max_ms
        )

    # --- records ------------------------------------------------------------------------------

    def _record_timestamp(self, topic: str, ts: int) -> tuple[int, Headers]:
        """The Kafka timestamp for a commit timestamp, clamped (and said so) if the topic refuses it."""
        limits = self._limits.get(topic)
        now = int(time.time() * 1000)
        clamped = limits.clamp(ts, now) if limits is not None else None
        if clamped is None and ts <= 0:
            clamped = now  # librdkafka reads 0 as "now"; say it
        if clamped is None:
            return ts, []
        return clamped, [(HEADER_CLAMPED_FROM, str(ts).encode())]

    def _expand_oversize(
        self, topic: str, values: list[bytes], headers: Iterable[Headers], where: tuple[int, int]
    ) -> tuple[list[bytes], Iterable[Headers]]:
        limit = self._limits[topic].max_value_bytes if topic in self._limits else self.cfg.max_record_bytes
        if not values or max(map(len, values)) <= limit:
            return values, headers
        out_v: list[bytes] = []
        out_h: list[Headers] = []
        version, first_index = where
        for i, (value, hdrs) in enumerate(zip(values, headers, strict=True)):
            if len(value) <= limit:
                out_v.append(value)
                out_h.append(hdrs)
                continue
            if self.cfg.oversize_policy == "fail":
                raise RecordTooLargeError(
                    f"record of {len(value)} bytes is larger than max_record_bytes ({limit}) for topic "
                    f"{topic}; raise the limit or use oversize_policy split",
                    table=self.uri,
                    version=version,
                    index=first_index + i,
                )
            n = -(-len(value) // limit)
            for j in range(n):
                out_v.append(value[j * limit : (j + 1) * limit])
                out_h.append([*hdrs, (HEADER_FRAGMENT, f"{j}/{n}".encode())])
        return out_v, out_h

    def _publish(self, unit: PublishUnit) -> None:
        pub = self._pub
        assert pub is not None
        topic = self.topics.actions
        encoder = encoder_for(unit)
        key = unit.table_id.encode()
        version_b = str(unit.version).encode()
        version_header = (HEADER_VERSION, version_b)
        ts, ts_headers = self._record_timestamp(topic, unit.timestamp.timestamp)
        if ts_headers:
            log.warning(
                "topic %s refuses the commit timestamp %d: records carry %d and a %s header",
                topic,
                unit.timestamp.timestamp,
                ts,
                HEADER_CLAMPED_FROM,
                extra={**self._log_extra, "version": unit.version},
            )
        bar = (
            ProgressBar(f"snapshot v{unit.version} of {self.uri}", unit.count - unit.start)
            if isinstance(unit, SnapshotWork)
            else None
        )
        index = unit.start
        if self._txn_first_version is None:
            self._txn_first_version = unit.version
        try:
            for batch in unit.batches(self.batch_size):
                values, headers = self._expand_oversize(
                    topic,
                    encoder.encode_many(index, batch),
                    action_headers(version_header, index, batch, ts_headers),
                    (unit.version, index),
                )
                pub.produce_many(topic, values, key, headers, ts)
                index += len(batch)
                self._events_in_txn += len(batch)
                self._produced = position_after(unit, index - 1)
                if bar is not None:
                    bar.advance(len(batch))
                if index < unit.count and (self._bounds_reached() or self.stop.is_set()):
                    self._commit()  # a chunk of a version larger than a transaction
                    if self.stop.is_set():
                        return
                    pub.begin()
                    self._txn_first_version = unit.version
        finally:
            if bar is not None:
                bar.close()
        summary = unit.summary().to_json_bytes()
        ts_c, hdr_c = self._record_timestamp(self.topics.commits, unit.timestamp.timestamp)
        values_c, headers_c = self._expand_oversize(
            self.topics.commits,
            [summary],
            [[(HEADER_KIND, b"commit"), (HEADER_VERSION, version_b), *hdr_c]],
            (unit.version, -1),
        )
        pub.produce_many(self.topics.commits, values_c, key, headers_c, ts_c)
        self._produced = position_after(unit, unit.count - 1)
        self._completed.append((unit.version, unit.timestamp.timestamp))

    def _announce_replaced(self, work: TableReplacedWork) -> None:
        assert self._pub is not None
        now = int(time.time() * 1000)
        record = TableReplaced(
            schema_version=SCHEMA_VERSION,
            table_uri=self.uri,
            table_id=work.table_id,
            previous_table_id=work.previous_table_id,
            previous_version=work.previous_version,
            reason=work.reason,
            detected_at=now,
        )
        self._pub.produce(
            self.topics.commits,
            record.to_json_bytes(),
            work.table_id.encode(),
            [(HEADER_KIND, b"tableReplaced")],
            now,
        )
        log.warning(
            "table re-created: now mirroring table %s (was %s up to version %d)",
            work.table_id,
            work.previous_table_id,
            work.previous_version,
            extra={**self._log_extra, "reason": work.reason},
        )

    def _idle_duties(self) -> None:
        """Heartbeats, and the periodic progress re-write that makes a fenced idle watcher notice."""
        if self.committed is None or self._pub is None:
            return
        now_s = time.monotonic()
        heartbeat = self.cfg.heartbeat_interval_s
        # the liveness re-write is not activity: it must not postpone a heartbeat forever
        due_heartbeat = heartbeat is not None and now_s - self._last_activity >= heartbeat
        if not due_heartbeat and now_s - self._last_txn_end < LIVENESS_INTERVAL_S:
            return
        self._pub.begin()
        if due_heartbeat:
            self._last_activity = now_s
            now = int(time.time() * 1000)
            beat = Heartbeat(
                schema_version=SCHEMA_VERSION,
                table_id=self.committed.table_id,
                table_uri=self.uri,
                latest_version=self.committed.version,
                commit_timestamp=self.committed.timestamp.timestamp,
                commit_timestamp_source=str(self.committed.timestamp.source),  # type: ignore[arg-type]
                heartbeat_timestamp=now,
            )
            self._pub.produce(
                self.topics.commits,
                beat.to_json_bytes(),
                self.committed.table_id.encode(),
                [(HEADER_KIND, b"heartbeat"), (HEADER_VERSION, str(self.committed.version).encode())],
                now,
            )
        self._commit()

    # --- transactions -------------------------------------------------------------------------

    def _commit(self, timeout_s: float | None = None) -> None:
        """Commit the open transaction with its progress record (60 s at most, less when stopping)."""
        pub = self._pub
        assert pub is not None
        if timeout_s is None:
            timeout_s = max(0.0, min(60.0, self.time_left()))
        if self._produced is not None:
            record = progress_record(self._produced, self.uri, self.txn_id)
            pub.produce(self.cfg.progress_topic, record.to_json_bytes(), self.uri.encode(), None, 0)
        pub.commit(timeout_s)
        self._txn_first_version = None
        self.committed = self._produced
        self._last_txn_end = time.monotonic()
        self.metrics.transaction_committed(self.uri)
        if self._events_in_txn:
            self._last_activity = self._last_txn_end
            self.metrics.event_published(self.uri, self._events_in_txn)
        for version, ts in self._completed:
            self.metrics.published_version(self.uri, version, ts)
        self._completed.clear()
        self._events_in_txn = 0

    def _abort(self, timeout_s: float | None = None) -> None:
        if timeout_s is None:
            timeout_s = max(0.0, min(30.0, self.time_left()))
        if self._pub is not None and self._pub.in_transaction:
            self.metrics.transaction_aborted(self.uri)
            self._pub.abort(timeout_s)
        self._txn_first_version = None
        self._produced = self.committed
        self._completed.clear()
        self._events_in_txn = 0
        self._needs_start = True


# --- the service ----------------------------------------------------------------------------------


class _NullMetrics:
    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


def _new_metrics() -> Any:
    try:
        from .metrics import WatcherMetrics
    except ImportError:  # prometheus-client missing: run without metrics
        return _NullMetrics()
    return WatcherMetrics()


class WatchService:
    """All tables of a configuration, each in its own thread."""

    def __init__(
        self,
        cfg: WatchConfig,
        *,
        metrics: Any = None,
        stop: threading.Event | None = None,
        stop_budget_s: float = STOP_BUDGET_S,
    ) -> None:
        self.cfg = cfg
        self.metrics = metrics if metrics is not None else _new_metrics()
        self.stop_event = stop if stop is not None else threading.Event()
        self.stop_budget_s = stop_budget_s
        #: when the requested stop must be done (monotonic), None until one is requested
        self.stop_deadline: float | None = None
        self._check_topic_collisions()
        #: one reporter for every client: one warning per interval for a cluster that is down
        self.reporter = KafkaConnectionReporter(cfg.kafka.bootstrap_servers)
        self.pipelines = [
            TablePipeline(
                cfg,
                t,
                metrics=self.metrics,
                stop=self.stop_event,
                reporter=self.reporter,
                stop_budget_s=stop_budget_s,
            )
            for t in cfg.tables
        ]
        self._threads: list[threading.Thread] = []
        self._failure: BaseException | None = None
        self._server: Any = None

    def _check_topic_collisions(self) -> None:
        seen: dict[str, str] = {}
        for table in self.cfg.tables:
            topics = table_topics(table)
            explicit = {table.actions_topic, table.commits_topic}
            for name in (topics.actions, topics.commits):
                other = seen.get(name)
                if other is not None and name not in explicit:
                    raise ConfigError(
                        f"tables {other} and {table.uri} would share the default topic {name}: "
                        "set actions_topic and commits_topic for one of them",
                        table=table.uri,
                    )
                seen[name] = table.uri

    def start(self) -> None:
        if self.cfg.metrics_port is not None:
            from .metrics import serve

            self._server = serve(self.metrics, self.cfg.metrics_host, self.cfg.metrics_port)
        for pipeline in self.pipelines:
            thread = threading.Thread(
                target=self._run_pipeline, args=(pipeline,), name=f"watch-{pipeline.txn_id}", daemon=True
            )
            self._threads.append(thread)
            thread.start()
        threading.Thread(target=self._report_ready, name="watch-ready", daemon=True).start()

    def _report_ready(self) -> None:
        for pipeline in self.pipelines:
            while not pipeline.ready.wait(0.5):
                if self.stop_event.is_set():
                    return
        self.metrics.set_healthy(True)
        log.info("all tables resumed", extra={"tables": len(self.pipelines)})

    def _run_pipeline(self, pipeline: TablePipeline) -> None:
        try:
            pipeline.run()
        except BaseException as exc:
            if self._failure is None:
                self._failure = exc
            self.metrics.set_healthy(False, str(exc))
            log.error("stopping the watcher: %s", exc, exc_info=exc, extra={"table": pipeline.uri})
            self.stop_event.set()

    def request_stop(self, budget_s: float | None = None) -> None:
        """Stop every table within ``budget_s`` (default ``stop_budget_s``); a shorter one wins."""
        deadline = time.monotonic() + (self.stop_budget_s if budget_s is None else budget_s)
        if self.stop_deadline is None or deadline < self.stop_deadline:
            self.stop_deadline = deadline
            for pipeline in self.pipelines:
                pipeline.stop_deadline = deadline
        self.stop_event.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for every table thread to end; True when they all did."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for thread in self._threads:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            thread.join(left)
        return all(not t.is_alive() for t in self._threads)

    def close(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None

    def run(self) -> int:
        """Start, wait until stopped; 0 after a clean stop. A fenced table raises ProducerFencedError.

        The stop takes at most the budget (plus ``STOP_GRACE_S``): a table still waiting on the
        broker then is abandoned (its thread is a daemon) after saying what it leaves undone.
        """
        self.start()
        try:
            while not self.stop_event.wait(0.2):
                pass
            if self.stop_deadline is None:  # a table failed and set the flag itself
                self.request_stop()
            self._wait_for_stop()
        finally:
            self.close()
        if self._failure is not None:
            raise self._failure
        return 0

    def _wait_for_stop(self) -> None:
        while True:
            alive = [p for p, t in zip(self.pipelines, self._threads, strict=True) if t.is_alive()]
            deadline = self.stop_deadline
            if not alive or (deadline is not None and time.monotonic() > deadline + STOP_GRACE_S):
                break
            self._threads[self.pipelines.index(alive[0])].join(0.1)
        for pipeline in alive:
            pipeline.say_abandoned()


def run_watch(cfg: WatchConfig) -> int:
    """The ``watch`` command: JSON logs, signal handling, the service."""
    configure_logging()
    log.info("starting", extra={"config": json.dumps(redacted(cfg), default=str)})
    service = WatchService(cfg)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if service.stop_event.is_set():
            log.warning("second stop request (%s): stopping now", name)
            service.request_stop(0.0)
            return
        log.info(
            "stop requested (%s): finishing the open transactions (at most %.0f s)",
            name,
            service.stop_budget_s,
        )
        service.request_stop()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        code = service.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    log.info("stopped", extra={"exitCode": code})
    return code


# --- ``deltamirror events`` -----------------------------------------------------------------------


def iter_event_values(
    uri: str,
    storage_options: dict[str, Any] | None = None,
    *,
    starting_version: int | None = None,
    ending_version: int | None = None,
    allowed_path_prefixes: Iterable[str] = (),
) -> Iterator[bytes]:
    """The action-event values the watcher publishes for versions [start, end], without Kafka."""
    watcher = TableWatcher(
        uri, storage_options, mode="from-version", from_version=0, allowed_path_prefixes=allowed_path_prefixes
    )
    table = watcher.table
    latest = table.latest_version()
    commits = table.listing(0).commits
    start = starting_version if starting_version is not None else min(commits, default=latest + 1)
    end = ending_version if ending_version is not None else latest
    if start < 0 or end < 0 or (end < start and starting_version is not None):
        raise InvalidArgumentError(f"invalid version range [{start}, {end}]", table=watcher.uri)
    if start > end:
        return  # a log with no commit file left (only a checkpoint): no action to print
    if end > latest:
        raise VersionNotFoundError(
            f"version {end} does not exist; the latest version is {latest}", table=watcher.uri, version=end
        )
    watcher.from_version = start
    watcher.start(None)
    try:
        while watcher.cursor < end:
            work = watcher.next_work()
            if work is None:
                missing = watcher.cursor + 1
                raise LogGapError(
                    f"commit {missing} is missing from the log (versions up to {end} exist)",
                    table=watcher.uri,
                    version=missing,
                )
            if not isinstance(work, CommitWork) or work.version > end:
                return
            encoder = encoder_for(work)
            index = work.start
            for batch in work.batches(BATCH):
                yield from encoder.encode_many(index, batch)
                index += len(batch)
    finally:
        watcher.close()


__all__ = [
    "JsonLogFormatter",
    "TablePipeline",
    "WatchService",
    "configure_logging",
    "iter_event_values",
    "read_progress",
    "run_watch",
    "transactional_id",
]
