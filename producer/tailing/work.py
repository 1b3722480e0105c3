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
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any

from deltamirror.core.actions import FILE_ACTIONS, ActionRun, PartitionKeySets, Where, read_actions
from deltamirror.core.errors import CorruptLogError, VersionNotFoundError
from deltamirror.core.log import check_commit, commit_name, stream_commit
from deltamirror.core.models import Metadata, model_of
from deltamirror.core.storage import FileInfo, TableStorage
from deltamirror.core.timestamps import CommitTimestamp
from deltamirror.mirror.records.events import MAX_SUMMED_BYTES, SCHEMA_VERSION, CommitSummary
from deltamirror.producer.tailing.snapshot_events import (
    MAX_PARTITIONS_LISTED,
    ActionBatch,
    Body,
    SnapshotWork,
)

#: commit files up to this size are read once and kept for the second pass
SMALL_COMMIT_BYTES = 16 * 1024 * 1024


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
            self.bytes_removed += sum(filter(None, map(_GET_SIZE, run.values)))
        else:
            self.cdc += n
            self.bytes_cdc += sum(filter(None, map(_GET_SIZE, run.values)))
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


_SIZE = operator.itemgetter("size")
_GET_SIZE = operator.methodcaller("get", "size")


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
    ) -> None:
        self._storage = storage
        #: the metaData in force at this version (its own, or the one before): its row changes' schema
        self.metadata = metadata
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

    def summary(self) -> CommitSummary:
        s = self.scan.summary
        ci = self.scan.commit_info or {}
        read_version = ci.get("readVersion")
        blind = ci.get("isBlindAppend")
        return CommitSummary(
            schema_version=SCHEMA_VERSION,
            table_id=self.table_id,
            table_uri=self.table_uri,
            version=self.version,
            commit_timestamp=self.timestamp.timestamp,
            commit_timestamp_source=str(self.timestamp.source),  # type: ignore[arg-type]
            snapshot=False,
            action_count=self.count,
            operation=ci.get("operation") if isinstance(ci.get("operation"), str) else None,
            read_version=read_version if isinstance(read_version, int) else None,
            is_blind_append=blind if isinstance(blind, bool) else None,
            adds=s.adds,
            removes=s.removes,
            cdc_files=s.cdc,
            # a long, as every Delta reader sums sizes: each size is one, their sum may not be
            bytes_added=min(s.bytes_added, MAX_SUMMED_BYTES),
            bytes_removed=min(s.bytes_removed, MAX_SUMMED_BYTES),
            partitions_touched=list(s.partitions.values()),
            partitions_touched_truncated=s.truncated,
            metadata_changed=self.scan.metadata is not None,
            protocol_changed=self.scan.protocol is not None,
        )


PublishUnit = CommitWork | SnapshotWork
Work = CommitWork | SnapshotWork | TableReplacedWork | TableDroppedWork | PositionWork


def position_after(unit: PublishUnit, index: int, row_offset: int | None = None) -> Position:
    """The position once action ``index`` of ``unit`` (and ``row_offset`` row-change records) is published."""
    return Position(unit.table_id, unit.version, index, unit.count, unit.timestamp, unit.snapshot, row_offset)


# --- reading a commit -------------------------------------------------------------------------


@dataclass
class VersionScan:
    """What the first pass over a commit learned (every action validated by core's log boundary)."""

    version: int
    file: FileInfo
    count: int = 0
    commit_info: dict[str, Any] | None = None
    commit_info_line: int | None = None
    metadata: dict[str, Any] | None = None
    metadata_line: int | None = None
    protocol: dict[str, Any] | None = None
    summary: _Summary = field(default_factory=_Summary)
    #: every action of a small commit as it is published (the file was read and validated once)
    actions: list[tuple[str, Body]] | None = None
    partition_keys: PartitionKeySets = field(default_factory=PartitionKeySets, repr=False)

    def observe(self, run: ActionRun) -> None:
        """Count a run of actions into the summary; keep commitInfo, metaData and protocol."""
        self.count += len(run)
        name = run.name
        if name in FILE_ACTIONS:
            self.summary.count_run(run, self.partition_keys.add(run))
        elif name == "commitInfo" and self.commit_info is None:
            self.commit_info, self.commit_info_line = run.values[0], run.line
        elif name == "metaData":
            self.metadata, self.metadata_line = run.values[-1], run.line + len(run) - 1
        elif name == "protocol":
            self.protocol = run.values[-1]


def scan_version(
    storage: TableStorage,
    version: int,
    info: FileInfo,
    data: bytes | None = None,
    metadata: Metadata | None = None,
) -> VersionScan:
    """First pass: validate every line, count actions, keep commitInfo/metaData/protocol, summarize.

    The lines are validated by core's log boundary (:mod:`deltamirror.core.actions`); only what
    it accepted is published, as the log's own bytes. ``metadata`` is the metaData in force before
    this version (the commit's own metaData, if it has one, decides instead). A small commit is
    read whole (unless ``data``, its bytes read already, is given) and its actions kept for
    :func:`iter_raw_actions`; a large one is streamed, keeping nothing but the summary.
    """
    scan = VersionScan(version, info)
    path = storage.log_file(commit_name(version))
    if info.size <= SMALL_COMMIT_BYTES:
        try:
            if data is None:
                data = storage.read_bytes(path)
        except FileNotFoundError:
            raise VersionNotFoundError(
                f"commit {version} disappeared while it was read",
                table=storage.uri,
                version=version,
                file=path,
            ) from None
        kept: list[tuple[str, Body]] = []
        scan.actions = kept
        for run in read_actions(data, table=storage.uri, file=path, version=version):
            scan.observe(run)
            kept += zip(repeat(run.name), run.bodies)
    else:
        for run in stream_commit(storage, version):  # listed: gone now means the log was cleaned under us
            scan.observe(run)
    # as core's readers check a commit as a whole: an empty file (one still being written by a
    # writer without atomic put, or a broken one) stops the table until the file has actions, and
    # the metaData in force (its own, or the one before it) decides ICT
    in_force = model_of("metaData", scan.metadata) if scan.metadata is not None else metadata
    check_commit(
        Where(storage.uri, path, version),
        actions=scan.count,
        metadata=in_force if isinstance(in_force, Metadata) else None,
        commit_info=scan.commit_info,
        commit_info_line=scan.commit_info_line,
    )
    return scan


def iter_raw_actions(storage: TableStorage, version: int, scan: VersionScan) -> Iterator[tuple[str, Body]]:
    """Second pass: (type, body) per action in file order; bodies are the log's own bytes.

    A large commit is read (and validated) again, streaming: the same bytes come out.
    """
    if scan.actions is not None:
        yield from scan.actions
        return
    for run in stream_commit(storage, version):
        yield from zip(repeat(run.name), run.bodies)


__all__ = [
    "SMALL_COMMIT_BYTES",
    "CommitWork",
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
