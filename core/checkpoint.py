"""Reading checkpoints (classic, multi-part, V2 with sidecars) into Arrow.

File actions stay columnar from the parquet page to the snapshot: the ``add`` struct column is
filtered and flattened by pyarrow, never turned into Python objects. Only the handful of
non-file actions (protocol, metaData, txn, domainMetadata) become models.

Every column of the ``add`` rows but ``stats`` is read at once; the stats (most of a checkpoint's
bytes, and needed by no replay) are read again from the checkpoint when a snapshot's files are
first asked for them (:class:`DeferredStats`, :mod:`.file_table`). A column that row group
statistics prove null in every add row is not decoded at all.

A checkpoint is log input like a commit and gets the same checks (:mod:`.checkpoint_checks`),
vectorised. A file that is not Parquet, or is cut short, is refused as a corrupt checkpoint
(exit 2), never a traceback.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from deltamirror.core.compute import pc

from . import action_schema
from .accumulator import ActionAccumulator
from .actions import Where, iter_values, read_actions
from .checkpoint_checks import check_file_rows
from .errors import CorruptLogError, IncompleteTableStateError
from .file_table import CHECKPOINT_ROW, CHECKPOINT_ROW_TYPE, shared_nulls
from .log import Checkpoint
from .memory import release_unused_arrow
from .models import CheckpointMetadata, DomainMetadata, Metadata, Protocol, Sidecar, parse_action
from .storage import TableStorage

SIDECAR_DIR = "_sidecars"
_BATCH_ROWS = 65_536
_SMALL_ACTIONS = ("metaData", "protocol", "txn", "domainMetadata", "checkpointMetadata", "sidecar")
#: what a reader of a checkpoint's configuration reads of it
_CONFIG_ACTIONS = ("metaData", "protocol", "checkpointMetadata")


@dataclass(frozen=True)
class _PartRows:
    """Where the add rows of one parquet part (or sidecar) are read again: the row groups read and
    how many add rows they held; the footer's size and row count tell a file that changed."""

    path: str
    groups: list[int] | None
    rows: int
    footer: tuple[int, int]


class DeferredStats:
    """The ``add.stats`` of a checkpoint's add rows, in their order, read when first needed.

    A parquet part's stats are read again from the rows that held adds the first time; those of a
    JSON part (and of a part whose ``add`` column had to be read whole) are kept as read; a part
    without a ``stats`` field has as many nulls.
    """

    def __init__(self, storage: TableStorage) -> None:
        self.storage = storage
        self._pieces: list[_PartRows | pa.ChunkedArray | int] = []

    def kept(self, stats: pa.ChunkedArray | int) -> None:
        """The stats of the next rows as read (a number: that many nulls)."""
        self._pieces.append(stats)

    def deferred(self, part: _PartRows) -> None:
        self._pieces.append(part)

    def read(self) -> pa.ChunkedArray:
        chunks: list[pa.Array] = []
        for piece in self._pieces:
            if isinstance(piece, int):
                chunks.append(pa.nulls(piece, pa.string()))
            else:
                chunks += (piece if isinstance(piece, pa.ChunkedArray) else self._read_part(piece)).chunks
        return pa.chunked_array(chunks, type=pa.string())

    def _read_part(self, part: _PartRows) -> pa.ChunkedArray:
        where = Where(self.storage.uri, part.path)
        pf = _open_part(self.storage, part.path, "before the snapshot read its files' stats")
        try:
            with _corrupt_checkpoint(where, "add.stats"):
                if _footer(pf) != part.footer:
                    raise where.refuse("checkpoint changed after the snapshot read it")
                column = _read_add_groups(pf, ["add.stats"], part.groups)
                column = action_schema.keep_rows(column, pc.is_valid(column))
                if len(column) != part.rows:
                    raise where.refuse(
                        f"checkpoint changed after the snapshot read it ({len(column)} add rows, "
                        f"{part.rows} before)"
                    )
                stats = pc.struct_field(column, "stats")
                return stats if stats.type == pa.string() else stats.cast(pa.string())
        finally:
            pf.close()


def _footer(pf: pq.ParquetFile) -> tuple[int, int]:
    return int(pf.metadata.serialized_size), int(pf.metadata.num_rows)


@dataclass
class CheckpointState:
    """What one checkpoint holds, before the commits after it are applied.

    ``adds`` has the columns of :data:`.action_schema.ADD` (``stats`` null: see ``add_stats``) and
    :data:`.file_table.CHECKPOINT_ROW`, each row's place among the adds.
    """

    version: int
    adds: pa.Table
    removes: pa.Table
    #: the stats of ``adds``, in order, read on demand
    add_stats: DeferredStats | None = None
    #: its metaData, protocol, txns and domains
    actions: ActionAccumulator = field(default_factory=ActionAccumulator)
    checkpoint_metadata: CheckpointMetadata | None = None
    sidecars: list[Sidecar] = field(default_factory=list)

    @property
    def metadata(self) -> Metadata | None:
        return self.actions.metadata

    @property
    def protocol(self) -> Protocol | None:
        return self.actions.protocol


def arrow_to_python(value: Any, typ: pa.DataType) -> Any:
    """A value from ``to_pylist`` with maps turned back into dicts (as the JSON log has them)."""
    if value is None:
        return None
    if pa.types.is_map(typ):
        return {k: arrow_to_python(v, typ.item_type) for k, v in value}
    if pa.types.is_struct(typ):
        return {
            f.name: arrow_to_python(value.get(f.name), f.type) for f in typ if value.get(f.name) is not None
        }
    if pa.types.is_list(typ) or pa.types.is_large_list(typ):
        return [arrow_to_python(v, typ.value_type) for v in value]
    return value


def struct_rows(column: pa.ChunkedArray, schema: pa.Schema) -> pa.Table:
    """The non-null rows of a struct column as a table conformed to ``schema`` (the fields it
    lacks null, all over one zeroed buffer)."""
    column = action_schema.keep_rows(column, pc.is_valid(column))
    if len(column) == 0:
        return schema.empty_table()
    table = pa.Table.from_struct_array(column)
    missing = [f for f in schema if f.name not in table.column_names]
    if missing:
        nulls = pa.nulls(table.num_rows, pa.struct(missing))
        for k, f in enumerate(missing):
            table = table.append_column(f, nulls.field(k))
    return action_schema.conform(table, schema)


def _small_actions(table: pa.Table, state: CheckpointState, *, file: str, uri: str) -> None:
    for name in _SMALL_ACTIONS:
        if name not in table.column_names:
            continue
        col = table.column(name)
        col = col.filter(pc.is_valid(col))
        for raw in col.to_pylist():
            _apply_small({name: arrow_to_python(raw, col.type)}, state, file=file, uri=uri)


def _apply_small(
    wrapped: dict[str, Any], state: CheckpointState, *, file: str, uri: str, line: int | None = None
) -> None:
    action = parse_action(wrapped, file=file, line=line, table=uri)
    if isinstance(action, Metadata):
        action.located(Where(uri, file, state.version), line)
    if isinstance(action, CheckpointMetadata):
        state.checkpoint_metadata = action
    elif isinstance(action, Sidecar):
        state.sidecars.append(action)
    elif not (isinstance(action, DomainMetadata) and action.removed):
        # a checkpoint is reconciled: its domain tombstones remove nothing from it
        state.actions.apply(action)


def _read_parquet_part(
    storage: TableStorage, path: str, stats: DeferredStats
) -> Iterator[tuple[str, pa.Table]]:
    """(kind, table) pieces of one checkpoint parquet file: 'add', 'remove' and 'small'.

    File action rows come out checked (:func:`check_file_rows`); anything Arrow cannot read or
    cast (a corrupt page, a column of the wrong type) is a corrupt checkpoint. The adds' stats are
    left to ``stats``.
    """
    pf = _open_part(storage, path)
    try:
        where = Where(storage.uri, path)
        names = set(pf.schema_arrow.names)
        for kind in ("add", "remove"):
            if kind in names:
                with _corrupt_checkpoint(where, kind):
                    rows = _read_add_rows(pf, path, stats) if kind == "add" else _read_file_rows(pf, kind)
                check_file_rows(kind, rows, where)
                yield kind, rows
        for name in _SMALL_ACTIONS:
            if name in names:
                with _corrupt_checkpoint(where, name):
                    small = _read_action_column(pf, name)
                yield "small", small
    finally:
        pf.close()


def _read_file_rows(pf: pq.ParquetFile, kind: str) -> pa.Table:
    return struct_rows(_read_action_column(pf, kind).column(kind), action_schema.SCHEMAS[kind])


def _read_add_rows(pf: pq.ParquetFile, path: str, stats: DeferredStats) -> pa.Table:
    """The add rows of a part, every column but ``stats`` read (that one is checked by its type
    and left to ``stats``, to read again from the same row groups when it is needed)."""
    typ = pf.schema_arrow.field("add").type
    groups = _row_groups_holding(pf, "add")
    if groups is not None and len(groups) == pf.metadata.num_row_groups:
        groups = None
    eager = []
    has_stats = pa.types.is_struct(typ) and typ.get_field_index("stats") >= 0
    if pa.types.is_struct(typ):
        if has_stats:
            action_schema.check_castable(typ.field("stats").type, pa.string(), "stats")
        known = set(action_schema.ADD.names) - {"stats"}
        eager = [f"add.{f.name}" for f in typ if f.name in known]
        for name in _null_leaves(pf, eager, groups):
            # checked as read: a null where the protocol requires a value is refused all the same
            action_schema.check_castable(
                typ.field(name[4:]).type, action_schema.ADD.field(name[4:]).type, name[4:]
            )
            eager.remove(name)
    column = _read_add_groups(pf, eager or ["add"], groups)
    rows = struct_rows(column, action_schema.ADD)
    del column
    if not eager:
        rows = _keep_stats(rows, stats)
    elif has_stats:
        stats.deferred(_PartRows(path, groups, rows.num_rows, _footer(pf)))
    else:
        stats.kept(rows.num_rows)
    return shared_nulls(rows)


def _null_leaves(pf: pq.ParquetFile, columns: list[str], groups: list[int] | None) -> list[str]:
    """The ``columns`` (``add.x`` of a primitive ``x``) that row group statistics prove null in
    every row of ``groups`` (None: all): nothing in them to decode (row ids, a clustering
    provider, on most tables)."""
    meta = pf.metadata
    if meta.num_row_groups == 0:
        return []
    index = {meta.schema.column(j).path: j for j in range(meta.num_columns)}
    out = []
    for name in columns:
        j = index.get(name)
        if j is None:  # a nested field (a map, a struct): its leaves are named below it
            continue
        for i in range(meta.num_row_groups) if groups is None else groups:
            chunk = meta.row_group(i).column(j)
            stats = chunk.statistics
            if stats is None or not stats.has_null_count or stats.null_count != chunk.num_values:
                break
        else:
            out.append(name)
    return out


#: reading a checkpoint's row groups hands the memory freed since back to the OS once groups of
#: this many bytes (uncompressed, as the footer says) were read, and once more when the checkpoint
#: is read: pyarrow's allocator (mimalloc) keeps freed pages, so the decoding buffers of each group
#: would stay resident while the next group, then the log replay, allocate fresh ones. On the
#: 1M-file bench table (4 groups of ~80 MB) the snapshot's peak RSS went from 335 to 309 MB with
#: both (326 with the first alone, 335 with the last alone), no CPU cost measurable.
RELEASE_AFTER_BYTES = 32 * 1024 * 1024


def _read_add_groups(pf: pq.ParquetFile, columns: list[str], groups: list[int] | None) -> pa.ChunkedArray:
    """The ``add`` column (``columns`` of it) of row ``groups`` (None: all), read a group at a time:
    the decoding buffers of one group are alive at once, not those of the whole file."""
    if groups is None:
        groups = list(range(pf.metadata.num_row_groups))
    if not groups:
        return pf.read_row_groups([], columns=columns).column("add")
    chunks = []
    since_release = 0
    for i in groups:
        chunks += pf.read_row_group(i, columns=columns, use_threads=False).column("add").chunks
        since_release += pf.metadata.row_group(i).total_byte_size
        if since_release >= RELEASE_AFTER_BYTES:
            release_unused_arrow()
            since_release = 0
    return pa.chunked_array(chunks)


def _keep_stats(rows: pa.Table, stats: DeferredStats) -> pa.Table:
    """Add rows read whole: their stats are kept by ``stats``, a placeholder left in their place."""
    stats.kept(rows.column("stats"))
    index = rows.schema.get_field_index("stats")
    return rows.set_column(index, rows.schema.field(index), pa.nulls(rows.num_rows, pa.string()))


@contextlib.contextmanager
def _corrupt_checkpoint(where: Where, column: str) -> Iterator[None]:
    try:
        yield
    except (OSError, EOFError, MemoryError, pa.ArrowException, TypeError, ValueError) as exc:
        if isinstance(exc, CorruptLogError):
            raise
        text = " ".join(str(exc).split())  # one line
        raise where.refuse(f"unreadable checkpoint ({column} column): {text}") from exc


def _open_part(storage: TableStorage, path: str, when: str = "while reading") -> pq.ParquetFile:
    try:
        return storage.parquet_file(path)
    except FileNotFoundError:
        raise CorruptLogError(f"checkpoint file disappeared {when}", table=storage.uri, file=path) from None
    except (OSError, EOFError, MemoryError, pa.ArrowException) as exc:
        text = " ".join(str(exc).split())  # one line
        raise CorruptLogError(f"unreadable checkpoint: {text}", table=storage.uri, file=path) from exc


def _read_action_column(pf: pq.ParquetFile, name: str) -> pa.Table:
    """The non-null rows of the column of one action type, from only the row groups that hold
    such an action, a batch at a time: a few tombstones among a million adds cost a batch of
    null rows in memory, not a row group's."""
    groups = _row_groups_holding(pf, name)
    if groups is None:
        groups = list(range(pf.metadata.num_row_groups))
    batches = pf.iter_batches(_BATCH_ROWS, row_groups=groups, columns=[name], use_threads=False)
    field = pf.schema_arrow.field(name)
    chunks = []
    for batch in batches:
        column = batch.column(0)
        if column.null_count < len(column):
            chunks.append(column.filter(column.is_valid()) if column.null_count else column)
    return pa.Table.from_arrays([pa.chunked_array(chunks, type=field.type)], schema=pa.schema([field]))


def _row_groups_holding(pf: pq.ParquetFile, name: str) -> list[int] | None:
    """Row groups with at least one non-null ``name`` action; None when that cannot be told cheaply.

    Each action type is a sparse column of the checkpoint: most row groups hold no protocol or
    txn, and a million adds leave the remove column null in most groups. Decoding a column's
    nulls costs about as much as its values, so groups are picked first. Row group statistics
    prove presence (a non-null leaf means a non-null action); absence is proved by reading one
    narrow leaf, whose definition levels carry the action struct's own nulls.
    """
    typ = pf.schema_arrow.field(name).type
    if not pa.types.is_struct(typ):
        return None
    narrow = next((f.name for f in typ if pa.types.is_integer(f.type) or pa.types.is_boolean(f.type)), None)
    meta = pf.metadata
    leaf = f"{name}.{narrow}"
    index = next((j for j in range(meta.num_columns) if meta.schema.column(j).path == leaf), None)
    if narrow is None or index is None:
        return None
    holding, unsure = [], []
    for i in range(meta.num_row_groups):
        group = meta.row_group(i)
        stats = group.column(index).statistics
        if stats is not None and stats.has_null_count and stats.null_count < group.num_rows:
            holding.append(i)
        elif group.num_rows:
            unsure.append(i)
    for i in unsure:
        if pc.any(pc.is_valid(pf.read_row_group(i, columns=[leaf], use_threads=False).column(name))).as_py():
            holding.append(i)
    return sorted(holding)


def read_checkpoint(
    storage: TableStorage, checkpoint: Checkpoint, progress: Callable[[int, int], None] | None = None
) -> CheckpointState:
    """All actions of a checkpoint, with sidecar files of a V2 checkpoint folded in.

    ``progress(done, total)`` is told before each part or sidecar is read: a checkpoint of many
    parts is a long wait. The total grows once a V2 manifest names its sidecars.
    """
    adds: list[pa.Table] = []
    removes: list[pa.Table] = []
    stats = DeferredStats(storage)
    state = CheckpointState(
        checkpoint.version, action_schema.ADD.empty_table(), action_schema.REMOVE.empty_table(), stats
    )
    for done, info in enumerate(checkpoint.files):
        if progress is not None:
            progress(done, len(checkpoint.files))
        path = storage.log_file(info.name)
        if checkpoint.format == "json":
            _read_json_checkpoint(storage, path, state, adds, removes)
            continue
        for kind, table in _read_parquet_part(storage, path, stats):
            if kind == "add":
                adds.append(table)
            elif kind == "remove":
                removes.append(table)
            else:
                _small_actions(table, state, file=path, uri=storage.uri)
    for done, sidecar in enumerate(state.sidecars, start=len(checkpoint.files)):
        if progress is not None:
            progress(done, len(checkpoint.files) + len(state.sidecars))
        path = _sidecar_path(storage, sidecar.path)
        for kind, table in _read_parquet_part(storage, path, stats):
            if kind == "add":
                adds.append(table)
            elif kind == "remove":
                removes.append(table)
    if adds:
        state.adds = pa.concat_tables(adds)
    state.adds = _numbered(state.adds)
    if removes:
        state.removes = pa.concat_tables(removes)
    _holds_config(storage, checkpoint, state)
    # the log replay that follows allocates anew: give it the pages the decoding freed
    release_unused_arrow()
    return state


def _numbered(adds: pa.Table) -> pa.Table:
    """``adds`` with :data:`CHECKPOINT_ROW`: 0, 1, 2... (where each row's stats are)."""
    rows = pc.indices_nonzero(pa.repeat(pa.scalar(True), adds.num_rows))
    return adds.append_column(pa.field(CHECKPOINT_ROW, CHECKPOINT_ROW_TYPE), rows)


def _holds_config(storage: TableStorage, checkpoint: Checkpoint, state: CheckpointState) -> Metadata:
    """A checkpoint holds the protocol and metaData of its version (PROTOCOL.md): one that lacks
    either (an emptied file, text that is no checkpoint) is refused naming it, whatever the commits
    after it hold. Its metaData is returned."""
    missing = [
        name for name, found in (("protocol", state.protocol), ("metaData", state.metadata)) if not found
    ]
    if missing:
        parts = f" ({len(checkpoint.files)} parts)" if len(checkpoint.files) > 1 else ""
        raise IncompleteTableStateError(
            f"not a checkpoint{parts}: it holds no {' and no '.join(missing)} action "
            "(a checkpoint holds the protocol and metaData of its version)",
            table=storage.uri,
            version=checkpoint.version,
            file=storage.log_file(checkpoint.files[0].name),
        )
    assert state.metadata is not None
    return state.metadata


def read_checkpoint_config(storage: TableStorage, checkpoint: Checkpoint) -> CheckpointState:
    """Only the protocol and metaData of a checkpoint (no file actions, no sidecars), and the
    checkpointMetadata of a V2 one (its header: whoever uses the checkpoint checks it).

    What a reader needs to know the table's schema and features at a version: a change feed plan
    needs that at its start and at the latest version, never their file lists.
    """
    state = CheckpointState(
        checkpoint.version, action_schema.ADD.empty_table(), action_schema.REMOVE.empty_table()
    )
    for info in checkpoint.files:
        path = storage.log_file(info.name)
        if checkpoint.format == "json":
            only = tuple(f'"{name}"'.encode() for name in _CONFIG_ACTIONS)
            runs = read_actions(storage.read_bytes(path), table=storage.uri, file=path, only=only)
            for line, name, value in iter_values(runs):
                if name in _CONFIG_ACTIONS:
                    _apply_small({name: value}, state, file=path, uri=storage.uri, line=line)
            continue
        pf = _open_part(storage, path)
        names = set(pf.schema_arrow.names)
        for name in _CONFIG_ACTIONS:
            if name in names:
                with _corrupt_checkpoint(Where(storage.uri, path), name):
                    column = _read_action_column(pf, name)
                _small_actions(column, state, file=path, uri=storage.uri)
    _holds_config(storage, checkpoint, state)
    return state


def _sidecar_path(storage: TableStorage, path: str) -> str:
    # relative to _delta_log/_sidecars (as kernel-rs joins it), held to the table root
    return storage.resolve(path, kind="sidecar")


def _read_json_checkpoint(
    storage: TableStorage, path: str, state: CheckpointState, adds: list[pa.Table], removes: list[pa.Table]
) -> None:
    """A V2 checkpoint written as JSON lines: the boundary validates it as it does a commit."""
    file_actions: dict[str, list[dict[str, Any]]] = {"add": [], "remove": []}
    for run in read_actions(storage.read_bytes(path), table=storage.uri, file=path):
        if run.name in file_actions:
            file_actions[run.name] += run.values
        else:
            for line, value in enumerate(run.values, start=run.line):
                _apply_small({run.name: value}, state, file=path, uri=storage.uri, line=line)
    with _corrupt_checkpoint(Where(storage.uri, path), "add"):
        if file_actions["add"]:
            rows = pa.Table.from_pylist(file_actions["add"], schema=action_schema.ADD)
            assert state.add_stats is not None
            adds.append(_keep_stats(rows, state.add_stats))
        if file_actions["remove"]:
            removes.append(pa.Table.from_pylist(file_actions["remove"], schema=action_schema.REMOVE))
