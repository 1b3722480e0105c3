"""The state of one mirrored table (its active files and the rest), applied version by version.

:class:`IncrementalSnapshot` is the state of one table (one ``tableId``), applied from its action
events. The active files are one Arrow table with the columns of a checkpoint's ``add`` (as
``Snapshot.files``), in the order they became active. Nothing is applied per action: a version's
events are collected (:class:`~.pending.PendingVersion`; one by one with :meth:`~IncrementalSnapshot.apply`,
or as segments the batch decoder already turned into Arrow rows with
:meth:`~IncrementalSnapshot.apply_segment`) and reconciled with the files once, when its last
action arrives, by core's own replay rule (:func:`deltamirror.core.replay.reconcile`: newest action
per canonical path + deletion vector id wins). A version costs what it names, not what the state
holds: the files it names are found by :class:`~.files.PathIndex`, the ones it removes are marked
and dropped when :attr:`~IncrementalSnapshot.files` is read (or once they are an eighth of the
rows), its files are appended. What the version changed (:class:`Invalidation`) is computed with
the same keys, by the kernels of :mod:`.files`, and kept in Arrow until read.

The state serializes itself as a document (everything but the files) beside its files: in format 3
the document is the footer of a Delta checkpoint of the files (:mod:`.delta_checkpoint`, what
:class:`~.store.StateStore` writes); in format 2 it was a JSON sidecar beside a Parquet file of the
files; format 1 has every ``add`` inline in one JSON document. Formats 1 and 2 are still read (and
migrated by the store).
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Callable, Iterable, Iterator, Mapping
from itertools import accumulate
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from deltamirror.core import action_schema
from deltamirror.core.compute import pc
from deltamirror.core.deletion_vectors import dv_unique_id
from deltamirror.core.errors import ConfigError
from deltamirror.core.replay import canonical_paths, file_keys, reconcile
from deltamirror.mirror.errors import EventStreamError
from deltamirror.mirror.records.events import ActionEvent

from .files import (
    PathIndex,
    compact,
    gone,
    keys,
    needs_compaction,
    positions_from,
    share_nulls,
    snapshot_changes,
    take_rows,
)
from .invalidation import Invalidation, Partitions, Paths
from .pending import PendingVersion
from .stats_spill import StatsSpill

if TYPE_CHECKING:
    from pathlib import Path

    from deltamirror.mirror.records.boundary import RecordRules
    from deltamirror.mirror.records.event_batches import Envelope, Segment

#: a Delta checkpoint per table (:mod:`.delta_checkpoint`)
STATE_FORMAT = 3
#: a JSON sidecar beside a Parquet file of the files, per table (read and migrated)
STATE_FORMAT_PARQUET = 2
#: the format that kept every ``add`` inline in the table's JSON file (read and migrated)
STATE_FORMAT_JSON = 1

FileKey = tuple[str, str]
"""(canonical path, deletion vector id or ""): one logical file, as core's replay keys it."""

_FILE_SCHEME = re.compile(r"^file:/+")
#: the rows of files gone a stats spill may hold beyond the live files' before it is written anew
SPILL_SLACK_ROWS = 65_536
#: the files as held with their stats on disk: each file's reference in the spill for its stats
SPILLED = action_schema.ADD.set(action_schema.ADD.get_field_index("stats"), pa.field("stats", pa.int64()))


def file_key(action: Mapping[str, Any]) -> FileKey:
    """The replay key of an ``add`` or ``remove`` (same rule as ``core.replay.file_keys``)."""
    path = str(action["path"])
    if path.startswith("file:"):
        path = _FILE_SCHEME.sub("/", path)
    dv = action.get("deletionVector")
    dv_id = dv_unique_id(dv["storageType"], dv["pathOrInlineDv"], dv.get("offset")) if dv else ""
    return path, dv_id


class IncrementalSnapshot:
    """The state of one table, applied from its action events in order.

    A version is applied when its last action (``index == count - 1``) arrives, all at once; until
    then nothing changes. A snapshot (``snapshot: true``) replaces the whole state at its end and
    supersedes an unfinished version. ``complete`` tells whether the state is the whole table: it
    is, once built from version 0 or from a snapshot; a stream that starts at a later version
    (watcher mode ``from-version``) only has the files added since.
    """

    def __init__(self, table_id: str, table_uri: str | None = None) -> None:
        self.table_id = table_id
        self.table_uri = table_uri
        self.version: int | None = None
        #: the commit timestamp (epoch ms) of ``version``, as the events resolved it
        self.commit_timestamp: int | None = None
        self.complete = False
        self.metadata: dict[str, Any] | None = None
        self.protocol: dict[str, Any] | None = None
        self.txns: dict[str, dict[str, Any]] = {}
        self.domains: dict[str, dict[str, Any]] = {}
        #: the files, and rows removed since (their positions in it, dropped when read: :attr:`files`)
        self._files_held: pa.Table = action_schema.ADD.empty_table()
        #: a state loaded from its checkpoint reads its files there when first needed (a restart
        #: with nothing new to apply reads none): the reader, and how many files it gives
        self._files_loader: Callable[[], pa.Table] | None = None
        self._files_unread = 0
        self._dead: set[int] = set()
        self._paths: PathIndex | None = None  # built on first use
        #: where the files' stats are when they are not in memory (:meth:`spill_stats`): then the
        #: ``stats`` column of ``_files`` holds their references in it
        self._spill: StatsSpill | None = None
        self._pending: PendingVersion | None = None
        self._invalidations: list[Invalidation] = []
        #: events ignored because their version was already applied (a re-read after a restart)
        self.skipped_events = 0

    def __repr__(self) -> str:
        return f"IncrementalSnapshot({self.table_id!r}, version={self.version}, files={self.file_count})"

    # --- reading -------------------------------------------------------------------------------

    @property
    def _files(self) -> pa.Table:
        """The files held, read from the saved checkpoint on first use (:meth:`from_document`)."""
        loader = self._files_loader
        if loader is not None:
            self._files_held = share_nulls(loader())
            self._files_loader = None
        return self._files_held

    @_files.setter
    def _files(self, files: pa.Table) -> None:
        self._files_loader = None
        self._files_held = files

    @property
    def files_loaded(self) -> bool:
        """False while the files of a loaded state are still only in its saved checkpoint."""
        return self._files_loader is None

    @property
    def file_count(self) -> int:
        if self._files_loader is not None:
            return self._files_unread
        return int(self._files.num_rows) - len(self._dead)

    @property
    def files(self) -> pa.Table:
        """Active files with the columns of a checkpoint's ``add`` (as ``Snapshot.files``).

        The state itself (no copy), in the order the files became active; do not rely on an order.
        A version marks the rows it removes and this drops them when read (one pass for all the
        versions since, where removing them at once would copy every file each version). With
        the stats on disk (:meth:`spill_stats`), they are read back into the table returned.
        """
        live = self._live()
        if self._spill is None:
            return live
        return self._with_stats(live)

    def file_batches(self, rows: int) -> Iterator[pa.Table]:
        """:attr:`files`, at most ``rows`` at a time (stats on disk are read a part at a time).

        The rows removed since are dropped from each part as it is made, not from the state: a
        save does not copy every file to drop a few (the state drops them when :attr:`files` is
        read, or once they are an eighth of its rows)."""
        files = self._files
        dead = pa.array(sorted(self._dead), pa.int64()) if self._dead else None
        for start in range(0, files.num_rows, rows):
            part = files.slice(start, rows)
            if dead is not None:
                gone_here = pc.is_in(positions_from(start, part.num_rows), value_set=dead)
                if pc.any(gone_here).as_py():
                    part = part.filter(pc.invert(gone_here))
            if part.num_rows:
                yield part if self._spill is None else self._with_stats(part)

    @property
    def stats_on_disk(self) -> bool:
        """Whether the files' ``stats`` are kept on disk (:meth:`spill_stats`), not in memory."""
        return self._spill is not None

    def spill_stats(self, directory: str | Path | None = None) -> None:
        """Keep the files' ``stats`` on disk from now on (a temporary file in ``directory``),
        those of the files held now included; nothing when they are already."""
        if self._spill is not None:
            return
        spill = StatsSpill(directory)
        files = self._files
        at = files.schema.get_field_index("stats")
        refs = pa.chunked_array([spill.put(c) for c in files.column(at).chunks], pa.int64())
        self._files = files.set_column(at, pa.field("stats", pa.int64()), refs)
        self._spill = spill

    def _with_stats(self, files: pa.Table) -> pa.Table:
        assert self._spill is not None
        at = files.schema.get_field_index("stats")
        stats = pa.chunked_array([self._spill.get(c) for c in files.column(at).chunks], pa.string())
        return files.set_column(at, action_schema.ADD.field("stats"), stats)

    def _compact_spill(self) -> None:
        """A new spill of the live files' stats once most of the spill is of files gone."""
        spill = self._spill
        if spill is None or spill.rows + spill.base_rows <= 2 * self.file_count + SPILL_SLACK_ROWS:
            return
        files = self._live()
        at = files.schema.get_field_index("stats")
        fresh, refs = spill.copy(files.column(at))
        self._files = files.set_column(at, files.schema.field(at), refs)
        self._spill = fresh
        spill.close()

    def _live(self) -> pa.Table:
        """The files with the rows removed since dropped, stats as held (see :attr:`files`)."""
        if self._dead:
            dead = pa.array(sorted(self._dead), pa.int64())
            # chunk by chunk, each replaced as soon as it is filtered: one chunk more, not a copy
            batches, schema = self._files.to_batches(), self._files.schema
            self._files = schema.empty_table()
            first = 0
            for i, batch in enumerate(batches):
                gone_here = pc.is_in(positions_from(first, batch.num_rows), value_set=dead)
                first += batch.num_rows
                if pc.any(gone_here).as_py():
                    batches[i] = batch.filter(pc.invert(gone_here))
            del batch
            files = pa.Table.from_batches(batches, schema)
            self._files = share_nulls(compact(files) if needs_compaction(files) else files)
            if self._paths is not None:
                self._paths.drop(dead)
            self._dead = set()
        return self._files

    @property
    def file_keys(self) -> set[FileKey]:
        """The replay keys of the active files (built from :attr:`files`; for tests and debugging)."""
        files = self._live()
        found = file_keys(files["path"], files["deletionVector"]).to_pylist()
        return {(p, d) for p, _, d in (str(k).partition("\x00") for k in found)}

    @property
    def in_progress(self) -> bool:
        """True while a version or snapshot has arrived only in part."""
        return self._pending is not None

    def abandon_pending(self) -> None:
        """Give up the version (or snapshot) that arrived only in part: it changes nothing."""
        self._pending = None

    def invalidations(self) -> list[Invalidation]:
        """The versions applied since the last call, oldest first (the list is then emptied)."""
        out, self._invalidations = self._invalidations, []
        return out

    # --- applying ------------------------------------------------------------------------------

    def apply(self, event: ActionEvent) -> Invalidation | None:
        """Take one event; the :class:`Invalidation` when it completed a version, else None."""
        pending = self._begin(event, event.index, 1)
        if pending is None:
            return None
        pending.take(event)
        if event.index + 1 < event.count:
            return None
        return self._complete(pending, event.snapshot_end)

    def apply_segment(self, segment: Segment) -> Invalidation | None:
        """Take the events of a decoded segment (consecutive events of one version, see
        :func:`~deltamirror.mirror.records.event_batches.decode_action_events`) as :meth:`apply` takes them
        one by one: the same checks, the same errors, the same state after."""
        pending = self._begin(segment.envelope, segment.first_index, segment.stop - segment.start)
        if pending is None:
            return None
        pending.take_segment(segment)
        if segment.last_index + 1 < segment.envelope.count:
            return None
        return self._complete(pending, segment.snapshot_end)

    def _begin(self, head: ActionEvent | Envelope, index: int, events: int) -> PendingVersion | None:
        """The checks :meth:`apply` and :meth:`apply_segment` share before taking ``events`` events
        from ``index`` on: the version they continue, or None when it was applied already."""
        if head.table_id != self.table_id:
            raise EventStreamError(
                f"event of table {head.table_id} given to the state of {self.table_id}", version=head.version
            )
        if self._already_applied(head.version, head.snapshot):
            self.skipped_events += events
            return None
        if self.table_uri is None:
            self.table_uri = head.table_uri
        elif head.table_uri != self.table_uri:
            raise EventStreamError(
                f"an event of table {self.table_id} says it is at {head.table_uri}, not at "
                f"{self.table_uri}: events never move a table",
                table=self.table_id,
                version=head.version,
            )
        return self._pending_for(head.version, head.snapshot, head.count, index, head.commit_timestamp)

    def _pending_for(
        self, version: int, snapshot: bool, count: int, index: int, commit_timestamp: int
    ) -> PendingVersion:
        """The version an event at ``index`` continues (or starts, at 0), after the order checks."""
        pending = self._pending
        if index == 0:
            if pending is not None and not snapshot:
                raise EventStreamError(
                    f"version {version} starts while {pending.describe()} is incomplete "
                    f"({pending.received} of {pending.count} actions)",
                    table=self.table_id,
                    version=version,
                )
            if not snapshot and self.version is not None and version != self.version + 1:
                raise EventStreamError(
                    f"version {version} follows version {self.version}: versions are missing",
                    table=self.table_id,
                    version=version,
                )
            pending = self._pending = PendingVersion(
                self.table_id, version, snapshot, count, commit_timestamp, self._spill
            )
        elif pending is None or (pending.version, pending.snapshot, pending.count) != (
            version,
            snapshot,
            count,
        ):
            raise EventStreamError(
                f"action {index} of {'snapshot' if snapshot else 'version'} {version} "
                "arrived without the actions before it",
                table=self.table_id,
                version=version,
            )
        elif index != pending.received:
            raise EventStreamError(
                f"action {index} of {pending.describe()} arrived after action {pending.received - 1}",
                table=self.table_id,
                version=version,
            )
        return pending

    def _complete(self, pending: PendingVersion, snapshot_end: bool | None) -> Invalidation:
        if pending.snapshot and snapshot_end is not True:
            raise EventStreamError(
                f"the last event of snapshot {pending.version} has no snapshotEnd",
                table=self.table_id,
                version=pending.version,
            )
        self._pending = None
        return self._apply_version(pending)

    def _already_applied(self, version: int, snapshot: bool) -> bool:
        """A version at or below the state's: re-read after a restart, or republished by the watcher."""
        if self.version is None or version > self.version:
            return False
        # a snapshot describes the table at its version: a whole state at or past it has it all;
        # a partial state (started after version 0) is completed by it
        return not snapshot or self.complete

    def _paths_at(self, rows: pa.Array) -> pa.Array:
        """The canonical paths of the rows at ``rows`` (dead ones included): what the path index
        reads instead of holding a copy of the paths."""
        column = self._files["path"]
        if column.num_chunks == 1:
            return canonical_paths(column.chunk(0).take(rows))
        # a take over the chunked column would first combine its chunks (copy every path)
        starts = list(accumulate((len(c) for c in column.chunks), initial=0))
        chunks = column.chunks
        found = []
        for row in rows.to_pylist():
            i = bisect_right(starts, row) - 1
            found.append(chunks[i][row - starts[i]].as_py())
        return canonical_paths(pa.array(found, pa.string()))

    def _named(self, adds: pa.Table, removes: pa.Table) -> tuple[pa.Table, pa.Array] | None:
        """The live rows of the state whose path an add or remove of the version names, with their
        positions; None when there is none (an append)."""
        before = self._files
        if before.num_rows == 0 or adds.num_rows + removes.num_rows == 0:
            return None
        paths = pa.chunked_array(adds["path"].chunks + removes["path"].chunks, type=pa.string())
        touched = pc.unique(canonical_paths(paths))
        if PathIndex.available and not touched.null_count:
            if self._paths is None:
                self._paths = PathIndex(canonical_paths(before["path"]), lookup=self._paths_at)
            positions = self._paths.positions(touched)
        else:  # a pass over every file
            positions = pc.indices_nonzero(pc.is_in(canonical_paths(before["path"]), value_set=touched))
        if self._dead:
            positions = pa.array([p for p in positions.to_pylist() if p not in self._dead], pa.int64())
        if len(positions) == 0:
            return None
        return take_rows(before, positions), positions

    def _apply_version(self, pending: PendingVersion) -> Invalidation:
        adds, removes = pending.file_actions()
        empty_removes = action_schema.REMOVE.empty_table()
        index = None
        if pending.snapshot and removes.num_rows == 0 and PathIndex.available:
            # a snapshot's files: sorted once for the index, which tells whether a path repeats
            index = PathIndex(canonical_paths(adds["path"]), lookup=self._paths_at)
        # the touched keys active after the version: the adds no later action of the version undid
        live, _ = reconcile(
            self._files.schema.empty_table(),
            empty_removes,
            adds,
            removes,
            distinct_paths=index is not None and index.distinct(),
        )
        live = share_nulls(live)  # the columns the table never sets cost nothing per file
        if pending.snapshot:
            before = self._live()
            files = live
            self.metadata = self.protocol = None
            self.txns, self.domains = {}, {}
            added, removed = snapshot_changes(before, live)
            # the index's positions are those of the adds: the files when every add stands
            self._paths = index if live.num_rows == adds.num_rows and index is not None else None
        elif (named := self._named(adds, removes)) is None:
            # an append (nothing the version names is in the state): no pass over the state
            files = pa.concat_tables([self._files, live]) if self._files.num_rows else live
            added, removed = live, live.slice(0, 0)
        else:
            # as core's reconcile: a named file whose key the version touched is replaced or removed
            rows, positions = named
            touched = pa.chunked_array([keys(adds), keys(removes)], type=pa.string()).combine_chunks()
            self._dead.update(positions.filter(pc.is_in(keys(rows), value_set=touched)).to_pylist())
            files = pa.concat_tables([self._files, live])
            added, removed = live, gone(rows, adds, removes, live)
        if not pending.snapshot and self._paths is not None:
            self._paths.extend(canonical_paths(live["path"]), self._files.num_rows)
            if self._paths.size > 2 * (files.num_rows - len(self._dead)) + 4096:  # mostly removed: rebuild
                self._paths = None
        self._apply_others(pending.others)
        self._files = share_nulls(compact(files)) if needs_compaction(files) else files
        if len(self._dead) > self._files.num_rows // 8:  # a bound on the rows kept dead
            self._files = self._live()
        self._compact_spill()
        self.version = pending.version
        self.commit_timestamp = pending.commit_timestamp
        self.complete = self.complete or pending.snapshot or pending.version == 0
        invalidation = Invalidation(
            self.table_id,
            pending.version,
            pending.snapshot,
            Paths(canonical_paths(added["path"])),
            Paths(canonical_paths(removed["path"])),
            Partitions(
                pa.chunked_array(
                    added["partitionValues"].chunks + removed["partitionValues"].chunks,
                    type=action_schema.STRING_MAP,
                )
            ),
            self.file_count,
        )
        self._invalidations.append(invalidation)
        return invalidation

    def _apply_others(self, others: Iterable[tuple[str, Any]]) -> None:
        for action_type, action in others:
            if action_type == "metaData":
                self.metadata = action
            elif action_type == "protocol":
                self.protocol = action
            elif action_type == "txn":
                self.txns[str(action["appId"])] = action
            elif action_type == "domainMetadata":
                if action.get("removed"):
                    self.domains.pop(str(action["domain"]), None)
                else:
                    self.domains[str(action["domain"])] = action
            # commitInfo, cdc and types this version does not know change no state

    def apply_values(
        self, values: Iterable[bytes | str], *, rules: RecordRules | None = None
    ) -> list[Invalidation]:
        """Apply serialized action events (e.g. the lines ``deltamirror events`` prints), held to
        the consumers' boundary (``rules``: :class:`~deltamirror.mirror.records.boundary.RecordRules`).

        Decoded in columns (:func:`~deltamirror.mirror.records.event_batches.decode_action_events`); when a
        value is refused, the events before it are applied first, as :meth:`apply` would.
        """
        from deltamirror.mirror.records.event_batches import decode_action_events

        batch = decode_action_events(list(values), rules=rules, partial=True)
        out = []
        for segment in batch.segments:
            applied = self.apply_segment(segment)
            if applied is not None:
                out.append(applied)
        if batch.refused is not None:
            raise batch.refused[1]
        return out

    # --- serialized forms ----------------------------------------------------------------------

    def document(self) -> dict[str, Any]:
        """Everything but the files (format 3: what a checkpoint's footer holds).

        An unfinished version is not part of the state: it is read again.
        """
        return {
            "format": STATE_FORMAT,
            "tableId": self.table_id,
            "tableUri": self.table_uri,
            "version": self.version,
            "commitTimestamp": self.commit_timestamp,
            "complete": self.complete,
            "metaData": self.metadata,
            "protocol": self.protocol,
            "txns": self.txns,
            "domains": self.domains,
            "fileCount": self.file_count,
        }

    def sidecar(self, files: str) -> dict[str, Any]:
        """Everything but the files (format 2), naming the Parquet file ``files`` that holds them.

        What the store wrote before format 3 (kept to export, and to test the migration).
        """
        return {**self.document(), "format": STATE_FORMAT_PARQUET, "files": files}

    @classmethod
    def from_sidecar(cls, data: Mapping[str, Any], files: pa.Table) -> IncrementalSnapshot:
        """The state from a format-2 sidecar and its files (any table with the ``add`` columns)."""
        if data.get("format") != STATE_FORMAT_PARQUET:
            raise ConfigError(f"unknown snapshot state format {data.get('format')!r}")
        return cls._with_files(data, files)

    @classmethod
    def from_document(
        cls,
        data: Mapping[str, Any],
        files: pa.Table | Callable[[], pa.Table],
        spill: StatsSpill | None = None,
        *,
        file_count: int | None = None,
    ) -> IncrementalSnapshot:
        """The state from a format-3 document (a checkpoint's footer) and its files (with a
        ``spill``, their ``stats`` are its references: :meth:`spill_stats`).

        ``files`` may be a function that reads them, with their ``file_count``: it is called when
        the files are first needed (a version to apply, :attr:`files`, a save), not before."""
        if data.get("format") != STATE_FORMAT:
            raise ConfigError(f"unknown snapshot state format {data.get('format')!r}")
        if isinstance(files, pa.Table):
            return cls._with_files(data, files, spill)
        if file_count is None:
            raise ValueError("files read later need their file_count")
        read, schema = files, action_schema.ADD if spill is None else SPILLED
        state = cls._with_files(data, schema.empty_table(), spill)
        state._files_loader = lambda: action_schema.conform(read(), schema)
        state._files_unread = file_count
        return state

    @classmethod
    def _with_files(
        cls, data: Mapping[str, Any], files: pa.Table, spill: StatsSpill | None = None
    ) -> IncrementalSnapshot:
        try:
            state = cls._from_fields(data)
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(
                f"a snapshot state document lacks a field or has one of a wrong type: {exc}"
            ) from None
        state._files = action_schema.conform(files, action_schema.ADD if spill is None else SPILLED)
        state._spill = spill
        return state

    def to_json(self) -> dict[str, Any]:
        """The whole state as one JSON document, every ``add`` inline (format 1).

        What :class:`~.store.StateStore` wrote before format 2; kept for export and debugging of
        small tables (a Python object per file: not for large ones).
        """
        return {
            **self.sidecar(""),
            "format": STATE_FORMAT_JSON,
            "files": action_schema.file_rows(self.files),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> IncrementalSnapshot:
        """A format-1 document (:meth:`to_json`, or a state file written before format 2)."""
        if data.get("format") != STATE_FORMAT_JSON:
            raise ConfigError(f"unknown snapshot state format {data.get('format')!r}")
        state = cls._from_fields(data)
        try:
            state._files = pa.Table.from_pylist(list(data["files"]), schema=action_schema.ADD)
        except (pa.ArrowException, TypeError, ValueError, OverflowError) as exc:
            raise ConfigError(
                f"the files of the state of table {state.table_id} do not parse: {exc}"
            ) from None
        return state

    @classmethod
    def _from_fields(cls, data: Mapping[str, Any]) -> IncrementalSnapshot:
        state = cls(str(data["tableId"]), data.get("tableUri"))
        state.version = data["version"]
        state.commit_timestamp = data.get("commitTimestamp")
        state.complete = bool(data["complete"])
        state.metadata = data["metaData"]
        state.protocol = data["protocol"]
        state.txns = dict(data["txns"])
        state.domains = dict(data["domains"])
        return state


__all__ = [
    "STATE_FORMAT",
    "STATE_FORMAT_JSON",
    "STATE_FORMAT_PARQUET",
    "FileKey",
    "IncrementalSnapshot",
    "Invalidation",
    "Partitions",
    "Paths",
    "PendingVersion",
    "file_key",
]
