"""A publisher's close lets its Kafka client go, within a bound, whatever its transaction's state.

A client that outlives its owner keeps retrying a broker that is gone (librdkafka's raw ``FAIL``
lines); a close that waits for a broker that does not answer holds a stop up without a bound.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support.kafka import free_port_pair, live_clients, new_topic

pytestmark = pytest.mark.kafka


def test_a_fenced_publisher_in_a_transaction_is_closed(
    kafka_bootstrap: str, request: pytest.FixtureRequest
) -> None:
    """Fenced while its transaction is open (the error comes from the commit, not the error
    callback): close must still close the client, which ends at once (the fence is fatal)."""
    from deltamirror.mirror.errors import ProducerFencedError
    from deltamirror.mirror.kafka.producer import TransactionalPublisher

    topic = new_topic(kafka_bootstrap, f"close-{uuid.uuid4().hex[:8]}")
    kafka = {"bootstrap.servers": kafka_bootstrap}
    txn_id = f"close-{uuid.uuid4().hex[:8]}"
    fenced = TransactionalPublisher(kafka, txn_id)
    fenced.init()
    newer = TransactionalPublisher(kafka, txn_id)
    newer.init()  # fences the first one
    fenced.begin()
    fenced.produce(topic, b"zombie", b"k")
    with pytest.raises(ProducerFencedError):
        fenced.commit(30)
    assert fenced.in_transaction
    started = time.monotonic()
    fenced.close(1.0)
    newer.close(1.0)
    assert time.monotonic() - started < 5
    # the publishers are still referenced here: their clients must be closed, not merely let go
    assert live_clients(request.node.nodeid) == []
    with pytest.raises(RuntimeError, match="closed"):
        fenced.begin()


def test_a_publisher_dropped_without_close_lets_its_client_go(
    kafka_bootstrap: str, request: pytest.FixtureRequest
) -> None:
    """An owner that loses its publisher without closing it (an error on the way to the close)
    leaves nothing alive: the client is destroyed with the publisher. The publisher's callbacks are
    held by the C client and by every record awaiting its delivery report, where the garbage
    collector does not see them: as bound methods they kept the publisher, and so its client, alive
    until the process ended (a fenced one then raised "Failed to end transaction" at the session's
    end)."""
    import gc

    from deltamirror.mirror.kafka.producer import TransactionalPublisher

    topic = new_topic(kafka_bootstrap, f"drop-{uuid.uuid4().hex[:8]}")
    dropped = TransactionalPublisher({"bootstrap.servers": kafka_bootstrap}, f"drop-{uuid.uuid4().hex[:8]}")
    dropped.init()
    dropped.begin()
    dropped.produce(topic, b"first", b"k")  # its delivery report is not served: no poll, no flush
    del dropped
    gc.collect()
    assert live_clients(request.node.nodeid) == []


@contextlib.contextmanager
def _frozen_mid_transaction(tmp_path: Path, name: str) -> Iterator[tuple[Any, str]]:
    """A publisher of a broker of its own (and its topic), in a transaction whose first record the
    broker stored (the coordinator has the partition in it), then the broker frozen (SIGSTOP)."""
    from deltamirror.devkafka.broker import LocalKafka
    from deltamirror.mirror.kafka.producer import TransactionalPublisher

    broker = LocalKafka(port=free_port_pair(), data_dir=tmp_path / "kafka")
    bootstrap = broker.start()
    pid = broker.status()["pid"]
    assert pid is not None
    frozen = False
    try:
        topic = new_topic(bootstrap, name)
        pub = TransactionalPublisher({"bootstrap.servers": bootstrap}, f"{name}-{uuid.uuid4().hex[:8]}")
        pub.init()
        pub.begin()
        pub.produce(topic, b"first", b"k")
        deadline = time.monotonic() + 30
        while pub.in_flight():
            assert time.monotonic() < deadline
            pub.poll(0.1)
        os.kill(pid, signal.SIGSTOP)
        frozen = True
        yield pub, topic
    finally:
        if frozen:
            os.kill(pid, signal.SIGCONT)
        broker.stop()


@pytest.mark.isolated  # its own broker
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_publisher_whose_broker_froze_mid_transaction_closes_at_once_and_its_client_is_gone(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The broker stops answering (SIGSTOP) while a transaction is open: the client's own close
    would abort the transaction and wait for the broker without a bound (seen: still waiting after
    40 s). close(1.0) returns within a bound, and the client is destroyed even though the publisher
    is still referenced: the broker aborts the transaction after transaction.timeout.ms."""
    with _frozen_mid_transaction(tmp_path, "frozen") as (pub, topic):
        pub.produce(topic, b"second", b"k")
        closed = threading.Event()
        closer = threading.Thread(target=lambda: (pub.close(1.0), closed.set()), daemon=True)
        started = time.monotonic()
        closer.start()
        assert closed.wait(15), "close waited for the frozen broker"
        assert time.monotonic() - started < 15
        assert live_clients(request.node.nodeid) == []


def test_the_session_check_names_a_client_that_raises_on_use_rather_than_failing_on_it(
    kafka_bootstrap: str, request: pytest.FixtureRequest
) -> None:
    """A client left open may raise a KafkaException on use: the session's check once stopped on
    "Failed to end transaction: ... fenced", raised by the poll of a fenced producer a test had left
    open, and so named no test. The check lists such a client and closes it. (The producer here
    raises from poll by its own override: a fenced client raises there only when confluent-kafka
    has a callback's error to give back, which a test cannot time.)"""
    from confluent_kafka import KafkaError, KafkaException, Producer

    from support.kafka import open_clients

    class FencedOnPoll(Producer):
        def poll(self, *args: object) -> int:
            raise KafkaException(KafkaError(KafkaError._FENCED, "Failed to end transaction", fatal=True))

    left_open = FencedOnPoll({"bootstrap.servers": kafka_bootstrap})
    left_open.opened_by = request.node.nodeid  # type: ignore[attr-defined]
    assert live_clients(request.node.nodeid) == [left_open]
    named = open_clients(request.node.nodeid)  # its own only: other tests' clients stay open
    assert len(named) == 1 and "FencedOnPoll" in named[0]
    with pytest.raises(RuntimeError, match="closed"):
        left_open.flush(0)


@pytest.mark.isolated  # its own broker
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_an_error_its_caller_keeps_does_not_keep_a_let_go_client_alive(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The broker freezes before a commit: the commit's error (kept by the caller, as a pipeline
    keeps its last error) must not keep the client alive once close() let it go. Its traceback
    kept the frame that called the client, with the client's bound method in it (a session's check
    once found such a producer of the broker-kill test alive at the end)."""
    from deltamirror.mirror.errors import KafkaError

    with _frozen_mid_transaction(tmp_path, "kept") as (pub, _):
        with pytest.raises(KafkaError) as kept:
            pub.commit(1.0)
        pub.close(1.0)
        assert live_clients(request.node.nodeid) == []
        assert kept.value is not None  # still held here
