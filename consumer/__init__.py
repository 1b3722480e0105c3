"""deltamirror.consumer: incremental snapshots, cache invalidation and the Spark change-feed source.

Rooms (private): ``snapshot/`` (the state of each mirrored table, kept from the actions topic),
``invalidate/`` (each version handed to a command or a webhook), ``spark/`` (the PySpark data
source, the one module that imports pyspark), ``mirror_changes.py`` (which versions the mirror
holds, where). :func:`register` loads pyspark only when called for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from deltamirror.core.faces import lazy_exports

if TYPE_CHECKING:
    from .invalidate import (
        DeadLetterTopic,
        ExecTarget,
        InvalidationConsumer,
        Invalidator,
        RetryPolicy,
        Target,
        WebhookTarget,
        version_payload,
    )
    from .snapshot import IncrementalSnapshot, Invalidation, SnapshotConsumer, StateStore, TableReplacement
    from .spark.source import register

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "IncrementalSnapshot": ".snapshot",
        "Invalidation": ".snapshot",
        "SnapshotConsumer": ".snapshot",
        "StateStore": ".snapshot",
        "TableReplacement": ".snapshot",
        "DeadLetterTopic": ".invalidate",
        "ExecTarget": ".invalidate",
        "InvalidationConsumer": ".invalidate",
        "Invalidator": ".invalidate",
        "RetryPolicy": ".invalidate",
        "Target": ".invalidate",
        "WebhookTarget": ".invalidate",
        "version_payload": ".invalidate",
        "register": ".spark.source",
    },
)

__all__ = [
    "DeadLetterTopic",
    "ExecTarget",
    "IncrementalSnapshot",
    "Invalidation",
    "InvalidationConsumer",
    "Invalidator",
    "RetryPolicy",
    "SnapshotConsumer",
    "StateStore",
    "TableReplacement",
    "Target",
    "WebhookTarget",
    "register",
    "version_payload",
]
