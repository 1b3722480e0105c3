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
  an :class:`EventStreamError`, never a skipped row.

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
from deltamirror.mirror.events import CommitSummary, TableReplaced, decode_action_event, decode_commits_record
from deltamirror.mirror.headers import HEADER_KIND
from deltamirror.mirror.kafka_consumer import MirrorConsumer
from deltamirror.mirror.topics import murmur2_partition

log = logging.getLogger(__name__)

#: the commits-topic kinds the index reads; heartbeats, and kinds a newer watcher may add, are not
_INDEX_KINDS = frozenset({"commit", "tableReplaced"})


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

    def __post_init__(self) -> None:
        object.__setattr__(self, "table_uri", normalize_table_uri(self.table_uri))

    def consumer(self) -> MirrorConsumer:
        """A consumer of its own (assign() only, nothing committed): a fresh one per read."""
        return MirrorConsumer(
            {**self.kafka_config, "bootstrap.servers": self.bootstrap_servers}, purpose="changes"
        )


@dataclass(frozen=True)
class MirroredVersion:
    version: int
    timestamp_ms: int
    action_count: int
    metadata_changed: bool


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
        with self.settings.consumer() as consumer:
            partitions = _partitions(consumer, topic, self.settings.table_uri)
            consumer.assign((topic, p, self._next.get(p)) for p in partitions)
            for batch in consumer.batches(until_end=True, idle_timeout_s=self.settings.idle_timeout_s):
                for record in batch:
                    self._next[record.partition] = record.offset + 1
                    self._take(record.value, record.header(HEADER_KIND), offset=record.offset)

    def _take(self, value: bytes, kind: bytes | str | None, *, offset: int | None = None) -> None:
        kind = kind.decode() if isinstance(kind, bytes) else kind
        record = decode_commits_record(
            value,
            kind,
            wanted=_INDEX_KINDS,
            table=self.settings.table_uri,
            topic=self.settings.commits_topic,
            offset=offset,
        )
        if not isinstance(record, CommitSummary | TableReplaced):
            return  # heartbeats, and kinds a newer producer may add
        if record.table_uri != self.settings.table_uri:  # the watcher publishes normalized locations
            return
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
            self._gaps.append((self._last + 1, v))
        if record.snapshot:
            # a snapshot stands for the table at v, not for commit v's actions: no change rows from it
            self._snapshots.add(v)
        if self._first is None:
            self._first = v + 1 if record.snapshot else v
        self._versions[v] = MirroredVersion(
            v, record.commit_timestamp, record.action_count, record.metadata_changed
        )
        self._last = v

    def timestamp(self, version: int) -> int:
        return self._versions[version].timestamp_ms

    def check_available(self, start: int, end: int) -> None:
        """Raise unless every version in ``[start, end]`` is in the mirror as a commit."""
        if self._first is None or self._last is None or end > self._last:
            raise EventStreamError(
                f"versions {start}-{end} are not all in the mirror yet (latest there: {self._last})",
                table=self.settings.table_uri,
            )
        if start < self._first:
            raise EventStreamError(
                f"version {start} is not in the mirror: its commits start at version {self._first} "
                "(the watcher was started from there, or began with a snapshot); start the stream at "
                f"version {self._first} or later",
                table=self.settings.table_uri,
                version=start,
            )
        for first_missing, next_present in self._gaps:
            if start < next_present and end >= first_missing:
                raise EventStreamError(
                    f"versions {first_missing}-{next_present - 1} are not in the mirror (the watcher "
                    f"re-snapshotted at version {next_present}, probably after they were cleaned from the "
                    "log), so their change rows cannot be read",
                    table=self.settings.table_uri,
                    version=first_missing,
                )
        snapshots = [v for v in self._snapshots if start <= v <= end]
        if snapshots:
            raise EventStreamError(
                f"version {min(snapshots)} is in the mirror as a snapshot, not as a commit: its change "
                "rows cannot be read",
                table=self.settings.table_uri,
                version=min(snapshots),
            )

    def forget_before(self, version: int) -> None:
        """Drop what is known of versions before ``version`` (a stream never goes back)."""
        for v in [v for v in self._versions if v < version]:
            del self._versions[v]

    def actions_partition(self) -> int:
        """The actions-topic partition that holds this table's records."""
        if self.table_id is None:
            raise EventStreamError(
                "no version of the table is in the mirror yet", table=self.settings.table_uri
            )
        with self.settings.consumer() as consumer:
            count = len(_partitions(consumer, self.settings.actions_topic, self.settings.table_uri))
        return murmur2_partition(self.table_id.encode(), count)


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
) -> Iterator[VersionActions]:
    """The actions of versions ``start..end`` (all wholly in the mirror), one version at a time."""
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
            reader = _VersionReader(settings, table_id, start, end)
            yield from reader.read(consumer, partition, None)
        if not reader.done:
            raise EventStreamError(
                f"the actions of versions {start}-{end} are not all on {settings.actions_topic} partition "
                f"{partition}, though their summaries are committed (last read: version {reader.version}, "
                f"action {reader.next_index})",
                table=settings.table_uri,
                version=reader.version,
            )


def _seek_offset(consumer: MirrorConsumer, topic: str, partition: int, timestamp_ms: int) -> int:
    # timestamps strictly increase per table, so nothing of the start version lies before the first
    # record at or after start-1 ms; the reader checks it did not land past it. No record that late:
    # BEGINNING, the partition read from its start
    return consumer.offset_for_time(topic, partition, max(timestamp_ms - 1, 0))


class _VersionReader:
    def __init__(self, settings: MirrorSettings, table_id: str, start: int, end: int) -> None:
        self.settings = settings
        self.table_id = table_id
        self.start, self.end = start, end
        self.version = start
        self.next_index = 0
        self.done = False
        self.overshot = False
        self._started = False
        self._actions: list[tuple[str, Mapping[str, Any]]] = []
        self._timestamp = 0

    def read(self, consumer: MirrorConsumer, partition: int, offset: int | None) -> Iterator[VersionActions]:
        """Versions from ``offset`` (None: the partition's start) until the end version, an overshoot
        (the caller then reads from the start), or the partition's end (the caller then sees it is
        not done)."""
        topic = self.settings.actions_topic
        key = self.table_id.encode()
        consumer.assign([(topic, partition, offset)])
        for batch in consumer.batches(until_end=True, idle_timeout_s=self.settings.idle_timeout_s):
            for record in batch:
                if record.key != key:
                    continue  # another table's records share the partition
                version = self._take(record.value, record.offset)
                if self.overshot:
                    return
                if version is not None:
                    yield version
                if self.done:
                    return

    def _take(self, value: bytes, offset: int) -> VersionActions | None:
        event = decode_action_event(
            value, table=self.settings.table_uri, topic=self.settings.actions_topic, offset=offset
        )
        if event.snapshot or (event.version < self.start and not self._started):
            return None
        if event.version != self.version or event.index != self.next_index:
            if not self._started:
                self.overshot = True  # the seek landed past the start: the caller reads from the beginning
                return None
            raise EventStreamError(
                f"expected action {self.next_index} of version {self.version}, read action {event.index} of "
                f"version {event.version} at offset {offset} of {self.settings.actions_topic}",
                table=self.settings.table_uri,
                version=event.version,
            )
        self._started = True
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
