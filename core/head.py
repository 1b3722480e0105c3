"""Where a follower of the log starts: the metaData and protocol in force at a version, the
timestamps it chains from, and the table a ``0.json`` names.

These are the protocol questions a tailer asks before it reads any commit (the producer's watcher
asks them on every start, resume and re-created table); they read no data file and replay no file
actions. A head is feature-checked here, by core's one rule (:func:`~deltamirror.core.features.check_table`):
a tailer never decides itself whether it can read a table.
"""

from __future__ import annotations

from dataclasses import dataclass

from deltamirror.core import features
from deltamirror.core.actions import iter_values
from deltamirror.core.errors import CorruptLogError, VersionNotFoundError
from deltamirror.core.log import build_segment, stream_commit
from deltamirror.core.models import Metadata, Protocol
from deltamirror.core.replay import replay_config
from deltamirror.core.storage import TableStorage
from deltamirror.core.table import DeltaTable
from deltamirror.core.timestamps import CommitTimestamp, IctConfig


def timestamp_of(table: DeltaTable, version: int, ict: IctConfig) -> CommitTimestamp:
    """The resolved timestamp of ``version``: core's one rule (``DeltaTable.commit_timestamp``), as
    ``snapshot`` and ``history`` give it. ``ict`` is not used: the rule reads the latest metaData's."""
    del ict
    return table.commit_timestamp(version)


def previous_timestamp(table: DeltaTable, version: int, ict: IctConfig) -> CommitTimestamp | None:
    """The resolved timestamp of the last commit at or before ``version`` (None if none is listed):
    what the versions after it are chained from (``DeltaTable.last_commit_timestamp``)."""
    del ict
    return table.last_commit_timestamp(version)


def version0_table_id(storage: TableStorage) -> str | None:
    """metaData.id of version 0, decoding no line but its metaData (None if it has none yet, or
    none that reads: a writer may still be writing it; reading the version later says more)."""
    try:
        for _, name, value in iter_values(stream_commit(storage, 0, only=(b'"metaData"',))):
            if name == "metaData":
                return str(value["id"])
    except (CorruptLogError, VersionNotFoundError):
        return None
    return None


@dataclass(frozen=True)
class TableHead:
    """The metaData and protocol in force at a version: all a follower needs to start there."""

    version: int
    metadata: Metadata
    protocol: Protocol

    #: the table's location (errors name it)
    table: str | None = None

    @property
    def ict(self) -> IctConfig:
        return IctConfig.from_configuration(self.metadata.configuration)

    def check_readable(self) -> TableHead:
        """This head, once this deltamirror can read the table: its protocol (an unsupported reader
        feature refused by name), then its metaData's schema; as :meth:`DeltaTable.snapshot` checks."""
        features.check_table(self.protocol, self.metadata, table=self.table, version=self.version)
        return self


def read_head(table: DeltaTable, version: int, *, check_features: bool = True) -> TableHead:
    """metaData and protocol at ``version`` without replaying the table's files (core's
    :func:`~deltamirror.core.replay.replay_config`: commits streamed newest first, then the checkpoint).

    Feature-checked (:meth:`TableHead.check_readable`) unless ``check_features`` is False: a caller
    that only compares the table's id or reads its timestamp settings first, and checks it after."""
    segment = table.segment(version)
    metadata, protocol = replay_config(table.storage, segment)
    table._remember_config(segment.version, metadata)  # its ICT settings: not read again for its timestamp
    head = TableHead(segment.version, metadata, protocol, table.uri)
    return head.check_readable() if check_features else head


def read_latest_head(table: DeltaTable) -> tuple[TableHead, CommitTimestamp]:
    """The feature-checked head at the table's latest version and that version's timestamp, from
    one listing of the whole log: the latest version, its head and its timestamp asked in turn
    listed the log three times (a fresh start at the latest version, per table)."""
    listing = table.listing(0)
    segment = build_segment(table.storage, whole_log=listing)
    metadata, protocol = replay_config(table.storage, segment)
    table._remember_config(segment.version, metadata)
    head = TableHead(segment.version, metadata, protocol, table.uri).check_readable()
    return head, table._commit_timestamp(head.version, listing)


__all__ = [
    "TableHead",
    "previous_timestamp",
    "read_head",
    "read_latest_head",
    "timestamp_of",
    "version0_table_id",
]
