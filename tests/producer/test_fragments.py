"""FragmentAssembler joins split records and refuses gaps rather than guessing."""

from __future__ import annotations

import pytest

from deltamirror.core.errors import EventStreamError
from deltamirror.core.events import HEADER_FRAGMENT, FragmentAssembler


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
    with pytest.raises(EventStreamError, match="missing"):
        assembler.feed(b"{}", [])
