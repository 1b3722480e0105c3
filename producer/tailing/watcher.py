"""Following one table's log: what to publish next, from where the last publish stopped.

The watcher knows nothing of Kafka. Given the last published :class:`~.work.Position` (from the
progress topic) or a snapshot mode, it hands out units of work (:mod:`.work`) in order: a snapshot,
a commit, the announcement that the location holds a new table, or a bare start position. The
publisher turns them into records; after any failure the service calls :meth:`TableWatcher.start`
again with the last *committed* position, so a version is never skipped and never published twice.

An idle table costs the same whatever its log's length (no periodic listing): each poll is one
``stat`` of ``<next>.json``, and every ``check_interval_s`` two more ``stat`` calls notice what that
probe cannot see:

* ``0.json`` with another identity: the table may have been re-created at the same path (its
  ``metaData.id`` is read only then); it is also checked whenever new versions appear.
* ``<cursor>.json`` gone or rewritten: the table was deleted, re-created with fewer versions, or
  cleaned past what was published (a log cleanup deletes the oldest commits first, so versions
  after the cursor are never gone while the cursor's own file is there). Only then is the log
  listed, to tell which.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from deltamirror.core.commits import TimestampTracker, probe_next_versions
from deltamirror.core.errors import LogGapError, TableNotFoundError, VersionNotFoundError
from deltamirror.core.head import (
    TableHead,
    previous_timestamp,
    read_head,
    read_latest_head,
    timestamp_of,
    version0_table_id,
)
from deltamirror.core.log import commit_name
from deltamirror.core.models import Metadata
from deltamirror.core.readahead import CommitReadAhead
from deltamirror.core.storage import FileInfo
from deltamirror.core.table import open_table
from deltamirror.core.timestamps import (
    CommitTimestamp,
    IctConfig,
    TimestampSource,
    parse_timestamp,
    version_at_or_after,
)
from deltamirror.producer.discovery.scan import GONE_TABLES
from deltamirror.producer.tailing.snapshot_events import SnapshotWork
from deltamirror.producer.tailing.waker import LogWaker
from deltamirror.producer.tailing.work import (
    SMALL_COMMIT_BYTES,
    CommitWork,
    NetCatchUpWork,
    NetChangesWork,
    Position,
    PositionWork,
    PublishUnit,
    TableDroppedWork,
    TableReplacedWork,
    Work,
    position_after,
    scan_version,
)

from ..settings import DUE_EARLY_S, SNAPSHOT_MODES, SnapshotMode

log = logging.getLogger(__name__)


#: versions probed ahead in one go while catching up
PROBE_AHEAD = 100


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
        drop_when_gone: bool = False,
        net_catch_up: bool = False,
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
        #: discovery no longer finding the table and its log empty end it with TableDroppedWork
        self.drop_when_gone = drop_when_gone
        #: a fresh start at a version hands out the versions up to the latest as one net catch-up
        self.net_catch_up = net_catch_up
        #: set by another thread (an operator's signal): a fresh snapshot at the cursor comes next
        self.snapshot_requested = threading.Event()
        #: set by another thread (a ``net-changes`` signal): the first version of a net block next,
        #: and how the signal is answered once the block is published or refused
        self._net_changes_from: tuple[int, Callable[[str | None], None]] | None = None
        self._net_lock = threading.Lock()
        #: closed (the table stopped here): a request for a net block is refused at once
        self._closed = False
        self._clock = clock
        self._pending: deque[Work] = deque()
        self._ahead: deque[tuple[int, FileInfo]] = deque()
        self._table_id: str | None = None
        self._metadata: Metadata | None = None
        self._cursor = -1
        self._tracker = TimestampTracker(IctConfig())
        self._v0: FileInfo | None = None
        #: the file of the version at the cursor, as last seen (None: not seen yet)
        self._cursor_file: tuple[int, FileInfo] | None = None
        self._next_check = 0.0
        self._idle = True
        self._prefetch = CommitReadAhead(self.storage, max_bytes=SMALL_COMMIT_BYTES)
        #: a log file the last listing of a gone-marked table found: while it exists, the log holds
        #: a version, and one stat of it stands for a listing on every idle poll
        self._log_witness: str | None = None

    def __repr__(self) -> str:
        return f"TableWatcher({self.uri!r}, cursor={self._cursor})"

    def close(self) -> None:
        """Stop reading ahead (the watcher can be started again); a net block asked for and not
        handed out yet is refused (its signal is answered so)."""
        self._prefetch.close()
        with self._net_lock:
            asked, self._net_changes_from = self._net_changes_from, None
            self._closed = True
        if asked is not None:
            asked[1]("the table stopped here before publishing the block")

    @property
    def table_id(self) -> str | None:
        return self._table_id

    @property
    def configuration(self) -> dict[str, str]:
        """The table's properties in force at the cursor (``metaData.configuration``)."""
        return dict(self._metadata.configuration) if self._metadata is not None else {}

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
        with self._net_lock:
            self._closed = False
        self._v0 = self._stat_version0()
        self._cursor_file = None
        self._idle = True
        self._next_check = self._clock() + self.check_interval_s
        if position is None:  # nothing published: nothing a drop could name
            self._table_id, self._cursor = None, -1
        if self._gone_for_good(position):
            return
        try:
            if position is None:
                self._start_fresh(self.mode)
            else:
                self._resume(position)
        except TableNotFoundError:
            if not self._gone_for_good(position, seen_missing=True):
                raise

    def _start_fresh(self, mode: str, *, replaced: bool = False) -> None:
        if mode == "latest" and not replaced:  # the latest version, its head and time: one listing
            head, ts = read_latest_head(self.table)
            self._set_cursor(head.metadata, head.version, head.ict, ts)
            self._pending.append(PositionWork(Position(head.metadata.id, head.version, -1, 0, ts)))
            return
        latest = self.table.latest_version()
        if mode in ("initial", "when-needed"):
            self._begin_snapshot(latest)
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
            ict = read_head(self.table, latest, check_features=False).ict  # the start's head is checked
            found = version_at_or_after(self.table.commit_timestamps(ict=ict), ts_ms, ict, table=self.uri)
            start = latest + 1 if found is None else found
        self._begin_at(start, latest)
        if self.net_catch_up and not replaced and start <= latest:
            self._pending.append(NetCatchUpWork(start, latest))

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
            head = read_head(self.table, min(start, latest))
        except VersionNotFoundError:  # cleaned up before any checkpoint: the latest state names the table
            head = read_head(self.table, latest)
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
            # checked once the id says the table is the one published (a replaced one is announced first)
            head: TableHead | None = read_head(self.table, position.version, check_features=False)
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
            head = read_head(self.table, latest, check_features=False)
        head = head.check_readable()
        self._set_cursor(head.metadata, position.version, head.ict, position.timestamp, position.table_id)
        if position.complete:
            return
        start = position.index + 1
        if position.snapshot:
            if head.version != position.version:
                self._gap(position.version, latest, position)
                return
            snap = self.table.snapshot(position.version)
            self._pending.append(
                SnapshotWork(snap, self.uri, position.timestamp, start, row_offset=position.row_offset or 0)
            )
            return
        info = self.table.listing(position.version).commits.get(position.version)
        if info is None:
            self._gap(position.version, latest, position)
            return
        scan = scan_version(self.storage, position.version, info, metadata=head.metadata)
        previous = None
        if scan.checked.metadata is not None and position.version > 0:  # what a schemaChanged compares
            with contextlib.suppress(VersionNotFoundError):  # cleaned: the version's record says nothing
                previous = read_head(self.table, position.version - 1, check_features=False).metadata
        self._pending.append(
            CommitWork(
                self.storage,
                position.table_id,
                position.version,
                position.timestamp,
                scan,
                start,
                metadata=head.metadata,
                row_offset=position.row_offset or 0,
                previous_metadata=previous,
            )
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
        if self.snapshot_requested.is_set() and self._table_id is not None and self._cursor >= 0:
            self.snapshot_requested.clear()
            return self._fresh_snapshot()
        net = self._net_changes_block()
        if net is not None:
            return net
        if not self._ahead:
            found = probe_next_versions(self.storage, self._cursor, limit=PROBE_AHEAD)
            if not found:
                self._idle = True
                if self._gone_for_good(None):
                    return self._pending.popleft()
                self._prefetch.close()  # no read-ahead thread while there is nothing to read
                # a turn may come DUE_EARLY_S early (the scheduler): a check as long as the poll
                # would otherwise wait a whole poll more, every other turn
                if self._clock() >= self._next_check - DUE_EARLY_S:
                    self._next_check = self._clock() + self.check_interval_s
                    self._check_idle_log()
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
        scan = scan_version(self.storage, version, info, data, self._metadata, self._tracker)
        metadata = scan.checked.metadata
        previous = self._metadata if metadata is not None else None
        if metadata is not None:
            self._metadata = metadata
            if metadata.id != self._table_id:
                log.warning(
                    "metaData.id changed within the log (%s -> %s)",
                    self._table_id,
                    metadata.id,
                    extra={"table": self.uri, "version": version},
                )
                self._table_id = metadata.id
        ts = scan.checked.timestamp
        assert ts is not None  # resolved by the tracker
        self._ahead.popleft()
        self._cursor = version
        self._cursor_file = (version, info)
        assert self._table_id is not None
        return CommitWork(
            self.storage,
            self._table_id,
            version,
            ts,
            scan,
            metadata=self._metadata,
            previous_metadata=previous,
        )

    def _current_position(self) -> Position:
        assert self._table_id is not None
        ts = self._tracker.previous or CommitTimestamp(self._cursor, 0, TimestampSource.FILE_TIME)
        return Position(self._table_id, self._cursor, 0, 1, ts)

    def _stat_version0(self) -> FileInfo | None:
        try:
            return self.storage.info(self.storage.log_file(commit_name(0)))
        except FileNotFoundError:
            return None

    def _fresh_snapshot(self) -> SnapshotWork:
        """The table at the cursor (the last version handed out) as a snapshot, between two versions:
        nothing is skipped or repeated, and the next version follows it."""
        snap = self.table.snapshot(self._cursor)
        ts = self._tracker.previous or timestamp_of(
            self.table, self._cursor, IctConfig.from_configuration(snap.metadata.configuration)
        )
        log.info("publishing a fresh snapshot on request", extra={"table": self.uri, "version": self._cursor})
        return SnapshotWork(snap, self.uri, ts)

    def request_net_changes(
        self, first: int, answer: Callable[[str | None], None], *, again: bool = False
    ) -> None:
        """Publish the net row changes of versions ``first`` to the cursor next (a signal, answered
        through ``answer`` once the block is published or refused). A request not handed out yet
        is replaced, and answered as such. ``again``: a request handed out before and not published
        (the table restarted): a newer one waiting replaces it instead."""
        with self._net_lock:
            closed, waiting = self._closed, self._net_changes_from
            if not closed and not (again and waiting is not None):
                self._net_changes_from = (first, answer)
        if closed:
            answer("the table stopped here before publishing the block")
        elif again and waiting is not None:
            answer(f"replaced by a newer net-changes signal (from version {waiting[0]})")
        elif waiting is not None:
            waiting[1](f"replaced by a newer net-changes signal (from version {first})")

    def _net_changes_block(self) -> NetChangesWork | None:
        """The net block a signal asked for, between two versions: over ``first`` to the last version
        handed out, so the next version follows it with no gap and no duplicate. (The owner checked
        ``first`` against its committed version, which the cursor never trails.)"""
        if self._table_id is None or self._cursor < 0 or self._metadata is None:
            return None
        with self._net_lock:
            asked, self._net_changes_from = self._net_changes_from, None
        if asked is None:
            return None
        first, answer = asked
        try:
            ts = self._tracker.previous or timestamp_of(
                self.table, self._cursor, IctConfig.from_configuration(self._metadata.configuration)
            )
        except Exception as exc:
            answer(f"the commit time of version {self._cursor} could not be read ({exc})")
            raise
        log.info(
            "publishing the net row changes of versions %d to %d on request",
            first,
            self._cursor,
            extra={"table": self.uri, "version": self._cursor},
        )
        return NetChangesWork(first, self._cursor, self._table_id, self._metadata, ts, answer)

    def _gone_for_good(self, position: Position | None, *, seen_missing: bool = False) -> bool:
        """True (and TableDroppedWork queued) when the table is deleted for good (``drop_when_gone``).

        Looked at when discovery no longer finds the table (:mod:`..discovery.scan`: a set lookup per
        idle poll), or when reading the log found no version (``seen_missing``, a table published
        before; a wrong location that never held a table is an error, not a drop); either way a
        listing must find no commit or checkpoint left. While a marked table's log still holds
        versions, the newest file the listing found is stat'ed instead of listing again.
        """
        if not self.drop_when_gone:
            return False
        marked = self.uri in GONE_TABLES
        table_id, version = (
            (position.table_id, position.version) if position is not None else (self._table_id, self._cursor)
        )
        if not (marked or (seen_missing and table_id is not None)):
            return False
        if self._log_witness is not None:
            try:
                self.storage.info(self._log_witness)
                return False  # a commit or checkpoint is still there
            except FileNotFoundError:
                self._log_witness = None
        listing = self.table.listing(0)
        if listing.commits:
            self._log_witness = self.storage.log_file(listing.commits[max(listing.commits)].name)
            return False
        if listing.checkpoints:
            newest = listing.checkpoints[max(listing.checkpoints)]
            self._log_witness = self.storage.log_file(newest.files[0].name)
            return False
        self._pending.clear()
        self._ahead.clear()
        self._prefetch.clear()
        self._pending.append(TableDroppedWork(table_id, version, "no commit or checkpoint left in the log"))
        return True

    def _check_version0(self) -> bool:
        """True (and work queued) when ``0.json`` was written again, for another table.

        Log cleanup deletes ``0.json`` and never writes it back: a new one means a new table.
        """
        info = self._stat_version0()
        known, self._v0 = self._v0, info
        if info is None or info == known:
            return False
        new_id = version0_table_id(self.storage)
        if new_id is None or new_id == self._table_id:
            return False
        self._replaced(self._current_position(), f"version 0 was written again with metaData.id {new_id}")
        return True

    def _check_idle_log(self) -> None:
        """What the probe of the next version cannot see, at a cost independent of the log's length."""
        if self._cursor >= 0:
            try:
                info: FileInfo | None = self.storage.info(self.storage.log_file(commit_name(self._cursor)))
            except FileNotFoundError:
                info = None
            known, self._cursor_file = self._cursor_file, None if info is None else (self._cursor, info)
            if info is None or (known is not None and known[0] == self._cursor and known[1] != info):
                self._check_log()  # gone or rewritten: list the log, once, to tell why
                return
        self._check_version0()

    def _check_log(self) -> None:
        """The slow checks (a listing): the table deleted, re-created, or versions cleaned unpublished."""
        try:
            latest = self.table.latest_version()
        except TableNotFoundError:
            if self._gone_for_good(None, seen_missing=True):
                return
            raise
        if latest < self._cursor:
            self._replaced(
                self._current_position(), f"the latest version went backwards ({self._cursor} -> {latest})"
            )
            return
        if self._check_version0():
            return
        if latest > self._cursor and self._cursor + 1 not in self.table.listing(self._cursor + 1).commits:
            self._gap(self._cursor, latest, None)


__all__ = [
    "SNAPSHOT_MODES",
    "CommitWork",
    "LogWaker",
    "Position",
    "PositionWork",
    "PublishUnit",
    "SnapshotMode",
    "SnapshotWork",
    "TableReplacedWork",
    "TableWatcher",
    "Work",
    "position_after",
    "scan_version",
    "timestamp_of",
]
