"""docs/avro.md's Spark recipe: Avro row changes read with Spark's ``from_avro`` (spark-avro from Maven
Central) and the schema the registry holds, after the 5-byte Confluent header.

The watcher mirrors a small table (decimal, timestamp, date columns; an insert, an update and a delete
version) with ``format: avro`` to the session's broker and registry (both real). Spark reads the
changes topic in a batch (``spark.read.format("kafka")``), takes the schema id of the records' header,
fetches that schema from the registry with confluent-kafka's client, and applies ``from_avro`` to the
value after its header. Expected: the events are core's change feed of the table, row for row.
"""

from __future__ import annotations

import datetime as dt
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from deltamirror.core.changes import read_changes
from deltamirror.core.table import open_table
from support.cdf_tables import typed_cdf_table
from support.spark import SPARK_AVRO_PACKAGE
from support.watching import watch_until

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.registry]

COLUMNS = ("id", "name", "amount", "ts", "day")  # typed_cdf_table's


def image(row: Any) -> tuple[Any, ...] | None:
    """A row image as comparable values: timestamps as microseconds since the epoch."""
    if row is None:
        return None
    values = row if isinstance(row, dict) else row.asDict()
    ts = values["ts"]
    if isinstance(ts, dt.datetime):
        values["ts"] = (ts - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) // dt.timedelta(microseconds=1)
    return tuple(values[c] for c in COLUMNS)


def test_spark_avro_jar_is_on_the_session_classpath(spark: SparkSession) -> None:
    """The one session resolved spark-avro: its jar is listed, and from_avro's class loads."""
    jars = spark.sparkContext._jsc.sc().listJars()
    names = [str(jars.apply(i)) for i in range(jars.size())]
    group, artifact, version = SPARK_AVRO_PACKAGE.split(":")
    assert any(n.endswith(f"{group}_{artifact}-{version}.jar") for n in names), names
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    # the jars of spark.jars.packages are on the context class loader (py4j's Class.forName does not see them)
    loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
    assert loader.loadClass("org.apache.spark.sql.avro.AvroDataToCatalyst") is not None


def test_from_avro_reads_the_row_changes_as_the_change_feed(
    spark: SparkSession, kafka_bootstrap: str, schema_registry: str, tmp_path: Path
) -> None:
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import from_avro

    started = time.monotonic()
    path = tmp_path / "t"
    end = typed_cdf_table(path)
    uid = uuid.uuid4().hex[:8]
    name = f"sparkavro{uid}"
    changes = f"{name}.t.changes"
    watch_until(
        kafka_bootstrap,
        path,
        f"{name}.t.actions",
        end,
        name,
        snapshot_mode="from-version",
        changes_topic=changes,
        transaction_topic=f"{name}.t.transaction",
        row_changes={"format": "avro", "key_columns": ["id"], "registry": {"url": schema_registry}},
    )

    published = time.monotonic()
    # the recipe of docs/avro.md: a batch read, committed records only, no tombstones; the schema id
    # of the Confluent header (magic byte 0, 4-byte big-endian id), from_avro after the 5 bytes
    records = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", kafka_bootstrap)
        .option("subscribe", changes)
        .option("startingOffsets", "earliest")
        .option("endingOffsets", "latest")
        .option("kafka.isolation.level", "read_committed")
        .load()
        .where(F.col("value").isNotNull())
        .withColumn("schema_id", F.conv(F.hex(F.substring("value", 2, 4)), 16, 10).cast("int"))
    )
    headers = records.select(F.substring("value", 1, 1).alias("magic"), "schema_id").distinct().collect()
    assert {bytes(h["magic"]) for h in headers} == {b"\x00"}
    ids = [h["schema_id"] for h in headers]
    assert len(ids) == 1  # one table whose schema never changed: one value schema
    registry = SchemaRegistryClient({"url": schema_registry})
    events: list[Any] = []
    for schema_id in ids:
        schema = registry.get_schema(schema_id).schema_str
        assert schema is not None
        events += (
            records.where(F.col("schema_id") == schema_id)
            .select(from_avro(F.expr("substring(value, 6)"), schema).alias("e"))
            .select(
                "e.op",
                "e.source.delta_version",
                F.col("e.before").withField("ts", F.unix_micros("e.before.ts")).alias("before"),
                F.col("e.after").withField("ts", F.unix_micros("e.after.ts")).alias("after"),
            )
            .collect()
        )
    print(f"watcher {published - started:.1f}s, Spark {time.monotonic() - published:.1f}s")
    got: Counter[tuple[str, int, tuple[Any, ...] | None]] = Counter()
    for e in events:
        if e["op"] in ("c", "r"):
            got[("insert", e["delta_version"], image(e["after"]))] += 1
        elif e["op"] == "u":
            got[("update_preimage", e["delta_version"], image(e["before"]))] += 1
            got[("update_postimage", e["delta_version"], image(e["after"]))] += 1
        else:
            assert e["op"] == "d", e
            got[("delete", e["delta_version"], image(e["before"]))] += 1

    feed = read_changes(open_table(str(path)), starting_version=0, ending_version=end).to_arrow().to_pylist()
    want = Counter((r["_change_type"], r["_commit_version"], image(r)) for r in feed)
    assert got == want
    assert {v for _, v, _ in want} == set(range(end + 1))
