"""``watch --row-format avro`` end to end: a real broker, a real Schema Registry, read back with
confluent-kafka's ``AvroDeserializer`` equal to core's change feed.

Marked ``registry`` (and ``kafka``): needs the session's ``schema_registry`` fixture (issue 30 item
4), skipped without one. Never a mock.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from deltamirror.core.changes import read_changes
from deltamirror.core.table import open_table
from support.cdf_tables import cdf_table
from support.watching import watch_until

pytestmark = [pytest.mark.kafka, pytest.mark.registry]


@pytest.fixture
def registry(schema_registry: str) -> str:
    """The session's real registry's Confluent-API URL (tests/support/registry.py)."""
    return schema_registry


def test_watch_publishes_avro_row_changes_equal_to_the_change_feed(
    registry: str, kafka_bootstrap: str, tmp_path: Path, kit: Any
) -> None:
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    path = tmp_path / "t"
    end = cdf_table(path)
    name = kit.unique("avro")
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
        row_changes={"format": "avro", "key_columns": ["id"], "registry": {"url": registry}},
    )
    client = SchemaRegistryClient({"url": registry})
    values, keys = AvroDeserializer(client), AvroDeserializer(client)
    records = [r for r in kit.consume(kafka_bootstrap, [changes], idle_s=0.5) if r.value is not None]
    events = [values(r.value, SerializationContext(changes, MessageField.VALUE)) for r in records]
    for r, e in zip(records, events, strict=True):
        assert keys(r.key, SerializationContext(changes, MessageField.KEY)) == {
            "id": (e["after"] or e["before"])["id"]
        }
    feed = read_changes(open_table(str(path)), starting_version=0, ending_version=end).to_arrow().to_pylist()
    inserted = sorted(
        (row["_commit_version"], row["id"], row["name"]) for row in feed if row["_change_type"] == "insert"
    )
    assert (
        sorted(
            (e["source"]["delta_version"], e["after"]["id"], e["after"]["name"])
            for e in events
            if e["op"] == "c"
        )
        == inserted
    )
    assert sum(e["op"] == "u" for e in events) == sum(
        row["_change_type"] == "update_postimage" for row in feed
    )
