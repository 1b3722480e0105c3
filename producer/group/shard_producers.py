"""One transactional producer per shard, shared by the shard's tables (``watch --group``).

A process holds at most about 1,000 librdkafka clients, so a producer per table caps the tables a
member can run. In a group the unit that moves is the shard, so the shard carries the fence: its
producer's ``transactional.id`` is ``<prefix>-<group>-shard-<n>`` (:func:`shard_transactional_id`),
and a new owner's ``init_transactions`` fences the old owner for every table of the shard at once.

The tables of a shard take turns: a table's transaction holds the shard's lock from ``begin`` to
its commit or abort (:class:`ProducerLease`), so each transaction still holds one table's records
and that table's progress record, exactly as with a producer of its own.

Generations: the first table of a shard to open creates the producer and initialises it; the
others reuse it (a table's progress is read after its lease is open, so after that init). A
producer that breaks (a fatal error other than a fence, or a transaction left open by a stop that
ran out of time) is replaced by a new generation at the next open, and the other tables of the
shard reopen on their next transaction: they are told "replaced" (reconnect), never "fenced",
since it was their own process that fenced the old generation. Only a fence by another owner marks
a generation fenced, which each table of the shard then sees as :class:`ProducerFencedError`. The
producer is closed when its last table lets it go (its shard moved away, or the process stops).
"""

from __future__ import annotations

import builtins
import contextlib
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from deltamirror.mirror.errors import (
    KafkaError,
    ProducerFencedError,
    RecordRefusedError,
    RetriableKafkaError,
    StopRequested,
    TransactionAbortableError,
)
from deltamirror.mirror.kafka.producer import TransactionalPublisher
from deltamirror.mirror.records.headers import Headers
from deltamirror.mirror.records.record import Record

#: errors after which the producer still works (the open transaction is aborted, or retried)
_RECOVERABLE = (TransactionAbortableError, RetriableKafkaError, RecordRefusedError, StopRequested)
#: how often a table waiting for its shard's lock looks at its stop budget
_LOCK_SLICE_S = 0.2
#: a shard's producer that answered a metadata request this recently is taken as reachable by the
#: tables of the shard that open next (10,000 tables opening asked for the whole metadata each)
REACHABLE_FRESH_S = 1.0


def shard_transactional_id(prefix: str, group: str, shard: int) -> str:
    """``<prefix>-<group>-shard-<n>``: the producer identity of a group's shard, on any member."""
    return f"{prefix}-{group}-shard-{shard}"


class _Generation:
    """One producer of a shard, from its creation until it is replaced or closed."""

    def __init__(self, pub: TransactionalPublisher) -> None:
        self.pub = pub
        self.initialized = False
        #: another owner's init fenced it: every table of the shard must be released
        self.fenced = False
        #: unusable for another reason: the next open replaces it
        self.broken = False
        #: when the producer last answered a metadata request (monotonic)
        self.answered_at = float("-inf")


class ShardProducer:
    """The producer of one shard and the lock its tables' transactions take turns on."""

    def __init__(
        self,
        registry: ShardProducers,
        shard: int,
        transactional_id: str,
        make: Callable[[], TransactionalPublisher],
    ) -> None:
        self.registry = registry
        self.shard = shard
        self.transactional_id = transactional_id
        self._make = make
        self.current: _Generation | None = None
        #: held by the table whose transaction is open, from begin to commit/abort
        self.txn_lock = threading.Lock()
        #: guards ``current`` and ``users`` (held briefly)
        self.open_lock = threading.Lock()
        #: serialises initialising a generation (the first table to open does it, the others wait)
        self.init_lock = threading.Lock()
        self.users = 0
        self.generations = 0
        #: when a transaction of any table of the shard last committed (monotonic): a fence shows
        #: at any table's commit, so the shard needs one liveness transaction per interval, not each table
        self.last_commit = 0.0

    def generation(self) -> _Generation:
        """The usable generation, created (not yet initialised) when there is none or it broke.

        A generation fenced by another owner is not replaced here: a new ``init_transactions``
        would fence that owner back, for every table of the shard, whenever any table of this
        member reconnected. Only the assignment may decide that the shard is this member's again
        (:meth:`renew`); until then every open is refused as fenced.
        """
        stale: _Generation | None = None
        with self.open_lock:
            gen = self.current
            if gen is not None and gen.fenced and not gen.broken:
                raise ProducerFencedError(
                    "fenced: another watcher now publishes this table's shard",
                    transactional_id=self.transactional_id,
                )
            if gen is None or gen.broken:
                stale = gen
                gen = self.current = _Generation(self._make())
                self.generations += 1
        if stale is not None:
            self._close_generation(stale, 0.0)
        return gen

    def renew(self, *, only_fenced: bool = False) -> None:
        """The shard is (again) assigned to this member: the next open makes a new generation and
        initialises it, fencing whoever held the shard meanwhile, even when this member's
        current producer was fenced or is still alive from before the shard went away.

        ``only_fenced``: only if the current generation was fenced (a fenced table restarting
        while its shard is here); a generation a sibling table already renewed is kept, or the
        tables of the shard would keep replacing each other's producer.
        """
        with self.open_lock:
            if self.current is not None and (self.current.fenced or not only_fenced):
                self.current.broken = True

    def init(self, gen: _Generation, stop: threading.Event) -> None:
        """``init_transactions`` once per generation: it fences every older producer of the shard."""
        with self.init_lock:
            if gen.initialized:
                return
            if gen.fenced and not gen.broken:
                raise ProducerFencedError(
                    "fenced: another watcher now publishes this table's shard",
                    transactional_id=self.transactional_id,
                )
            if gen is not self.current or gen.broken:
                raise KafkaError("the shard's producer was replaced while opening; reconnecting")
            gen.pub.stop = stop
            try:
                gen.pub.init()
            except ProducerFencedError:
                gen.fenced = True
                raise
            except StopRequested:
                raise
            except KafkaError:
                gen.broken = True
                raise
            gen.initialized = True

    def _close_generation(self, gen: _Generation, timeout_s: float) -> None:
        with contextlib.suppress(KafkaError):
            gen.pub.close(timeout_s)
        self.registry._closed(gen.pub)

    def release_user(self, timeout_s: float) -> None:
        with self.open_lock:
            self.users -= 1
            if self.users > 0:
                return
            gen, self.current = self.current, None
        if gen is not None:
            self._close_generation(gen, timeout_s)
        self.registry._forget(self)


class ProducerLease:
    """One table's use of its shard's producer: what a table's transactions see as their producer.

    It offers what :class:`~deltamirror.mirror.kafka.producer.TransactionalPublisher` offers the
    pipeline; ``in_transaction`` and the transaction's counters are this table's only.
    """

    def __init__(
        self, shard: ShardProducer, *, stop: threading.Event, time_left: Callable[[], float]
    ) -> None:
        self.shard = shard
        self.transactional_id = shard.transactional_id
        self.stop = stop
        self.time_left = time_left
        self._gen = shard.generation()
        self._holding = False
        self._closed = False

    # --- state ---------------------------------------------------------------------------------

    @property
    def fenced(self) -> bool:
        """The shard's producer was fenced by another owner: this table must be released."""
        return self._gen.fenced

    @property
    def in_transaction(self) -> bool:
        return self._holding and self._gen.pub.in_transaction

    @property
    def records(self) -> int:
        return self._gen.pub.records if self._holding else 0

    @property
    def bytes(self) -> int:
        return self._gen.pub.bytes if self._holding else 0

    @property
    def started_at(self) -> float:
        return self._gen.pub.started_at

    def in_flight(self) -> int:
        if not self._holding:
            return 0
        try:
            return self._gen.pub.in_flight()
        except RuntimeError:  # closed by the table that replaced the generation: nothing can land
            return 0

    @property
    def disconnects(self) -> int:
        """Connections the shard's producer lost so far (see :class:`TransactionalPublisher`)."""
        return self._gen.pub.disconnects

    def partition_leader(self, topic: str, partition: int, timeout_s: float = 5.0) -> int | None:
        return self._gen.pub.partition_leader(topic, partition, timeout_s)

    # --- opening -------------------------------------------------------------------------------

    def reachable(self, timeout_s: float) -> bool:
        """A broker answered the shard's producer within ``timeout_s``, or less than
        :data:`REACHABLE_FRESH_S` ago (for another table of the shard)."""
        gen = self._gen
        if time.monotonic() - gen.answered_at < REACHABLE_FRESH_S:
            return True
        if not gen.pub.reachable(timeout_s):
            return False
        gen.answered_at = time.monotonic()
        return True

    def init(self) -> None:
        """The shard's producer initialised (by this table, or earlier by another of the shard)."""
        self.shard.init(self._gen, self.stop)

    # --- transactions --------------------------------------------------------------------------

    def _check(self) -> None:
        gen = self._gen
        if gen.fenced:
            raise ProducerFencedError(
                "fenced: another watcher now publishes this table's shard",
                transactional_id=self.transactional_id,
            )
        if gen.broken or gen is not self.shard.current or not gen.initialized:
            raise KafkaError(
                "the shard's producer was replaced; reconnecting", transactional_id=self.transactional_id
            )

    def _acquire(self) -> None:
        lock = self.shard.txn_lock
        while not lock.acquire(timeout=_LOCK_SLICE_S):
            if self.time_left() <= 0:
                raise StopRequested("stop requested while waiting for the shard's producer")
        self._holding = True

    def _release(self) -> None:
        if self._holding:
            self._holding = False
            self.shard.txn_lock.release()

    def _after(self, exc: BaseException | None = None) -> None:
        """After a call: the lock goes once no transaction of this table is open, or the producer died."""
        gen = self._gen
        if isinstance(exc, ProducerFencedError):
            gen.fenced = True
        elif isinstance(exc, KafkaError) and not isinstance(exc, _RECOVERABLE):
            gen.broken = True
        if gen.fenced or gen.broken or not gen.pub.in_transaction:
            self._release()

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            result = fn(*args)
        except RuntimeError as exc:
            if self._gen is self.shard.current:
                self._after(exc)
                raise
            # the table that replaced the generation closed it (see ShardProducer.generation): this
            # table's transaction on it is over, as after any broken producer, and it reconnects
            replaced = KafkaError(
                "the shard's producer was replaced; reconnecting", transactional_id=self.transactional_id
            )
            self._after(replaced)
            raise replaced from None
        except BaseException as exc:
            self._after(exc)
            raise
        return result

    def begin(self) -> None:
        if not self._holding:
            self._acquire()
        try:
            self._check()
        except BaseException:
            self._release()
            raise
        self._gen.pub.stop = self.stop
        self._call(self._gen.pub.begin)

    def produce(
        self,
        topic: str,
        value: builtins.bytes | None,
        key: builtins.bytes,
        headers: Headers | None = None,
        timestamp: int = 0,
    ) -> None:
        self._call(self._gen.pub.produce, topic, value, key, headers, timestamp)

    def produce_many(
        self,
        topic: str,
        values: Sequence[builtins.bytes],
        key: builtins.bytes,
        headers: Iterable[Headers],
        timestamp: int,
    ) -> None:
        self._call(self._gen.pub.produce_many, topic, values, key, headers, timestamp)

    def produce_keyed(
        self,
        records: Sequence[Record],
        timestamps: Mapping[str, int],
        headers: Headers | None = None,
    ) -> None:
        self._call(self._gen.pub.produce_keyed, records, timestamps, headers)

    def commit(self, timeout_s: float = 60.0) -> None:
        self._call(self._gen.pub.commit, timeout_s)
        self.shard.last_commit = time.monotonic()
        self._after()

    @property
    def last_commit(self) -> float:
        """When any table of the shard last committed on this process (monotonic)."""
        return self.shard.last_commit

    def abort(self, timeout_s: float = 30.0) -> None:
        if not self._holding:
            return
        self._call(self._gen.pub.abort, timeout_s)
        self._after()

    def close(self, timeout_s: float = 5.0) -> None:
        """Let the shard's producer go: it closes when its last table let it go.

        A transaction of this table still open here (a stop that ran out of time) leaves the
        producer unusable: the next table to open replaces it, and its init aborts what was left.
        """
        if self._closed:
            return
        self._closed = True
        if self._holding:
            if self._gen.pub.in_transaction:
                self._gen.broken = True
            self._release()
        self.shard.release_user(timeout_s)


class ShardProducers:
    """The shard producers of one process, created on first use and closed with their last table."""

    def __init__(self, make: Callable[[str], TransactionalPublisher], *, prefix: str, group: str) -> None:
        self._make = make
        self.prefix = prefix
        self.group = group
        self._lock = threading.Lock()
        #: taken under a shard's open_lock (which the registry's lock is taken before): its own
        self._count_lock = threading.Lock()
        self._shards: dict[int, ShardProducer] = {}
        #: live producers (created and not closed), for metrics and tests
        self._live: set[int] = set()
        self.created = 0

    def transactional_id(self, shard: int) -> str:
        return shard_transactional_id(self.prefix, self.group, shard)

    def lease(self, shard: int, *, stop: threading.Event, time_left: Callable[[], float]) -> ProducerLease:
        """A table's use of its shard's producer (created here when the shard has none)."""
        with self._lock:
            producer = self._shards.get(shard)
            if producer is None:
                txn_id = self.transactional_id(shard)
                producer = self._shards[shard] = ShardProducer(self, shard, txn_id, lambda: self._new(txn_id))
            # counted under the registry's lock: a concurrent last release must not forget it
            with producer.open_lock:
                producer.users += 1
        try:
            return ProducerLease(producer, stop=stop, time_left=time_left)
        except BaseException:
            producer.release_user(0.0)
            raise

    def renew(self, shards: Iterable[int], *, only_fenced: bool = False) -> None:
        """These shards are assigned to this member: their next open initialises a new producer
        (:meth:`ShardProducer.renew`)."""
        with self._lock:
            producers = [self._shards[s] for s in shards if s in self._shards]
        for producer in producers:
            producer.renew(only_fenced=only_fenced)

    def _new(self, txn_id: str) -> TransactionalPublisher:
        pub = self._make(txn_id)
        with self._count_lock:
            self._live.add(id(pub))
            self.created += 1
        return pub

    def _closed(self, pub: TransactionalPublisher) -> None:
        with self._count_lock:
            self._live.discard(id(pub))

    def _forget(self, producer: ShardProducer) -> None:
        with self._lock, producer.open_lock:
            if producer.users <= 0 and self._shards.get(producer.shard) is producer:
                del self._shards[producer.shard]

    def live(self) -> int:
        """Shard producers alive in this process now."""
        with self._count_lock:
            return len(self._live)


__all__ = ["ProducerLease", "ShardProducer", "ShardProducers", "shard_transactional_id"]
