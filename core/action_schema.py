"""Arrow types of file actions, shared by commit parsing, checkpoints and snapshots.

Snapshots of a million files are Arrow tables of these columns, never Python objects per file.
The names are Delta's own (camelCase), as in a checkpoint's ``add`` struct.
"""

from __future__ import annotations

import itertools
from typing import Any, TypeVar

import pyarrow as pa

from deltamirror.core.compute import pc

STRING_MAP = pa.map_(pa.string(), pa.string())

DELETION_VECTOR = pa.struct(
    [
        pa.field("storageType", pa.string()),
        pa.field("pathOrInlineDv", pa.string()),
        pa.field("offset", pa.int32()),
        pa.field("sizeInBytes", pa.int32()),
        pa.field("cardinality", pa.int64()),
        pa.field("maxRowIndex", pa.int64()),
    ]
)

ADD = pa.schema(
    [
        pa.field("path", pa.string(), nullable=False),
        pa.field("partitionValues", STRING_MAP),
        pa.field("size", pa.int64()),
        pa.field("modificationTime", pa.int64()),
        pa.field("dataChange", pa.bool_()),
        pa.field("stats", pa.string()),
        pa.field("tags", STRING_MAP),
        pa.field("deletionVector", DELETION_VECTOR),
        pa.field("baseRowId", pa.int64()),
        pa.field("defaultRowCommitVersion", pa.int64()),
        pa.field("clusteringProvider", pa.string()),
    ]
)

REMOVE = pa.schema(
    [
        pa.field("path", pa.string(), nullable=False),
        pa.field("deletionTimestamp", pa.int64()),
        pa.field("dataChange", pa.bool_()),
        pa.field("extendedFileMetadata", pa.bool_()),
        pa.field("partitionValues", STRING_MAP),
        pa.field("size", pa.int64()),
        pa.field("stats", pa.string()),
        pa.field("tags", STRING_MAP),
        pa.field("deletionVector", DELETION_VECTOR),
        pa.field("baseRowId", pa.int64()),
        pa.field("defaultRowCommitVersion", pa.int64()),
    ]
)

CDC = pa.schema(
    [
        pa.field("path", pa.string(), nullable=False),
        pa.field("partitionValues", STRING_MAP),
        pa.field("size", pa.int64()),
        pa.field("dataChange", pa.bool_()),
        pa.field("tags", STRING_MAP),
    ]
)

SCHEMAS = {"add": ADD, "remove": REMOVE, "cdc": CDC}

T = TypeVar("T", pa.Table, pa.ChunkedArray)
_MAX_RUNS = 64  # runs kept as slices whatever the size
_MIN_ROWS_PER_RUN = 256  # beyond that many runs, the average slice must hold this many rows


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """Give a table read from any writer exactly ``schema``: missing columns as nulls, extra dropped.

    Checkpoints from different writers differ in which optional fields they carry and in integer
    widths; replay concatenates them with commit actions, so they must agree. Only casts that keep
    values are made (integer widths, string flavours): a column of another kind (a string where a
    long belongs) raises :class:`ColumnTypeError`, as a line with such a field is refused. An
    integer that does not fit the narrower type raises ``pa.ArrowInvalid``.
    """
    columns = []
    for field in schema:
        if field.name in table.column_names:
            col = table.column(field.name)
            if col.type != field.type:
                check_castable(col.type, field.type, field.name)
                col = _cast(col, field.type)
            columns.append(col)
        else:
            columns.append(pa.nulls(table.num_rows, field.type))
    return pa.Table.from_arrays(columns, schema=schema)


class ColumnTypeError(ValueError):
    """A file action column whose type is not the protocol's (nor a lossless variant of it)."""


def _same_kind(src: pa.DataType, dst: pa.DataType) -> bool:
    for kind in (pa.types.is_integer, pa.types.is_boolean):
        if kind(dst):
            return bool(kind(src))
    if pa.types.is_string(dst):
        return bool(pa.types.is_string(src) or pa.types.is_large_string(src))
    return False


def check_castable(src: pa.DataType, dst: pa.DataType, name: str) -> None:
    """Raise :class:`ColumnTypeError` unless ``src`` values become ``dst`` values unchanged."""
    if src == dst or pa.types.is_null(src):
        return
    if pa.types.is_struct(dst) and pa.types.is_struct(src):
        for f in dst:
            i = src.get_field_index(f.name)
            if i >= 0:
                check_castable(src.field(i).type, f.type, f"{name}.{f.name}")
        return
    if pa.types.is_map(dst) and pa.types.is_map(src):
        check_castable(src.key_type, dst.key_type, f"{name}.key")
        check_castable(src.item_type, dst.item_type, f"{name}.value")
        return
    if not _same_kind(src, dst):
        raise ColumnTypeError(f"{name}: expected {dst}, the column holds {src}")


def keep_rows(data: T, keep: pa.Array | pa.ChunkedArray) -> T:
    """The rows of ``data`` where ``keep`` (no nulls) is true, in order, copying no row if it can.

    Replay drops a handful of a checkpoint's million files (and a checkpoint's ``add`` rows sit in a
    few runs between other actions); a filter would copy every kept path and stats string. Runs of
    kept rows become zero-copy slices instead, as long as there are few of them: more than one
    chunk per ``_MIN_ROWS_PER_RUN`` rows would slow every later kernel, so then it filters.
    """
    if isinstance(keep, pa.ChunkedArray):
        keep = keep.combine_chunks() if keep.num_chunks != 1 else keep.chunk(0)
    n = len(keep)
    if n == 0:
        return data
    changes: pa.Array = pc.indices_nonzero(pc.not_equal(keep.slice(1), keep.slice(0, n - 1)))
    if len(changes) > 2 * max(_MAX_RUNS, n // _MIN_ROWS_PER_RUN):
        return data.filter(keep)
    edges = [0, *(i + 1 for i in changes.to_pylist()), n]
    first_kept = bool(keep[0].as_py())
    runs = [(a, b - a) for i, (a, b) in enumerate(itertools.pairwise(edges)) if (i % 2 == 0) == first_kept]
    if runs == [(0, n)]:
        return data
    pieces = [data.slice(start, length) for start, length in runs] or [data.slice(0, 0)]
    if isinstance(data, pa.Table):
        return pa.concat_tables(pieces)
    return pa.chunked_array([c for p in pieces for c in p.chunks], type=data.type)


def _cast(col: pa.ChunkedArray, target: pa.DataType) -> pa.ChunkedArray:
    if pa.types.is_struct(target) and pa.types.is_struct(col.type):
        chunks = []
        for chunk in col.chunks:
            arrays = []
            for f in target:
                idx = chunk.type.get_field_index(f.name)
                child = chunk.field(idx) if idx >= 0 else pa.nulls(len(chunk), f.type)
                arrays.append(child if child.type == f.type else child.cast(f.type))
            chunks.append(pa.StructArray.from_arrays(arrays, fields=list(target), mask=chunk.is_null()))
        return pa.chunked_array(chunks, type=target)
    return col.cast(target)


def file_rows(files: pa.Table) -> list[dict[str, Any]]:
    """Active-file rows as ``add`` action bodies (Delta's names, nulls left out), column by column."""
    columns: list[tuple[str, list[Any]]] = []
    for name, col in zip(files.column_names, files.columns, strict=True):
        if col.null_count == len(col):
            continue
        values = col.to_pylist()
        typ = col.type
        if pa.types.is_map(typ):
            values = [dict(v) if v is not None else None for v in values]
        elif pa.types.is_struct(typ):
            values = [
                {k: x for k, x in v.items() if x is not None} if v is not None else None for v in values
            ]
        columns.append((name, values))
    return [
        {name: values[i] for name, values in columns if values[i] is not None} for i in range(files.num_rows)
    ]
