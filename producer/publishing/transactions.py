"""The records of one table and the Kafka transactions that carry them.

A transaction holds whole versions until ``txn_max_records``/``txn_max_bytes``/``txn_max_ms`` is
reached or the table has nothing more to publish; a larger version is split at batch boundaries
into several transactions. Each transaction ends with the table's progress record, and a version's
summary goes to the commits topic in the transaction of its last chunk: a subscriber that reads
``read_committed`` sees a version's summary only once all its actions are there, and a restart
resumes exactly after the last committed progress record.

An idle table still writes: a heartbeat on the commits topic every ``heartbeat_interval_s`` (if
set), and its progress again every ``LIVENESS_INTERVAL_S`` in a transaction, which is how a
watcher fenced by a newer one learns it even when its table never changes. Tables sharing a
shard's producer share that duty: a fence shows at any commit of the producer, so an idle table
re-writes its progress only when no table of its shard committed for ``LIVENESS_INTERVAL_S``.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Generator, Sequence
from contextlib import closing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from deltamirror.core.errors import DeltaMirrorError
from deltamirror.mirror.errors import StopRequested
from deltamirror.mirror.kafka.producer import TransactionalPublisher
from deltamirror.mirror.records.actions import ActionRecords
from deltamirror.mirror.records.commits import (
    encode_commit_summary,
    encode_heartbeat,
    encode_schema_changed,
    encode_table_dropped,
    encode_table_replaced,
)
from deltamirror.mirror.records.events import (
    SCHEMA_VERSION,
    Heartbeat,
    TableDropped,
    TableReplaced,
)
from deltamirror.mirror.records.fragments import Oversize
from deltamirror.mirror.records.headers import HEADER_CLAMPED_FROM, Headers, clamped_headers
from deltamirror.mirror.records.progress import encode_progress, encode_progress_tombstone
from deltamirror.mirror.records.record import Record
from deltamirror.mirror.records.row_changes import VersionRows, skip_records
from deltamirror.mirror.topic_names import TableTopics
from deltamirror.mirror.topics import TopicLimits

from ..group.shard_producers import ProducerLease
from ..settings import DUE_EARLY_S, WatchConfig
from ..tailing.snapshot_events import ProgressBar, SnapshotWork
from ..tailing.summaries import envelope_encoder
from ..tailing.work import (
    CommitWork,
    NetCatchUpWork,
    NetChangesWork,
    Position,
    PublishUnit,
    TableDroppedWork,
    TableReplacedWork,
    position_after,
)
from .progress import progress_record
from .tails import AlreadyPublished

if TYPE_CHECKING:  # for the type checker only: importing it loads prometheus_client
    from ..metrics import Metrics
    from .row_events import RowChangesSource

log = logging.getLogger("deltamirror.watch")

#: records encoded and produced in one call; a transaction ends only between two batches
BATCH = 1000
#: a version whose change data files are larger is paired (a first read) with no records pending:
#: the pass must not run inside an open transaction that could outlive ``transaction.timeout.ms``
#: (a 142 MB pass took over 60 s on a loaded 2-core machine); below this it takes a second or two
PAIRING_PASS_COMMIT_BYTES = 8 * 1024 * 1024
#: an idle table re-writes its progress this often, in a transaction: a fenced watcher learns it
LIVENESS_INTERVAL_S = 15.0


def action_records_for(
    unit: PublishUnit, extra_headers: Headers | None = None, oversize: Oversize | None = None
) -> ActionRecords:
    """The action records' encoder of one version (or snapshot), headers and fragments included."""
    return ActionRecords(envelope_encoder(unit), extra_headers=extra_headers, oversize=oversize)


#: the fields ``drop_file_stats`` takes out of add and remove actions
FILE_STATS_FIELDS = ("stats", "tags")


def without_file_stats(batch: Sequence[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """``batch`` with its add and remove actions' stats and tags left out (the others as they are).

    Decoded only when a body holds one of them (the raw line is kept otherwise): the bytes of an
    action, a line of the log, name the field as ``"stats":`` whatever its place.
    """
    out: list[tuple[str, Any]] = []
    for name, body in batch:
        if name in ("add", "remove"):
            raw = body if isinstance(body, bytes | bytearray) else None
            if raw is None or any(b'"' + f.encode() + b'"' in raw for f in FILE_STATS_FIELDS):
                data = json.loads(raw) if raw is not None else dict(body)
                for field in FILE_STATS_FIELDS:
                    data.pop(field, None)
                body = data
        out.append((name, body))
    return out


@dataclass(frozen=True)
class AtomicBlock:
    """Versions ``first`` to ``last`` whose records the open transaction commits whole, once all are
    in, or aborts (on an error or a stop): never cut at the transaction bounds, never committed in
    part. A net catch-up (the range's actions and summaries, its net row changes after ``last``'s
    actions) or a ``net-changes`` signal's block (the net row changes alone)."""

    first: int
    last: int
    #: what the block is, in words (logs, the report of a stop)
    what: str


class TableTransactions:
    """One table's open transaction: what it holds, and the records that go into it.

    ``committed`` is where the last committed progress record stands (a restart resumes there);
    ``produced`` is how far the open transaction reaches. ``time_left`` says how long a stop
    still allows a broker call to take (infinite while no stop is requested).
    """

    def __init__(
        self,
        cfg: WatchConfig,
        uri: str,
        topics: TableTopics,
        txn_id: str,
        *,
        metrics: Metrics,
        stop: threading.Event,
        time_left: Callable[[], float],
        batch_size: int,
    ) -> None:
        self.cfg = cfg
        self.uri = uri
        self.topics = topics
        self.txn_id = txn_id
        self.metrics = metrics
        self.stop = stop
        self.time_left = time_left
        self.batch_size = batch_size
        #: the producer of the current session (None between sessions)
        self.pub: TransactionalPublisher | ProducerLease | None = None
        #: what each event topic accepts, learnt when the session opened
        self.limits: dict[str, TopicLimits] = {}
        self.committed: Position | None = None
        self.produced: Position | None = None
        #: records past ``committed`` that the topics hold already (a partly committed transaction):
        #: not published again
        self.already = AlreadyPublished()
        self._log_extra = {"table": uri}
        #: versions whose last chunk is in the open transaction: (version, commit timestamp)
        self._completed: list[tuple[int, int]] = []
        self._events_in_txn = 0
        self._last_txn_end = time.monotonic()
        #: last transaction that published events, or last heartbeat: heartbeats count from it
        self._last_activity = self._last_txn_end
        #: first version with records in the open transaction (for the report of an abandoned one)
        self._txn_first_version: int | None = None
        #: called before a transaction that reached its bounds commits, while its records are
        #: still on their way to the broker (the pipeline reads the next versions meanwhile)
        self.before_bounded_commit: Callable[[], None] = lambda: None
        #: add and remove actions go out without their stats and tags (``drop_file_stats``)
        self.drop_file_stats = False
        #: the table's row changes (None: not published); their records go in the same
        #: transactions as the version's actions, after them and before its summary
        self.rows: RowChangesSource | None = None
        #: the atomic block the open transaction holds (None: a plain transaction, cut at its bounds)
        self.block: AtomicBlock | None = None
        #: True once the block's last record is in the open transaction: commit it next
        self.block_complete = False

    @property
    def atomic(self) -> bool:
        """The open transaction holds an :class:`AtomicBlock`: it commits whole (at its end) or
        aborts, never in chunks, nor on a stop or an error."""
        return self.block is not None

    def _begin_block(self, first: int, last: int, what: str) -> None:
        assert self.in_transaction
        self.block = AtomicBlock(first, last, what)
        self.block_complete = False

    def begin_catch_up(self, work: NetCatchUpWork) -> None:
        """The versions ``work`` names go out in the open transaction, committed once all are in."""
        self._begin_block(work.first, work.last, "net catch-up")
        log.info(
            "net catch-up of versions %d to %d: one transaction, row changes netted",
            work.first,
            work.last,
            extra=self._log_extra,
        )

    def _cut(self) -> bool:
        """A transaction that reached its bounds or a stop may end here (a chunk) unless it holds an
        atomic block: then a stop ends the publishing (the block is aborted; a catch-up is done
        again on the next start)."""
        block = self.block
        if block is not None:
            if self.stop.is_set():
                raise StopRequested(f"stop requested during a {block.what}")
            return False
        return self.bounds_reached() or self.stop.is_set()

    def resume(self, committed: Position | None, already: AlreadyPublished | None = None) -> None:
        """A new session starts from the committed progress: nothing is open. ``already``: what the
        topics hold past it, not to be published again."""
        self.committed = committed
        self.produced = committed
        self.already = already or AlreadyPublished()

    @property
    def in_transaction(self) -> bool:
        return self.pub is not None and self.pub.in_transaction

    def begin(self) -> None:
        assert self.pub is not None
        self.pub.begin()

    def describe_open(self) -> str | None:
        """The open transaction in words (None when there is none), for the report of a stop."""
        pub = self.pub
        if pub is None or not pub.in_transaction:
            return None
        first = self._txn_first_version
        last = self.produced.version if self.produced is not None else None
        if first is None or last is None or last < first:
            versions = ""
        elif first == last:
            versions = f" version {first}"
        else:
            versions = f" versions {first} to {last}"
        return f"the open transaction of table {self.uri}{versions}"

    def bounds_reached(self) -> bool:
        pub = self.pub
        assert pub is not None
        return (
            pub.records >= self.cfg.txn_max_records
            or pub.bytes >= self.cfg.txn_max_bytes
            or (time.monotonic() - pub.started_at) * 1000 >= self.cfg.txn_max_ms
        )

    # --- records ------------------------------------------------------------------------------

    def _record_timestamp(self, topic: str, ts: int) -> tuple[int, Headers]:
        """The Kafka timestamp for a commit timestamp, clamped (and said so) if the topic refuses it."""
        limits = self.limits.get(topic)
        now = int(time.time() * 1000)
        clamped = limits.clamp(ts, now) if limits is not None else None
        if clamped is None and ts <= 0:
            clamped = now  # librdkafka reads 0 as "now"; say it
        if clamped is None:
            return ts, []
        return clamped, clamped_headers(ts)

    def _oversize(self, topic: str) -> Oversize:
        """What ``topic`` takes, and what a longer value becomes (the oversize policy)."""
        limit = self.limits[topic].max_value_bytes if topic in self.limits else self.cfg.max_record_bytes
        return Oversize(limit, self.cfg.oversize_policy, topic, self.uri)

    def _produce(self, topic: str, record: Record, timestamp: int) -> None:
        assert self.pub is not None and record.key is not None  # every topic of a table is keyed
        self.pub.produce(topic, record.value, record.key, record.headers, timestamp)

    def publish(self, unit: PublishUnit) -> None:
        """A version's (or snapshot's) action records, then its summary, into the open transaction.

        A version larger than a transaction is committed in chunks; a stop commits the chunk
        published so far and returns (the rest is published after the restart).
        """
        pub = self.pub
        assert pub is not None
        topic = self.topics.actions
        ts, ts_headers = self._record_timestamp(topic, unit.timestamp.timestamp)
        encoder = action_records_for(unit, ts_headers, self._oversize(topic))
        if ts_headers:
            log.warning(
                "topic %s refuses the commit timestamp %d: records carry %d and a %s header",
                topic,
                unit.timestamp.timestamp,
                ts,
                HEADER_CLAMPED_FROM,
                extra={**self._log_extra, "version": unit.version},
            )
        prepared = self._prepare_rows(unit)  # a registry's refusal: before anything of the version
        bar = (
            ProgressBar(f"snapshot v{unit.version} of {self.uri}", unit.count - unit.start)
            if isinstance(unit, SnapshotWork)
            else None
        )
        index = unit.start
        if self._txn_first_version is None:
            self._txn_first_version = unit.version
        try:
            self._publish_prepared(unit, prepared, topic, ts, encoder, bar, index)
        finally:
            if prepared is not None:
                prepared.close()  # a stop or an error before its rows were taken: its spill files go

    def _publish_prepared(
        self,
        unit: PublishUnit,
        prepared: VersionRows | None,
        topic: str,
        ts: int,
        encoder: Any,
        bar: ProgressBar | None,
        index: int,
    ) -> None:
        pub = self.pub
        assert pub is not None
        try:
            for batch in unit.batches(self.batch_size):
                there = (
                    self.already.skip_actions(unit.table_id, unit.version, unit.snapshot, index, len(batch))
                    if self.already
                    else 0
                )
                if there:  # committed already by a transaction Kafka committed on that topic only
                    self._say_already(f"{there} action records of version {unit.version}")
                if self.drop_file_stats:
                    batch = without_file_stats(batch)
                records = encoder.encode(index, batch, skip=there)
                if records.values:
                    pub.produce_many(topic, records.values, records.key, records.headers, ts)
                index += len(batch)
                self._events_in_txn += len(batch)
                self.produced = position_after(unit, index - 1)
                if bar is not None:
                    bar.advance(len(batch))
                if index < unit.count and self._cut():
                    if not self.stop.is_set():
                        self.before_bounded_commit()
                    self.commit()  # a chunk of a version larger than a transaction
                    if self.stop.is_set():
                        return
                    pub.begin()
                    self._txn_first_version = unit.version
        finally:
            if bar is not None:
                bar.close()
        block = self.block
        if block is not None:
            if self.rows is not None and unit.version == block.last:
                self._publish_rows(unit, net_from=block.first)
        elif self.rows is not None and not self._publish_rows(unit, prepared=prepared):
            return  # a stop committed part of the version's row changes
        if self.already and self.already.skip_summary(unit.table_id, unit.version, unit.snapshot):
            self._say_already(f"the summary of version {unit.version}")
        else:
            commits = self.topics.commits
            ts_c, hdr_c = self._record_timestamp(commits, unit.timestamp.timestamp)
            summary = encode_commit_summary(
                unit.summary(), extra_headers=hdr_c, oversize=self._oversize(commits)
            )
            pub.produce_many(commits, summary.values, summary.key, summary.headers, ts_c)
            # after the summary, in its transaction and partition: both are there, or neither
            changed = unit.schema_change() if isinstance(unit, CommitWork) else None
            if changed is not None:
                record = encode_schema_changed(changed, extra_headers=hdr_c, oversize=self._oversize(commits))
                pub.produce_many(commits, record.values, record.key, record.headers, ts_c)
        self.produced = position_after(unit, unit.count - 1)
        self._completed.append((unit.version, unit.timestamp.timestamp))
        if block is not None and unit.version >= block.last:
            self.block_complete = True

    def _say_already(self, what: str) -> None:
        log.warning(
            "not published again: %s, committed already (a transaction Kafka committed on some of its "
            "partitions only, and whose other records read as aborted)",
            what,
            extra=self._log_extra,
        )

    def _prepare_rows(self, unit: PublishUnit) -> VersionRows | None:
        """A registry format's row changes of a version not begun, read up to their first records
        before its actions are produced: a schema the registry refuses stops the table before
        anything of the version is published (the open transaction holds earlier versions only).
        None otherwise (the row changes are read after the actions, as they always are)."""
        rows = self.rows
        if rows is None or rows.registry is None or self.block is not None:
            return None
        if unit.start != 0 or unit.row_offset:
            return None  # begun in a committed transaction already
        stream = rows.rows_of(unit)
        self._end_before_pairing(stream, unit)
        stream.prepare()
        return stream

    def _end_before_pairing(self, stream: VersionRows, unit: PublishUnit) -> None:
        """Reading the change data twice may outlast transaction.timeout.ms: end the open one."""
        pub = self.pub
        assert pub is not None
        if (
            stream.pairing_pass
            and not self.atomic
            and isinstance(unit, CommitWork)
            and unit.scan.summary.bytes_cdc > PAIRING_PASS_COMMIT_BYTES
            and pub.records
        ):
            self.commit()
            pub.begin()
            self._txn_first_version = unit.version

    def _publish_rows(
        self, unit: PublishUnit, *, net_from: int | None = None, prepared: VersionRows | None = None
    ) -> bool:
        """The row changes of ``unit`` (its actions are in), from the record the progress counts.

        Streamed a batch at a time; a transaction that reaches its bounds ends between two batches
        with a progress record counting the row-change records in it (``row_offset``), as an action
        chunk does. False when a stop ended the publishing (what was produced is committed).
        ``net_from``: the net row changes of versions ``net_from`` to ``unit``'s instead (a net
        catch-up: never cut).
        """
        pub, rows = self.pub, self.rows
        assert pub is not None and rows is not None
        last = unit.count - 1
        done = unit.row_offset
        self.produced = position_after(unit, last, done)
        if net_from is not None:
            assert isinstance(unit, CommitWork) and not done
            stream = rows.net_rows_of(unit, net_from)
        elif prepared is not None:
            stream = prepared  # read up to its first records before the actions
        else:
            stream = rows.rows_of(unit)
        if prepared is None:
            self._end_before_pairing(stream, unit)
        with closing(self._produce_rows(stream, unit.timestamp.timestamp, skip=done)) as produced:
            for n in produced:
                done += n
                self.produced = position_after(unit, last, done)
                if self._cut():
                    if not self.stop.is_set():
                        self.before_bounded_commit()
                    self.commit()  # row changes larger than a transaction
                    if self.stop.is_set():
                        return False
                    pub.begin()
                    self._txn_first_version = unit.version
        return True

    def _produce_rows(self, stream: VersionRows, ts_ms: int, *, skip: int = 0) -> Generator[int, None, None]:
        """Produce ``stream``'s records (past the first ``skip``) a batch at a time into the open
        transaction, yielding each batch's record count: the caller may end the transaction there.
        Closed (its spill files go) when the caller closes it, done or not."""
        pub, rows = self.pub, self.rows
        assert pub is not None and rows is not None
        limits = self.limits.get(rows.topics.changes)
        stream.max_record_bytes = limits.max_value_bytes if limits is not None else self.cfg.max_record_bytes
        timestamps: dict[str, int] = {}
        headers: Headers = []
        for topic in (rows.topics.changes, rows.topics.transaction):
            timestamps[topic], clamped = self._record_timestamp(topic, ts_ms)
            headers = headers or clamped
        with closing(skip_records(stream.records(), skip)) as chunks:
            for chunk in chunks:
                for i in range(0, len(chunk), self.batch_size):
                    part = chunk[i : i + self.batch_size]
                    pub.produce_keyed(part, timestamps, headers or None)
                    yield len(part)

    def publish_net_block(self, work: NetChangesWork) -> None:
        """The net row changes ``work`` names (a ``net-changes`` signal), alone in one transaction.

        The block is netted first, on this (the table's) thread, with nothing opened: a range the
        change data feed does not cover refuses the signal (``work.answer``). Then the block's
        BEGIN/END records and the unchanged progress record are committed together as an
        :class:`AtomicBlock`, whatever ``txn_max_records`` says: an error or a stop aborts it whole
        (the signal is answered so), never committing part of it. The open transaction, if any, is
        committed first. The signal is answered done once the block is committed.
        """
        pub, rows = self.pub, self.rows
        assert pub is not None and rows is not None
        try:
            stream = rows.net_rows_between(
                work.table_id, work.metadata, work.first, work.last, work.timestamp.timestamp, backfill=True
            )
        except DeltaMirrorError as exc:
            work.answer(f"versions {work.first} to {work.last}: {exc}")
            return
        except BaseException as exc:  # the request is taken: never leave the signal unanswered
            work.answer(f"versions {work.first} to {work.last}: not read ({type(exc).__name__}: {exc})")
            raise
        try:
            if self.in_transaction:
                self.commit()
            pub.begin()
            self._txn_first_version = work.last
            self._begin_block(work.first, work.last, "signal's net block")
            log.info(
                "net row changes of versions %d to %d on a signal: one transaction",
                work.first,
                work.last,
                extra=self._log_extra,
            )
            with closing(self._produce_rows(stream, work.timestamp.timestamp)) as produced:
                for n in produced:
                    self._events_in_txn += n
                    self._cut()  # a stop raises: the block is aborted, never committed in part
            self.block_complete = True
        except BaseException as exc:
            work.answer(f"versions {work.first} to {work.last}: not published ({type(exc).__name__}: {exc})")
            raise
        try:
            self.commit()
        except BaseException as exc:
            work.answer(
                f"versions {work.first} to {work.last}: the block's commit failed, it may or may not be "
                f"published: read the changes topic before sending again ({type(exc).__name__}: {exc})"
            )
            raise
        work.answer(None)

    def announce_replaced(self, work: TableReplacedWork) -> None:
        assert self.pub is not None
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
        self._produce(self.topics.commits, encode_table_replaced(record), now)
        log.warning(
            "table re-created: now mirroring table %s (was %s up to version %d)",
            work.table_id,
            work.previous_table_id,
            work.previous_version,
            extra={**self._log_extra, "reason": work.reason},
        )

    def announce_dropped(self, work: TableDroppedWork) -> None:
        """The table's last transaction: ``tableDropped`` and a tombstone of its progress record.

        Committed here; the table is not published again (a table created later at the location
        starts afresh, as its snapshot mode says). Aborted, it is announced again on the restart.
        """
        assert self.pub is not None
        now = int(time.time() * 1000)
        if work.table_id is not None:
            record = TableDropped(
                schema_version=SCHEMA_VERSION,
                table_uri=self.uri,
                table_id=work.table_id,
                last_version=work.last_version,
                reason=work.reason,
                detected_at=now,
            )
            self._produce(self.topics.commits, encode_table_dropped(record), now)
        self._produce(self.cfg.progress_topic, encode_progress_tombstone(self.uri), 0)
        self.produced = None  # no progress record: the tombstone above is the last word
        self.commit()
        log.warning(
            "table dropped: %s; no longer mirrored (last version published: %d)",
            work.reason,
            work.last_version,
            extra=self._log_extra,
        )

    def idle_duties(self) -> None:
        """Heartbeats, and the periodic progress re-write that makes a fenced idle watcher notice."""
        if self.committed is None or self.pub is None:
            return
        now_s = time.monotonic()
        heartbeat = self.cfg.heartbeat_interval_s
        # the liveness re-write is not activity: it must not postpone a heartbeat forever
        # a turn may come DUE_EARLY_S before it is due (the scheduler takes tables due that soon):
        # a duty as long as the poll would otherwise wait a whole poll more, every other turn
        due_heartbeat = heartbeat is not None and now_s - self._last_activity >= heartbeat - DUE_EARLY_S
        last_end = self._last_txn_end
        if isinstance(self.pub, ProducerLease):  # a fence shows at any commit of the shard's producer
            last_end = max(last_end, self.pub.last_commit)
        if not due_heartbeat and now_s - last_end < LIVENESS_INTERVAL_S - DUE_EARLY_S:
            return
        self.pub.begin()
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
            self._produce(self.topics.commits, encode_heartbeat(beat), now)
        self.commit()

    # --- ending a transaction -------------------------------------------------------------------

    def commit(self, timeout_s: float | None = None) -> None:
        """Commit the open transaction with its progress record (60 s at most, less when stopping)."""
        pub = self.pub
        assert pub is not None
        if timeout_s is None:
            timeout_s = max(0.0, min(60.0, self.time_left()))
        if self.produced is not None:
            self._produce(
                self.cfg.progress_topic,
                encode_progress(progress_record(self.produced, self.uri, self.txn_id)),
                0,
            )
        pub.commit(timeout_s)
        self._txn_first_version = None
        self.block, self.block_complete = None, False
        self.committed = self.produced
        self._last_txn_end = time.monotonic()
        self.metrics.transaction_committed(self.uri)
        if self._events_in_txn:
            self._last_activity = self._last_txn_end
            self.metrics.event_published(self.uri, self._events_in_txn)
        for version, ts in self._completed:
            self.metrics.published_version(self.uri, version, ts)
        self._completed.clear()
        self._events_in_txn = 0

    def abort(self, timeout_s: float | None = None) -> None:
        """Abort the open transaction (30 s at most, less when stopping): back to the committed position."""
        if timeout_s is None:
            timeout_s = max(0.0, min(30.0, self.time_left()))
        if self.pub is not None and self.pub.in_transaction:
            self.metrics.transaction_aborted(self.uri)
            self.pub.abort(timeout_s)
        self._txn_first_version = None
        self.block, self.block_complete = None, False
        self.produced = self.committed
        self._completed.clear()
        self._events_in_txn = 0


__all__ = ["BATCH", "LIVENESS_INTERVAL_S", "AtomicBlock", "TableTransactions", "action_records_for"]
