"""``watch`` with ``row_changes.format: protobuf`` end to end: a real broker, a real Schema
Registry, read back with confluent-kafka's ``ProtobufDeserializer`` equal to core's change feed.
Marked ``registry`` and ``kafka``. Never a mock."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from deltamirror.core.changes import read_changes
from deltamirror.core.table import open_table
from support.cdf_tables import cdf_table
from support.watching import watch_until

pytestmark = [pytest.mark.kafka, pytest.mark.registry]


def test_watch_publishes_protobuf_row_changes_equal_to_the_change_feed(
    schema_registry: str, kafka_bootstrap: str, tmp_path: Path, kit: Any
) -> None:
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    path = tmp_path / "t"
    end = cdf_table(path)
    name = kit.unique("pb")
    actions, changes, txn = f"{name}.actions", f"{name}.changes", f"{name}.transaction"
    watch_until(
        kafka_bootstrap,
        path,
        actions,
        end,
        kit.unique("dm"),
        snapshot_mode="from-version",
        changes_topic=changes,
        transaction_topic=txn,
        row_changes={"format": "protobuf", "key_columns": ["id"], "registry": {"url": schema_registry}},
    )
    table = open_table(str(path))
    feed = read_changes(table, starting_version=0, ending_version=end).to_arrow()
    client = SchemaRegistryClient({"url": schema_registry})
    records = [r for r in kit.consume(kafka_bootstrap, [changes], idle_s=0.5) if r.value is not None]
    # a consumer without deltamirror: the message classes from the registered schemas (docs/protobuf.md)
    values = ProtobufDeserializer(message_class(client, records[0].value, "Envelope"), {}, client)
    keys = ProtobufDeserializer(message_class(client, records[0].key, "Key"), {}, client)
    events = [values(r.value, SerializationContext(changes, MessageField.VALUE)) for r in records]
    for r, e in zip(records, events, strict=True):
        assert (
            keys(r.key, SerializationContext(changes, MessageField.KEY)).id
            == (e.after if e.HasField("after") else e.before).id
        )
    rows = feed.to_pylist()
    inserted = sorted(
        (row["_commit_version"], row["id"], row["name"]) for row in rows if row["_change_type"] == "insert"
    )
    assert (
        sorted((e.source.delta_version, e.after.id, e.after.name) for e in events if e.op == "c") == inserted
    )
    assert sum(e.op == "u" for e in events) == sum(row["_change_type"] == "update_postimage" for row in rows)
    deleted = sorted((row["_commit_version"], row["id"]) for row in rows if row["_change_type"] == "delete")
    assert sorted((e.source.delta_version, e.before.id) for e in events if e.op == "d") == deleted


def message_class(client: Any, record: bytes, name: str) -> Any:
    """The message ``name`` of the schema a record was written with (docs/protobuf.md's recipe)."""
    import base64

    from confluent_kafka.schema_registry.confluent.type import decimal_pb2, variant_pb2
    from google.protobuf import (
        descriptor_pb2,
        descriptor_pool,
        duration_pb2,
        empty_pb2,
        message_factory,
        timestamp_pb2,
    )
    from google.type import date_pb2, datetime_pb2

    schema = client.get_schema(int.from_bytes(record[1:5], "big"))
    file = descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(schema.schema_str))
    pool = descriptor_pool.DescriptorPool()
    for known in (timestamp_pb2, duration_pb2, empty_pb2, date_pb2, datetime_pb2, decimal_pb2, variant_pb2):
        pool.AddSerializedFile(known.DESCRIPTOR.serialized_pb)
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{file.package}.{name}"))
