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


class _HeldListOffsets:
    """A real admin client whose first ListOffsets request waits until ``release`` is set: the
    calls made meanwhile are what the manager does with callers that come while one is in flight."""

    def __init__(self, admin: Any) -> None:
        import threading

        self._admin = admin
        self.requests: list[int] = []  # partitions asked, per ListOffsets request
        self.metadata: list[list[str]] = []  # the topics named, per metadata request
        self.in_flight = threading.Event()
        self.release = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._admin, name)

    def release_once_queued(self, manager: TopicManager, later: list[Any]) -> None:
        """Starts the ``later`` callers' threads while the first request is held, and releases it
        once all of them wait in the next batch."""
        import time

        for thread in later:
            thread.start()
        deadline = time.monotonic() + 20  # inside the manager's 30 s timeout, which the callers wait at most
        while (pending := manager._ends._open) is None or pending.callers < len(later):
            assert time.monotonic() < deadline, "the later callers never queued behind the first request"
            time.sleep(0.01)
        self.release.set()

    def describe_topics(self, topics: Any, *args: Any, **kwargs: Any) -> Any:
        self.metadata.append(sorted(topics.topic_names))
        return self._admin.describe_topics(topics, *args, **kwargs)

    def list_offsets(self, wanted: Any, *args: Any, **kwargs: Any) -> Any:
        self.requests.append(len(wanted))
        futures = self._admin.list_offsets(wanted, *args, **kwargs)
        if len(self.requests) == 1:  # answered by the broker, and not returned yet
            for future in futures.values():
                future.result(30)
            self.in_flight.set()
            assert self.release.wait(30), "the test never released the first request"
        return futures


@pytest.mark.kafka
def test_end_offsets_asked_by_many_threads_at_once_is_one_request_and_each_answer_follows_its_ask(
    kafka_bootstrap: str,
) -> None:
    """A 10,000-table start waited on each table's own end-offsets requests (several per table, on
    one admin client). Callers that ask while a request is in flight share the next one; none gets
    an answer taken before it asked (a record written meanwhile is in the later callers' ends)."""
    import threading

    from confluent_kafka import Producer

    topic = f"ends-{uuid.uuid4().hex[:8]}"
    manager = TopicManager({"bootstrap.servers": kafka_bootstrap}, max_record_bytes=1_000_000)
    manager.ensure_event_topic(topic)
    held = _HeldListOffsets(manager._admin)
    manager._admin = held
    answers: dict[str, dict[int, int]] = {}

    def ask(name: str) -> None:
        answers[name] = manager.end_offsets(topic)

    first = threading.Thread(target=ask, args=("first",))
    first.start()
    assert held.in_flight.wait(30)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    producer.produce(topic, b"written while the first request was in flight")
    assert producer.flush(30) == 0
    later = [threading.Thread(target=ask, args=(f"later-{i}",)) for i in range(20)]
    held.release_once_queued(manager, later)
    for thread in (first, *later):
        thread.join(30)
    assert answers["first"] == {0: 0}
    assert {name: ends for name, ends in answers.items() if name != "first"} == {
        f"later-{i}": {0: 1} for i in range(20)
    }
    assert held.requests == [1, 1]  # the first caller's request, then one for the twenty others
    assert held.metadata == [[topic], [topic]]


@pytest.mark.kafka
def test_end_offsets_of_many_topics_in_one_batch_are_one_metadata_request(kafka_bootstrap: str) -> None:
    """A batch asked a metadata request per topic, one after the other: twenty topics, twenty
    requests. Callers of twenty topics that queue behind a request in flight now share one
    metadata request and one ListOffsets request, and each gets its own topic's ends."""
    import threading

    from confluent_kafka import Producer

    manager = TopicManager({"bootstrap.servers": kafka_bootstrap}, max_record_bytes=1_000_000)
    first, *others = [f"ends-many-{i}-{uuid.uuid4().hex[:6]}" for i in range(21)]
    for topic in (first, *others):
        manager.ensure_event_topic(topic)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for i, topic in enumerate(others):
        for _ in range(i):
            producer.produce(topic, b"x")
    assert producer.flush(30) == 0
    held = _HeldListOffsets(manager._admin)
    manager._admin = held
    answers: dict[str, dict[int, int]] = {}

    def ask(topic: str) -> None:
        answers[topic] = manager.end_offsets(topic)

    opener = threading.Thread(target=ask, args=(first,))
    opener.start()
    assert held.in_flight.wait(30)
    later = [threading.Thread(target=ask, args=(topic,)) for topic in others]
    held.release_once_queued(manager, later)
    for thread in (opener, *later):
        thread.join(30)
    assert answers == {first: {0: 0}, **{topic: {0: i} for i, topic in enumerate(others)}}
    # the opener's topic, then one request naming the twenty (not every topic of the cluster)
    assert held.metadata == [[first], sorted(others)]
    assert held.requests == [1, 20]


def test_end_offsets_of_many_topics_asked_together_end_within_one_timeout_when_no_broker_answers() -> None:
    """A batch of end-offsets keys asked a metadata request per topic, one after the other, each
    with the whole timeout: twenty tables resuming together against a broker that does not answer
    waited twenty timeouts, where each alone had waited one. Each caller now waits its own timeout
    at most, and a batch asks one metadata request for all its topics."""
    import socket
    import threading

    timeout_s, count = 1.0, 20
    with socket.socket() as silent:  # accepts connections (the kernel's backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)
        bootstrap = f"127.0.0.1:{silent.getsockname()[1]}"
        manager = TopicManager(
            {"bootstrap.servers": bootstrap}, max_record_bytes=1_000_000, timeout_s=timeout_s
        )
        real_describe_topics = manager._admin.describe_topics
        metadata_requests: list[list[str]] = []
        #: the time each request was given: what is left of its batch's one deadline
        request_timeouts: list[float] = []

        def describe_topics(topics: Any, *args: Any, **kwargs: Any) -> Any:
            metadata_requests.append(sorted(topics.topic_names))
            request_timeouts.append(kwargs["request_timeout"])
            return real_describe_topics(topics, *args, **kwargs)

        manager._admin.describe_topics = describe_topics  # counted, then asked of the real client
        topics = [f"silent-{i}-{uuid.uuid4().hex[:6]}" for i in range(count)]
        errors: dict[str, BaseException] = {}
        start = threading.Barrier(count)

        def ask(topic: str) -> None:
            start.wait(30)
            try:
                manager.end_offsets(topic)
            except BaseException as exc:
                errors[topic] = exc

        threads = [threading.Thread(target=ask, args=(topic,)) for topic in topics]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(count * timeout_s * 3)
    assert sorted(errors) == sorted(topics)
    for topic, error in errors.items():
        assert isinstance(error, KafkaError) and topic in str(error), error
    # one request per batch, not per topic (twenty requests of a whole timeout each, in turn) ...
    assert len(metadata_requests) < count / 2, metadata_requests
    # ... each given what is left of its batch's deadline, never more than a caller's own timeout
    assert request_timeouts and all(0 <= t <= timeout_s for t in request_timeouts), request_timeouts


def test_a_batch_queued_past_its_deadline_says_it_was_never_sent() -> None:
    """A batch of keys queued behind the request in flight can reach its deadline before its turn
    (the request before it answered late): it is then never sent, and its callers were told that
    the brokers did not answer, which sent whoever read it to look at the brokers. The error now
    says that the request was not asked, and how long it waited."""
    import threading
    import time

    from deltamirror.mirror.topics import _Batches

    sent: list[list[str]] = []
    batches: _Batches

    def send(items: list[str], deadline: float) -> dict[str, str]:
        sent.append(items)
        if items == ["first"]:  # answers late: once the batch queued behind it is past its deadline
            queued = threading.Event()
            while batches._open is None and not queued.wait(0.005):
                pass
            while time.monotonic() <= batches._open.deadline:
                queued.wait(0.005)
        return {item: f"answer of {item}" for item in items}

    batches = _Batches(
        send, lambda key, why: LookupError(f"{key}: {why or 'no answer in time'}"), one_in_flight=True
    )
    answers: dict[str, object] = {}
    first = threading.Thread(target=lambda: answers.setdefault("first", batches.ask("first", "first", 0.3)))
    first.start()
    while not sent:  # bounded by the thread's start: it sends at once, nothing being in flight
        first.join(0.005)
    with pytest.raises(LookupError) as missed:
        batches.ask("queued", "queued", 0.3)  # the same timeout, queued behind the held request
    first.join(30)
    assert answers == {"first": "answer of first"}
    assert sent == [["first"]]  # the queued batch was never sent ...
    assert "not asked: it waited" in str(missed.value)  # ... and its caller is told so
    assert "behind the request before it" in str(missed.value)
    assert batches.ask("after", "after", 30) == "answer of after"  # and the batcher still works


def test_keys_asked_together_share_one_batch_and_one_wait() -> None:
    """A table resuming asked its three topics' ends one after the other, twice: six waits for a
    shared request each. Asked together they join one batch (with whatever others asked
    meanwhile), and each key gets its own answer or its own refusal."""
    from deltamirror.mirror.topics import _Batches

    sent: list[list[str]] = []

    def send(items: list[str], deadline: float) -> dict[str, str]:
        sent.append(items)
        return {item: f"end of {item}" for item in items if item != "gone"}

    batches = _Batches(send, lambda key, why: LookupError(f"{key}: not answered"), one_in_flight=True)
    assert batches.ask_many({"actions": "actions", "commits": "commits", "progress": "progress"}, 30) == {
        "actions": "end of actions",
        "commits": "end of commits",
        "progress": "end of progress",
    }
    assert sent == [["actions", "commits", "progress"]]  # one request, asked once
    with pytest.raises(LookupError, match="gone: not answered"):
        batches.ask_many({"actions": "actions", "gone": "gone"}, 30)
    assert batches.ask("after", "after", 30) == "end of after"


def test_a_resume_waits_for_its_topics_ends_asked_together() -> None:
    """The wait for the transactions open on a table's topics asks all its topics' ends at once:
    once for the high watermarks, once a round for the stable offsets (each topic alone before)."""
    import threading

    from deltamirror.producer.publishing.hanging import wait_until_settled

    topics = ["t.actions", "t.commits", "t.progress"]
    stable = {"t.actions": {0: 3}, "t.commits": {0: 5}, "t.progress": {0: 7}}
    asked: list[tuple[tuple[str, ...], bool]] = []

    def many(names: Any, committed: bool) -> dict[str, dict[int, int]]:
        asked.append((tuple(names), committed))
        if not committed:
            return {"t.actions": {0: 4}, "t.commits": {0: 5}, "t.progress": {0: 7}}
        ends = {name: dict(stable[name]) for name in names}
        stable["t.actions"] = {0: 4}  # the transaction open on t.actions ends after the first look
        return ends

    def one(topic: str, committed: bool) -> dict[int, int]:
        raise AssertionError(f"{topic} asked alone")

    waited = wait_until_settled(
        one,
        topics,
        hang_after_s=60,
        stop=threading.Event(),
        on_hang=lambda held: None,
        on_clear=lambda held: None,
        poll_s=0.0,
        many=many,
    )
    assert waited
    assert asked == [(tuple(topics), False), (tuple(topics), True), (tuple(topics), True)]
