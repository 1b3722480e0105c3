"""Incremental snapshots: the active files of each mirrored table, kept current from the actions topic.

:class:`IncrementalSnapshot` is the state of one table (one ``tableId``), applied version by version
from action events; :class:`SnapshotConsumer` feeds it from Kafka under ``read_committed``, can
persist it so that a restart continues where it stopped instead of re-reading the topic, and can
follow the commits topic to drop the state of a table that was deleted and re-created.

State representation: the active files are one Arrow table with the columns of a checkpoint's
``add`` (as ``Snapshot.files``), in the order they became active. An event carries one action, but
nothing is applied per action: a version's ``add`` and ``remove`` bodies are collected (turned
into Arrow every few thousand rows) and reconciled with the files once, when its last action
arrives, by core's own replay (:func:`deltamirror.core.replay.reconcile`: newest action per
canonical path + deletion vector id wins). What the version changed (:class:`Invalidation`) is
computed with the same keys, by kernels.

Restarts (``state_dir``), in this order after the records of a poll batch are handled:

1. every table whose state changed: ``tables/<hash>-v<version>-<token>.parquet`` (the files) and
   then ``tables/<hash>.json`` (version, metaData, protocol, txns, domains and the name of that
   Parquet file), each written to a temp file, fsynced and renamed; the directory is fsynced, then
   the Parquet file the sidecar named before is deleted;
2. ``offsets.json``: the next offset to read per partition of the actions (and commits) topic and
   the table ids retired by ``tableReplaced`` (same atomic write);
3. the files of the retired tables are deleted; then the offsets are stored for the group commit
   and the applied versions and replacements reported (callbacks).

The stored offset of an actions partition is the first record of the oldest version still
incomplete in it (transactions of several tables interleave in one partition, and a version can
span transactions), so a restart re-reads every unfinished version whole. Records a table has
already applied (``version`` at or below its state's, see :meth:`IncrementalSnapshot.apply`) are
skipped on that re-read. A crash between two steps only makes the restart re-read, never lose,
records; :meth:`StateStore.load` deletes what an interrupted save left behind (Parquet files no
sidecar names, the files of a table ``offsets.json`` lists as retired). Without ``state_dir``
nothing is persisted and the state is rebuilt by reading the topics from their beginning (the
watcher creates its topics with unlimited retention). Either way the position comes from the
state, not from the group's committed offset: an offset is meaningless without the state it
belongs to. The group offsets are still committed, so that lag shows in Kafka's tools.

State format 2 is the above. Format 1 (before the files moved to Parquet: one JSON file per table
with every ``add`` inline) is still read, and rewritten as format 2 when the store is loaded; a
newer format is refused with a :class:`ConfigError`.

Re-created tables (``commits_topic``): the watcher announces a location that now holds another
table with a ``tableReplaced`` record on the commits topic, in the transaction of the new table's
first events. On it the consumer drops the previous ``tableId``'s state (and its files on disk),
remembers the id as retired, so that its events still to be read, or read again after a restart,
are skipped instead of building a new state for it, and reports a :class:`TableReplacement`
(``on_replaced``) after the drop is persisted. The two topics are read together but Kafka orders
nothing across topics: the notice can come before or after the previous table's last events, and
both orders end with its state dropped. Without ``commits_topic`` a re-created table simply
appears under its new ``tableId`` and the previous one's state stays.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pydantic import ValidationError

from deltamirror.core import action_schema
from deltamirror.core.deletion_vectors import dv_unique_id
from deltamirror.core.errors import ConfigError, EventStreamError, KafkaError
from deltamirror.core.events import HEADER_KIND, ActionEvent, FragmentAssembler, TableReplaced
from deltamirror.core.partitions import distinct_partitions
from deltamirror.core.replay import ORDER, canonical_paths, file_keys, reconcile

log = logging.getLogger(__name__)

DEFAULT_GROUP_ID = "deltamirror-snapshot-consumer"
STATE_FORMAT = 2
#: the format that kept every ``add`` inline in the table's JSON file (read and migrated)
STATE_FORMAT_JSON = 1

FileKey = tuple[str, str]
"""(canonical path, deletion vector id or ""): one logical file, as core's replay keys it."""

_FILE_SCHEME = re.compile(r"^file:/+")
_ADD_ROWS = action_schema.ADD.append(pa.field(ORDER, pa.int64()))
_REMOVE_ROWS = action_schema.REMOVE.append(pa.field(ORDER, pa.int64()))
#: add/remove bodies of a version held as dicts before they are turned into Arrow
_BATCH_ROWS = 8192
#: the files table is made contiguous again when its chunks exceed this, or one per _ROWS_PER_CHUNK
_MAX_CHUNKS = 64
_ROWS_PER_CHUNK = 4096


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


@dataclass(frozen=True)
class TableReplacement:
    """A location now holds another table: everything cached for ``previous_table_id`` must go.

    ``dropped_version`` / ``dropped_files`` describe the state this consumer dropped (None / 0
    when it held none, e.g. the notice was read again after a restart). The new table's own
    versions follow as :class:`Invalidation` s of ``table_id``, starting from its snapshot or
    version 0.
    """

    table_uri: str
    table_id: str
    previous_table_id: str
    previous_version: int
    reason: str
    dropped_version: int | None
    dropped_files: int


class _Pending:
    """The events of the version (or snapshot) being received; file bodies become Arrow in batches."""

    def __init__(self, version: int, snapshot: bool, count: int) -> None:
        self.version = version
        self.snapshot = snapshot
        self.count = count
        self.received = 0
        self.others: list[tuple[str, Any]] = []
        self._rows: dict[str, list[dict[str, Any]]] = {"add": [], "remove": []}
        #: each row's index in the version: the order core's reconcile needs across adds and removes
        self._order: dict[str, list[int]] = {"add": [], "remove": []}
        self._tables: dict[str, list[pa.Table]] = {"add": [], "remove": []}

    def take(self, event: ActionEvent) -> None:
        rows = self._rows.get(event.type)
        if rows is None:
            self.others.append((event.type, event.action))
        else:
            if type(event.action) is not dict:  # parsed JSON: an object is a dict
                raise EventStreamError(
                    f"action {event.index} ({event.type}) is not an object",
                    table=event.table_id,
                    version=event.version,
                )
            rows.append(event.action)
            self._order[event.type].append(event.index)
            if len(rows) >= _BATCH_ROWS:
                self._flush(event.type, event.table_id)
        self.received += 1

    def _flush(self, action_type: str, table_id: str) -> None:
        schema = action_schema.ADD if action_type == "add" else action_schema.REMOVE
        try:
            table = pa.Table.from_pylist(self._rows[action_type], schema=schema)
        except (pa.ArrowException, TypeError, ValueError) as exc:
            raise EventStreamError(
                f"a {action_type} action does not fit the columns of a checkpoint's {action_type}: {exc}",
                table=table_id,
                version=self.version,
            ) from None
        order = pa.array(self._order[action_type], pa.int64())
        self._tables[action_type].append(table.append_column(pa.field(ORDER, pa.int64()), order))
        self._rows[action_type], self._order[action_type] = [], []

    def file_actions(self, table_id: str) -> tuple[pa.Table, pa.Table]:
        """(adds, removes) with ``__order``, as core's reconcile takes them."""
        out = []
        for action_type, schema in (("add", _ADD_ROWS), ("remove", _REMOVE_ROWS)):
            if self._rows[action_type]:
                self._flush(action_type, table_id)
            tables = self._tables[action_type]
            out.append(pa.concat_tables(tables) if tables else schema.empty_table())
        return out[0], out[1]


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
        self.complete = False
        self.metadata: dict[str, Any] | None = None
        self.protocol: dict[str, Any] | None = None
        self.txns: dict[str, dict[str, Any]] = {}
        self.domains: dict[str, dict[str, Any]] = {}
        self._files: pa.Table = action_schema.ADD.empty_table()
        self._paths: _PathIndex | None = None  # built on first use
        self._pending: _Pending | None = None
        self._invalidations: list[Invalidation] = []
        #: events ignored because their version was already applied (a re-read after a restart)
        self.skipped_events = 0

    def __repr__(self) -> str:
        return f"IncrementalSnapshot({self.table_id!r}, version={self.version}, files={self.file_count})"

    # --- reading -------------------------------------------------------------------------------

    @property
    def file_count(self) -> int:
        return self._files.num_rows

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
                    f"version {event.version} starts while {self._describe(pending)} is incomplete "
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
            pending = self._pending = _Pending(event.version, event.snapshot, event.count)
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
                f"action {event.index} of {self._describe(pending)} arrived after action "
                f"{pending.received - 1}",
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

    @staticmethod
    def _describe(pending: _Pending) -> str:
        return f"{'snapshot' if pending.snapshot else 'version'} {pending.version}"

    def _named(self, before: pa.Table, adds: pa.Table, removes: pa.Table) -> pa.Table | None:
        """The files of ``before`` (the state) whose path an add or remove of the version names;
        None when there is none (an append)."""
        if before.num_rows == 0 or adds.num_rows + removes.num_rows == 0:
            return None
        paths = pa.chunked_array(adds["path"].chunks + removes["path"].chunks, type=pa.string())
        touched = pc.unique(canonical_paths(paths))
        if _PathIndex.available:
            if self._paths is None:
                self._paths = _PathIndex(canonical_paths(before["path"]))
            if not self._paths.may_hold_any(touched):
                return None
        named = before.filter(pc.is_in(canonical_paths(before["path"]), value_set=touched))  # a pass
        return named if named.num_rows else None

    def _apply_version(self, pending: _Pending) -> Invalidation:
        adds, removes = pending.file_actions(self.table_id)
        before = self._files
        empty_removes = action_schema.REMOVE.empty_table()
        # the touched keys active after the version: the adds no later action of the version undid
        live, _ = reconcile(action_schema.ADD.empty_table(), empty_removes, adds, removes)
        if pending.snapshot:
            files = live
            self.metadata = self.protocol = None
            self.txns, self.domains = {}, {}
            added, removed = _snapshot_changes(before, live)
        elif (named := self._named(before, adds, removes)) is None:
            # an append (nothing the version names is in the state): no pass over the state
            files = pa.concat_tables([before, live]) if before.num_rows else live
            added, removed = live, before.slice(0, 0)
        else:
            files, _ = reconcile(before, empty_removes, adds, removes)
            added, removed = live, _gone(named, adds, removes, live)
        if pending.snapshot:
            self._paths = None
        elif self._paths is not None:
            self._paths.extend(canonical_paths(live["path"]))
            if self._paths.size > 2 * files.num_rows + 4096:  # mostly files removed since: rebuild
                self._paths = None
        for action_type, action in pending.others:
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
        if files.num_rows and files.column(0).num_chunks > max(
            _MAX_CHUNKS, files.num_rows // _ROWS_PER_CHUNK
        ):
            files = _compact(files)  # every version adds chunks; kernels slow down with many
        self._files = files
        self.version = pending.version
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
            files.num_rows,
        )
        self._invalidations.append(invalidation)
        return invalidation

    def apply_values(self, values: Iterable[bytes | str]) -> list[Invalidation]:
        """Apply serialized action events (e.g. the lines ``deltamirror events`` prints)."""
        out = []
        for value in values:
            applied = self.apply(parse_event(value))
            if applied is not None:
                out.append(applied)
        return out

    # --- persistence ---------------------------------------------------------------------------

    def sidecar(self, files: str) -> dict[str, Any]:
        """Everything but the files (format 2), naming the Parquet file ``files`` that holds them.

        An unfinished version is not part of the state: it is read again.
        """
        return {
            "format": STATE_FORMAT,
            "tableId": self.table_id,
            "tableUri": self.table_uri,
            "version": self.version,
            "complete": self.complete,
            "metaData": self.metadata,
            "protocol": self.protocol,
            "txns": self.txns,
            "domains": self.domains,
            "files": files,
            "fileCount": self.file_count,
        }

    @classmethod
    def from_sidecar(cls, data: Mapping[str, Any], files: pa.Table) -> IncrementalSnapshot:
        """The state from a format-2 sidecar and its files (any table with the ``add`` columns)."""
        if data.get("format") != STATE_FORMAT:
            raise ConfigError(f"unknown snapshot state format {data.get('format')!r}")
        state = cls._from_fields(data)
        state._files = action_schema.conform(files, action_schema.ADD)
        return state

    def to_json(self) -> dict[str, Any]:
        """The whole state as one JSON document, every ``add`` inline (format 1).

        What :class:`StateStore` wrote before format 2; kept for export and debugging of small
        tables (a Python object per file: not for large ones).
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
        state.complete = bool(data["complete"])
        state.metadata = data["metaData"]
        state.protocol = data["protocol"]
        state.txns = dict(data["txns"])
        state.domains = dict(data["domains"])
        return state


class _PathIndex:
    """Which paths may be among the state's files, answered without a pass over every file.

    Sorted runs of canonical paths, searched by binary search: a run per version, merged with the
    run before it when that one is not more than twice as long, so there are few runs and a path
    is sorted again only a few times. It only grows: a removed file stays until the index is
    twice the state, then it is built again. So it may say "maybe" for a path no longer there
    (the exact check follows) but never "no" for a path that is. It costs a second copy of the
    paths. Without pyarrow's ``search_sorted`` every version makes the exact check.
    """

    available = hasattr(pc, "search_sorted")

    def __init__(self, paths: pa.Array | pa.ChunkedArray) -> None:
        self._runs: list[pa.Array] = []
        self.size = 0
        self.extend(paths)

    def extend(self, paths: pa.Array | pa.ChunkedArray) -> None:
        if isinstance(paths, pa.ChunkedArray):
            paths = paths.combine_chunks()
        if len(paths) == 0:
            return
        self._runs.append(paths.take(pc.array_sort_indices(paths)))
        self.size += len(paths)
        while len(self._runs) > 1 and len(self._runs[-2]) <= 2 * len(self._runs[-1]):
            last = self._runs.pop()
            merged = pa.concat_arrays([self._runs.pop(), last])
            self._runs.append(merged.take(pc.array_sort_indices(merged)))

    def may_hold_any(self, paths: pa.Array | pa.ChunkedArray) -> bool:
        if isinstance(paths, pa.ChunkedArray):
            paths = paths.combine_chunks()
        for run in self._runs:
            at = pc.min_element_wise(pc.search_sorted(run, paths), len(run) - 1)
            if pc.any(pc.equal(run.take(at), paths)).as_py():
                return True
        return False


def _compact(files: pa.Table) -> pa.Table:
    """Each run of small chunks merged into one; chunks of ``_ROWS_PER_CHUNK`` rows or more stay.

    Versions of a few files each add a small chunk: merging only those costs their rows, where
    combining the whole table copied every file each time.
    """
    out: list[pa.RecordBatch] = []
    small: list[pa.RecordBatch] = []
    for batch in [*files.to_batches(), None]:
        if batch is None or batch.num_rows >= _ROWS_PER_CHUNK:
            if len(small) > 1:
                out.extend(pa.Table.from_batches(small, files.schema).combine_chunks().to_batches())
            else:
                out.extend(small)
            small = []
            if batch is not None:
                out.append(batch)
        else:
            small.append(batch)
    return pa.Table.from_batches(out, files.schema)


def _keys(files: pa.Table) -> pa.Array:
    return file_keys(files["path"], files["deletionVector"])


def _snapshot_changes(before: pa.Table, after: pa.Table) -> tuple[pa.Table, pa.Table]:
    """(files of ``after`` not in ``before``, files of ``before`` not in ``after``), by replay key."""
    before_keys, after_keys = _keys(before), _keys(after)
    added = after.filter(pc.invert(pc.is_in(after_keys, value_set=before_keys)))
    removed = before.filter(pc.invert(pc.is_in(before_keys, value_set=after_keys)))
    return added, removed


def _gone(named: pa.Table, adds: pa.Table, removes: pa.Table, live: pa.Table) -> pa.Table:
    """Of ``named`` (the files of the state whose path a version's actions name), those whose key
    the version touched and that are not active after it. Keys are built only for these rows
    (as core's replay does)."""
    touched = pa.chunked_array([_keys(adds), _keys(removes)], type=pa.string()).combine_chunks()
    named_keys = _keys(named)
    hit = pc.and_(
        pc.is_in(named_keys, value_set=touched), pc.invert(pc.is_in(named_keys, value_set=_keys(live)))
    )
    return named.filter(hit)


def parse_event(value: bytes | str) -> ActionEvent:
    """An actions-topic value as its model; a value that is not one is an :class:`EventStreamError`."""
    try:
        return ActionEvent.model_validate_json(value)
    except ValidationError as exc:
        raise EventStreamError(f"not an action event: {_first_error(exc)}") from None


def _first_error(exc: ValidationError) -> str:
    first = exc.errors()[0]
    return f"{'.'.join(str(p) for p in first['loc'])}: {first['msg']}"


def parse_table_replaced(value: bytes | str) -> TableReplaced | None:
    """A commits-topic value: its :class:`TableReplaced`, or None for any other ``kind``.

    Commit summaries, heartbeats and kinds a newer watcher may add are not needed here (the
    contract says to ignore unknown kinds); a ``tableReplaced`` that does not parse is an error.
    """
    try:
        data = json.loads(value)
    except ValueError as exc:
        raise EventStreamError(f"a commits-topic record is not JSON: {exc}") from None
    if not isinstance(data, dict) or data.get("kind") != "tableReplaced":
        return None
    try:
        return TableReplaced.model_validate(data)
    except ValidationError as exc:
        raise EventStreamError(f"not a tableReplaced record: {_first_error(exc)}") from None


# --- persistence on disk --------------------------------------------------------------------------


def _write_atomically(path: Path, write: Callable[[Any], None]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as out:
        write(out)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)


def _write_json(path: Path, data: Any) -> None:
    _write_atomically(path, lambda out: out.write(json.dumps(data, separators=(",", ":")).encode()))


def _write_parquet(files: pa.Table, out: Any) -> None:
    pq.write_table(files, out)


def _fsync_dir(path: Path) -> None:
    """Make the renames in ``path`` durable before the next step relies on them."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass
class Position:
    """Where the consumer stands besides its tables: what ``offsets.json`` holds."""

    #: actions topic: partition -> next offset to read
    offsets: dict[int, int] = field(default_factory=dict)
    #: commits topic: partition -> next offset to read
    commits_offsets: dict[int, int] = field(default_factory=dict)
    #: table ids dropped on ``tableReplaced`` -> the last version published for them
    retired: dict[str, int] = field(default_factory=dict)


class StateStore:
    """Tables and offsets of one consumer in a directory (see the module docstring)."""

    def __init__(self, directory: str | Path, topic: str, commits_topic: str | None = None) -> None:
        self.root = Path(directory)
        self.topic = topic
        self.commits_topic = commits_topic
        self.tables_dir = self.root / "tables"
        self.tables_dir.mkdir(parents=True, exist_ok=True)
        self.offsets_path = self.root / "offsets.json"
        #: table id -> the Parquet file its sidecar names
        self._parquet: dict[str, str] = {}

    def _stem(self, table_id: str) -> str:
        return hashlib.sha1(table_id.encode()).hexdigest()[:16]

    def _sidecar_path(self, table_id: str) -> Path:
        return self.tables_dir / f"{self._stem(table_id)}.json"

    def load(self) -> tuple[dict[str, IncrementalSnapshot], dict[int, int]]:
        """The tables and the actions-topic offsets (see :meth:`load_all` for the rest)."""
        tables, position = self.load_all()
        return tables, position.offsets

    def load_all(self) -> tuple[dict[str, IncrementalSnapshot], Position]:
        position = self._read_position()
        tables: dict[str, IncrementalSnapshot] = {}
        migrate: list[tuple[IncrementalSnapshot, Path]] = []
        for path in sorted(self.tables_dir.glob("*.json")):
            data = json.loads(path.read_text())
            fmt = data.get("format") if isinstance(data, dict) else None
            if fmt == STATE_FORMAT_JSON:
                state = IncrementalSnapshot.from_json(data)
                migrate.append((state, path))
            elif fmt == STATE_FORMAT:
                state = IncrementalSnapshot.from_sidecar(data, self._read_files(path, data))
                self._parquet[state.table_id] = str(data["files"])
            else:
                raise ConfigError(
                    f"{path} has snapshot state format {fmt!r}, this deltamirror reads {STATE_FORMAT_JSON} "
                    f"and {STATE_FORMAT}: run the version that wrote it, or delete {self.root} to rebuild "
                    "the state from the topic"
                )
            if state.table_id in position.retired:  # dropped, but a crash came before its files went
                self.delete_table(state.table_id)
                continue
            tables[state.table_id] = state
        self._delete_leftovers()
        for state, legacy in migrate:
            if state.table_id not in tables:
                continue
            log.info("migrating the state of table %s to format %d (Parquet)", state.table_id, STATE_FORMAT)
            self.write_tables([state])  # replaces the legacy file when it has the sidecar's name
            if legacy != self._sidecar_path(state.table_id):
                legacy.unlink(missing_ok=True)
        return tables, position

    def _read_position(self) -> Position:
        position = Position()
        if not self.offsets_path.exists():
            return position
        data = json.loads(self.offsets_path.read_text())
        if data.get("topic") != self.topic:
            raise ConfigError(
                f"state directory {self.root} holds the state of topic {data.get('topic')!r}, not {self.topic!r}"
            )
        position.offsets = {int(p): int(o) for p, o in data["partitions"].items()}
        stored_commits = data.get("commitsTopic")
        if self.commits_topic is not None and stored_commits not in (None, self.commits_topic):
            raise ConfigError(
                f"state directory {self.root} followed commits topic {stored_commits!r}, not "
                f"{self.commits_topic!r}"
            )
        if self.commits_topic is not None and stored_commits == self.commits_topic:
            position.commits_offsets = {int(p): int(o) for p, o in data.get("commitsPartitions", {}).items()}
        position.retired = {str(t): int(v) for t, v in data.get("retired", {}).items()}
        return position

    def _read_files(self, sidecar: Path, data: Mapping[str, Any]) -> pa.Table:
        path = self.tables_dir / str(data["files"])
        try:
            files = pq.read_table(path)
        except (OSError, pa.ArrowException) as exc:
            raise ConfigError(
                f"{sidecar} names {path.name}, which cannot be read ({exc}): delete {self.root} to rebuild "
                "the state from the topic"
            ) from None
        if files.num_rows != data.get("fileCount"):
            raise ConfigError(
                f"{path} has {files.num_rows} files, its sidecar {sidecar.name} says {data.get('fileCount')}: "
                f"delete {self.root} to rebuild the state from the topic"
            )
        return files

    def _delete_leftovers(self) -> None:
        """Parquet files no sidecar names and temp files: what an interrupted save left."""
        named = set(self._parquet.values())
        for path in self.tables_dir.iterdir():
            stale_tmp = path.name.startswith(".") and path.name.endswith(".tmp")
            if stale_tmp or (path.suffix == ".parquet" and path.name not in named):
                path.unlink(missing_ok=True)

    def write_tables(self, tables: Iterable[IncrementalSnapshot]) -> None:
        """Step 1 of a save: each table's files, then its sidecar; then the files they replace go."""
        superseded = []
        wrote = False
        for state in tables:
            name = f"{self._stem(state.table_id)}-v{state.version}-{secrets.token_hex(4)}.parquet"
            _write_atomically(self.tables_dir / name, functools.partial(_write_parquet, state.files))
            _write_json(self._sidecar_path(state.table_id), state.sidecar(name))
            previous = self._parquet.get(state.table_id)
            if previous is not None:
                superseded.append(previous)
            self._parquet[state.table_id] = name
            wrote = True
        if wrote:
            _fsync_dir(self.tables_dir)
        for name in superseded:
            (self.tables_dir / name).unlink(missing_ok=True)

    def delete_table(self, table_id: str) -> None:
        """The sidecar first (so none names a missing file), then the Parquet file."""
        self._sidecar_path(table_id).unlink(missing_ok=True)
        name = self._parquet.pop(table_id, None)
        if name is not None:
            (self.tables_dir / name).unlink(missing_ok=True)

    def save(
        self,
        tables: Iterable[IncrementalSnapshot],
        offsets: Mapping[int, int],
        *,
        commits_offsets: Mapping[int, int] | None = None,
        retired: Mapping[str, int] | None = None,
        dropped: Iterable[str] = (),
    ) -> None:
        """Steps 1 to 3 of the module docstring: tables, then the position, then dropped tables."""
        self.write_tables(tables)  # a crash before the offsets only means a re-read
        data: dict[str, Any] = {
            "topic": self.topic,
            "partitions": {str(p): o for p, o in sorted(offsets.items())},
        }
        if self.commits_topic is not None:
            data["commitsTopic"] = self.commits_topic
            data["commitsPartitions"] = {str(p): o for p, o in sorted((commits_offsets or {}).items())}
        data["retired"] = dict(sorted((retired or {}).items()))
        _write_json(self.offsets_path, data)
        _fsync_dir(self.root)
        for table_id in dropped:  # retired in offsets.json now: a crash here is cleaned by load
            self.delete_table(table_id)


# --- the Kafka consumer ---------------------------------------------------------------------------

AppliedCallback = Callable[[Invalidation, IncrementalSnapshot], None]
ReplacedCallback = Callable[[TableReplacement], None]


class SnapshotConsumer:
    """Keeps an :class:`IncrementalSnapshot` per table of an actions topic.

    Every partition of the topic (and of ``commits_topic``, when given) is assigned to this
    consumer (no group rebalancing: each instance keeps the whole state, so run one per
    ``state_dir``). ``on_applied`` is called for each applied version, ``on_replaced`` for each
    ``tableReplaced`` read from ``commits_topic``, in the order they happened, after the state
    that includes them is persisted.
    """

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        *,
        group_id: str = DEFAULT_GROUP_ID,
        state_dir: str | Path | None = None,
        kafka: Mapping[str, str] | None = None,
        on_applied: AppliedCallback | None = None,
        stop: threading.Event | None = None,
        batch_size: int = 1000,
        commits_topic: str | None = None,
        on_replaced: ReplacedCallback | None = None,
    ) -> None:
        if commits_topic == topic:
            raise ConfigError(f"the commits topic is the actions topic ({topic})")
        self.topic = topic
        self.commits_topic = commits_topic
        self.config = {
            **(kafka or {}),
            "bootstrap.servers": bootstrap_servers,
            "group.id": group_id,
            "isolation.level": "read_committed",
            "enable.auto.commit": True,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
        }
        self.store = StateStore(state_dir, topic, commits_topic) if state_dir is not None else None
        self.tables: dict[str, IncrementalSnapshot] = {}
        position = Position()
        if self.store is not None:
            self.tables, position = self.store.load_all()
        self._offsets = position.offsets
        self._commits_offsets = position.commits_offsets
        #: table ids dropped on tableReplaced (-> last version published for them); their events are skipped
        self.retired = position.retired
        self.on_applied = on_applied
        self.on_replaced = on_replaced
        self.stop_event = stop or threading.Event()
        self.batch_size = batch_size
        self._assemblers: dict[tuple[str, int], FragmentAssembler] = {}
        self._fragment_start: dict[int, int] = {}
        #: per partition, the offset of the first record of each table's unfinished version
        self._starts: dict[int, dict[str, int]] = {}
        self._dirty: set[str] = set()
        self._dropped: set[str] = set()
        self._notices: list[tuple[Invalidation, IncrementalSnapshot] | TableReplacement] = []
        #: events of retired tables that were skipped
        self.skipped_retired_events = 0

    def request_stop(self) -> None:
        self.stop_event.set()

    def run(self, *, once: bool = False, topic_timeout_s: float = 30.0) -> None:
        """Consume until stopped; with ``once``, until every partition is read to its end."""
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        consumer = Consumer(self.config)
        try:
            wanted = {self.topic: self._offsets}
            if self.commits_topic is not None:
                wanted[self.commits_topic] = self._commits_offsets
            assignment: list[Any] = []
            for topic, offsets in wanted.items():
                partitions = self._partitions(consumer, topic, wait=not once, timeout_s=topic_timeout_s)
                if partitions is None:
                    return
                assignment.extend(
                    TopicPartition(topic, p, offsets.get(p, OFFSET_BEGINNING)) for p in partitions
                )
            consumer.assign(assignment)
            everything = {(tp.topic, tp.partition) for tp in assignment}
            at_end: set[tuple[str, int]] = set()
            while not self.stop_event.is_set():
                # consume(n, timeout) waits for n records or the whole timeout: keep it short so a
                # live stream's versions are applied (and invalidated) promptly
                for msg in consumer.consume(self.batch_size, timeout=0.05):
                    where = (msg.topic() or "", msg.partition() or 0)
                    if self._is_end(msg):
                        at_end.add(where)
                        continue
                    at_end.discard(where)
                    self.handle(*where, msg.offset() or 0, msg.value() or b"", msg.headers())
                self.checkpoint(consumer)
                if once and at_end >= everything:
                    break
            self.checkpoint(consumer)
        finally:
            consumer.close()  # commits the stored offsets

    def _partitions(
        self, consumer: Any, topic_name: str, *, wait: bool, timeout_s: float
    ) -> list[int] | None:
        deadline = time.monotonic() + timeout_s
        while not self.stop_event.is_set():
            from confluent_kafka import KafkaException

            try:
                topic = consumer.list_topics(topic=topic_name, timeout=10).topics.get(topic_name)
            except KafkaException as exc:  # no broker answered
                if not wait:
                    raise KafkaError(f"cannot read the metadata of topic {topic_name}: {exc}") from None
                log.warning("cannot read the metadata of topic %s (retrying): %s", topic_name, exc)
                continue
            if topic is not None and topic.error is None and topic.partitions:
                return sorted(topic.partitions)
            if not wait and time.monotonic() > deadline:
                raise ConfigError(f"topic {topic_name} does not exist")
            log.info("waiting for topic %s to exist", topic_name)
            self.stop_event.wait(1.0)
        return None

    @staticmethod
    def _is_end(msg: Any) -> bool:
        from confluent_kafka import KafkaError as RdKafkaError

        err = msg.error()
        if err is None:
            return False
        if err.code() == RdKafkaError._PARTITION_EOF:
            return True
        if err.fatal() or not err.retriable():
            raise KafkaError(f"consuming failed: {err.str()}", topic=msg.topic(), partition=msg.partition())
        log.warning("consumer error (retried): %s", err.str())
        return False

    def handle(self, topic: str, partition: int, offset: int, value: bytes, headers: Any = None) -> None:
        """One record of the actions or the commits topic, in partition order.

        What :meth:`run` does with each record; :meth:`checkpoint` then persists and reports.
        """
        if topic == self.topic:
            self._handle(partition, offset, value, headers)
        elif topic == self.commits_topic:
            self._handle_commits(partition, offset, value, headers)
        else:
            raise ConfigError(f"a record of topic {topic}, which this consumer does not read")

    def _handle(self, partition: int, offset: int, value: bytes, headers: Any) -> None:
        """One actions-topic record."""
        assembler = self._assemblers.setdefault((self.topic, partition), FragmentAssembler())
        whole = assembler.feed(value, headers)
        if whole is None:
            self._fragment_start.setdefault(partition, offset)
            return
        first = self._fragment_start.pop(partition, offset)
        event = parse_event(whole)
        self._offsets[partition] = offset + 1
        if event.table_id in self.retired:
            self.skipped_retired_events += 1
            return
        state = self.tables.get(event.table_id)
        if state is None:
            state = self.tables[event.table_id] = IncrementalSnapshot(event.table_id, event.table_uri)
        applied = state.apply(event)
        state.invalidations()  # reported through on_applied; the list must not grow
        starts = self._starts.setdefault(partition, {})
        if state.in_progress:
            if event.index == 0:
                starts[event.table_id] = first
        else:
            starts.pop(event.table_id, None)
        if applied is not None:
            self._dirty.add(event.table_id)
            self._notices.append((applied, state))

    def _handle_commits(self, partition: int, offset: int, value: bytes, headers: Any) -> None:
        """One commits-topic record: only ``tableReplaced`` matters here."""
        assembler = self._assemblers.setdefault((self.commits_topic or "", partition), FragmentAssembler())
        whole = assembler.feed(value, headers)
        if whole is None:
            return  # the offset stays at the first fragment until the record is whole
        self._commits_offsets[partition] = offset + 1
        kind = next((v for k, v in headers or () if k == HEADER_KIND), None)
        if kind is not None and kind not in (b"tableReplaced", "tableReplaced"):
            return
        record = parse_table_replaced(whole)
        if record is not None:
            self.replace(record)

    def replace(self, record: TableReplaced) -> TableReplacement:
        """Drop the state of ``record.previous_table_id`` and retire that id (see the module docstring)."""
        previous = record.previous_table_id
        self.retired[previous] = record.previous_version
        self.retired.pop(record.table_id, None)  # an id can come back (a table restored elsewhere)
        state = self.tables.pop(previous, None)
        for starts in self._starts.values():
            starts.pop(previous, None)  # its unfinished version no longer holds the offset back
        self._dirty.discard(previous)
        self._dropped.add(previous)
        notice = TableReplacement(
            table_uri=record.table_uri,
            table_id=record.table_id,
            previous_table_id=previous,
            previous_version=record.previous_version,
            reason=record.reason,
            dropped_version=state.version if state is not None else None,
            dropped_files=state.file_count if state is not None else 0,
        )
        log.info(
            "table %s at %s was replaced by %s (%s): dropped its state (%s files)",
            previous,
            record.table_uri,
            record.table_id,
            record.reason,
            notice.dropped_files,
        )
        self._notices.append(notice)
        return notice

    @property
    def position(self) -> Position:
        """Where a restart would continue from: what the next checkpoint writes."""
        return Position(self._safe_offsets(), dict(self._commits_offsets), dict(self.retired))

    def _safe_offsets(self) -> dict[int, int]:
        """Per partition, where a restart must read from: the oldest unfinished version, or past the end."""
        return {p: min(self._starts.get(p, {}).values(), default=o) for p, o in self._offsets.items()}

    def checkpoint(self, consumer: Any = None) -> None:
        """Persist what changed, store the offsets in ``consumer`` (if any), then report.

        The steps of the module docstring; nothing happens when nothing was applied or dropped.
        """
        if not self._dirty and not self._notices and not self._dropped:
            return
        offsets = self._safe_offsets()
        commits_offsets = dict(self._commits_offsets)
        if self.store is not None:
            self.store.save(
                (self.tables[t] for t in sorted(self._dirty)),
                offsets,
                commits_offsets=commits_offsets,
                retired=self.retired,
                dropped=sorted(self._dropped),
            )
        if consumer is not None:
            from confluent_kafka import TopicPartition

            stored = [TopicPartition(self.topic, p, o) for p, o in offsets.items()]
            if self.commits_topic is not None:
                stored += [TopicPartition(self.commits_topic, p, o) for p, o in commits_offsets.items()]
            if stored:
                consumer.store_offsets(offsets=stored)
        self._dirty.clear()
        self._dropped.clear()
        notices, self._notices = self._notices, []
        for notice in notices:
            if isinstance(notice, TableReplacement):
                if self.on_replaced is not None:
                    self.on_replaced(notice)
            elif self.on_applied is not None:
                self.on_applied(*notice)


__all__ = [
    "DEFAULT_GROUP_ID",
    "IncrementalSnapshot",
    "Invalidation",
    "Position",
    "SnapshotConsumer",
    "StateStore",
    "TableReplacement",
    "file_key",
    "parse_event",
    "parse_table_replaced",
]
