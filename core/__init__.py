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

from importlib import import_module
from typing import TYPE_CHECKING, Any

from .errors import DeltaMirrorError

if TYPE_CHECKING:
    from .table import DeltaTable, HistoryEntry, Snapshot, open_table
    from .timestamps import CommitTimestamp, TimestampSource

#: names loaded on first use: importing the package does not load pyarrow, pydantic or fsspec, so
#: a program (or the CLI's --help) that only names the package starts fast (PEP 562)
_LAZY = {
    "DeltaTable": ".table",
    "HistoryEntry": ".table",
    "Snapshot": ".table",
    "open_table": ".table",
    "CommitTimestamp": ".timestamps",
    "TimestampSource": ".timestamps",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])


__all__ = [
    "CommitTimestamp",
    "DeltaMirrorError",
    "DeltaTable",
    "HistoryEntry",
    "Snapshot",
    "TimestampSource",
    "open_table",
]
