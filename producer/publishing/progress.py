"""A table's committed progress: the record on the progress topic and the position it stands for.

Each transaction of a table ends with one progress record keyed by the table's URI (compacted
topic), written in the same transaction as the records it covers. Reading the topic
``read_committed`` to its end therefore gives the last position whose records are all committed:
where a (re)started watcher goes on, so that nothing is skipped or published twice.

"Its end" must be the end the topic had when the read began, records of open transactions
included: a ``read_committed`` reader stops at the last stable offset, the first record of the
oldest open transaction, and every table shares the topic's partition. A watcher killed while
table B's transaction was committing leaves B's progress record open below table A's committed
one; A, resumed elsewhere and reading only to the stable offset, would miss its own last
position and publish its versions again. So a read first waits until every transaction open at
its start has ended (:func:`settled_ends`): a new owner's ``init_transactions()`` aborts a dead
watcher's at once, the broker any other after ``transaction.timeout.ms``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from deltamirror.core.timestamps import CommitTimestamp, TimestampSource
from deltamirror.mirror.errors import KafkaError, StopRequested, TopicNotFoundError
from deltamirror.mirror.kafka.consumer import MirrorConsumer
from deltamirror.mirror.records.events import SCHEMA_VERSION, ProgressRecord, decode_progress
from deltamirror.mirror.topics import TopicManager

from ..tailing.work import Position
from .tails import _SKIP, INDEX_IDLE_S, INDEX_MIN_TABLES, _Index, _index_read

log = logging.getLogger(__name__)

#: how long a read waits for the transactions open at its start to end (a dead watcher's open
#: transaction is aborted by the broker after ``transaction.timeout.ms``, 60 s, checked every 10 s)
SETTLE_TIMEOUT_S = 90.0
#: a wait longer than this is said in the log (once per read)
SETTLE_SAY_AFTER_S = 2.0

#: each partition's end now: ``committed`` True for a read_committed reader, else the high watermark
EndOffsets = Callable[[str, bool], Mapping[int, int]]

#: a round is read once no table asked for this long (tables resuming together join it)
GATHER_S = 0.1
#: and at most this long after its first table asked
GATHER_MAX_S = 2.0


def position_from_record(record: ProgressRecord) -> Position:
    ts = CommitTimestamp(
        record.version, record.commit_timestamp, TimestampSource(record.commit_timestamp_source)
    )
    return Position(
        record.table_id, record.version, record.index, record.count, ts, record.snapshot, record.row_offset
    )


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
        row_offset=position.row_offset,
    )


def settled_ends(
    end_offsets: EndOffsets,
    topic: str,
    *,
    timeout_s: float = SETTLE_TIMEOUT_S,
    stop: threading.Event | None = None,
    poll_s: float = 0.05,
) -> dict[int, int]:
    """Each partition's read_committed end, once it has reached the high watermark taken first.

    Then every transaction that was open when this was called has ended (committed or aborted),
    and a read_committed read to the returned ends sees every record committed before the call.
    A transaction opened later does not hold the wait: its records lie past the watermark.
    """
    target = dict(end_offsets(topic, False))
    started = time.monotonic()
    said = False
    while True:
        stable = dict(end_offsets(topic, True))
        if all(stable.get(p, 0) >= end for p, end in target.items()):
            return stable
        waited = time.monotonic() - started
        if waited > timeout_s:
            raise KafkaError(
                f"the progress topic {topic} still has a transaction open after {timeout_s:.0f} s "
                "(a watcher stopped mid-commit whose tables nobody resumed?); retrying",
                topic=topic,
            )
        if not said and waited > SETTLE_SAY_AFTER_S:
            said = True
            log.info(
                "waiting for a transaction open on the progress topic to end (a stopped watcher's is "
                "aborted by the broker within transaction.timeout.ms)",
                extra={"topic": topic},
            )
        if stop is not None and stop.wait(poll_s):
            raise StopRequested("stop requested")
        if stop is None:
            time.sleep(poll_s)


def read_progress(
    kafka: dict[str, Any],
    topic: str,
    uri: str,
    timeout_s: float = 60.0,
    *,
    stop: threading.Event | None = None,
    max_record_bytes: int = 1_000_000,
) -> Position | None:
    """The last committed progress of ``uri``: the progress topic read with read_committed to the
    end it had when called (after :func:`settled_ends`), for a table that resumes alone.

    With ``stop``, raises StopRequested once it is set (the metadata is asked for in short slices).
    """
    manager = TopicManager(kafka, max_record_bytes=max_record_bytes)
    ends = settled_ends(lambda t, committed: manager.end_offsets(t, committed=committed), topic, stop=stop)
    values = read_progress_values(kafka, topic, {uri}, timeout_s, stop=stop, ends=ends)
    return decode_position(values.get(uri), topic)


def decode_position(value: bytes | None, topic: str) -> Position | None:
    """The position a progress record stands for; None for no record or a tombstone."""
    if not value:  # never published, or a tombstone: start as the snapshot mode says
        return None
    return position_from_record(decode_progress(value, topic=topic))


def read_progress_values(
    kafka: dict[str, Any],
    topic: str,
    uris: Collection[str],
    timeout_s: float = 60.0,
    *,
    stop: threading.Event | None = None,
    ends: Mapping[int, int] | None = None,
) -> dict[str, bytes | None]:
    """The last committed progress record of each of ``uris`` (raw): one read of the topic for all.

    With ``ends`` (each partition's end for a read_committed reader, taken after the callers'
    producers were initialised), the read stops once a record at or past that end was seen, or
    the end is found: with many tables committing, a reader that follows the end as it moves may
    not find it for a long time, and nothing a caller needs comes later (a caller's own table
    publishes nothing until it resumes, and what a previous owner left was completed by the init).
    """
    keys = {uri.encode(): uri for uri in uris}
    last: dict[str, bytes | None] = {}
    deadline = time.monotonic() + timeout_s
    with MirrorConsumer(kafka, purpose="progress") as consumer:
        try:
            partitions = consumer.partitions(topic, timeout_s=timeout_s, stop=stop)
        except TopicNotFoundError as exc:  # created before it is read: the broker lost it, retry
            raise KafkaError(str(exc), topic=topic) from None
        assert partitions is not None  # only a wait for the topic returns None
        consumer.assign((topic, p, None) for p in partitions)
        todo = {p: end for p, end in (ends or {}).items() if end > 0}
        if ends is not None and not todo:
            return last  # nothing ever committed
        # consume(n, timeout) returns only once n records came or the timeout passed: a short
        # timeout, or every (re)start waits ~1 s on a small progress topic
        for batch in consumer.batches(
            until_end=True, stop=stop, timeout_s=max(0.0, deadline - time.monotonic()), poll_s=0.05
        ):
            for record in batch:
                uri = keys.get(record.key) if record.key is not None else None
                if uri is not None:
                    last[uri] = record.value
                end = todo.get(record.partition)
                if end is not None and record.offset >= end - 1:
                    del todo[record.partition]
            if ends is not None and not todo:
                break
    return last


@dataclass(eq=False)
class _Round:
    """Tables whose positions one read of the progress topic finds."""

    uris: set[str] = field(default_factory=set)
    last_arrival: float = field(default_factory=time.monotonic)
    done: threading.Event = field(default_factory=threading.Event)
    values: dict[str, bytes | None] = field(default_factory=dict)
    error: BaseException | None = None


class ProgressBoard:
    """One read of the progress topic for the tables that resume at about the same time.

    Without it each resuming table (the service starting, a group assigning shards) creates a
    consumer and reads the whole topic: n tables, n clients and n reads, and past about 1,000
    clients librdkafka refuses more. A table asks :meth:`committed` once its producer's
    ``init_transactions()`` has returned. The first to ask opens a round, whose thread waits while
    the previous round still reads and while tables keep asking (``gather_s`` after the last one,
    ``gather_max_s`` in all), then reads once for every table of the round; each table waits for
    it with its own stop. At most one progress consumer exists at a time.

    A round of many tables (and every round after it, while the index is used) reads the topic
    through its index (:class:`~.tails._Index`): only the records committed since the last round.

    Why this keeps exactly once: a table's position must be read after its producer's init,
    which completes or aborts what a previous owner left open. Every table of a round asked after
    its init returned, and the round's read starts after the round closed: each table sees the
    topic as it would reading alone at that moment, or later.
    """

    def __init__(
        self,
        kafka: dict[str, Any],
        topic: str,
        *,
        gather_s: float = GATHER_S,
        gather_max_s: float = GATHER_MAX_S,
        timeout_s: float = 60.0,
        end_offsets: EndOffsets | None = None,
    ) -> None:
        self.kafka = kafka
        self.topic = topic
        #: the topic's ends now (admin calls): a read waits for the transactions open at its start
        #: to end (:func:`settled_ends`), then reads to the end it found instead of chasing it
        self.end_offsets = end_offsets
        self.gather_s = gather_s
        self.gather_max_s = gather_max_s
        self.timeout_s = timeout_s
        #: how many times the topic was read (one per round)
        self.reads = 0
        self._cond = threading.Condition()
        self._gathering: _Round | None = None
        self._reading = False
        #: each key's last record of the topic, once a round of many tables read it (one round
        #: reads at a time: only the round's thread touches it)
        self._index: _Index | None = None
        #: a round of this many tables reads the topic through the index
        self.index_min_tables = INDEX_MIN_TABLES
        #: records read into the index, in all; positions it answered
        self.indexed = 0
        self.from_index = 0

    def committed(self, uri: str, *, stop: threading.Event | None = None) -> Position | None:
        """The table's committed position; call only after its producer's ``init_transactions()``.

        ``stop`` (the table's) raises StopRequested while it waits.
        """
        with self._cond:
            round_ = self._gathering
            leader = round_ is None
            if round_ is None:
                round_ = self._gathering = _Round()
            round_.uris.add(uri)
            round_.last_arrival = time.monotonic()
            self._cond.notify_all()
        if leader:  # read on a thread of its own: the leader's stop must not wait for the read
            threading.Thread(target=self._lead, args=(round_,), name="progress-read", daemon=True).start()
        while not round_.done.wait(0.2):
            if stop is not None and stop.is_set():
                raise StopRequested("stop requested")
        if round_.error is not None:
            raise KafkaError(f"cannot read the progress topic: {round_.error}", topic=self.topic)
        return decode_position(round_.values.get(uri), self.topic)

    def _values(self, uris: set[str], ends: dict[int, int] | None) -> dict[str, bytes | None]:
        """What :func:`read_progress_values` gives the round: through the topic's index (read to
        ``ends`` from where it was read to) for the tables it holds plainly, when the round is one
        of many tables or an index was kept; each answer is the last record below the same ends,
        the read from the start gives. The others (and any round without ``ends``) read whole.

        Without it, every round of a survivor resuming thousands of tables read the whole topic
        (10,000 tables: ~30,000 records) for its ~256 tables."""
        index = self._index
        self._index = None  # back once read to the new ends
        if index is not None and time.monotonic() - index.used > INDEX_IDLE_S:
            index = None
        if ends is None or (index is None and len(uris) < self.index_min_tables):
            return read_progress_values(self.kafka, self.topic, uris, self.timeout_s, ends=ends)
        before = 0 if index is None else index.records
        if index is None or not _index_read(self.kafka, self.topic, index, ends):
            index, before = _Index(False, hold_bytes=None), 0
            if not _index_read(self.kafka, self.topic, index, ends):
                return read_progress_values(self.kafka, self.topic, uris, self.timeout_s, ends=ends)
        index.used = time.monotonic()
        self._index = index
        values: dict[str, bytes | None] = {}
        rest: set[str] = set()
        for uri in uris:
            record = index.last_of(uri.encode())
            if record is _SKIP:
                rest.add(uri)
            elif record is not None:
                values[uri] = record.value
        self.indexed += index.records - before
        self.from_index += len(uris) - len(rest)
        if rest:
            values.update(read_progress_values(self.kafka, self.topic, rest, self.timeout_s, ends=ends))
        return values

    def _lead(self, round_: _Round) -> None:
        """Gather, then read for the round, on a thread of its own: any table of the round, the
        one that opened it included, stops waiting when its stop is set, while the others still
        get the read (bounded by the settle wait and ``timeout_s``)."""
        started = time.monotonic()
        with self._cond:
            while True:
                now = time.monotonic()
                gather_until = min(round_.last_arrival + self.gather_s, started + self.gather_max_s)
                if not self._reading and now >= gather_until:
                    break
                self._cond.wait(0.2 if self._reading else max(0.01, min(0.2, gather_until - now)))
            self._gathering = None  # who asks from now on is served by the next round
            self._reading = True
            uris = set(round_.uris)
        read_from = time.monotonic()
        settled = read_from
        try:
            ends = None if self.end_offsets is None else settled_ends(self.end_offsets, self.topic)
            settled = time.monotonic()
            round_.values = self._values(uris, ends)
        except BaseException as exc:
            round_.error = exc
        finally:
            with self._cond:
                self._reading = False
                self.reads += 1
                self._cond.notify_all()
            round_.done.set()
        if len(uris) > 1:  # a table resuming alone is not worth a line
            now = time.monotonic()
            log.info(
                "progress read",
                extra={
                    "tables": len(uris),
                    "gathered_s": round(read_from - started, 3),
                    "settle_s": round(settled - read_from, 3),
                    "read_s": round(now - settled, 3),
                },
            )


__all__ = [
    "ProgressBoard",
    "decode_position",
    "position_from_record",
    "progress_record",
    "read_progress",
    "read_progress_values",
    "settled_ends",
]
