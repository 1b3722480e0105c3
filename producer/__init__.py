"""deltamirror.producer: tail Delta tables' ``_delta_log`` and publish every commit to Kafka (``watch``).

The API: :class:`WatchService` runs the tables of a :class:`WatchConfig` (from a file with
:func:`load_config`, flags merged by :func:`merge_overrides`); :func:`run_watch` is the command.
Rooms (private): ``tailing/`` (one table's log: watcher, units of work, wakers, retention),
``publishing/`` (records, Kafka transactions, progress, sessions), ``group/`` (membership, shard
producers), ``discovery/`` (tables found under a prefix, signals, topic claims); the service, its
pipeline per table, settings, metrics and liveness at the top.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from deltamirror.core.faces import lazy_exports

if TYPE_CHECKING:
    from .config_file import load_config, redacted
    from .metrics import WatcherMetrics
    from .service import WatchService, run_watch
    from .settings import (
        DiscoverConfig,
        GroupSettings,
        OversizePolicy,
        RowChangesConfig,
        SnapshotMode,
        TableConfig,
        WatchConfig,
        merge_overrides,
    )

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "WatchService": ".service",
        "run_watch": ".service",
        "DiscoverConfig": ".settings",
        "GroupSettings": ".settings",
        "OversizePolicy": ".settings",
        "RowChangesConfig": ".settings",
        "SnapshotMode": ".settings",
        "TableConfig": ".settings",
        "WatchConfig": ".settings",
        "merge_overrides": ".settings",
        "load_config": ".config_file",
        "redacted": ".config_file",
        "WatcherMetrics": ".metrics",
    },
)

__all__ = [
    "DiscoverConfig",
    "GroupSettings",
    "OversizePolicy",
    "RowChangesConfig",
    "SnapshotMode",
    "TableConfig",
    "WatchConfig",
    "WatchService",
    "WatcherMetrics",
    "load_config",
    "merge_overrides",
    "redacted",
    "run_watch",
]
