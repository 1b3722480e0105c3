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

from __future__ import annotations

from typing import TYPE_CHECKING

from .errors import DeltaMirrorError
from .faces import lazy_exports

if TYPE_CHECKING:
    from .table import DeltaTable, HistoryEntry, Snapshot, open_table
    from .timestamps import CommitTimestamp, TimestampSource

#: names loaded on first use: importing the package does not load pyarrow, pydantic or fsspec, so
#: a program (or the CLI's --help) that only names the package starts fast (PEP 562)
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "DeltaTable": ".table",
        "HistoryEntry": ".table",
        "Snapshot": ".table",
        "open_table": ".table",
        "CommitTimestamp": ".timestamps",
        "TimestampSource": ".timestamps",
    },
)

__all__ = [
    "CommitTimestamp",
    "DeltaMirrorError",
    "DeltaTable",
    "HistoryEntry",
    "Snapshot",
    "TimestampSource",
    "open_table",
]
