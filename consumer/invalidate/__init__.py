"""Invalidation outside Python: each committed version, handed to a command or an HTTP endpoint.

A cache in front of a Delta table (query results, a CDN, a search index) needs to know what each
version changed, and its owner may not write Python. Each version the snapshot consumer applies
becomes one JSON document (:func:`version_payload`: table, version, commit timestamp, operation,
partitions touched, files added and removed, long lists cut and flagged) handed to a
:class:`Target` (:class:`ExecTarget`: a command with the document on stdin; :class:`WebhookTarget`:
an HTTP POST), retried with exponential backoff (:class:`RetryPolicy`); what cannot be delivered
goes to a dead-letter topic (:class:`DeadLetterTopic`) or stops the run (:class:`Invalidator`).

Delivery is at least once, in order, never skipping a version: :class:`InvalidationConsumer`
reports versions synchronously in the order they were applied (each table's in version order)
and stores the group's offsets only after the versions before them were handed over. A version
handed over but not acknowledged when the process died is handed over again: receivers should be
idempotent (``Idempotency-Key`` / ``DELTAMIRROR_DELIVERY_ID`` names a delivery).

One job per module: :mod:`.payload` (the documents), :mod:`.targets` (command, webhook),
:mod:`.delivery` (retries, dead letters), :mod:`.consumer` (ordering and acknowledgement).
Used by ``deltamirror invalidate`` and ``deltamirror consume-snapshot --format jsonl``::

    from deltamirror.consumer import InvalidationConsumer, Invalidator, WebhookTarget

    send = Invalidator(WebhookTarget("https://cache.internal/invalidate"))
    InvalidationConsumer("kafka:9092", "deltamirror.sales.actions", on_payload=send).run()
"""

from __future__ import annotations

from .consumer import DEFAULT_GROUP_ID, InvalidationConsumer
from .delivery import (
    DeadLetterTopic,
    DeliveryCounters,
    DeliveryMetrics,
    InvalidationDeliveryError,
    Invalidator,
    Outcome,
    RecordSender,
    RetryPolicy,
)
from .payload import DEFAULT_MAX_ITEMS, Payload, delivery_id, describe, replacement_payload, version_payload
from .targets import (
    DEFAULT_TIMEOUT_S,
    DeliveryAttemptError,
    ExecTarget,
    Target,
    WebhookTarget,
    exec_environment,
    safe_url,
)

__all__ = [
    "DEFAULT_GROUP_ID",
    "DEFAULT_MAX_ITEMS",
    "DEFAULT_TIMEOUT_S",
    "DeadLetterTopic",
    "DeliveryAttemptError",
    "DeliveryCounters",
    "DeliveryMetrics",
    "ExecTarget",
    "InvalidationConsumer",
    "InvalidationDeliveryError",
    "Invalidator",
    "Outcome",
    "Payload",
    "RecordSender",
    "RetryPolicy",
    "Target",
    "WebhookTarget",
    "delivery_id",
    "describe",
    "exec_environment",
    "replacement_payload",
    "safe_url",
    "version_payload",
]
