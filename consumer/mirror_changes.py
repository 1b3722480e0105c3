"""The change data feed of a table, read from its Kafka mirror instead of its ``_delta_log``.

The mirror holds every action of every version (the actions topic) and, in the same transaction as
a version's last record, one summary per version (the commits topic). The change rows themselves
come from the table's data files, read by :func:`deltamirror.core.changes.changes_from_actions` with
the same rules as a change feed read from the log, so the rows are delta-spark's.

Two halves, because the Spark source runs them in different processes:

* :class:`MirrorIndex` (the planner) reads the small commits topic: which versions are wholly in
  the mirror (a summary is committed only with its version's last record), their timestamps, and
  which partition of the actions topic holds the table (records are keyed by table id and placed
  by Kafka's murmur2 partitioner).
* :func:`read_mirror_versions` (a reader) reads the actions of a range of versions from one
  partition. It seeks with ``offsets_for_times`` to the first version's commit timestamp (record
  timestamps are the resolved, strictly increasing commit timestamps) and checks that the first
  record of the range it meets is that version's first action; a clamped or rewritten timestamp
  makes it read the partition from its start instead. A missing, repeated or out-of-order action is
  an :class:`EventStreamError`, never a skipped row (unless the caller asks to skip versions that
  retention deleted from the topic: the Spark source's failOnDataLoss=false).

Both take every record through the consumers' boundary (:mod:`deltamirror.mirror.records.boundary`): the
contract, core's rules for each action and its paths (``allowed_path_prefixes`` for a shallow
clone), and the table's own location: a record keyed by the table's id that says another id or
location is refused (no record moves the table). A refused record is a
:class:`~deltamirror.mirror.records.boundary.BadRecordError` naming topic, partition and offset; with
``on_bad_record="skip"`` it is logged, counted and passed over. The index stops at a refused record
(:attr:`MirrorIndex.refused`) and keeps the versions before it: a planner plans them first, then
raises it.

Neither imports pyspark: both are plain library code, usable without Spark.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from deltamirror.core.changes import VersionActions
from deltamirror.core.storage import normalize_table_uri
from deltamirror.mirror.errors import EventStreamError, KafkaError, TopicNotFoundError
from deltamirror.mirror.kafka.consumer import MirrorConsumer
from deltamirror.mirror.records.boundary import BadRecordError, OnBadRecord, RecordRules, shown
from deltamirror.mirror.records.events import (
    COMMITS_KINDS,
    CommitSummary,
    TableReplaced,
    decode_action_event,
    decode_commits_record,
)
from deltamirror.mirror.records.headers import HEADER_KIND
from deltamirror.mirror.topics import murmur2_partition

log = logging.getLogger(__name__)

#: versions skipped by a watcher (gaps) the index remembers at most (a real mirror has a few)
MAX_GAPS = 10_000


@dataclass(frozen=True)
class MirrorSettings:
    """Where a table's mirror is: plain strings only, so that Spark can pickle it to executors."""

    bootstrap_servers: str
    actions_topic: str
    commits_topic: str
    table_uri: str
    #: extra librdkafka settings (security.protocol, sasl.*, ssl.*): passed to every consumer. Kept
    #: out of repr(): it may hold a password, and Spark logs what it plans
    kafka_config: Mapping[str, str] = field(default_factory=dict, repr=False)
    #: a read fails when the broker sends nothing for this long (it should never wait on a committed range)
    idle_timeout_s: float = 60.0
    #: locations outside the table root whose files an action may name (a shallow clone's source)
    allowed_path_prefixes: tuple[str, ...] = ()
    #: a record the boundary refuses: ``stop`` (raise) or ``skip`` (log, count, pass over)
    on_bad_record: OnBadRecord = "stop"

    def __post_init__(self) -> None:
        object.__setattr__(self, "table_uri", normalize_table_uri(self.table_uri))
        object.__setattr__(self, "allowed_path_prefixes", tuple(self.allowed_path_prefixes))
        if self.on_bad_record not in ("stop", "skip"):
            raise ValueError(f"on_bad_record must be stop or skip here, not {self.on_bad_record!r}")

    def rules(self) -> RecordRules:
        return RecordRules(allowed_path_prefixes=self.allowed_path_prefixes)

    def consumer(self) -> MirrorConsumer:
        """A consumer of its own (assign() only, nothing committed): a fresh one per read."""
        return MirrorConsumer(
            {**self.kafka_config, "bootstrap.servers": self.bootstrap_servers}, purpose="changes"
        )

    def refused(self, error: BadRecordError) -> None:
        """A refused record: raised (stop) or logged and passed over (skip)."""
        if self.on_bad_record == "stop":
            raise error
        log.warning("record skipped (onBadRecord skip): %s", error)


@dataclass(frozen=True)
class MirroredVersion:
    version: int
    timestamp_ms: int
    action_count: int
    metadata_changed: bool
    #: the data files whose rows the version's changes are (its cdc files, else its adds and
    #: removes) and their bytes (added + removed: a summary does not give cdc files' sizes); what
    #: maxFilesPerTrigger and maxBytesPerTrigger count
    files: int = 0
    bytes: int = 0


class MirrorIndex:
    """What the commits topic says about one table: the versions wholly in the mirror, in order.

    :meth:`refresh` reads what was committed since the last call. Versions must follow one another
    from the first one seen; a jump (a watcher that re-snapshotted after the log was cleaned) is
    remembered and refused by :meth:`versions` for any range that needs the versions skipped.
    """

    def __init__(self, settings: MirrorSettings) -> None:
        self.settings = settings
        self.table_id: str | None = None
        self._versions: dict[int, MirroredVersion] = {}
        self._first: int | None = None
        self._last: int | None = None
        #: versions the mirror does not have although later ones are there: (first missing, next present)
        self._gaps: list[tuple[int, int]] = []
        self._snapshots: set[int] = set()
        #: where the next refresh starts reading, per commits-topic partition: after the last whole
        #: record taken (a run of fragments not yet complete is read again from its first fragment)
        self._next: dict[int, int] = {}
        self._rules = settings.rules()
        #: records of a kind this version does not know (skipped), and records refused and skipped
        self.unknown_kinds = 0
        self.skipped_records = 0
        #: the record that stopped the index (on_bad_record stop): nothing after it is read; the
        #: versions before it stay readable, and a reader that has read them raises it
        self.refused: BadRecordError | None = None

    def close(self) -> None:
        """Nothing stays open between refreshes; kept so that callers need not know."""

    @property
    def latest(self) -> int | None:
        """The last version wholly in the mirror (None before the first summary)."""
        return self._last

    @property
    def first(self) -> int | None:
        return self._first

    def refresh(self) -> None:
        """Read what was committed to the commits topic since the last refresh, up to its end.

        A fresh consumer each time, assigned where the last one stopped: the end of a partition is
        where its position reaches the last stable offset (read_committed), transaction markers
        included, which a consumer that already reported the end would not report again.
        """
        topic = self.settings.commits_topic
        if self.refused is not None:
            return  # nothing past a refused record is read
        try:
            with self.settings.consumer() as consumer:
                partitions = _partitions(consumer, topic, self.settings.table_uri)
                consumer.assign((topic, p, self._next.get(p)) for p in partitions)
                for batch in consumer.batches(
                    until_end=True,
                    idle_timeout_s=self.settings.idle_timeout_s,
                    on_bad_record=self._skip if self.settings.on_bad_record == "skip" else None,
                ):
                    for record in batch:
                        try:
                            self._take(
                                record.value,
                                record.header(HEADER_KIND),
                                offset=record.offset,
                                partition=record.partition,
                                key=record.key,
                            )
                        except BadRecordError as exc:
                            self._next[record.partition] = record.first_offset  # read again next time
                            if self.settings.on_bad_record == "stop":
                                raise
                            self._skip(exc)
                        self._next[record.partition] = record.offset + 1
        except BadRecordError as exc:
            # the versions before it stay readable: a planner plans them first, then raises it
            # (spark/planning.py: next_offset), and a restart reads it again
            self.refused = exc

    def _skip(self, error: BadRecordError) -> None:
        self.skipped_records += 1
        self.settings.refused(error)

    def _take(
        self,
        value: bytes,
        kind: bytes | str | None,
        *,
        offset: int | None = None,
        partition: int | None = None,
        key: bytes | bool | None = False,
    ) -> None:
        """One commits-topic record (``key``: its key, when read from Kafka)."""
        kind = kind.decode() if isinstance(kind, bytes) else kind
        where: dict[str, Any] = {
            "topic": self.settings.commits_topic,
            "partition": partition,
            "offset": offset,
        }
        record = decode_commits_record(
            value, kind, wanted=COMMITS_KINDS, rules=self._rules, table=self.settings.table_uri, **where
        )
        if record is None:
            self.unknown_kinds += 1  # a kind a newer watcher may write: skipped, as the contract says
            return
        if not isinstance(record, CommitSummary | TableReplaced):
            return  # heartbeats, dropped tables: not the feed's
        if record.table_uri != self.settings.table_uri:  # the watcher publishes normalized locations
            return  # another table's (the same id at another location is another table too)
        if key is not False and key != record.table_id.encode():
            raise BadRecordError(
                f"a {record.kind} record of table {shown(record.table_id)} is keyed otherwise: its key is its "
                "table id",
                table=self.settings.table_uri,
                **where,
            )
        if isinstance(record, TableReplaced):
            if self.table_id is not None:
                raise EventStreamError(
                    "the table was deleted and created anew at its location: its versions start over, so "
                    "this change feed cannot go on; start a new stream (new checkpoint) to read the new table",
                    table=self.settings.table_uri,
                )
            return
        if self.table_id is None:
            self.table_id = record.table_id
        elif record.table_id != self.table_id:
            raise EventStreamError(
                f"the table id changed from {self.table_id} to {record.table_id} (the table was re-created); "
                "start a new stream to read the new table",
                table=self.settings.table_uri,
                version=record.version,
            )
        v = record.version
        if self._last is not None and v <= self._last:
            return  # a re-published snapshot of a version already seen adds nothing to the feed
        if self._last is not None and v != self._last + 1:
            if len(self._gaps) >= MAX_GAPS:
                raise BadRecordError(
                    f"version {v} would be gap {len(self._gaps) + 1} in the mirror of the table, more than a "
                    f"reader takes ({MAX_GAPS})",
                    table=self.settings.table_uri,
                    **where,
                )
            self._gaps.append((self._last + 1, v))
        if record.snapshot:
            # a snapshot stands for the table at v, not for commit v's actions: no change rows from it
            self._snapshots.add(v)
        if self._first is None:
            self._first = v + 1 if record.snapshot else v
        files = record.cdc_files or record.adds + record.removes
        self._versions[v] = MirroredVersion(
            v,
            record.commit_timestamp,
            record.action_count,
            record.metadata_changed,
            files=files,
            bytes=record.bytes_added + record.bytes_removed,
        )
        self._last = v

    def timestamp(self, version: int) -> int:
        return self._versions[version].timestamp_ms

    def metadata_changed(self, version: int) -> bool:
        """Whether ``version`` has a metaData action (False for a version not in the index)."""
        entry = self._versions.get(version)
        return entry is not None and entry.metadata_changed

    def admit(self, first: int, last: int, *, max_files: int | None, max_bytes: int | None) -> int:
        """The last version of ``first..last`` a micro-batch reads under a files and bytes limit.

        Whole versions only, and at least one however large, as delta-spark admits a commit whose
        change rows come from cdc files or deletion vectors: all of it or nothing, the first
        always, a later one only if it fits in what is left.
        """
        files_left = max_files if max_files is not None else float("inf")
        bytes_left = max_bytes if max_bytes is not None else float("inf")
        admitted_files = False  # a version without data files (metaData only) fills nothing
        for v in range(first, last + 1):
            entry = self._versions.get(v)
            files, size = (entry.files, entry.bytes) if entry is not None else (0, 0)
            if admitted_files and (files > files_left or size > bytes_left):
                return v - 1
            admitted_files = admitted_files or files > 0
            files_left -= files
            bytes_left -= size
            if files_left <= 0 or bytes_left <= 0:
                return v
        return last

    def lost(self, start: int, end: int) -> list[tuple[int, int, str]]:
        """The versions of ``[start, end]`` the mirror does not hold as commits, as (first, last, why).

        Versions before the first mirrored commit, versions a watcher skipped when it re-snapshotted,
        and versions mirrored as a snapshot: their change rows cannot be read from the mirror.
        """
        out: list[tuple[int, int, str]] = []
        if self._first is not None and start < self._first:
            out.append(
                (
                    start,
                    min(end, self._first - 1),
                    f"its commits start at version {self._first}: the watcher was started there, or "
                    "began with a snapshot",
                )
            )
        for first_missing, next_present in self._gaps:
            lo, hi = max(start, first_missing), min(end, next_present - 1)
            if lo <= hi:
                out.append(
                    (
                        lo,
                        hi,
                        f"the watcher re-snapshotted at version {next_present}, probably after they were "
                        "cleaned from the log",
                    )
                )
        first = self._first if self._first is not None else 0
        for v in sorted(self._snapshots):
            if start <= v <= end and v >= first and not any(lo <= v <= hi for lo, hi, _ in out):
                out.append((v, v, "it is there as a snapshot, not as a commit"))
        return sorted(out)

    def check_available(self, start: int, end: int) -> None:
        """Raise unless every version in ``[start, end]`` is in the mirror as a commit."""
        if self._first is None or self._last is None or end > self._last:
            raise EventStreamError(
                f"versions {start}-{end} are not all in the mirror yet (latest there: {self._last})",
                table=self.settings.table_uri,
            )
        for lo, hi, why in self.lost(start, end):
            raise EventStreamError(
                f"{_versions_text(lo, hi)} not in the mirror as change data ({why}), so no change rows "
                "can be read for them",
                table=self.settings.table_uri,
                version=lo,
            )

    def forget_before(self, version: int) -> None:
        """Drop what is known of versions before ``version`` (a stream never goes back)."""
        for v in [v for v in self._versions if v < version]:
            del self._versions[v]
        self._snapshots = {v for v in self._snapshots if v >= version}

    def actions_partition(self) -> int:
        """The actions-topic partition that holds this table's records."""
        if self.table_id is None:
            raise EventStreamError(
                "no version of the table is in the mirror yet", table=self.settings.table_uri
            )
        with self.settings.consumer() as consumer:
            count = len(_partitions(consumer, self.settings.actions_topic, self.settings.table_uri))
        return murmur2_partition(self.table_id.encode(), count)


def _versions_text(first: int, last: int) -> str:
    return f"version {first} is" if first == last else f"versions {first}-{last} are"


def _partitions(consumer: MirrorConsumer, topic: str, table: str) -> list[int]:
    """The partitions of one of the table's topics; a missing topic may be created yet: retryable."""
    try:
        partitions = consumer.partitions(topic)
    except TopicNotFoundError as exc:  # the watcher has not created it (yet): not the reader's input
        raise KafkaError(exc.message, table=table, **exc.context) from None
    assert partitions is not None  # only a wait for the topic returns None
    return partitions


def read_mirror_versions(
    settings: MirrorSettings,
    *,
    table_id: str,
    partition: int,
    start: int,
    end: int,
    start_timestamp_ms: int,
    skip_lost: bool = False,
) -> Iterator[VersionActions]:
    """The actions of versions ``start..end`` (all wholly in the mirror), one version at a time.

    A version whose first records are no longer on the topic (retention deleted them) fails the
    read, unless ``skip_lost`` (the Spark source's failOnDataLoss=false): then the versions before
    the first one still whole on the topic are skipped with a warning.
    """
    with settings.consumer() as consumer:
        seek = _seek_offset(consumer, settings.actions_topic, partition, start_timestamp_ms)
        reader = _VersionReader(settings, table_id, start, end)
        yield from reader.read(consumer, partition, seek)
        if not reader.done and reader.overshot:
            log.warning(
                "the record timestamps of %s do not lead to version %d (clamped or rewritten?): reading "
                "partition %d from its start",
                settings.actions_topic,
                start,
                partition,
            )
            reader = _VersionReader(settings, table_id, start, end, skip_lost=skip_lost)
            yield from reader.read(consumer, partition, None)
        if not reader.done and skip_lost and not reader.started:
            _warn_lost(settings, start, end, partition)
            return
        if not reader.done:
            raise EventStreamError(
                f"the actions of versions {start}-{end} are not all on {settings.actions_topic} partition "
                f"{partition}, though their summaries are committed (last read: version {reader.version}, "
                f"action {reader.next_index})",
                table=settings.table_uri,
                version=reader.version,
            )


def _warn_lost(settings: MirrorSettings, first: int, last: int, partition: int) -> None:
    log.warning(
        "versions %d-%d of %s are no longer on %s partition %d (retention?): their change rows are "
        "skipped (failOnDataLoss=false)",
        first,
        last,
        settings.table_uri,
        settings.actions_topic,
        partition,
    )


def _seek_offset(consumer: MirrorConsumer, topic: str, partition: int, timestamp_ms: int) -> int:
    # timestamps strictly increase per table, so nothing of the start version lies before the first
    # record at or after start-1 ms; the reader checks it did not land past it. No record that late:
    # BEGINNING, the partition read from its start
    return consumer.offset_for_time(topic, partition, max(timestamp_ms - 1, 0))


class _VersionReader:
    def __init__(
        self, settings: MirrorSettings, table_id: str, start: int, end: int, *, skip_lost: bool = False
    ) -> None:
        self.settings = settings
        self.skip_lost = skip_lost
        self.table_id = table_id
        self.start, self.end = start, end
        self.version = start
        self.next_index = 0
        self.done = False
        self.overshot = False
        self.started = False
        #: the last version seen whole before the range's start: after it comes the start, or a gap
        self.before_start = -1
        self.partition = -1
        self._actions: list[tuple[str, Mapping[str, Any]]] = []
        self._timestamp = 0
        self._rules = settings.rules()
        #: records refused and skipped (onBadRecord skip)
        self.skipped_records = 0

    def read(self, consumer: MirrorConsumer, partition: int, offset: int | None) -> Iterator[VersionActions]:
        """Versions from ``offset`` (None: the partition's start) until the end version, an overshoot
        (the caller then reads from the start), or the partition's end (the caller then sees it is
        not done)."""
        topic = self.settings.actions_topic
        key = self.table_id.encode()
        self.partition = partition
        consumer.assign([(topic, partition, offset)])
        skip = self.settings.on_bad_record == "skip"
        # only the table's own records: another table's share the partition on a shared topic,
        # and the read may start inside its fragments (they are neither joined nor judged here)
        for batch in consumer.batches(
            until_end=True,
            idle_timeout_s=self.settings.idle_timeout_s,
            on_bad_record=self._skip if skip else None,
            key=key,
        ):
            for record in batch:
                try:
                    version = self._take(record.value, record.first_offset, partition)
                except BadRecordError as exc:
                    if not skip:
                        raise
                    self._skip(exc)
                    continue
                if self.overshot:
                    return
                if version is not None:
                    yield version
                if self.done:
                    return

    def _skip(self, error: BadRecordError) -> None:
        self.skipped_records += 1
        self.settings.refused(error)

    def _take(self, value: bytes, offset: int, partition: int | None = None) -> VersionActions | None:
        where: dict[str, Any] = {
            "topic": self.settings.actions_topic,
            "partition": partition,
            "offset": offset,
        }
        event = decode_action_event(value, rules=self._rules, table=self.settings.table_uri, **where)
        if event.table_id == self.table_id and event.table_uri != self.settings.table_uri:
            # a copy of the table (a copied folder keeps its id) on a topic shared by many tables
            # (a discover prefix's topics: shared): another table's, as the index takes it
            return None
        if event.table_id != self.table_id:
            raise BadRecordError(
                f"a record keyed by table {shown(self.table_id)} says it is table {shown(event.table_id)} at "
                f"{shown(event.table_uri)!r}, not at {self.settings.table_uri}: records never move a table",
                table=self.settings.table_uri,
                version=event.version,
                **where,
            )
        if event.snapshot:
            return None
        if event.version < self.version and not self.started:
            if event.index == event.count - 1:
                self.before_start = event.version
            return None
        out_of_place = event.version != self.version or event.index != self.next_index
        if out_of_place and not self.started and self.skip_lost:
            # read from the partition's start, the range begins later: what is before is lost.
            # A version met past its first action cannot be read whole: lost too
            last_lost = event.version - 1 if event.index == 0 else event.version
            _warn_lost(self.settings, self.version, min(last_lost, self.end), self.partition)
            self.version = last_lost + 1
            self.done = self.version > self.end
            if event.index != 0 or self.done:
                return None
        elif out_of_place:
            if not self.started and self.before_start == self.version - 1 and event.version > self.version:
                # the version before the start was read whole, and the next record skips versions:
                # retention removes a partition's oldest records, never ones between two it kept
                raise BadRecordError(
                    f"version {event.version} follows version {self.before_start} on the actions topic, "
                    f"whose commits topic announces version {self.version}: versions are never skipped",
                    table=self.settings.table_uri,
                    version=event.version,
                    **where,
                )
            if not self.started:
                self.overshot = True  # the seek landed past the start: the caller reads from the beginning
                return None
            raise EventStreamError(
                f"expected action {self.next_index} of version {self.version}, read action {event.index} of "
                f"version {event.version} at offset {offset} of {self.settings.actions_topic}",
                table=self.settings.table_uri,
                version=event.version,
            )
        self.started = True
        self._actions.append((event.type, event.action))
        self._timestamp = event.commit_timestamp
        self.next_index += 1
        if self.next_index < event.count:
            return None
        out = VersionActions(self.version, self._timestamp, self._actions)
        self._actions = []
        self.next_index = 0
        self.done = self.version == self.end
        self.version += 1
        return out


__all__ = [
    "MirrorIndex",
    "MirrorSettings",
    "MirroredVersion",
    "read_mirror_versions",
]
