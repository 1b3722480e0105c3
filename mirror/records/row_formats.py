"""The row-change formats: how a row change and Debezium's transaction metadata become bytes.

A format is one class implementing :class:`RowChangeSerializer`, chosen once from the table's
``row_changes.format`` setting (:func:`row_change_serializer`); :class:`~.row_changes.RowChangeEncoder`
builds the envelope's text (the same payload in every format) and hands it to the serializer:

- :class:`JsonRowChanges` (``json``): the payload alone;
- :class:`ConnectJsonRowChanges` (``json-schema``): ``{"schema": ..., "payload": ...}`` as Kafka
  Connect's ``JsonConverter`` writes it with ``schemas.enable=true``.

A class also says how its values read in Spark (``value_ddl``, ``key_ddl``: what
:func:`~.spark_ddl.row_changes_ddl` returns for its format) and how it writes the values JSON has
no one form for (floats that are not finite, decimals). A new format (Avro, Protobuf with a schema
registry) is one more class here and one more value of the setting; the encoder, the pairing of
updates, the transactions and the DDL functions do not change.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any, ClassVar, Literal, Protocol

import pyarrow as pa

from deltamirror.core.schema import DecimalType, StructType

from ..errors import UnrepresentableValueError
from .connect_types import (
    TXN_KEY_SCHEMA,
    TXN_VALUE_SCHEMA,
    column_values,
    connect_decimal,
    connect_schema,
    int64_field,
    source_schema,
    string_field,
    struct_schema,
    transaction_block_schema,
)
from .spark_types import envelope_ddl, fields_ddl

#: the values of the ``row_changes.format`` setting (the keys of :data:`ROW_CHANGE_SERIALIZERS`)
RowChangesFormat = Literal["json", "json-schema"]

_JSON = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


class RowChangeSerializer(Protocol):
    """One format of the row-change records, made per table schema.

    ``topic`` is the changes topic (it names the Connect structs), ``fields`` the table's Arrow
    fields by name, ``columns`` the row's columns and ``key_columns`` the key's, in order.
    """

    #: the value of the ``row_changes.format`` setting that chooses it
    format: ClassVar[str]

    def __init__(
        self, topic: str, fields: Mapping[str, pa.Field], columns: Sequence[str], key_columns: Sequence[str]
    ) -> None: ...

    def column_values(self, column: pa.Array) -> list[Any]:
        """A column's values as the payload carries them (JSON-ready Python values)."""
        ...

    @classmethod
    def value_ddl(cls, schema: StructType) -> str:
        """The Spark DDL of a value for a table of ``schema`` (``from_json(value, DDL)``)."""
        ...

    @classmethod
    def key_ddl(cls, fields: StructType) -> str:
        """The Spark DDL of a key made of ``fields`` (the key columns)."""
        ...

    def key(self, payload: bytes) -> bytes:
        """The record key around a key payload (the JSON text of the key columns)."""
        ...

    def value(self, payload: bytes) -> bytes:
        """The record value around a change event's payload (the JSON text of its envelope)."""
        ...

    @staticmethod
    def transaction(key: Mapping[str, Any], payload: Mapping[str, Any]) -> tuple[bytes, bytes]:
        """A transaction-metadata record's key and value (BEGIN or END)."""
        ...


class JsonRowChanges:
    """``json``: the payload alone. NaN and infinities as the strings ``"NaN"``, ``"Infinity"``,
    ``"-Infinity"``; decimals as exact strings."""

    format: ClassVar[str] = "json"

    def __init__(
        self, topic: str, fields: Mapping[str, pa.Field], columns: Sequence[str], key_columns: Sequence[str]
    ) -> None:
        pass

    @staticmethod
    def float_value(value: float | None) -> float | str | None:
        if value is None or math.isfinite(value):
            return value
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")

    @staticmethod
    def decimal_value(value: Decimal, scale: int) -> str:
        return f"{value:f}"

    @staticmethod
    def decimal_ddl(t: DecimalType) -> str:
        """The exact decimal text reads as the decimal it is."""
        return f"DECIMAL({t.precision},{t.scale})"

    def column_values(self, column: pa.Array) -> list[Any]:
        return column_values(column, self)

    @classmethod
    def value_ddl(cls, schema: StructType) -> str:
        return ", ".join(f"{name} {ddl}" for name, ddl in envelope_ddl(schema, cls.decimal_ddl))

    @classmethod
    def key_ddl(cls, fields: StructType) -> str:
        return fields_ddl(fields, cls.decimal_ddl)

    def key(self, payload: bytes) -> bytes:
        return payload

    def value(self, payload: bytes) -> bytes:
        return payload

    @staticmethod
    def transaction(key: Mapping[str, Any], payload: Mapping[str, Any]) -> tuple[bytes, bytes]:
        return _JSON.encode(key).encode(), _JSON.encode(payload).encode()


class ConnectJsonRowChanges:
    """``json-schema``: JsonConverter's form with ``schemas.enable=true``, the schema inline in every
    record (struct names ``<topic>.Envelope`` / ``<topic>.Value`` / ``<topic>.Key``). NaN and
    infinities are refused (JsonConverter would read them as 0.0); decimals are Connect decimals."""

    format: ClassVar[str] = "json-schema"

    def __init__(
        self, topic: str, fields: Mapping[str, pa.Field], columns: Sequence[str], key_columns: Sequence[str]
    ) -> None:
        value_fields = [connect_schema(fields[c].type, field=c) for c in columns]
        key_fields = [connect_schema(fields[c].type, field=c) for c in key_columns]
        envelope = struct_schema(
            f"{topic}.Envelope",
            [
                struct_schema(f"{topic}.Value", value_fields, optional=True, field="before"),
                struct_schema(f"{topic}.Value", value_fields, optional=True, field="after"),
                source_schema(),
                string_field("op"),
                int64_field("ts_ms", True),
                transaction_block_schema(),
            ],
            optional=False,
        )
        envelope["version"] = 1
        self._value_prefix = b'{"schema":' + _JSON.encode(envelope).encode() + b',"payload":'
        key_schema = struct_schema(f"{topic}.Key", key_fields, optional=False)
        self._key_prefix = b'{"schema":' + _JSON.encode(key_schema).encode() + b',"payload":'

    @staticmethod
    def float_value(value: float | None) -> float | None:
        """JsonConverter reads the text "NaN" in a float field as 0.0: not finite is refused."""
        if value is None or math.isfinite(value):
            return value
        raise UnrepresentableValueError(
            f"the value {value} cannot be carried by format json-schema (Kafka Connect's JsonConverter "
            'reads it as 0.0); use format json, where it is the text "NaN" / "Infinity"'
        )

    @staticmethod
    def decimal_value(value: Decimal, scale: int) -> str:
        return connect_decimal(value, scale)

    @staticmethod
    def decimal_ddl(t: DecimalType) -> str:
        """JsonConverter's base64 unscaled bytes."""
        return "BINARY"

    def column_values(self, column: pa.Array) -> list[Any]:
        return column_values(column, self)

    @classmethod
    def value_ddl(cls, schema: StructType) -> str:
        """The envelope is under ``payload``."""
        return (
            "payload STRUCT<" + ", ".join(f"{n}: {d}" for n, d in envelope_ddl(schema, cls.decimal_ddl)) + ">"
        )

    @classmethod
    def key_ddl(cls, fields: StructType) -> str:
        return f"payload STRUCT<{fields_ddl(fields, cls.decimal_ddl, sep=': ')}>"

    def key(self, payload: bytes) -> bytes:
        return self._key_prefix + payload + b"}"

    def value(self, payload: bytes) -> bytes:
        return self._value_prefix + payload + b"}"

    @staticmethod
    def transaction(key: Mapping[str, Any], payload: Mapping[str, Any]) -> tuple[bytes, bytes]:
        return (
            _JSON.encode({"schema": TXN_KEY_SCHEMA, "payload": key}).encode(),
            _JSON.encode({"schema": TXN_VALUE_SCHEMA, "payload": payload}).encode(),
        )


#: every format, by the setting's value
ROW_CHANGE_SERIALIZERS: dict[str, type[RowChangeSerializer]] = {
    cls.format: cls for cls in (JsonRowChanges, ConnectJsonRowChanges)
}
ROW_CHANGES_FORMATS: tuple[str, ...] = tuple(ROW_CHANGE_SERIALIZERS)


def row_change_serializer(format: str) -> type[RowChangeSerializer]:
    """The serializer of ``format`` (a value of ``row_changes.format``); another is a ValueError."""
    try:
        return ROW_CHANGE_SERIALIZERS[format]
    except KeyError:
        raise ValueError(
            f"row-change format {format!r} is not one deltamirror writes ({', '.join(ROW_CHANGE_SERIALIZERS)})"
        ) from None


__all__ = [
    "ROW_CHANGES_FORMATS",
    "ROW_CHANGE_SERIALIZERS",
    "ConnectJsonRowChanges",
    "JsonRowChanges",
    "RowChangeSerializer",
    "RowChangesFormat",
    "row_change_serializer",
]
