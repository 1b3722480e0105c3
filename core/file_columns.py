"""A data file's columns made the table's: the physical columns a file holds, read as logical ones.

A data file names its columns physically (column mapping: by physical name, or by parquet field
id), may lack columns added later (those read as nulls), may hold timestamps as int96 or in
another unit, legacy two-level maps, variants, and even partition columns
(``materializePartitionColumns``), whose values must still come from the log. This module works
out, per table schema and per file column layout, which file column feeds each table column and
turns each decoded batch into the logical schema; :mod:`.read` opens the files and streams them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from deltamirror.core.compute import pc

from .errors import SchemaError, UnsupportedFeatureError
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
    field_id,
    physical_name,
    to_arrow_field,
    to_arrow_type,
)

__all__ = ["AppendColumns", "FileColumns", "SchemaReader", "schema_reader"]


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


# --- a table schema's reader, per file layout ------------------------------------------------


def _selected_fields(schema: StructType, columns: Sequence[str] | None) -> list[StructField]:
    if columns is None:
        return list(schema.fields)
    return list(schema.select(columns).fields)


class FileColumns:
    """Which file column feeds each output column, for files whose top-level columns are alike."""

    def __init__(
        self, read_names: list[str], sources: list[str | None], file_names: Sequence[str] = ()
    ) -> None:
        self.read_names = read_names  # the file columns to decode
        self.sources = sources  # per output column: its file column (None: absent or partition)
        #: what to ask the parquet reader for: None when that is every column of the file
        self.columns_arg: list[str] | None = (
            None if read_names and len(set(file_names)) == len(file_names) == len(read_names) else read_names
        )
        #: per decoded batch schema (files with these columns may differ in types: string or
        #: string_view...), how each output column comes from such a batch; checked once
        self._plans: list[tuple[pa.Schema, _BatchPlan]] = []

    def plan_for(self, batch_schema: pa.Schema, reader: SchemaReader) -> _BatchPlan:
        for schema, plan in self._plans:
            if batch_schema == schema:
                return plan
        plan = _plan(self, batch_schema, reader)
        if len(self._plans) >= _PLANS_KEPT:
            self._plans.clear()
        self._plans.append((batch_schema, plan))
        return plan


@dataclass(frozen=True)
class AppendColumns:
    """Columns a caller adds after the table's to every batch read (a change feed's
    ``_change_type``, ``_commit_version``...): built in the same batch, not in a second one."""

    #: the schema of the whole batch: the table's columns read, then the appended ones
    schema: pa.Schema
    #: the appended columns for a batch of ``n`` rows (before deletion-vector filtering)
    arrays: Callable[[int], Sequence[pa.Array]]


class SchemaReader:
    """What reading files of one table schema needs, worked out once instead of once per file.

    A change feed or a snapshot opens thousands of small files, where per-file Python work costs
    as much as decoding: Arrow types, the output schema and the partition columns depend only on
    the schema, and the file-to-table column match only on the file's column names (and ids).
    """

    def __init__(
        self,
        schema: StructType,
        partition_columns: Sequence[str],
        mode: ColumnMappingMode,
        columns: Sequence[str] | None,
    ) -> None:
        self.mode = mode
        self.fields = _selected_fields(schema, columns)
        self.targets = [to_arrow_type(f.type) for f in self.fields]
        self.out_schema = pa.schema([to_arrow_field(f) for f in self.fields])
        part_names = {schema.field(name).name for name in partition_columns}
        self.partition = [f.name in part_names for f in self.fields]
        self._partition_fields = [(i, f) for i, f in enumerate(self.fields) if self.partition[i]]
        self._layouts: dict[tuple[Any, ...], FileColumns] = {}
        self._constants: dict[tuple[str | None, ...], Mapping[int, pa.Scalar]] = {}

    def constants(
        self, partition_values: Mapping[str, str | None], table: str, path_in_log: str
    ) -> Mapping[int, pa.Scalar]:
        """Output position -> the file's partition value there (read-only: shared by the files
        of one partition, as parsing a value costs several Arrow calls per file)."""
        if not self._partition_fields:
            return _NO_CONSTANTS
        raw = tuple(partition_value_of(partition_values, f, self.mode) for _, f in self._partition_fields)
        found = self._constants.get(raw)
        if found is None:
            found = {
                i: parse_partition_value(value, f.type, column=f.name, table=table, file=path_in_log)
                for (i, f), value in zip(self._partition_fields, raw, strict=True)
            }
            if len(self._constants) >= _CONSTANTS_KEPT:
                self._constants.clear()
            self._constants[raw] = found
        return found

    def file_columns(self, file_schema: pa.Schema, table: str, path_in_log: str) -> FileColumns:
        if self.mode == "id":
            key: tuple[Any, ...] = tuple((f.name, _file_field_id(f)) for f in file_schema)
        else:
            key = tuple(file_schema.names)
        found = self._layouts.get(key)
        if found is None:
            found = self._match(list(file_schema), table, path_in_log)
            if len(self._layouts) >= _LAYOUTS_KEPT:
                self._layouts.clear()
            self._layouts[key] = found
        return found

    def _match(self, file_fields: list[pa.Field], table: str, path_in_log: str) -> FileColumns:
        if self.mode == "id" and file_fields and all(_file_field_id(f) is None for f in file_fields):
            raise SchemaError(
                "the table uses column mapping mode 'id' but the data file has no parquet field ids",
                table=table,
                file=path_in_log,
            )
        sources: list[str | None] = []
        for f, is_partition in zip(self.fields, self.partition, strict=True):
            i = None if is_partition else _find_child(file_fields, f, self.mode)
            sources.append(None if i is None else file_fields[i].name)
        read_names = sorted({s for s in sources if s is not None})
        return FileColumns(read_names, sources, [f.name for f in file_fields])

    def assemble(
        self,
        layout: FileColumns,
        constants: Mapping[int, pa.Scalar],
        raw: pa.RecordBatch | None,
        num_rows: int,
        append: AppendColumns | None = None,
    ) -> pa.RecordBatch:
        arrays = self._arrays(layout, constants, raw, num_rows)
        if append is None:
            return pa.RecordBatch.from_arrays(arrays, schema=self.out_schema)
        return pa.RecordBatch.from_arrays([*arrays, *append.arrays(num_rows)], schema=append.schema)

    def _arrays(
        self,
        layout: FileColumns,
        constants: Mapping[int, pa.Scalar],
        raw: pa.RecordBatch | None,
        num_rows: int,
    ) -> list[pa.Array]:
        if raw is None:  # only partition columns and columns absent from the file
            return [
                pa.repeat(constants[i], num_rows) if is_partition else pa.nulls(num_rows, target)
                for i, (is_partition, target) in enumerate(zip(self.partition, self.targets, strict=True))
            ]
        plan = layout.plan_for(raw.schema, self)
        columns: list[pa.Array] = raw.columns
        if plan.identity:  # the batch's columns are the output, as they are
            return columns
        arrays: list[pa.Array] = []
        for i, (kind, j) in enumerate(plan.steps):
            if kind == _TAKE:
                arrays.append(columns[j])
            elif kind == _CONFORM:
                f = self.fields[i]
                arrays.append(_conform(columns[j], f.type, self.mode, f.name))
            elif kind == _CONSTANT:
                arrays.append(pa.repeat(constants[i], num_rows))
            else:
                arrays.append(pa.nulls(num_rows, self.targets[i]))
        return arrays


#: how an output column comes from a decoded batch: its column j as it is, or made logical
#: (column mapping ids, another type), or the file's partition value, or nulls (not in the file)
_TAKE, _CONFORM, _CONSTANT, _NULLS = range(4)


@dataclass(frozen=True)
class _BatchPlan:
    """Per output column (kind, batch position) for batches of one schema, worked out once."""

    steps: tuple[tuple[int, int], ...]
    #: every output column is the batch's column at the same position, unchanged
    identity: bool


def _plan(layout: FileColumns, batch_schema: pa.Schema, reader: SchemaReader) -> _BatchPlan:
    names = batch_schema.names
    steps = []
    for i, source in enumerate(layout.sources):
        if reader.partition[i]:
            steps.append((_CONSTANT, -1))
        elif source is None:
            steps.append((_NULLS, -1))
        else:
            j = names.index(source)
            same = reader.mode != "id" and batch_schema.field(j).type == reader.targets[i]
            steps.append((_TAKE if same else _CONFORM, j))
    identity = len(steps) == len(names) and all(s == (_TAKE, i) for i, s in enumerate(steps))
    return _BatchPlan(tuple(steps), identity)


#: distinct file column layouts remembered per schema reader (files of one writer share one)
_LAYOUTS_KEPT = 64
#: decoded batch schemas (types) whose plan one file column layout remembers
_PLANS_KEPT = 8
#: distinct partitions whose parsed values a schema reader remembers
_CONSTANTS_KEPT = 1024
_NO_CONSTANTS: Mapping[int, pa.Scalar] = {}
#: schema readers remembered, by the identity of the (frozen) schema they were built for
_READERS_KEPT = 16
_readers: dict[tuple[Any, ...], tuple[StructType, SchemaReader]] = {}


def schema_reader(
    schema: StructType,
    partition_columns: Sequence[str],
    mode: ColumnMappingMode,
    columns: Sequence[str] | None,
) -> SchemaReader:
    """The reader for this schema, shared by the reads of one snapshot or change feed.

    Keyed by the schema object's identity (hashing a wide schema per file would cost what the
    cache saves); the entry holds the schema, so its id cannot be reused while it is cached.
    """
    key = (id(schema), tuple(partition_columns), mode, None if columns is None else tuple(columns))
    entry = _readers.get(key)
    if entry is not None and entry[0] is schema:
        return entry[1]
    reader = SchemaReader(schema, partition_columns, mode, columns)
    if len(_readers) >= _READERS_KEPT:
        _readers.clear()
    _readers[key] = (schema, reader)
    return reader
