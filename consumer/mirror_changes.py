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
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition
from confluent_kafka import KafkaError as RdKafkaError
from pydantic import ValidationError

from deltamirror.core.changes import VersionActions
from deltamirror.core.errors import EventStreamError, KafkaError
from deltamirror.core.events import HEADER_KIND, ActionEvent, CommitSummary, FragmentAssembler, TableReplaced
from deltamirror.core.storage import normalize_table_uri

log = logging.getLogger(__name__)

#: how long one poll waits; a read gives up when the broker sends nothing for ``idle_timeout_s``
_POLL_S = 1.0


@dataclass(frozen=True)
class MirrorSettings:
    """Where a table's mirror is: picklable, so that Spark can ship it to executors."""

    bootstrap_servers: str
    actions_topic: str
    commits_topic: str
    table_uri: str
    #: extra librdkafka settings (security.protocol, sasl.*, ssl.*): passed to every consumer
    kafka_config: Mapping[str, str] = field(default_factory=dict)
    #: a read fails when the broker sends nothing for this long (it should never wait on a committed range)
    idle_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "table_uri", normalize_table_uri(self.table_uri))

    def consumer(self) -> Consumer:
        return Consumer(
            {
                **self.kafka_config,
                "bootstrap.servers": self.bootstrap_servers,
                "group.id": f"deltamirror-changes-{uuid.uuid4().hex[:12]}",  # assign() only, never committed
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "enable.partition.eof": True,
                "auto.offset.reset": "earliest",
            }
        )


def murmur2(key: bytes) -> int:
    """Kafka's murmur2 hash of ``key`` (``org.apache.kafka.common.utils.Utils.murmur2``), as a signed int."""
    m, mask = 0x5BD1E995, 0xFFFFFFFF
    length = len(key)
    h = (0x9747B28C ^ length) & mask
    for i in range(0, length - length % 4, 4):
        k = int.from_bytes(key[i : i + 4], "little")
        k = (k * m) & mask
        k ^= k >> 24
        k = (k * m) & mask
        h = ((h * m) & mask) ^ k
    tail = length % 4
    base = length - tail
    if tail == 3:
        h ^= key[base + 2] << 16
    if tail >= 2:
        h ^= key[base + 1] << 8
    if tail >= 1:
        h ^= key[base]
        h = (h * m) & mask
    h ^= h >> 13
    h = (h * m) & mask
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def murmur2_partition(key: bytes, partitions: int) -> int:
    """The partition Kafka's default partitioner (and librdkafka's ``murmur2_random``) gives ``key``."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


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
        #: where the next refresh starts reading, per commits-topic partition
        self._next: dict[int, int] = {}
        self._assemblers: dict[int, FragmentAssembler] = {}

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
        consumer = self.settings.consumer()
        try:
            partitions = sorted(_metadata(consumer, topic).partitions)
            consumer.assign(
                [TopicPartition(topic, p, self._next.get(p, OFFSET_BEGINNING)) for p in partitions]
            )
            pending = set(partitions)
            quiet = 0.0
            while pending:
                msg = consumer.poll(_POLL_S)
                if msg is None:
                    pending = {p for p in pending if not _at_end(consumer, topic, p)}
                    quiet += _POLL_S
                    if pending and quiet >= self.settings.idle_timeout_s:
                        raise KafkaError(
                            f"{topic} partitions {sorted(pending)} did not reach their end in "
                            f"{self.settings.idle_timeout_s:.0f} s",
                            table=self.settings.table_uri,
                        )
                    continue
                quiet = 0.0
                partition = msg.partition() or 0
                err = msg.error()
                if err is not None:
                    if err.code() == RdKafkaError._PARTITION_EOF:
                        pending.discard(partition)
                        continue
                    raise KafkaError(f"reading {topic}: {err.str()}", table=self.settings.table_uri)
                self._next[partition] = (msg.offset() or 0) + 1
                headers: Any = msg.headers() or []
                value = self._assemblers.setdefault(partition, FragmentAssembler()).feed(
                    msg.value() or b"", headers
                )
                if value is not None:
                    self._take(value, dict(headers).get(HEADER_KIND))
        finally:
            consumer.close()

    def _take(self, value: bytes, kind: bytes | str | None) -> None:
        kind = kind.decode() if isinstance(kind, bytes) else kind
        if kind not in ("commit", "tableReplaced"):
            return  # heartbeats, and kinds a newer producer may add
        try:
            record: CommitSummary | TableReplaced = (
                CommitSummary.model_validate_json(value)
                if kind == "commit"
                else TableReplaced.model_validate_json(value)
            )
        except ValidationError as exc:
            raise EventStreamError(
                f"a {kind} record on {self.settings.commits_topic} does not fit the contract: {exc.errors()[0]['msg']}",
                table=self.settings.table_uri,
            ) from None
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
        consumer = self.settings.consumer()
        try:
            md = _metadata(consumer, self.settings.actions_topic)
        finally:
            consumer.close()
        return murmur2_partition(self.table_id.encode(), len(md.partitions))


def _at_end(consumer: Consumer, topic: str, partition: int) -> bool:
    tp = TopicPartition(topic, partition)
    try:
        end = consumer.get_watermark_offsets(tp, timeout=10, cached=False)[1]  # the LSO, read_committed
        position = consumer.position([tp])[0].offset
    except KafkaException as exc:
        raise KafkaError(f"cannot read the end offsets of {topic}: {exc}") from exc
    return position >= end or (position < 0 and end == 0)


def _metadata(consumer: Consumer, topic: str) -> Any:
    try:
        md = consumer.list_topics(topic, timeout=30)
    except KafkaException as exc:
        raise KafkaError(f"cannot read the metadata of topic {topic}: {exc}") from exc
    tmd = md.topics.get(topic)
    if tmd is None or tmd.error is not None or not tmd.partitions:
        reason = tmd.error.str() if tmd is not None and tmd.error is not None else "no such topic"
        raise KafkaError(f"topic {topic} cannot be read: {reason}")
    return tmd


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
    consumer = settings.consumer()
    try:
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
            yield from reader.read(consumer, partition, OFFSET_BEGINNING)
        if not reader.done:
            raise EventStreamError(
                f"the actions of versions {start}-{end} are not all on {settings.actions_topic} partition "
                f"{partition}, though their summaries are committed (last read: version {reader.version}, "
                f"action {reader.next_index})",
                table=settings.table_uri,
                version=reader.version,
            )
    finally:
        consumer.close()


def _seek_offset(consumer: Consumer, topic: str, partition: int, timestamp_ms: int) -> int:
    # timestamps strictly increase per table, so nothing of the start version lies before the first
    # record at or after start-1 ms; the reader checks it did not land past it
    try:
        found = consumer.offsets_for_times(
            [TopicPartition(topic, partition, max(timestamp_ms - 1, 0))], timeout=30
        )
    except KafkaException as exc:
        raise KafkaError(f"cannot look up offsets by time on {topic}: {exc}") from exc
    offset = found[0].offset
    return offset if offset >= 0 else OFFSET_BEGINNING


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

    def read(self, consumer: Consumer, partition: int, offset: int) -> Iterator[VersionActions]:
        topic = self.settings.actions_topic
        consumer.assign([TopicPartition(topic, partition, offset)])
        assembler = FragmentAssembler()
        idle = 0.0
        while not self.done:
            msg = consumer.poll(_POLL_S)
            if msg is None:
                idle += _POLL_S
                if idle >= self.settings.idle_timeout_s:
                    return
                continue
            idle = 0.0
            err = msg.error()
            if err is not None:
                if err.code() == RdKafkaError._PARTITION_EOF:
                    return
                raise KafkaError(f"reading {topic}: {err.str()}", table=self.settings.table_uri)
            headers: Any = msg.headers()
            value = assembler.feed(msg.value() or b"", headers)
            if value is None or msg.key() != self.table_id.encode():
                continue
            version = self._take(value, msg.offset())
            if self.overshot:
                return
            if version is not None:
                yield version

    def _take(self, value: bytes, offset: int | None) -> VersionActions | None:
        try:
            event = ActionEvent.model_validate_json(value)
        except ValidationError as exc:
            raise EventStreamError(
                f"record at offset {offset} of {self.settings.actions_topic} does not fit the contract: "
                f"{exc.errors()[0]['msg']}",
                table=self.settings.table_uri,
            ) from None
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
    "murmur2",
    "murmur2_partition",
    "read_mirror_versions",
]
