"""The Kafka headers of the mirror's records (values are ASCII strings), written once.

Headers repeat what the value says (version, index, type, kind) so that a subscriber can route or
skip a record without parsing its value. Header pairs are immutable tuples shared by every record
that has them: per record only its list is new.
"""

from __future__ import annotations

import operator
from collections.abc import Iterator, Sequence
from itertools import repeat
from typing import Any

from ..errors import EventStreamError

HEADER_VERSION = "version"
HEADER_INDEX = "index"
HEADER_TYPE = "type"
HEADER_KIND = "kind"
#: on records split by the ``split`` oversize policy: "<fragment>/<fragments>", 0-based
HEADER_FRAGMENT = "fragment"
#: on records whose Kafka timestamp was clamped because the broker refuses the commit timestamp
HEADER_CLAMPED_FROM = "clampedFrom"

#: a record's headers as confluent-kafka takes and gives them
Headers = list[tuple[str, str | bytes | None]]

#: the text of the first indexes (most versions have fewer actions), made once: the envelope's
#: ``index`` and the ``index`` header share it
INDEX_TEXT: tuple[bytes, ...] = tuple(str(i).encode() for i in range(4096))

_TYPE_HEADERS: dict[str, tuple[str, bytes]] = {}
#: the ``index`` headers of the first actions of a version (most versions have fewer), made once
_INDEX_HEADERS: tuple[tuple[str, bytes], ...] = tuple((HEADER_INDEX, text) for text in INDEX_TEXT)
_TYPE_OF = operator.itemgetter(0)


def _type_header(action_type: str) -> tuple[str, bytes]:
    header = _TYPE_HEADERS.get(action_type)
    if header is None:
        header = (HEADER_TYPE, action_type.encode())
        if len(_TYPE_HEADERS) < 1024:
            _TYPE_HEADERS[action_type] = header
    return header


def action_headers(
    version_header: tuple[str, bytes],
    start: int,
    batch: Sequence[tuple[str, Any]],
    extra: Headers,
) -> Iterator[Headers]:
    """The headers of consecutive actions, the first at index ``start``: version, index, type, ``extra``.

    ``batch`` holds (action type, body) pairs. The lists are made as they are produced, each freed
    right after: made all at once, a batch of them kept the garbage collector busy.
    """
    stop = start + len(batch)
    indexes = (
        _INDEX_HEADERS[start:stop]
        if stop <= len(_INDEX_HEADERS)
        else [(HEADER_INDEX, str(i).encode()) for i in range(start, stop)]
    )
    types = set(map(_TYPE_OF, batch))
    for action_type in types:
        _type_header(action_type)  # remembered from now on (up to 1024 types)
    if not extra and all(t in _TYPE_HEADERS for t in types):
        type_headers = (
            repeat(_TYPE_HEADERS[next(iter(types))])  # one type (a run of adds): no lookup per record
            if len(types) == 1
            else map(_TYPE_HEADERS.__getitem__, map(_TYPE_OF, batch))
        )
        return map(  # C-level: no Python step per record
            list,
            zip(repeat(version_header), indexes, type_headers, strict=False),  # repeat() is endless
        )
    return (
        [version_header, index, _type_header(t), *extra] for index, (t, _) in zip(indexes, batch, strict=True)
    )


def clamped_headers(commit_timestamp: int) -> Headers:
    """The header of a record whose Kafka timestamp is not its commit timestamp (the topic refuses
    it): ``clampedFrom`` says the one it should have had. Encoders add it to their records."""
    return [(HEADER_CLAMPED_FROM, str(commit_timestamp).encode())]


def header_value(headers: Sequence[tuple[str, bytes | str | None]] | None, name: str) -> str | None:
    """The text of header ``name`` (the first one), or None when the record has none."""
    value = next((v for k, v in headers or () if k == name), None)
    if value is None:
        return None
    if not isinstance(value, bytes):
        return str(value)
    try:
        return value.decode("ascii")
    except UnicodeDecodeError:
        raise EventStreamError(f"header {name} is not ASCII text") from None


__all__ = [
    "HEADER_CLAMPED_FROM",
    "HEADER_FRAGMENT",
    "HEADER_INDEX",
    "HEADER_KIND",
    "HEADER_TYPE",
    "HEADER_VERSION",
    "INDEX_TEXT",
    "Headers",
    "action_headers",
    "clamped_headers",
    "header_value",
]
