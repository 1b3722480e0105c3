"""Rows of a Delta table: data files read with the physical schema, shown with the logical one.

A data file names its columns physically (column mapping: by physical name, or by parquet field id),
may lack columns added later (those read as nulls), may hold timestamps as int96 or in another unit,
and may even hold partition columns (``materializePartitionColumns``), whose values must still come
from the log. Deletion vectors drop rows by their index in the file. Files are streamed row group by
row group so a large file never sits in memory whole.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from . import deletion_vectors
from .errors import (
    DataFileNotFoundError,
    DeletionVectorError,
    SchemaError,
    StorageError,
    UnsupportedFeatureError,
)
from .partitions import parse_partition_value, partition_value_of
from .schema import (
    PARQUET_FIELD_ID,
    ArrayType,
    ColumnMappingMode,
    DeltaType,
    MapType,
    PrimitiveType,
    StructField,
    StructType,
    column_mapping_mode,
    field_id,
    physical_name,
    to_arrow_field,
    to_arrow_type,
)
from .storage import TableStorage

BATCH_SIZE = 65_536


# --- finding a column in a file -------------------------------------------------------------


def _file_field_id(field: pa.Field) -> int | None:
    raw = (field.metadata or {}).get(PARQUET_FIELD_ID)
    return int(raw) if raw is not None else None


def _find_child(candidates: Sequence[pa.Field], field: StructField, mode: ColumnMappingMode) -> int | None:
    """Position of the file column holding ``field``: by field id in ``id`` mode, else by name.

    Names fall back to a case-insensitive match, as delta-spark resolves parquet columns.
    """
    if mode == "id":
        wanted = field_id(field)
        if wanted is None:
            raise SchemaError(f"column {field.name!r} has no column mapping id in 'id' mode")
        for i, f in enumerate(candidates):
            if _file_field_id(f) == wanted:
                return i
        return None
    name = physical_name(field, mode)
    for i, f in enumerate(candidates):
        if f.name == name:
            return i
    folded = [i for i, f in enumerate(candidates) if f.name.lower() == name.lower()]
    return folded[0] if len(folded) == 1 else None


# --- physical array -> logical array --------------------------------------------------------


def _conform(array: pa.Array, data_type: DeltaType, mode: ColumnMappingMode, path: str) -> pa.Array:
    """``array`` as read from parquet, turned into the logical Arrow type of ``data_type``."""
    target = to_arrow_type(data_type)
    if mode != "id" and array.type == target:  # same names and types at every level: nothing to do
        return array
    if isinstance(data_type, StructType):
        return _conform_struct(array, data_type, mode, path)
    if isinstance(data_type, ArrayType):
        return _conform_list(array, data_type, mode, path)
    if isinstance(data_type, MapType):
        return _conform_map(array, data_type, mode, path)
    if isinstance(data_type, PrimitiveType) and data_type.name == "variant":
        return _conform_variant(array, target, path)
    if array.type == target:
        return array
    return _cast_leaf(array, data_type, target, path)


def _cast_leaf(array: pa.Array, data_type: DeltaType, target: pa.DataType, path: str) -> pa.Array:
    source = array.type
    try:
        if pa.types.is_timestamp(target) and pa.types.is_timestamp(source):
            # Spark's int96 and isAdjustedToUTC=false are both UTC instants for `timestamp`;
            # for `timestamp_ntz` a zoned value keeps its UTC wall clock.
            if target.tz is not None and source.tz is None:
                array = array.cast(pa.timestamp(source.unit, tz=target.tz))
            elif target.tz is None and source.tz is not None:
                array = array.cast(pa.timestamp(source.unit))
            return pc.cast(array, options=pc.CastOptions(target, allow_time_truncate=True))
        return array.cast(target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
        raise SchemaError(
            f"column {path!r}: data file type {source} cannot be read as {data_type.to_json_value()}: {exc}"
        ) from exc


def _valid_mask(array: pa.Array) -> pa.Array | None:
    return array.is_null() if array.null_count else None


def _conform_struct(array: pa.Array, data_type: StructType, mode: ColumnMappingMode, path: str) -> pa.Array:
    if not pa.types.is_struct(array.type):
        raise SchemaError(f"column {path!r} is a struct in the table but {array.type} in the data file")
    file_fields = [array.type.field(i) for i in range(array.type.num_fields)]
    children = []
    for field in data_type.fields:
        child_path = f"{path}.{field.name}"
        i = _find_child(file_fields, field, mode)
        if i is None:
            children.append(pa.nulls(len(array), to_arrow_type(field.type)))
        else:
            children.append(_conform(array.field(i), field.type, mode, child_path))
    fields = [to_arrow_field(f) for f in data_type.fields]
    return pa.StructArray.from_arrays(children, fields=fields, mask=_valid_mask(array))


def _list_parts(array: pa.Array, path: str) -> tuple[pa.Array, pa.Array]:
    if pa.types.is_list(array.type) or pa.types.is_large_list(array.type):
        return array.offsets.cast(pa.int32()), array.values
    if pa.types.is_fixed_size_list(array.type):
        size = array.type.list_size
        offsets = pa.array(
            range(array.offset * size, (array.offset + len(array)) * size + 1, size), pa.int32()
        )
        return offsets, array.values
    raise SchemaError(f"column {path!r} is an array in the table but {array.type} in the data file")


def _conform_list(array: pa.Array, data_type: ArrayType, mode: ColumnMappingMode, path: str) -> pa.Array:
    offsets, values = _list_parts(array, path)
    values = _conform(values, data_type.element_type, mode, f"{path}.element")
    target = to_arrow_type(data_type)
    return pa.ListArray.from_arrays(offsets, values, type=target, mask=_valid_mask(array))


def _conform_map(array: pa.Array, data_type: MapType, mode: ColumnMappingMode, path: str) -> pa.Array:
    if pa.types.is_map(array.type):
        offsets, keys, items = array.offsets, array.keys, array.items
    else:  # a legacy 2-level map written as list<struct<key, value>>
        offsets, entries = _list_parts(array, path)
        if not pa.types.is_struct(entries.type) or entries.type.num_fields != 2:
            raise SchemaError(f"column {path!r} is a map in the table but {array.type} in the data file")
        keys, items = entries.field(0), entries.field(1)
    keys = _conform(keys, data_type.key_type, mode, f"{path}.key")
    items = _conform(items, data_type.value_type, mode, f"{path}.value")
    target = to_arrow_type(data_type)
    return pa.MapArray.from_arrays(offsets, keys, items, type=target, mask=_valid_mask(array))


def _conform_variant(array: pa.Array, target: pa.DataType, path: str) -> pa.Array:
    if not pa.types.is_struct(array.type):
        raise SchemaError(f"column {path!r} is a variant but {array.type} in the data file")
    names = [array.type.field(i).name for i in range(array.type.num_fields)]
    if "typed_value" in names:
        raise UnsupportedFeatureError(
            f"column {path!r} holds shredded variant data, which deltamirror cannot read",
            feature="variantShredding",
        )
    if "value" not in names or "metadata" not in names:
        raise SchemaError(f"variant column {path!r} lacks 'value' or 'metadata' in the data file")
    children = [array.field(names.index(n)).cast(pa.binary()) for n in ("value", "metadata")]
    return pa.StructArray.from_arrays(children, fields=list(target), mask=_valid_mask(array))


# --- reading one file -----------------------------------------------------------------------


def _open(storage: TableStorage, fs_path: str, path_in_log: str, table: str) -> pq.ParquetFile:
    """The parquet file, int96 timestamps read as microseconds (nanoseconds overflow past 2262)."""
    try:
        return pq.ParquetFile(
            fs_path, filesystem=storage.fs, pre_buffer=True, coerce_int96_timestamp_unit="us"
        )
    except FileNotFoundError as exc:
        raise DataFileNotFoundError(
            "data file referenced by the log is missing (vacuumed?)", table=table, file=path_in_log
        ) from exc
    except (OSError, pa.ArrowInvalid) as exc:
        raise StorageError(f"cannot open data file: {exc}", table=table, file=path_in_log) from exc


def _selected_fields(schema: StructType, columns: Sequence[str] | None) -> list[StructField]:
    if columns is None:
        return list(schema.fields)
    return list(schema.select(columns).fields)


def read_data_file(
    storage: TableStorage,
    path_in_log: str,
    *,
    schema: StructType,
    partition_columns: Sequence[str],
    column_mapping: ColumnMappingMode,
    partition_values: Mapping[str, str | None],
    deletion_vector: Mapping[str, Any] | None = None,
    columns: Sequence[str] | None = None,
    only_rows: pa.UInt64Array | None = None,
    table: str | None = None,
) -> Iterator[pa.RecordBatch]:
    """The live rows of one data file, in the logical schema (``columns`` only, in table order).

    ``only_rows`` keeps exactly those row indexes (the change feed's rows whose DV bit flipped) and
    replaces the deletion vector; otherwise rows the deletion vector deletes are dropped.
    Partition columns are constants parsed from ``partition_values`` (keys: physical names).
    """
    table = table if table is not None else storage.uri
    fields = _selected_fields(schema, columns)
    out_schema = pa.schema([to_arrow_field(f) for f in fields])
    part_names = {schema.field(name).name for name in partition_columns}
    constants: dict[str, pa.Scalar] = {}
    for f in fields:
        if f.name in part_names:
            raw = partition_value_of(partition_values, f, column_mapping)
            constants[f.name] = parse_partition_value(
                raw, f.type, column=f.name, table=table, file=path_in_log
            )

    pf = _open(storage, storage.data_path(path_in_log), path_in_log, table)
    try:
        file_fields = list(pf.schema_arrow)
        if column_mapping == "id" and file_fields and all(_file_field_id(f) is None for f in file_fields):
            raise SchemaError(
                "the table uses column mapping mode 'id' but the data file has no parquet field ids",
                table=table,
                file=path_in_log,
            )
        # logical field -> position in the file (None: not in the file, read as nulls)
        positions: dict[str, int | None] = {}
        for f in fields:
            if f.name not in part_names:
                positions[f.name] = _find_child(file_fields, f, column_mapping)
        read_names = sorted({file_fields[i].name for i in positions.values() if i is not None})

        def assemble(raw: pa.RecordBatch | None, num_rows: int) -> pa.RecordBatch:
            arrays = []
            for f in fields:
                if f.name in constants:
                    arrays.append(pa.repeat(constants[f.name], num_rows))
                    continue
                i = positions[f.name]
                if i is None or raw is None:
                    arrays.append(pa.nulls(num_rows, to_arrow_type(f.type)))
                else:
                    column = raw.column(raw.schema.get_field_index(file_fields[i].name))
                    arrays.append(_conform(column, f.type, column_mapping, f.name))
            return pa.RecordBatch.from_arrays(arrays, schema=out_schema)

        try:
            yield from _stream(
                pf,
                read_names,
                assemble,
                _row_filter(storage, pf, deletion_vector, only_rows, table, path_in_log),
            )
        except DeletionVectorError as exc:
            if exc.table is None:
                exc.table, exc.file = table, path_in_log
            raise
        except OSError as exc:
            raise StorageError(f"cannot read data file: {exc}", table=table, file=path_in_log) from exc
    finally:
        pf.close()


class _RowFilter:
    """Which rows of the file survive: a keep mask (deletion vector) or a sorted index list."""

    def __init__(self, mask: pa.BooleanArray | None, rows: pa.Int64Array | None) -> None:
        self.mask = mask
        self.rows = rows

    def any_in(self, start: int, stop: int) -> bool:
        if self.mask is not None:
            return bool(pc.any(self.mask.slice(start, stop - start)).as_py())
        if self.rows is not None:
            return self._rows_in(start, stop) is not None
        return True

    def _rows_in(self, start: int, stop: int) -> pa.Array | None:
        assert self.rows is not None
        lo = _search(self.rows, start)
        hi = _search(self.rows, stop)
        return self.rows.slice(lo, hi - lo) if hi > lo else None

    def apply(self, batch: pa.RecordBatch, start: int) -> pa.RecordBatch:
        if self.mask is not None:
            return batch.filter(self.mask.slice(start, batch.num_rows))
        if self.rows is not None:
            wanted = self._rows_in(start, start + batch.num_rows)
            if wanted is None:
                return batch.slice(0, 0)
            return batch.take(pc.subtract(wanted, pa.scalar(start, pa.int64())))
        return batch


def _search(sorted_rows: pa.Int64Array, value: int) -> int:
    """Index of the first element >= value (binary search on an Arrow array)."""
    lo, hi = 0, len(sorted_rows)
    while lo < hi:
        mid = (lo + hi) // 2
        if sorted_rows[mid].as_py() < value:
            lo = mid + 1
        else:
            hi = mid
    return lo


def _row_filter(
    storage: TableStorage,
    pf: pq.ParquetFile,
    deletion_vector: Mapping[str, Any] | None,
    only_rows: pa.UInt64Array | None,
    table: str,
    path_in_log: str,
) -> _RowFilter:
    num_rows = pf.metadata.num_rows
    if only_rows is not None:
        rows = pc.unique(only_rows.cast(pa.int64()))
        rows = pc.take(rows, pc.sort_indices(rows))
        if len(rows) and rows[-1].as_py() >= num_rows:
            raise DeletionVectorError(
                f"row {rows[-1].as_py()} requested but the data file has {num_rows} rows",
                table=table,
                file=path_in_log,
            )
        return _RowFilter(None, rows)
    if deletion_vector is None:
        return _RowFilter(None, None)
    deleted = deletion_vectors.read_deleted_rows(storage, deletion_vector, table=table, data_file=path_in_log)
    if len(deleted) == 0:
        return _RowFilter(None, None)
    return _RowFilter(deletion_vectors.keep_mask(deleted, num_rows, data_file=path_in_log), None)


def _stream(
    pf: pq.ParquetFile,
    read_names: list[str],
    assemble: Any,
    row_filter: _RowFilter,
) -> Iterator[pa.RecordBatch]:
    start = 0
    for rg in range(pf.metadata.num_row_groups):
        rg_rows = pf.metadata.row_group(rg).num_rows
        rg_start, start = start, start + rg_rows
        if rg_rows == 0 or not row_filter.any_in(rg_start, rg_start + rg_rows):
            continue
        if not read_names:  # only partition columns or columns absent from the file
            for offset in range(0, rg_rows, BATCH_SIZE):
                n = min(BATCH_SIZE, rg_rows - offset)
                out = row_filter.apply(assemble(None, n), rg_start + offset)
                if out.num_rows:
                    yield out
            continue
        offset = rg_start
        for raw in pf.iter_batches(batch_size=BATCH_SIZE, row_groups=[rg], columns=read_names):
            kept = row_filter.apply(raw, offset)
            offset += raw.num_rows
            if kept.num_rows:
                yield assemble(kept, kept.num_rows)


# --- reading a snapshot ---------------------------------------------------------------------


def read_snapshot(
    storage: TableStorage,
    files: pa.Table,
    *,
    schema: StructType,
    partition_columns: Sequence[str],
    configuration: Mapping[str, str],
    columns: Sequence[str] | None = None,
    table: str | None = None,
) -> Iterator[pa.RecordBatch]:
    """The rows of every active file (``path``, ``partitionValues``, ``deletionVector`` columns)."""
    mode = column_mapping_mode(configuration)
    if files.num_rows == 0:
        return
    wanted = [c for c in ("path", "partitionValues", "deletionVector") if c in files.column_names]
    if "path" not in wanted:
        raise SchemaError("the files table has no 'path' column", table=table)
    for chunk in files.select(wanted).to_batches(max_chunksize=1024):
        for row in chunk.to_pylist():
            yield from read_data_file(
                storage,
                row["path"],
                schema=schema,
                partition_columns=partition_columns,
                column_mapping=mode,
                partition_values=dict(row.get("partitionValues") or ()),
                deletion_vector=row.get("deletionVector"),
                columns=columns,
                table=table,
            )
