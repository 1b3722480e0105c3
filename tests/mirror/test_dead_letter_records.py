"""The dead-letter encoders: a document given up, and the copy of a refused record (Connect's DLQ form)."""

from __future__ import annotations

import json

from deltamirror.mirror.records.dead_letters import encode_dead_letter, encode_refused_record


def test_a_dead_letter_is_keyed_by_table_id_with_kind_and_version() -> None:
    payload = {"tableId": "t-1", "version": 7, "files": ["a"]}
    record = encode_dead_letter(payload, "HTTP 500", 3, "webhook http://x")
    assert record.key == b"t-1"
    assert record.headers == [("kind", b"deadLetter"), ("version", b"7")]
    assert record.value == (
        b'{"payload":{"tableId":"t-1","version":7,"files":["a"]},"error":"HTTP 500","attempts":3,'
        b'"target":"webhook http://x"}'
    )
    assert record.value is not None and json.loads(record.value)["payload"] == payload


def test_a_dead_letter_without_version_or_table_has_an_empty_key_and_no_version_header() -> None:
    record = encode_dead_letter({"x": 1}, "e", 1, "t")
    assert (record.key, record.headers) == (b"", [("kind", b"deadLetter")])


def test_a_refused_record_is_copied_as_read_with_where_and_why() -> None:
    copy = encode_refused_record(
        b'{"bad":1}',
        b"k",
        [("version", b"3")],
        where={"topic": "deltamirror.t.actions", "partition": 0, "offset": 41},
        reason="not an action event:\n index é",
        max_value_bytes=100,
    )
    assert (copy.value, copy.key) == (b'{"bad":1}', b"k")
    assert copy.headers == [
        ("version", b"3"),
        ("deltamirror.refused.topic", b"deltamirror.t.actions"),
        ("deltamirror.refused.partition", b"0"),
        ("deltamirror.refused.offset", b"41"),
        ("deltamirror.refused.reason", b"not an action event: index \\xe9"),
    ]


def test_a_value_too_large_to_copy_is_left_out_and_its_size_said_and_no_record_keeps_no_key() -> None:
    copy = encode_refused_record(b"x" * 11, None, None, where={}, reason="r", max_value_bytes=10)
    assert (copy.value, copy.key) == (b"", None)
    assert copy.headers is not None and copy.headers[-1] == ("deltamirror.refused.bytes", b"11")
    assert copy.headers[0] == ("deltamirror.refused.topic", b"")
    lost = encode_refused_record(
        None, None, None, where={"topic": "t"}, reason="fragments lost", max_value_bytes=10
    )
    assert lost.value == b"" and lost.headers is not None and len(lost.headers) == 4
