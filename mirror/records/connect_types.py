"""Arrow values and types as Kafka Connect's JSON sees them: the payload and the inline schema.

:mod:`.row_changes` states the mapping; this module is its code. Values are converted per column on
the Arrow side where Arrow can (timestamps to int64 microseconds, dates to int32 days), then one
``to_pylist`` per column; only binary, decimal, float and nested values take a Python step each.
The values JSON has no one form for (floats that are not finite, decimals) are written as the
format says (:class:`LeafValues`: each format class of :mod:`.row_formats`).
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from decimal import Decimal
from typing import Any, Protocol

import pyarrow as pa

from deltamirror.core.compute import pc

# --- values: Arrow columns to JSON-ready Python values ------------------------------------------


class LeafValues(Protocol):
    """How a format writes the values JSON has no one form for."""

    @staticmethod
    def float_value(value: float | None) -> Any:
        """A float (None: null) as the format carries it, infinities and NaN included."""
        ...

    @staticmethod
    def decimal_value(value: Decimal, scale: int) -> Any:
        """A decimal of a column with ``scale`` as the format carries it."""
        ...


def connect_decimal(value: Decimal, scale: int) -> str:
    """A Connect decimal as JsonConverter writes it: the base64 of its unscaled two's-complement bytes."""
    unscaled = int(value.scaleb(scale))
    size = max(1, (unscaled.bit_length() + 8) // 8)
    return base64.b64encode(unscaled.to_bytes(size, "big", signed=True)).decode()


def _converter(t: pa.DataType, fmt: LeafValues) -> Callable[[Any], Any] | None:
    """How one Python value (from ``to_pylist``) of type ``t`` becomes JSON; None: as it is."""
    if pa.types.is_floating(t):
        return fmt.float_value
    if pa.types.is_decimal(t):
        scale = t.scale
        decimal = fmt.decimal_value
        return lambda v: None if v is None else decimal(v, scale)
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return lambda v: None if v is None else base64.b64encode(v).decode()
    if pa.types.is_date(t):
        epoch = 719163  # date(1970, 1, 1).toordinal()
        return lambda v: None if v is None else v.toordinal() - epoch
    if pa.types.is_timestamp(t):
        return None  # handled on the Arrow side (cast to int64 micros)
    if pa.types.is_struct(t):
        fields = [(t.field(i).name, _converter(t.field(i).type, fmt)) for i in range(t.num_fields)]
        if all(c is None for _, c in fields):
            return None
        return lambda v: None if v is None else {n: (c(v[n]) if c else v[n]) for n, c in fields}
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        item = _converter(t.value_type, fmt)
        return None if item is None else (lambda v: None if v is None else [item(x) for x in v])
    if pa.types.is_map(t):
        kc, vc = _converter(t.key_type, fmt), _converter(t.item_type, fmt)
        k = kc or (lambda x: x)
        w = vc or (lambda x: x)
        if pa.types.is_string(t.key_type) or pa.types.is_large_string(t.key_type):
            return lambda v: None if v is None else {kk: w(vv) for kk, vv in v}
        return lambda v: None if v is None else [[k(kk), w(vv)] for kk, vv in v]
    return None


def _micros(column: pa.Array) -> pa.Array:
    """Timestamps (any unit) as int64 microseconds; nested ones are left to :func:`_nested_micros`."""
    t = column.type
    if pa.types.is_timestamp(t):
        return pc.cast(pc.cast(column, pa.timestamp("us", tz=t.tz)), pa.int64())
    return _nested_micros(column)


def _nested_micros(column: pa.Array) -> pa.Array:
    t = column.type
    if pa.types.is_struct(t) and any(_has_timestamp(f.type) for f in t):
        arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
        children = [_micros(arr.field(i)) for i in range(t.num_fields)]
        return pa.StructArray.from_arrays(
            children, fields=None, names=[f.name for f in t], mask=arr.is_null()
        )
    if (pa.types.is_list(t) or pa.types.is_large_list(t)) and _has_timestamp(t.value_type):
        arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
        values = _micros(arr.values)
        cls = pa.ListArray if pa.types.is_list(t) else pa.LargeListArray
        return cls.from_arrays(arr.offsets, values, mask=arr.is_null())
    if pa.types.is_map(t) and (_has_timestamp(t.key_type) or _has_timestamp(t.item_type)):
        arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
        return pa.MapArray.from_arrays(arr.offsets, _micros(arr.keys), _micros(arr.items), mask=arr.is_null())
    return column


def _has_timestamp(t: pa.DataType) -> bool:
    if pa.types.is_timestamp(t):
        return True
    if pa.types.is_struct(t):
        return any(_has_timestamp(f.type) for f in t)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return _has_timestamp(t.value_type)
    if pa.types.is_map(t):
        return _has_timestamp(t.key_type) or _has_timestamp(t.item_type)
    return False


def column_values(column: pa.Array, fmt: LeafValues) -> list[Any]:
    """A column as JSON-ready values, one per row: casts on the Arrow side, then one ``to_pylist``."""
    t = column.type
    column = _micros(column)
    if pa.types.is_date(t):
        return pc.cast(column, pa.int32()).to_pylist()  # type: ignore[no-any-return]
    values = column.to_pylist()
    convert = _converter(t, fmt)
    return values if convert is None else list(map(convert, values))


# --- Connect schemas --------------------------------------------------------------------------


def connect_schema(t: pa.DataType, *, optional: bool = True, field: str | None = None) -> dict[str, Any]:
    """The Kafka Connect schema (as JsonConverter writes it) of an Arrow type."""
    s: dict[str, Any]
    if pa.types.is_boolean(t):
        s = {"type": "boolean"}
    elif pa.types.is_int8(t):
        s = {"type": "int8"}
    elif pa.types.is_int16(t):
        s = {"type": "int16"}
    elif pa.types.is_int32(t):
        s = {"type": "int32"}
    elif pa.types.is_int64(t):
        s = {"type": "int64"}
    elif pa.types.is_float32(t) or pa.types.is_float16(t):
        s = {"type": "float"}
    elif pa.types.is_float64(t):
        s = {"type": "double"}
    elif pa.types.is_string(t) or pa.types.is_large_string(t):
        s = {"type": "string"}
    elif pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        s = {"type": "bytes"}
    elif pa.types.is_decimal(t):
        s = {
            "type": "bytes",
            "name": "org.apache.kafka.connect.data.Decimal",
            "version": 1,
            "parameters": {"scale": str(t.scale), "connect.decimal.precision": str(t.precision)},
        }
    elif pa.types.is_date(t):
        s = {"type": "int32", "name": "io.debezium.time.Date", "version": 1}
    elif pa.types.is_timestamp(t):
        s = {"type": "int64", "name": "io.debezium.time.MicroTimestamp", "version": 1}
    elif pa.types.is_struct(t):
        s = {"type": "struct", "fields": [connect_schema(f.type, field=f.name) for f in t]}
    elif pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        s = {"type": "array", "items": connect_schema(t.value_type)}
    elif pa.types.is_map(t):
        s = {
            "type": "map",
            "keys": connect_schema(t.key_type, optional=False),
            "values": connect_schema(t.item_type),
        }
    elif pa.types.is_null(t):
        s = {"type": "string"}
    else:
        raise TypeError(f"no Kafka Connect type for Arrow type {t}")
    s["optional"] = optional
    if field is not None:
        s["field"] = field
    return s


def struct_schema(
    name: str, fields: list[dict[str, Any]], *, optional: bool, field: str | None = None
) -> dict[str, Any]:
    s: dict[str, Any] = {"type": "struct", "fields": fields, "optional": optional, "name": name}
    if field is not None:
        s["field"] = field
    return s


def string_field(field: str, optional: bool = False) -> dict[str, Any]:
    return {"type": "string", "optional": optional, "field": field}


def int64_field(field: str, optional: bool = False) -> dict[str, Any]:
    return {"type": "int64", "optional": optional, "field": field}


# --- the envelope's own parts (as Debezium names them) ------------------------------------------


def source_schema() -> dict[str, Any]:
    snapshot = {
        "type": "string",
        "optional": True,
        "name": "io.debezium.data.Enum",
        "version": 1,
        "parameters": {"allowed": "true,last,false,incremental"},
        "default": "false",
        "field": "snapshot",
    }
    fields = [
        string_field("version"),
        string_field("connector"),
        string_field("name"),
        int64_field("ts_ms"),
        snapshot,
        string_field("db"),
        string_field("table", True),
        string_field("table_id"),
        int64_field("delta_version"),
        int64_field("index"),
    ]
    return struct_schema("io.debezium.connector.deltamirror.Source", fields, optional=False, field="source")


def transaction_block_schema() -> dict[str, Any]:
    fields = [string_field("id"), int64_field("total_order"), int64_field("data_collection_order")]
    return struct_schema("event.block", fields, optional=True, field="transaction")


#: Debezium's transaction metadata key and value
TXN_KEY_SCHEMA = struct_schema(
    "io.debezium.connector.common.TransactionMetadataKey", [string_field("id")], optional=False
)
TXN_VALUE_SCHEMA = struct_schema(
    "io.debezium.connector.common.TransactionMetadataValue",
    [
        string_field("status"),
        string_field("id"),
        int64_field("event_count", True),
        {
            "type": "array",
            "items": struct_schema(
                "io.debezium.connector.common.TransactionMetadataDataCollection",
                [string_field("data_collection"), int64_field("event_count")],
                optional=False,
            ),
            "optional": True,
            "field": "data_collections",
        },
        int64_field("ts_ms"),
    ],
    optional=False,
)


__all__ = [
    "TXN_KEY_SCHEMA",
    "TXN_VALUE_SCHEMA",
    "LeafValues",
    "column_values",
    "connect_decimal",
    "connect_schema",
    "int64_field",
    "source_schema",
    "string_field",
    "struct_schema",
    "transaction_block_schema",
]
