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

from deltamirror.mirror.records.boundary import BadRecordError
from deltamirror.mirror.records.dead_letters import REFUSED_HEADER_PREFIX, encode_refused_record

if TYPE_CHECKING:
    from deltamirror.mirror.kafka.consumer import Record

    from .invalidate.delivery import RecordSender

HEADER_PREFIX = REFUSED_HEADER_PREFIX
#: a copy must fit the dead-letter topic (1 MB per record by default)
DEFAULT_MAX_VALUE_BYTES = 900_000


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
        copy = encode_refused_record(
            record.value if record is not None else None,
            record.key if record is not None else None,
            record.headers if record is not None else None,
            where=error.context,
            reason=error.message,
            max_value_bytes=self.max_value_bytes,
        )
        assert copy.value is not None  # a copy without its value has an empty one, never a tombstone
        self.producer.send(self.topic, copy.value, copy.key, copy.headers)
        self.sent += 1


__all__ = ["HEADER_PREFIX", "BadRecordTopic"]
