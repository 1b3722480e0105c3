"""Incremental snapshots: the active files of each mirrored table, kept current from the actions topic.

One job per module:

- :mod:`.state`: :class:`IncrementalSnapshot`, the state of one table (files in Arrow, metaData,
  protocol, txns, domains), applied version by version; :class:`Invalidation`, what a version changed;
- :mod:`.files`: the Arrow kernels that find what a version changed without a pass per file;
- :mod:`.delta_checkpoint`: one table's state as the actions of a classic V1 Delta checkpoint, and
  back (Arrow);
- :mod:`.table_folder`: that checkpoint as a Delta table folder on disk (with ``_last_checkpoint``)
  that delta-spark, delta-rs and core open at the state's version;
- :mod:`.store`: :class:`StateStore`, the state on disk (a checkpoint folder per table,
  ``offsets.json``), crash-safe, and the migration from the older formats (Parquet + JSON
  sidecar, all-JSON);
- :mod:`.loop`: :class:`SnapshotConsumer`, the Kafka loop over the actions (and commits) topic, on
  the mirror's one reader, with restarts and re-created tables (:class:`TableReplacement`).

Records are decoded by the mirror's one decoder (:mod:`deltamirror.mirror.records.events`).
"""

from __future__ import annotations

from deltamirror.core.memory import use_returning_pool

from .loop import (
    DEFAULT_CHECKPOINT_INTERVAL_S,
    DEFAULT_CHECKPOINT_INTERVAL_VERSIONS,
    DEFAULT_GROUP_ID,
    AppliedCallback,
    ReplacedCallback,
    SnapshotConsumer,
    TableReplacement,
)
from .state import (
    STATE_FORMAT,
    STATE_FORMAT_JSON,
    STATE_FORMAT_PARQUET,
    FileKey,
    IncrementalSnapshot,
    Invalidation,
    file_key,
)
from .store import Position, StateStore

__all__ = [
    "DEFAULT_CHECKPOINT_INTERVAL_S",
    "DEFAULT_CHECKPOINT_INTERVAL_VERSIONS",
    "DEFAULT_GROUP_ID",
    "STATE_FORMAT",
    "STATE_FORMAT_JSON",
    "STATE_FORMAT_PARQUET",
    "AppliedCallback",
    "FileKey",
    "IncrementalSnapshot",
    "Invalidation",
    "Position",
    "ReplacedCallback",
    "SnapshotConsumer",
    "StateStore",
    "TableReplacement",
    "file_key",
    "use_returning_pool",
]
