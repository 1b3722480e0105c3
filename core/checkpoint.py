"""Reading checkpoints (classic, multi-part, V2 with sidecars) into Arrow.

File actions stay columnar from the parquet page to the snapshot: the ``add`` struct column is
filtered and flattened by pyarrow, never turned into Python objects. Only the handful of
non-file actions (protocol, metaData, txn, domainMetadata) become models.

A checkpoint is log input like a commit and gets the same checks (:mod:`.actions`), vectorised:
columns of the types the protocol gives (integers stay integers, a string is not a number),
required fields present, paths non-empty, sizes non-negative, deletion vector descriptors well
formed, and every partition column named by each file's ``partitionValues``. A file that is not
Parquet, or is cut short, is refused as a corrupt checkpoint (exit 2), never a traceback.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from . import action_schema
from .accumulator import ActionAccumulator
from .actions import PartitionKeys, Where, iter_values, read_actions
from .errors import CorruptLogError, IncompleteTableStateError
from .log import Checkpoint
from .models import CheckpointMetadata, DomainMetadata, Metadata, Protocol, Sidecar, parse_action
from .storage import TableStorage

SIDECAR_DIR = "_sidecars"
_SMALL_ACTIONS = ("metaData", "protocol", "txn", "domainMetadata", "checkpointMetadata", "sidecar")
#: what a reader of a checkpoint's configuration reads of it
_CONFIG_ACTIONS = ("metaData", "protocol", "checkpointMetadata")


@dataclass
class CheckpointState:
    """What one checkpoint holds, before the commits after it are applied."""

    version: int
    adds: pa.Table
    removes: pa.Table
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
    """The non-null rows of a struct column as a table conformed to ``schema``."""
    column = action_schema.keep_rows(column, pc.is_valid(column))
    if len(column) == 0:
        return schema.empty_table()
    return action_schema.conform(pa.Table.from_struct_array(column), schema)


#: fields a file action row must have (as a commit line must), by action type
_REQUIRED = {
    "add": ("path", "partitionValues", "size", "modificationTime", "dataChange"),
    "remove": ("path", "dataChange"),
}
_NON_NEGATIVE = ("size", "baseRowId", "defaultRowCommitVersion")
_DV_NON_NEGATIVE = ("offset", "sizeInBytes", "cardinality", "maxRowIndex")


def check_file_rows(kind: str, rows: pa.Table, where: Where) -> None:
    """A checkpoint's ``add`` (or ``remove``) rows, checked as the boundary checks commit lines,
    in Arrow: a handful of kernels whatever the number of files (a null count is free, a minimum
    one pass; deletion vectors are checked on the rows that have one)."""

    def refuse(mask: pa.ChunkedArray | pa.Array, problem: str) -> None:
        if pc.any(mask).as_py():
            row = pc.index(mask, True).as_py()
            raise where.refuse(f"{problem} (checkpoint {kind} row {row})")

    for name in _REQUIRED[kind]:
        if rows[name].null_count:
            refuse(pc.is_null(rows[name]), f"{kind}.{name}: required field missing")
    if rows.num_rows and pc.min(pc.binary_length(rows["path"])).as_py() == 0:
        refuse(pc.equal(pc.binary_length(rows["path"]), 0), f"{kind}.path: expected a non-empty string")
    for name in _NON_NEGATIVE:
        if rows[name].null_count == rows.num_rows:
            continue
        low = pc.min(rows[name]).as_py()
        if low is not None and low < 0:
            refuse(pc.less(rows[name], 0), f"{kind}.{name}: expected a non-negative 64-bit integer")
    dv = rows["deletionVector"]
    if dv.null_count == len(dv):
        return
    present = pc.is_valid(dv)
    dvs = dv.filter(present)  # the few rows with a deletion vector

    def refuse_dv(mask: pa.ChunkedArray | pa.Array, problem: str) -> None:
        if pc.any(mask).as_py():
            row = pc.indices_nonzero(present)[pc.index(mask, True).as_py()].as_py()
            raise where.refuse(f"{problem} (checkpoint {kind} row {row})")

    storage_type = pc.struct_field(dvs, "storageType")
    refuse_dv(
        pc.invert(pc.fill_null(pc.is_in(storage_type, pa.array(["u", "i", "p"])), False)),
        f"{kind}.deletionVector.storageType: expected one of 'u', 'i', 'p'",
    )
    inline = pc.struct_field(dvs, "pathOrInlineDv")
    refuse_dv(
        pc.fill_null(pc.equal(pc.binary_length(inline), 0), True),
        f"{kind}.deletionVector.pathOrInlineDv: expected a non-empty string",
    )
    for name in _DV_NON_NEGATIVE:
        values = pc.struct_field(dvs, name)
        if name in ("sizeInBytes", "cardinality") and values.null_count:
            refuse_dv(pc.is_null(values), f"{kind}.deletionVector.{name}: required field missing")
        low = pc.min(values).as_py()
        if low is not None and low < 0:
            refuse_dv(pc.less(values, 0), f"{kind}.deletionVector.{name}: expected a non-negative integer")


def check_partition_rows(rows: pa.Table, columns: PartitionKeys, where: Where, kind: str = "add") -> None:
    """Every row's ``partitionValues`` names every partition column (by physical or logical name).

    Vectorised, chunk by chunk: per column, a running count of the entries naming it, read at
    each row's end. With one partition column and one entry per map (the usual case) a count of
    the entries naming it is enough.
    """
    if not columns or rows.num_rows == 0:
        return
    first_row = 0
    for maps in rows["partitionValues"].chunks:
        keys = maps.keys  # every entry's key; the offsets (absolute, even in a slice) delimit each row's
        offsets = maps.offsets
        lengths = pc.subtract(offsets.slice(1), offsets.slice(0, len(maps)))
        for physical, logical in columns:
            hit = pc.equal(keys.slice(offsets[0].as_py(), offsets[-1].as_py() - offsets[0].as_py()), physical)
            if logical != physical:
                hit = pc.or_(hit, pc.equal(keys.slice(offsets[0].as_py(), len(hit)), logical))
            if (
                len(columns) == 1
                and pc.sum(hit).as_py() == len(maps)
                and pc.min_max(lengths).as_py() == {"min": 1, "max": 1}
            ):
                continue  # one entry per map, each naming the column
            running = pa.concat_arrays(
                [pa.array([0], pa.int64()), pc.cumulative_sum(pc.cast(hit, pa.int64()))]
            )
            base = offsets[0].as_py()
            starts = pc.subtract(pc.cast(offsets.slice(0, len(maps)), pa.int64()), base)
            ends = pc.subtract(pc.cast(offsets.slice(1), pa.int64()), base)
            missing = pc.equal(pc.subtract(running.take(ends), running.take(starts)), 0)
            if pc.any(missing).as_py():
                row = first_row + pc.index(missing, True).as_py()
                raise where.refuse(
                    f"{kind}.partitionValues: partition column {logical!r} is missing "
                    f"(checkpoint {kind} row {row})"
                )
        first_row += len(maps)


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


def _read_parquet_part(storage: TableStorage, path: str) -> Iterator[tuple[str, pa.Table]]:
    """(kind, table) pieces of one checkpoint parquet file: 'add', 'remove' and 'small'.

    File action rows come out checked (:func:`check_file_rows`); anything Arrow cannot read or
    cast (a corrupt page, a column of the wrong type) is a corrupt checkpoint.
    """
    pf = _open_part(storage, path)
    where = Where(storage.uri, path)
    names = set(pf.schema_arrow.names)
    for kind in ("add", "remove"):
        if kind in names:
            with _corrupt_checkpoint(where, kind):
                rows = struct_rows(_read_action_column(pf, kind).column(kind), action_schema.SCHEMAS[kind])
            check_file_rows(kind, rows, where)
            yield kind, rows
    for name in _SMALL_ACTIONS:
        if name in names:
            with _corrupt_checkpoint(where, name):
                small = _read_action_column(pf, name)
            yield "small", small


@contextlib.contextmanager
def _corrupt_checkpoint(where: Where, column: str) -> Iterator[None]:
    try:
        yield
    except (OSError, EOFError, MemoryError, pa.ArrowException, TypeError, ValueError) as exc:
        if isinstance(exc, CorruptLogError):
            raise
        text = " ".join(str(exc).split())  # one line
        raise where.refuse(f"unreadable checkpoint ({column} column): {text}") from exc


def _open_part(storage: TableStorage, path: str) -> pq.ParquetFile:
    try:
        return storage.parquet_file(path)
    except FileNotFoundError:
        raise CorruptLogError(
            "checkpoint file disappeared while reading", table=storage.uri, file=path
        ) from None
    except (OSError, EOFError, MemoryError, pa.ArrowException) as exc:
        text = " ".join(str(exc).split())  # one line
        raise CorruptLogError(f"unreadable checkpoint: {text}", table=storage.uri, file=path) from exc


def _read_action_column(pf: pq.ParquetFile, name: str) -> pa.Table:
    """The column of one action type, from only the row groups that hold such an action."""
    groups = _row_groups_holding(pf, name)
    if groups is None or len(groups) == pf.metadata.num_row_groups:
        return pf.read(columns=[name])
    return pf.read_row_groups(groups, columns=[name])


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
    if unsure:
        valid = pc.is_valid(pf.read_row_groups(unsure, columns=[leaf]).column(name))
        start = 0
        for i in unsure:
            rows = meta.row_group(i).num_rows
            if pc.any(valid.slice(start, rows)).as_py():
                holding.append(i)
            start += rows
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
    state = CheckpointState(
        checkpoint.version, action_schema.ADD.empty_table(), action_schema.REMOVE.empty_table()
    )
    for done, info in enumerate(checkpoint.files):
        if progress is not None:
            progress(done, len(checkpoint.files))
        path = storage.log_file(info.name)
        if checkpoint.format == "json":
            _read_json_checkpoint(storage, path, state, adds, removes)
            continue
        for kind, table in _read_parquet_part(storage, path):
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
        for kind, table in _read_parquet_part(storage, path):
            if kind == "add":
                adds.append(table)
            elif kind == "remove":
                removes.append(table)
    if adds:
        state.adds = pa.concat_tables(adds)
    if removes:
        state.removes = pa.concat_tables(removes)
    metadata = _holds_config(storage, checkpoint, state)
    name = storage.log_file(checkpoint.files[0].name)
    check_partition_rows(state.adds, metadata.partition_keys, Where(storage.uri, name))
    return state


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
            adds.append(pa.Table.from_pylist(file_actions["add"], schema=action_schema.ADD))
        if file_actions["remove"]:
            removes.append(pa.Table.from_pylist(file_actions["remove"], schema=action_schema.REMOVE))
