"""The signal topic's encoder and its one decoder: a signal keyed by its table, refused when it is not one."""

from __future__ import annotations

import pytest

from deltamirror.mirror.records.boundary import BadRecordError
from deltamirror.mirror.records.signals import (
    MAX_SIGNAL_BYTES,
    Signal,
    decode_signal,
    encode_signal,
    new_signal,
)


def test_a_signal_is_keyed_by_its_table_without_headers_and_decodes_back() -> None:
    signal = Signal(kind="snapshot", table_uri="file:///data/t", id="abc", requested_at=5)
    record = encode_signal(signal)
    assert (record.key, record.headers) == (b"file:///data/t", None)
    assert record.value == b'{"kind":"snapshot","tableUri":"file:///data/t","id":"abc","requestedAt":5}'
    assert decode_signal(record.value) == signal


def test_a_done_names_the_signal_it_answers() -> None:
    asked = new_signal("snapshot", "file:///data/t")
    done = new_signal("done", asked.table_uri, asked.id)
    assert (done.kind, done.id, done.table_uri) == ("done", asked.id, asked.table_uri)
    assert done.requested_at >= asked.requested_at and len(asked.id) == 32
    assert encode_signal(done).key == encode_signal(asked).key  # the done follows its signal


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (b"not json", "Invalid JSON"),
        (b'{"kind":"explode","tableUri":"t","id":"a","requestedAt":1}', "kind: Input should be"),
        (b'{"kind":"snapshot","tableUri":"","id":"a","requestedAt":1}', "tableUri: String should have"),
        (None, "Invalid JSON"),
        (
            b" " * (MAX_SIGNAL_BYTES + 1),
            f"{MAX_SIGNAL_BYTES + 1} bytes; a signal has at most {MAX_SIGNAL_BYTES}",
        ),
    ],
)
def test_what_is_not_a_signal_is_refused_saying_why(value: bytes | None, reason: str) -> None:
    with pytest.raises(BadRecordError) as refused:
        decode_signal(value)
    assert reason in refused.value.message
