"""The ``protobuf`` format against a real Schema Registry (Apicurio Registry 2.4.2, the session's
``schema_registry`` fixture): the Confluent wire format, the subjects of each strategy, a new schema
version, refusals; read back with confluent-kafka's own ``ProtobufDeserializer``. Never a mock.
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
from support.protobuf_rows import row

pytestmark = pytest.mark.registry


def _options(
    topic: str, settings: RegistrySettings, schema: dict[str, Any] = EVERY_TYPE
) -> RowChangesOptions:
    return RowChangesOptions(
        f"{topic}.changes",
        f"{topic}.transaction",
        topic,
        "tid",
        key_columns=("id",),
        format="protobuf",
        table_schema=parse_schema(json.dumps(schema)),
        registry=settings,
    )


def _wider(batch: pa.RecordBatch) -> tuple[dict[str, Any], pa.RecordBatch]:
    added = {
        **EVERY_TYPE,
        "fields": [
            *EVERY_TYPE["fields"],
            {"name": "extra", "type": "string", "nullable": True, "metadata": {}},
        ],
    }
    return added, batch.append_column("extra", pa.array(["x", None]))


@pytest.mark.parametrize(
    ("subject_name_strategy", "subjects"),
    [
        ("topic", ["{t}.changes-key", "{t}.changes-value"]),
        ("record", ["{ns}.Envelope", "{ns}.Key"]),
        ("topic-record", ["{t}.changes-{ns}.Envelope", "{t}.changes-{ns}.Key"]),
    ],
)
def test_records_are_the_confluent_wire_format_under_each_subject_strategy_and_read_back(
    schema_registry: str, subject_name_strategy: str, subjects: list[str]
) -> None:
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    topic = f"pb{uuid.uuid4().hex[:8]}"
    settings = RegistrySettings(url=schema_registry, subject_name_strategy=subject_name_strategy)  # type: ignore[arg-type]
    batch = every_type_batch()
    rows = VersionRows(_options(topic, settings), lambda: [batch], version=3, ts_ms=5)
    changes = [r for chunk in rows.records() for r in chunk if r.topic == f"{topic}.changes"]
    assert len(changes) == 2
    client = SchemaRegistryClient({"url": schema_registry})
    ns = f"{topic}.changes"
    assert sorted(s for s in client.get_subjects() if topic in s) == sorted(
        s.format(t=topic, ns=ns) for s in subjects
    )
    s = rows.encoder(batch.schema).serializer
    values = ProtobufDeserializer(s.envelope_class, {}, client)  # type: ignore[attr-defined]
    keys = ProtobufDeserializer(s.key_class, {}, client)  # type: ignore[attr-defined]
    events = []
    for r in changes:
        assert r.value[:1] == b"\x00" and r.value[5:6] == b"\x00"  # magic byte, schema id, index [0]
        event = values(r.value, SerializationContext(r.topic, MessageField.VALUE))
        key = keys(r.key, SerializationContext(r.topic, MessageField.KEY))
        assert key.id == (event.after if event.HasField("after") else event.before).id
        assert event.source.delta_version == 3 and event.transaction.id == "tid:3"
        events.append(event)
    schema = parse_schema(json.dumps(EVERY_TYPE))
    inserted = row(events[0].after, schema)
    assert events[0].op == "c" and not events[0].HasField("before")
    assert inserted["dec"] == ROW["dec"] and math.isnan(inserted["f64"]) and inserted["ts"] == ROW["ts"]
    assert inserted["ntz"] == ROW["ntz"] and inserted["st"] == ROW["st"]
    assert events[1].op == "d" and not events[1].HasField("after") and events[1].before.id == 2


def test_a_new_column_registers_a_new_schema_version_and_an_unchanged_version_none(
    schema_registry: str,
) -> None:
    from confluent_kafka.schema_registry import SchemaRegistryClient

    topic = f"pb{uuid.uuid4().hex[:8]}"
    settings = RegistrySettings(url=schema_registry)
    batch = every_type_batch()
    for version in (1, 2):  # the same schema twice: one version of the subject
        list(VersionRows(_options(topic, settings), lambda: [batch], version=version, ts_ms=5).records())
    client = SchemaRegistryClient({"url": schema_registry})
    assert client.get_versions(f"{topic}.changes-value") == [1]
    added, wider = _wider(batch)
    list(VersionRows(_options(topic, settings, added), lambda: [wider], version=3, ts_ms=5).records())
    assert client.get_versions(f"{topic}.changes-value") == [1, 2]
    assert client.get_versions(f"{topic}.changes-key") == [1]  # the key did not change


def test_a_subject_not_registered_is_refused_with_auto_register_off_before_any_record(
    schema_registry: str,
) -> None:
    from deltamirror.mirror.errors import SchemaRegistryError, SchemaRegistryUnavailableError

    topic = f"pb{uuid.uuid4().hex[:8]}"
    settings = RegistrySettings(url=schema_registry, auto_register=False)
    chunks = VersionRows(
        _options(topic, settings), lambda: [every_type_batch()], version=2, ts_ms=5
    ).records()
    with pytest.raises(SchemaRegistryError) as caught:
        next(chunks)
    err = caught.value
    assert not isinstance(err, SchemaRegistryUnavailableError) and err.exit_code == 2
    assert (err.table, err.version) == (topic, 2)
    assert err.context["subject"] in (f"{topic}.changes-key", f"{topic}.changes-value")


def test_apicurio_cannot_check_the_compatibility_of_a_protobuf_version_it_answers_500(
    schema_registry: str,
) -> None:
    """What Apicurio Registry 2.4.2's ccompat API answers once a subject has a compatibility level:
    it stores confluent-kafka's schema (the base64 ``FileDescriptorProto``) but parses the stored
    versions as .proto text to compare them, and fails with HTTP 500 on any new version, compatible
    or not. deltamirror reports it as the registry failing (exit 1, retry), naming the subject,
    before anything of the version. A registry that checks it (Confluent's) refuses an
    incompatible version with 409: SchemaRegistryError, exit 2, as for Avro."""
    from confluent_kafka.schema_registry import SchemaRegistryClient

    from deltamirror.mirror.errors import SchemaRegistryUnavailableError

    topic = f"pb{uuid.uuid4().hex[:8]}"
    settings = RegistrySettings(url=schema_registry)
    batch = every_type_batch()
    list(VersionRows(_options(topic, settings), lambda: [batch], version=1, ts_ms=5).records())
    client = SchemaRegistryClient({"url": schema_registry})
    client.set_compatibility(f"{topic}.changes-value", "BACKWARD")
    added, wider = _wider(batch)  # compatible: a new optional field
    chunks = VersionRows(_options(topic, settings, added), lambda: [wider], version=2, ts_ms=5).records()
    with pytest.raises(SchemaRegistryUnavailableError) as caught:
        next(chunks)
    err = caught.value
    assert (err.table, err.version, err.context["subject"]) == (topic, 2, f"{topic}.changes-value")
    assert "HTTP 500" in err.message and "Syntax error" in err.message
    assert client.get_versions(f"{topic}.changes-value") == [1]
