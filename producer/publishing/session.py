"""A table's producer session at its edges: its identity, waiting for a broker, closing it.

Kept apart from the pipeline's loops because these steps follow the broker's rules, not the
table's: the ``transactional.id`` decides which earlier producer a new one fences, a broker that
does not answer must neither hold a stop up nor flood the log, and a producer closed while
stopping must say what it leaves open instead of waiting on a broker that is gone.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
from collections.abc import Callable

from deltamirror.mirror.errors import KafkaError, StopRequested
from deltamirror.mirror.kafka.connection import KafkaConnectionReporter
from deltamirror.mirror.kafka.producer import TransactionalPublisher

from ..group.shard_producers import ProducerLease
from .transactions import TableTransactions

#: how long one metadata request waits while connecting (a stop is noticed within it)
CONNECT_SLICE_S = 1.0


def transactional_id(prefix: str, table_uri: str) -> str:
    """``<prefix>-<sha1(table_uri)[:16]>``: the one producer identity of a table.

    ``table_uri`` is the normalized location (:attr:`TableConfig.normalized_uri`).
    """
    digest = hashlib.sha1(table_uri.encode(), usedforsecurity=False).hexdigest()
    return f"{prefix}-{digest[:16]}"


def wait_for_brokers(
    pub: TransactionalPublisher | ProducerLease, reporter: KafkaConnectionReporter, stop: threading.Event
) -> None:
    """Until a broker answers: the reporter says why not (now and then), a stop ends the wait.

    The admin calls that follow wait up to 30 s each on a broker that does not answer, and
    librdkafka would print each failed attempt; asking for metadata in short slices first
    keeps both the stop and the log under control.
    """
    while not pub.reachable(CONNECT_SLICE_S):
        reporter.check()  # wrong credentials: no retry
        if reporter.last_reason is None:  # no transport error: the broker is silent
            reporter.unreachable(f"no answer within {CONNECT_SLICE_S:.0f} s")
        if stop.is_set():
            raise StopRequested("stop requested")
    reporter.check()
    reporter.reachable()


def close_publisher(
    txns: TableTransactions,
    *,
    time_left: Callable[[], float],
    stop: threading.Event,
    say_abandoned: Callable[[], None],
) -> None:
    """Close the session's producer, aborting its open transaction within the time left.

    A transaction still open while stopping (the broker did not answer the abort) is said
    abandoned, once, before the producer goes.
    """
    pub = txns.pub
    if pub is None:
        return
    txns.pub = None
    try:
        left = time_left()
        if pub.in_transaction and left > 0:
            with contextlib.suppress(KafkaError):
                pub.abort(min(5.0, left))
        if pub.in_transaction and stop.is_set():
            txns.pub = pub  # for the report
            say_abandoned()
            txns.pub = None
    finally:  # whatever the abort raised: the client (or the shard's lease) is let go
        pub.close(max(0.0, min(5.0, time_left())))


__all__ = ["CONNECT_SLICE_S", "close_publisher", "transactional_id", "wait_for_brokers"]
