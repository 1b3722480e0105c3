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
from support.watching import watch_row_changes

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
    actions, changes = f"{name}.actions", f"{name}.changes"
    watch_row_changes(
        kafka_bootstrap,
        path,
        actions,
        end,
        {"format": "protobuf", "key_columns": ["id"], "registry": {"url": schema_registry}},
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


def descriptor_set(schema_str: str) -> bytes:
    """docs/protobuf.md's Spark recipe: the registered schema (the base64 ``FileDescriptorProto``
    confluent-kafka registers) as a binary ``FileDescriptorSet`` with the files it imports, what
    Spark's ``from_protobuf`` takes (``binaryDescriptorSet``, or a file for ``descFilePath``)."""
    import base64

    from confluent_kafka.schema_registry.confluent.type import decimal_pb2, variant_pb2
    from google.protobuf import descriptor_pb2, duration_pb2, empty_pb2, timestamp_pb2
    from google.type import date_pb2, datetime_pb2

    file = descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(schema_str))
    known = {
        m.DESCRIPTOR.name: m.DESCRIPTOR.serialized_pb
        for m in (timestamp_pb2, duration_pb2, empty_pb2, date_pb2, datetime_pb2, decimal_pb2, variant_pb2)
    }
    files = descriptor_pb2.FileDescriptorSet()
    for dependency in file.dependency:  # imported files first
        files.file.add().MergeFromString(known[dependency])
    files.file.append(file)
    return files.SerializeToString()


def test_protobuf_records_read_with_a_descriptor_set_from_the_registry_after_six_bytes(
    schema_registry: str, kafka_bootstrap: str, tmp_path: Path, kit: Any
) -> None:
    """What docs/protobuf.md's Spark recipe gives ``from_protobuf``, checked without Spark (the
    spark-protobuf jar is not served here, see the doc): every record, key and value, is the magic
    byte 0, the 4-byte schema id and the message indexes ``[0]`` as the single byte 0 (Envelope and
    Key are the first messages of their files), then the message; the body after those 6 bytes,
    parsed with nothing but the descriptor set built from the registered schema (a pool of its own,
    no confluent-kafka), is core's change feed of a table with decimal, timestamp and date columns."""
    import datetime as dt
    from decimal import Decimal

    from confluent_kafka.schema_registry import SchemaRegistryClient
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    from support.cdf_tables import typed_cdf_table

    path = tmp_path / "t"
    row_changes = {"format": "protobuf", "key_columns": ["id"], "registry": {"url": schema_registry}}
    actions, end = f"{kit.unique('pbdesc')}.actions", typed_cdf_table(path)
    changes = watch_row_changes(kafka_bootstrap, path, actions, end, row_changes)
    records = [r for r in kit.consume(kafka_bootstrap, [changes], idle_s=0.5) if r.value is not None]
    assert records
    for r in records:
        for data in (r.key, r.value):
            assert data[:1] == b"\x00" and data[5:6] == b"\x00", data[:8]
    client = SchemaRegistryClient({"url": schema_registry})

    def message_class(data: bytes, message: str) -> Any:
        schema_str = client.get_schema(int.from_bytes(data[1:5], "big")).schema_str
        assert schema_str is not None
        (tmp_path / f"{message}.desc").write_bytes(descriptor_set(schema_str))  # what Spark would read
        files = descriptor_pb2.FileDescriptorSet.FromString((tmp_path / f"{message}.desc").read_bytes())
        pool = descriptor_pool.DescriptorPool()
        for file in files.file:
            pool.Add(file)
        (package,) = {f.package for f in files.file if f.name.endswith(f"/{message.lower()}.proto")}
        return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.{message}"))

    assert len({r.value[1:5] for r in records}) == 1 and len({r.key[1:5] for r in records}) == 1
    envelope, key = message_class(records[0].value, "Envelope"), message_class(records[0].key, "Key")

    def image(row: Any) -> tuple[Any, ...]:
        amount = Decimal(int.from_bytes(row.amount.value, "big", signed=True)).scaleb(-row.amount.scale)
        ts = row.ts.seconds * 1_000_000 + row.ts.nanos // 1000
        day = dt.date(row.day.year, row.day.month, row.day.day)
        return (row.id, row.name if row.HasField("name") else None, amount, ts, day)

    got: list[tuple[Any, ...]] = []
    for r in records:
        e = envelope.FromString(r.value[6:])
        assert key.FromString(r.key[6:]).id == (e.after if e.HasField("after") else e.before).id
        version = e.source.delta_version
        if e.op in ("c", "r"):
            got.append(("insert", version, image(e.after)))
        elif e.op == "u":
            got += [
                ("update_preimage", version, image(e.before)),
                ("update_postimage", version, image(e.after)),
            ]
        else:
            assert e.op == "d", e
            got.append(("delete", version, image(e.before)))
    epoch = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
    want = [
        (
            row["_change_type"],
            row["_commit_version"],
            (
                row["id"],
                row["name"],
                row["amount"],
                (row["ts"] - epoch) // dt.timedelta(microseconds=1),
                row["day"],
            ),
        )
        for row in read_changes(open_table(str(path)), starting_version=0, ending_version=end)
        .to_arrow()
        .to_pylist()
    ]
    assert sorted(got, key=repr) == sorted(want, key=repr)
    assert {v for _, v, _ in want} == set(range(end + 1))
