"""Kafka Connect as the consumer of Avro row changes: a standalone worker with Apicurio Registry's
AvroConverter (keys and values) and connect-file's sink reads what the watcher published.

Real broker, real registry, the worker's own jars from Maven Central (tests/support/connect_avro.py).
Expected: the sink writes one line per record, and the records it converted are, by operation,
version and row, the events confluent-kafka's AvroDeserializer reads (which test_avro_kafka.py checks
against core's change feed).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from support.cdf_tables import typed_cdf_table
from support.connect_avro import file_sink_lines
from support.watching import watch_row_changes

pytestmark = [pytest.mark.kafka, pytest.mark.registry, pytest.mark.slow]


def connect_fields(struct: str) -> dict[str, str]:
    """The top-level fields of Connect's ``Struct{a=1,b=Struct{...},...}`` text (nested ones kept whole)."""
    assert struct.startswith("Struct{") and struct.endswith("}"), struct
    fields, depth, start = {}, 0, len("Struct{")
    for i, ch in enumerate(struct[start:-1], start):
        depth += ch == "{"
        depth -= ch == "}"
        if ch == "," and depth == 0:
            name, _, value = struct[start:i].partition("=")
            fields[name] = value
            start = i + 1
    name, _, value = struct[start:-1].partition("=")
    fields[name] = value
    return fields


def test_connect_avro_converter_reads_the_row_changes(
    schema_registry: str, kafka_bootstrap: str, tmp_path: Path, kit: Any
) -> None:
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    path = tmp_path / "t"
    row_changes = {"format": "avro", "key_columns": ["id"], "registry": {"url": schema_registry}}
    actions = f"{kit.unique('connect')}.actions"
    changes = watch_row_changes(kafka_bootstrap, path, actions, typed_cdf_table(path), row_changes)
    records = kit.consume(kafka_bootstrap, [changes], idle_s=0.5)
    values = AvroDeserializer(SchemaRegistryClient({"url": schema_registry}))
    events = [
        None if r.value is None else values(r.value, SerializationContext(changes, MessageField.VALUE))
        for r in records
    ]

    started = time.monotonic()
    lines = file_sink_lines(kafka_bootstrap, schema_registry, changes, len(records), tmp_path / "connect")
    print(f"Connect worker: {time.monotonic() - started:.1f}s for {len(records)} records")

    assert len(lines) == len(records)
    got, want = [], []
    for line, event in zip(lines, events, strict=True):
        if event is None:  # a tombstone: the sink writes the null value
            assert line == "null"
            continue
        fields = connect_fields(line)
        source = connect_fields(fields["source"])
        row = event["after"] or event["before"]
        image = connect_fields(fields["after"] if event["after"] else fields["before"])
        got.append((fields["op"], int(source["delta_version"]), int(image["id"]), image.get("name")))
        want.append((event["op"], event["source"]["delta_version"], row["id"], row["name"]))
        # a decimal is Connect's Decimal (java.math.BigDecimal), exactly the Avro value
        assert image["amount"] == str(row["amount"])
    assert got == want
    assert {op for op, *_ in got} == {"c", "u", "d"}
