"""Following one table's log: what to publish next, from where the last publish stopped.

The watcher knows nothing of Kafka. Given the last published :class:`Position` (from the progress
topic) or a snapshot mode, it hands out units of work in order: a snapshot, a commit, the
announcement that the location holds a new table, or a bare start position. The publisher turns
them into records; after any failure the service calls :meth:`TableWatcher.start` again with the
last *committed* position, so a version is never skipped and never published twice.

Finding new versions costs one ``stat`` of ``<next>.json`` per poll whatever the log's length; a
listing runs only every ``check_interval_s`` to notice what probing cannot see: a gap (versions
cleaned before they were published), the latest version going backwards, or a table deleted.
Version 0 is ``stat``-ed whenever new versions appear: a new ``0.json`` with another ``metaData.id``
means the table was re-created at the same path.

Every action of a commit is counted and summarized, and every line checked, before the first
record goes out (events carry ``index``/``count``; the summary and timestamp must be known; a
corrupt line must stop the version before any of it is published). Actions go out as the log's own
JSON bytes. A small commit is read and split once, its actions kept until they are published. A
large one is read twice, streaming (count and check, then hand out in batches): memory is bounded
by the batch size, whatever the size of the commit.
"""

from __future__ import annotations

import itertools
import logging
import operator
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any, Literal

from deltamirror.core import features
from deltamirror.core.actions import (
    FILE_ACTIONS,
    ActionRun,
    PartitionKeySets,
    Where,
    iter_values,
    read_actions,
)
from deltamirror.core.commits import TimestampTracker, probe_next_versions
from deltamirror.core.errors import (
    CorruptLogError,
    LogGapError,
    VersionNotFoundError,
)
from deltamirror.core.events import SCHEMA_VERSION, CommitSummary
from deltamirror.core.log import check_commit, commit_name, stream_commit
from deltamirror.core.models import Metadata, Protocol, model_of
from deltamirror.core.replay import replay_config
from deltamirror.core.storage import FileInfo, TableStorage
from deltamirror.core.table import DeltaTable, open_table
from deltamirror.core.timestamps import (
    CommitTimestamp,
    IctConfig,
    TimestampSource,
    parse_timestamp,
    version_at_or_after,
)
from deltamirror.producer.snapshot_events import ActionBatch, Body, SnapshotWork

log = logging.getLogger(__name__)

SnapshotMode = Literal["initial", "latest", "from-version", "from-timestamp", "when-needed"]
SNAPSHOT_MODES: tuple[str, ...] = ("initial", "latest", "from-version", "from-timestamp", "when-needed")

#: commit files up to this size are read once and kept for the second pass
SMALL_COMMIT_BYTES = 16 * 1024 * 1024
#: distinct partitions listed in a commit summary
MAX_PARTITIONS_LISTED = 1000
#: versions probed ahead in one go while catching up
PROBE_AHEAD = 100


# --- positions and units of work --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Position:
    """The last published action of a table: ``index`` of ``version`` (of its snapshot).

    ``index + 1 == count`` means the version is complete. ``index == -1, count == 0`` is a start
    position with nothing published for ``version`` (``latest`` mode begins after it).
    """

    table_id: str
    version: int
    index: int
    count: int
    timestamp: CommitTimestamp
    snapshot: bool = False

    @property
    def complete(self) -> bool:
        return self.index + 1 >= self.count


@dataclass(frozen=True)
class TableReplacedWork:
    """The location holds another table than the one published so far."""

    previous_table_id: str
    previous_version: int
    table_id: str
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
    ) -> None:
        self._storage = storage
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
            bytes_added=s.bytes_added,
            bytes_removed=s.bytes_removed,
            partitions_touched=list(s.partitions.values()),
            partitions_touched_truncated=s.truncated,
            metadata_changed=self.scan.metadata is not None,
            protocol_changed=self.scan.protocol is not None,
        )


PublishUnit = CommitWork | SnapshotWork
Work = CommitWork | SnapshotWork | TableReplacedWork | PositionWork


def position_after(unit: PublishUnit, index: int) -> Position:
    """The position once action ``index`` of ``unit`` is published."""
    return Position(unit.table_id, unit.version, index, unit.count, unit.timestamp, unit.snapshot)


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
    this version: every file action must name its partition columns (the commit's own metaData,
    if it has one, decides instead). A small commit is read whole (unless ``data``, its bytes read
    already, is given) and its actions kept for :func:`iter_raw_actions`; a large one is
    streamed, keeping nothing but the summary.
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
    # the metaData in force (its own, or the one before it) decides partition columns and ICT
    in_force = model_of("metaData", scan.metadata) if scan.metadata is not None else metadata
    check_commit(
        Where(storage.uri, path, version),
        actions=scan.count,
        keys=scan.partition_keys,
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


# --- finding the table's start and timestamps ------------------------------------------------


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


def _v0_table_id(storage: TableStorage) -> str | None:
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
    """The metaData and protocol in force at a version: all the watcher needs to start there."""

    version: int
    metadata: Metadata
    protocol: Protocol

    @property
    def ict(self) -> IctConfig:
        return IctConfig.from_configuration(self.metadata.configuration)


def read_head(table: DeltaTable, version: int) -> TableHead:
    """metaData and protocol at ``version`` without replaying the table's files (core's
    :func:`~deltamirror.core.replay.replay_config`: commits streamed newest first, then the checkpoint)."""
    segment = table.segment(version)
    metadata, protocol = replay_config(table.storage, segment)
    return TableHead(segment.version, metadata, protocol)


# --- reading ahead ----------------------------------------------------------------------------

#: small commits read ahead of the one being published
PREFETCH_DEPTH = 2


class CommitPrefetch:
    """Reads the next commits in a helper thread while the current one is published.

    Catching up a long log costs a read per version: on an object store a request of tens of
    milliseconds, on a local disk a copy of the file. Either runs while the watcher's thread scans,
    encodes and produces (the read releases the GIL). Only small commits are read ahead, at most
    :data:`PREFETCH_DEPTH` of them; a read that failed, or a file that changed since it was listed,
    is simply read again by the scan, which reports what it meets. (Scanning ahead here too was
    measured slower: the validation holds the GIL, so it only competes with the publishing.)
    """

    def __init__(self, storage: TableStorage) -> None:
        self._storage = storage
        self._pool: ThreadPoolExecutor | None = None
        self._reads: dict[int, tuple[FileInfo, Future[bytes]]] = {}

    def want(self, ahead: Iterable[tuple[int, FileInfo]]) -> None:
        """Start reading these versions (the next ones to publish, in order)."""
        for version, info in itertools.islice(ahead, PREFETCH_DEPTH):
            if version in self._reads or info.size > SMALL_COMMIT_BYTES:
                continue
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="deltamirror-prefetch")
            path = self._storage.log_file(commit_name(version))
            self._reads[version] = (info, self._pool.submit(self._storage.read_bytes, path))

    def take(self, version: int, info: FileInfo) -> bytes | None:
        """The bytes of ``version`` if they were read ahead and still match its listing, else None."""
        entry = self._reads.pop(version, None)
        if entry is None:
            return None
        known, future = entry
        if known != info:
            future.cancel()
            return None
        try:
            data = future.result()
        except Exception:  # the scan reads it again and reports what it meets
            return None
        return data if len(data) == info.size else None

    def clear(self) -> None:
        for _, future in self._reads.values():
            future.cancel()
        self._reads.clear()

    def close(self) -> None:
        self.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


# --- the watcher ------------------------------------------------------------------------------


class TableWatcher:
    """Hands out what to publish next for one table, in order, from a position or a snapshot mode."""

    def __init__(
        self,
        uri: str,
        storage_options: dict[str, Any] | None = None,
        *,
        mode: SnapshotMode = "initial",
        from_version: int | None = None,
        from_timestamp: str | int | None = None,
        check_interval_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        allowed_path_prefixes: Iterable[str] = (),
    ) -> None:
        if mode not in SNAPSHOT_MODES:
            raise ValueError(f"unknown snapshot mode {mode!r}")
        self.table = open_table(uri, storage_options, allowed_path_prefixes=allowed_path_prefixes)
        self.storage = self.table.storage
        self.uri = self.table.uri
        self.mode = mode
        self.from_version = from_version
        self.from_timestamp = from_timestamp
        self.check_interval_s = check_interval_s
        self._clock = clock
        self._pending: deque[Work] = deque()
        self._ahead: deque[tuple[int, FileInfo]] = deque()
        self._table_id: str | None = None
        self._metadata: Metadata | None = None
        self._cursor = -1
        self._tracker = TimestampTracker(IctConfig())
        self._v0: FileInfo | None = None
        self._next_check = 0.0
        self._idle = True
        self._prefetch = CommitPrefetch(self.storage)

    def __repr__(self) -> str:
        return f"TableWatcher({self.uri!r}, cursor={self._cursor})"

    def close(self) -> None:
        """Stop reading ahead (the watcher can be started again)."""
        self._prefetch.close()

    @property
    def table_id(self) -> str | None:
        return self._table_id

    @property
    def cursor(self) -> int:
        """The last version handed out (or the version a start position is at)."""
        return self._cursor

    def next_commit_size(self) -> int:
        """Size in bytes of the next commit already found (0 if none is known yet)."""
        return self._ahead[0][1].size if self._ahead and not self._pending else 0

    @property
    def versions_ahead(self) -> int:
        """Versions known to exist after the cursor (a lower bound while catching up)."""
        return len(self._ahead)

    # --- starting ------------------------------------------------------------------------------

    def start(self, position: Position | None) -> None:
        """(Re)start right after ``position``; without one, where the snapshot mode says.

        Called again after any failure with the last committed position: everything handed out
        since is forgotten and will be handed out again.
        """
        self._pending.clear()
        self._ahead.clear()
        self._prefetch.clear()
        self._v0 = self._stat_version0()
        self._idle = True
        self._next_check = self._clock() + self.check_interval_s
        if position is None:
            self._start_fresh(self.mode)
        else:
            self._resume(position)

    def _start_fresh(self, mode: str, *, replaced: bool = False) -> None:
        latest = self.table.latest_version()
        if mode in ("initial", "when-needed"):
            self._begin_snapshot(latest)
            return
        if mode == "latest" and not replaced:
            head = self._checked_head(latest)
            ts = timestamp_of(self.table, latest, head.ict)
            self._set_cursor(head.metadata, latest, head.ict, ts)
            self._pending.append(PositionWork(Position(head.metadata.id, latest, -1, 0, ts)))
            return
        if replaced or mode == "latest":
            first = min(self.table.listing(0).commits, default=None)
            if first is None or first != 0:
                self._begin_snapshot(latest)  # the new table's start is gone: its state will do
                return
            start = 0
        elif mode == "from-version":
            assert self.from_version is not None, "from-version needs from_version"
            start = self.from_version
        else:
            assert self.from_timestamp is not None, "from-timestamp needs from_timestamp"
            ts_ms = (
                parse_timestamp(self.from_timestamp)
                if isinstance(self.from_timestamp, str)
                else int(self.from_timestamp)
            )
            ict = read_head(self.table, latest).ict
            found = version_at_or_after(self.table.commit_timestamps(ict=ict), ts_ms, ict, table=self.uri)
            start = latest + 1 if found is None else found
        self._begin_at(start, latest)

    def _checked_head(self, version: int) -> TableHead:
        head = read_head(self.table, version)
        features.check_table(head.protocol, head.metadata, table=self.uri, version=head.version)
        return head

    def _begin_at(self, start: int, latest: int) -> None:
        """Publish from version ``start`` on (it may not exist yet)."""
        if start <= latest:
            listing = self.table.listing(start)
            if start not in listing.commits:
                raise VersionNotFoundError(
                    f"version {start} is not in the log (cleaned up, or never written)",
                    table=self.uri,
                    version=start,
                )
        try:
            head = self._checked_head(min(start, latest))
        except VersionNotFoundError:  # cleaned up before any checkpoint: the latest state names the table
            head = self._checked_head(latest)
        previous = previous_timestamp(self.table, min(start - 1, latest), head.ict) if start > 0 else None
        self._set_cursor(head.metadata, start - 1, head.ict, previous)

    def _begin_snapshot(self, version: int) -> None:
        snap = self.table.snapshot(version)
        ict = IctConfig.from_configuration(snap.metadata.configuration)
        ts = timestamp_of(self.table, version, ict)
        self._set_cursor(snap.metadata, version, ict, ts)
        self._pending.append(SnapshotWork(snap, self.uri, ts))

    def _set_cursor(
        self,
        metadata: Metadata,
        version: int,
        ict: IctConfig,
        previous: CommitTimestamp | None,
        table_id: str | None = None,
    ) -> None:
        """Hand out what follows ``version``; ``metadata`` is in force there (the partition
        columns the next versions' file actions must name)."""
        self._table_id = table_id or metadata.id
        self._metadata = metadata
        self._cursor = version
        self._tracker = TimestampTracker(ict, previous)

    def _resume(self, position: Position) -> None:
        latest = self.table.latest_version()
        if latest < position.version:
            self._replaced(position, f"the latest version went backwards ({position.version} -> {latest})")
            return
        try:
            head: TableHead | None = read_head(self.table, position.version)
        except VersionNotFoundError:
            head = None
        if head is not None and head.metadata.id != position.table_id:
            self._replaced(position, f"version {position.version} now belongs to table {head.metadata.id}")
            return
        if head is None:
            # the published version cannot be rebuilt any more (log cleaned): fine if what follows is there
            needed = position.version + (1 if position.complete else 0)
            if needed not in self.table.listing(needed).commits:
                self._gap(position.version, latest, position)
                return
            head = read_head(self.table, latest)
        features.check_table(head.protocol, head.metadata, table=self.uri, version=head.version)
        self._set_cursor(head.metadata, position.version, head.ict, position.timestamp, position.table_id)
        if position.complete:
            return
        start = position.index + 1
        if position.snapshot:
            if head.version != position.version:
                self._gap(position.version, latest, position)
                return
            snap = self.table.snapshot(position.version)
            self._pending.append(SnapshotWork(snap, self.uri, position.timestamp, start))
            return
        info = self.table.listing(position.version).commits.get(position.version)
        if info is None:
            self._gap(position.version, latest, position)
            return
        scan = scan_version(self.storage, position.version, info, metadata=head.metadata)
        self._pending.append(
            CommitWork(self.storage, position.table_id, position.version, position.timestamp, scan, start)
        )

    def _gap(self, missing_after: int, latest: int, position: Position | None) -> None:
        if self.mode == "when-needed":
            log.warning(
                "versions after %d were cleaned from the log before they were published: new snapshot",
                missing_after,
                extra={"table": self.uri, "version": latest},
            )
            self._begin_snapshot(latest)
            return
        raise LogGapError(
            f"version {missing_after + 1} is no longer in the log but was never published "
            "(snapshot mode when-needed would publish a new snapshot)",
            table=self.uri,
            version=missing_after + 1,
        )

    def _replaced(self, position: Position, reason: str) -> None:
        self._pending.clear()
        self._ahead.clear()
        self._prefetch.clear()
        self._start_fresh(self.mode, replaced=True)
        assert self._table_id is not None
        log.warning("table re-created at the same location: %s", reason, extra={"table": self.uri})
        self._pending.appendleft(
            TableReplacedWork(position.table_id, position.version, self._table_id, reason)
        )

    # --- tailing -------------------------------------------------------------------------------

    def next_work(self) -> Work | None:
        """The next unit to publish, or None when the table has nothing new right now."""
        if self._pending:
            return self._pending.popleft()
        if not self._ahead:
            found = probe_next_versions(self.storage, self._cursor, limit=PROBE_AHEAD)
            if not found:
                self._idle = True
                if self._clock() >= self._next_check:
                    self._next_check = self._clock() + self.check_interval_s
                    self._check_log()
                    if self._pending:
                        return self._pending.popleft()
                return None
            self._ahead.extend(found)
        if self._idle:
            self._idle = False
            if self._check_version0():
                return self._pending.popleft()
        version, info = self._ahead[0]
        data = self._prefetch.take(version, info)
        self._prefetch.want(itertools.islice(self._ahead, 1, None))
        scan = scan_version(self.storage, version, info, data, self._metadata)
        if scan.protocol is not None:
            protocol = model_of("protocol", scan.protocol)
            assert isinstance(protocol, Protocol)
            features.check_readable(protocol, table=self.uri, version=version)
        if scan.metadata is not None:
            metadata = model_of("metaData", scan.metadata)
            assert isinstance(metadata, Metadata)
            file = self.storage.log_file(commit_name(version))
            features.check_schema(metadata.located(Where(self.uri, file, version), scan.metadata_line))
            self._metadata = metadata
            self._tracker.observe_metadata(metadata)
            if metadata.id != self._table_id:
                log.warning(
                    "metaData.id changed within the log (%s -> %s)",
                    self._table_id,
                    metadata.id,
                    extra={"table": self.uri, "version": version},
                )
                self._table_id = metadata.id
        ict_value = (scan.commit_info or {}).get("inCommitTimestamp")
        ts = self._tracker.resolve(
            version, info.modification_time, ict_value if isinstance(ict_value, int) else None
        )
        self._ahead.popleft()
        self._cursor = version
        assert self._table_id is not None
        return CommitWork(self.storage, self._table_id, version, ts, scan)

    def _current_position(self) -> Position:
        assert self._table_id is not None
        ts = self._tracker.previous or CommitTimestamp(self._cursor, 0, TimestampSource.FILE_TIME)
        return Position(self._table_id, self._cursor, 0, 1, ts)

    def _stat_version0(self) -> FileInfo | None:
        try:
            return self.storage.info(self.storage.log_file(commit_name(0)))
        except FileNotFoundError:
            return None

    def _check_version0(self) -> bool:
        """True (and work queued) when ``0.json`` was written again, for another table.

        Log cleanup deletes ``0.json`` and never writes it back: a new one means a new table.
        """
        info = self._stat_version0()
        known, self._v0 = self._v0, info
        if info is None or info == known:
            return False
        new_id = _v0_table_id(self.storage)
        if new_id is None or new_id == self._table_id:
            return False
        self._replaced(self._current_position(), f"version 0 was written again with metaData.id {new_id}")
        return True

    def _check_log(self) -> None:
        """The slow checks (a listing): the table deleted, re-created, or versions cleaned unpublished."""
        latest = self.table.latest_version()
        if latest < self._cursor:
            self._replaced(
                self._current_position(), f"the latest version went backwards ({self._cursor} -> {latest})"
            )
            return
        if self._check_version0():
            return
        if latest > self._cursor and self._cursor + 1 not in self.table.listing(self._cursor + 1).commits:
            self._gap(self._cursor, latest, None)


# --- waking up early on a local file system -------------------------------------------------


class LogWaker:
    """Waits for the next poll, or less when a file appears in a local ``_delta_log``.

    Notifications come from watchdog (inotify, FSEvents, ReadDirectoryChangesW). They only shorten
    the wait: the listing stays the source of truth, so a lost or spurious notification costs at
    most one poll interval. Object stores have no notifications here: there it simply waits.
    """

    def __init__(self, storage: TableStorage, enabled: bool = True) -> None:
        self._changed = threading.Event()
        self._observer: Any = None
        if not enabled or not storage.uri.startswith("file://"):
            return
        from watchdog.events import FileSystemEvent, FileSystemEventHandler
        from watchdog.observers import Observer

        changed = self._changed

        class _OnLogFile(FileSystemEventHandler):
            def on_any_event(self, event: FileSystemEvent) -> None:
                if event.event_type in ("created", "moved", "closed") and not event.is_directory:
                    changed.set()

        observer = Observer()
        try:
            observer.schedule(_OnLogFile(), storage.log_path, recursive=False)
            observer.daemon = True
            observer.start()
        except OSError as exc:  # no _delta_log yet, or the inotify watch limit reached: just poll
            log.info("no file notifications for %s (%s); polling", storage.log_path, exc)
            return
        self._observer = observer

    @property
    def notifying(self) -> bool:
        return self._observer is not None

    def wait(self, timeout: float, stop: threading.Event | None = None) -> None:
        """Return after ``timeout`` seconds, on a log file event, or when ``stop`` is set."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or (stop is not None and stop.is_set()):
                return
            if self._changed.wait(min(left, 0.1)):
                self._changed.clear()
                return

    def close(self) -> None:
        if self._observer is not None:
            self._observer.stop()
            self._observer.join(timeout=5)
            self._observer = None


__all__ = [
    "SNAPSHOT_MODES",
    "CommitWork",
    "LogWaker",
    "Position",
    "PositionWork",
    "PublishUnit",
    "SnapshotWork",
    "TableReplacedWork",
    "TableWatcher",
    "Work",
    "position_after",
    "scan_version",
    "timestamp_of",
]
