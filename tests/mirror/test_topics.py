"""Topic names both sides agree on, and the partitioner readers compute as Kafka does."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import pytest

from deltamirror.core.errors import ConfigError
from deltamirror.mirror.errors import KafkaError
from deltamirror.mirror.topic_names import default_commits_topic, default_topics
from deltamirror.mirror.topics import TopicManager, murmur2, murmur2_partition


def test_murmur2_gives_kafkas_own_test_vectors() -> None:
    # org.apache.kafka.common.utils.UtilsTest#testMurmur2
    cases = {
        "21": -973932308,
        "foobar": -790332482,
        "a-little-bit-long-string": -985981536,
        "a-little-bit-longer-string": -1486304829,
        "lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
        "abc": 479470107,
    }
    assert {k: murmur2(k.encode()) for k in cases} == cases


def test_default_commits_topic_follows_the_watchers_naming_rule() -> None:
    for uri in ("/data/demo", "s3://bucket/a b/sales.v2", "file:///x/_weird-"):
        topics = default_topics(uri)
        assert default_commits_topic(topics.actions) == topics.commits
    with pytest.raises(ConfigError, match="give the commits topic"):
        default_commits_topic("my.own.actions.topic")


# --- against the real broker ---------------------------------------------------------------------


@pytest.mark.kafka
def test_murmur2_partition_is_where_librdkafka_puts_a_key(kafka_bootstrap: str) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = f"murmur-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.create_topics([NewTopic(topic, 7, 1)])[topic].result(30)
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "partitioner": "murmur2_random"})
    placed: dict[bytes, int] = {}
    keys = [uuid.uuid4().hex.encode() for _ in range(40)] + [b"a", b"ab", b"abc", b"abcd"]
    for key in keys:
        producer.produce(
            topic, b"v", key, on_delivery=lambda err, msg: placed.__setitem__(msg.key(), msg.partition())
        )
    assert producer.flush(30) == 0
    assert placed == {k: murmur2_partition(k, 7) for k in keys}
    assert len(set(placed.values())) > 1


class _Unanswered:
    """A real admin client whose answers to one kind of request never come (a broker busy creating
    thousands of topics did this to ListOffsets): its futures stay pending, so a wait on them ends
    with the future's own TimeoutError, not a KafkaException."""

    def __init__(self, admin: Any, silent: str) -> None:
        self._admin, self._silent = admin, silent

    def __getattr__(self, name: str) -> Any:
        real = getattr(self._admin, name)
        if name != self._silent:
            return real

        def unanswered(wanted: Any, *args: Any, **kwargs: Any) -> dict[Any, Future[Any]]:
            # keyed as the real call keys them: create_topics by topic name, the others by what was asked
            return {key.topic if name == "create_topics" else key: Future() for key in wanted}

        return unanswered


@pytest.mark.parametrize(
    ("silent", "call"),
    [
        ("list_offsets", lambda m, topic: m.end_offsets(topic)),
        ("create_topics", lambda m, topic: m.ensure_event_topic(f"{topic}-new")),
        ("describe_configs", lambda m, topic: m.ensure_event_topic(topic)),
    ],
    ids=["end-offsets", "create", "describe"],
)
def test_an_admin_request_left_unanswered_is_a_kafka_error_naming_the_topic(
    kafka_bootstrap: str, silent: str, call: Callable[[TopicManager, str], Any]
) -> None:
    """Every wait on an admin future ends as a KafkaError (retried by the table) naming the topic and
    the wait: the watcher exited 1 on a bare TimeoutError from end_offsets during a 1,000-table start."""
    topic = f"unanswered-{uuid.uuid4().hex[:8]}"
    TopicManager({"bootstrap.servers": kafka_bootstrap}, max_record_bytes=1_000_000).ensure_event_topic(topic)
    manager = TopicManager({"bootstrap.servers": kafka_bootstrap}, max_record_bytes=1_000_000, timeout_s=0.5)
    manager._admin = _Unanswered(manager._admin, silent)
    with pytest.raises(KafkaError, match=r"within 0\.5 s") as caught:
        call(manager, topic)
    assert topic in str(caught.value)
