"""One typed wrapper over confluent-kafka's consumer, and the one loop that reads the mirror's topics.

Every reader of the mirror (the watcher's progress, the snapshot consumer, the change feed read
from the mirror, the Spark source) reads the same way: partitions assigned by the reader itself
(no group rebalancing: each reader knows which partitions it needs), ``read_committed`` (an
aborted transaction's records are never seen), records in partition order, fragments of the
``split`` oversize policy joined back into one value (per partition and key: on a topic shared by
many tables another table's records may come between a record's fragments), and a clear notion of "the end": a
partition is at its end when the consumer's position reaches its last stable offset. That loop
is :meth:`MirrorConsumer.batches`, written once here.

Errors are translated once too: a broker that does not answer is a
:class:`~deltamirror.mirror.errors.KafkaError` (retryable), a missing topic a
:class:`~deltamirror.mirror.errors.TopicNotFoundError` (bad input), records that break the
contract an :class:`~deltamirror.mirror.errors.EventStreamError`.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from types import TracebackType
from typing import Any, overload

from confluent_kafka import OFFSET_BEGINNING, KafkaException, TopicPartition
from confluent_kafka import KafkaError as _RdKafkaError
from confluent_kafka import Message as _ClientMessage

from ..errors import KafkaError, StopRequested, TopicNotFoundError
from ..records.boundary import BadRecordError, RecordLimits
from ..records.fragments import MIN_FRAGMENT_BYTES, FragmentError, KeyedFragments
from ..records.headers import HEADER_FRAGMENT, Headers, header_value
from . import clients

log = logging.getLogger(__name__)

#: the client's message type, whose methods read a batch's columns (``map`` in C)
_Message: Any = _ClientMessage

#: the offset that means "the first record the partition still has"
BEGINNING = OFFSET_BEGINNING
#: how long one metadata request waits: a stop is noticed within it
METADATA_SLICE_S = 1.0
#: how long closing may wait for the group's last commit before it is left to finish in the background
CLOSE_TIMEOUT_S = 5.0
#: how long a partition may stay quiet before its end is asked of the broker (the end of a
#: partition assigned exactly at its last stable offset is reported by no fetch)
END_CHECK_AFTER_S = 0.5
#: how long one consume() waits while a read to the end has no records coming: consume() returns
#: when its batch is full or its timeout passes, not when a partition's end is reported, so a
#: restart with nothing new to read waited a whole ``poll_s`` (50 ms) after the end was known
END_SLICE_S = 0.005

#: librdkafka prefetches records ahead of the reader into a queue per partition, by default up to
#: 64 MB and 100,000 records, and backs off 1 s once that is full: a reader slower than the broker
#: (one that applies what it reads) holds the whole queue in memory. 16 MB keeps the fetches ahead
#: of the reader; a 10 ms back-off refills it as soon as the reader took its records. A setting
#: of the cluster's ``kafka`` mapping takes precedence.
FETCH_QUEUE_BOUNDS: dict[str, int] = {"queued.max.messages.kbytes": 16_384, "fetch.queue.backoff.ms": 10}

#: librdkafka (2.x) drops its bootstrap connection once the metadata names the brokers, and with it
#: the reader's first metadata request when that was still on it; a connection to the named broker
#: is then held back for half of ``reconnect.backoff.ms`` (100 ms by default): a reader's first
#: metadata took ~55 ms in most starts instead of ~5 ms. 20 ms makes that wait 11 ms (librdkafka's
#: least); a broker that stays away is still retried at doubling intervals up to
#: ``reconnect.backoff.max.ms`` (10 s). A setting of the cluster's ``kafka`` mapping takes precedence.
FIRST_CONNECTION: dict[str, int] = {"reconnect.backoff.ms": 20}

#: what a reader that handles refused records itself does with one (``batches(on_bad_record=...)``)
BadRecordHandler = Callable[[BadRecordError], None]


@dataclass(frozen=True, slots=True)
class Record:
    """One whole record: fragments joined, so ``first_offset`` may be before ``offset``."""

    topic: str
    partition: int
    #: the offset of the record (of its last fragment): a reader that took it goes on at offset + 1
    #: (on a shared topic, not past :meth:`MirrorConsumer.fragment_starts`: another key's record
    #: may be in part there)
    offset: int
    #: the offset of its first fragment: a reader that must read it again starts there
    first_offset: int
    key: bytes | None
    value: bytes
    headers: Headers
    timestamp_ms: int

    def header(self, name: str) -> str | None:
        return header_value(self.headers, name)


def _record(item: Any) -> Record:
    """A batch's item as a Record: it is one (joined from fragments), or the consumer's message."""
    if type(item) is Record:
        return item
    offset: int = item.offset() or 0
    return Record(
        item.topic() or "",
        item.partition() or 0,
        offset,
        offset,
        item.key(),
        item.value() or b"",
        item.headers() or [],
        item.timestamp()[1],
    )


class RecordBatch(Sequence[Record]):
    """The whole records of one read, in order: :class:`Record` s when read one by one, and columns
    (:meth:`values`, :meth:`offsets`...) for a reader that takes a batch at once, without a Python
    object per record beyond the client's own message."""

    __slots__ = ("_items", "_joined")

    def __init__(self) -> None:
        self._items: list[Any] = []  # a Record (joined from fragments) or the client's message
        #: whether any item is a Record: without one, a column is read from the messages in C
        #: (``map`` over the message type's own method, no test of each item's type)
        self._joined = False

    def __len__(self) -> int:
        return len(self._items)

    @overload
    def __getitem__(self, index: int) -> Record: ...

    @overload
    def __getitem__(self, index: slice) -> list[Record]: ...

    def __getitem__(self, index: int | slice) -> Record | list[Record]:
        if isinstance(index, slice):
            return [_record(item) for item in self._items[index]]
        return _record(self._items[index])

    def __iter__(self) -> Iterator[Record]:
        return map(_record, self._items)

    # a consumed message (not an error) always has its topic, partition and offset: the
    # ``or`` of the mixed form stays for a Record's sake only; a value may be None (a tombstone)

    def topics(self) -> list[str]:
        if not self._joined:
            return list(map(_Message.topic, self._items))
        return [i.topic if type(i) is Record else i.topic() or "" for i in self._items]

    def partitions(self) -> list[int]:
        if not self._joined:
            return list(map(_Message.partition, self._items))
        return [i.partition if type(i) is Record else i.partition() or 0 for i in self._items]

    def offsets(self) -> list[int]:
        if not self._joined:
            return list(map(_Message.offset, self._items))
        return [i.offset if type(i) is Record else i.offset() or 0 for i in self._items]

    def first_offsets(self) -> list[int]:
        if not self._joined:
            return list(map(_Message.offset, self._items))
        return [i.first_offset if type(i) is Record else i.offset() or 0 for i in self._items]

    def values(self) -> list[bytes]:
        if not self._joined:
            return [v or b"" for v in map(_Message.value, self._items)]
        return [i.value if type(i) is Record else i.value() or b"" for i in self._items]

    def keys(self) -> list[bytes | None]:
        if not self._joined:
            return list(map(_Message.key, self._items))
        return [i.key if type(i) is Record else i.key() for i in self._items]


class MirrorConsumer:
    """A confluent-kafka consumer that reads assigned partitions of the mirror, ``read_committed``.

    ``kafka`` is the librdkafka configuration of the cluster (``bootstrap.servers`` and the
    security settings, e.g. from :meth:`~deltamirror.mirror.settings.KafkaSettings.librdkafka_config`).
    Offsets are committed to the group only when ``group_id`` is given and :meth:`store_offsets`
    is called (auto-commit of stored offsets: what was processed, never what was only fetched);
    otherwise the group id is a throw-away one and nothing is committed. ``purpose`` names the
    throw-away group (``deltamirror-<purpose>-<random>``) so that an operator can tell readers apart.
    ``limits`` bound the fragments of one record (:class:`~.boundary.RecordLimits`).
    """

    def __init__(
        self,
        kafka: Mapping[str, Any],
        *,
        group_id: str | None = None,
        purpose: str = "reader",
        fetch_wait_max_ms: int | None = 10,
        limits: RecordLimits | None = None,
    ) -> None:
        self._commits = group_id is not None
        self._group_id = group_id or f"deltamirror-{purpose}-{uuid.uuid4().hex[:12]}"
        self.limits = limits if limits is not None else RecordLimits()
        config: dict[str, Any] = {
            # the end of a partition is known only when a fetch returns, and the broker holds a fetch
            # that finds nothing new for fetch.wait.max.ms (500 ms by default): a reader that reads
            # to the end asks for 10 ms; a long-running one keeps librdkafka's default
            **({} if fetch_wait_max_ms is None else {"fetch.wait.max.ms": fetch_wait_max_ms}),
            **FETCH_QUEUE_BOUNDS,
            **FIRST_CONNECTION,
            **kafka,
            "group.id": self._group_id,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": self._commits,
            "enable.auto.offset.store": False,
        }
        try:
            self._consumer = clients.consumer(config)
        except KafkaException as exc:
            raise KafkaError(f"cannot create a Kafka consumer: {_reason(exc)}") from None
        self._assigned: list[tuple[str, int]] = []
        #: where each assigned partition was asked to start (BEGINNING or an offset): lag() before a read
        self._start_offsets: dict[tuple[str, int], int] = {}
        #: records come in part (split by the watcher), per partition and key
        self._fragments = KeyedFragments(self.limits)
        #: whether every assigned partition was at its end when :meth:`batches` last yielded
        #: (its end was reported and no record came since): a reader knows it has caught up
        self.at_end = False

    # --- lifetime -----------------------------------------------------------------------------

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Leave the cluster; with a group, the stored offsets are committed first, within
        ``timeout_s``.

        librdkafka's close waits for that commit without a bound of its own: ``session.timeout.ms``
        (45 s by default) with the brokers gone, and longer (minutes were seen) with a broker whose
        connections hang. So the close runs on a thread of its own; past ``timeout_s`` it is left to
        finish there, and one warning says that the last offsets may not be committed (a reader
        whose position is the group's reads them again: at least once, as after a crash).
        """
        consumer = self._consumer
        done = threading.Event()

        def close() -> None:
            try:
                consumer.close()
            except (KafkaException, RuntimeError) as exc:  # already closed, or the client broke
                log.debug("closing the Kafka consumer failed: %s", exc)
            finally:
                done.set()

        threading.Thread(target=close, name="deltamirror-consumer-close", daemon=True).start()
        if not done.wait(timeout_s):
            log.warning(
                "the Kafka consumer did not close within %.0f s (the broker does not answer): "
                "its last offsets may not be committed to group %s; the close goes on in the background",
                timeout_s,
                self._group_id,
            )

    def __enter__(self) -> MirrorConsumer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # --- metadata -----------------------------------------------------------------------------

    def partitions(
        self,
        topic: str,
        *,
        timeout_s: float = 30.0,
        stop: threading.Event | None = None,
        wait_for_topic: bool = False,
    ) -> list[int] | None:
        """The partition ids of ``topic``, sorted.

        A broker that does not answer is asked again until ``timeout_s`` (then a KafkaError). A
        missing topic is a TopicNotFoundError, or with ``wait_for_topic`` is waited for until
        ``stop`` is set (None is returned then). Setting ``stop`` otherwise raises StopRequested.
        """
        deadline = time.monotonic() + timeout_s
        said_waiting = False
        while True:
            if stop is not None and stop.is_set():
                if wait_for_topic:
                    return None
                raise StopRequested("stop requested")
            try:
                slice_s = max(0.1, min(METADATA_SLICE_S, deadline - time.monotonic()))
                found = self._consumer.list_topics(topic, timeout=slice_s).topics.get(topic)
            except KafkaException as exc:
                if not self._assigned:
                    # the error callback (a broker unreachable, a login refused) is served only by a
                    # poll: without one the first word of a dead broker came after two timeouts (60 s).
                    # Nothing is assigned, so the poll cannot take a record away from the reader.
                    self._consumer.poll(0)
                if time.monotonic() >= deadline and not wait_for_topic:
                    raise KafkaError(
                        f"cannot read the metadata of topic {topic}: {_reason(exc)}", topic=topic
                    ) from None
                if wait_for_topic and time.monotonic() >= deadline:
                    log.warning("cannot read the metadata of topic %s (retrying): %s", topic, _reason(exc))
                    deadline = time.monotonic() + timeout_s
                continue
            if found is not None and found.error is None and found.partitions:
                return sorted(found.partitions)
            if not wait_for_topic:
                reason = (
                    found.error.str() if found is not None and found.error is not None else "no such topic"
                )
                raise TopicNotFoundError(f"topic {topic} cannot be read: {reason}", topic=topic)
            if not said_waiting:
                log.info("waiting for topic %s to exist", topic)
                said_waiting = True
            if stop is not None:
                stop.wait(1.0)
            else:
                time.sleep(1.0)

    def offset_for_time(self, topic: str, partition: int, timestamp_ms: int, timeout_s: float = 30.0) -> int:
        """The first offset whose record timestamp is at or after ``timestamp_ms`` (BEGINNING if none)."""
        try:
            found = self._consumer.offsets_for_times(
                [TopicPartition(topic, partition, max(timestamp_ms, 0))], timeout=timeout_s
            )
        except KafkaException as exc:
            raise KafkaError(
                f"cannot look up offsets by time on {topic}: {_reason(exc)}", topic=topic
            ) from None
        offset: int = found[0].offset
        return offset if offset >= 0 else BEGINNING

    # --- reading ------------------------------------------------------------------------------

    def assign(self, starts: Iterable[tuple[str, int, int | None]]) -> None:
        """Read these (topic, partition) from these offsets (None: from the beginning), nothing else."""
        parts = [TopicPartition(t, p, BEGINNING if o is None else o) for t, p, o in starts]
        self._assigned = [(tp.topic, tp.partition) for tp in parts]
        self._start_offsets = {(tp.topic, tp.partition): tp.offset for tp in parts}
        self._fragments.clear()
        self.at_end = not parts
        try:
            self._consumer.assign(parts)
        except KafkaException as exc:
            raise KafkaError(f"cannot assign partitions: {_reason(exc)}") from None

    def batches(
        self,
        *,
        until_end: bool,
        stop: threading.Event | None = None,
        timeout_s: float | None = None,
        idle_timeout_s: float | None = None,
        max_records: int = 1000,
        poll_s: float = 0.05,
        on_bad_record: BadRecordHandler | None = None,
        key: bytes | None = None,
        keys: AbstractSet[bytes] | None = None,
        ends: Mapping[tuple[str, int], int] | None = None,
    ) -> Iterator[RecordBatch]:
        """Whole records of the assigned partitions, in batches, each partition in order.

        With ``until_end``, the loop ends once every assigned partition has been read to its end
        (a set ``stop`` raises StopRequested). :attr:`at_end` says, at each batch, whether every
        assigned partition is at its end. Without it, the loop runs until ``stop`` is set and
        also yields empty batches while the topics are quiet, so that a caller can checkpoint.
        ``timeout_s`` bounds the whole read to the end and ``idle_timeout_s`` a silence of the
        broker while the end is not reached: both raise a KafkaError.

        The end of a partition is where librdkafka reports it (its last stable offset). When the
        log holds records past it (the high watermark of the fetch that reported it is beyond it:
        a transaction still open, or one committed whose markers are not written yet, as after
        ``commit_transaction`` returns), the partition counts as at its end only once ``poll_s``
        passed without a record of it: a transaction whose markers come within that is read, one
        still open (or slower) is not waited for. When the log holds nothing past it, the end is
        final at once. A record in part at an end with records past it is kept, not cut short: its
        last fragments may lie behind another producer's open transaction (a shared topic).

        Fragments that do not make a record (missing, out of order, beyond the ``limits``, or cut
        short: a partition that ends, or waits ``fragment_wait_s``, with a record's last fragment
        still to come, when the watcher writes every fragment of a record in one transaction) are
        a :class:`~.fragments.FragmentError` naming the offset of their first fragment. The records
        before them are yielded first; then the error is raised, or with ``on_bad_record`` handed
        to it (which may raise it) and the read goes on after them.

        Fragments are joined per partition and key (:class:`~.fragments.KeyedFragments`): on a
        topic shared by many tables another table's records may come between a record's
        fragments. A joined record comes at its last fragment's place, so a reader that stores
        offsets must not store one past :meth:`fragment_starts`. With ``key`` only the records
        of that key are read (the others are neither joined nor judged: a reader of one table on
        a shared topic, which may start inside another table's fragments); with ``keys``, those of
        these keys (a reader of many tables at once). With ``ends`` (with ``until_end``), a
        partition given an end there is read once a record at or past that end less one came (of
        any key; nothing from that end on is yielded), or its end is reported: a reader that needs
        the records below an end taken earlier does not chase the end of a partition others keep
        writing (it may not find it for a long time).
        """
        wanted = keys if key is None else {key}
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        pending = set(self._assigned)
        #: (read to the end) partitions whose end was reported with records past it not readable
        #: yet, and when: each stays pending until poll_s passed without a record of it
        held: dict[tuple[str, int], float] = {}
        quiet_since = time.monotonic()
        last_end_check = 0.0
        records_came = False  # in the last consume(): while none come, a read to the end asks often
        #: partitions read to their given end (``ends``): nothing more of them is taken
        finished: set[tuple[str, int]] = set()
        while True:
            if until_end and not pending:
                return
            if stop is not None and stop.is_set():
                if until_end:
                    raise StopRequested("stop requested")
                return
            now = time.monotonic()
            if until_end and deadline is not None and now > deadline:
                raise KafkaError(
                    f"could not read {_names(pending)} to the end within {timeout_s:.0f} s",
                    topic=sorted(pending)[0][0],
                )
            wait_s = poll_s if records_came or not until_end else min(poll_s, END_SLICE_S)
            try:
                messages = self._consumer.consume(max_records, timeout=wait_s)
            except KafkaException as exc:
                raise KafkaError(f"consuming failed: {_reason(exc)}") from None
            batch = RecordBatch()
            items = batch._items
            last: tuple[str, int] | None = None
            last_topic: str | None = None
            last_partition: Any = -1
            assembling = self._fragments  # holds the partitions with a record's first fragments taken
            #: the partitions with records in part (live: feeding a fragment changes it), read as a
            #: dict: the loop asks it of every record, a method call each was its dearest test
            in_part = assembling.partitions_in_part
            refused: BadRecordError | None = None
            records_came = False
            for msg in messages:
                err = msg.error()
                if ends is not None:  # a read to ends taken earlier (a tail: few records), per record
                    where = (msg.topic() or "", msg.partition() or 0)
                    if where in finished:
                        continue
                    if err is None and until_end:
                        bound = ends.get(where)
                        if bound is not None and (msg.offset() or 0) >= bound - 1:
                            finished.add(where)  # what the reader needs of it came
                            pending.discard(where)
                            held.pop(where, None)
                            if (msg.offset() or 0) >= bound:
                                continue
                            # not pending again: the run below is this partition's already
                            last, last_topic, last_partition = where, msg.topic(), msg.partition()
                if err is not None:
                    where = (msg.topic() or "", msg.partition() or 0)
                    last = None
                    last_topic = None
                    if err.code() == _RdKafkaError._PARTITION_EOF:
                        final = self._nothing_past(where, msg.offset() or 0)
                        if until_end and not final:
                            held.setdefault(where, time.monotonic())
                        else:
                            pending.discard(where)
                            held.pop(where, None)
                        # the end came before a record's last fragment: cut short only when the
                        # log holds nothing past the end. Records past it sit behind an open
                        # transaction (the last stable offset): on a topic shared by many tables
                        # another producer's transaction may open between a committed record's
                        # fragments, and its last fragments come when that transaction ends
                        if final and where in in_part:
                            refused = self._cut_short(where, "the partition ends", on_bad_record)
                            if refused is not None:
                                break
                        continue
                    if err.fatal() or not err.retriable():
                        raise KafkaError(f"consuming failed: {err.str()}", topic=where[0], partition=where[1])
                    log.warning("consumer error (retried): %s", err.str())
                    continue
                records_came = True
                topic: Any = msg.topic()
                partition: Any = msg.partition()
                if partition != last_partition or topic != last_topic or last is None:
                    last_topic, last_partition = topic, partition
                    last = (topic or "", partition or 0)
                    pending.add(last)  # not at its end any more: wait for the next end
                    held.pop(last, None)
                where = last
                if wanted is not None and msg.key() not in wanted:
                    continue  # another key's: not this reader's to join or judge
                if not in_part or where not in in_part or not assembling.holds(where, msg.key()):
                    value: Any = msg.value()  # made by consume(): no cost here
                    if value is not None and len(value) < MIN_FRAGMENT_BYTES:
                        # never a first fragment (nor one the watcher writes but last), and no
                        # record of its key is in part: whole, checked as every whole record is,
                        # its headers not made into Python objects (~3.5 us a record)
                        items.append(msg)
                        continue
                    marks: Any = msg.headers()  # a list of (name, value), as _whole reads it
                    for name, _ in marks or ():
                        if name == HEADER_FRAGMENT:
                            break
                    else:  # a whole record (the common case): kept as the client's message
                        items.append(msg)
                        continue
                try:
                    record = self._whole(where, msg)
                except FragmentError as exc:
                    if on_bad_record is None:
                        refused = exc
                        break
                    on_bad_record(exc)
                    # the record fed was not one of the refused (a whole one, another's first
                    # fragment): taken as it comes, its key holding nothing now
                    record = self._whole_after_refusal(where, msg, exc, on_bad_record)
                if record is not None:
                    items.append(record)
                    batch._joined = True
            if refused is None and assembling:
                refused = self._overdue(on_bad_record)
            if held:
                now = time.monotonic()
                for where in [w for w, since in held.items() if now - since >= poll_s]:
                    pending.discard(where)
                    del held[where]
            if messages:
                quiet_since = time.monotonic()
            elif until_end and pending:
                quiet = time.monotonic() - quiet_since
                if quiet >= END_CHECK_AFTER_S and time.monotonic() - last_end_check >= END_CHECK_AFTER_S:
                    last_end_check = time.monotonic()
                    pending = {w for w in pending if not self._at_end(*w)}
                    for where in {w for w in assembling.starts() if w not in pending and w not in finished}:
                        if refused is None and self._nothing_past(where, self._position(where)):
                            refused = self._cut_short(where, "the partition ends", on_bad_record)
                if pending and idle_timeout_s is not None and quiet >= idle_timeout_s:
                    raise KafkaError(
                        f"{_names(pending)} did not reach their end: the broker sent nothing for "
                        f"{idle_timeout_s:.0f} s",
                        topic=sorted(pending)[0][0],
                    )
            self.at_end = not pending
            if batch or (not until_end and refused is None):
                yield batch
            if refused is not None:
                raise refused

    def _whole(self, where: tuple[str, int], msg: Any) -> Record | None:
        offset: int = msg.offset() or 0
        headers: Headers = msg.headers() or []
        key: bytes | None = msg.key()
        joined = self._fragments.feed(where, key, offset, msg.value() or b"", headers)
        if joined is None:
            return None
        value, first = joined
        if first != offset:  # joined: the record's headers are its own, without the last fragment's mark
            headers = [h for h in headers if h[0] != HEADER_FRAGMENT]
        return Record(where[0], where[1], offset, first, key, value, headers, msg.timestamp()[1])

    def _whole_after_refusal(
        self, where: tuple[str, int], msg: Any, refused: FragmentError, on_bad_record: BadRecordHandler
    ) -> Record | None:
        """``msg`` again, after the fragments before it were refused (when it was not one of them)."""
        if not refused.keeps_current:
            return None
        try:
            return self._whole(where, msg)
        except FragmentError as exc:  # refused on its own account (a first fragment of too many)
            on_bad_record(exc)
            return None

    def _cut_short(
        self, where: tuple[str, int], why: str, on_bad_record: BadRecordHandler | None
    ) -> FragmentError | None:
        """The records of ``where`` held in part, refused (their last fragment never came): each
        handed to ``on_bad_record``, or without one the first returned (the others are dropped)."""
        for refused in self._fragments.cut_short(where, why):
            if on_bad_record is None:
                return refused
            on_bad_record(refused)
        return None

    def _nothing_past(self, where: tuple[str, int], end: int) -> bool:
        """Whether the log of ``where`` holds no record past ``end`` (a reported end), committed or
        not: the high watermark librdkafka kept from the fetch that reported the end is not
        beyond it."""
        try:
            high = self._consumer.get_watermark_offsets(TopicPartition(*where), cached=True)[1]
        except KafkaException:
            return False
        return bool(high is not None and 0 <= high <= end)

    def _overdue(self, on_bad_record: BadRecordHandler | None) -> FragmentError | None:
        for refused in self._fragments.overdue():
            if on_bad_record is None:
                return refused
            on_bad_record(refused)
        return None

    def fragment_starts(self) -> dict[tuple[str, int], int]:
        """Per partition with a record read in part (its last fragment still to come), the offset
        of the first fragment of the oldest such record: a reader that stores or saves offsets
        stores none past it, or a restart would miss that record."""
        return self._fragments.starts()

    def _position(self, where: tuple[str, int]) -> int:
        """The consumer's position in ``where`` (-1 when it has none yet)."""
        try:
            offset: int = self._consumer.position([TopicPartition(*where)])[0].offset
        except KafkaException:
            return -1
        return offset

    def _at_end(self, topic: str, partition: int) -> bool:
        tp = TopicPartition(topic, partition)
        try:
            end = self._consumer.get_watermark_offsets(tp, timeout=10, cached=False)[1]  # the LSO
            position = self._consumer.position([tp])[0].offset
        except KafkaException as exc:
            raise KafkaError(f"cannot read the end offsets of {topic}: {_reason(exc)}", topic=topic) from None
        return bool(position >= end or (position < 0 and end == 0))

    def lag(self, timeout_s: float = 2.0) -> dict[tuple[str, int], int]:
        """Per assigned partition, the offsets between this reader's position and the partition's end.

        The end is the last stable offset (``read_committed``): records of open transactions are
        not behind yet. Counted in offsets, so transaction markers count too (a reader at the end
        is at 0). A partition not read yet counts from where it was assigned. The broker is asked
        (``timeout_s`` for all partitions together: asked between two batches, this must not hold
        a stop up for as many timeouts as there are partitions): a KafkaError when it does not answer.
        """
        out: dict[tuple[str, int], int] = {}
        deadline = time.monotonic() + timeout_s
        try:
            positions = self._consumer.position([TopicPartition(t, p) for t, p in self._assigned])
            for tp in positions:
                where = (tp.topic, tp.partition)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise KafkaError(
                        f"cannot read the end offsets of {where[0]}: timed out after {timeout_s:g} s",
                        topic=where[0],
                    )
                marks = self._consumer.get_watermark_offsets(
                    TopicPartition(*where), timeout=left, cached=False
                )
                if marks is None:  # older clients say a timeout this way
                    raise KafkaError(f"cannot read the end offsets of {where[0]}: timed out", topic=where[0])
                low, end = marks
                # not read yet: from where it was assigned (BEGINNING is below any low watermark)
                position = tp.offset if tp.offset >= 0 else self._start_offsets.get(where, BEGINNING)
                out[where] = max(0, end - max(position, low))
        except KafkaException as exc:
            raise KafkaError(f"cannot read the end offsets: {_reason(exc)}") from None
        return out

    def committed(
        self,
        topic: str,
        partitions: Iterable[int],
        timeout_s: float = 30.0,
        *,
        stop: threading.Event | None = None,
    ) -> dict[int, int]:
        """The group's committed offset of each partition that has one (a reader built with a group_id).

        Asked in slices of :data:`METADATA_SLICE_S` until ``timeout_s`` (then a KafkaError); a set
        ``stop`` raises StopRequested within a slice.
        """
        if not self._commits:
            raise ValueError("committed needs a consumer built with a group_id")
        wanted = [TopicPartition(topic, p) for p in partitions]
        deadline = time.monotonic() + timeout_s
        while True:
            if stop is not None and stop.is_set():
                raise StopRequested("stop requested")
            left = deadline - time.monotonic()
            try:
                found = self._consumer.committed(wanted, timeout=max(0.1, min(METADATA_SLICE_S, left)))
                break
            except KafkaException as exc:
                err = exc.args[0] if exc.args and isinstance(exc.args[0], _RdKafkaError) else None
                # a group's coordinator not found or still loading (a new group, a broker just
                # back) answers with an error Kafka calls retriable: asked again within the bound
                retry = err is not None and (err.code() in _COORDINATOR_NOT_READY or err.retriable())
                if not retry or time.monotonic() >= deadline:
                    reason = _reason(exc)
                    raise KafkaError(
                        f"cannot read the committed offsets of {topic}: {reason}", topic=topic
                    ) from None
        return {tp.partition: tp.offset for tp in found if tp.error is None and tp.offset >= 0}

    def store_offsets(self, offsets: Mapping[tuple[str, int], int]) -> None:
        """Remember where each partition's processing stands; committed to the group in the background."""
        if not self._commits:
            raise ValueError("store_offsets needs a consumer built with a group_id")
        if offsets:
            self._consumer.store_offsets(offsets=[TopicPartition(t, p, o) for (t, p), o in offsets.items()])


#: answers that mean "ask again": the group's coordinator is moving, loading or not known yet
_COORDINATOR_NOT_READY = frozenset(
    {
        _RdKafkaError._TIMED_OUT,
        _RdKafkaError.NOT_COORDINATOR,
        _RdKafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        _RdKafkaError.COORDINATOR_NOT_AVAILABLE,
    }
)


def _reason(exc: KafkaException) -> str:
    first = exc.args[0] if exc.args else exc
    return first.str() if isinstance(first, _RdKafkaError) else str(first)


def _names(partitions: Iterable[tuple[str, int]]) -> str:
    return ", ".join(f"{t}[{p}]" for t, p in sorted(partitions))


__all__ = ["BEGINNING", "FETCH_QUEUE_BOUNDS", "MirrorConsumer", "Record", "RecordBatch"]
