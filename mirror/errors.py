"""The errors of the wire: the broker failed, refused, or sent records that break the contract.

Each derives from :class:`~deltamirror.core.errors.DeltaMirrorError` like every error a user can
cause, so the CLI prints them the same way. Their ``exit_code`` says what a caller may do:
1 for broker trouble (retry later), 2 for records or settings that are wrong.

The producer's transaction outcomes (:class:`TransactionAbortableError`, :class:`RetriableKafkaError`
and their kin) live here too: :mod:`deltamirror.mirror.kafka.producer` maps every librdkafka
failure to one of them, and the watcher reacts to each differently.
"""

from __future__ import annotations

from deltamirror.core.errors import ConfigError, DeltaMirrorError


class KafkaError(DeltaMirrorError):
    """The broker failed or refused; carries librdkafka's reason."""

    exit_code = 1


class ProducerFencedError(KafkaError):
    """Another watcher took over this table's transactional.id; this one must stop for good."""


class TransactionAbortableError(KafkaError):
    """The open transaction must be aborted; publishing resumes from the last committed position."""


class RetriableKafkaError(KafkaError):
    """A call that timed out or met a passing broker condition; it may be repeated as is."""


class TimestampRefusedError(TransactionAbortableError):
    """A topic refused a record's timestamp (its message.timestamp.*.max.ms): clamp and retry."""


class RecordRefusedError(TransactionAbortableError):
    """The broker refused a record permanently (too large for the topic, policy...)."""


class RecordTooLargeError(DeltaMirrorError):
    """A record larger than max_record_bytes with oversize_policy ``fail``."""


class UnrepresentableValueError(DeltaMirrorError):
    """A row value the chosen row-change format cannot carry (NaN or an infinity with inline
    Connect schemas: JsonConverter would read it as 0.0); refused, never published wrong."""


class SchemaRegistryError(DeltaMirrorError):
    """The Schema Registry refused a schema a record needs (incompatible with the subject's
    versions under its compatibility level, not registered with auto-register off, unauthorized):
    nothing of the version is published. Names the subject."""


class SchemaRegistryUnavailableError(SchemaRegistryError):
    """The Schema Registry could not be reached or failed (5xx): retry later."""

    exit_code = 1


class LocalRegistryError(SchemaRegistryError):
    """The local development registry (``deltamirror local registry``) could not be built,
    checked, started or stopped."""

    exit_code = 1


class TopicNotFoundError(ConfigError):
    """A topic the reader was told to read does not exist (or has no partitions)."""


class EventStreamError(DeltaMirrorError):
    """Records read from the mirror do not fit the contract (e.g. a fragment missing or out of order)."""


class StopRequested(Exception):
    """The stop flag was set while a call waited on the broker; nothing was committed by the call."""


__all__ = [
    "EventStreamError",
    "KafkaError",
    "ProducerFencedError",
    "RecordRefusedError",
    "RecordTooLargeError",
    "RetriableKafkaError",
    "SchemaRegistryError",
    "StopRequested",
    "TimestampRefusedError",
    "TopicNotFoundError",
    "TransactionAbortableError",
    "UnrepresentableValueError",
]
