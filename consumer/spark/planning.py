"""Where the Spark source's stream starts, how far a micro-batch reads, and what it cannot read.

The driver's half of ``format("deltamirror")``, without pyspark (source.py turns Spark's calls
and its ReadLimit objects into these), with delta-spark's rules for its ``readChangeFeed`` stream:

* ``startingVersion`` must exist: after the table's latest version it is DELTA_VERSION_NOT_FOUND,
  ``latest`` is the latest version + 1; ``startingTimestamp`` starts at the first commit at or
  after it (a timestamp before the first commit starts at it; after the last one is
  DELTA_TIMESTAMP_GREATER_THAN_COMMIT).
* Admission control takes whole versions (:meth:`MirrorIndex.admit`): a micro-batch never splits a
  version, and a version larger than the limit is a batch of its own.
* ``failOnDataLoss=false`` skips, with a warning, the versions the mirror does not hold as change
  data (before its first commit, skipped by a re-snapshotting watcher); by default they fail the
  query, naming them.

Offsets are ``{"version": next version to read}``, plus ``"snapshot": true`` before the initial
snapshot (no starting option: the table at the latest mirrored version, as inserts).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from deltamirror.core.changes import ReadSchema, check_change_metadata, is_cdf_enabled
from deltamirror.core.errors import (
    ChangeDataNotEnabledError,
    ChangeTimestampAfterLatestError,
    StreamStartNotFoundError,
    VersionNotFoundError,
)
from deltamirror.core.models import Metadata
from deltamirror.core.timestamps import IctConfig, format_iso, version_at_or_after
from deltamirror.mirror.errors import EventStreamError

from ..mirror_changes import MirrorIndex
from .options import SourceOptions
from .schema_log import refuse_untracked, same_shape

if TYPE_CHECKING:
    from deltamirror.core.table import DeltaTable

log = logging.getLogger(__name__)

Offset = dict[str, Any]
#: (most files, most bytes) a micro-batch reads; None for either: no limit of that kind
Limit = tuple[int | None, int | None]


def initial_offset(options: SourceOptions, index: MirrorIndex, read: ReadSchema | None) -> Offset:
    """Where a new query starts (a restarted one starts from its checkpoint, never here).

    ``read`` None: the schema is not checked there (a new schema tracking log starts with it)."""
    uri = options.settings.table_uri
    mirrored = index.latest
    if mirrored is None and index.refused is not None:
        raise index.refused
    if mirrored is None:
        raise EventStreamError(
            f"nothing of the table is on {options.settings.commits_topic} yet: start the watcher first",
            table=uri,
        )
    table = options.table()
    start = options.starting_version
    if start is None and options.starting_timestamp_ms is None:
        check_enabled_at(table, mirrored, read)
        return {"version": mirrored, "snapshot": True}
    # the table's latest, as delta-spark takes it: a lagging watcher only delays the rows
    latest = max(table.latest_version(), mirrored)
    if start == "latest":
        return {"version": latest + 1}
    if options.starting_timestamp_ms is not None:
        start = version_at_timestamp(table, options.starting_timestamp_ms, read)
    assert isinstance(start, int)
    if start > latest:
        raise StreamStartNotFoundError(
            f"startingVersion {start} does not exist: the table's latest version is {latest}",
            table=uri,
            version=start,
        )
    check_enabled_at(table, start, read)
    return {"version": start}


def version_at_timestamp(table: DeltaTable, timestamp_ms: int, read: ReadSchema | None) -> int:
    """delta-spark's stream start for a timestamp: the first commit at or after it, or the first
    commit when it is before them all; after the last commit it fails."""
    metadata = read.metadata if read is not None else table.snapshot().metadata
    ict = IctConfig.from_configuration(metadata.configuration, table=table.uri)
    stamps = table.commit_timestamps(ict=ict)
    version = version_at_or_after(stamps, timestamp_ms, ict, table=table.uri)
    if version is None:
        last = stamps[-1]
        raise ChangeTimestampAfterLatestError(
            f"startingTimestamp {format_iso(timestamp_ms)} is after the latest commit "
            f"(version {last.version} at {last.iso})",
            table=table.uri,
            version=last.version,
        )
    return version


def check_enabled_at(table: DeltaTable, version: int, read: ReadSchema | None) -> None:
    """The change feed must be on where the stream starts (later metaData are checked as read),
    and the data there readable with the read schema, widened types included (as in delta-spark's
    stream, not its batch reader)."""
    try:
        metadata = table.snapshot(version=version).metadata
    except VersionNotFoundError:  # cleaned from the log: the mirror's own metaData decide then
        return
    if not is_cdf_enabled(metadata):
        raise ChangeDataNotEnabledError(
            f"change data was not recorded for version {version} (delta.enableChangeDataFeed is not "
            "true), so the stream cannot start there",
            table=table.uri,
            version=version,
        )
    if read is None:
        return
    refuse_untracked(read.metadata, read.version, metadata, version, table.uri)
    if version < read.version:
        check_change_metadata(read, metadata, version, table=table.uri, start=version, allow_widening=True)


def metadata_at(table: DeltaTable, version: int) -> Metadata:
    """The metaData in force at ``version``: its own, if it has one, else its snapshot's."""
    own = table.commit_metadata(version)
    return own if own is not None else table.snapshot(version=version).metadata


def next_schema_change(
    index: MirrorIndex, table: Callable[[], DeltaTable], read: ReadSchema, first: int, end: int
) -> tuple[int, Metadata] | None:
    """The first version of ``first..end-1`` whose metaData is not of the read schema's shape
    (schema, partition columns), and that metaData; None if there is none. The commits topic
    says which versions have a metaData; only theirs are read from the log (``table()`` opens it)."""
    for version in range(max(first, read.version + 1), end):
        if index.metadata_changed(version):
            metadata = metadata_at(table(), version)
            if not same_shape(metadata, read.metadata):
                return version, metadata
    return None


def next_offset(index: MirrorIndex, start: Offset, *, target: int | None, limit: Limit | None) -> Offset:
    """The end of the next micro-batch from ``start``; ``start`` itself when there is nothing new.

    ``target``: the last version a Trigger.AvailableNow query reads (what was mirrored when it
    started). ``limit`` None reads everything there is (ReadAllAvailable); the initial snapshot is a
    batch of its own under a limit, whatever its size.
    """
    latest = index.latest
    if latest is not None and target is not None:
        latest = min(latest, target)
    first = int(start["version"])
    if latest is None or latest < first:
        if index.refused is not None:  # every version before the refused record was read
            raise index.refused
        return start
    if start.get("snapshot"):
        return {"version": (first if limit is not None else latest) + 1}
    if limit is None:
        return {"version": latest + 1}
    return {"version": index.admit(first, latest, max_files=limit[0], max_bytes=limit[1]) + 1}


def readable_runs(
    index: MirrorIndex, first: int, last: int, *, fail_on_data_loss: bool
) -> list[tuple[int, int]]:
    """The runs of ``[first, last]`` the mirror holds as change data, in order.

    A version it does not hold fails the query naming it, or with ``fail_on_data_loss`` False is
    skipped with a warning (delta-spark's failOnDataLoss, for versions gone from the mirror).
    """
    uri = index.settings.table_uri
    if index.latest is None or last > index.latest:
        index.check_available(first, last)  # raises: not yet mirrored
    lost = index.lost(first, last)
    if lost and fail_on_data_loss:
        lo, hi, why = lost[0]
        raise EventStreamError(
            f"{_versions(lo, hi)} not in the mirror as change data ({why}), so their change rows cannot "
            "be read; .option('failOnDataLoss', 'false') skips them",
            table=uri,
            version=lo,
        )
    runs: list[tuple[int, int]] = []
    v = first
    for lo, hi, why in lost:
        log.warning(
            "%s of %s not in the mirror as change data (%s): skipped (failOnDataLoss=false)",
            _versions(lo, hi),
            uri,
            why,
        )
        if v < lo:
            runs.append((v, lo - 1))
        v = hi + 1
    if v <= last:
        runs.append((v, last))
    return runs


def _versions(first: int, last: int) -> str:
    return f"version {first} is" if first == last else f"versions {first}-{last} are"


__all__ = [
    "Limit",
    "Offset",
    "check_enabled_at",
    "initial_offset",
    "metadata_at",
    "next_offset",
    "next_schema_change",
    "readable_runs",
    "version_at_timestamp",
]
