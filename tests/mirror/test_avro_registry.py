"""The ``avro`` format against a real Schema Registry: the Confluent wire format, the subjects of
each strategy, new schema versions, read back with confluent-kafka's own ``AvroDeserializer``.

Marked ``registry``: they need the ``schema_registry`` fixture (a running registry's Confluent-API
base URL, issue 30 item 4), and are skipped, saying so, in a session without one. Never a mock.
"""

from __future__ import annotations

import json
import math
import uuid
from typing import Any

import pyarrow as pa
import pytest

from deltamirror.core.schema import parse_schema
from deltamirror.mirror.records.row_changes import VersionRows
from deltamirror.mirror.records.row_formats import RegistrySettings
from deltamirror.mirror.records.row_records import RowChangesOptions
from support.avro_rows import EVERY_TYPE, ROW, every_type_batch

pytestmark = pytest.mark.registry


@pytest.fixture
def registry(schema_registry: str) -> str:
    """The session's real registry's Confluent-API URL (tests/support/registry.py)."""
    return schema_registry


def _options(
    topic: str, settings: RegistrySettings, schema: dict[str, Any] = EVERY_TYPE
) -> RowChangesOptions:
    return RowChangesOptions(
        f"{topic}.changes",
        f"{topic}.transaction",
        topic,
        "tid",
        key_columns=("id",),
        format="avro",
        table_schema=parse_schema(json.dumps(schema)),
        registry=settings,
    )


def _changes(records: list[Any], topic: str) -> list[Any]:
    return [r for r in records if r.topic == f"{topic}.changes"]


@pytest.mark.parametrize(
    ("subject_name_strategy", "subjects"),
    [
        ("topic", ["{t}.changes-key", "{t}.changes-value"]),
        ("record", ["{ns}.Envelope", "{ns}.Key"]),
        ("topic-record", ["{t}.changes-{ns}.Envelope", "{t}.changes-{ns}.Key"]),
    ],
)
def test_records_are_the_confluent_wire_format_under_each_subject_strategy_and_read_back(
    registry: str, subject_name_strategy: str, subjects: list[str]
) -> None:
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    topic = f"avro{uuid.uuid4().hex[:8]}"
    settings = RegistrySettings(url=registry, subject_name_strategy=subject_name_strategy, auto_register=True)  # type: ignore[arg-type]
    batch = every_type_batch()
    records = [
        r
        for chunk in VersionRows(_options(topic, settings), lambda: [batch], version=3, ts_ms=5).records()
        for r in chunk
    ]
    changes = _changes(records, topic)
    assert len(changes) == 2
    client = SchemaRegistryClient({"url": registry})
    ns = f"{topic}.changes"
    assert sorted(s for s in client.get_subjects() if topic in s) == sorted(
        s.format(t=topic, ns=ns) for s in subjects
    )
    values, keys = AvroDeserializer(client), AvroDeserializer(client)
    for r in changes:
        assert r.value[0] == 0 and r.key[0] == 0  # magic byte, then the 4-byte schema id
        event = values(r.value, SerializationContext(r.topic, MessageField.VALUE))
        key = keys(r.key, SerializationContext(r.topic, MessageField.KEY))
        assert key == {"id": (event["after"] or event["before"])["id"]}
        assert event["source"]["delta_version"] == 3 and event["transaction"]["id"] == "tid:3"
    inserted = values(changes[0].value, SerializationContext(changes[0].topic, MessageField.VALUE))
    assert (
        inserted["op"] == "c"
        and inserted["after"]["dec"] == ROW["dec"]
        and math.isnan(inserted["after"]["f64"])
    )
    assert inserted["after"]["ts"] == ROW["ts"] and inserted["after"]["ntz"] == ROW["ntz"]
    deleted = values(changes[1].value, SerializationContext(changes[1].topic, MessageField.VALUE))
    assert deleted["op"] == "d" and deleted["after"] is None and deleted["before"]["id"] == 2


def test_a_new_column_registers_a_new_schema_version_and_an_unchanged_version_none(registry: str) -> None:
    from confluent_kafka.schema_registry import SchemaRegistryClient

    topic = f"avro{uuid.uuid4().hex[:8]}"
    settings = RegistrySettings(url=registry)
    batch = every_type_batch()
    for version in (1, 2):  # the same schema twice: one version of the subject
        list(VersionRows(_options(topic, settings), lambda: [batch], version=version, ts_ms=5).records())
    client = SchemaRegistryClient({"url": registry})
    assert client.get_versions(f"{topic}.changes-value") == [1]
    added = {
        **EVERY_TYPE,
        "fields": [
            *EVERY_TYPE["fields"],
            {"name": "extra", "type": "string", "nullable": True, "metadata": {}},
        ],
    }
    wider = batch.append_column("extra", pa.array(["x", None]))
    list(VersionRows(_options(topic, settings, added), lambda: [wider], version=3, ts_ms=5).records())
    assert client.get_versions(f"{topic}.changes-value") == [1, 2]  # additive: compatible under BACKWARD


def test_an_incompatible_schema_is_refused_before_any_record_naming_table_version_and_subject(
    registry: str,
) -> None:
    from confluent_kafka.schema_registry import SchemaRegistryClient

    from deltamirror.mirror.errors import SchemaRegistryError, SchemaRegistryUnavailableError

    topic = f"avro{uuid.uuid4().hex[:8]}"
    settings = RegistrySettings(url=registry)
    batch = every_type_batch()
    list(VersionRows(_options(topic, settings), lambda: [batch], version=1, ts_ms=5).records())
    client = SchemaRegistryClient({"url": registry})
    client.set_compatibility(f"{topic}.changes-value", "BACKWARD")
    retyped = {
        **EVERY_TYPE,
        "fields": [
            {**f, "type": "string"} if f["name"] == "i32" else f
            for f in EVERY_TYPE["fields"]  # int -> string
        ],
    }
    changed = batch.set_column(batch.schema.get_field_index("i32"), "i32", pa.array(["a", None]))
    chunks = VersionRows(_options(topic, settings, retyped), lambda: [changed], version=2, ts_ms=5).records()
    with pytest.raises(SchemaRegistryError) as caught:
        next(chunks)
    err = caught.value
    assert not isinstance(err, SchemaRegistryUnavailableError) and err.exit_code == 2
    assert (err.table, err.version, err.context["subject"]) == (topic, 2, f"{topic}.changes-value")
    assert client.get_versions(f"{topic}.changes-value") == [1]
