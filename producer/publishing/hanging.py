"""Transactions that hold a table's partitions: waiting until they end, and saying when one never will.

A table publishes from what its topics hold, not from what it remembers (:mod:`.pipeline`): after
an aborted transaction, a new producer session, or a connection lost to the brokers, it first waits
until no transaction open at that moment is still open on its own topics or on the progress topic
(each partition's last stable offset has reached the high watermark it had), then reads its
progress back.

With no transaction of the table open, a partition whose last stable offset stays below that point
for longer than the producer's ``transaction.timeout.ms`` plus :data:`HANG_MARGIN_S` (the broker
aborts a producer's expired transaction within about 10 s of its timeout) holds a transaction
nobody is going to end. Kafka 4.x leaves one when a single broker killed mid-commit comes back:
it completes the transaction but skips the markers of the partitions it has no leader for yet
(fenced for a moment after its restart), as it does for deleted topics; its log says ``Couldn't
find leader endpoint for partitions Set(...) while trying to send transaction markers for <id>,
these partitions are likely deleted already and hence can be skipped``. ``read_committed``
readers stop at such a partition's last stable offset for good, and the producer's next marker
there would decide the fate of those records, committed by Kafka, silently. So the table
publishes nothing until the transaction has ended, and says why: one error line per partition
naming the offset and Kafka's remedy (:func:`remedy`), ``/healthz`` unhealthy for the table, the
``deltamirror_hanging_transactions`` gauge above 0. Once an operator has aborted it (``kafka-
transactions.sh abort``, or ``deltamirror local kafka abort-hanging`` for the local broker) the
table reads its progress and publishes again from there.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from deltamirror.mirror.errors import StopRequested

#: beyond ``transaction.timeout.ms``: Kafka's check for expired transactions runs every 10 s
HANG_MARGIN_S = 30.0
#: how often a partition held by a transaction is looked at again (more slowly once reported)
POLL_S = 0.1
POLL_REPORTED_S = 2.0

#: each partition's end now: ``committed`` True for a read_committed reader, else the high watermark
EndOffsets = Callable[[str, bool], Mapping[int, int]]


@dataclass(frozen=True)
class OpenTransaction:
    """A partition whose records from ``offset`` on (the first record of its oldest open
    transaction, its last stable offset) are not readable ``read_committed``."""

    topic: str
    partition: int
    offset: int
    #: the high watermark when the wait began: the partition is settled once ``offset`` reaches it
    end: int

    def __str__(self) -> str:
        return f"{self.topic}[{self.partition}] from offset {self.offset}"


#: the end offsets of several topics at once, by topic (``committed`` as for :data:`EndOffsets`)
ManyEndOffsets = Callable[[Sequence[str], bool], Mapping[str, Mapping[int, int]]]


def one_by_one(end_offsets: EndOffsets) -> ManyEndOffsets:
    """:data:`ManyEndOffsets` asking ``end_offsets`` for each topic in turn."""
    return lambda topics, committed: {topic: end_offsets(topic, committed) for topic in topics}


def open_transactions(
    end_offsets: EndOffsets,
    topics: Sequence[str],
    targets: Mapping[tuple[str, int], int],
    *,
    many: ManyEndOffsets | None = None,
) -> list[OpenTransaction]:
    """The partitions of ``topics`` whose last stable offset is still below its target (``many``:
    the topics' ends asked at once)."""
    ends = (many or one_by_one(end_offsets))(topics, True)
    held = []
    for topic in topics:
        for partition, stable in sorted(ends[topic].items()):
            end = targets.get((topic, partition), 0)
            if stable < end:
                held.append(OpenTransaction(topic, partition, stable, end))
    return held


def wait_until_settled(
    end_offsets: EndOffsets,
    topics: Sequence[str],
    *,
    hang_after_s: float,
    stop: threading.Event,
    on_hang: Callable[[list[OpenTransaction]], None],
    on_clear: Callable[[list[OpenTransaction]], None],
    poll_s: float = POLL_S,
    poll_reported_s: float = POLL_REPORTED_S,
    clock: Callable[[], float] = time.monotonic,
    many: ManyEndOffsets | None = None,
) -> bool:
    """Return once every transaction open on ``topics`` when called has ended; True if one was.

    ``on_hang`` is called once with the partitions still held after ``hang_after_s`` (the wait goes
    on: only an operator can end such a transaction), ``on_clear`` with them once they are free.
    A set ``stop`` raises StopRequested. ``many``: the topics' ends asked at once (each table
    resuming asked its three topics' ends twice, six waits for a shared request, one at a time).
    """
    ends = many or one_by_one(end_offsets)
    targets = {
        (topic, p): end for topic, offsets in ends(topics, False).items() for p, end in offsets.items()
    }
    started = clock()
    reported: list[OpenTransaction] = []
    waited = False
    while True:
        held = open_transactions(end_offsets, topics, targets, many=ends)
        if not held:
            if reported:
                on_clear(reported)
            return waited
        waited = True
        if not reported and clock() - started >= hang_after_s:
            reported = held
            on_hang(held)
        if stop.wait(poll_reported_s if reported else poll_s):
            raise StopRequested("stop requested")


def remedy(bootstrap_servers: str, held: OpenTransaction, broker_id: int | None) -> str:
    """Kafka's own way to end a hanging transaction (``kafka-transactions.sh``), for this partition."""
    tool = f"kafka-transactions.sh --bootstrap-server {bootstrap_servers}"
    find = f"{tool} find-hanging --broker-id {broker_id if broker_id is not None else '<leader id>'}"
    abort = f"{tool} abort --topic {held.topic} --partition {held.partition} --start-offset {held.offset}"
    return (
        f"{find}, then {abort} (a broker of deltamirror local kafka: deltamirror local kafka abort-hanging)"
    )


__all__ = [
    "HANG_MARGIN_S",
    "EndOffsets",
    "ManyEndOffsets",
    "OpenTransaction",
    "one_by_one",
    "open_transactions",
    "remedy",
    "wait_until_settled",
]
