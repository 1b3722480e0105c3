"""deltamirror.core: the Delta Lake protocol, with no Kafka and no Spark in it.

The library API in four names::

    from deltamirror.core import open_table
    table = open_table("s3://bucket/events", storage_options={...})
    snap = table.snapshot()                     # or version=N, timestamp="2026-01-01T00:00:00Z"
    snap.files                                  # active files (Arrow)
    snap.to_arrow()                             # rows, deletion vectors applied
    for entry in table.history(): ...           # versions with resolved commit timestamps
    for batch in table.changes(starting_version=3): ...   # change data feed (Arrow batches)

Every error is a :class:`DeltaMirrorError`.
"""

from .errors import DeltaMirrorError
from .table import DeltaTable, HistoryEntry, Snapshot, open_table
from .timestamps import CommitTimestamp, TimestampSource

__all__ = [
    "CommitTimestamp",
    "DeltaMirrorError",
    "DeltaTable",
    "HistoryEntry",
    "Snapshot",
    "TimestampSource",
    "open_table",
]
