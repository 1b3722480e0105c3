"""The watcher's settings, under the name they were first published as: re-exports only.

The models live in :mod:`deltamirror.producer.settings` (TableConfig, WatchConfig,
:func:`~deltamirror.producer.settings.merge_overrides`) and :mod:`deltamirror.mirror.settings`
(KafkaSettings, shared with the consumer commands); the file loading in
:mod:`deltamirror.producer.config_file`.
"""

from __future__ import annotations

from deltamirror.mirror.settings import RESERVED_KAFKA_KEYS, KafkaSettings

from .config_file import load_config, redacted
from .settings import OversizePolicy, SnapshotMode, TableConfig, WatchConfig, merge_overrides

__all__ = [
    "RESERVED_KAFKA_KEYS",
    "KafkaSettings",
    "OversizePolicy",
    "SnapshotMode",
    "TableConfig",
    "WatchConfig",
    "load_config",
    "merge_overrides",
    "redacted",
]
