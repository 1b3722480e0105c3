"""Operators' signals to running watchers, through a Kafka topic every watcher reads.

``deltamirror signal snapshot TABLE`` writes one :class:`Signal` to the signal topic
(``signal_topic``, ``deltamirror.signals`` by default; one partition, kept a day), keyed by the
table's normalized URI. Every watcher instance runs a :class:`SignalListener` that reads the topic
from its beginning but takes only signals written after the listener started (an older one was
meant for the watchers running then). A snapshot signal makes the table's watcher publish a fresh
snapshot of the table at the last version published (``snapshot: true`` events and summary, as an
initial snapshot), in order between two versions, without a restart: no version is skipped or
published twice, and the versions after it follow as usual.
``deltamirror signal net-changes TABLE --from-version N`` makes it publish the net row changes of
versions N to the last version published as one backfill block in a transaction of its own
(:meth:`~deltamirror.producer.publishing.transactions.TableTransactions.publish_net_block`), or
refuse it. The owner answers every signal it takes through the :class:`SignalAnswer` it is
handed: done, or the reason it refuses, logged and written in the ``done`` record (``refused``),
where ``signal --wait`` reads it. A snapshot is answered at once; a net block by the table's own
thread once it is committed, or refused when its range cannot be read (no change data feed).

A signal for a table that does not run on this instance is kept in memory, one per table (a newer
signal replaces an older one), for :data:`PENDING_TTL_S`: if the table starts here meanwhile (its
shard moved here, discovery found it, its failed pipeline came back), it is acted on then. The
instance that acts writes a ``done`` record with the signal's id to the topic, and every instance
that kept the signal drops it on reading that record, so a snapshot is not repeated by the next
owner of a table that moved. Each listener acts on one signal at most once, and so does the whole
group unless the ``done`` record cannot be written (broker trouble: logged) or two instances
start the table within the moment it takes to read it; a repeated snapshot is harmless (a
consumer that has its version skips it). A signal is lost when the TTL passes before the table
starts anywhere, when every instance that kept it stops, or when the table moves away between
the signal and its snapshot.

The topic is input anyone with write access can fill, so what it can cost is bounded: a record
larger than :data:`MAX_SIGNAL_BYTES` is skipped unread (one warning line), at most
:data:`MAX_PENDING` signals are kept (each with a location of at most 8192 characters), a log line
quotes at most 200 characters of a location, and signals start at most one snapshot per table per
:data:`SNAPSHOT_INTERVAL_S`, and at most :data:`MAX_SNAPSHOTS_PER_INTERVAL` over the instance in
that time: a signal over the limit is kept (coalesced with later ones for its table) and acted on
once the limit allows, within its TTL.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Literal

from deltamirror.mirror.errors import KafkaError, StopRequested
from deltamirror.mirror.records.boundary import BadRecordError, RecordLimits, shown
from deltamirror.mirror.records.signals import (
    MAX_SIGNAL_BYTES,
    Signal,
    decode_signal,
    encode_signal,
    new_signal,
)

log = logging.getLogger("deltamirror.signals")

#: a signal is a few hundred bytes (what the topic manager sizes topics by)
SIGNAL_MAX_BYTES = 1_000_000
#: a listener that failed (broker gone) starts again after this
RETRY_S = 5.0
#: how long a signal for a table that does not run here is kept, waiting for the table to start
PENDING_TTL_S = 600.0
#: at most this many tables with a kept signal (the oldest is dropped first, with a warning)
MAX_PENDING = 1000
#: how long :func:`send_signal` may take, all of it (``deltamirror signal snapshot --timeout``'s default)
SEND_TIMEOUT_S = 15.0
#: a signal topic created here refuses records larger than this at the broker (an existing one
#: keeps its own limit: the listener then skips them unread)
SIGNAL_TOPIC_MAX_BYTES = MAX_SIGNAL_BYTES + 4096
#: a table is snapshotted on signals at most once in this many seconds ...
SNAPSHOT_INTERVAL_S = 60.0
#: ... and the instance starts at most this many such snapshots in that time
MAX_SNAPSHOTS_PER_INTERVAL = 10


def send_signal(
    kafka: dict[str, Any],
    topic: str,
    table_uri: str,
    kind: Literal["snapshot", "net-changes"],
    *,
    timeout_s: float = SEND_TIMEOUT_S,
    from_version: int | None = None,
) -> Signal:
    """Write one signal for ``table_uri`` (normalized) and wait until the broker has stored it.

    ``timeout_s`` bounds the whole call (creating the topic if needed, then the write; the write's
    own bound is at least 1 s, so the call may end that much later): past it, a KafkaError saying
    so, as with a broker that does not answer. A signal whose write timed out is not sent.
    """
    import math

    from deltamirror.core.errors import InvalidArgumentError
    from deltamirror.mirror.kafka.producer import RecordProducer
    from deltamirror.mirror.topics import TopicManager

    if not (timeout_s > 0 and math.isfinite(timeout_s)):
        raise InvalidArgumentError("timeout_s must be more than 0 s")
    deadline = time.monotonic() + timeout_s

    def left() -> float:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise KafkaError(f"the signal could not be sent within {timeout_s:g} s", topic=topic)
        return remaining

    TopicManager(kafka, max_record_bytes=SIGNAL_MAX_BYTES, timeout_s=left()).ensure_signal_topic(
        topic, SIGNAL_TOPIC_MAX_BYTES
    )
    signal = new_signal(kind, table_uri, from_version=from_version)
    record = encode_signal(signal)
    assert record.value is not None  # a signal is never a tombstone
    producer = RecordProducer(kafka, delivery_timeout_s=max(1.0, left()))
    try:
        producer.send(topic, record.value, record.key, record.headers)
    finally:
        producer.close(timeout_s=1.0)
    return signal


class SignalAnswer:
    """The owner's answer to one signal it took: called once, with None (acted on) or the reason it
    refuses; a later call is ignored. The answer is logged and written to the topic as the signal's
    ``done`` record (``refused`` when refused): the other instances drop the signal on reading it
    and ``signal --wait`` reads it. Callable from any thread (a net block is answered by its
    table's thread once it is published)."""

    def __init__(self, listener: SignalListener, signal: Signal) -> None:
        self._listener = listener
        self.signal = signal
        self._lock = threading.Lock()
        self.given = False
        #: why the owner refused the signal (None: not refused, or not answered yet)
        self.refused: str | None = None

    def __call__(self, refused: str | None) -> None:
        with self._lock:
            if self.given:
                return
            self.given, self.refused = True, refused
        self._listener._answered(self.signal, refused)


class SignalListener:
    """Reads the signal topic on its own thread and hands each new signal to ``on_signal``.

    ``on_signal(signal, answer)`` returns whether this instance took it (False: the table does not
    run here); one it took is answered through ``answer`` (a :class:`SignalAnswer`), at once or
    later from another thread; a signal not taken is offered again after every read of the topic (at least every 0.2 s)
    until it is, its ``done`` record is read, or ``pending_ttl_s`` passes. Kafka failures are
    retried every :data:`RETRY_S`, reading on from where the listener was; a record that is not a
    signal is skipped with a warning (the topic is operators' input, not the mirror's).
    """

    def __init__(
        self,
        kafka: dict[str, Any],
        topic: str,
        on_signal: Callable[[Signal, SignalAnswer], bool],
        *,
        stop: threading.Event,
        pending_ttl_s: float = PENDING_TTL_S,
        clock: Callable[[], float] = time.monotonic,
        snapshot_interval_s: float = SNAPSHOT_INTERVAL_S,
        max_snapshots_per_interval: int = MAX_SNAPSHOTS_PER_INTERVAL,
    ) -> None:
        self.kafka = kafka
        self.topic = topic
        self.on_signal = on_signal
        self.stop = stop
        self.pending_ttl_s = pending_ttl_s
        self._clock = clock
        self.started_ms = int(time.time() * 1000)
        #: set once the listener reads the topic (tests wait for it before sending)
        self.listening = threading.Event()
        #: signals not acted on yet, by table: (the signal, when it expires on ``clock``)
        self.pending: dict[str, tuple[Signal, float]] = {}
        self.snapshot_interval_s = snapshot_interval_s
        self.max_snapshots_per_interval = max_snapshots_per_interval
        #: when each table was last snapshotted on a signal, and the instance's recent such snapshots
        self._acted_at: dict[str, float] = {}
        self._recent: deque[float] = deque()
        #: where the next read of each partition starts (after a failure: no signal taken twice)
        self._next_offsets: dict[int, int] = {}
        self._producer: Any = None
        #: answers come from tables' threads too: one producer, created once, closed once
        self._announce_lock = threading.Lock()
        self._closed = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="watch-signals", daemon=True)
        self._thread.start()

    def join(self, timeout: float | None = None) -> None:
        """Wait for the listener (stopped by ``stop``) to have stopped reading."""
        if self._thread is not None:
            self._thread.join(timeout)

    def close(self) -> None:
        """Close the producer of ``done`` records; later answers are only logged. Called once the
        tables that may still answer a signal (a net block published or refused on a stop) have
        ended: the listener's own stop does not close it."""
        with self._announce_lock:
            self._closed = True
            if self._producer is not None:
                self._producer.close()
                self._producer = None

    def _run(self) -> None:
        try:
            while not self.stop.is_set():
                try:
                    self._listen()
                except StopRequested:
                    return
                except KafkaError as exc:
                    log.warning("signal topic %s: %s (retrying)", self.topic, exc)
                    self.stop.wait(RETRY_S)
        finally:
            self.listening.clear()

    def _listen(self) -> None:
        from deltamirror.mirror.kafka.consumer import MirrorConsumer
        from deltamirror.mirror.topics import TopicManager

        TopicManager(self.kafka, max_record_bytes=SIGNAL_MAX_BYTES).ensure_signal_topic(
            self.topic, SIGNAL_TOPIC_MAX_BYTES
        )
        # fragments are joined per key: what keys hold in part together is bounded as tightly
        limits = RecordLimits(
            max_record_bytes=MAX_SIGNAL_BYTES,
            max_fragments=2,
            max_pending_records=64,
            max_pending_bytes=16 * MAX_SIGNAL_BYTES,
        )
        # signals are small: the client queues a few MB of them, not the 64 MB it queues by default
        small = {**self.kafka, "queued.max.messages.kbytes": "4096", "fetch.max.bytes": "4194304"}
        with MirrorConsumer(small, purpose="signals", fetch_wait_max_ms=None, limits=limits) as consumer:
            partitions = consumer.partitions(self.topic, wait_for_topic=True, stop=self.stop)
            if partitions is None:
                return
            consumer.assign((self.topic, p, self._next_offsets.get(p)) for p in partitions)
            self.listening.set()
            for batch in consumer.batches(
                until_end=False, stop=self.stop, poll_s=0.2, on_bad_record=self._not_a_signal
            ):
                for record in batch:
                    self._take(record.value, record.offset)
                    self._next_offsets[record.partition] = record.offset + 1
                self.offer_pending()

    def _not_a_signal(self, error: BadRecordError) -> None:
        log.warning("signal topic %s: %s; skipped", self.topic, error)

    def _take(self, value: bytes | None, offset: int) -> None:
        try:
            signal = decode_signal(value)
        except BadRecordError as exc:
            log.warning(
                "signal topic %s: record at offset %d is not a signal (%s); skipped",
                self.topic,
                offset,
                exc.message,
            )
            return
        if signal.requested_at < self.started_ms:
            return  # meant for the watchers that ran then
        uri = signal.table_uri
        if signal.kind == "done":
            kept = self.pending.get(uri)
            if kept is not None and kept[0].id == signal.id:
                del self.pending[uri]
                log.info("signal snapshot for table %s: acted on by another instance", *self._said(signal))
            return
        self.pending.pop(uri, None)  # an older one is covered by this one (re-inserted last)
        later = self._later(uri)
        if later is None and self._offer(signal):
            return
        if len(self.pending) >= MAX_PENDING:
            oldest, (dropped, _) = next(iter(self.pending.items()))
            log.warning("signal snapshot for table %s: dropped, too many kept", *self._said(dropped)[:1])
            del self.pending[oldest]
        self.pending[uri] = (signal, self._clock() + self.pending_ttl_s)
        if later is None:
            log.info(
                "signal %s for table %s: the table does not run here; kept for %.0f s until it does",
                signal.kind,
                shown(uri),
                self.pending_ttl_s,
                extra=self._extra(signal),
            )
        else:
            log.info(
                "signal %s for table %s: %s; kept, acted on once allowed (within %.0f s)",
                signal.kind,
                shown(uri),
                later,
                self.pending_ttl_s,
                extra=self._extra(signal),
            )

    @staticmethod
    def _extra(signal: Signal) -> dict[str, Any]:
        return {"table": shown(signal.table_uri), "signalId": shown(signal.id)}

    def _said(self, signal: Signal) -> tuple[str, ...]:
        return (shown(signal.table_uri),)

    def _later(self, uri: str) -> str | None:
        """Why a snapshot of ``uri`` on a signal must wait now (the rate limit), or None."""
        now = self._clock()
        interval = self.snapshot_interval_s
        last = self._acted_at.get(uri)
        if last is not None and now - last < interval:
            return f"a signal snapshotted it {now - last:.0f} s ago (at most one in {interval:.0f} s)"
        while self._recent and now - self._recent[0] >= interval:
            self._recent.popleft()
        if len(self._recent) >= self.max_snapshots_per_interval:
            return (
                f"signals started {len(self._recent)} snapshots within {interval:.0f} s (at most "
                f"{self.max_snapshots_per_interval})"
            )
        return None

    def offer_pending(self) -> None:
        """Offer the kept signals again (their table may run here now, the rate limit may allow
        them); forget the expired ones."""
        if not self.pending:
            return
        now = self._clock()
        for uri, (signal, expires) in list(self.pending.items()):
            if self._later(uri) is None and self._offer(signal):
                del self.pending[uri]
            elif now >= expires:
                del self.pending[uri]
                log.info(
                    "signal %s for table %s: not acted on within %.0f s (the table did not start here, "
                    "or the rate limit did not allow it)",
                    signal.kind,
                    shown(uri),
                    self.pending_ttl_s,
                    extra=self._extra(signal),
                )
        # the acted-on times of tables past their interval are not needed any more
        if len(self._acted_at) > MAX_PENDING:
            self._acted_at = {u: t for u, t in self._acted_at.items() if now - t < self.snapshot_interval_s}

    def announce(self, done: Signal) -> None:
        """Write ``done`` to the topic (keyed as its signal, so it follows it): the others drop it."""
        with self._announce_lock:
            if self._closed:
                raise KafkaError("the signal listener has stopped")
            if self._producer is None:
                from deltamirror.mirror.kafka.producer import RecordProducer

                self._producer = RecordProducer(self.kafka, delivery_timeout_s=10.0)
            record = encode_signal(done)
            assert record.value is not None  # a signal is never a tombstone
            self._producer.send(self.topic, record.value, record.key, record.headers)

    def _offer(self, signal: Signal) -> bool:
        """Hand the signal over: True when this instance took it (acted on it, refused it, or will
        answer it later). One taken and not refused at once counts against the rate limit."""
        answer = SignalAnswer(self, signal)
        if not self.on_signal(signal, answer):
            return False
        if answer.refused is None:
            now = self._clock()
            self._acted_at[signal.table_uri] = now
            self._recent.append(now)
        return True

    def _answered(self, signal: Signal, refused: str | None) -> None:
        """Log the owner's answer and tell the others and the sender (``done``, ``refused`` if so)."""
        if refused is None:
            log.info(
                "signal %s for table %s: acted on",
                signal.kind,
                shown(signal.table_uri),
                extra=self._extra(signal),
            )
        else:
            log.warning(
                "signal %s for table %s: refused: %s",
                signal.kind,
                shown(signal.table_uri),
                refused,
                extra=self._extra(signal),
            )
        if refused is not None:
            # refused after it was taken (a net block's range, read on the table's thread): it
            # does not hold back the next signal for the table
            self._acted_at.pop(signal.table_uri, None)
        done = new_signal("done", signal.table_uri, signal.id, refused=refused)
        try:
            self.announce(done)
        except Exception as exc:  # an answer never fails the thread that gives it (a table's)
            log.warning(
                "signal %s for table %s: answered, but the others could not be told (%s)",
                signal.kind,
                shown(signal.table_uri),
                exc,
                extra=self._extra(signal),
            )


__all__ = [
    "MAX_PENDING",
    "MAX_SIGNAL_BYTES",
    "MAX_SNAPSHOTS_PER_INTERVAL",
    "PENDING_TTL_S",
    "SEND_TIMEOUT_S",
    "SNAPSHOT_INTERVAL_S",
    "Signal",
    "SignalAnswer",
    "SignalListener",
    "send_signal",
]
