"""The row-change formats: how a row change and Debezium's transaction metadata become bytes.

A format is one class implementing :class:`RowChangeSerializer`, chosen once from the table's
``row_changes.format`` setting (:func:`row_change_serializer`), made per table schema (the batch's
Arrow fields and, where the caller knows it, the version's Delta schema). Two kinds, told apart by
the class's ``image_type`` (what a row image is, and what pairing holds and spills):

- text formats (``pa.large_string()``): :class:`~.row_changes.RowChangeEncoder` builds a row image's
  JSON text and the envelope's text (the same payload in every text format; the hot path, untouched
  by the binary kind) and the serializer frames it (:meth:`RowChangeSerializer.value`):

  - :class:`JsonRowChanges` (``json``): the payload alone;
  - :class:`ConnectJsonRowChanges` (``json-schema``): ``{"schema": ..., "payload": ...}`` as Kafka
    Connect's ``JsonConverter`` writes it with ``schemas.enable=true``;

- binary formats (``pa.large_binary()``, :class:`BinaryRowChangeSerializer`): the encoder hands the
  format the columns' values (its own :meth:`~RowChangeSerializer.column_values`) and the format
  makes each row image's bytes (:meth:`~BinaryRowChangeSerializer.images`) and each event's record
  value from the envelope's parts (:meth:`~BinaryRowChangeSerializer.event`):

  - ``avro`` (:mod:`.avro_format`, imported only when chosen: it needs ``deltamirror[avro]``):
    Avro through a Schema Registry, the Confluent wire format.

A class also says how its values read in Spark (``value_ddl``, ``key_ddl``: what
:func:`~.spark_ddl.row_changes_ddl` returns for its format) and how it writes the values JSON has
no one form for (floats that are not finite, decimals). A new format (Protobuf with a schema
registry) is one more class and one more value of the setting; the encoder, the pairing of
updates, the transactions and the DDL functions do not change.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, ClassVar, Literal, Protocol

import pyarrow as pa
from pydantic import SecretStr

from deltamirror.core.errors import ConfigError
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
RowChangesFormat = Literal["json", "json-schema", "avro"]

#: the subject name strategies of a registry-backed format (Confluent's three)
SubjectNameStrategy = Literal["topic", "record", "topic-record"]
SUBJECT_NAME_STRATEGIES: tuple[str, ...] = ("topic", "record", "topic-record")

_JSON = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


class RowChangeSerializer(Protocol):
    """One format of the row-change records, made per table schema.

    ``topic`` is the changes topic (it names the Connect structs, the Avro namespace), ``fields`` the
    batch's Arrow fields by name, ``columns`` the row's columns and ``key_columns`` the key's, in
    order; ``table_schema`` the version's Delta schema when the caller knows it (a binary format
    takes the Delta types from it: variant is not told apart from a struct in Arrow), ``registry``
    the Schema Registry settings of a format that needs one (:class:`RegistrySettings`).
    """

    #: the value of the ``row_changes.format`` setting that chooses it
    format: ClassVar[str]
    #: what a row image is: ``pa.large_string()`` (JSON text the encoder builds) or
    #: ``pa.large_binary()`` (a :class:`BinaryRowChangeSerializer`'s bytes)
    image_type: ClassVar[pa.DataType]

    def __init__(
        self,
        topic: str,
        fields: Mapping[str, pa.Field],
        columns: Sequence[str],
        key_columns: Sequence[str],
        *,
        table_schema: StructType | None = None,
        registry: RegistrySettings | None = None,
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
        """The record key around a key payload (the JSON text of the key columns; a binary format's
        key image)."""
        ...

    def value(self, payload: bytes) -> bytes:
        """The record value around a change event's payload (the JSON text of its envelope); text
        formats only."""
        ...

    @staticmethod
    def transaction(key: Mapping[str, Any], payload: Mapping[str, Any]) -> tuple[bytes, bytes]:
        """A transaction-metadata record's key and value (BEGIN or END)."""
        ...


class BinaryRowChangeSerializer(RowChangeSerializer, Protocol):
    """A format whose row images are its own bytes (``image_type`` ``pa.large_binary()``).

    The encoder converts each column once (:meth:`column_values`, one list per column, as for the
    text formats); the format makes the images and keys from those lists and the record values from
    the envelope's parts. An image must be the same bytes for the same row on every read (pairing
    hashes keys and compares them; a restart skips a prefix of the same stream).
    """

    def images(self, values: Mapping[str, list[Any]], n: int) -> list[bytes]:
        """The ``n`` row images of a batch whose columns' values are ``values`` (by column name)."""
        ...

    def key_images(self, values: Mapping[str, list[Any]], n: int) -> list[bytes]:
        """The ``n`` key payloads (the pairing identity, and what :meth:`key` frames)."""
        ...

    def event(
        self,
        op: str,
        before: bytes | None,
        after: bytes | None,
        source: Mapping[str, Any],
        ts_ms: int,
        transaction: Mapping[str, Any],
    ) -> bytes:
        """One change event's record value: the envelope with the row images ``before`` / ``after``
        (None: null), Debezium's ``source`` block and ``transaction`` block."""
        ...


@dataclass(frozen=True)
class RegistrySettings:
    """Where a registry-backed format registers its schemas (``row_changes.registry``).

    ``subject_name_strategy``: ``topic`` (``<topic>-key`` / ``<topic>-value``), ``record``
    (the record's full name) or ``topic-record`` (``<topic>-<record full name>``), as Confluent's
    serializers name them. The password is a ``SecretStr``: revealed only to the registry client.
    """

    url: str
    username: str | None = None
    password: SecretStr | None = field(default=None, repr=False)
    subject_name_strategy: SubjectNameStrategy = "topic"
    #: register new schemas (and versions of them) as records need them
    auto_register: bool = True


class JsonRowChanges:
    """``json``: the payload alone. NaN and infinities as the strings ``"NaN"``, ``"Infinity"``,
    ``"-Infinity"``; decimals as exact strings."""

    format: ClassVar[str] = "json"
    image_type: ClassVar[pa.DataType] = pa.large_string()

    def __init__(
        self,
        topic: str,
        fields: Mapping[str, pa.Field],
        columns: Sequence[str],
        key_columns: Sequence[str],
        *,
        table_schema: StructType | None = None,
        registry: RegistrySettings | None = None,
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
    image_type: ClassVar[pa.DataType] = pa.large_string()

    def __init__(
        self,
        topic: str,
        fields: Mapping[str, pa.Field],
        columns: Sequence[str],
        key_columns: Sequence[str],
        *,
        table_schema: StructType | None = None,
        registry: RegistrySettings | None = None,
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


#: the text formats, by the setting's value
ROW_CHANGE_SERIALIZERS: dict[str, type[RowChangeSerializer]] = {
    cls.format: cls for cls in (JsonRowChanges, ConnectJsonRowChanges)
}
#: the registry-backed formats: their modules, imported when chosen (their libraries are an extra)
REGISTRY_FORMATS: dict[str, str] = {"avro": "avro_format"}
ROW_CHANGES_FORMATS: tuple[str, ...] = (*ROW_CHANGE_SERIALIZERS, *REGISTRY_FORMATS)


def row_change_serializer(format: str) -> type[RowChangeSerializer]:
    """The serializer of ``format`` (a value of ``row_changes.format``); another is a ValueError, a
    registry format whose libraries are not installed a ConfigError."""
    found = ROW_CHANGE_SERIALIZERS.get(format)
    if found is not None:
        return found
    module = REGISTRY_FORMATS.get(format)
    if module is None:
        raise ValueError(
            f"row-change format {format!r} is not one deltamirror writes ({', '.join(ROW_CHANGES_FORMATS)})"
        )
    import importlib

    try:
        loaded = importlib.import_module(f"{__package__}.{module}")
    except ImportError as exc:
        if (exc.name or "").startswith("deltamirror"):
            raise
        raise ConfigError(
            f"row-change format {format} needs the package {exc.name or 'fastavro'}: install deltamirror[{format}]"
        ) from None
    cls: type[RowChangeSerializer] = loaded.SERIALIZER
    ROW_CHANGE_SERIALIZERS[format] = cls
    return cls


__all__ = [
    "REGISTRY_FORMATS",
    "ROW_CHANGES_FORMATS",
    "ROW_CHANGE_SERIALIZERS",
    "SUBJECT_NAME_STRATEGIES",
    "BinaryRowChangeSerializer",
    "ConnectJsonRowChanges",
    "JsonRowChanges",
    "RegistrySettings",
    "RowChangeSerializer",
    "RowChangesFormat",
    "SubjectNameStrategy",
    "row_change_serializer",
]
