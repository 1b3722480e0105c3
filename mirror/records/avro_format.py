"""The ``avro`` row-change format: Debezium's envelope as Avro through a Schema Registry.

Keys and values are written by confluent-kafka's own
:class:`~confluent_kafka.schema_registry.avro.AvroSerializer`: the Confluent wire format (magic byte
0, the 4-byte big-endian schema id, the Avro binary body), the schema registered under the subject
the configured strategy names (``topic``: ``<topic>-key`` / ``<topic>-value``; ``record``: the
record's full name; ``topic-record``: ``<topic>-<record full name>``). The schemas are
:mod:`.avro_types`' (key: ``<namespace>.Key`` of the key columns; value: ``<namespace>.Envelope``).

Row images (what pairing holds and spills) are the schemaless Avro binary of the ``Value`` record,
made with fastavro; an event decodes its images and hands the envelope to the serializer (the cost
of the binary path; the JSON formats do not pay it). Transaction metadata (BEGIN/END) stays JSON,
as the action and commit events do: those topics have one fixed schema that the JSON Schema of the
wire documents, and no consumer needs a registry to read them.

Clients are shared: one registry client per registry settings, one serializer per schema and
subject strategy, so a new version of an unchanged table registers nothing and asks nothing.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, cast

import fastavro
import pyarrow as pa
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from deltamirror.core.schema import StructType

from .avro_types import (
    column_converter,
    column_types,
    delta_type_of,
    envelope_schema,
    key_schema,
    value_schema,
)
from .registry_clients import (
    SUBJECT_NAME_STRATEGY_FUNCTIONS,
    made_once,
    registry_client,
    subject_name,
)
from .registry_clients import registry_error as _registry_error
from .row_formats import JsonRowChanges, RegistrySettings

_serializers: dict[tuple[RegistrySettings, str], AvroSerializer] = {}


def avro_serializer(settings: RegistrySettings, schema: Mapping[str, Any]) -> AvroSerializer:
    """confluent-kafka's serializer of ``schema`` (an Avro schema as a dict), made once per settings
    and schema text: the subjects it registered are known to it, so a schema is registered once."""
    text = json.dumps(schema, separators=(",", ":"), sort_keys=True)
    return made_once(
        _serializers,
        (settings, text),
        lambda: AvroSerializer(
            registry_client(settings),
            text,
            conf={
                "auto.register.schemas": settings.auto_register,
                "subject.name.strategy": SUBJECT_NAME_STRATEGY_FUNCTIONS[settings.subject_name_strategy],
            },
        ),
    )


class AvroRowChanges:
    """``avro``: keys and values as Avro in the Confluent wire format, schemas in a registry."""

    format: ClassVar[str] = "avro"
    image_type: ClassVar[pa.DataType] = pa.large_binary()

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
        if registry is None:
            raise ValueError("row-change format avro needs a Schema Registry (row_changes.registry.url)")
        self.topic = topic
        self.registry = registry
        types = column_types(fields, columns, table_schema)
        key_types = column_types(fields, key_columns, table_schema)  # each column's on its own
        self.columns = list(columns)
        self.key_columns = list(key_columns)
        #: the Avro schemas (dicts, as registered)
        self.value_schema = envelope_schema(topic, types)
        self.row_schema = value_schema(topic, types)
        self.key_schema = key_schema(topic, key_types)
        self._row = fastavro.parse_schema(self.row_schema)
        self._key = fastavro.parse_schema(self.key_schema)
        self._row_names = [f["name"] for f in self.row_schema["fields"]]
        self._key_names = [f["name"] for f in self.key_schema["fields"]]
        #: confluent-kafka's serializers, made at the first record (the images need no registry)
        self._value_serializer: AvroSerializer | None = None
        self._key_serializer: AvroSerializer | None = None
        self._value_context = SerializationContext(topic, MessageField.VALUE)
        self._key_context = SerializationContext(topic, MessageField.KEY)

    # --- values and images ------------------------------------------------------------------------

    def column_values(self, column: pa.Array) -> list[Any]:
        """Avro-ready values (:func:`~.avro_types.column_converter`). The conversion depends on the
        Arrow type alone: the one Delta type Arrow does not tell apart, variant, is a struct of
        ``value`` and ``metadata`` either way."""
        return _by_arrow(column)

    def images(self, values: Mapping[str, list[Any]], n: int) -> list[bytes]:
        return _encode_rows(self._row, self._row_names, [values[c] for c in self.columns], n)

    def key_images(self, values: Mapping[str, list[Any]], n: int) -> list[bytes]:
        return _encode_rows(self._key, self._key_names, [values[c] for c in self.key_columns], n)

    def row(self, image: bytes) -> dict[str, Any]:
        """A row image back as the record it is (fastavro's reader: logical types as Python values)."""
        return cast(dict[str, Any], fastavro.schemaless_reader(io.BytesIO(image), self._row, self._row))

    # --- records ----------------------------------------------------------------------------------

    def key(self, payload: bytes) -> bytes:
        record = fastavro.schemaless_reader(io.BytesIO(payload), self._key, self._key)
        if self._key_serializer is None:
            self._key_serializer = avro_serializer(self.registry, self.key_schema)
        try:
            out = self._key_serializer(record, self._key_context)
        except Exception as exc:
            raise _registry_error(exc, self._subject("key", self.key_schema)) from exc
        assert out is not None
        return out

    def value(self, payload: bytes) -> bytes:
        raise TypeError("format avro writes events from their parts (event), not from JSON text")

    def event(
        self,
        op: str,
        before: bytes | None,
        after: bytes | None,
        source: Mapping[str, Any],
        ts_ms: int,
        transaction: Mapping[str, Any],
    ) -> bytes:
        envelope = {
            "before": None if before is None else self.row(before),
            "after": None if after is None else self.row(after),
            "source": source,
            "op": op,
            "ts_ms": ts_ms,
            "transaction": transaction,
        }
        if self._value_serializer is None:
            self._value_serializer = avro_serializer(self.registry, self.value_schema)
        try:
            out = self._value_serializer(envelope, self._value_context)
        except Exception as exc:
            raise _registry_error(exc, self._subject("value", self.value_schema)) from exc
        assert out is not None
        return out

    def _subject(self, field: str, schema: Mapping[str, Any]) -> str:
        """The subject the strategy names (as confluent-kafka's strategy functions do)."""
        return subject_name(self.registry, self.topic, field, f"{schema['namespace']}.{schema['name']}")

    # --- what else a format says ------------------------------------------------------------------

    @classmethod
    def value_ddl(cls, schema: StructType) -> str:
        """No DDL: Spark reads Avro with ``from_avro`` and the registered schema (after the 5-byte
        header), whose names are the sanitized ones (docs/avro.md)."""
        raise ValueError(
            "format avro has no Spark DDL: read it with from_avro and the registered schema (docs/avro.md)"
        )

    @classmethod
    def key_ddl(cls, fields: StructType) -> str:
        return cls.value_ddl(fields)

    #: BEGIN/END stay JSON (see the module's docstring)
    transaction = staticmethod(JsonRowChanges.transaction)


#: the converter of each Arrow type met (a table has few)
_CONVERTERS: dict[pa.DataType, Callable[[pa.Array], list[Any]]] = {}


def _by_arrow(column: pa.Array) -> list[Any]:
    t = column.type
    convert = _CONVERTERS.get(t)
    if convert is None:
        convert = _CONVERTERS[t] = column_converter(delta_type_of(t))
    return convert(column)


def _encode_rows(schema: Any, names: list[str], columns: list[list[Any]], n: int) -> list[bytes]:
    """Each row's schemaless Avro binary (a record's binary is its fields' in order)."""
    write = fastavro.schemaless_writer
    out: list[bytes] = []
    buffer = io.BytesIO()
    for row in zip(*columns, strict=True) if columns else ((),) * n:
        buffer.seek(0)
        buffer.truncate()
        write(buffer, schema, dict(zip(names, row, strict=True)))
        out.append(buffer.getvalue())
    return out


#: the class :func:`~.row_formats.row_change_serializer` returns for ``avro``
SERIALIZER = AvroRowChanges

__all__ = [
    "SERIALIZER",
    "SUBJECT_NAME_STRATEGY_FUNCTIONS",
    "AvroRowChanges",
    "avro_serializer",
    "registry_client",
]
