"""The dead-letter topics' records: what a consumer gave up, written once.

Two kinds (docs/consumers.md):

- :func:`encode_dead_letter`: a document ``invalidate`` could not deliver after its last attempt,
  one JSON record ``{"payload", "error", "attempts", "target"}``, keyed by the payload's
  ``tableId``, with the ``kind`` header ``deadLetter`` and the ``version`` header when the payload
  names one;
- :func:`encode_refused_record`: a record the consumers' boundary refused
  (``on_bad_record: dead-letter``), copied as Kafka Connect's dead letter queue copies one: its key,
  value and headers as they were read, then ASCII headers ``deltamirror.refused.topic``,
  ``.partition``, ``.offset`` and ``.reason`` (and ``.bytes`` instead of a value larger than a copy
  may hold).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from .headers import HEADER_KIND, HEADER_VERSION, Headers
from .record import Record

#: the prefix of the headers a refused record's copy gets
REFUSED_HEADER_PREFIX = "deltamirror.refused."
_DEAD_LETTER = (HEADER_KIND, b"deadLetter")


def encode_dead_letter(payload: Mapping[str, Any], error: str, attempts: int, target: str) -> Record:
    """A document given up after ``attempts`` (``error``: the last one's failure; ``target``: where)."""
    value = {"payload": payload, "error": error, "attempts": attempts, "target": target}
    headers: Headers = [_DEAD_LETTER]
    if "version" in payload:
        headers.append((HEADER_VERSION, str(payload["version"]).encode()))
    key = str(payload.get("tableId", "")).encode()
    return Record(json.dumps(value, separators=(",", ":")).encode(), key, headers)


def _ascii(text: object) -> bytes:
    return " ".join(str(text).split()).encode("ascii", "backslashreplace")


def encode_refused_record(
    value: bytes | None,
    key: bytes | None,
    headers: Sequence[tuple[str, str | bytes | None]] | None,
    *,
    where: Mapping[str, Any],
    reason: str,
    max_value_bytes: int,
) -> Record:
    """The copy of a refused record (``value``, ``key``, ``headers`` as read; None when fragments
    never made one), saying ``where`` it was (topic, partition, offset) and why (``reason``).

    A value longer than ``max_value_bytes`` is not copied: the ``bytes`` header says its size.
    """
    out: Headers = list(headers or ())
    out += [
        (REFUSED_HEADER_PREFIX + "topic", _ascii(where.get("topic", ""))),
        (REFUSED_HEADER_PREFIX + "partition", _ascii(where.get("partition", ""))),
        (REFUSED_HEADER_PREFIX + "offset", _ascii(where.get("offset", ""))),
        (REFUSED_HEADER_PREFIX + "reason", _ascii(reason)[:2000]),
    ]
    copied = value if value is not None else b""
    if len(copied) > max_value_bytes:
        out.append((REFUSED_HEADER_PREFIX + "bytes", str(len(copied)).encode()))
        copied = b""
    return Record(copied, key, out)


__all__ = ["REFUSED_HEADER_PREFIX", "encode_dead_letter", "encode_refused_record"]
