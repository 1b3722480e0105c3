"""The snapshot consumer: an :class:`~.state.IncrementalSnapshot` per table, kept current from Kafka.

:class:`SnapshotConsumer` reads the actions topic (and the commits topic, when given) through the
mirror's one reader, :class:`~deltamirror.mirror.kafka_consumer.MirrorConsumer` (``read_committed``,
fragments joined, every partition assigned to this instance), applies each record to its table's
state, and after each batch (:meth:`SnapshotConsumer.checkpoint`) stores the offsets for the group
commit, reports the applied versions and replacements (callbacks), and saves the state when a
save is due, in that order.

Persistence (``state_dir``): each table's state is saved as a Delta checkpoint that any Delta
reader opens (:mod:`.store`, :mod:`.table_folder`), together with the offsets it corresponds
to, after ``checkpoint_interval_versions`` applied versions (over all tables) or
``checkpoint_interval_s`` seconds after the first change since the last save, whichever comes
first, and always when the loop ends (a clean stop, or the end of the topics with ``once``).
Between saves nothing is written: the offsets saved with the checkpoints are the restart
position, and a restart reads the topics again from them and applies the versions after them
again. That is the whole crash story; it bounds the re-read by the interval, and a save of a
large state (a whole checkpoint) is not paid per batch. Reports come before the save that
includes them: after a crash, the versions applied since the last save are applied and reported
again (at least once), never lost.

Where a restart continues: the saved offset of an actions partition is the first record of the
oldest version then incomplete in it (transactions of several tables interleave in one
partition, and a version can span transactions), so a restart re-reads every unfinished version
whole. Records a table has already applied (``version`` at or below its state's, see
:meth:`IncrementalSnapshot.apply`) are skipped on that re-read. Without ``state_dir`` nothing is
persisted and the state is rebuilt by reading the topics from their beginning (the watcher creates
its topics with unlimited retention). Either way the position comes from the state, not from the
group's committed offset: an offset is meaningless without the state it belongs to. The group
offsets (where the consumer is, saved or not) are still committed, so that lag shows in Kafka's
tools.

Re-created tables (``commits_topic``): the watcher announces a location that now holds another
table with a ``tableReplaced`` record on the commits topic, in the transaction of the new table's
first events. On it the consumer drops the previous ``tableId``'s state (and its files on disk),
remembers the id as retired, so that its events still to be read, or read again after a restart,
are skipped instead of building a new state for it, and reports a :class:`TableReplacement`
(``on_replaced``) after the drop is persisted. The two topics are read together but Kafka orders
nothing across topics: the notice can come before or after the previous table's last events, and
both orders end with its state dropped. Without ``commits_topic`` a re-created table simply
appears under its new ``tableId`` and the previous one's state stays. A ``tableDropped`` record (a
table deleted for good) is handled the same way, without a new table: its state is dropped, its id
retired, and the :class:`TableReplacement` reported says ``dropped``.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from deltamirror.core.errors import ConfigError
from deltamirror.mirror.errors import EventStreamError, StopRequested
from deltamirror.mirror.event_batches import Envelope, Segment, decode_action_events
from deltamirror.mirror.events import (
    ActionEvent,
    CommitSummary,
    Heartbeat,
    TableDropped,
    TableReplaced,
    decode_action_event,
    decode_commits_record,
)
from deltamirror.mirror.fragments import FragmentAssembler
from deltamirror.mirror.headers import HEADER_KIND, header_value

from .state import IncrementalSnapshot, Invalidation
from .store import Position, StateStore

if TYPE_CHECKING:
    from deltamirror.mirror.kafka_consumer import MirrorConsumer, Record

    from ..metrics import MetricsSink

log = logging.getLogger(__name__)

DEFAULT_GROUP_ID = "deltamirror-snapshot-consumer"
#: a save after this many applied versions (over all tables) ...
DEFAULT_CHECKPOINT_INTERVAL_VERSIONS = 100
#: ... or this many seconds after the first change since the last save
DEFAULT_CHECKPOINT_INTERVAL_S = 60.0
#: records taken from the client at once: each batch is decoded in columns, then checkpointed
DEFAULT_BATCH_SIZE = 10_000


@dataclass(frozen=True)
class TableReplacement:
    """A location now holds another table: everything cached for ``previous_table_id`` must go.

    ``dropped_version`` / ``dropped_files`` describe the state this consumer dropped (None / 0
    when it held none, e.g. the notice was read again after a restart). The new table's own
    versions follow as :class:`Invalidation` s of ``table_id``, starting from its snapshot or
    version 0.
    """

    table_uri: str
    table_id: str
    previous_table_id: str
    previous_version: int
    reason: str
    dropped_version: int | None
    dropped_files: int
    #: a ``tableDropped`` notice: the table is gone, no new one follows (``table_id`` is the
    #: dropped table's, as ``previous_table_id``)
    dropped: bool = False


AppliedCallback = Callable[[Invalidation, IncrementalSnapshot], None]
ReplacedCallback = Callable[[TableReplacement], None]


@runtime_checkable
class _Columns(Protocol):
    """Records that also give their fields as columns (:class:`~deltamirror.mirror.kafka_consumer.RecordBatch`)."""

    def topics(self) -> list[str]: ...
    def partitions(self) -> list[int]: ...
    def offsets(self) -> list[int]: ...
    def first_offsets(self) -> list[int]: ...
    def values(self) -> list[bytes]: ...


class OffsetStore(Protocol):
    """Where a checkpoint stores the offsets for the group commit (a MirrorConsumer with a group)."""

    def store_offsets(self, offsets: Mapping[tuple[str, int], int]) -> None: ...


class SnapshotConsumer:
    """Keeps an :class:`IncrementalSnapshot` per table of an actions topic.

    Every partition of the topic (and of ``commits_topic``, when given) is assigned to this
    consumer (no group rebalancing: each instance keeps the whole state, so run one per
    ``state_dir``). ``on_applied`` is called for each applied version, ``on_replaced`` for each
    ``tableReplaced`` read from ``commits_topic``, in the order they happened, once the batch
    that completes them is handled (before the save that includes them: at least once).
    ``checkpoint_interval_versions`` / ``checkpoint_interval_s`` say how often the state is saved
    to ``state_dir`` (None: never on that count; the loop's end always saves).
    """

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        *,
        group_id: str = DEFAULT_GROUP_ID,
        state_dir: str | Path | None = None,
        kafka: Mapping[str, str] | None = None,
        on_applied: AppliedCallback | None = None,
        stop: threading.Event | None = None,
        batch_size: int = DEFAULT_BATCH_SIZE,
        commits_topic: str | None = None,
        on_replaced: ReplacedCallback | None = None,
        metrics: MetricsSink | None = None,
        checkpoint_interval_versions: int | None = DEFAULT_CHECKPOINT_INTERVAL_VERSIONS,
        checkpoint_interval_s: float | None = DEFAULT_CHECKPOINT_INTERVAL_S,
    ) -> None:
        if commits_topic == topic:
            raise ConfigError(f"the commits topic is the actions topic ({topic})")
        if checkpoint_interval_versions is not None and (
            type(checkpoint_interval_versions) is not int or checkpoint_interval_versions < 1
        ):
            raise ConfigError(
                f"checkpoint_interval_versions must be 1 or more, not {checkpoint_interval_versions!r}"
            )
        if checkpoint_interval_s is not None and not checkpoint_interval_s > 0:
            raise ConfigError(f"checkpoint_interval_s must be more than 0, not {checkpoint_interval_s!r}")
        self.checkpoint_interval_versions = checkpoint_interval_versions
        self.checkpoint_interval_s = checkpoint_interval_s
        self.topic = topic
        self.commits_topic = commits_topic
        self.group_id = group_id
        #: the cluster's librdkafka settings; how the topics are read is MirrorConsumer's
        self.config = {**(kafka or {}), "bootstrap.servers": bootstrap_servers}
        self.store = (
            StateStore(state_dir, topic, commits_topic, group_id=group_id) if state_dir is not None else None
        )
        self.tables: dict[str, IncrementalSnapshot] = {}
        position = Position()
        if self.store is not None:
            self.tables, position = self.store.load_all()
        self._offsets = position.offsets
        self._commits_offsets = position.commits_offsets
        #: table ids dropped on tableReplaced (-> last version published for them); their events are skipped
        self.retired = position.retired
        self.on_applied = on_applied
        self.on_replaced = on_replaced
        #: what operators see (consumer/metrics.py: ConsumerMetrics); None measures nothing
        self.metrics = metrics
        self.stop_event = stop or threading.Event()
        self.batch_size = batch_size
        #: fragments of records given to :meth:`handle` (run's records come whole)
        self._assemblers: dict[tuple[str, int], FragmentAssembler] = {}
        self._fragment_start: dict[tuple[str, int], int] = {}
        #: per partition, the offset of the first record of each table's unfinished version
        self._starts: dict[int, dict[str, int]] = {}
        self._dirty: set[str] = set()
        self._dropped: set[str] = set()
        self._notices: list[tuple[Invalidation, IncrementalSnapshot] | TableReplacement] = []
        #: events of retired tables that were skipped
        self.skipped_retired_events = 0
        #: versions applied since the last save, and when the first change since it was reported
        self._unsaved_versions = 0
        self._unsaved_since: float | None = None
        #: saves of the state (a Delta checkpoint per changed table, then the offsets) so far
        self.saves = 0

    def request_stop(self) -> None:
        self.stop_event.set()

    # --- the Kafka loop ------------------------------------------------------------------------

    def run(self, *, once: bool = False, topic_timeout_s: float = 30.0) -> None:
        """Consume until stopped; with ``once``, until every partition is read to its end.

        Without ``once`` a topic that does not exist yet is waited for; with it, that is an error.
        """
        try:
            self._run(once, topic_timeout_s)
        except Exception as exc:
            if self.metrics is not None:
                self.metrics.stopped(exc)
            raise
        if self.metrics is not None:
            self.metrics.stopped()

    def _run(self, once: bool, topic_timeout_s: float) -> None:
        from deltamirror.mirror.kafka_consumer import MirrorConsumer

        # one that reads to the end asks the broker not to hold an empty fetch (MirrorConsumer's
        # default); a long-running one keeps librdkafka's fetch wait
        consumer = (
            MirrorConsumer(self.config, group_id=self.group_id)
            if once
            else MirrorConsumer(self.config, group_id=self.group_id, fetch_wait_max_ms=None)
        )
        with consumer:
            with contextlib.suppress(StopRequested):  # stopped: what was taken is still saved
                self._consume(consumer, once=once, topic_timeout_s=topic_timeout_s)
            self.checkpoint(consumer)
            if self.unsaved:  # the loop's end always saves
                self.save()
        # closing the consumer commits the stored offsets (within a bound: MirrorConsumer.close)

    def _consume(self, consumer: MirrorConsumer, *, once: bool, topic_timeout_s: float) -> None:
        wanted = {self.topic: self._offsets}
        if self.commits_topic is not None:
            wanted[self.commits_topic] = self._commits_offsets
        starts: list[tuple[str, int, int | None]] = []
        for topic, offsets in wanted.items():
            partitions = consumer.partitions(
                topic, wait_for_topic=not once, timeout_s=topic_timeout_s, stop=self.stop_event
            )
            if partitions is None:  # stopped while waiting for the topic
                return
            starts.extend((topic, p, offsets.get(p)) for p in partitions)
        consumer.assign(starts)
        # without once, empty batches come too while the topics are quiet: each is a checkpoint
        for batch in consumer.batches(until_end=once, stop=self.stop_event, max_records=self.batch_size):
            self.take_batch(batch)
            self.checkpoint(consumer)
            if self.metrics is not None:
                self.metrics.batch_read(len(batch), consumer)

    # --- records -------------------------------------------------------------------------------

    def take_batch(self, records: Sequence[Record]) -> None:
        """Whole records in partition order, as :meth:`take` takes them one by one, with the same
        outcome; the actions records decoded in columns (the batch decoder of
        :mod:`deltamirror.mirror.event_batches`), a run of one partition at a time.

        A subclass that overrides :meth:`take` (to see every record) gets its records one by one.
        """
        if type(self).take is not SnapshotConsumer.take:
            for record in records:
                self.take(record)
            return
        if isinstance(records, _Columns):  # a MirrorConsumer's RecordBatch
            topics, partitions = records.topics(), records.partitions()
            values, offsets, firsts = records.values(), records.offsets(), records.first_offsets()
        else:
            topics, partitions = [r.topic for r in records], [r.partition for r in records]
            values, offsets = [r.value for r in records], [r.offset for r in records]
            firsts = [r.first_offset for r in records]
        start, n = 0, len(topics)
        while start < n:
            if topics[start] != self.topic:
                self.take(records[start])
                start += 1
                continue
            stop, partition = start + 1, partitions[start]
            while stop < n and partitions[stop] == partition and topics[stop] == self.topic:
                stop += 1
            self._take_actions(partition, values[start:stop], offsets[start:stop], firsts[start:stop])
            start = stop

    def _take_actions(
        self, partition: int, values: list[bytes], offsets: list[int], firsts: list[int]
    ) -> None:
        """Actions-topic records of one partition, in order (``firsts``: their first fragments)."""
        batch = decode_action_events(
            values, lambda i: {"topic": self.topic, "partition": partition, "offset": offsets[i]}
        )
        starts = self._starts.setdefault(partition, {})
        for segment in batch.segments:
            env = segment.envelope
            if env.table_id in self.retired:
                self.skipped_retired_events += segment.stop - segment.start
                continue
            self._segment_read(segment, partition, offsets)
            state = self._state_of(env)
            applied = state.apply_segment(segment)
            self._after_apply(state, env, applied, starts, segment.first_index == 0, firsts[segment.start])
        self._offsets[partition] = offsets[-1] + 1

    def _segment_read(self, segment: Segment, partition: int, offsets: list[int]) -> None:
        """A subclass's look at a run of one version's records before it is applied (``offsets``:
        the batch's, so that ``offsets[segment.stop - 1]`` is the run's last record)."""

    def take(self, record: Record) -> None:
        """One whole record (fragments joined) of the actions or the commits topic, in partition order."""
        self._take(
            record.topic,
            record.partition,
            record.first_offset,
            record.offset,
            record.value,
            record.header(HEADER_KIND),
        )

    def handle(
        self,
        topic: str,
        partition: int,
        offset: int,
        value: bytes,
        headers: Sequence[tuple[str, bytes | str | None]] | None = None,
    ) -> None:
        """One record as Kafka stores it (maybe a fragment of a larger one), in partition order.

        For a caller that reads the topics itself; :meth:`run` takes whole records (:meth:`take`).
        :meth:`checkpoint` then persists and reports.
        """
        if topic != self.topic and topic != self.commits_topic:
            raise ConfigError(f"a record of topic {topic}, which this consumer does not read")
        where = (topic, partition)
        whole = self._assemblers.setdefault(where, FragmentAssembler()).feed(value, headers)
        if whole is None:
            self._fragment_start.setdefault(where, offset)
            return
        first = self._fragment_start.pop(where, offset)
        self._take(topic, partition, first, offset, whole, header_value(headers, HEADER_KIND))

    def _take(
        self, topic: str, partition: int, first: int, offset: int, value: bytes, kind: str | None
    ) -> None:
        if topic == self.topic:
            self._take_action(partition, first, offset, value)
        elif topic == self.commits_topic:
            self._take_commits(partition, offset, value, kind)
        else:
            raise ConfigError(f"a record of topic {topic}, which this consumer does not read")

    def _take_action(self, partition: int, first: int, offset: int, value: bytes) -> None:
        """One actions-topic record; ``first`` is the offset of its first fragment."""
        event = decode_action_event(value, topic=self.topic, partition=partition, offset=offset)
        self._offsets[partition] = offset + 1
        if event.table_id in self.retired:
            self.skipped_retired_events += 1
            return
        state = self._state_of(event)
        applied = state.apply(event)
        self._after_apply(
            state, event, applied, self._starts.setdefault(partition, {}), event.index == 0, first
        )

    def _state_of(self, head: ActionEvent | Envelope) -> IncrementalSnapshot:
        state = self.tables.get(head.table_id)
        if state is None:
            state = self.tables[head.table_id] = IncrementalSnapshot(head.table_id, head.table_uri)
        return state

    def _after_apply(
        self,
        state: IncrementalSnapshot,
        head: ActionEvent | Envelope,
        applied: Invalidation | None,
        starts: dict[str, int],
        starts_version: bool,
        first: int,
    ) -> None:
        """The bookkeeping after events of ``head``'s version were applied: where an incomplete
        version starts (``first``, when these events began it), what to save and report."""
        state.invalidations()  # reported through on_applied; the list must not grow
        if state.in_progress:
            if starts_version:
                starts[head.table_id] = first
        else:
            starts.pop(head.table_id, None)
        if applied is not None:
            self._dirty.add(head.table_id)
            self._notices.append((applied, state))
            self._unsaved_versions += 1
            if self.metrics is not None:
                self.metrics.version_applied(
                    head.table_uri or head.table_id, head.version, head.commit_timestamp, head.count
                )

    def _take_commits(self, partition: int, offset: int, value: bytes, kind: str | None) -> None:
        """One commits-topic record: ``tableReplaced``; with metrics, commits and heartbeats too."""
        self._commits_offsets[partition] = offset + 1
        where = {"topic": self.commits_topic, "partition": partition, "offset": offset}
        record = decode_commits_record(value, kind, wanted={"tableReplaced", "tableDropped"}, **where)
        if isinstance(record, TableReplaced | TableDropped):
            self.replace(record)
            return
        if self.metrics is None:
            return
        # read for the metrics only: a summary that breaks the contract must not stop a consumer
        # that would not have read it without metrics
        try:
            seen = decode_commits_record(value, kind, wanted={"commit", "heartbeat"}, **where)
        except EventStreamError as exc:
            log.warning("a commits-topic record read for metrics only is skipped: %s", exc)
            return
        if isinstance(seen, CommitSummary | Heartbeat) and seen.table_id not in self.retired:
            published = seen.version if isinstance(seen, CommitSummary) else seen.latest_version
            self.metrics.version_published(seen.table_uri or seen.table_id, published)

    def replace(self, record: TableReplaced | TableDropped) -> TableReplacement:
        """Drop the state of ``record.previous_table_id`` (of ``record.table_id`` for a dropped
        table) and retire that id (see the module docstring)."""
        dropped = isinstance(record, TableDropped)
        if isinstance(record, TableDropped):
            previous, previous_version = record.table_id, record.last_version
        else:
            previous, previous_version = record.previous_table_id, record.previous_version
        self.retired[previous] = previous_version
        if not dropped:
            self.retired.pop(record.table_id, None)  # an id can come back (a table restored elsewhere)
        state = self.tables.pop(previous, None)
        for starts in self._starts.values():
            starts.pop(previous, None)  # its unfinished version no longer holds the offset back
        self._dirty.discard(previous)
        self._dropped.add(previous)
        notice = TableReplacement(
            table_uri=record.table_uri,
            table_id=record.table_id,
            previous_table_id=previous,
            previous_version=previous_version,
            reason=record.reason,
            dropped_version=state.version if state is not None else None,
            dropped_files=state.file_count if state is not None else 0,
            dropped=dropped,
        )
        log.info(
            "table %s at %s was %s (%s): dropped its state (%s files)",
            previous,
            record.table_uri,
            "dropped" if dropped else f"replaced by {record.table_id}",
            record.reason,
            notice.dropped_files,
        )
        self._notices.append(notice)
        return notice

    # --- position and checkpoints --------------------------------------------------------------

    @property
    def position(self) -> Position:
        """Where a restart would continue from: what the next checkpoint writes."""
        return Position(self._safe_offsets(), dict(self._commits_offsets), dict(self.retired))

    def _safe_offsets(self) -> dict[int, int]:
        """Per partition, where a restart must read from: the oldest unfinished version, or past the end."""
        return {p: min(self._starts.get(p, {}).values(), default=o) for p, o in self._offsets.items()}

    def checkpoint(self, consumer: OffsetStore | None = None) -> None:
        """After a batch: store the offsets in ``consumer`` (if any) for the group commit, report
        what the batch applied, then save the state if a save is due (:meth:`save`).

        See the module docstring for why reports come before the save and saves come only at the
        interval. Nothing happens when nothing was applied or dropped.
        """
        changed = self.unsaved
        if not changed and not self._notices:
            return
        if changed and self._unsaved_since is None:
            self._unsaved_since = time.monotonic()
        offsets = self._safe_offsets()
        if consumer is not None:
            stored = {(self.topic, p): o for p, o in offsets.items()}
            if self.commits_topic is not None:
                stored.update({(self.commits_topic, p): o for p, o in self._commits_offsets.items()})
            if stored:
                consumer.store_offsets(stored)
        notices, self._notices = self._notices, []
        for notice in notices:
            if isinstance(notice, TableReplacement):
                if self.on_replaced is not None:
                    self.on_replaced(notice)
            elif self.on_applied is not None:
                self.on_applied(*notice)
        if changed and self._save_due():
            self.save(offsets)

    @property
    def unsaved(self) -> bool:
        """True when a table changed or was dropped since the last save."""
        return bool(self._dirty or self._dropped)

    def _save_due(self) -> bool:
        versions, seconds = self.checkpoint_interval_versions, self.checkpoint_interval_s
        if versions is not None and self._unsaved_versions >= versions:
            return True
        since = self._unsaved_since
        return seconds is not None and since is not None and time.monotonic() - since >= seconds

    def save(self, offsets: Mapping[int, int] | None = None) -> None:
        """Save the tables changed since the last save and the position (``offsets``, or where a
        restart would read from now), whatever the interval; :meth:`run` does at its end. Nothing
        is written without ``state_dir``."""
        if self.store is not None:
            self.store.save(
                (self.tables[t] for t in sorted(self._dirty)),
                self._safe_offsets() if offsets is None else offsets,
                commits_offsets=dict(self._commits_offsets),
                retired=self.retired,
                dropped=sorted(self._dropped),
            )
            self.saves += 1
        self._dirty.clear()
        self._dropped.clear()
        self._unsaved_versions = 0
        self._unsaved_since = None


__all__ = [
    "DEFAULT_CHECKPOINT_INTERVAL_S",
    "DEFAULT_CHECKPOINT_INTERVAL_VERSIONS",
    "DEFAULT_GROUP_ID",
    "AppliedCallback",
    "ReplacedCallback",
    "SnapshotConsumer",
    "TableReplacement",
]
