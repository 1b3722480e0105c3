"""MirrorConsumer against the session's real broker: the end of a partition, transactions, fragments, stop.

Records are written here with confluent-kafka's own producer (transactional where the test needs
markers), so what the reader must see follows from Kafka's rules alone: on one partition a
transaction of ``n`` records takes ``n`` offsets and its commit or abort marker one more, and a
``read_committed`` reader never sees an aborted record.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from deltamirror.mirror.errors import EventStreamError, KafkaError, StopRequested, TopicNotFoundError
from deltamirror.mirror.kafka.consumer import BEGINNING, MirrorConsumer, Record
from deltamirror.mirror.records.fragments import MIN_FRAGMENT_BYTES, split_oversize
from deltamirror.mirror.records.headers import HEADER_FRAGMENT, Headers
from support.kafka import new_topic, wait_settled

pytestmark = pytest.mark.kafka

#: every read to the end in these tests is bounded: a reader that never finds the end fails, not hangs
READ_S = 60.0


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def _kafka(bootstrap: str) -> dict[str, Any]:
    return {"bootstrap.servers": bootstrap}


def _plain_producer(bootstrap: str) -> Producer:
    return Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})


def _transactional_producer(bootstrap: str) -> Producer:
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": _name("txn"), "linger.ms": 0})
    producer.init_transactions(30)
    return producer


def _transaction(
    bootstrap: str, producer: Producer, topic: str, values: list[bytes], *, commit: bool
) -> None:
    producer.begin_transaction()
    for value in values:
        producer.produce(topic, value, b"k", partition=0)
    producer.flush(30)
    if commit:
        producer.commit_transaction(30)
    else:
        producer.abort_transaction(30)
    wait_settled(bootstrap, topic)


def _read_to_end(bootstrap: str, topic: str, **kw: Any) -> list[Record]:
    with MirrorConsumer(_kafka(bootstrap), purpose="test") as consumer:
        partitions = consumer.partitions(topic)
        assert partitions is not None
        consumer.assign((topic, p, kw.pop("offset", None)) for p in partitions)
        return [r for batch in consumer.batches(until_end=True, timeout_s=READ_S, **kw) for r in batch]


@pytest.fixture
def topic(kafka_bootstrap: str) -> Iterator[str]:
    yield new_topic(kafka_bootstrap, _name("mc"))


# --- the end of a partition ---------------------------------------------------------------------


def test_reads_every_partition_to_its_end_in_order(kafka_bootstrap: str) -> None:
    topic = new_topic(kafka_bootstrap, _name("mc3"), partitions=3)
    producer = _plain_producer(kafka_bootstrap)
    sent: dict[int, list[tuple[bytes, bytes, Headers, int]]] = {0: [], 1: []}
    for i in range(25):
        partition = i % 2  # partition 2 stays empty: its end is its beginning
        headers: Headers = [("version", str(i).encode())]
        key, value, ts = f"key-{i}".encode(), f'{{"n":{i}}}'.encode(), 1_700_000 + i
        producer.produce(topic, value, key, partition=partition, headers=headers, timestamp=ts)
        sent[partition].append((key, value, headers, ts))
    assert producer.flush(30) == 0

    got = _read_to_end(kafka_bootstrap, topic, max_records=4)
    for partition, records in sent.items():
        mine = [r for r in got if r.partition == partition]
        assert [(r.key, r.value, r.headers, r.timestamp_ms) for r in mine] == records
        assert [r.offset for r in mine] == list(range(len(records)))
        assert all(r.first_offset == r.offset and r.topic == topic for r in mine)
        assert [r.header("version") for r in mine] == [str(i) for i in range(partition, 25, 2)]
    assert len(got) == 25


def test_an_empty_topic_is_at_its_end_at_once(kafka_bootstrap: str, topic: str) -> None:
    started = time.monotonic()
    assert _read_to_end(kafka_bootstrap, topic) == []
    assert time.monotonic() - started < 20


@pytest.mark.parametrize(
    "transactions",
    [
        [("commit", 3)],
        [("commit", 3), ("abort", 2)],
        [("abort", 4)],
        [("commit", 2), ("abort", 3), ("commit", 2)],
        [("abort", 1), ("abort", 2), ("commit", 1), ("abort", 3)],
    ],
    ids=["committed-marker-last", "aborted-last", "only-aborted", "aborted-between", "many"],
)
def test_the_end_is_found_behind_transaction_markers_and_aborted_records(
    kafka_bootstrap: str, topic: str, transactions: list[tuple[str, int]]
) -> None:
    producer = _transactional_producer(kafka_bootstrap)
    expected: list[tuple[int, bytes]] = []
    offset = 0
    for t, (outcome, n) in enumerate(transactions):
        values = [f"{outcome}-{t}-{i}".encode() for i in range(n)]
        _transaction(kafka_bootstrap, producer, topic, values, commit=outcome == "commit")
        if outcome == "commit":
            expected += [(offset + i, v) for i, v in enumerate(values)]
        offset += n + 1  # the records, then the transaction's marker
    got = _read_to_end(kafka_bootstrap, topic)
    assert [(r.offset, r.value) for r in got] == expected
    assert not any(r.value.startswith(b"abort") for r in got)
    # read again from the offset after the last committed record: nothing, and the end is found
    last = expected[-1][0] + 1 if expected else 0
    assert _read_to_end(kafka_bootstrap, topic, offset=last) == []


def test_a_read_from_the_end_ends_when_the_end_is_reported(kafka_bootstrap: str, topic: str) -> None:
    """A restart with nothing new: the partition's log holds nothing past the end librdkafka
    reports (the last transaction's markers are written), so the end is final when reported.
    consume() itself returns only when its batch is full or its timeout passed: a read that asked
    it for ``poll_s`` waited that long after the end was known (50 ms of every restart); with a
    poll of an hour, this read must still end."""
    producer = _transactional_producer(kafka_bootstrap)
    _transaction(kafka_bootstrap, producer, topic, [b"a", b"b"], commit=True)  # settled: LSO == HWM
    got: list[list[Record]] = []
    reader = threading.Thread(
        target=lambda: got.append(_read_to_end(kafka_bootstrap, topic, offset=3, poll_s=3600.0)), daemon=True
    )
    reader.start()
    reader.join(READ_S)
    assert not reader.is_alive(), "the read to the end waited out its poll after the end was reported"
    assert got == [[]]


def test_the_end_is_the_start_of_a_transaction_still_open(kafka_bootstrap: str, topic: str) -> None:
    """A read_committed reader stops at the last stable offset: what an open transaction wrote is not
    there yet, and waiting for it would hold up every reader of the topic."""
    producer = _transactional_producer(kafka_bootstrap)
    _transaction(kafka_bootstrap, producer, topic, [b"a", b"b"], commit=True)
    producer.begin_transaction()
    producer.produce(topic, b"open", b"k", partition=0)
    producer.flush(30)
    try:
        got = _read_to_end(kafka_bootstrap, topic)
        assert [(r.offset, r.value) for r in got] == [(0, b"a"), (1, b"b")]
    finally:
        producer.abort_transaction(30)


# --- fragments ------------------------------------------------------------------------------------


def _publish_with_a_split_record(bootstrap: str, topic: str) -> tuple[bytes, list[bytes]]:
    big = b'{"metaData":"' + bytes(ord("a") + i % 26 for i in range(3500)) + b'"}'
    values = [b'{"i":0}', big, b'{"i":2}']
    headers: list[Headers] = [[("version", b"4"), ("index", str(i).encode())] for i in range(3)]
    out_v, out_h = split_oversize(values, headers, 1024, "split", topic=topic, version=4, index=0)
    producer = _transactional_producer(bootstrap)
    producer.begin_transaction()
    for v, h in zip(out_v, out_h, strict=True):
        producer.produce(topic, v, b"table-id", partition=0, headers=h, timestamp=1_234)
    producer.flush(30)
    producer.commit_transaction(30)
    wait_settled(bootstrap, topic)
    return big, out_v


def test_a_test_topic_keeps_records_of_any_age(kafka_bootstrap: str, topic: str) -> None:
    """The fragment tests below write records stamped 1970 (``timestamp=1_234``). Their topics
    had the broker's default 7-day retention, and when its retention check (every 5 minutes) ran
    between a write and the read back, the read was empty: the records were deleted. Topics made
    for tests keep every record, as the watcher's own event topics do (``retention.ms=-1``)."""
    from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

    resource = ConfigResource(ResourceType.TOPIC, topic)
    admin = AdminClient(_kafka(kafka_bootstrap))  # held: a client collected mid-request ends it
    config = admin.describe_configs([resource])[resource].result(timeout=30)
    assert config["retention.ms"].value == "-1"
    assert config["retention.bytes"].value == "-1"


@pytest.mark.parametrize("max_records", [1, 2, 1000])
def test_fragments_come_back_as_one_record_with_the_offsets_of_both_ends(
    kafka_bootstrap: str, topic: str, max_records: int
) -> None:
    big, sent = _publish_with_a_split_record(kafka_bootstrap, topic)
    fragments = len(sent) - 2
    assert fragments >= 4  # 3500+ bytes in pieces of at most 1024
    got = _read_to_end(kafka_bootstrap, topic, max_records=max_records)
    assert [r.value for r in got] == [b'{"i":0}', big, b'{"i":2}']
    # the split record's fragments took offsets 1 .. fragments; the last whole record the next one
    assert [(r.first_offset, r.offset) for r in got] == [
        (0, 0),
        (1, fragments),
        (fragments + 1, fragments + 1),
    ]
    assert all(r.key == b"table-id" and r.timestamp_ms == 1_234 for r in got)
    assert [r.header("version") for r in got] == ["4", "4", "4"]
    assert [r.header("index") for r in got] == ["0", "1", "2"]


@pytest.mark.parametrize("max_records", [1, 1000])
def test_a_batch_s_columns_are_those_of_its_records_joined_or_not(
    kafka_bootstrap: str, topic: str, max_records: int
) -> None:
    """A reader that takes a batch in columns (the snapshot consumer) sees what it would see record
    by record: batches with a joined record and batches of the client's messages alone."""
    _publish_with_a_split_record(kafka_bootstrap, topic)
    with MirrorConsumer(_kafka(kafka_bootstrap), purpose="test") as consumer:
        consumer.assign([(topic, 0, None)])
        batches = list(consumer.batches(until_end=True, timeout_s=READ_S, max_records=max_records))
    assert sum(map(len, batches)) == 3
    for batch in batches:
        records = list(batch)
        assert batch.topics() == [r.topic for r in records] == [topic] * len(batch)
        assert batch.partitions() == [r.partition for r in records]
        assert batch.offsets() == [r.offset for r in records]
        assert batch.first_offsets() == [r.first_offset for r in records]
        assert batch.values() == [r.value for r in records]
        assert batch.keys() == [r.key for r in records] == [b"table-id"] * len(batch)
    firsts = [o for batch in batches for o in batch.first_offsets()]
    offsets = [o for batch in batches for o in batch.offsets()]
    assert firsts[:2] == [0, 1] and offsets[1] > 1  # the joined record starts at its first fragment


def test_a_read_that_starts_inside_a_split_record_is_an_event_stream_error(
    kafka_bootstrap: str, topic: str
) -> None:
    _publish_with_a_split_record(kafka_bootstrap, topic)
    with pytest.raises(EventStreamError, match="fragment"):
        _read_to_end(kafka_bootstrap, topic, offset=2)  # the second fragment of the split record


def test_a_record_shorter_than_any_first_fragment_is_whole_whatever_its_headers(
    kafka_bootstrap: str, topic: str
) -> None:
    """Every fragment but a record's last is at least MIN_FRAGMENT_BYTES long (the least a value is
    split at): a shorter record whose key holds no record in part is whole, its headers not read
    (a forged ``fragment`` header on it changes nothing: it is checked as the whole record it is),
    while a short last fragment of a record in part is still joined to it."""
    producer = _transactional_producer(kafka_bootstrap)
    first = b"a" * MIN_FRAGMENT_BYTES
    producer.begin_transaction()
    for value, fragment in [(b'{"i":0}', b"0/2"), (b'{"i":1}', b"1/2"), (first, b"0/2"), (b"z", b"1/2")]:
        producer.produce(topic, value, b"k", partition=0, headers=[(HEADER_FRAGMENT, fragment)])
    producer.flush(30)
    producer.commit_transaction(30)
    wait_settled(kafka_bootstrap, topic)
    got = _read_to_end(kafka_bootstrap, topic)
    assert [(r.value, r.first_offset, r.offset) for r in got] == [
        (b'{"i":0}', 0, 0),
        (b'{"i":1}', 1, 1),
        (first + b"z", 2, 3),
    ]
    assert got[0].header(HEADER_FRAGMENT) == "0/2"  # kept as it came: the reader judged its length


def test_fragments_split_over_transactions_are_joined(kafka_bootstrap: str, topic: str) -> None:
    """A whole record may follow its fragments' transaction: the reader keeps them until the last."""
    producer = _transactional_producer(kafka_bootstrap)
    a, c = b"a" * MIN_FRAGMENT_BYTES, b"c" * MIN_FRAGMENT_BYTES  # fragments but a record's last: 1024+ bytes
    parts = [(a, b"0/3"), (c, b"1/3"), (b"ef", b"2/3")]
    for value, fragment in parts:
        producer.begin_transaction()
        producer.produce(topic, value, b"k", partition=0, headers=[(HEADER_FRAGMENT, fragment)])
        producer.flush(30)
        producer.commit_transaction(30)
    wait_settled(kafka_bootstrap, topic)
    got = _read_to_end(kafka_bootstrap, topic)
    # three one-record transactions: records at 0, 2, 4 (markers at 1, 3, 5)
    assert [(r.value, r.first_offset, r.offset) for r in got] == [(a + c + b"ef", 0, 4)]


def test_a_committed_record_whose_fragments_another_open_transaction_splits_is_waited_for(
    kafka_bootstrap: str, topic: str
) -> None:
    """On a topic shared by many tables another producer's transaction may open between a record's
    fragments. Once the record's transaction commits, a read_committed reader sees its first
    fragment (below the last stable offset) and the rest only when the other transaction ends: the
    partition's end then comes with records past it, and the record is not cut short there (it
    was refused as "a record cut short" before, dropped or stopping the reader); it comes whole
    once the other transaction ends."""
    table_a, table_b = _transactional_producer(kafka_bootstrap), _transactional_producer(kafka_bootstrap)
    table_a.begin_transaction()
    first = b"a" * MIN_FRAGMENT_BYTES  # a fragment but a record's last: 1024+ bytes
    table_a.produce(topic, first, b"table-a", partition=0, headers=[(HEADER_FRAGMENT, b"0/2")])
    table_a.flush(30)
    table_b.begin_transaction()
    table_b.produce(topic, b"other", b"table-b", partition=0)
    table_b.flush(30)
    table_a.produce(topic, b"cd", b"table-a", partition=0, headers=[(HEADER_FRAGMENT, b"1/2")])
    table_a.flush(30)
    table_a.commit_transaction(30)
    try:
        with MirrorConsumer(_kafka(kafka_bootstrap), purpose="test") as consumer:
            consumer.assign([(topic, 0, None)])
            # the end is table-b's open transaction, its first offset: table-a's first fragment only
            assert [r for b in consumer.batches(until_end=True, timeout_s=READ_S) for r in b] == []
            assert consumer.fragment_starts() == {(topic, 0): 0}
            table_b.commit_transaction(30)
            wait_settled(kafka_bootstrap, topic)
            got = [r for b in consumer.batches(until_end=True, timeout_s=READ_S) for r in b]
    finally:
        with contextlib.suppress(Exception):
            table_b.abort_transaction(30)
    assert [(r.key, r.value, r.first_offset, r.offset) for r in got] == [
        (b"table-b", b"other", 1, 1),
        (b"table-a", first + b"cd", 0, 2),
    ]


# --- topics that do not exist ---------------------------------------------------------------------


def test_a_missing_topic_is_a_topic_not_found_error(kafka_bootstrap: str) -> None:
    missing = _name("missing")
    with MirrorConsumer(_kafka(kafka_bootstrap)) as consumer, pytest.raises(TopicNotFoundError) as err:
        consumer.partitions(missing, timeout_s=10)
    assert err.value.exit_code == 2
    assert missing in str(err.value)


def test_waiting_for_a_topic_ends_when_stop_is_set(kafka_bootstrap: str) -> None:
    stop = threading.Event()
    stop.set()
    with MirrorConsumer(_kafka(kafka_bootstrap)) as consumer:
        assert consumer.partitions(_name("missing"), wait_for_topic=True, stop=stop) is None
        with pytest.raises(StopRequested):
            consumer.partitions(_name("missing"), stop=stop)

        later = threading.Event()
        timer = threading.Timer(1.5, later.set)
        timer.start()
        started = time.monotonic()
        try:
            assert consumer.partitions(_name("missing"), wait_for_topic=True, stop=later) is None
        finally:
            timer.cancel()
        assert 1.4 <= time.monotonic() - started < 15


def test_waiting_for_a_topic_returns_its_partitions_once_it_exists(kafka_bootstrap: str) -> None:
    name = _name("later")
    stop = threading.Event()
    creator = threading.Timer(1.0, lambda: new_topic(kafka_bootstrap, name, partitions=2))
    creator.start()
    guard = threading.Timer(60, stop.set)
    guard.start()
    try:
        with MirrorConsumer(_kafka(kafka_bootstrap)) as consumer:
            assert consumer.partitions(name, wait_for_topic=True, stop=stop) == [0, 1]
    finally:
        creator.join()
        guard.cancel()
    assert not stop.is_set()


# --- stop -----------------------------------------------------------------------------------------


def test_stop_set_during_a_read_to_the_end_raises_stop_requested(kafka_bootstrap: str, topic: str) -> None:
    producer = _plain_producer(kafka_bootstrap)
    for i in range(100):
        producer.produce(topic, str(i).encode(), partition=0)
    assert producer.flush(30) == 0
    stop = threading.Event()
    seen: list[Record] = []
    with MirrorConsumer(_kafka(kafka_bootstrap)) as consumer:
        consumer.assign([(topic, 0, None)])
        with pytest.raises(StopRequested):
            for batch in consumer.batches(until_end=True, stop=stop, timeout_s=READ_S, max_records=5):
                seen += batch
                stop.set()
    assert 0 < len(seen) <= 5


def test_a_continuous_read_yields_quiet_batches_sees_new_records_and_returns_on_stop(
    kafka_bootstrap: str, topic: str
) -> None:
    producer = _plain_producer(kafka_bootstrap)
    for value in (b"1", b"2", b"3"):
        producer.produce(topic, value, partition=0)
    assert producer.flush(30) == 0
    stop = threading.Event()
    seen: list[bytes] = []
    empty_after_all = 0
    more_sent = False
    deadline = time.monotonic() + READ_S
    with MirrorConsumer(_kafka(kafka_bootstrap), fetch_wait_max_ms=None) as consumer:
        consumer.assign([(topic, 0, None)])
        for batch in consumer.batches(until_end=False, stop=stop, poll_s=0.05):
            assert time.monotonic() < deadline, f"still reading after {READ_S} s: {seen}"
            seen += [r.value for r in batch]
            if len(seen) == 3 and not more_sent:
                for value in (b"4", b"5"):
                    producer.produce(topic, value, partition=0)
                assert producer.flush(30) == 0
                more_sent = True
            if len(seen) == 5 and not batch:
                empty_after_all += 1
                if empty_after_all == 3:
                    stop.set()  # the loop returns at its next turn: no exception, nothing more
    assert seen == [b"1", b"2", b"3", b"4", b"5"]
    assert empty_after_all == 3


# --- the prefetch queue ---------------------------------------------------------------------------


def test_a_reader_bounds_its_prefetch_queue_and_the_cluster_settings_take_precedence(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """librdkafka's prefetch queue (64 MB by default, and a 1 s back-off once full) is bounded by
    FETCH_QUEUE_BOUNDS, and its first connection to a named broker held back for 10 ms, not 50
    (FIRST_CONNECTION), in every reader's client; a ``kafka`` setting of the cluster's overrides them."""
    from deltamirror.mirror.kafka import clients
    from deltamirror.mirror.kafka.consumer import FETCH_QUEUE_BOUNDS, FIRST_CONNECTION

    made: list[dict[str, Any]] = []
    real = clients.consumer
    monkeypatch.setattr(clients, "consumer", lambda config: made.append(dict(config)) or real(config))
    MirrorConsumer({"bootstrap.servers": "127.0.0.1:9"}).close(0.5)
    MirrorConsumer(
        {
            "bootstrap.servers": "127.0.0.1:9",
            "queued.max.messages.kbytes": 65_536,
            "reconnect.backoff.ms": 100,
        },
        fetch_wait_max_ms=None,
    ).close(0.5)
    assert FETCH_QUEUE_BOUNDS["queued.max.messages.kbytes"] <= 16_384
    assert {k: made[0][k] for k in FETCH_QUEUE_BOUNDS} == FETCH_QUEUE_BOUNDS
    assert made[1]["queued.max.messages.kbytes"] == 65_536
    assert made[1]["fetch.queue.backoff.ms"] == FETCH_QUEUE_BOUNDS["fetch.queue.backoff.ms"]
    assert FIRST_CONNECTION["reconnect.backoff.ms"] <= 22  # librdkafka waits half of it, at least 11 ms
    assert made[0]["reconnect.backoff.ms"] == FIRST_CONNECTION["reconnect.backoff.ms"]
    assert made[1]["reconnect.backoff.ms"] == 100


# --- offsets of a group -----------------------------------------------------------------------------


def test_store_offsets_needs_a_group_id(kafka_bootstrap: str, topic: str) -> None:
    with MirrorConsumer(_kafka(kafka_bootstrap)) as consumer, pytest.raises(ValueError, match="group_id"):
        consumer.store_offsets({(topic, 0): 1})


def _committed(bootstrap: str, group: str, parts: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        found = consumer.committed([TopicPartition(t, p) for t, p in parts], timeout=30)
        return {(tp.topic, tp.partition): tp.offset for tp in found}
    finally:
        consumer.close()


def test_stored_offsets_are_committed_to_the_group_on_close(kafka_bootstrap: str) -> None:
    topic = new_topic(kafka_bootstrap, _name("grp"), partitions=2)
    producer = _plain_producer(kafka_bootstrap)
    for i in range(7):
        producer.produce(topic, str(i).encode(), partition=i % 2)  # 4 on partition 0, 3 on 1
    assert producer.flush(30) == 0
    group = _name("group")
    consumer = MirrorConsumer(_kafka(kafka_bootstrap), group_id=group)
    try:
        consumer.assign([(topic, 0, None), (topic, 1, None)])
        got = [r for b in consumer.batches(until_end=True, timeout_s=READ_S) for r in b]
        assert len(got) == 7
        # processed: all of partition 0, the first record of partition 1 (goes on at offset 1)
        consumer.store_offsets({(topic, 0): 4, (topic, 1): 1})
    finally:
        consumer.close()
    assert _committed(kafka_bootstrap, group, [(topic, 0), (topic, 1)]) == {(topic, 0): 4, (topic, 1): 1}


# --- offsets by time --------------------------------------------------------------------------------


def test_offset_for_time_is_the_first_record_at_or_after_it(kafka_bootstrap: str, topic: str) -> None:
    producer = _plain_producer(kafka_bootstrap)
    for ts in (1_000, 2_000, 3_000):
        producer.produce(topic, str(ts).encode(), partition=0, timestamp=ts)
    assert producer.flush(30) == 0
    with MirrorConsumer(_kafka(kafka_bootstrap)) as consumer:
        assert consumer.offset_for_time(topic, 0, 0) == 0
        assert consumer.offset_for_time(topic, 0, 2_000) == 1
        assert consumer.offset_for_time(topic, 0, 2_001) == 2
        assert consumer.offset_for_time(topic, 0, -5) == 0
        assert consumer.offset_for_time(topic, 0, 3_001) == BEGINNING  # none at or after: documented


def test_a_broker_that_does_not_answer_is_a_kafka_error() -> None:
    unreachable = {"bootstrap.servers": "127.0.0.1:1"}
    with MirrorConsumer(unreachable) as consumer, pytest.raises(KafkaError) as err:
        consumer.partitions("any", timeout_s=1.5)
    assert err.value.exit_code == 1
