"""The ``protobuf`` row-change format: Debezium's envelope as Protobuf through a Schema Registry.

Keys and values are written by confluent-kafka's own
:class:`~confluent_kafka.schema_registry.protobuf.ProtobufSerializer`: the Confluent wire format
(magic byte 0, the 4-byte big-endian schema id, the message indexes, the Protobuf binary body), the
schema (the file's serialized ``FileDescriptorProto``, as confluent-kafka sends it) registered under
the subject the configured strategy names, as for Avro (``record``: the message's full name,
``<package>.Envelope`` / ``<package>.Key``). The message classes are built at runtime from the
version's Delta schema (:mod:`.protobuf_types`: ``descriptor_pb2`` -> a ``DescriptorPool`` of
their own -> ``message_factory.GetMessageClass``); the imported files (``google/protobuf/*``,
``google/type/*``, ``confluent/type/*``) are the known types confluent-kafka does not register as
references, which a registry resolves itself.

Row images (what pairing holds and spills) are the deterministic Protobuf binary of the ``Value``
message (map entries sorted by key: the same bytes for the same row on every read); an event parses
its images into the ``Envelope`` and hands it to the serializer. Transaction metadata (BEGIN/END)
stays JSON, as for Avro.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import pyarrow as pa
from confluent_kafka.schema_registry.confluent.type import decimal_pb2, variant_pb2
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import Message

from deltamirror.core.schema import StructType

from .avro_types import column_types, delta_type_of
from .protobuf_types import (
    WELL_KNOWN_FILES,
    column_converter,
    envelope_file,
    field_numbers,
    key_file,
    shaper,
)
from .registry_clients import (
    SUBJECT_NAME_STRATEGY_FUNCTIONS,
    made_once,
    registry_client,
    registry_error,
    subject_name,
)
from .row_formats import JsonRowChanges, RegistrySettings

_serializers: dict[tuple[RegistrySettings, bytes], ProtobufSerializer] = {}
_classes: dict[bytes, descriptor_pool.DescriptorPool] = {}


def message_classes(file: descriptor_pb2.FileDescriptorProto, *names: str) -> tuple[type[Message], ...]:
    """The classes of messages ``names`` of ``file``, built once per file in a pool of its own (two
    versions of a table have messages of the same names): an unchanged file gives the same classes,
    so its serializer (which checks a message's class) and the subjects it knows are kept."""
    cache_key = file.SerializeToString(deterministic=True)

    def pool() -> descriptor_pool.DescriptorPool:
        made = descriptor_pool.DescriptorPool()
        for module in (*WELL_KNOWN_FILES, decimal_pb2, variant_pb2):
            made.AddSerializedFile(module.DESCRIPTOR.serialized_pb)
        made.Add(file)
        return made

    found = made_once(_classes, cache_key, pool)
    made: tuple[type[Message], ...] = tuple(
        message_factory.GetMessageClass(found.FindMessageTypeByName(f"{file.package}.{name}"))
        for name in names
    )
    return made


def protobuf_serializer(settings: RegistrySettings, cls: type[Message]) -> ProtobufSerializer:
    """confluent-kafka's serializer of message class ``cls``, made once per settings and file: the
    subjects it registered are known to it, so a schema is registered once."""
    text = cls.DESCRIPTOR.file.serialized_pb + b"#" + cls.DESCRIPTOR.full_name.encode()
    return made_once(
        _serializers,
        (settings, text),
        lambda: ProtobufSerializer(
            cls,
            registry_client(settings),
            conf={
                "auto.register.schemas": settings.auto_register,
                "subject.name.strategy": SUBJECT_NAME_STRATEGY_FUNCTIONS[settings.subject_name_strategy],
                "use.deprecated.format": False,
            },
        ),
    )


class ProtobufRowChanges:
    """``protobuf``: keys and values as Protobuf in the Confluent wire format, schemas in a registry."""

    format: ClassVar[str] = "protobuf"
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
            raise ValueError("row-change format protobuf needs a Schema Registry (row_changes.registry.url)")
        self.topic = topic
        self.registry = registry
        types = column_types(fields, columns, table_schema)
        key_types = column_types(fields, key_columns, table_schema)  # each column's on its own
        numbers = dict(zip(columns, field_numbers(types), strict=True))
        extra = max(numbers.values(), default=0)
        key_numbers = []
        for c in key_columns:  # a key column not published (columns:) takes a number after the row's
            if c not in numbers:
                extra += 1
                numbers[c] = extra
            key_numbers.append(numbers[c])
        self.columns = list(columns)
        self.key_columns = list(key_columns)
        #: the generated files (``FileDescriptorProto``), as registered
        self.value_file = envelope_file(topic, types, [numbers[c] for c in columns])
        self.key_file = key_file(topic, key_types, key_numbers)
        self.envelope_class, self.value_class = message_classes(self.value_file, "Envelope", "Value")
        (self.key_class,) = message_classes(self.key_file, "Key")
        value_fields = self.value_class.DESCRIPTOR.fields
        key_fields = self.key_class.DESCRIPTOR.fields
        self._row_names = [f.name for f in value_fields]
        self._key_names = [f.name for f in key_fields]
        self._row_shapers = [shaper(f.type, f.nullable) for f in types]
        self._key_shapers = [shaper(f.type, f.nullable, native_maps=False) for f in key_types]
        #: confluent-kafka's serializers, made at the first record (the images need no registry)
        self._value_serializer: ProtobufSerializer | None = None
        self._key_serializer: ProtobufSerializer | None = None
        self._value_context = SerializationContext(topic, MessageField.VALUE)
        self._key_context = SerializationContext(topic, MessageField.KEY)

    # --- values and images ------------------------------------------------------------------------

    def column_values(self, column: pa.Array) -> list[Any]:
        """Neutral values (:func:`~.protobuf_types.column_converter`), from the Arrow type alone (the
        one Delta type Arrow does not tell apart, variant, is a struct of ``value`` and ``metadata``
        either way); the row's message shapes them by the Delta schema (:meth:`images`)."""
        t = column.type
        convert = _CONVERTERS.get(t)
        if convert is None:
            convert = _CONVERTERS[t] = column_converter(delta_type_of(t))
        return convert(column)

    def images(self, values: Mapping[str, list[Any]], n: int) -> list[bytes]:
        columns = [values[c] for c in self.columns]
        return _encode_rows(self.value_class, self._row_names, self._row_shapers, columns, n)

    def key_images(self, values: Mapping[str, list[Any]], n: int) -> list[bytes]:
        columns = [values[c] for c in self.key_columns]
        return _encode_rows(self.key_class, self._key_names, self._key_shapers, columns, n)

    def row(self, image: bytes) -> Message:
        """A row image back as the ``Value`` message it is."""
        return self.value_class.FromString(image)

    # --- records ----------------------------------------------------------------------------------

    def key(self, payload: bytes) -> bytes:
        record = self.key_class.FromString(payload)
        if self._key_serializer is None:
            self._key_serializer = protobuf_serializer(self.registry, self.key_class)
        try:
            out = self._key_serializer(record, self._key_context)
        except Exception as exc:
            raise registry_error(exc, self._subject("key", self.key_class)) from exc
        assert out is not None
        return out

    def value(self, payload: bytes) -> bytes:
        raise TypeError("format protobuf writes events from their parts (event), not from JSON text")

    def event(
        self,
        op: str,
        before: bytes | None,
        after: bytes | None,
        source: Mapping[str, Any],
        ts_ms: int,
        transaction: Mapping[str, Any],
    ) -> bytes:
        envelope = self.envelope_class(op=op, ts_ms=ts_ms, source=dict(source), transaction=dict(transaction))
        for name, image in (("before", before), ("after", after)):
            if image is not None:
                part = getattr(envelope, name)
                part.SetInParent()
                part.MergeFromString(image)
        if self._value_serializer is None:
            self._value_serializer = protobuf_serializer(self.registry, self.envelope_class)
        try:
            out = self._value_serializer(envelope, self._value_context)
        except Exception as exc:
            raise registry_error(exc, self._subject("value", self.envelope_class)) from exc
        assert out is not None
        return out

    def _subject(self, field: str, cls: type[Message]) -> str:
        return subject_name(self.registry, self.topic, field, cls.DESCRIPTOR.full_name)

    # --- what else a format says ------------------------------------------------------------------

    @classmethod
    def value_ddl(cls, schema: StructType) -> str:
        """No DDL: Spark reads Protobuf with ``from_protobuf`` and the registered descriptor (after
        the Confluent header), whose names are the sanitized ones (docs/protobuf.md)."""
        raise ValueError(
            "format protobuf has no Spark DDL: read it with from_protobuf and the registered schema "
            "(docs/protobuf.md)"
        )

    @classmethod
    def key_ddl(cls, fields: StructType) -> str:
        return cls.value_ddl(fields)

    #: BEGIN/END stay JSON (see the module's docstring)
    transaction = staticmethod(JsonRowChanges.transaction)


#: the converter of each Arrow type met (a table has few)
_CONVERTERS: dict[pa.DataType, Callable[[pa.Array], list[Any]]] = {}


def _encode_rows(
    cls: Callable[..., Message],
    names: list[str],
    shapers: list[Callable[[Any], Any] | None],
    columns: list[list[Any]],
    n: int,
) -> list[bytes]:
    """Each row's deterministic Protobuf binary (None leaves a field unset)."""
    shaped = [
        values if shape is None else [None if v is None else shape(v) for v in values]
        for shape, values in zip(shapers, columns, strict=True)
    ]
    out: list[bytes] = []
    for row in zip(*shaped, strict=True) if shaped else ((),) * n:
        message = cls(**{k: v for k, v in zip(names, row, strict=True) if v is not None})
        out.append(message.SerializeToString(deterministic=True))
    return out


#: the class :func:`~.row_formats.row_change_serializer` returns for ``protobuf``
SERIALIZER = ProtobufRowChanges

__all__ = [
    "SERIALIZER",
    "ProtobufRowChanges",
    "message_classes",
    "protobuf_serializer",
]
