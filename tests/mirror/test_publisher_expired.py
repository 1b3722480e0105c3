"""A transaction the coordinator expired is not a fence by another watcher.

When a producer's transaction outlives ``transaction.timeout.ms`` (the broker was away, or
restarted after a kill -9, for longer than that), the coordinator aborts it and bumps the
producer's epoch; the producer's next transactional call is then refused as fenced. The watcher
took that for another watcher and stopped (exit 1) after a broker kill whose restart took 31 s.
It is a broken producer session: a fatal KafkaError (a new session), never ProducerFencedError.
"""

from __future__ import annotations

import time
import uuid

import pytest

from deltamirror.mirror.errors import KafkaError, ProducerFencedError
from deltamirror.mirror.kafka.producer import TransactionalPublisher
from support.kafka import new_topic, uncommitted_records

pytestmark = [pytest.mark.kafka]


@pytest.mark.timeout(120)
def test_a_transaction_the_coordinator_expired_is_not_taken_for_a_fence(kafka_bootstrap: str) -> None:
    topic = new_topic(kafka_bootstrap, f"dm-test-expired-{uuid.uuid4().hex[:12]}")
    pub = TransactionalPublisher(
        {"bootstrap.servers": kafka_bootstrap, "transaction.timeout.ms": "1000"},
        f"dm-test-expired-{uuid.uuid4().hex[:8]}",
    )
    try:
        pub.init()
        pub.begin()
        pub.produce(topic, b"v", b"k")
        pub._producer.flush(30)
        assert uncommitted_records(kafka_bootstrap, topic) == 1
        deadline = time.monotonic() + 60  # the coordinator's expiry check runs every 10 s
        while uncommitted_records(kafka_bootstrap, topic) != 0:
            assert time.monotonic() < deadline, "the coordinator did not abort the expired transaction"
            time.sleep(0.2)
        with pytest.raises(KafkaError) as caught:
            pub.commit(30)
        assert not isinstance(caught.value, ProducerFencedError), caught.value
        if caught.value.context.get("fatal"):  # refused as fenced: said as the coordinator's doing
            assert "aborted this producer's transaction, open for" in str(caught.value)
    finally:
        pub.close(5)
