"""The units of work the watcher hands out, and the reading of a commit they are made from.

A unit is what the publisher turns into records: a snapshot (:mod:`.snapshot_events`), a commit,
the announcement that the location holds a new table, or a bare start position. A published
action is recorded as a :class:`Position`, from which the watcher resumes after any failure.

Every action of a commit is counted and summarized, and every line checked, before the first
record goes out (events carry ``index``/``count``; the summary and timestamp must be known; a
corrupt line must stop the version before any of it is published). Actions go out as the log's own
JSON bytes. A small commit is read and split once, its actions kept until they are published. A
large one is read twice, streaming (count and check, then hand out in batches): memory is bounded
by the batch size, whatever the size of the commit.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, cast

from deltamirror.core.actions import FILE_ACTIONS, ActionRun, PartitionKeySets
from deltamirror.core.commits import (
    SMALL_COMMIT_BYTES,
    CheckedVersion,
    TimestampTracker,
    read_version,
    version_actions,
)
from deltamirror.core.errors import CorruptLogError
from deltamirror.core.log import commit_name
from deltamirror.core.models import Metadata
from deltamirror.core.schema_changes import schema_change
from deltamirror.core.storage import FileInfo, TableStorage
from deltamirror.core.timestamps import CommitTimestamp
from deltamirror.mirror.records.events import CommitSummary, SchemaChanged
from deltamirror.producer.tailing.snapshot_events import (
    MAX_PARTITIONS_LISTED,
    ActionBatch,
    Body,
    SnapshotWork,
)
from deltamirror.producer.tailing.summaries import commit_summary, schema_changed

# --- positions and units of work --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Position:
    """The last published action of a table: ``index`` of ``version`` (of its snapshot).

    ``index + 1 == count`` means the version is complete, unless ``row_offset`` is set: then its
    actions are, and the first ``row_offset`` records of its row changes
    (:class:`~deltamirror.mirror.records.row_changes.VersionRows`) are published, the rest (and its
    summary) not yet. ``index == -1, count == 0`` is a start position with nothing published for
    ``version`` (``latest`` mode begins after it).
    """

    table_id: str
    version: int
    index: int
    count: int
    timestamp: CommitTimestamp
    snapshot: bool = False
    row_offset: int | None = None

    @property
    def complete(self) -> bool:
        return self.index + 1 >= self.count and self.row_offset is None


@dataclass(frozen=True)
class TableReplacedWork:
    """The location holds another table than the one published so far."""

    previous_table_id: str
    previous_version: int
    table_id: str
    reason: str


@dataclass(frozen=True)
class TableDroppedWork:
    """The table is gone for good (no version left, and discovery no longer finds it): its last unit.

    ``table_id`` is None when nothing was ever published for it (no record then, only the end).
    """

    table_id: str | None
    last_version: int
    reason: str


@dataclass(frozen=True)
class NetCatchUpWork:
    """The versions ``first`` to ``last`` that come next are a catch-up: their row changes go out
    once, netted over the range, after the actions of ``last``; the range's actions, summaries,
    net rows and progress are committed in one transaction (all of it, or none)."""

    first: int
    last: int


@dataclass(frozen=True)
class NetChangesWork:
    """Asked for by a signal: the net row changes of versions ``first`` to ``last`` (published
    already, ``last`` the last one handed out) as one BEGIN/END block in a transaction of its own,
    marked as a backfill (``snapshot`` ``true``, ``last`` on its last event). No action, no summary."""

    first: int
    last: int
    table_id: str
    metadata: Metadata
    timestamp: CommitTimestamp
    #: answers the signal, once: None when the block is committed, else why it was not published
    answer: Callable[[str | None], None] = field(default=lambda refused: None, compare=False, repr=False)


@dataclass(frozen=True)
class PositionWork:
    """Nothing to publish, but a position to record (``latest`` mode's starting point)."""

    position: Position


@dataclass
class _Summary:
    """Counters of one version, filled while scanning it (from the validated actions)."""

    adds: int = 0
    removes: int = 0
    cdc: int = 0
    bytes_added: int = 0
    bytes_removed: int = 0
    #: size of the change data files (not in the summary: how long reading the row changes takes)
    bytes_cdc: int = 0
    partitions: dict[tuple[tuple[str, Any], ...], dict[str, Any]] = field(default_factory=dict)
    truncated: bool = False
    #: the partitions above as met (entries in file order): most files repeat a few of them
    _seen: dict[tuple[tuple[str, Any], ...], None] = field(default_factory=dict, repr=False)

    def count_run(self, run: ActionRun, partitions: Iterable[tuple[tuple[str, Any], ...]]) -> None:
        """A run of add, remove or cdc actions: counts, bytes (cdc has none), and its distinct
        partitions (entry tuples, as :class:`PartitionKeySets` returns them), with C-level maps
        rather than a Python step per file."""
        n = len(run)
        if run.name == "add":
            self.adds += n
            self.bytes_added += sum(map(_SIZE, run.values))
        elif run.name == "remove":
            self.removes += n
            self.bytes_removed += sum(filter(None, map(_SIZE, run.values)))
        else:
            self.cdc += n
            self.bytes_cdc += sum(filter(None, map(_SIZE, run.values)))
        for entries in partitions:
            if entries:
                self._touch(entries)

    def _touch(self, entries: tuple[tuple[str, Any], ...]) -> None:
        if self.truncated or entries in self._seen:
            return
        key = tuple(sorted(entries))
        if key not in self.partitions:
            if len(self.partitions) >= MAX_PARTITIONS_LISTED:
                self.truncated = True
                return
            self.partitions[key] = dict(entries)
        if len(self._seen) < 4 * MAX_PARTITIONS_LISTED:
            self._seen[entries] = None


_SIZE = operator.attrgetter("size")  # file actions come as Structs (read_version)


class CommitWork:
    """One version to publish, from action ``start`` on."""

    snapshot = False

    def __init__(
        self,
        storage: TableStorage,
        table_id: str,
        version: int,
        timestamp: CommitTimestamp,
        scan: VersionScan,
        start: int = 0,
        *,
        metadata: Metadata | None = None,
        row_offset: int = 0,
        previous_metadata: Metadata | None = None,
    ) -> None:
        self._storage = storage
        #: the metaData in force at this version (its own, or the one before): its row changes' schema
        self.metadata = metadata
        #: the metaData in force before this version, when the version has one of its own (what a
        #: ``schemaChanged`` record compares it with; None: the version has none, or it is the first)
        self.previous_metadata = previous_metadata
        #: row-change records published already (a restart in the middle of the version's rows)
        self.row_offset = row_offset
        self.table_id = table_id
        self.table_uri = storage.uri
        self.version = version
        self.timestamp = timestamp
        self.scan = scan
        self.count = scan.count
        self.start = start

    def __repr__(self) -> str:
        return f"CommitWork(version={self.version}, count={self.count}, start={self.start})"

    def batches(self, size: int) -> Iterator[ActionBatch]:
        actions = self.scan.actions
        if actions is not None:  # a small commit, split already
            for i in range(self.start, len(actions), size):
                yield actions[i : i + size]
            return
        actions_left = iter_raw_actions(self._storage, self.version, self.scan)
        index = sum(1 for _ in itertools.islice(actions_left, self.start))  # published already
        while batch := list(itertools.islice(actions_left, size)):
            index += len(batch)
            yield batch
        if index != self.count:
            raise CorruptLogError(
                f"commit changed while it was read ({self.count} actions, then {index})",
                table=self.table_uri,
                version=self.version,
                file=self._storage.log_file(commit_name(self.version)),
            )

    def schema_change(self) -> SchemaChanged | None:
        """The ``schemaChanged`` record of the version (None: its metaData, if any, changed neither
        the schema, the partition columns nor the column mapping)."""
        current = self.scan.checked.metadata
        if current is None or self.previous_metadata is None:
            return None
        change = schema_change(self.previous_metadata, current)
        return None if change is None else schema_changed(self, change, self.previous_metadata, current)

    def summary(self) -> CommitSummary:
        s = self.scan.summary
        ci = self.scan.checked.commit_info or {}
        read_version = ci.get("readVersion")
        blind = ci.get("isBlindAppend")
        return commit_summary(
            self,
            operation=ci.get("operation") if isinstance(ci.get("operation"), str) else None,
            read_version=read_version if isinstance(read_version, int) else None,
            is_blind_append=blind if isinstance(blind, bool) else None,
            adds=s.adds,
            removes=s.removes,
            cdc_files=s.cdc,
            bytes_added=s.bytes_added,
            bytes_removed=s.bytes_removed,
            partitions_touched=list(s.partitions.values()),
            partitions_touched_truncated=s.truncated,
            metadata_changed=self.scan.checked.metadata is not None,
            protocol_changed=self.scan.checked.protocol is not None,
        )


PublishUnit = CommitWork | SnapshotWork
Work = (
    CommitWork
    | SnapshotWork
    | TableReplacedWork
    | TableDroppedWork
    | PositionWork
    | NetCatchUpWork
    | NetChangesWork
)


def position_after(unit: PublishUnit, index: int, row_offset: int | None = None) -> Position:
    """The position once action ``index`` of ``unit`` (and ``row_offset`` row-change records) is published."""
    return Position(unit.table_id, unit.version, index, unit.count, unit.timestamp, unit.snapshot, row_offset)


# --- reading a commit -------------------------------------------------------------------------


@dataclass
class VersionScan:
    """A version core read and checked (:func:`deltamirror.core.commits.read_version`), with the
    summary of its file actions counted on the way (the one pass over its lines)."""

    checked: CheckedVersion
    summary: _Summary = field(default_factory=_Summary)
    partition_keys: PartitionKeySets = field(default_factory=PartitionKeySets, repr=False)

    @property
    def file(self) -> FileInfo:
        return self.checked.file

    @property
    def count(self) -> int:
        return self.checked.count

    @property
    def actions(self) -> list[tuple[str, Body]] | None:
        """Every action of a small commit as it is published (the file was read and validated once)."""
        return cast("list[tuple[str, Body]] | None", self.checked.actions)


def scan_version(
    storage: TableStorage,
    version: int,
    info: FileInfo,
    data: bytes | None = None,
    metadata: Metadata | None = None,
    timestamps: TimestampTracker | None = None,
) -> VersionScan:
    """Read one version checked by core, counting its file actions into the commit's summary.

    ``metadata`` is the metaData in force before the version, ``timestamps`` the tracker of the
    versions before (the version's timestamp is then resolved); see :func:`read_version`. Only
    what core accepted is published, as the log's own bytes.
    """
    summary = _Summary()
    keys = PartitionKeySets()

    def observe(run: ActionRun) -> None:
        if run.name in FILE_ACTIONS:
            summary.count_run(run, keys.add(run))

    checked = read_version(
        storage, version, info, data=data, in_force=metadata, timestamps=timestamps, observe=observe
    )
    return VersionScan(checked, summary, keys)


def iter_raw_actions(storage: TableStorage, version: int, scan: VersionScan) -> Iterator[tuple[str, Body]]:
    """Second pass: (type, body) per action in file order; bodies are the log's own bytes."""
    return version_actions(storage, scan.checked)


__all__ = [
    "SMALL_COMMIT_BYTES",
    "CommitWork",
    "NetCatchUpWork",
    "NetChangesWork",
    "Position",
    "PositionWork",
    "PublishUnit",
    "TableDroppedWork",
    "TableReplacedWork",
    "VersionScan",
    "Work",
    "iter_raw_actions",
    "position_after",
    "scan_version",
]
