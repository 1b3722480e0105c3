"""One table's transactional, idempotent Kafka producer, and what its errors mean for the watcher.

Every Kafka call that can fail is mapped to one of four outcomes, because the service reacts to
each differently:

- :class:`ProducerFencedError` (core): another watcher took over the ``transactional.id``; this
  one must stop for good and exit non-zero (retrying would fence the newer one in turn);
- :class:`TransactionAbortableError`: the open transaction cannot commit (a record refused, a
  broker restarted mid-transaction); abort it and publish again from the last committed position;
- :class:`RetriableKafkaError`: the call may simply be repeated (a timeout);
- :class:`kafka error <deltamirror.core.errors.KafkaError>` otherwise: the producer is unusable;
  the service builds a new one (``init_transactions`` again) and re-reads its progress.

Delivery errors are latched by the delivery callback (reports are requested for errors only, so
the hot path makes no Python call per record) and raised at the next commit.

Every call that waits on the broker is bounded by the timeout it is given (the watcher gives the
time left before a stop must be done), and the waits that may last (``init``, a full local queue)
watch the stop flag: with the broker gone, a stop is not held up for librdkafka's own timeouts.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import warnings
import weakref
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from confluent_kafka import KafkaError as _RdKafkaError
from confluent_kafka import KafkaException, Producer

from deltamirror.core.errors import ConfigError

from ..errors import (
    KafkaError,
    ProducerFencedError,
    RecordRefusedError,
    RetriableKafkaError,
    StopRequested,
    TimestampRefusedError,
    TopicNotFoundError,
    TransactionAbortableError,
)
from ..records.headers import Headers
from ..records.record import Record
from . import clients

log = logging.getLogger(__name__)


def new_producer(config: dict[str, Any]) -> Producer:
    """A librdkafka producer, or one line saying why none can be made.

    librdkafka refuses a client past about 1,012 in one process (``Failed to initialize thread
    local storage``): one producer per running table makes that a limit on tables per process.
    """
    try:
        return clients.producer(config)
    except KafkaException as exc:
        raise KafkaError(f"cannot create a Kafka producer: {exc}") from None
    except RuntimeError as exc:
        raise ConfigError(
            f"cannot create another Kafka client in this process ({exc}): librdkafka allows about "
            "1,000 per process and every running table holds one; run fewer tables per process "
            "(share them with --group)"
        ) from None


FENCED_CODES = frozenset(
    {_RdKafkaError._FENCED, _RdKafkaError.PRODUCER_FENCED, _RdKafkaError.INVALID_PRODUCER_EPOCH}
)
#: bytes a record needs besides its value (key, headers, record framing)
RECORD_OVERHEAD = 4096


def classify(exc: BaseException, what: str, transactional_id: str) -> KafkaError:
    """The deltamirror error for a librdkafka exception raised by ``what``."""
    err = exc.args[0] if exc.args and isinstance(exc.args[0], _RdKafkaError) else None
    if err is None:
        return KafkaError(f"{what} failed: {exc}", transactional_id=transactional_id)
    reason = f"{what} failed: {err.str()} ({err.name()})"
    if err.code() in FENCED_CODES or "fenced" in err.str().lower():
        return ProducerFencedError(
            f"fenced: another watcher now publishes this table ({err.str()})",
            transactional_id=transactional_id,
        )
    if err.txn_requires_abort():
        return TransactionAbortableError(reason, transactional_id=transactional_id)
    if err.retriable():
        return RetriableKafkaError(reason, transactional_id=transactional_id)
    return KafkaError(reason, transactional_id=transactional_id, fatal=err.fatal() or None)


#: the error callback's codes for a lost connection: the brokers were away (or restarted) meanwhile
DISCONNECT_CODES = frozenset({_RdKafkaError._TRANSPORT, _RdKafkaError._ALL_BROKERS_DOWN})
#: ``transaction.timeout.ms`` unless the user's settings say otherwise (see :func:`producer_config`)
DEFAULT_TRANSACTION_TIMEOUT_MS = 60_000

#: how long librdkafka waits to fill a batch. Versions end with a commit, which flushes at once, so
#: this never delays a tailing watcher; while catching up it lets batches fill to batch.size: at
#: 5 ms the broker spent 2-3x the CPU per record (many small produce requests) and the watcher
#: published 48k actions/s where it now publishes 62k on the bench (bench/bench_producer.py).
LINGER_MS = 50
#: delivery callbacks are served after about this many records (and always at commit)
POLL_EVERY_RECORDS = 10_000
#: ``produce``'s partition argument for "the partitioner decides" (RD_KAFKA_PARTITION_UA)
_ANY_PARTITION = -1


def producer_config(
    kafka: dict[str, str], transactional_id: str, *, max_message_bytes: int, linger_ms: int = LINGER_MS
) -> dict[str, Any]:
    """librdkafka settings for exactly-once publishing; the user's own settings come first."""
    return {
        "linger.ms": linger_ms,
        "compression.type": "lz4",
        "queue.buffering.max.kbytes": 65536,
        "queue.buffering.max.messages": 500_000,
        "batch.size": 1_000_000,
        "transaction.timeout.ms": DEFAULT_TRANSACTION_TIMEOUT_MS,
        **kafka,
        # the watcher's own: exactly-once and Java-compatible partitioning depend on them
        "transactional.id": transactional_id,
        "enable.idempotence": True,
        "acks": "all",
        "partitioner": "murmur2_random",
        "message.max.bytes": max(1_000_000, max_message_bytes + RECORD_OVERHEAD),
        "delivery.report.only.error": True,
    }


def transaction_timeout_s(kafka: Mapping[str, Any]) -> float:
    """The ``transaction.timeout.ms`` a publisher made from these settings runs with, in seconds."""
    return int(kafka.get("transaction.timeout.ms", DEFAULT_TRANSACTION_TIMEOUT_MS)) / 1000


def _let_frames_go(exc: BaseException) -> None:
    """Detach the frames from ``exc`` and the exceptions chained to it.

    confluent-kafka keeps a reference to the SystemError a delivery callback raises while the
    client's fatal error is still set (see :meth:`TransactionalPublisher._serving`): that exception
    is never freed, and through its traceback neither are the frames it passed, with the publisher
    and its client in their locals, which then outlive their owner.
    """
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        current = todo.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        current.__traceback__ = None
        todo += [current.__cause__, current.__context__]


def _weak_callback(method: Any) -> Any:
    """``method``, called only while its object lives: a callback handed to a librdkafka client.

    The C client holds its callbacks, and every record awaiting its delivery report holds the
    delivery callback, where the garbage collector does not see them: a bound method there would
    keep its publisher, and through it the client, alive for good once the publisher is dropped
    without :meth:`TransactionalPublisher.close` (a client outliving its owner).
    """
    target = weakref.WeakMethod(method)

    def call(*args: Any) -> None:
        bound = target()
        if bound is not None:
            bound(*args)

    return call


class TransactionalPublisher:
    """A transactional producer that knows how big its open transaction is."""

    def __init__(
        self,
        kafka: dict[str, str],
        transactional_id: str,
        *,
        max_message_bytes: int = 1_000_000,
        linger_ms: int = LINGER_MS,
        logger: logging.Logger | None = None,
        stop: threading.Event | None = None,
    ) -> None:
        self.transactional_id = transactional_id
        self.stop = stop
        config = producer_config(
            kafka, transactional_id, max_message_bytes=max_message_bytes, linger_ms=linger_ms
        )
        # held weakly: a publisher dropped without close() is collected, and its client destroyed
        config["on_delivery"] = _weak_callback(self._on_delivery)
        if logger is not None:
            config["logger"] = logger
        self._outer_error_cb: Any = config.get("error_cb")
        config["error_cb"] = _weak_callback(self._on_client_error)
        #: the client's fatal error (fenced...), for a poll/flush that fails without saying it
        self._fatal: _RdKafkaError | None = None
        self._producer = new_producer(config)
        self._error: _RdKafkaError | None = None
        self._error_topic: str | None = None
        self.in_transaction = False
        self.records = 0
        self.bytes = 0
        self.started_at = 0.0
        self.transaction_timeout_s = transaction_timeout_s(config)
        #: connections to the brokers lost so far: a broker may have restarted meanwhile, and one
        #: killed mid-commit can leave a committed transaction's records without their markers
        self.disconnects = 0

    # --- callbacks --------------------------------------------------------------------------

    def _on_delivery(self, err: _RdKafkaError | None, msg: Any) -> None:
        if err is not None and self._error is None:
            self._error = err
            self._error_topic = msg.topic() if msg is not None else None

    def _classify(self, exc: BaseException, what: str) -> KafkaError:
        """:func:`classify`, with librdkafka's generic ``_FATAL`` replaced by the fatal error itself.

        A producer fenced while it produces first answers ``_FATAL`` ("Fatal error"), which would
        read as a broken client: the watcher would open a new producer and fence the new owner back.
        """
        err = exc.args[0] if exc.args and isinstance(exc.args[0], _RdKafkaError) else None
        if err is not None and err.code() == _RdKafkaError._FATAL:
            exc = self._fatal_cause() or exc
        found = classify(exc, what, self.transactional_id)
        return self._expired(found, what) if isinstance(found, ProducerFencedError) else found

    def _expired(self, fenced: ProducerFencedError, what: str) -> KafkaError:
        """A fence of a producer whose own transaction outlived ``transaction.timeout.ms`` (a broker
        away meanwhile) is the coordinator's doing: it aborted the expired transaction and bumped the
        producer's epoch. Not another watcher: a fatal KafkaError (a new producer session), not
        ProducerFencedError (which ends the watcher)."""
        age = time.monotonic() - self.started_at
        if not self.in_transaction or age < self.transaction_timeout_s:
            return fenced
        return KafkaError(
            f"{what} failed: the transaction coordinator aborted this producer's transaction, open for "
            f"{age:.0f} s (transaction.timeout.ms {self.transaction_timeout_s:.0f} s), and fenced its "
            f"epoch ({fenced})",
            transactional_id=self.transactional_id,
            fatal=True,
        )

    def _fatal_cause(self) -> KafkaException | None:
        """The client's fatal error: latched by the error callback, or returned by the next call."""
        if self._fatal is not None:
            return KafkaException(self._fatal)
        probes = (lambda: self._producer.poll(0), lambda: self._producer.abort_transaction(0.1))
        for probe in probes:  # the producer is unusable anyway: these only ask what happened
            try:
                probe()
            except KafkaException as exc:
                if (
                    exc.args
                    and isinstance(exc.args[0], _RdKafkaError)
                    and exc.args[0].code() != _RdKafkaError._FATAL
                ):
                    return exc
            except SystemError as exc:
                _let_frames_go(exc)
                if isinstance(exc.__cause__, KafkaException):
                    return exc.__cause__
        return None

    def _on_client_error(self, err: _RdKafkaError) -> None:
        if err.code() in DISCONNECT_CODES:
            self.disconnects += 1
        if err.fatal() and self._fatal is None:
            self._fatal = err
        if self._outer_error_cb is not None:
            self._outer_error_cb(err)

    def _raise_latched(self) -> None:
        err, topic = self._error, self._error_topic
        if err is None:
            return
        self._error = None
        self._error_topic = None
        reason = f"delivery to {topic} failed: {err.str()} ({err.name()})"
        if err.code() in FENCED_CODES:
            raise self._expired(
                ProducerFencedError(
                    f"fenced: another watcher now publishes this table ({err.str()})",
                    transactional_id=self.transactional_id,
                ),
                f"delivery to {topic}",
            )
        if err.code() == _RdKafkaError.INVALID_TIMESTAMP:
            raise TimestampRefusedError(reason, topic=topic, transactional_id=self.transactional_id)
        if err.code() in (_RdKafkaError.MSG_SIZE_TOO_LARGE, _RdKafkaError.RECORD_LIST_TOO_LARGE):
            raise RecordRefusedError(reason, topic=topic, transactional_id=self.transactional_id)
        raise TransactionAbortableError(reason, topic=topic, transactional_id=self.transactional_id)

    # --- transactions -----------------------------------------------------------------------

    def _call(self, what: str, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except KafkaException as exc:
            # the error's traceback keeps this frame: not the client's bound method with it (an
            # error kept by its catcher would keep a client alive that close() let go)
            del fn, args
            raise self._classify(exc, what) from exc

    def _check_stop(self) -> None:
        if self.stop is not None and self.stop.is_set():
            raise StopRequested("stop requested")

    def reachable(self, timeout_s: float) -> bool:
        """True when a broker answered a metadata request within ``timeout_s``; serves callbacks."""
        try:
            self._producer.list_topics(timeout=timeout_s)
        except KafkaException:
            return False
        finally:
            self._producer.poll(0)  # error_cb and logger calls are served by poll
        return True

    def partition_leader(self, topic: str, partition: int, timeout_s: float = 5.0) -> int | None:
        """The broker id leading ``topic[partition]`` now (None: unknown or no leader)."""
        try:
            found = self._producer.list_topics(topic, timeout=timeout_s).topics.get(topic)
        except KafkaException:
            return None
        meta = found.partitions.get(partition) if found is not None and found.error is None else None
        return meta.leader if meta is not None and meta.leader >= 0 else None

    def init(self, timeout_s: float = 60.0, *, slice_s: float = 1.0) -> None:
        """``init_transactions``: fences older producers of this id and completes their transaction.

        Called in slices of ``slice_s`` (librdkafka resumes an init that timed out), so that a
        stop is noticed within a slice; raises StopRequested then.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            self._check_stop()
            left = deadline - time.monotonic()
            try:
                self._call(
                    "init_transactions", self._producer.init_transactions, max(0.1, min(slice_s, left))
                )
                return
            except RetriableKafkaError:
                self._producer.poll(0)
                if time.monotonic() >= deadline:
                    raise

    def begin(self) -> None:
        self._error = None
        self._call("begin_transaction", self._producer.begin_transaction)
        self.in_transaction = True
        self.records = 0
        self.bytes = 0
        self.started_at = time.monotonic()

    def produce(
        self,
        topic: str,
        value: bytes | None,
        key: bytes,
        headers: Headers | None = None,
        timestamp: int = 0,
    ) -> None:
        """One record; a None ``value`` is a tombstone (a compacted topic forgets the key)."""
        self._produce_one(self._producer.produce, topic, value, key, headers, timestamp)
        self.records += 1
        self.bytes += len(value) if value is not None else 0
        if self.records % POLL_EVERY_RECORDS == 0:
            self._serve_callbacks()

    def _produce_one(
        self,
        produce: Any,
        topic: str,
        value: bytes | None,
        key: bytes | None,
        headers: Headers | None,
        timestamp: int,
    ) -> None:
        while True:
            try:
                produce(topic, value, key, _ANY_PARTITION, None, None, timestamp, headers)
                return
            except BufferError:
                self._check_stop()  # the queue stays full while the broker is gone
                self._producer.poll(0.05)  # the local queue is full: wait for deliveries
            except KafkaException as exc:
                raise self._classify(exc, "produce") from exc

    def produce_many(
        self,
        topic: str,
        values: Sequence[bytes],
        key: bytes,
        headers: Iterable[Headers],
        timestamp: int,
    ) -> None:
        """``values`` with their ``headers``, one record each, all with ``key`` and ``timestamp``.

        The loop's one Python step per record is the ``produce`` call, its arguments positional
        (keywords cost a fifth of the call: confluent-kafka's order is topic, value, key,
        partition, callback, on_delivery, timestamp, headers); counts are made once per batch.
        """
        produce = self._producer.produce
        for value, hdrs in zip(values, headers, strict=True):
            try:
                produce(topic, value, key, _ANY_PARTITION, None, None, timestamp, hdrs)
            except BufferError:  # the local queue is full: wait for room (or a stop)
                self._produce_one(produce, topic, value, key, hdrs, timestamp)
            except KafkaException as exc:
                raise self._classify(exc, "produce") from exc
        before = self.records
        self.records += len(values)
        self.bytes += sum(map(len, values))
        if before // POLL_EVERY_RECORDS != self.records // POLL_EVERY_RECORDS:
            self._serve_callbacks()

    def produce_keyed(
        self,
        records: Sequence[Record],
        timestamps: Mapping[str, int],
        headers: Headers | None = None,
    ) -> None:
        """Records that name their topic, each keyed by itself (a None value: a tombstone) and placed
        by the murmur2 partitioner, with their topic's timestamp from ``timestamps`` and ``headers``."""
        produce = self._producer.produce
        size = 0
        for record in records:
            topic, key, value = record.topic, record.key, record.value
            if topic is None:
                raise ValueError("a record produced by its key names its topic")
            timestamp = timestamps[topic]
            try:
                produce(topic, value, key, _ANY_PARTITION, None, None, timestamp, headers)
            except BufferError:  # the local queue is full: wait for room (or a stop)
                self._produce_one(produce, topic, value, key, headers, timestamp)
            except KafkaException as exc:
                raise self._classify(exc, "produce") from exc
            if value is not None:
                size += len(value)
        before = self.records
        self.records += len(records)
        self.bytes += size
        if before // POLL_EVERY_RECORDS != self.records // POLL_EVERY_RECORDS:
            self._serve_callbacks()

    def _serving(self, what: str, fn: Any, *args: Any) -> Any:
        """``fn`` (poll or flush), with a fatal error (fenced) as a deltamirror error.

        confluent-kafka raises the fatal error from poll/flush, then calls the next delivery
        callback with that exception still set, which surfaces as a SystemError whose cause it is.
        """
        try:
            return fn(*args)
        except (KafkaException, SystemError) as exc:
            del fn, args  # as in _call: the raised error's frame must not hold the client
            if isinstance(exc, SystemError):
                _let_frames_go(exc)
            cause = exc if isinstance(exc, KafkaException) else exc.__cause__
            if not isinstance(cause, KafkaException):
                cause = self._fatal_cause()
            if not isinstance(cause, KafkaException):  # the client broke without a reason: a new one
                raise KafkaError(f"{what} failed: {exc}", transactional_id=self.transactional_id) from exc
            raise self._classify(cause, what) from None

    def _serve_callbacks(self) -> None:
        """Delivery errors (only errors are reported) and log callbacks, now and then: a poll per
        batch cost 6% of the watcher's time, and commit() flushes and raises what is latched."""
        self._serving("poll", self._producer.poll, 0)
        if self._error is not None:
            self._raise_latched()

    def commit(self, timeout_s: float = 60.0) -> None:
        """Flush and commit within ``timeout_s``; a latched delivery error is raised instead (then abort).

        A RetriableKafkaError when the time is up: the transaction is still open (abort it, or the
        broker aborts it after ``transaction.timeout.ms``).
        """
        deadline = time.monotonic() + timeout_s
        self._serving("flush", self._producer.flush, max(0.0, min(timeout_s, 30.0)))
        self._raise_latched()
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RetriableKafkaError(
                    f"commit_transaction did not complete within {timeout_s:.1f} s",
                    transactional_id=self.transactional_id,
                )
            try:
                self._call("commit_transaction", self._producer.commit_transaction, max(0.1, left))
                break
            except RetriableKafkaError:
                self._raise_latched()
                if time.monotonic() >= deadline:
                    raise
            except TransactionAbortableError:
                self._raise_latched()
                raise
        self.in_transaction = False

    def abort(self, timeout_s: float = 30.0) -> None:
        """Abort the open transaction (its records become invisible to read_committed consumers)."""
        self._error = None
        if not self.in_transaction:
            return
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RetriableKafkaError(
                    f"abort_transaction did not complete within {timeout_s:.1f} s",
                    transactional_id=self.transactional_id,
                )
            try:
                self._call("abort_transaction", self._producer.abort_transaction, max(0.1, left))
                break
            except RetriableKafkaError:
                if time.monotonic() >= deadline:
                    raise
        self.in_transaction = False
        self._error = None

    def poll(self, timeout_s: float = 0.0) -> None:
        self._serving("poll", self._producer.poll, timeout_s)

    def in_flight(self) -> int:
        """Records produced and not yet acknowledged by the broker (queued or sent)."""
        return len(self._producer)

    def close(self, timeout_s: float = 5.0) -> None:
        """Let the client go for good, within about ``timeout_s``, so that it does not outlive its
        owner retrying a broker that is gone (librdkafka's raw ``FAIL`` lines).

        Outside a transaction nothing is queued: the client is closed. A transaction still open (a
        stop ran out of time, the client broke) is aborted within ``timeout_s`` first. An abort the
        broker does not answer in time is not waited for: the client's ``close`` would abort again
        and wait for the broker without a bound. Its records are purged instead and the client is
        dropped, which destroys it without an abort (the broker aborts the transaction after
        ``transaction.timeout.ms``, as after a crash). Either way the publisher holds no client
        afterwards: any later call raises RuntimeError, as a closed client does.
        """
        producer, self._producer = self._producer, _CLOSED
        if self.in_transaction and not self._abort_for_close(producer, timeout_s):
            with contextlib.suppress(KafkaException, SystemError, RuntimeError):
                producer.purge(True, True)
                producer.flush(0)  # serves the purged records' reports
            return  # the last reference goes with this frame: destroyed, no abort
        with contextlib.suppress(KafkaException, SystemError, RuntimeError), warnings.catch_warnings():
            # a fatal (fenced) client's close says "abort_transaction failed during close", at once
            warnings.simplefilter("ignore", RuntimeWarning)
            producer.purge(True, True)
            producer.close()

    def _abort_for_close(self, producer: Producer, timeout_s: float) -> bool:
        """Abort the open transaction for :meth:`close`: False when the broker did not answer in
        time (a fatal client ends it at once: True, its close does not wait for the broker)."""
        try:
            producer.abort_transaction(max(0.1, timeout_s))
        except KafkaException as exc:
            err = exc.args[0] if exc.args and isinstance(exc.args[0], _RdKafkaError) else None
            return err is not None and err.fatal()
        except SystemError as exc:  # a callback served with the fatal error set (see _serving)
            _let_frames_go(exc)
            return True
        self.in_transaction = False
        return True


class _ClosedProducer:
    """What a closed publisher holds instead of its client: every use says it is closed."""

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError("the producer was closed")

    def __len__(self) -> int:
        raise RuntimeError("the producer was closed")


_CLOSED: Any = _ClosedProducer()


class RecordProducer:
    """An idempotent, non-transactional producer whose :meth:`send` returns once the record is stored.

    For the odd record that must be on the broker before the caller goes on (a dead letter, then
    the offset of what it replaces): no transaction, each send waits for its delivery report. A
    send that times out may still be delivered later: at least once, like what it stands for.
    """

    def __init__(self, kafka: dict[str, Any], *, delivery_timeout_s: float = 30.0) -> None:
        self.delivery_timeout_s = delivery_timeout_s
        config = {
            "linger.ms": 5,
            **kafka,
            "enable.idempotence": True,
            "acks": "all",
            "message.timeout.ms": max(1000, int(delivery_timeout_s * 1000)),
        }
        self._producer = new_producer(config)

    def check_topic(self, topic: str, timeout_s: float = 30.0) -> None:
        """A TopicNotFoundError now, rather than a send that fails after its timeout."""
        try:
            found = self._producer.list_topics(topic, timeout=timeout_s).topics.get(topic)
        except KafkaException as exc:
            raise KafkaError(f"cannot read the metadata of topic {topic}: {exc}", topic=topic) from None
        if found is None or found.error is not None or not found.partitions:
            reason = found.error.str() if found is not None and found.error is not None else "no such topic"
            raise TopicNotFoundError(f"topic {topic} cannot be written: {reason}", topic=topic)

    def send(
        self, topic: str, value: bytes, key: bytes | None = None, headers: Headers | None = None
    ) -> None:
        """Produce one record and wait for the broker to store it; a KafkaError if it did not."""
        outcome: list[_RdKafkaError | None] = []

        def delivered(err: _RdKafkaError | None, msg: Any) -> None:
            outcome.append(err)

        try:
            self._producer.produce(topic, value, key, headers=headers, on_delivery=delivered)
        except (KafkaException, BufferError) as exc:
            raise KafkaError(f"producing to {topic} failed: {exc}", topic=topic) from None
        self._producer.flush(self.delivery_timeout_s + 5.0)
        if not outcome:
            raise RetriableKafkaError(
                f"a record to {topic} was not delivered within {self.delivery_timeout_s:.0f} s", topic=topic
            )
        err = outcome[0]
        if err is not None:
            raise KafkaError(f"delivery to {topic} failed: {err.str()} ({err.name()})", topic=topic)

    def close(self, timeout_s: float = 5.0) -> None:
        """Wait up to ``timeout_s`` for what is queued, then close the client (what is left is
        purged: a send that returned had its outcome already)."""
        producer, self._producer = self._producer, _CLOSED
        with contextlib.suppress(KafkaException, RuntimeError):
            producer.flush(timeout_s)
            producer.purge(True, True)
            producer.close()


__all__ = [
    "FENCED_CODES",
    "RECORD_OVERHEAD",
    "RecordProducer",
    "RecordRefusedError",
    "RetriableKafkaError",
    "StopRequested",
    "TimestampRefusedError",
    "TransactionAbortableError",
    "TransactionalPublisher",
    "classify",
    "producer_config",
    "transaction_timeout_s",
]
