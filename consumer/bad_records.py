"""Refused records copied to a topic (``on_bad_record: dead-letter``), as Kafka Connect's dead letter
queue copies them: the record as it was read (key, value, headers), with headers saying where it
was and why it was refused, so that an operator can look at it, and replay it once it is fixed.

Headers added (ASCII): ``deltamirror.refused.topic``, ``deltamirror.refused.partition``,
``deltamirror.refused.offset`` (of its first fragment for a split record), and
``deltamirror.refused.reason`` (the refusal, one line, at most 200 characters of any value it
quotes). Fragments that never made a record are not kept (their bytes are bounded, not stored):
their copy has no value. A value larger than ``max_value_bytes`` is not copied either; the header
``deltamirror.refused.bytes`` says how large it was.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from deltamirror.mirror.boundary import BadRecordError

if TYPE_CHECKING:
    from deltamirror.mirror.kafka_consumer import Record

    from .invalidate.delivery import RecordSender

HEADER_PREFIX = "deltamirror.refused."
#: a copy must fit the dead-letter topic (1 MB per record by default)
DEFAULT_MAX_VALUE_BYTES = 900_000


def _ascii(text: object) -> bytes:
    return " ".join(str(text).split()).encode("ascii", "backslashreplace")


class BadRecordTopic:
    """Copies each refused record to ``topic`` (which must exist) and waits until it is stored."""

    def __init__(
        self, producer: RecordSender, topic: str, *, max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES
    ) -> None:
        self.producer = producer
        self.topic = topic
        self.max_value_bytes = max_value_bytes
        #: records copied so far
        self.sent = 0

    def __call__(self, error: BadRecordError, record: Record | None) -> None:
        where = error.context
        headers: list[tuple[str, str | bytes | None]] = list(record.headers) if record is not None else []
        headers += [
            (HEADER_PREFIX + "topic", _ascii(where.get("topic", ""))),
            (HEADER_PREFIX + "partition", _ascii(where.get("partition", ""))),
            (HEADER_PREFIX + "offset", _ascii(where.get("offset", ""))),
            (HEADER_PREFIX + "reason", _ascii(error.message)[:2000]),
        ]
        value = record.value if record is not None else b""
        if len(value) > self.max_value_bytes:
            headers.append((HEADER_PREFIX + "bytes", str(len(value)).encode()))
            value = b""
        self.producer.send(self.topic, value, record.key if record is not None else None, headers)
        self.sent += 1


__all__ = ["HEADER_PREFIX", "BadRecordTopic"]
