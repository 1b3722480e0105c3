"""Delta types as Avro: the schemas of the ``avro`` row-change format and its values (docs/avro.md).

A table's Delta schema (each column's Delta type, from the version's ``metaData`` when the caller
knows it, else read back from the batch's Arrow type) becomes the Avro ``Value`` record of a row;
the envelope, key and ``source`` records are Debezium's. Values are converted per column, as the
JSON formats convert them (:mod:`.connect_types`): on the Arrow side where Arrow can (timestamps to
int64 microseconds, dates to int32 days), then one ``to_pylist``; nested values take a Python step.

The mapping (docs/avro.md has it as a table):

==================  ==================================================================================
Delta               Avro
==================  ==================================================================================
boolean             ``boolean``
byte, short         ``int`` with ``"connect.type": "int8"`` / ``"int16"`` (Avro has no smaller int)
integer, long       ``int``, ``long``
float, double       ``float``, ``double`` (NaN and infinities as they are: Avro carries them)
decimal(p,s)        ``bytes`` with logical type ``decimal``, ``precision`` p, ``scale`` s
string, binary      ``string``, ``bytes``
date                ``int`` with logical type ``date`` (days since 1970-01-01)
timestamp           ``long`` with logical type ``timestamp-micros`` (UTC)
timestamp_ntz       ``long`` with logical type ``local-timestamp-micros``
struct              ``record`` (named by its path: ``Value_<column>_<field>``)
array               ``array`` of the element type
map, string keys    ``map`` of the value type
map, other keys     ``array`` of ``record {key, value}`` (``"deltamirror.map": true``), Kafka
                    Connect's AvroConverter form for non-string keys
variant             ``record {value: bytes, metadata: bytes}`` with ``"deltamirror.type": "variant"``:
                    the Variant binary encoding as Delta stores it (no decoding)
void                ``null``
nullable T          ``["null", T]`` with ``"default": null``
==================  ==================================================================================

Names: Avro names match ``[A-Za-z_][A-Za-z0-9_]*``. A column or field name that does not is
sanitized (every other character becomes ``_``; a leading digit gets a ``_`` before it; a name
taken already by a sibling gets ``_2``, ``_3``...), and the field carries the Delta name as
``"deltamirror.name"``. A name that is valid stays as it is, without the property.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pyarrow as pa

from deltamirror.core.compute import pc
from deltamirror.core.schema import (
    VARIANT_ARROW,
    ArrayType,
    DecimalType,
    DeltaType,
    MapType,
    PrimitiveType,
    StructField,
    StructType,
    to_arrow_type,
)

#: the property a sanitized field keeps its Delta name in
ORIGINAL_NAME = "deltamirror.name"
#: the property of an array that carries a map with non-string keys
MAP_ENTRIES = "deltamirror.map"
#: the property of the record that carries a variant
DELTA_TYPE = "deltamirror.type"

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_NOT_NAME_CHAR = re.compile(r"[^A-Za-z0-9_]")

_INT_PRIMITIVES: dict[str, Any] = {
    "boolean": "boolean",
    "byte": {"type": "int", "connect.type": "int8"},
    "short": {"type": "int", "connect.type": "int16"},
    "integer": "int",
    "long": "long",
    "float": "float",
    "double": "double",
    "string": "string",
    "binary": "bytes",
    "date": {"type": "int", "logicalType": "date"},
    "timestamp": {"type": "long", "logicalType": "timestamp-micros"},
    "timestamp_ntz": {"type": "long", "logicalType": "local-timestamp-micros"},
    "void": "null",
}


def avro_name(name: str) -> str:
    """``name`` as a valid Avro name (see the module's docstring)."""
    if _NAME.match(name):
        return name
    clean = _NOT_NAME_CHAR.sub("_", name) or "_"
    return f"_{clean}" if clean[0].isdigit() else clean


def avro_namespace(topic: str) -> str:
    """A topic name as an Avro namespace: each dot-separated part an Avro name."""
    return ".".join(avro_name(part) for part in topic.split(".") if part)


def field_names(names: Sequence[str]) -> list[str]:
    """The Avro names of sibling fields named ``names``: sanitized, then made unique in order."""
    taken: set[str] = set()
    out = []
    for name in names:
        base = avro_name(name)
        candidate, n = base, 1
        while candidate in taken:
            n += 1
            candidate = f"{base}_{n}"
        taken.add(candidate)
        out.append(candidate)
    return out


# --- Arrow back to Delta (columns the caller's Delta schema does not give) -----------------------


def delta_type_of(t: pa.DataType) -> DeltaType:
    """The Delta type an Arrow type of a batch stands for (the inverse of core's mapping; a struct
    shaped as core's variant is a struct here: only the Delta schema tells a variant apart)."""
    primitive = _DELTA_OF_ARROW.get(t)
    if primitive is not None:
        return PrimitiveType(name=primitive)
    if pa.types.is_timestamp(t):
        return PrimitiveType(name="timestamp" if t.tz is not None else "timestamp_ntz")
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return PrimitiveType(name="string")
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return PrimitiveType(name="binary")
    if pa.types.is_date(t):
        return PrimitiveType(name="date")
    if pa.types.is_decimal(t):
        return DecimalType(precision=t.precision, scale=t.scale)
    if pa.types.is_map(t):
        return MapType(
            key_type=delta_type_of(t.key_type),
            value_type=delta_type_of(t.item_type),
            value_contains_null=t.item_field.nullable,
        )
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return ArrayType(element_type=delta_type_of(t.value_type), contains_null=t.value_field.nullable)
    if pa.types.is_struct(t):
        return StructType(fields=tuple(_delta_field(t.field(i)) for i in range(t.num_fields)))
    raise TypeError(f"no Delta type for the Arrow type {t}")


_DELTA_OF_ARROW: dict[pa.DataType, str] = {
    pa.bool_(): "boolean",
    pa.int8(): "byte",
    pa.int16(): "short",
    pa.int32(): "integer",
    pa.int64(): "long",
    pa.float32(): "float",
    pa.float64(): "double",
    pa.null(): "void",
}


def _delta_field(f: pa.Field) -> StructField:
    return StructField(name=f.name, type=delta_type_of(f.type), nullable=f.nullable)


def column_types(
    fields: Mapping[str, pa.Field], columns: Sequence[str], table_schema: StructType | None
) -> list[StructField]:
    """The Delta field of each column: the Delta schema's where its Arrow type is the batch's (a row
    transform may have replaced a column, e.g. by its HMAC text), else read back from Arrow."""
    delta = {f.name: f for f in table_schema.fields} if table_schema is not None else {}
    out = []
    for name in columns:
        arrow = fields[name]
        known = delta.get(name)
        if known is not None and _same_arrow(to_arrow_type(known.type), arrow.type):
            out.append(known)
        else:
            out.append(StructField(name=name, type=delta_type_of(arrow.type), nullable=arrow.nullable))
    return out


def _same_arrow(a: pa.DataType, b: pa.DataType) -> bool:
    """Arrow types equal but for nested fields' nullability and names (the change feed's may differ)."""
    if a == b:
        return True
    try:
        return delta_type_of(a) == delta_type_of(b)
    except TypeError:
        return False


# --- schemas ----------------------------------------------------------------------------------


class _Names:
    """Record names of one schema: unique (Avro resolves a name once per schema)."""

    def __init__(self) -> None:
        self.taken: set[str] = set()

    def new(self, name: str) -> str:
        candidate, n = name, 1
        while candidate in self.taken:
            n += 1
            candidate = f"{name}_{n}"
        self.taken.add(candidate)
        return candidate


def avro_type(t: DeltaType, nullable: bool, path: str, names: _Names) -> Any:
    """The Avro schema of Delta type ``t`` (a union with null when ``nullable``); ``path`` names
    the records it makes."""
    inner = _avro_type(t, path, names)
    if not nullable or inner == "null":
        return inner
    return ["null", inner]


def _avro_type(t: DeltaType, path: str, names: _Names) -> Any:
    if isinstance(t, PrimitiveType):
        if t.name == "variant":
            return {
                "type": "record",
                "name": names.new(path),
                DELTA_TYPE: "variant",
                "fields": [{"name": "value", "type": "bytes"}, {"name": "metadata", "type": "bytes"}],
            }
        found = _INT_PRIMITIVES.get(t.name)
        if found is None:
            raise TypeError(f"no Avro type for the Delta type {t.name!r}")
        return dict(found) if isinstance(found, dict) else found
    if isinstance(t, DecimalType):
        return {"type": "bytes", "logicalType": "decimal", "precision": t.precision, "scale": t.scale}
    if isinstance(t, ArrayType):
        return {
            "type": "array",
            "items": avro_type(t.element_type, t.contains_null, f"{path}_element", names),
        }
    if isinstance(t, MapType):
        value = avro_type(t.value_type, t.value_contains_null, f"{path}_value", names)
        if isinstance(t.key_type, PrimitiveType) and t.key_type.name == "string":
            return {"type": "map", "values": value}
        entry = {
            "type": "record",
            "name": names.new(f"{path}_entry"),
            "fields": [
                {"name": "key", "type": avro_type(t.key_type, False, f"{path}_key", names)},
                {"name": "value", "type": value},
            ],
        }
        return {"type": "array", "items": entry, MAP_ENTRIES: True}
    if isinstance(t, StructType):
        return record_schema(names.new(path), t.fields, names, path)
    raise TypeError(f"not a Delta data type: {t!r}")


def record_schema(
    name: str,
    fields: Sequence[StructField],
    names: _Names,
    path: str | None = None,
    namespace: str | None = None,
) -> dict[str, Any]:
    """A record of ``fields`` named ``name``; nested records are named ``<path>_<field>``."""
    out: list[dict[str, Any]] = []
    for f, avro in zip(fields, field_names([f.name for f in fields]), strict=True):
        t = avro_type(f.type, f.nullable, f"{path or name}_{avro}", names)
        entry: dict[str, Any] = {"name": avro, "type": t}
        if isinstance(t, list):
            entry["default"] = None
        if avro != f.name:
            entry[ORIGINAL_NAME] = f.name
        out.append(entry)
    record: dict[str, Any] = {"type": "record", "name": name}
    if namespace:
        record["namespace"] = namespace
    record["fields"] = out
    return record


def _source_schema() -> dict[str, Any]:
    """Debezium's ``source`` block, deltamirror's fields (``delta_version``, ``table_id``, ``index``)."""
    return {
        "type": "record",
        "name": "Source",
        "namespace": "io.deltamirror.connector",
        "fields": [
            {"name": "version", "type": "string"},
            {"name": "connector", "type": "string"},
            {"name": "name", "type": "string"},
            {"name": "ts_ms", "type": "long"},
            {"name": "snapshot", "type": ["null", "string"], "default": None},
            {"name": "db", "type": "string"},
            {"name": "table", "type": ["null", "string"], "default": None},
            {"name": "table_id", "type": "string"},
            {"name": "delta_version", "type": "long"},
            {"name": "index", "type": "long"},
        ],
    }


def _transaction_schema() -> Any:
    """Debezium's ``transaction`` block (``event.block``)."""
    return [
        "null",
        {
            "type": "record",
            "name": "block",
            "namespace": "event",
            "fields": [
                {"name": "id", "type": "string"},
                {"name": "total_order", "type": "long"},
                {"name": "data_collection_order", "type": "long"},
            ],
        },
    ]


def envelope_schema(topic: str, fields: Sequence[StructField]) -> dict[str, Any]:
    """The value schema of a changes topic: ``<namespace>.Envelope`` with ``before`` / ``after`` of
    ``<namespace>.Value``, Debezium's ``source``, ``op``, ``ts_ms`` and ``transaction``."""
    namespace = avro_namespace(topic)
    names = _Names()
    names.taken.update({"Envelope", "Value"})
    value = record_schema("Value", fields, names, "Value")
    return {
        "type": "record",
        "name": "Envelope",
        "namespace": namespace,
        "connect.name": f"{namespace}.Envelope",
        "fields": [
            {"name": "before", "type": ["null", value], "default": None},
            {"name": "after", "type": ["null", "Value"], "default": None},
            {"name": "source", "type": _source_schema()},
            {"name": "op", "type": "string"},
            {"name": "ts_ms", "type": ["null", "long"], "default": None},
            {"name": "transaction", "type": _transaction_schema(), "default": None},
        ],
    }


def value_schema(topic: str, fields: Sequence[StructField]) -> dict[str, Any]:
    """The ``Value`` record alone (a row image's schema), with the names :func:`envelope_schema` gives."""
    names = _Names()
    names.taken.update({"Envelope", "Value"})
    return record_schema("Value", fields, names, "Value", namespace=avro_namespace(topic))


def key_schema(topic: str, fields: Sequence[StructField]) -> dict[str, Any]:
    """The key schema: ``<namespace>.Key``, a record of the key columns."""
    names = _Names()
    names.taken.add("Key")
    return record_schema("Key", fields, names, "Key", namespace=avro_namespace(topic))


# --- values -----------------------------------------------------------------------------------

_EPOCH_DAYS = 719163  # date(1970, 1, 1).toordinal()
_UTC_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_NAIVE_EPOCH = datetime.datetime(1970, 1, 1)
_MICRO = datetime.timedelta(microseconds=1)


def _converter(t: DeltaType) -> Callable[[Any], Any] | None:
    """How one Python value (from ``to_pylist``) of Delta type ``t`` becomes Avro-ready; None: as it is."""
    if isinstance(t, PrimitiveType):
        if t.name == "timestamp":
            return lambda v: None if v is None else (v - _UTC_EPOCH) // _MICRO
        if t.name == "timestamp_ntz":
            return lambda v: None if v is None else (v - _NAIVE_EPOCH) // _MICRO
        if t.name == "date":
            return lambda v: None if v is None else v.toordinal() - _EPOCH_DAYS
        return None  # booleans, numbers, strings, bytes, variant's {value, metadata}: as they are
    if isinstance(t, DecimalType):
        return None  # a Decimal of the column's scale: fastavro writes its unscaled bytes
    if isinstance(t, ArrayType):
        item = _converter(t.element_type)
        return None if item is None else (lambda v: None if v is None else [item(x) for x in v])
    if isinstance(t, MapType):
        k = _converter(t.key_type) or _same
        w = _converter(t.value_type) or _same
        if isinstance(t.key_type, PrimitiveType) and t.key_type.name == "string":
            return lambda v: None if v is None else {kk: w(vv) for kk, vv in v}
        return lambda v: None if v is None else [{"key": k(kk), "value": w(vv)} for kk, vv in v]
    if isinstance(t, StructType):
        names = [f.name for f in t.fields]
        avro = field_names(names)
        convs = [_converter(f.type) for f in t.fields]
        if avro == names and all(c is None for c in convs):
            return None
        fields = list(zip(names, avro, convs, strict=True))
        return lambda v: None if v is None else {a: (c(v[n]) if c else v[n]) for n, a, c in fields}
    return None


def _same(v: Any) -> Any:
    return v


def column_converter(t: DeltaType) -> Callable[[pa.Array], list[Any]]:
    """A column of Delta type ``t`` (as Arrow) to its Avro-ready Python values, one per row."""
    if isinstance(t, PrimitiveType) and t.name in ("timestamp", "timestamp_ntz"):

        def micros(column: pa.Array) -> list[Any]:
            unit = column.type.unit if pa.types.is_timestamp(column.type) else "us"
            if unit != "us":
                column = pc.cast(column, pa.timestamp("us", column.type.tz), safe=False)
            out: list[Any] = column.cast(pa.int64()).to_pylist()
            return out

        return micros
    if isinstance(t, PrimitiveType) and t.name == "date":
        return lambda column: column.cast(pa.int32()).to_pylist()
    convert = _converter(t)
    if convert is None:
        return lambda column: column.to_pylist()
    return lambda column: [convert(v) for v in column.to_pylist()]


__all__ = [
    "DELTA_TYPE",
    "MAP_ENTRIES",
    "ORIGINAL_NAME",
    "VARIANT_ARROW",
    "avro_name",
    "avro_namespace",
    "avro_type",
    "column_converter",
    "column_types",
    "delta_type_of",
    "envelope_schema",
    "field_names",
    "key_schema",
    "record_schema",
    "value_schema",
]
