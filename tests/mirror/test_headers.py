"""The headers of the mirror's records, as docs/events.md says: ASCII text, version/index/type on actions."""

from __future__ import annotations

from typing import Any

import pytest

from deltamirror.mirror.errors import EventStreamError
from deltamirror.mirror.records.headers import action_headers, header_value

VERSION_7 = ("version", b"7")


def _expected(version: bytes, start: int, types: list[str], extra: list[Any] = []) -> list[list[Any]]:  # noqa: B006
    """What the contract asks, written out: version, index, type (all as text), then ``extra``."""
    return [
        [("version", version), ("index", str(start + i).encode()), ("type", t.encode()), *extra]
        for i, t in enumerate(types)
    ]


def _batch(types: list[str]) -> list[tuple[str, Any]]:
    return [(t, {"n": i}) for i, t in enumerate(types)]


def test_each_action_gets_its_version_index_and_type() -> None:
    types = ["commitInfo", "protocol", "metaData", "add", "add", "remove"]
    got = list(action_headers(VERSION_7, 0, _batch(types), []))
    assert got == _expected(b"7", 0, types)
    assert all(isinstance(h, list) for h in got)


@pytest.mark.parametrize("start", [1, 4090, 4094, 4095, 4096, 10_000, 1_234_567])
def test_indexes_past_the_first_4096_are_written_like_the_rest(start: int) -> None:
    types = ["add", "remove", "cdc", "add", "txn", "add"]
    got = list(action_headers(("version", b"123456"), start, _batch(types), []))
    assert got == _expected(b"123456", start, types)


def test_extra_headers_follow_on_every_record() -> None:
    extra: list[tuple[str, str | bytes | None]] = [("clampedFrom", b"1700000000000"), ("other", "x")]
    types = ["add", "remove"]
    assert list(action_headers(VERSION_7, 3, _batch(types), extra)) == _expected(b"7", 3, types, extra)


def test_types_delta_does_not_define_yet_are_carried_as_text() -> None:
    types = ["add", "someNewAction", "add", "anotherOne_v2"]
    assert list(action_headers(VERSION_7, 0, _batch(types), [])) == _expected(b"7", 0, types)
    # a second batch of the now known types gives the same headers
    assert list(action_headers(VERSION_7, 4, _batch(types), [])) == _expected(b"7", 4, types)


def test_many_distinct_types_in_one_batch() -> None:
    types = [f"type{i:04d}" for i in range(1500)]  # more than any cache of types may hold
    assert list(action_headers(VERSION_7, 0, _batch(types), [])) == _expected(b"7", 0, types)


def test_every_record_has_its_own_list() -> None:
    """A caller adds headers to one record (a fragment, a clamped timestamp) without touching the others."""
    got = list(action_headers(VERSION_7, 0, _batch(["add", "add", "add"]), []))
    got[0].append(("fragment", b"0/2"))
    assert got[1:] == _expected(b"7", 1, ["add", "add"])


def test_an_empty_batch_has_no_headers() -> None:
    assert list(action_headers(VERSION_7, 0, [], [])) == []
    assert list(action_headers(VERSION_7, 5000, [], [("a", b"b")])) == []


# --- header_value ---------------------------------------------------------------------------------


def test_header_value_is_the_text_of_the_first_header_of_that_name() -> None:
    headers: list[tuple[str, str | bytes | None]] = [
        ("version", b"12"),
        ("kind", b"commit"),
        ("kind", b"heartbeat"),
        ("fragment", "1/3"),
    ]
    assert header_value(headers, "version") == "12"
    assert header_value(headers, "kind") == "commit"
    assert header_value(headers, "fragment") == "1/3"  # confluent-kafka may hand str values too


def test_header_value_of_a_missing_header_is_none() -> None:
    assert header_value([("version", b"1")], "kind") is None
    assert header_value([], "kind") is None
    assert header_value(None, "kind") is None
    assert header_value([("Kind", b"commit")], "kind") is None  # names are case-sensitive
    assert header_value([("kind", None)], "kind") is None  # a header without a value says nothing


def test_header_value_of_an_empty_header_is_the_empty_text() -> None:
    assert header_value([("kind", b"")], "kind") == ""


def test_a_header_that_is_not_text_is_an_event_stream_error() -> None:
    """Headers are ASCII text by contract; one read from a topic that is not is a broken record,
    reported as such (never a UnicodeDecodeError traceback)."""
    with pytest.raises(EventStreamError, match="kind"):
        header_value([("kind", b"\xff\xfe")], "kind")
