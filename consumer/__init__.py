"""deltamirror.consumer: incremental snapshots, cache invalidation and the Spark change-feed source."""

from .snapshot import IncrementalSnapshot, Invalidation, SnapshotConsumer

__all__ = ["IncrementalSnapshot", "Invalidation", "SnapshotConsumer"]
