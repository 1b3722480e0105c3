"""Oversize records: split by the producer, joined by FragmentAssembler, which refuses gaps rather than guessing."""

from __future__ import annotations

import pytest

from deltamirror.mirror.errors import EventStreamError, RecordTooLargeError
from deltamirror.mirror.records.boundary import RecordLimits
from deltamirror.mirror.records.fragments import (
    MIN_FRAGMENT_BYTES,
    FragmentAssembler,
    FragmentError,
    KeyedFragments,
    split_oversize,
)
from deltamirror.mirror.records.headers import HEADER_FRAGMENT, Headers, action_headers, header_value


def _split(value: bytes, size: int) -> list[tuple[bytes, list[tuple[str, bytes]]]]:
    n = -(-len(value) // size)
    return [
        (value[i * size : (i + 1) * size], [("version", b"3"), (HEADER_FRAGMENT, f"{i}/{n}".encode())])
        for i in range(n)
    ]


def test_whole_records_pass_and_fragments_join() -> None:
    assembler = FragmentAssembler()
    assert assembler.feed(b'{"a":1}', [("version", b"1")]) == b'{"a":1}'
    big = b'{"metaData":"' + b"x" * 1000 + b'"}'
    out = [assembler.feed(v, h) for v, h in _split(big, 100)]
    assert out[:-1] == [None] * (len(out) - 1) and out[-1] == big
    assert assembler.feed(b"{}", None) == b"{}"


def test_a_missing_fragment_is_an_error() -> None:
    assembler = FragmentAssembler()
    parts = _split(b"0123456789", 3)
    assembler.feed(*parts[0])
    with pytest.raises(EventStreamError, match="out of order"):
        assembler.feed(*parts[2])
    assembler = FragmentAssembler()
    assembler.feed(*parts[0])
    with pytest.raises(FragmentError, match="cut short") as cut:
        assembler.feed(b"{}", [])
    assert cut.value.keeps_current  # the whole record itself was not refused
    assert not assembler.pending and assembler.feed(b"{}", []) == b"{}"


def test_a_record_of_more_fragments_than_a_reader_takes_is_refused_at_its_first() -> None:
    """``fragment: 0/999999``: refused at once, not gathered until memory runs out."""
    assembler = FragmentAssembler(RecordLimits(max_fragments=1000))
    with pytest.raises(FragmentError, match="999999 fragments"):
        assembler.feed(b"x" * 1000, [(HEADER_FRAGMENT, b"0/999999")])
    assert not assembler.pending
    assert [assembler.feed(v, h) for v, h in _split(b"0123456789", 5)] == [None, b"0123456789"]


def test_fragments_holding_more_bytes_than_a_reader_takes_are_refused_as_they_come() -> None:
    assembler = FragmentAssembler(RecordLimits(max_record_bytes=2500))
    parts = _split(b"y" * 5000, 1000)
    assert assembler.feed(*parts[0]) is None and assembler.feed(*parts[1]) is None
    with pytest.raises(FragmentError, match="3000 bytes"):
        assembler.feed(*parts[2])
    assert not assembler.pending


def test_fragments_waiting_longer_than_the_limit_are_overdue() -> None:
    now = [100.0]
    assembler = FragmentAssembler(RecordLimits(fragment_wait_s=5.0), clock=lambda: now[0])
    parts = _split(b"0123456789", 3)
    assembler.feed(*parts[0])
    now[0] += 5.0
    assert not assembler.overdue()
    now[0] += 0.1
    assert assembler.overdue()


def test_a_first_fragment_after_a_broken_one_may_start_again() -> None:
    assembler = FragmentAssembler()
    parts = _split(b"0123456789", 3)
    assembler.feed(*parts[0])
    with pytest.raises(FragmentError) as broken:
        assembler.feed(*parts[0])
    assert broken.value.keeps_current
    assert [assembler.feed(v, h) for v, h in parts] == [None, None, None, b"0123456789"]


@pytest.mark.parametrize("header", [b"garbage", b"1", b"x/2", b"0/x", b"\xff/2", b"0/0", b""])
def test_a_malformed_fragment_header_is_an_event_stream_error(header: bytes) -> None:
    """The header is read from the topic, untrusted: a bad one is refused, never a traceback."""
    with pytest.raises(EventStreamError):
        FragmentAssembler().feed(b"{}", [(HEADER_FRAGMENT, header)])


# --- split_oversize (the producer's half) ---------------------------------------------------------

LIMIT = 1024  # the least a value is split at (MIN_FRAGMENT_BYTES)


def _headers(n: int) -> list[Headers]:
    return [[("version", b"5"), ("index", str(i).encode()), ("type", b"add")] for i in range(n)]


def _fragment(headers: Headers) -> str | None:
    return header_value(headers, HEADER_FRAGMENT)


def test_values_within_the_limit_are_left_alone() -> None:
    values = [b"a" * LIMIT, b"{}", b""]  # a value of exactly the limit is not larger than it
    headers = _headers(3)
    out_v, out_h = split_oversize(values, headers, LIMIT, "split", topic="t", version=5, index=0)
    assert out_v == values and list(out_h) == _headers(3)
    out_v, out_h = split_oversize(values, headers, LIMIT, "fail", topic="t", version=5, index=0)
    assert out_v == values and list(out_h) == _headers(3)
    assert split_oversize([], [], LIMIT, "fail") == ([], [])


@pytest.mark.parametrize("size", [LIMIT + 1, 2 * LIMIT, 2 * LIMIT + 1, 10 * LIMIT + 999])
def test_a_larger_value_becomes_fragments_with_its_headers_and_a_fragment_header(size: int) -> None:
    big = bytes(i % 251 for i in range(size))
    values = [b'{"small":1}', big, b'{"small":2}']
    out_v, out_h = split_oversize(values, _headers(3), LIMIT, "split", topic="t", version=5, index=0)
    out_headers = list(out_h)
    assert len(out_v) == len(out_headers)
    assert (out_v[0], out_headers[0]) == (values[0], _headers(3)[0])
    assert (out_v[-1], out_headers[-1]) == (values[2], _headers(3)[2])
    fragments, fragment_headers = out_v[1:-1], out_headers[1:-1]
    n = len(fragments)
    assert n >= 2 and all(0 < len(f) <= LIMIT for f in fragments)  # max_record_bytes bounds a value
    assert b"".join(fragments) == big  # "concatenate the values of fragments 0 ... n-1 in order"
    # "the same key and headers ... each with a fragment header "<j>/<n>" (j 0-based)"
    assert [_fragment(h) for h in fragment_headers] == [f"{j}/{n}" for j in range(n)]
    for h in fragment_headers:
        assert [x for x in h if x[0] != HEADER_FRAGMENT] == _headers(3)[1]
        assert sum(1 for x in h if x[0] == HEADER_FRAGMENT) == 1


def test_split_records_are_joined_back_into_the_values() -> None:
    values = [b"x" * 3500, b"{}", b"y" * (LIMIT + 1), b"z" * LIMIT, b"w" * 5 * LIMIT]
    headers = action_headers(("version", b"9"), 0, [("add", None)] * len(values), [])  # an iterator
    out_v, out_h = split_oversize(values, headers, LIMIT, "split", topic="t", version=9, index=0)
    assembler = FragmentAssembler()
    joined = [assembler.feed(v, h) for v, h in zip(out_v, out_h, strict=True)]
    assert [j for j in joined if j is not None] == values


def test_the_fail_policy_names_topic_table_version_and_the_index_of_the_value() -> None:
    values = [b"{}", b"{}", b"a" * (LIMIT + 1), b"b" * (LIMIT + 5)]
    with pytest.raises(RecordTooLargeError) as err:
        split_oversize(
            values,
            _headers(4),
            LIMIT,
            "fail",
            topic="deltamirror.t.actions",
            table="file:///t",
            version=5,
            index=40,
        )
    error = err.value
    text = str(error)
    # the first of the values is action 40 of the version: the first too large is action 42
    assert error.table == "file:///t" and error.version == 5 and error.context["index"] == 42
    assert (
        "deltamirror.t.actions" in text and "file:///t" in text and "version=5" in text and "index=42" in text
    )
    assert str(LIMIT + 1) in text and str(LIMIT) in text
    assert error.exit_code == 2


# --- many keys on one partition (a topic shared by many tables) ----------------------------------


def _keyed(value: bytes, size: int) -> list[tuple[bytes, list[tuple[str, bytes]]]]:
    return [(v, h) for v, h in _split(value, size)]


def test_fragments_of_keys_interleaved_on_one_partition_are_each_joined_whole() -> None:
    """On a shared topic another table's records come between a record's fragments: each key's
    record is joined on its own, and the oldest record in part bounds where a reader may resume."""
    joiner = KeyedFragments()
    a, b = b"a" * 25, b"b" * 15
    pa_, pb = _keyed(a, 10), _keyed(b, 10)
    where = ("t", 0)
    order = [
        (b"A", pa_[0]),
        (b"B", pb[0]),
        (b"C", (b"{}", [])),
        (b"A", pa_[1]),
        (b"B", pb[1]),
        (b"A", pa_[2]),
    ]
    out, starts = [], []
    for offset, (key, (value, headers)) in enumerate(order):
        out.append(joiner.feed(where, key, offset, value, headers))
        starts.append(joiner.starts())
    assert out == [None, None, (b"{}", 2), None, (b, 1), (a, 0)]
    assert starts == [{where: 0}] * 5 + [{}]
    assert len(joiner) == 0 and joiner.held_bytes == 0 and where not in joiner


def test_forged_or_incomplete_fragments_are_refused_per_key_naming_topic_partition_offset() -> None:
    joiner = KeyedFragments()
    where = ("shared.actions", 3)
    parts = _keyed(b"x" * 30, 10)
    joiner.feed(where, b"A", 10, *parts[0])
    # another key's fragment out of order: refused at its own offset; A's record is still joined
    with pytest.raises(FragmentError, match="out of order") as orphan:
        joiner.feed(where, b"B", 11, *parts[1])
    assert orphan.value.context == {"table_id": "B", "topic": "shared.actions", "partition": 3, "offset": 11}
    assert joiner.feed(where, b"A", 12, *parts[1]) is None
    # a whole record of A before A's last fragment: A's record is refused at its first fragment
    with pytest.raises(FragmentError, match="cut short") as cut:
        joiner.feed(where, b"A", 13, b"{}", [])
    assert cut.value.keeps_current and cut.value.context["offset"] == 10
    assert joiner.feed(where, b"A", 13, b"{}", []) == (b"{}", 13)
    # the partition ends with records in part: each refused, oldest first
    joiner.feed(where, b"B", 14, *parts[0])
    joiner.feed(where, b"A", 15, *parts[0])
    joiner.feed(("other", 0), b"A", 1, *parts[0])
    refused = joiner.cut_short(where, "the partition ends")
    assert [(e.context["offset"], e.context["table_id"]) for e in refused] == [(14, "B"), (15, "A")]
    assert all("cut short" in str(e) and "topic=shared.actions" in str(e) for e in refused)
    assert joiner.starts() == {("other", 0): 1}


def test_what_all_keys_hold_in_part_is_bounded_in_total() -> None:
    parts = _keyed(b"x" * 30, 10)
    where = ("t", 0)
    few = KeyedFragments(RecordLimits(max_pending_records=2))
    few.feed(where, b"A", 0, *parts[0])
    few.feed(where, b"B", 1, *parts[0])
    with pytest.raises(FragmentError, match="max_pending_records 2") as many:
        few.feed(where, b"C", 2, *parts[0])
    assert many.value.context["offset"] == 2 and len(few) == 2
    assert few.feed(where, b"A", 3, *parts[1]) is None  # the others' go on

    small = KeyedFragments(RecordLimits(max_pending_bytes=25))
    small.feed(where, b"A", 0, *parts[0])
    small.feed(where, b"B", 1, *parts[0])
    with pytest.raises(FragmentError, match="max_pending_bytes 25") as full:
        small.feed(where, b"A", 2, *parts[1])
    assert full.value.context["offset"] == 0 and full.value.context["table_id"] == "A"
    assert small.held_bytes == 10 and small.starts() == {where: 1}  # A's fragments are let go
    assert small.feed(where, b"B", 3, *parts[1]) is None
    with pytest.raises(FragmentError, match="max_pending_bytes 25"):  # B's record is 30 bytes
        small.feed(where, b"B", 4, *parts[2])
    assert small.held_bytes == 0 and len(small) == 0
    short = _keyed(b"y" * 20, 10)
    assert small.feed(where, b"C", 5, *short[0]) is None
    assert small.feed(where, b"C", 6, *short[1]) == (b"y" * 20, 5)


def test_a_record_in_part_too_long_is_refused_per_key() -> None:
    now = [0.0]
    joiner = KeyedFragments(RecordLimits(fragment_wait_s=5.0), clock=lambda: now[0])
    parts = _keyed(b"x" * 30, 10)
    joiner.feed(("t", 0), b"A", 7, *parts[0])
    now[0] = 3.0
    joiner.feed(("t", 0), b"B", 8, *parts[0])
    now[0] = 6.0
    (late,) = joiner.overdue()
    assert late.context["offset"] == 7 and "waited 5 s" in str(late)
    assert joiner.starts() == {("t", 0): 8}


@pytest.mark.kafka
def test_the_default_fragment_wait_outlasts_every_transaction_the_broker_lets_a_producer_open(
    kafka_bootstrap: str,
) -> None:
    """A record's fragments that another producer's open transaction splits are seen whole only
    once that transaction ends, which the broker forces within its ``transaction.max.timeout.ms``
    (a producer asking a longer transaction timeout is refused): the default wait (it was 60 s, and
    cut such records short) is longer than that bound, read from the broker."""
    import uuid

    from confluent_kafka import KafkaError, KafkaException, Producer
    from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    brokers = admin.list_topics(timeout=30).brokers
    resource = ConfigResource(ResourceType.BROKER, str(min(brokers)))
    config = admin.describe_configs([resource])[resource].result(30)
    max_timeout_ms = int(config["transaction.max.timeout.ms"].value)
    wait_s = RecordLimits().fragment_wait_s
    assert wait_s * 1000 > max_timeout_ms, (wait_s, max_timeout_ms)

    # the bound is the broker's: no transaction may stay open as long as the default wait
    producer = Producer(
        {
            "bootstrap.servers": kafka_bootstrap,
            "transactional.id": f"fragment-wait-{uuid.uuid4().hex[:8]}",
            "transaction.timeout.ms": str(int(wait_s * 1000)),
        }
    )
    with pytest.raises(KafkaException) as refused:
        producer.init_transactions(30)
    assert refused.value.args[0].code() == KafkaError.INVALID_TRANSACTION_TIMEOUT


def test_no_value_is_split_below_the_least_fragment_size() -> None:
    """Readers take a record shorter than MIN_FRAGMENT_BYTES as whole (its headers unread) when its
    key holds no record in part: a split into shorter fragments is never written."""
    with pytest.raises(ValueError, match="1024"):
        split_oversize([b"x" * 2000], _headers(1), MIN_FRAGMENT_BYTES - 1, "split", topic="t")
    with pytest.raises(RecordTooLargeError):  # the fail policy writes no fragment: any limit
        split_oversize([b"x" * 2000], _headers(1), 100, "fail", topic="t")
