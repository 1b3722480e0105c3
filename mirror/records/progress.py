"""The progress topic's records, finished: a table's position, keyed by its location.

The topic is compacted: the last record of a key is where the table's publishing stands, and a
tombstone (a null value) forgets a table that was dropped. No headers. The one decoder is
:func:`~.events.decode_progress`.
"""

from __future__ import annotations

from .events import ProgressRecord
from .record import Record


def encode_progress(record: ProgressRecord) -> Record:
    """``record`` as the progress topic carries it, keyed by its ``tableUri``."""
    return Record(record.to_json_bytes(), record.table_uri.encode())


def encode_progress_tombstone(table_uri: str) -> Record:
    """The tombstone that makes the compacted topic forget ``table_uri`` (a dropped table)."""
    return Record(None, table_uri.encode())


__all__ = ["encode_progress", "encode_progress_tombstone"]
