"""Delta table schemas (``metaData.schemaString``) as typed values, and their Arrow forms.

Parsing keeps everything a writer put in the JSON (unknown keys, column metadata, the object form
``{"type": "variant"}``, a key left out) so that :meth:`StructType.to_json_string` gives back the
same JSON: a mirror republishes schemas and must not alter them. Equality ignores those spelling
details, so a parsed schema equals the same schema built in code.

Column mapping (PROTOCOL.md "Column Mapping"): data files name columns by their *physical* name
(mode ``name``) or parquet field id (mode ``id``); readers show the *logical* name.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Annotated, Any, ClassVar, Literal

import pyarrow as pa
import pydantic_core
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    model_serializer,
    model_validator,
)
from pydantic.alias_generators import to_camel

from .errors import SchemaError, UnsupportedFeatureError

ColumnMappingMode = Literal["none", "name", "id"]

COLUMN_MAPPING_MODE_KEY = "delta.columnMapping.mode"
PHYSICAL_NAME_KEY = "delta.columnMapping.physicalName"
COLUMN_ID_KEY = "delta.columnMapping.id"
NESTED_IDS_KEY = "delta.columnMapping.nested.ids"
PARQUET_FIELD_ID = b"PARQUET:field_id"

PRIMITIVE_TYPE_NAMES = frozenset(
    {
        "string",
        "long",
        "integer",
        "short",
        "byte",
        "float",
        "double",
        "boolean",
        "binary",
        "date",
        "timestamp",
        "timestamp_ntz",
        "variant",
        "void",
    }
)

_DECIMAL = re.compile(r"^decimal\(\s*(-?\d+)\s*,\s*(-?\d+)\s*\)$")
# set as validation context by parse_schema: only JSON input records how it was spelled
_FROM_JSON = "deltamirror.schema.from_json"


def _is_json_input(info: ValidationInfo) -> bool:
    return isinstance(info.context, Mapping) and bool(info.context.get(_FROM_JSON))


class _SchemaNode(BaseModel):
    """A node of a schema: frozen, camelCase on the wire, unknown keys kept as extras."""

    model_config = ConfigDict(frozen=True, populate_by_name=True, alias_generator=to_camel, extra="allow")

    # the "type" key of this node's JSON object, consumed by validation (None: not an object)
    _wire_type: ClassVar[str | None] = None
    # wire keys the source JSON left out (defaults apply, but are not written back)
    _absent: frozenset[str] = PrivateAttr(default_factory=frozenset)

    @model_validator(mode="before")
    @classmethod
    def _drop_type_key(cls, data: Any) -> Any:
        if cls._wire_type is not None and isinstance(data, Mapping) and "type" in data:
            if data["type"] != cls._wire_type:
                raise ValueError(f"expected type {cls._wire_type!r}, not {data['type']!r}")
            return {k: v for k, v in data.items() if k != "type"}
        return data

    def to_json_value(self) -> Any:
        """The node as Delta writes it in ``schemaString`` (a str for primitives, else a dict)."""
        return self._json(exact=True)

    def _json(self, *, exact: bool) -> Any:
        raise NotImplementedError

    def _finish(self, out: dict[str, Any], *, exact: bool) -> dict[str, Any]:
        if exact:
            for key in self._absent:
                out.pop(key, None)
        for key, value in (self.__pydantic_extra__ or {}).items():
            out.setdefault(key, value)
        return out

    @model_serializer(mode="plain")
    def _serialize(self) -> Any:
        return self.to_json_value()

    @model_validator(mode="after")
    def _record_absent(self, info: ValidationInfo) -> _SchemaNode:
        if _is_json_input(info):
            optional = {
                (f.alias or name)
                for name, f in type(self).model_fields.items()
                if not f.is_required() and name not in self.model_fields_set
            }
            self._absent = frozenset(optional)
        return self

    def __eq__(self, other: object) -> bool:
        if type(self) is not type(other):
            return NotImplemented
        assert isinstance(other, _SchemaNode)
        return self.__dict__ == other.__dict__ and (self.__pydantic_extra__ or {}) == (
            other.__pydantic_extra__ or {}
        )

    def __hash__(self) -> int:
        return hash(json.dumps(self._json(exact=False), sort_keys=True, default=str))


class PrimitiveType(_SchemaNode):
    """A type named by a bare string: ``long``, ``timestamp_ntz``, ``variant``, or one unknown here."""

    name: str
    # `{"type": "variant"}` is as legal as `"variant"`; keep the spelling the writer chose
    _as_object: bool = PrivateAttr(default=False)

    def _json(self, *, exact: bool) -> Any:
        if exact and (self._as_object or self.__pydantic_extra__):
            return self._finish({"type": self.name}, exact=exact)
        return self.name


class DecimalType(_SchemaNode):
    """``decimal(precision,scale)``."""

    precision: int
    scale: int
    _spelling: str | None = PrivateAttr(default=None)
    _as_object: bool = PrivateAttr(default=False)

    def _json(self, *, exact: bool) -> Any:
        name = (self._spelling if exact else None) or f"decimal({self.precision},{self.scale})"
        if exact and (self._as_object or self.__pydantic_extra__):
            return self._finish({"type": name}, exact=exact)
        return name


def _to_data_type(value: Any, info: ValidationInfo) -> Any:
    """JSON form of a type -> node: a type is a bare string or an object with a "type" key."""
    if isinstance(value, _SchemaNode):
        return value
    context = info.context
    if isinstance(value, str):
        return _primitive_or_decimal(value, {}, as_object=False, context=context)
    if isinstance(value, Mapping):
        kind = value.get("type")
        if kind == "struct":
            return StructType.model_validate(value, context=context)
        if kind == "array":
            return ArrayType.model_validate(value, context=context)
        if kind == "map":
            return MapType.model_validate(value, context=context)
        if isinstance(kind, str):
            rest = {k: v for k, v in value.items() if k != "type"}
            return _primitive_or_decimal(kind, rest, as_object=True, context=context)
    raise ValueError(f"not a Delta data type: {value!r}")


def _primitive_or_decimal(
    name: str, extra: dict[str, Any], *, as_object: bool, context: Any
) -> PrimitiveType | DecimalType:
    node: PrimitiveType | DecimalType
    match = _DECIMAL.match(name)
    if match:
        node = DecimalType.model_validate(
            {"precision": int(match[1]), "scale": int(match[2]), **extra}, context=context
        )
        if name != f"decimal({node.precision},{node.scale})":
            node._spelling = name
    elif name == "decimal":  # Spark's spelling of its default decimal(10,0)
        node = DecimalType.model_validate({"precision": 10, "scale": 0, **extra}, context=context)
        node._spelling = name
    else:
        node = PrimitiveType.model_validate({"name": name, **extra}, context=context)
    node._as_object = as_object
    return node


class ArrayType(_SchemaNode):
    _wire_type: ClassVar[str | None] = "array"

    element_type: DataType
    contains_null: bool = True

    def _json(self, *, exact: bool) -> Any:
        out = {
            "type": "array",
            "elementType": self.element_type._json(exact=exact),
            "containsNull": self.contains_null,
        }
        return self._finish(out, exact=exact)


class MapType(_SchemaNode):
    _wire_type: ClassVar[str | None] = "map"

    key_type: DataType
    value_type: DataType
    value_contains_null: bool = True

    def _json(self, *, exact: bool) -> Any:
        out = {
            "type": "map",
            "keyType": self.key_type._json(exact=exact),
            "valueType": self.value_type._json(exact=exact),
            "valueContainsNull": self.value_contains_null,
        }
        return self._finish(out, exact=exact)


class StructField(_SchemaNode):
    name: str
    type: DataType
    nullable: bool = True
    metadata: dict[str, Any] = Field(default_factory=dict)

    def _json(self, *, exact: bool) -> Any:
        out = {
            "name": self.name,
            "type": self.type._json(exact=exact),
            "nullable": self.nullable,
            "metadata": dict(self.metadata),
        }
        return self._finish(out, exact=exact)


class StructType(_SchemaNode):
    _wire_type: ClassVar[str | None] = "struct"

    fields: tuple[StructField, ...]

    def _json(self, *, exact: bool) -> Any:
        out = {"type": "struct", "fields": [f._json(exact=exact) for f in self.fields]}
        return self._finish(out, exact=exact)

    def to_json_string(self) -> str:
        """The schema as a ``schemaString``: the JSON it was parsed from, up to key order."""
        return json.dumps(self.to_json_value(), separators=(",", ":"), ensure_ascii=False)

    @property
    def names(self) -> list[str]:
        return [f.name for f in self.fields]

    def field(self, name: str) -> StructField:
        """The field called ``name``; exact match first, then case-insensitive like delta-spark."""
        for f in self.fields:
            if f.name == name:
                return f
        folded = [f for f in self.fields if f.name.lower() == name.lower()]
        if len(folded) == 1:
            return folded[0]
        raise SchemaError(f"no column {name!r} in the schema", column=name)

    def select(self, names: Iterable[str]) -> StructType:
        """The named fields, in the schema's own order."""
        wanted = {self.field(n).name for n in names}
        return StructType(fields=tuple(f for f in self.fields if f.name in wanted))


DeltaType = PrimitiveType | DecimalType | ArrayType | MapType | StructType
# the annotation of a type-valued attribute: accepts the JSON forms (a string or an object)
DataType = Annotated[DeltaType, BeforeValidator(_to_data_type)]

ArrayType.model_rebuild()
MapType.model_rebuild()
StructField.model_rebuild()
StructType.model_rebuild()


# --- parsing ----------------------------------------------------------------------------------


@functools.lru_cache(maxsize=32)
def parse_schema(schema_string: str) -> StructType:
    """Parse a ``schemaString``; :class:`SchemaError` when it is not JSON or not a Delta struct.

    Cached (a schema is immutable): the log boundary checks each metaData's schema, then the
    table's readers use it, and a table has few schemas."""
    try:  # strict and depth-limited (a nesting too deep is an error, never a RecursionError)
        value = pydantic_core.from_json(schema_string, allow_inf_nan=False)
    except (TypeError, ValueError) as exc:
        raise SchemaError(f"schemaString is not JSON: {exc}") from exc
    if not isinstance(value, dict) or value.get("type") != "struct":
        raise SchemaError("schemaString must be a JSON object of type 'struct'")
    try:
        return StructType.model_validate(value, context={_FROM_JSON: True})
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"])
        raise SchemaError(f"schemaString is not a valid Delta schema: {where}: {first['msg']}") from None
    except RecursionError:
        raise SchemaError("schemaString nests types too deeply") from None


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
