"""Protobuf messages of the ``protobuf`` row-change format back as the Python values Arrow gives
(``to_pylist``), read by the Delta schema: what a consumer does with the table in docs/protobuf.md."""

from __future__ import annotations

import datetime
from decimal import MAX_EMAX, MAX_PREC, MIN_EMIN, Context, Decimal
from typing import Any

from deltamirror.core.schema import ArrayType, DecimalType, DeltaType, MapType, PrimitiveType, StructType
from deltamirror.mirror.records.avro_types import field_names

_SCALARS = {"boolean", "byte", "short", "integer", "long", "float", "double", "string", "binary"}
_MAP_KEYS = {"boolean", "byte", "short", "integer", "long", "string"}
UTC = datetime.UTC
_EXACT = Context(prec=MAX_PREC, Emax=MAX_EMAX, Emin=MIN_EMIN)


def row(message: Any, schema: StructType) -> dict[str, Any]:
    """A ``Value`` (or ``Key``) message as a dict by Delta name."""
    names = [f.name for f in schema.fields]
    return {
        f.name: field(message, p, f.type, f.nullable)
        for f, p in zip(schema.fields, field_names(names), strict=True)
    }


def field(message: Any, name: str, t: DeltaType, nullable: bool) -> Any:
    if isinstance(t, ArrayType | MapType):
        if nullable:
            if not message.HasField(name):
                return None
            return _many(
                getattr(getattr(message, name), "values" if isinstance(t, ArrayType) else "entries"), t
            )
        return _many(getattr(message, name), t)
    if isinstance(t, PrimitiveType) and t.name in _SCALARS:
        if nullable and not message.HasField(name):
            return None
        return getattr(message, name)
    if not message.HasField(name):
        return None
    return _single(getattr(message, name), t)


def _one(value: Any, t: DeltaType) -> Any:
    """An element or map value that is not wrapped (neither nullable nor an array or map)."""
    return value if isinstance(t, PrimitiveType) and t.name in _SCALARS else _single(value, t)


def _many(container: Any, t: ArrayType | MapType) -> list[Any]:
    if isinstance(t, ArrayType):
        if t.contains_null or isinstance(t.element_type, ArrayType | MapType):
            return [field(e, "value", t.element_type, t.contains_null) for e in container]
        return [_one(e, t.element_type) for e in container]
    wrapped = t.value_contains_null or isinstance(t.value_type, ArrayType | MapType)
    if isinstance(t.key_type, PrimitiveType) and t.key_type.name in _MAP_KEYS:
        pairs = [
            (k, field(v, "value", t.value_type, t.value_contains_null) if wrapped else _one(v, t.value_type))
            for k, v in container.items()
        ]
        return sorted(pairs, key=lambda kv: kv[0])  # a map's order is not kept: compare sorted
    return [
        (field(e, "key", t.key_type, False), field(e, "value", t.value_type, t.value_contains_null))
        for e in container
    ]


def _single(m: Any, t: DeltaType) -> Any:
    if isinstance(t, DecimalType):
        unscaled = int.from_bytes(m.value, "big", signed=True)
        return Decimal(unscaled).scaleb(-m.scale, _EXACT)
    if isinstance(t, StructType):
        return row(m, t)
    assert isinstance(t, PrimitiveType), t
    if t.name == "timestamp":
        return datetime.datetime(1970, 1, 1, tzinfo=UTC) + datetime.timedelta(
            seconds=m.seconds, microseconds=m.nanos // 1000
        )
    if t.name == "timestamp_ntz":
        return datetime.datetime(m.year, m.month, m.day, m.hours, m.minutes, m.seconds, m.nanos // 1000)
    if t.name == "date":
        return datetime.date(m.year, m.month, m.day)
    if t.name == "variant":
        return {"value": m.value, "metadata": m.metadata}
    if t.name == "void":
        return None
    raise TypeError(t)


def arrow_row(value: Any, t: DeltaType) -> Any:
    """A value as Arrow's ``to_pylist`` gives it, maps with string/integral keys sorted (the
    comparison form of :func:`row`)."""
    if value is None:
        return None
    if isinstance(t, StructType):
        return {f.name: arrow_row(value[f.name], f.type) for f in t.fields}
    if isinstance(t, ArrayType):
        return [arrow_row(x, t.element_type) for x in value]
    if isinstance(t, MapType):
        pairs = [(arrow_row(k, t.key_type), arrow_row(v, t.value_type)) for k, v in value]
        native = isinstance(t.key_type, PrimitiveType) and t.key_type.name in _MAP_KEYS
        return sorted(pairs, key=lambda kv: kv[0]) if native else pairs
    if isinstance(t, PrimitiveType) and t.name == "void":
        return None
    return value
