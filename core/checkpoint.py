"""Reading checkpoints (classic, multi-part, V2 with sidecars) into Arrow.

File actions stay columnar from the parquet page to the snapshot: the ``add`` struct column is
filtered and flattened by pyarrow, never turned into Python objects. Only the handful of
non-file actions (protocol, metaData, txn, domainMetadata) become models.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from . import action_schema
from .errors import CorruptLogError
from .log import Checkpoint, iter_json_actions
from .models import CheckpointMetadata, DomainMetadata, Metadata, Protocol, Sidecar, Txn
from .storage import TableStorage

SIDECAR_DIR = "_sidecars"
_SMALL_ACTIONS = ("metaData", "protocol", "txn", "domainMetadata", "checkpointMetadata", "sidecar")


@dataclass
class CheckpointState:
    """What one checkpoint holds, before the commits after it are applied."""

    version: int
    adds: pa.Table
    removes: pa.Table
    metadata: Metadata | None = None
    protocol: Protocol | None = None
    txns: dict[str, Txn] = field(default_factory=dict)
    domains: dict[str, DomainMetadata] = field(default_factory=dict)
    checkpoint_metadata: CheckpointMetadata | None = None
    sidecars: list[Sidecar] = field(default_factory=list)


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


def _small_actions(table: pa.Table, state: CheckpointState, *, file: str, uri: str) -> None:
    for name in _SMALL_ACTIONS:
        if name not in table.column_names:
            continue
        col = table.column(name)
        col = col.filter(pc.is_valid(col))
        for raw in col.to_pylist():
            _apply_small({name: arrow_to_python(raw, col.type)}, state, file=file, uri=uri)


def _apply_small(wrapped: dict[str, Any], state: CheckpointState, *, file: str, uri: str) -> None:
    from .models import parse_action  # local: models imports schema which is heavier

    action = parse_action(wrapped, file=file, table=uri)
    if isinstance(action, Metadata):
        state.metadata = action
    elif isinstance(action, Protocol):
        state.protocol = action
    elif isinstance(action, Txn):
        state.txns[action.app_id] = action
    elif isinstance(action, DomainMetadata):
        if not action.removed:
            state.domains[action.domain] = action
    elif isinstance(action, CheckpointMetadata):
        state.checkpoint_metadata = action
    elif isinstance(action, Sidecar):
        state.sidecars.append(action)


def _read_parquet_part(storage: TableStorage, path: str) -> Iterator[tuple[str, pa.Table]]:
    """(kind, table) pieces of one checkpoint parquet file: 'add', 'remove' and 'small'."""
    pf = _open_part(storage, path)
    names = set(pf.schema_arrow.names)
    for kind in ("add", "remove"):
        if kind in names:
            col = _read_action_column(pf, kind).column(kind)
            yield kind, struct_rows(col, action_schema.SCHEMAS[kind])
    for name in _SMALL_ACTIONS:
        if name in names:
            yield "small", _read_action_column(pf, name)


def _open_part(storage: TableStorage, path: str) -> pq.ParquetFile:
    try:
        return storage.parquet_file(path)
    except FileNotFoundError:
        raise CorruptLogError(
            "checkpoint file disappeared while reading", table=storage.uri, file=path
        ) from None
    except (OSError, pa.ArrowInvalid) as exc:
        raise CorruptLogError(f"unreadable checkpoint: {exc}", table=storage.uri, file=path) from exc


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


def read_checkpoint(storage: TableStorage, checkpoint: Checkpoint) -> CheckpointState:
    """All actions of a checkpoint, with sidecar files of a V2 checkpoint folded in."""
    adds: list[pa.Table] = []
    removes: list[pa.Table] = []
    state = CheckpointState(
        checkpoint.version, action_schema.ADD.empty_table(), action_schema.REMOVE.empty_table()
    )
    for info in checkpoint.files:
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
    for sidecar in state.sidecars:
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
    return state


def read_checkpoint_config(storage: TableStorage, checkpoint: Checkpoint) -> CheckpointState:
    """Only the protocol and metaData of a checkpoint (no file actions, no sidecars).

    What a reader needs to know the table's schema and features at a version: a change feed plan
    needs that at its start and at the latest version, never their file lists.
    """
    state = CheckpointState(
        checkpoint.version, action_schema.ADD.empty_table(), action_schema.REMOVE.empty_table()
    )
    for info in checkpoint.files:
        path = storage.log_file(info.name)
        if checkpoint.format == "json":
            only = (b'"metaData"', b'"protocol"')
            for _, wrapped in iter_json_actions(
                storage.read_bytes(path), table=storage.uri, file=path, only=only
            ):
                if "metaData" in wrapped or "protocol" in wrapped:
                    _apply_small(wrapped, state, file=path, uri=storage.uri)
            continue
        pf = _open_part(storage, path)
        names = set(pf.schema_arrow.names)
        for name in ("metaData", "protocol"):
            if name in names:
                _small_actions(_read_action_column(pf, name), state, file=path, uri=storage.uri)
    return state


def _sidecar_path(storage: TableStorage, path: str) -> str:
    if "/" in path or ":" in path:
        return storage.data_path(path)
    return storage.log_file(f"{SIDECAR_DIR}/{path}")


def _read_json_checkpoint(
    storage: TableStorage, path: str, state: CheckpointState, adds: list[pa.Table], removes: list[pa.Table]
) -> None:
    file_actions: dict[str, list[dict[str, Any]]] = {"add": [], "remove": []}
    for _, wrapped in iter_json_actions(storage.read_bytes(path), table=storage.uri, file=path):
        name = next(iter(wrapped))
        if name in file_actions:
            file_actions[name].append(wrapped[name])
        else:
            _apply_small(wrapped, state, file=path, uri=storage.uri)
    if file_actions["add"]:
        adds.append(pa.Table.from_pylist(file_actions["add"], schema=action_schema.ADD))
    if file_actions["remove"]:
        removes.append(pa.Table.from_pylist(file_actions["remove"], schema=action_schema.REMOVE))
