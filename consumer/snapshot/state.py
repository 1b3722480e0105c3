"""The state of one mirrored table (its active files and the rest), applied version by version.

:class:`IncrementalSnapshot` is the state of one table (one ``tableId``), applied from its action
events. The active files are one Arrow table with the columns of a checkpoint's ``add`` (as
``Snapshot.files``), in the order they became active. An event carries one action, but nothing
is applied per action: a version's ``add`` and ``remove`` bodies are collected (turned into Arrow
every few thousand rows) and reconciled with the files once, when its last action arrives, by
core's own replay (:func:`deltamirror.core.replay.reconcile`: newest action per canonical path +
deletion vector id wins). What the version changed (:class:`Invalidation`) is computed with the
same keys, by the kernels of :mod:`.files`.

The state serializes itself as a document (everything but the files) beside its files: in format 3
the document is the footer of a Delta checkpoint of the files (:mod:`.delta_checkpoint`, what
:class:`~.store.StateStore` writes); in format 2 it was a JSON sidecar beside a Parquet file of the
files; format 1 has every ``add`` inline in one JSON document. Formats 1 and 2 are still read (and
migrated by the store).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from deltamirror.core import action_schema
from deltamirror.core.accumulator import ActionAccumulator
from deltamirror.core.deletion_vectors import dv_unique_id
from deltamirror.core.errors import ConfigError, CorruptLogError
from deltamirror.core.partitions import distinct_partitions
from deltamirror.core.replay import canonical_paths, file_keys, reconcile
from deltamirror.mirror.errors import EventStreamError
from deltamirror.mirror.events import ActionEvent, decode_action_event

from .files import PathIndex, compact, gone, needs_compaction, snapshot_changes

#: a Delta checkpoint per table (:mod:`.delta_checkpoint`)
STATE_FORMAT = 3
#: a JSON sidecar beside a Parquet file of the files, per table (read and migrated)
STATE_FORMAT_PARQUET = 2
#: the format that kept every ``add`` inline in the table's JSON file (read and migrated)
STATE_FORMAT_JSON = 1

FileKey = tuple[str, str]
"""(canonical path, deletion vector id or ""): one logical file, as core's replay keys it."""

_FILE_SCHEME = re.compile(r"^file:/+")
#: add/remove bodies of a version held as dicts before they are turned into Arrow
_BATCH_ROWS = 8192


def file_key(action: Mapping[str, Any]) -> FileKey:
    """The replay key of an ``add`` or ``remove`` (same rule as ``core.replay.file_keys``)."""
    path = str(action["path"])
    if path.startswith("file:"):
        path = _FILE_SCHEME.sub("/", path)
    dv = action.get("deletionVector")
    dv_id = dv_unique_id(dv["storageType"], dv["pathOrInlineDv"], dv.get("offset")) if dv else ""
    return path, dv_id


@dataclass(frozen=True)
class Invalidation:
    """What one applied version changed: what a cache of the table's files or data must drop.

    ``added`` are files active after the version that an ``add`` of it (re)wrote, ``removed`` files
    active before it and gone after; a snapshot is compared with the state it replaces. Paths
    (canonical: ``file:`` prefixes dropped) appear once per file key (a deletion-vector update
    names the path in both lists). ``partitions`` are the distinct ``partitionValues`` of those
    files; ``files`` is the number of active files after the version.
    """

    table_id: str
    version: int
    snapshot: bool
    added: tuple[str, ...]
    removed: tuple[str, ...]
    partitions: tuple[dict[str, str | None], ...]
    files: int


class PendingVersion:
    """The events of the version (or snapshot) being received, and whether they come in order.

    Its ``add`` and ``remove`` bodies go to core's :class:`~deltamirror.core.accumulator.ActionAccumulator`
    (Arrow every few thousand rows, each row with its index in the version as its ``__order``), as
    log replay's do. The other actions are kept as they were published: the state holds and
    persists them as JSON, where the accumulator would turn them into typed models.
    """

    def __init__(
        self, table_id: str, version: int, snapshot: bool, count: int, commit_timestamp: int | None = None
    ) -> None:
        self.table_id = table_id
        self.version = version
        self.snapshot = snapshot
        self.count = count
        self.commit_timestamp = commit_timestamp
        self.received = 0
        self.others: list[tuple[str, Any]] = []
        self._files = ActionAccumulator(table=table_id, batch_rows=_BATCH_ROWS)

    def describe(self) -> str:
        return f"{'snapshot' if self.snapshot else 'version'} {self.version}"

    def take(self, event: ActionEvent) -> None:
        if event.type == "add" or event.type == "remove":
            if type(event.action) is not dict:  # parsed JSON: an object is a dict
                raise EventStreamError(
                    f"action {event.index} ({event.type}) is not an object",
                    table=event.table_id,
                    version=event.version,
                )
            try:
                self._files.take_files(event.type, [event.action], first_order=event.index)
            except CorruptLogError as exc:
                raise self._misfit(f"a {event.type} action", f"a checkpoint's {event.type}", exc) from None
        else:
            self.others.append((event.type, event.action))
        self.received += 1

    def file_actions(self) -> tuple[pa.Table, pa.Table]:
        """(adds, removes) with ``__order``, as core's reconcile takes them."""
        try:
            return self._files.file_actions()
        except CorruptLogError as exc:
            raise self._misfit("an add or remove action", "a checkpoint's add or remove", exc) from None

    def _misfit(self, what: str, columns: str, exc: CorruptLogError) -> EventStreamError:
        """The accumulator's refusal, as what it is here: an event that breaks the contract."""
        reason = exc.__cause__ if exc.__cause__ is not None else exc.message
        return EventStreamError(
            f"{what} does not fit the columns of {columns}: {reason}",
            table=self.table_id,
            version=self.version,
        )


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
        self._files: pa.Table = action_schema.ADD.empty_table()
        self._paths: PathIndex | None = None  # built on first use
        self._pending: PendingVersion | None = None
        self._invalidations: list[Invalidation] = []
        #: events ignored because their version was already applied (a re-read after a restart)
        self.skipped_events = 0

    def __repr__(self) -> str:
        return f"IncrementalSnapshot({self.table_id!r}, version={self.version}, files={self.file_count})"

    # --- reading -------------------------------------------------------------------------------

    @property
    def file_count(self) -> int:
        return int(self._files.num_rows)

    @property
    def files(self) -> pa.Table:
        """Active files with the columns of a checkpoint's ``add`` (as ``Snapshot.files``).

        The state itself (no copy), in the order the files became active; do not rely on an order.
        """
        return self._files

    @property
    def file_keys(self) -> set[FileKey]:
        """The replay keys of the active files (built from :attr:`files`; for tests and debugging)."""
        keys = file_keys(self._files["path"], self._files["deletionVector"]).to_pylist()
        return {(p, d) for p, _, d in (str(k).partition("\x00") for k in keys)}

    @property
    def in_progress(self) -> bool:
        """True while a version or snapshot has arrived only in part."""
        return self._pending is not None

    def invalidations(self) -> list[Invalidation]:
        """The versions applied since the last call, oldest first (the list is then emptied)."""
        out, self._invalidations = self._invalidations, []
        return out

    # --- applying ------------------------------------------------------------------------------

    def apply(self, event: ActionEvent) -> Invalidation | None:
        """Take one event; the :class:`Invalidation` when it completed a version, else None."""
        if event.table_id != self.table_id:
            raise EventStreamError(
                f"event of table {event.table_id} given to the state of {self.table_id}",
                version=event.version,
            )
        if self._already_applied(event):
            self.skipped_events += 1
            return None
        pending = self._pending
        if event.index == 0:
            if pending is not None and not event.snapshot:
                raise EventStreamError(
                    f"version {event.version} starts while {pending.describe()} is incomplete "
                    f"({pending.received} of {pending.count} actions)",
                    table=self.table_id,
                    version=event.version,
                )
            if not event.snapshot and self.version is not None and event.version != self.version + 1:
                raise EventStreamError(
                    f"version {event.version} follows version {self.version}: versions are missing",
                    table=self.table_id,
                    version=event.version,
                )
            pending = self._pending = PendingVersion(
                self.table_id, event.version, event.snapshot, event.count, event.commit_timestamp
            )
        elif pending is None or (pending.version, pending.snapshot, pending.count) != (
            event.version,
            event.snapshot,
            event.count,
        ):
            raise EventStreamError(
                f"action {event.index} of {'snapshot' if event.snapshot else 'version'} {event.version} "
                "arrived without the actions before it",
                table=self.table_id,
                version=event.version,
            )
        elif event.index != pending.received:
            raise EventStreamError(
                f"action {event.index} of {pending.describe()} arrived after action {pending.received - 1}",
                table=self.table_id,
                version=event.version,
            )
        if event.table_uri:
            self.table_uri = event.table_uri
        pending.take(event)
        if event.index + 1 < event.count:
            return None
        if event.snapshot and event.snapshot_end is not True:
            raise EventStreamError(
                f"the last event of snapshot {event.version} has no snapshotEnd",
                table=self.table_id,
                version=event.version,
            )
        self._pending = None
        return self._apply_version(pending)

    def _already_applied(self, event: ActionEvent) -> bool:
        """A version at or below the state's: re-read after a restart, or republished by the watcher."""
        if self.version is None or event.version > self.version:
            return False
        # a snapshot describes the table at its version: a whole state at or past it has it all;
        # a partial state (started after version 0) is completed by it
        return not event.snapshot or self.complete

    def _named(self, before: pa.Table, adds: pa.Table, removes: pa.Table) -> pa.Table | None:
        """The files of ``before`` (the state) whose path an add or remove of the version names;
        None when there is none (an append)."""
        if before.num_rows == 0 or adds.num_rows + removes.num_rows == 0:
            return None
        paths = pa.chunked_array(adds["path"].chunks + removes["path"].chunks, type=pa.string())
        touched = pc.unique(canonical_paths(paths))
        if PathIndex.available:
            if self._paths is None:
                self._paths = PathIndex(canonical_paths(before["path"]))
            if not self._paths.may_hold_any(touched):
                return None
        named = before.filter(pc.is_in(canonical_paths(before["path"]), value_set=touched))  # a pass
        return named if named.num_rows else None

    def _apply_version(self, pending: PendingVersion) -> Invalidation:
        adds, removes = pending.file_actions()
        before = self._files
        empty_removes = action_schema.REMOVE.empty_table()
        # the touched keys active after the version: the adds no later action of the version undid
        live, _ = reconcile(action_schema.ADD.empty_table(), empty_removes, adds, removes)
        if pending.snapshot:
            files = live
            self.metadata = self.protocol = None
            self.txns, self.domains = {}, {}
            added, removed = snapshot_changes(before, live)
        elif (named := self._named(before, adds, removes)) is None:
            # an append (nothing the version names is in the state): no pass over the state
            files = pa.concat_tables([before, live]) if before.num_rows else live
            added, removed = live, before.slice(0, 0)
        else:
            files, _ = reconcile(before, empty_removes, adds, removes)
            added, removed = live, gone(named, adds, removes, live)
        if pending.snapshot:
            self._paths = None
        elif self._paths is not None:
            self._paths.extend(canonical_paths(live["path"]))
            if self._paths.size > 2 * files.num_rows + 4096:  # mostly files removed since: rebuild
                self._paths = None
        self._apply_others(pending.others)
        self._files = compact(files) if needs_compaction(files) else files
        self.version = pending.version
        self.commit_timestamp = pending.commit_timestamp
        self.complete = self.complete or pending.snapshot or pending.version == 0
        invalidation = Invalidation(
            self.table_id,
            pending.version,
            pending.snapshot,
            tuple(canonical_paths(added["path"]).to_pylist()),
            tuple(canonical_paths(removed["path"]).to_pylist()),
            tuple(
                distinct_partitions(
                    pa.chunked_array(
                        added["partitionValues"].chunks + removed["partitionValues"].chunks,
                        type=action_schema.STRING_MAP,
                    ),
                    keep_empty=True,
                )[0]
            ),
            self._files.num_rows,
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

    def apply_values(self, values: Iterable[bytes | str]) -> list[Invalidation]:
        """Apply serialized action events (e.g. the lines ``deltamirror events`` prints)."""
        out = []
        for value in values:
            applied = self.apply(decode_action_event(value))
            if applied is not None:
                out.append(applied)
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
    def from_document(cls, data: Mapping[str, Any], files: pa.Table) -> IncrementalSnapshot:
        """The state from a format-3 document (a checkpoint's footer) and its files."""
        if data.get("format") != STATE_FORMAT:
            raise ConfigError(f"unknown snapshot state format {data.get('format')!r}")
        return cls._with_files(data, files)

    @classmethod
    def _with_files(cls, data: Mapping[str, Any], files: pa.Table) -> IncrementalSnapshot:
        try:
            state = cls._from_fields(data)
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(
                f"a snapshot state document lacks a field or has one of a wrong type: {exc}"
            ) from None
        state._files = action_schema.conform(files, action_schema.ADD)
        return state

    def to_json(self) -> dict[str, Any]:
        """The whole state as one JSON document, every ``add`` inline (format 1).

        What :class:`~.store.StateStore` wrote before format 2; kept for export and debugging of
        small tables (a Python object per file: not for large ones).
        """
        return {
            **self.sidecar(""),
            "format": STATE_FORMAT_JSON,
            "files": action_schema.file_rows(self._files),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> IncrementalSnapshot:
        """A format-1 document (:meth:`to_json`, or a state file written before format 2)."""
        if data.get("format") != STATE_FORMAT_JSON:
            raise ConfigError(f"unknown snapshot state format {data.get('format')!r}")
        state = cls._from_fields(data)
        try:
            state._files = pa.Table.from_pylist(list(data["files"]), schema=action_schema.ADD)
        except (pa.ArrowException, TypeError, ValueError) as exc:
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
    "PendingVersion",
    "file_key",
]
