"""The snapshot consumer: an :class:`~.state.IncrementalSnapshot` per table, kept current from Kafka.

:class:`SnapshotConsumer` reads the actions topic (and the commits topic, when given) through the
mirror's one reader, :class:`~deltamirror.mirror.kafka.consumer.MirrorConsumer` (``read_committed``,
fragments joined, every partition assigned to this instance), applies each record to its table's
state, and after each batch (:meth:`SnapshotConsumer.checkpoint`) stores the offsets for the group
commit, reports the applied versions and replacements (callbacks), and saves the state when a
save is due, in that order.

Persistence (``state_dir``): each table's state is saved as a Delta checkpoint that any Delta
reader opens (:mod:`.store`, :mod:`.table_folder`), together with the offsets it corresponds
to, after ``checkpoint_interval_versions`` applied versions (over all tables) or
``checkpoint_interval_s`` seconds after the first change since the last save, whichever comes
first, and always when the loop ends (a clean stop, or the end of the topics with ``once``).
While :meth:`SnapshotConsumer.run` reads the backlog the topics held when it started (until every
partition has been at its end once), the interval does not apply: a save of the whole state per
interval would be paid again and again for a state that is about to change, so the first save
comes once caught up (or at the loop's end), or, for a backlog that takes longer,
``CATCH_UP_SAVE_FACTOR`` times ``checkpoint_interval_s`` after the first change since the last
save (``catch_up_saves=True`` applies the interval throughout). A crash during the catch-up
re-reads from the last saved offsets, as after any crash.
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

Memory (:mod:`.memory`): after each batch :meth:`SnapshotConsumer.run` gives what glibc's heap and
pyarrow's pool hold free back to the system: reading a backlog frees much more than the state
keeps. The commands (``consume-snapshot``, ``invalidate``) also make pyarrow's jemalloc pool, with
freed pages returned at once, their process's default (:func:`deltamirror.core.memory.use_returning_pool`); a
library user's process keeps the pool it chose, and may call that function itself.

Records are untrusted input (:mod:`deltamirror.mirror.records.boundary`): each is held to the consumers'
boundary once, by the mirror's decoder (``rules``: the locations tables may be at, the prefixes
their files may be under, the limits), and to the state's own rules (versions in order, each
table at the location it was first seen at, at most ``limits.max_tables`` tables). A record that
fails is a :class:`~deltamirror.mirror.records.boundary.BadRecordError` naming topic, partition and
offset. With ``on_bad_record="stop"`` (the default) the consumer applies, reports and stores the
offsets of everything before it, saves the state, and raises it: a restart reads from it again.
With ``"skip"`` it is logged (one line), counted, and passed over; with ``"dead-letter"`` also
handed to ``dead_letters`` (a copy on a topic). A skipped record that belonged to a real version
leaves that version incomplete: the table waits for its next snapshot (a new version starting
while one is incomplete supersedes it, in these modes).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from deltamirror.core.errors import ConfigError
from deltamirror.core.memory import give_back
from deltamirror.mirror.errors import EventStreamError, StopRequested
from deltamirror.mirror.records.boundary import (
    BAD_RECORD_CHOICES,
    BadRecordError,
    OnBadRecord,
    RecordRules,
    TablePins,
    shown,
)
from deltamirror.mirror.records.event_batches import ActionEventBatch, Envelope, Segment, decode_action_events
from deltamirror.mirror.records.events import (
    COMMITS_KINDS,
    ActionEvent,
    CommitsTopicRecord,
    CommitSummary,
    SchemaChanged,
    TableDropped,
    TableReplaced,
    decode_commits_record,
)
from deltamirror.mirror.records.fragments import KeyedFragments
from deltamirror.mirror.records.headers import HEADER_KIND, header_value

from .state import IncrementalSnapshot, Invalidation
from .store import Position, StateStore

if TYPE_CHECKING:
    from deltamirror.mirror.kafka.consumer import MirrorConsumer, Record

    from ..metrics import MetricsSink

#: what a consumer that copies refused records somewhere (``on_bad_record="dead-letter"``) calls
#: with each: the refusal, and the record when it is at hand (not for fragments cut short)
BadRecordSink = Callable[[BadRecordError, "Record | None"], None]

log = logging.getLogger(__name__)

DEFAULT_GROUP_ID = "deltamirror-snapshot-consumer"
#: a save after this many applied versions (over all tables) ...
DEFAULT_CHECKPOINT_INTERVAL_VERSIONS = 100
#: ... or this many seconds after the first change since the last save
DEFAULT_CHECKPOINT_INTERVAL_S = 60.0
#: records taken from the client at once: each batch is decoded in columns, then checkpointed
DEFAULT_BATCH_SIZE = 10_000
#: records taken between two returns of the memory freed since to the system (:func:`give_back`);
#: it is returned before and after each save too. After each batch (10,000 records at most) it
#: cost ~6 s of the ~36 s of CPU of a 1M-file catch-up: ``malloc_trim`` walks the whole heap, and
#: the next batch faults the pages back in; the heap reuses what a batch freed for the next
#: batches, so between two returns it holds about one batch's worth more, not more each batch
GIVE_BACK_RECORDS = 20_000
#: while catching up, a save only this many times ``checkpoint_interval_s`` after the first change
CATCH_UP_SAVE_FACTOR = 10


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
SchemaChangedCallback = Callable[[SchemaChanged], None]


@runtime_checkable
class _Columns(Protocol):
    """Records that also give their fields as columns (:class:`~deltamirror.mirror.kafka.consumer.RecordBatch`)."""

    def topics(self) -> list[str]: ...
    def partitions(self) -> list[int]: ...
    def offsets(self) -> list[int]: ...
    def first_offsets(self) -> list[int]: ...
    def values(self) -> list[bytes]: ...
    def keys(self) -> list[bytes | None]: ...


class OffsetStore(Protocol):
    """Where a checkpoint stores the offsets for the group commit (a MirrorConsumer with a group)."""

    def store_offsets(self, offsets: Mapping[tuple[str, int], int]) -> None: ...


class SnapshotConsumer:
    """Keeps an :class:`IncrementalSnapshot` per table of an actions topic.

    Every partition of the topic (and of ``commits_topic``, when given) is assigned to this
    consumer (no group rebalancing: each instance keeps the whole state, so run one per
    ``state_dir``). ``on_applied`` is called for each applied version, ``on_replaced`` for each
    ``tableReplaced`` read from ``commits_topic``, ``on_schema_changed`` for each ``schemaChanged``
    of a table it keeps, in the order they happened, once the batch that completes them is
    handled (before the save that includes them: at least once).
    ``checkpoint_interval_versions`` / ``checkpoint_interval_s`` say how often the state is saved
    to ``state_dir`` (None: never on that count; the loop's end always saves), once :meth:`run`
    has caught up with the backlog it started with (``catch_up_saves``: throughout; see the
    module docstring).
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
        on_schema_changed: SchemaChangedCallback | None = None,
        metrics: MetricsSink | None = None,
        checkpoint_interval_versions: int | None = DEFAULT_CHECKPOINT_INTERVAL_VERSIONS,
        checkpoint_interval_s: float | None = DEFAULT_CHECKPOINT_INTERVAL_S,
        rules: RecordRules | None = None,
        on_bad_record: OnBadRecord = "stop",
        dead_letters: BadRecordSink | None = None,
        catch_up_saves: bool = False,
    ) -> None:
        if commits_topic == topic:
            raise ConfigError(f"the commits topic is the actions topic ({topic})")
        if on_bad_record not in BAD_RECORD_CHOICES:
            raise ConfigError(
                f"on_bad_record must be one of {', '.join(BAD_RECORD_CHOICES)}, not {on_bad_record!r}"
            )
        if (on_bad_record == "dead-letter") != (dead_letters is not None):
            raise ConfigError(
                "on_bad_record dead-letter goes with dead_letters (where refused records go), and only it"
            )
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
        self.catch_up_saves = catch_up_saves
        #: False while :meth:`run` reads the backlog it started with (a caller of :meth:`handle`
        #: reads the topics itself: the interval applies to it throughout)
        self.caught_up = True
        self.topic = topic
        self.commits_topic = commits_topic
        self.group_id = group_id
        #: the cluster's librdkafka settings; how the topics are read is MirrorConsumer's
        self.config = {**(kafka or {}), "bootstrap.servers": bootstrap_servers}
        self.store = (
            StateStore(state_dir, topic, commits_topic, group_id=group_id) if state_dir is not None else None
        )
        #: what a record must hold besides the contract (locations, path prefixes, limits)
        self.rules = rules if rules is not None else RecordRules()
        self.on_bad_record: OnBadRecord = on_bad_record
        self.dead_letters = dead_letters
        self.tables: dict[str, IncrementalSnapshot] = {}
        position = Position()
        if self.store is not None:
            # the files' stats stay on disk (:mod:`.stats_spill`): a load does not read them
            self.tables, position = self.store.load_all(spill_stats=True)
            for state in self.tables.values():
                state.spill_stats(self.store.root)  # those of an older format, read whole
        #: each table's location, pinned when first seen (the saved states' included)
        self.pins = TablePins(
            self.rules.limits, {t: s.table_uri for t, s in self.tables.items() if s.table_uri is not None}
        )
        self._offsets = position.offsets
        self._commits_offsets = position.commits_offsets
        #: table ids dropped on tableReplaced (-> last version published for them); their events are skipped
        self.retired = position.retired
        #: where the tables retired since the start were (their events elsewhere are refused: a
        #: tableDropped or tableReplaced read before a table's events cannot move it either)
        self._retired_at: dict[str, str] = {}
        self.on_applied = on_applied
        self.on_replaced = on_replaced
        self.on_schema_changed = on_schema_changed
        #: what operators see (consumer/metrics.py: ConsumerMetrics); None measures nothing
        self.metrics = metrics
        self.stop_event = stop or threading.Event()
        self.batch_size = batch_size
        #: fragments of records given to :meth:`handle`, per partition and key (run's records
        #: come whole, joined by its reader: :attr:`_reader`)
        self._fragments = KeyedFragments(self.rules.limits)
        #: the reader of :meth:`run` while it runs: what it holds in part bounds the offsets saved
        self._reader: MirrorConsumer | None = None
        #: per partition, the offset of the first record of each table's unfinished version
        self._starts: dict[int, dict[str, int]] = {}
        self._dirty: set[str] = set()
        self._dropped: set[str] = set()
        self._notices: list[tuple[Invalidation, IncrementalSnapshot] | TableReplacement | SchemaChanged] = []
        #: events of retired tables that were skipped
        self.skipped_retired_events = 0
        #: records refused and passed over (on_bad_record skip or dead-letter), and records of a
        #: commits-topic kind this version does not know (skipped, as the contract says)
        self.skipped_records = 0
        self.unknown_kinds = 0
        #: versions applied since the last save, and when the first change since it was reported
        self._unsaved_versions = 0
        self._unsaved_since: float | None = None
        #: saves of the state (a Delta checkpoint per changed table, then the offsets) so far
        self.saves = 0
        #: records taken since the freed memory was last returned to the system (GIVE_BACK_RECORDS)
        self._kept_since_give_back = 0

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
        from deltamirror.mirror.kafka.consumer import MirrorConsumer

        # one that reads to the end asks the broker not to hold an empty fetch (MirrorConsumer's
        # default); a long-running one keeps librdkafka's fetch wait
        limits = self.rules.limits
        consumer = (
            MirrorConsumer(self.config, group_id=self.group_id, limits=limits)
            if once
            else MirrorConsumer(self.config, group_id=self.group_id, fetch_wait_max_ms=None, limits=limits)
        )
        with consumer:
            self._reader = consumer
            try:
                try:
                    with contextlib.suppress(StopRequested):  # stopped: what was taken is still saved
                        self._consume(consumer, once=once, topic_timeout_s=topic_timeout_s)
                except BadRecordError as exc:
                    # stopped at a refused record: what came before it is delivered and saved
                    # first, and a restart reads from it (fragments refused by the reader may
                    # start before records of other keys taken after them)
                    self._restart_at(exc)
                    self._end(consumer)
                    raise
                self._end(consumer)
            finally:
                self._reader = None
        # closing the consumer commits the stored offsets (within a bound: MirrorConsumer.close)

    def _restart_at(self, error: BadRecordError) -> None:
        """A restart reads from the record ``error`` names again (when it names one of these topics)."""
        where = error.context
        partition, offset = where.get("partition"), where.get("offset")
        if type(partition) is not int or type(offset) is not int:
            return
        offsets = {self.topic: self._offsets, self.commits_topic: self._commits_offsets}.get(
            where.get("topic")
        )
        if offsets is not None and partition in offsets:
            offsets[partition] = min(offsets[partition], offset)

    def _end(self, consumer: MirrorConsumer) -> None:
        self.checkpoint(consumer)
        if self.unsaved:  # the loop's end always saves
            self.save()

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
        self.caught_up = consumer.at_end
        # without once, empty batches come too while the topics are quiet: each is a checkpoint;
        # fragments refused by the read loop come to _fragments_refused (which raises them to stop)
        for batch in consumer.batches(
            until_end=once,
            stop=self.stop_event,
            max_records=self.batch_size,
            on_bad_record=None if self.on_bad_record == "stop" else self._fragments_refused,
        ):
            saves = self.saves
            self.take_batch(batch)
            self.caught_up = self.caught_up or consumer.at_end
            self.checkpoint(consumer)
            self._kept_since_give_back += len(batch)
            if self.saves != saves or self._kept_since_give_back >= GIVE_BACK_RECORDS:
                give_back()  # what the batches (and a save) freed leaves the process
                self._kept_since_give_back = 0
            if self.metrics is not None:
                self.metrics.batch_read(len(batch), consumer)

    # --- refused records -----------------------------------------------------------------------

    def _refused(self, error: BadRecordError, record: Record | None = None) -> None:
        """A record the boundary refused: raised (stop), or logged, counted and passed over."""
        if self.on_bad_record == "stop":
            raise error
        self.skipped_records += 1
        log.warning("record skipped (on_bad_record %s): %s", self.on_bad_record, error)
        if self.metrics is not None:
            self.metrics.records_skipped(str(error.context.get("topic") or self.topic), "refused")
        if self.dead_letters is not None:
            self.dead_letters(error, record)

    def _fragments_refused(self, error: BadRecordError) -> None:
        self._refused(error, None)

    @staticmethod
    def _where(topic: str | None, partition: int, offset: int) -> dict[str, Any]:
        return {"topic": topic, "partition": partition, "offset": offset}

    # --- records -------------------------------------------------------------------------------

    def take_batch(self, records: Sequence[Record]) -> None:
        """Whole records in partition order, as :meth:`take` takes them one by one, with the same
        outcome; the actions records decoded in columns (the batch decoder of
        :mod:`deltamirror.mirror.records.event_batches`), a run of one partition at a time.

        A subclass that overrides :meth:`take` (to see every record) gets its records one by one.
        """
        if type(self).take is not SnapshotConsumer.take:
            for record in records:
                self.take(record)
            return
        if isinstance(records, _Columns):  # a MirrorConsumer's RecordBatch
            topics, partitions = records.topics(), records.partitions()
            values, offsets, firsts = records.values(), records.offsets(), records.first_offsets()
            keys = records.keys()
        else:
            topics, partitions = [r.topic for r in records], [r.partition for r in records]
            values, offsets = [r.value for r in records], [r.offset for r in records]
            firsts = [r.first_offset for r in records]
            keys = [r.key for r in records]
        start, n = 0, len(topics)
        while start < n:
            if topics[start] != self.topic:
                self.take(records[start])
                start += 1
                continue
            stop, partition = start + 1, partitions[start]
            while stop < n and partitions[stop] == partition and topics[stop] == self.topic:
                stop += 1
            self._take_actions(
                partition,
                values[start:stop],
                offsets[start:stop],
                firsts[start:stop],
                lambda i, first=start: records[first + i],  # type: ignore[misc]
                keys[start:stop],
            )
            start = stop

    def _take_actions(
        self,
        partition: int,
        values: list[bytes],
        offsets: list[int],
        firsts: list[int],
        record_at: Callable[[int], Record | None] | None = None,
        keys: list[bytes | None] | None = None,
    ) -> None:
        """Actions-topic records of one partition, in order (``firsts``: their first fragments;
        ``keys``: their keys, when known, each the table id of its record as the contract says).

        Decoded in columns up to the first record the boundary refuses: the versions before it
        are applied, then it is refused (:meth:`_refused`), and, when it is passed over, the
        records after it are taken the same way."""
        at = 0
        while at < len(values):
            batch = decode_action_events(
                values[at:],
                lambda i, at=at: self._where(self.topic, partition, firsts[at + i]),  # type: ignore[misc]
                rules=self.rules,
                partial=True,
            )
            if keys is not None:
                batch = self._keyed(batch, values, keys, at, partition, firsts)
            for segment in batch.segments:
                self._take_segment(segment, partition, at, offsets, firsts, record_at)
            if batch.refused is None:
                break
            bad = at + batch.refused[0]
            if self.on_bad_record == "stop":
                self._offsets[partition] = firsts[bad]  # a restart reads from the refused record
            self._refused(batch.refused[1], record_at(bad) if record_at is not None else None)
            at = bad + 1
        self._offsets[partition] = offsets[-1] + 1

    def _keyed(
        self,
        batch: ActionEventBatch,
        values: list[bytes],
        keys: list[bytes | None],
        at: int,
        partition: int,
        firsts: list[int],
    ) -> ActionEventBatch:
        """``batch``, or the part of it before the first record whose key is not its table id."""
        for segment in batch.segments:
            expected = segment.envelope.table_id.encode()
            lo, hi = at + segment.start, at + segment.stop
            if keys[lo:hi].count(expected) == hi - lo:
                continue
            bad = next(i for i in range(lo, hi) if keys[i] != expected)
            key = keys[bad]
            error = BadRecordError(
                f"a record of table {shown(segment.envelope.table_id)} is keyed "
                f"{shown(key.decode(errors='replace')) if key is not None else 'by nothing'}: the key of "
                "an action event is its table id",
                version=segment.envelope.version,
                **self._where(self.topic, partition, firsts[bad]),
            )
            before = decode_action_events(values[at:bad], rules=self.rules)  # accepted just now
            before.refused = (bad - at, error)
            return before
        return batch

    def _take_segment(
        self,
        segment: Segment,
        partition: int,
        at: int,
        offsets: list[int],
        firsts: list[int],
        record_at: Callable[[int], Record | None] | None,
    ) -> None:
        """One decoded run of a version's records (positions from ``at`` on), checked against the
        state's own rules (its table's location and count, versions in order), then applied."""
        env = segment.envelope
        first = at + segment.start
        where = self._where(self.topic, partition, firsts[first])
        if env.table_id in self.retired:
            retired_at = self._retired_at.get(env.table_id)
            if retired_at is None or retired_at == env.table_uri:
                self.skipped_retired_events += segment.stop - segment.start
                return
            moved = (
                f"table {shown(env.table_id)} was dropped or replaced at {shown(retired_at)!r}, but its "
                f"events say it is at {shown(env.table_uri)!r}: one of those records is not the watcher's"
            )
            self._segment_refused(
                BadRecordError(moved, version=env.version, **where), partition, firsts, first, record_at
            )
            return
        problem = self.pins.problem(env.table_id, env.table_uri)
        if problem is not None:
            self._segment_refused(
                BadRecordError(problem, version=env.version, **where), partition, firsts, first, record_at
            )
            return
        state = self._state_of(env)
        starts = self._starts.setdefault(partition, {})
        try:
            applied = self._apply(state, segment)
        except EventStreamError as exc:
            error = BadRecordError(exc.message, table=env.table_id, version=env.version, **where)
            self._segment_refused(error, partition, firsts, first, record_at)
            return
        self._segment_read(segment, partition, offsets[at:] if at else offsets)
        self._after_apply(state, env, applied, starts, segment.first_index == 0, firsts[first])

    def _apply(self, state: IncrementalSnapshot, segment: Segment) -> Invalidation | None:
        """``segment`` applied to ``state``; when skipping refused records, a version that starts
        while another is incomplete supersedes it (that one lost a record: it can never end)."""
        try:
            return state.apply_segment(segment)
        except EventStreamError:
            if self.on_bad_record == "stop" or segment.first_index != 0 or not state.in_progress:
                raise
        log.warning(
            "table %s: an incomplete version is given up, superseded by version %d",
            shown(state.table_id),
            segment.envelope.version,
        )
        state.abandon_pending()
        return state.apply_segment(segment)

    def _segment_refused(
        self,
        error: BadRecordError,
        partition: int,
        firsts: list[int],
        first: int,
        record_at: Callable[[int], Record | None] | None,
    ) -> None:
        if self.on_bad_record == "stop":
            self._offsets[partition] = firsts[first]
        self._refused(error, record_at(first) if record_at is not None else None)

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
            record,
        )

    def handle(
        self,
        topic: str,
        partition: int,
        offset: int,
        value: bytes,
        headers: Sequence[tuple[str, bytes | str | None]] | None = None,
        key: bytes | None = None,
    ) -> None:
        """One record as Kafka stores it (maybe a fragment of a larger one), in partition order.

        For a caller that reads the topics itself; :meth:`run` takes whole records (:meth:`take`).
        :meth:`checkpoint` then persists and reports. Fragments are joined per partition and
        ``key`` (the record's key: on a topic shared by many tables another table's records may
        come between a record's fragments; a caller that passes no key has them joined per
        partition, which refuses such records).
        """
        if topic != self.topic and topic != self.commits_topic:
            raise ConfigError(f"a record of topic {topic}, which this consumer does not read")
        try:
            joined = self._fragments.feed((topic, partition), key, offset, value, headers)
        except BadRecordError as exc:
            self._refused(exc)
            return
        if joined is None:
            return
        whole, first = joined
        self._take(topic, partition, first, offset, whole, header_value(headers, HEADER_KIND), None)

    def _take(
        self,
        topic: str,
        partition: int,
        first: int,
        offset: int,
        value: bytes,
        kind: str | None,
        record: Record | None,
    ) -> None:
        if topic == self.topic:
            self._take_action(partition, first, offset, value, record)
        elif topic == self.commits_topic:
            self._take_commits(partition, offset, value, kind, record)
        else:
            raise ConfigError(f"a record of topic {topic}, which this consumer does not read")

    def _take_action(
        self, partition: int, first: int, offset: int, value: bytes, record: Record | None = None
    ) -> None:
        """One actions-topic record; ``first`` is the offset of its first fragment."""
        self._take_actions(partition, [value], [offset], [first], lambda _: record)

    def _state_of(self, head: ActionEvent | Envelope) -> IncrementalSnapshot:
        state = self.tables.get(head.table_id)
        if state is None:
            state = self.tables[head.table_id] = IncrementalSnapshot(head.table_id, head.table_uri)
            if self.store is not None:
                state.spill_stats(self.store.root)
            self.pins.pin(head.table_id, head.table_uri)
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

    def _take_commits(
        self, partition: int, offset: int, value: bytes, kind: str | None, record: Record | None = None
    ) -> None:
        """One commits-topic record: ``tableReplaced`` and ``tableDropped``; summaries and
        heartbeats are checked and, with metrics, counted; a kind this version does not know is
        skipped, as the contract says (counted too)."""
        where = self._where(self.commits_topic, partition, offset)
        try:
            seen = decode_commits_record(value, kind, wanted=COMMITS_KINDS, rules=self.rules, **where)
            if seen is not None:
                problem = self._commits_problem(seen, record)
                if problem is not None:
                    raise BadRecordError(problem, table=seen.table_id, **where)
        except BadRecordError as exc:
            self._commits_offsets[partition] = offset
            self._refused(exc, record)
            self._commits_offsets[partition] = offset + 1
            return
        self._commits_offsets[partition] = offset + 1
        if seen is None:
            self.unknown_kinds += 1
            if self.metrics is not None:
                self.metrics.records_skipped(self.commits_topic or "", "unknown-kind")
            return
        if isinstance(seen, TableReplaced | TableDropped):
            self.replace(seen)
            return
        if isinstance(seen, SchemaChanged) and seen.table_id not in self.retired:
            self.schema_changed(seen)
        if self.metrics is not None and seen.table_id not in self.retired:
            published = (
                seen.version if isinstance(seen, CommitSummary | SchemaChanged) else seen.latest_version
            )
            self.metrics.version_published(seen.table_uri or seen.table_id, published)

    def _commits_problem(self, seen: CommitsTopicRecord, record: Record | None) -> str | None:
        """Why a commits-topic record cannot be true of the tables this consumer knows: keyed by
        another id than its table's, or naming a known table at another location."""
        if record is not None and record.key != seen.table_id.encode():
            return f"a {seen.kind} record of table {shown(seen.table_id)} is keyed otherwise: its key is its table id"
        if isinstance(seen, TableReplaced | TableDropped):
            return self._replacement_problem(seen)
        pinned = self.pins.get(seen.table_id)
        if pinned is not None and pinned != seen.table_uri:
            return (
                f"a {seen.kind} record of table {shown(seen.table_id)} says it is at {shown(seen.table_uri)!r}, "
                f"not at {shown(pinned)}: records never move a table"
            )
        return None

    def _replacement_problem(self, record: TableReplaced | TableDropped) -> str | None:
        """Why a ``tableReplaced``/``tableDropped`` cannot be true of the tables this consumer
        knows: it names a known table at another location (no record moves a table)."""
        gone = record.table_id if isinstance(record, TableDropped) else record.previous_table_id
        pinned = self.pins.get(gone)
        if pinned is not None and pinned != record.table_uri:
            return (
                f"a {record.kind} record at {shown(record.table_uri)!r} names table {shown(gone)}, which is at "
                f"{shown(pinned)}: records never move a table"
            )
        if isinstance(record, TableReplaced):
            return self.pins.problem(record.table_id, record.table_uri) if record.table_id != gone else None
        return None

    def replace(self, record: TableReplaced | TableDropped) -> TableReplacement:
        """Drop the state of ``record.previous_table_id`` (of ``record.table_id`` for a dropped
        table) and retire that id (see the module docstring)."""
        dropped = isinstance(record, TableDropped)
        if isinstance(record, TableDropped):
            previous, previous_version = record.table_id, record.last_version
        else:
            previous, previous_version = record.previous_table_id, record.previous_version
        self.retired.pop(previous, None)
        self.retired[previous] = previous_version  # the newest last: the oldest is forgotten first
        self._retired_at[previous] = self.pins.get(previous) or record.table_uri
        while len(self.retired) > self.rules.limits.max_retired:
            oldest = next(iter(self.retired))
            del self.retired[oldest]
            self._retired_at.pop(oldest, None)
            log.info("retired table id %s forgotten (more than %d retired)", shown(oldest), len(self.retired))
        if not dropped:
            self.retired.pop(record.table_id, None)  # an id can come back (a table restored elsewhere)
            self._retired_at.pop(record.table_id, None)
        state = self.tables.pop(previous, None)
        self.pins.forget(previous)
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
            shown(previous),
            shown(record.table_uri),
            "dropped" if dropped else f"replaced by {shown(record.table_id)}",
            shown(record.reason),
            notice.dropped_files,
        )
        self._notices.append(notice)
        return notice

    def schema_changed(self, record: SchemaChanged) -> None:
        """A version changed the table's schema: handed on (``on_schema_changed``) at the next
        checkpoint, with what the batch applied. Kafka orders nothing across the two topics: the
        version it names may be applied before or after."""
        log.info(
            "table %s: version %d changed its schema (%s)",
            shown(record.table_id),
            record.version,
            record.change_class,
        )
        self._notices.append(record)

    # --- position and checkpoints --------------------------------------------------------------

    @property
    def position(self) -> Position:
        """Where a restart would continue from: what the next checkpoint writes."""
        return Position(self._safe_offsets(), self._safe_commits_offsets(), dict(self.retired))

    def _held_starts(self) -> dict[tuple[str, int], int]:
        """Per partition, the first fragment of the oldest record read in part (by the reader of
        :meth:`run` or by :meth:`handle`): on a shared topic other tables' records may come between
        a record's fragments and be taken before it, and a restart must read it whole again."""
        held = self._fragments.starts()
        if self._reader is not None:
            for where, offset in self._reader.fragment_starts().items():
                held[where] = min(offset, held.get(where, offset))
        return held

    def _safe_offsets(self) -> dict[int, int]:
        """Per partition, where a restart must read from: the oldest unfinished version or record
        read in part, or past the end."""
        held = self._held_starts()
        return {
            p: min(*self._starts.get(p, {}).values(), held.get((self.topic, p), o), o)
            for p, o in self._offsets.items()
        }

    def _safe_commits_offsets(self) -> dict[int, int]:
        """Per commits-topic partition, where a restart must read from (a record read in part again)."""
        held = self._held_starts()
        return {
            p: min(held.get((self.commits_topic or "", p), o), o) for p, o in self._commits_offsets.items()
        }

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
                stored.update({(self.commits_topic, p): o for p, o in self._safe_commits_offsets().items()})
            if stored:
                consumer.store_offsets(stored)
        self._report()
        if changed and self._save_due():
            self.save(offsets)

    def _report(self) -> None:
        """Each notice to its callback, oldest first; none is held once reported (a snapshot's
        lists every file of the table: a save after the report must not hold a second copy)."""
        notices, self._notices = self._notices, []
        for notice in notices:
            if isinstance(notice, TableReplacement):
                if self.on_replaced is not None:
                    self.on_replaced(notice)
            elif isinstance(notice, SchemaChanged):
                if self.on_schema_changed is not None:
                    self.on_schema_changed(notice)
            elif self.on_applied is not None:
                self.on_applied(*notice)

    @property
    def unsaved(self) -> bool:
        """True when a table changed or was dropped since the last save."""
        return bool(self._dirty or self._dropped)

    def _save_due(self) -> bool:
        versions, seconds = self.checkpoint_interval_versions, self.checkpoint_interval_s
        if not self.caught_up and not self.catch_up_saves:
            versions = None
            seconds = None if seconds is None else seconds * CATCH_UP_SAVE_FACTOR
        if versions is not None and self._unsaved_versions >= versions:
            return True
        since = self._unsaved_since
        return seconds is not None and since is not None and time.monotonic() - since >= seconds

    def save(self, offsets: Mapping[int, int] | None = None) -> None:
        """Save the tables changed since the last save and the position (``offsets``, or where a
        restart would read from now), whatever the interval; :meth:`run` does at its end. Nothing
        is written without ``state_dir``."""
        if self.store is not None:
            give_back()  # what the batches since the last return freed leaves before the save's peak
            self.store.save(
                (self.tables[t] for t in sorted(self._dirty)),
                self._safe_offsets() if offsets is None else offsets,
                commits_offsets=self._safe_commits_offsets(),
                retired=self.retired,
                dropped=sorted(self._dropped),
            )
            self.saves += 1
        self._dirty.clear()
        self._dropped.clear()
        self._unsaved_versions = 0
        self._unsaved_since = None


__all__ = [
    "CATCH_UP_SAVE_FACTOR",
    "DEFAULT_CHECKPOINT_INTERVAL_S",
    "DEFAULT_CHECKPOINT_INTERVAL_VERSIONS",
    "DEFAULT_GROUP_ID",
    "GIVE_BACK_RECORDS",
    "AppliedCallback",
    "ReplacedCallback",
    "SchemaChangedCallback",
    "SnapshotConsumer",
    "TableReplacement",
]
