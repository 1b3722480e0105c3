"""Delta types as Protobuf: the message types of the ``protobuf`` row-change format and its values
(docs/protobuf.md).

A table's Delta schema (each column's Delta type, from the version's ``metaData`` when the caller
knows it, else read back from the batch's Arrow type, as for Avro) becomes a proto3
``FileDescriptorProto`` built at runtime: ``Envelope`` (Debezium's), ``Value`` (a row), ``Source``,
``Block`` in the value's file, ``Key`` in the key's; each struct a message of its own named by its
path (``Value_address``, ``Value_address_geo``), as the Avro records are.

==================  ==================================================================================
Delta               Protobuf
==================  ==================================================================================
boolean             ``bool``
byte, short,        ``int32`` (Protobuf has no smaller integer)
integer
long                ``int64``
float, double       ``float``, ``double`` (NaN and infinities as they are)
decimal(p,s)        ``confluent.type.Decimal`` (big-endian two's-complement unscaled ``value``,
                    ``precision``, ``scale``): Confluent's own decimal message
string, binary      ``string``, ``bytes``
date                ``google.type.Date`` (year, month, day)
timestamp           ``google.protobuf.Timestamp`` (seconds and nanos since the epoch, UTC)
timestamp_ntz       ``google.type.DateTime`` without ``time_offset`` (a local date-time, no zone)
struct              a message named by its path
array               ``repeated`` of the element type; nullable elements (``containsNull``), and
                    arrays or maps as elements, in a message ``<path>_element {value = 1}``
map, keys string,   ``map<K, V>``; nullable values (``valueContainsNull``), and arrays or maps as
boolean, integral   values, in a message ``<path>_value {value = 1}``
map, other keys     ``repeated <path>_entry {key = 1; value = 2}`` (Protobuf map keys are integral or
                    string only), order kept
variant             ``confluent.type.Variant`` (``metadata``, ``value``: the Variant binary encoding as
                    Delta stores it)
void                ``google.protobuf.Empty`` (never set)
nullable scalar     proto3 ``optional`` (explicit presence: ``HasField``)
nullable message    as it is (a message field has presence)
nullable array/map  in a message ``<path>_array {values = 1}`` / ``<path>_map {entries = 1}``: a
                    ``repeated`` or ``map`` field has no presence, an absent one reads as empty
==================  ==================================================================================

Field numbers: a column's ``delta.columnMapping.id`` when every sibling has one (stable under
renames and drops), else its position (1-based; without column mapping columns can only be added
at the end). Names: as for Avro (:func:`~.avro_types.field_names`); every field's ``json_name`` is
the Delta name, so ``json_format.MessageToDict`` gives the Delta names.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Callable, Sequence
from decimal import MAX_EMAX, MAX_PREC, MIN_EMIN, Context, Decimal
from typing import Any

import pyarrow as pa
from google.protobuf import descriptor_pb2, duration_pb2, empty_pb2, timestamp_pb2
from google.type import date_pb2, datetime_pb2

from deltamirror.core.compute import pc
from deltamirror.core.schema import (
    ArrayType,
    DecimalType,
    DeltaType,
    MapType,
    PrimitiveType,
    StructField,
    StructType,
    field_id,
)

from .avro_types import avro_namespace, field_names

_F = descriptor_pb2.FieldDescriptorProto

#: the files the generated ones import, with where their descriptors come from
WELL_KNOWN_FILES = (timestamp_pb2, duration_pb2, empty_pb2, date_pb2, datetime_pb2)
CONFLUENT_DECIMAL = ".confluent.type.Decimal"
CONFLUENT_VARIANT = ".confluent.type.Variant"

_SCALARS: dict[str, int] = {
    "boolean": _F.TYPE_BOOL,
    "byte": _F.TYPE_INT32,
    "short": _F.TYPE_INT32,
    "integer": _F.TYPE_INT32,
    "long": _F.TYPE_INT64,
    "float": _F.TYPE_FLOAT,
    "double": _F.TYPE_DOUBLE,
    "string": _F.TYPE_STRING,
    "binary": _F.TYPE_BYTES,
}
#: Delta types carried as a message of a well-known file: (type name, file)
_MESSAGES: dict[str, tuple[str, str]] = {
    "date": (".google.type.Date", "google/type/date.proto"),
    "timestamp": (".google.protobuf.Timestamp", "google/protobuf/timestamp.proto"),
    "timestamp_ntz": (".google.type.DateTime", "google/type/datetime.proto"),
    "variant": (CONFLUENT_VARIANT, "confluent/type/variant.proto"),
    "void": (".google.protobuf.Empty", "google/protobuf/empty.proto"),
}
#: the key types a Protobuf map takes (integral, bool, string)
_MAP_KEYS = frozenset({"boolean", "byte", "short", "integer", "long", "string"})
_MAX_FIELD_NUMBER = 536_870_911
_RESERVED_NUMBERS = range(19_000, 20_000)
_CAMEL = re.compile(r"_([a-z0-9])")


class _File:
    """One generated file: its message types (top level, unique names), its imports."""

    def __init__(self, name: str, package: str, native_maps: bool = True) -> None:
        self.proto = descriptor_pb2.FileDescriptorProto(name=name, package=package, syntax="proto3")
        self.taken: set[str] = set()
        #: maps as ``map<K, V>`` (else their entries as a plain repeated message, sorted by key)
        self.native_maps = native_maps

    def message(self, name: str) -> descriptor_pb2.DescriptorProto:
        candidate, n = name, 1
        while candidate in self.taken:
            n += 1
            candidate = f"{name}_{n}"
        self.taken.add(candidate)
        return self.proto.message_type.add(name=candidate)

    def type_name(self, message: descriptor_pb2.DescriptorProto) -> str:
        return f".{self.proto.package}.{message.name}"

    def depend(self, path: str) -> None:
        if path not in self.proto.dependency:
            self.proto.dependency.append(path)


def field_numbers(fields: Sequence[StructField]) -> list[int]:
    """Each field's number: its column mapping id when every sibling has a usable one, else its position."""
    ids = [field_id(f) for f in fields]
    usable = [i for i in ids if i is not None and 0 < i <= _MAX_FIELD_NUMBER and i not in _RESERVED_NUMBERS]
    if len(usable) == len(fields) and len(set(usable)) == len(usable):
        return usable
    return list(range(1, len(fields) + 1))


def add_fields(
    file: _File,
    message: descriptor_pb2.DescriptorProto,
    fields: Sequence[StructField],
    path: str,
    numbers: Sequence[int] | None = None,
) -> None:
    """``fields`` as the fields of ``message``; the messages they need are named ``<path>_<field>``."""
    numbers = list(numbers) if numbers is not None else field_numbers(fields)
    for f, name, number in zip(fields, field_names([f.name for f in fields]), numbers, strict=True):
        add_field(file, message, name, number, f.type, f.nullable, f"{path}_{name}", json_name=f.name)


def add_field(
    file: _File,
    message: descriptor_pb2.DescriptorProto,
    name: str,
    number: int,
    t: DeltaType,
    nullable: bool,
    path: str,
    json_name: str | None = None,
) -> None:
    """One field of Delta type ``t`` (see the module's table)."""
    field = message.field.add(name=name, number=number, json_name=json_name or name)
    field.label = _F.LABEL_OPTIONAL
    if isinstance(t, PrimitiveType) and t.name in _SCALARS:
        field.type = _SCALARS[t.name]
        if nullable:
            field.proto3_optional = True
            field.oneof_index = len(message.oneof_decl)
            message.oneof_decl.add(name=_synthetic_oneof(message, name))
        return
    if isinstance(t, ArrayType | MapType) and nullable:
        wrapper = file.message(f"{path}_{'array' if isinstance(t, ArrayType) else 'map'}")
        inner = "values" if isinstance(t, ArrayType) else "entries"
        add_field(file, wrapper, inner, 1, t, False, path)
        field.type = _F.TYPE_MESSAGE
        field.type_name = file.type_name(wrapper)
        return
    if isinstance(t, ArrayType):
        field.label = _F.LABEL_REPEATED
        if t.contains_null or isinstance(t.element_type, ArrayType | MapType):
            element = file.message(f"{path}_element")
            add_field(file, element, "value", 1, t.element_type, t.contains_null, f"{path}_element")
            field.type = _F.TYPE_MESSAGE
            field.type_name = file.type_name(element)
        else:
            _set_single(file, field, t.element_type, f"{path}_element")
        return
    if isinstance(t, MapType):
        field.label = _F.LABEL_REPEATED
        field.type = _F.TYPE_MESSAGE
        key = t.key_type
        if isinstance(key, PrimitiveType) and key.name in _MAP_KEYS:
            entry = message.nested_type.add(name=_entry_name(message, name))
            entry.options.map_entry = file.native_maps
            entry.field.add(
                name="key", number=1, json_name="key", label=_F.LABEL_OPTIONAL, type=_SCALARS[key.name]
            )
            value_field = entry.field.add(name="value", number=2, json_name="value", label=_F.LABEL_OPTIONAL)
            if t.value_contains_null or isinstance(t.value_type, ArrayType | MapType):
                wrapper = file.message(f"{path}_value")
                add_field(file, wrapper, "value", 1, t.value_type, t.value_contains_null, f"{path}_value")
                value_field.type = _F.TYPE_MESSAGE
                value_field.type_name = file.type_name(wrapper)
            else:
                _set_single(file, value_field, t.value_type, f"{path}_value")
            field.type_name = f"{file.type_name(message)}.{entry.name}"
        else:
            entry = file.message(f"{path}_entry")
            add_field(file, entry, "key", 1, key, False, f"{path}_key")
            add_field(file, entry, "value", 2, t.value_type, t.value_contains_null, f"{path}_value")
            field.type_name = file.type_name(entry)
        return
    _set_single(file, field, t, path)


def _set_single(file: _File, field: descriptor_pb2.FieldDescriptorProto, t: DeltaType, path: str) -> None:
    """A field holding one value of a type that is neither an array nor a map nor a nullable scalar."""
    if isinstance(t, PrimitiveType):
        scalar = _SCALARS.get(t.name)
        if scalar is not None:
            field.type = scalar
            return
        found = _MESSAGES.get(t.name)
        if found is None:
            raise TypeError(f"no Protobuf type for the Delta type {t.name!r}")
        field.type = _F.TYPE_MESSAGE
        field.type_name = found[0]
        file.depend(found[1])
        return
    field.type = _F.TYPE_MESSAGE
    if isinstance(t, DecimalType):
        field.type_name = CONFLUENT_DECIMAL
        file.depend("confluent/type/decimal.proto")
        return
    if isinstance(t, ArrayType | MapType):  # an element or a value that is one: always wrapped
        raise TypeError(f"an array or map here must be wrapped: {t!r}")
    nested = file.message(path)
    add_fields(file, nested, t.fields, path)
    field.type_name = file.type_name(nested)


def _synthetic_oneof(message: descriptor_pb2.DescriptorProto, name: str) -> str:
    """protoc's name of a proto3 ``optional`` field's oneof: ``_<name>``, made unique."""
    taken = {o.name for o in message.oneof_decl} | {f.name for f in message.field}
    candidate = f"_{name}"
    while candidate in taken:
        candidate = f"X{candidate}"
    return candidate


def _entry_name(message: descriptor_pb2.DescriptorProto, name: str) -> str:
    """protoc's name of a map field's entry type: the field's name in CamelCase and ``Entry``."""
    camel = _CAMEL.sub(lambda m: m.group(1).upper(), name)
    base = (camel[:1].upper() + camel[1:]).lstrip("_") or "Map"
    taken = {n.name for n in message.nested_type}
    candidate, n = f"{base}Entry", 1
    while candidate in taken:
        n += 1
        candidate = f"{base}{n}Entry"
    return candidate


# --- the files ----------------------------------------------------------------------------------


def proto_package(topic: str) -> str:
    """A topic name as a Protobuf package (each dot-separated part an identifier, as Avro's namespace)."""
    return avro_namespace(topic)


def _source(file: _File) -> descriptor_pb2.DescriptorProto:
    """Debezium's ``source`` block with deltamirror's fields (``table_id``, ``delta_version``, ``index``)."""
    source = file.message("Source")
    string, long = PrimitiveType(name="string"), PrimitiveType(name="long")
    for number, (name, t, nullable) in enumerate(
        [
            ("version", string, False),
            ("connector", string, False),
            ("name", string, False),
            ("ts_ms", long, False),
            ("snapshot", string, True),
            ("db", string, False),
            ("table", string, True),
            ("table_id", string, False),
            ("delta_version", long, False),
            ("index", long, False),
        ],
        start=1,
    ):
        add_field(file, source, name, number, t, nullable, f"Source_{name}")
    return source


def envelope_file(
    topic: str, fields: Sequence[StructField], numbers: Sequence[int]
) -> descriptor_pb2.FileDescriptorProto:
    """The value's file: ``Envelope`` first (message index 0), then ``Value``, ``Source``, ``Block``
    and the messages of the row's structs, arrays and maps."""
    package = proto_package(topic)
    file = _File(f"{package.replace('.', '/')}/envelope.proto", package)
    envelope, value = file.message("Envelope"), file.message("Value")
    source, block = _source(file), file.message("Block")
    string, long = PrimitiveType(name="string"), PrimitiveType(name="long")
    for number, name in enumerate(("id", "total_order", "data_collection_order"), start=1):
        add_field(file, block, name, number, string if name == "id" else long, False, f"Block_{name}")
    for number, (name, message) in enumerate(
        [("before", value), ("after", value), ("source", source)], start=1
    ):
        envelope.field.add(
            name=name,
            number=number,
            json_name=name,
            label=_F.LABEL_OPTIONAL,
            type=_F.TYPE_MESSAGE,
            type_name=file.type_name(message),
        )
    add_field(file, envelope, "op", 4, string, False, "Envelope_op")
    add_field(file, envelope, "ts_ms", 5, long, True, "Envelope_ts_ms")
    envelope.field.add(
        name="transaction",
        number=6,
        json_name="transaction",
        label=_F.LABEL_OPTIONAL,
        type=_F.TYPE_MESSAGE,
        type_name=file.type_name(block),
    )
    add_fields(file, value, fields, "Value", numbers)
    return file.proto


def key_file(
    topic: str, fields: Sequence[StructField], numbers: Sequence[int]
) -> descriptor_pb2.FileDescriptorProto:
    """The key's file: ``Key`` (the key columns, numbered as in ``Value``) and its messages."""
    package = proto_package(topic)
    file = _File(f"{package.replace('.', '/')}/key.proto", package, native_maps=False)
    key = file.message("Key")
    add_fields(file, key, fields, "Key", numbers)
    return file.proto


# --- values -------------------------------------------------------------------------------------
# A value becomes what a message class's constructor takes: scalars as they are, a message as a
# dict of its fields, a repeated field as a list, a map field as a dict; None leaves a field unset.

_UTC_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
#: no rounding: a decimal(38, s) has up to 38 digits, the default context keeps 28
_EXACT = Context(prec=MAX_PREC, Emax=MAX_EMAX, Emin=MIN_EMIN)
_MICRO = datetime.timedelta(microseconds=1)


def _decimal(v: Decimal, scale: int) -> dict[str, Any]:
    """``confluent.type.Decimal`` as confluent-kafka's ``decimal_to_protobuf`` writes it (precision:
    the unscaled value's digits)."""
    unscaled = int(v.scaleb(scale, _EXACT))
    size = (unscaled + (unscaled < 0)).bit_length() // 8 + 1
    digits = len(str(abs(unscaled))) if unscaled else 1
    return {"value": unscaled.to_bytes(size, "big", signed=True), "precision": digits, "scale": scale}


def _micros_to_timestamp(us: int) -> dict[str, int]:
    return {"seconds": us // 1_000_000, "nanos": (us % 1_000_000) * 1000}


def _local(v: datetime.datetime) -> dict[str, int]:
    return {
        "year": v.year,
        "month": v.month,
        "day": v.day,
        "hours": v.hour,
        "minutes": v.minute,
        "seconds": v.second,
        "nanos": v.microsecond * 1000,
    }


def _same(v: Any) -> Any:
    return v


def _is_leaf(t: DeltaType) -> bool:
    """A type whose value is one field's value as it is (a scalar or a well-known message)."""
    return isinstance(t, PrimitiveType | DecimalType)


# Two steps: the value of a column as Arrow holds it becomes a neutral Python value (leaves
# converted: timestamps, dates, decimals as their messages' dicts; structs as dicts by Delta name,
# arrays as lists, maps as lists of pairs), from the Arrow type alone (what ``column_values`` is
# given); then the row's message shapes it by the Delta type and nullability of its field (the
# wrappers of nullable elements, values, arrays and maps; proto names), which the schema says.


def neutral_converter(t: DeltaType) -> Callable[[Any], Any] | None:
    """How one non-null Python value (from ``to_pylist``) of Delta type ``t`` becomes neutral; None:
    as it is."""
    if isinstance(t, PrimitiveType):
        if t.name == "timestamp":
            return lambda v: _micros_to_timestamp((v - _UTC_EPOCH) // _MICRO)
        if t.name == "timestamp_ntz":
            return _local
        if t.name == "date":
            return lambda v: {"year": v.year, "month": v.month, "day": v.day}
        return None  # booleans, numbers, strings, bytes, variant's {value, metadata}
    if isinstance(t, DecimalType):
        scale = t.scale
        return lambda v: _decimal(v, scale)
    if isinstance(t, ArrayType):
        item = neutral_converter(t.element_type)
        return None if item is None else (lambda v: [None if x is None else item(x) for x in v])
    if isinstance(t, MapType):
        k = neutral_converter(t.key_type) or _same
        w = neutral_converter(t.value_type) or _same
        return lambda v: [(k(kk), None if vv is None else w(vv)) for kk, vv in v]
    fields = [(f.name, neutral_converter(f.type)) for f in t.fields]
    if all(c is None for _, c in fields):
        return None
    return lambda v: {n: (v[n] if c is None or v[n] is None else c(v[n])) for n, c in fields}


def column_converter(t: DeltaType) -> Callable[[pa.Array], list[Any]]:
    """A column of Delta type ``t`` (as Arrow) to its neutral values, one per row."""
    if isinstance(t, PrimitiveType) and t.name == "timestamp":

        def timestamps(column: pa.Array) -> list[Any]:
            if pa.types.is_timestamp(column.type) and column.type.unit != "us":
                column = pc.cast(column, pa.timestamp("us", column.type.tz), safe=False)
            micros = column.cast(pa.int64()).to_pylist()
            return [None if us is None else _micros_to_timestamp(us) for us in micros]

        return timestamps
    if isinstance(t, PrimitiveType) and t.name == "timestamp_ntz":

        def local_times(column: pa.Array) -> list[Any]:
            if pa.types.is_timestamp(column.type) and column.type.unit != "us":
                column = pc.cast(column, pa.timestamp("us"), safe=False)
            return [None if v is None else _local(v) for v in column.to_pylist()]

        return local_times
    convert = neutral_converter(t)
    if convert is None:
        return lambda column: column.to_pylist()
    return lambda column: [None if v is None else convert(v) for v in column.to_pylist()]


def shaper(t: DeltaType, nullable: bool, native_maps: bool = True) -> Callable[[Any], Any] | None:
    """How a neutral non-null value of a field of Delta type ``t`` becomes what the message
    constructor takes (a message as a dict, a repeated field as a list, a map field as a dict, or
    without ``native_maps`` as its entries sorted by key; None inside leaves a field unset); None:
    as it is."""
    inner = _shape(t, native_maps)
    if isinstance(t, ArrayType) and nullable:
        return lambda v: {"values": inner(v) if inner else v}
    if isinstance(t, MapType) and nullable:
        return lambda v: {"entries": inner(v) if inner else v}
    return inner


def _wrap(t: DeltaType, nullable: bool, native_maps: bool) -> Callable[[Any], Any]:
    """A value inside its one-field wrapper message (``{value = 1}``); null: the wrapper, empty."""
    s = shaper(t, nullable, native_maps) or _same
    return lambda x: {} if x is None else {"value": s(x)}


def _shape(t: DeltaType, native_maps: bool) -> Callable[[Any], Any] | None:
    if _is_leaf(t):
        return None
    if isinstance(t, ArrayType):
        if t.contains_null or isinstance(t.element_type, ArrayType | MapType):
            element = _wrap(t.element_type, t.contains_null, native_maps)
            return lambda v: [element(x) for x in v]
        item = _shape(t.element_type, native_maps)
        return None if item is None else (lambda v: [item(x) for x in v])
    if isinstance(t, MapType):
        native = isinstance(t.key_type, PrimitiveType) and t.key_type.name in _MAP_KEYS
        if native:
            if t.value_contains_null or isinstance(t.value_type, ArrayType | MapType):
                value = _wrap(t.value_type, t.value_contains_null, native_maps)
            else:
                value = _shape(t.value_type, native_maps) or _same
            if native_maps:
                return lambda v: {k: value(x) for k, x in v}
            # the entries in the order a deterministic serialization writes a map's: by key
            return lambda v: [{"key": k, "value": value(x)} for k, x in sorted(v, key=_first)]
        key = _shape(t.key_type, native_maps) or _same
        entry_value = shaper(t.value_type, t.value_contains_null, native_maps) or _same
        return lambda v: [{"key": key(k), "value": None if x is None else entry_value(x)} for k, x in v]
    assert isinstance(t, StructType)
    names = [f.name for f in t.fields]
    fields = [
        (n, p, shaper(f.type, f.nullable, native_maps) or _same)
        for n, p, f in zip(names, field_names(names), t.fields, strict=True)
    ]
    return lambda v: {p: s(v[n]) for n, p, s in fields if v[n] is not None}


def _first(pair: tuple[Any, Any]) -> Any:
    return pair[0]


__all__ = [
    "CONFLUENT_DECIMAL",
    "CONFLUENT_VARIANT",
    "WELL_KNOWN_FILES",
    "add_field",
    "add_fields",
    "column_converter",
    "envelope_file",
    "field_numbers",
    "key_file",
    "neutral_converter",
    "proto_package",
    "shaper",
]
