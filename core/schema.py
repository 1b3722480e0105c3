"""What a Delta table schema means for data files and Arrow: physical names and Arrow types.

Column mapping (PROTOCOL.md "Column Mapping"): data files name columns by their *physical* name
(mode ``name``) or parquet field id (mode ``id``); readers show the *logical* name. The schema's
types themselves, and their parsing from ``schemaString``, are :mod:`.schema_types`'s (re-exported
here: this is where readers import a schema's names from).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import pyarrow as pa

from .errors import SchemaError, UnsupportedFeatureError
from .schema_types import (
    PRIMITIVE_TYPE_NAMES,
    ArrayType,
    DataType,
    DecimalType,
    DeltaType,
    MapType,
    PrimitiveType,
    StructField,
    StructType,
    parse_schema,
)

__all__ = [
    "COLUMN_ID_KEY",
    "COLUMN_MAPPING_MODE_KEY",
    "NESTED_IDS_KEY",
    "PARQUET_FIELD_ID",
    "PHYSICAL_NAME_KEY",
    "PRIMITIVE_TYPE_NAMES",
    "VARIANT_ARROW",
    "ArrayType",
    "ColumnMappingMode",
    "DataType",
    "DecimalType",
    "DeltaType",
    "MapType",
    "PrimitiveType",
    "StructField",
    "StructType",
    "column_mapping_mode",
    "data_schema",
    "field_id",
    "parse_schema",
    "partition_schema",
    "physical_name",
    "schema_problem",
    "to_arrow_field",
    "to_arrow_schema",
    "to_arrow_type",
    "to_physical_arrow_schema",
]

ColumnMappingMode = Literal["none", "name", "id"]

COLUMN_MAPPING_MODE_KEY = "delta.columnMapping.mode"
PHYSICAL_NAME_KEY = "delta.columnMapping.physicalName"
COLUMN_ID_KEY = "delta.columnMapping.id"
NESTED_IDS_KEY = "delta.columnMapping.nested.ids"
PARQUET_FIELD_ID = b"PARQUET:field_id"


# --- column mapping ---------------------------------------------------------------------------


def column_mapping_mode(configuration: Mapping[str, str]) -> ColumnMappingMode:
    """``delta.columnMapping.mode`` (absent = ``none``).

    Only meaningful when the protocol supports the ``columnMapping`` feature; the caller checks that.
    """
    mode = (configuration.get(COLUMN_MAPPING_MODE_KEY) or "none").strip().lower()
    if mode == "none":
        return "none"
    if mode == "name":
        return "name"
    if mode == "id":
        return "id"
    raise UnsupportedFeatureError(f"unknown column mapping mode {mode!r}", feature="columnMapping", mode=mode)


def physical_name(field: StructField, mode: ColumnMappingMode) -> str:
    """The name the column has in data files and in ``partitionValues``/stats."""
    if mode != "none":
        name = field.metadata.get(PHYSICAL_NAME_KEY)
        if isinstance(name, str) and name:
            return name
    return field.name


def field_id(field: StructField) -> int | None:
    """``delta.columnMapping.id``, the parquet field id in ``id`` mode."""
    value = field.metadata.get(COLUMN_ID_KEY)
    if value is None:
        return None
    try:
        return int(value)
    except (TypeError, ValueError) as exc:
        raise SchemaError(f"column {field.name!r} has a non-integer column id {value!r}") from exc


# --- partition / data columns -----------------------------------------------------------------


def partition_schema(schema: StructType, partition_columns: Sequence[str]) -> StructType:
    """The partition columns' fields, in ``partitionColumns`` order."""
    return StructType(fields=tuple(schema.field(name) for name in partition_columns))


def data_schema(schema: StructType, partition_columns: Sequence[str]) -> StructType:
    """The fields stored in data files (all but the partition columns), in schema order."""
    parts = {schema.field(name).name for name in partition_columns}
    return StructType(fields=tuple(f for f in schema.fields if f.name not in parts))


# --- Arrow ------------------------------------------------------------------------------------

_ARROW_PRIMITIVES: dict[str, pa.DataType] = {
    "string": pa.string(),
    "long": pa.int64(),
    "integer": pa.int32(),
    "short": pa.int16(),
    "byte": pa.int8(),
    "float": pa.float32(),
    "double": pa.float64(),
    "boolean": pa.bool_(),
    "binary": pa.binary(),
    "date": pa.date32(),
    "timestamp": pa.timestamp("us", tz="UTC"),
    "timestamp_ntz": pa.timestamp("us"),
    "void": pa.null(),
}

VARIANT_ARROW = pa.struct(
    [pa.field("value", pa.binary(), nullable=False), pa.field("metadata", pa.binary(), nullable=False)]
)


def to_arrow_type(data_type: DeltaType) -> pa.DataType:
    """The Arrow type of a Delta type, with logical names for nested fields."""
    return _arrow_type(data_type, None, None)


def to_arrow_field(field: StructField) -> pa.Field:
    return _arrow_field(field, None)


def to_arrow_schema(schema: StructType) -> pa.Schema:
    """The table's rows as Arrow: logical names, Delta nullability."""
    return pa.schema([_arrow_field(f, None) for f in schema.fields])


def to_physical_arrow_schema(schema: StructType, mode: ColumnMappingMode) -> pa.Schema:
    """The schema of data files: physical names at every level; field ids too in ``id`` mode."""
    return pa.schema([_arrow_field(f, mode) for f in schema.fields])


def _arrow_field(field: StructField, mode: ColumnMappingMode | None) -> pa.Field:
    name = field.name if mode is None else physical_name(field, mode)
    nested_ids = _nested_ids(field) if mode == "id" else None
    arrow_type = _arrow_type(field.type, mode, (name, nested_ids) if nested_ids else None)
    metadata = None
    if mode == "id":
        fid = field_id(field)
        if fid is not None:
            metadata = {PARQUET_FIELD_ID: str(fid).encode()}
    return _pa_field(name, arrow_type, field.nullable, metadata)


def _pa_field(name: str, arrow_type: pa.DataType, nullable: bool, metadata: Any = None) -> pa.Field:
    # Arrow's null type (Delta's `void`) cannot be declared non-nullable
    nullable = nullable or pa.types.is_null(arrow_type)
    return pa.field(name, arrow_type, nullable=nullable, metadata=metadata)


def _nested_ids(field: StructField) -> dict[str, Any] | None:
    ids = field.metadata.get(NESTED_IDS_KEY)
    return ids if isinstance(ids, dict) and ids else None


def _id_meta(nested: tuple[str, dict[str, Any]] | None, suffix: str) -> dict[bytes, bytes] | None:
    if nested is None:
        return None
    value = nested[1].get(f"{nested[0]}.{suffix}")
    return None if value is None else {PARQUET_FIELD_ID: str(int(value)).encode()}


def _child(nested: tuple[str, dict[str, Any]] | None, suffix: str) -> tuple[str, dict[str, Any]] | None:
    return None if nested is None else (f"{nested[0]}.{suffix}", nested[1])


def _arrow_type(
    data_type: DeltaType,
    mode: ColumnMappingMode | None,
    nested: tuple[str, dict[str, Any]] | None,
) -> pa.DataType:
    if isinstance(data_type, PrimitiveType):
        if data_type.name == "variant":
            return VARIANT_ARROW
        arrow = _ARROW_PRIMITIVES.get(data_type.name)
        if arrow is None:
            raise SchemaError(
                f"unknown Delta type {data_type.name!r} (no Arrow mapping)", type=data_type.name
            )
        return arrow
    if isinstance(data_type, DecimalType):
        try:
            return pa.decimal128(data_type.precision, data_type.scale)
        except (ValueError, pa.ArrowInvalid) as exc:
            raise SchemaError(f"invalid decimal type {data_type.to_json_value()!r}: {exc}") from exc
    if isinstance(data_type, ArrayType):
        element = _pa_field(
            "element",
            _arrow_type(data_type.element_type, mode, _child(nested, "element")),
            data_type.contains_null,
            _id_meta(nested, "element"),
        )
        return pa.list_(element)
    if isinstance(data_type, MapType):
        key_type = _arrow_type(data_type.key_type, mode, _child(nested, "key"))
        if pa.types.is_null(key_type):
            raise SchemaError("a map key cannot be of type void")
        key = _pa_field("key", key_type, False, _id_meta(nested, "key"))
        value = _pa_field(
            "value",
            _arrow_type(data_type.value_type, mode, _child(nested, "value")),
            data_type.value_contains_null,
            _id_meta(nested, "value"),
        )
        return pa.map_(key, value)
    if isinstance(data_type, StructType):
        return pa.struct([_arrow_field(f, mode) for f in data_type.fields])
    raise SchemaError(f"not a Delta data type: {data_type!r}")


@functools.lru_cache(maxsize=32)
def schema_problem(schema_string: str) -> str | None:
    """Why a schema the log boundary accepted describes no table a reader can read (a type name
    no Delta reader knows, a decimal beyond 38 digits, a map keyed by ``void``), or None.

    The boundary cannot tell: a type a reader feature brings (``geometry`` with ``geospatial``)
    is unknown only to a reader without that feature, so the check waits for the protocol's.
    Cached: every reader asks it of the metaData in force, and a table has few schemas.
    """
    try:
        to_arrow_schema(parse_schema(schema_string))
    except SchemaError as exc:
        return exc.message
    return None
