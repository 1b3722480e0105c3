"""docs/spark.md's recipe: Spark's own Kafka source (spark-sql-kafka from Maven Central) with
``from_json`` and the shipped DDL (deltamirror.mirror.records.spark_ddl) reads what the watcher published.

The watcher mirrors a table with row changes on (plain JSON, key ``id``) to the session's broker;
Spark reads the actions, changes and transaction topics with ``format("kafka")`` and
``trigger(availableNow=True)``. Expected: the actions are the commit files' lines; the change events
are the table's expected change feed (tests/data/expected/cdf) paired by the documented rule.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter, defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from deltamirror.mirror.records.spark_ddl import (
    ACTIONS_DDL,
    ADD_ACTION_DDL,
    TRANSACTION_DDL,
    row_changes_ddl,
    row_changes_key_ddl,
)
from support.row_change_expectations import Event, expected_events, table_columns, text
from support.watching import watch_until

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

DATA = Path(__file__).resolve().parents[2] / "data"
TABLE = DATA / "tables" / "krs__cdf-table-non-partitioned"
EXPECTED = DATA / "expected" / "cdf" / "krs__cdf-table-non-partitioned__cdf_non_partitioned__0-latest.json"
LAST_VERSION = 4

pytestmark = pytest.mark.spark


def commit_lines(version: int) -> list[dict[str, Any]]:
    text_ = (TABLE / "_delta_log" / f"{version:020d}.json").read_text()
    return [json.loads(line) for line in text_.splitlines() if line.strip()]


def schema_string() -> str:
    (meta,) = [a["metaData"] for a in commit_lines(0) if "metaData" in a]
    return str(meta["schemaString"])


def read_all(spark: SparkSession, bootstrap: str, topic: str, select: list[Any], name: str) -> DataFrame:
    """The recipe: a Kafka stream of ``topic`` parsed with from_json, everything available now."""
    from pyspark.sql import functions as F

    stream = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("kafka.isolation.level", "read_committed")  # only committed transactions
        .load()
        .select(F.col("key").cast("string").alias("key"), F.col("value").cast("string").alias("value"))
        .select(*select)
    )
    query = stream.writeStream.format("memory").queryName(name).trigger(availableNow=True).start()
    try:
        query.awaitTermination(180)
        assert query.exception() is None, query.exception()
    finally:
        query.stop()
    return spark.table(name)


@pytest.fixture(scope="module")
def topics(kafka_bootstrap: str) -> dict[str, str]:
    uid = uuid.uuid4().hex[:8]
    names = {kind: f"spark{uid}.t.{kind}" for kind in ("actions", "commits", "changes", "transaction")}
    watch_until(
        kafka_bootstrap,
        TABLE,
        names["actions"],
        LAST_VERSION,
        f"spark{uid}",
        snapshot_mode="from-version",
        from_version=0,
        changes_topic=names["changes"],
        transaction_topic=names["transaction"],
        row_changes={"key_columns": ["id"], "format": "json"},
    )
    return names


@pytest.mark.kafka
def test_actions_topic_with_from_json(
    spark: SparkSession, kafka_bootstrap: str, topics: dict[str, str]
) -> None:
    from pyspark.sql import functions as F

    events = read_all(
        spark,
        kafka_bootstrap,
        topics["actions"],
        [F.from_json("value", ACTIONS_DDL).alias("e")],
        "dm_recipe_actions",
    )
    rows = events.select(
        "e.version",
        "e.index",
        "e.count",
        "e.type",
        "e.commitTimestamp",
        "e.action",
        F.from_json("e.action", ADD_ACTION_DDL).alias("add"),
    ).collect()
    want = {
        (v, i, next(iter(line))): line[next(iter(line))]
        for v in range(LAST_VERSION + 1)
        for i, line in enumerate(commit_lines(v))
    }
    got = {(r["version"], r["index"], r["type"]): json.loads(r["action"]) for r in rows}
    assert got == want
    assert all(r["count"] == len(commit_lines(r["version"])) and r["commitTimestamp"] > 0 for r in rows)
    adds = sorted((r["version"], r["add"]["path"], r["add"]["size"]) for r in rows if r["type"] == "add")
    assert adds == sorted((v, a["path"], a["size"]) for (v, _, t), a in want.items() if t == "add")
    assert adds


@pytest.mark.kafka
def test_changes_topic_with_from_json(
    spark: SparkSession, kafka_bootstrap: str, topics: dict[str, str]
) -> None:
    from pyspark.sql import functions as F

    schema = schema_string()
    changes = read_all(
        spark,
        kafka_bootstrap,
        topics["changes"],
        [
            F.from_json("key", row_changes_key_ddl(schema, ["id"])).alias("k"),
            F.from_json("value", row_changes_ddl(schema)).alias("e"),
        ],
        "dm_recipe_changes",
    ).select(
        "k.id",
        "e.op",
        "e.source.delta_version",
        "e.ts_ms",
        # dates travel as days since the epoch, timestamps as microseconds (timestamp_micros)
        F.col("e.before").withField("birthday", F.date_from_unix_date("e.before.birthday")).alias("before"),
        F.col("e.after").withField("birthday", F.date_from_unix_date("e.after.birthday")).alias("after"),
    )
    expected = json.loads(EXPECTED.read_text())
    columns = table_columns(expected)

    def image(row: Any) -> tuple[str | None, ...] | None:
        return None if row is None else tuple(text(row[c]) for c in columns)

    got: Counter[Event] = Counter()
    for r in changes.collect():
        got[(r["op"], image(r["before"]), image(r["after"]), r["delta_version"])] += 1
        assert r["id"] == (r["after"] or r["before"])["id"]
        assert r["ts_ms"] > 0
    assert got == expected_events(expected, ["id"])

    txn = read_all(
        spark,
        kafka_bootstrap,
        topics["transaction"],
        [F.from_json("value", TRANSACTION_DDL).alias("t")],
        "dm_recipe_transaction",
    ).select("t.*")
    per_version = Counter(v for (_, _, _, v), n in got.items() for _ in range(n))
    statuses: dict[str, list[str]] = defaultdict(list)
    for r in txn.collect():
        statuses[r["id"]].append(r["status"])
        if r["status"] == "END":
            version = int(r["id"].rsplit(":", 1)[1])
            assert r["event_count"] == per_version[version]
            assert [(d["data_collection"], d["event_count"]) for d in r["data_collections"]] == [
                (topics["changes"], per_version[version])
            ]
    assert sorted(statuses.values()) == [["BEGIN", "END"]] * len(per_version)


TYPES_SCHEMA = json.dumps(
    {
        "type": "struct",
        "fields": [
            {"name": n, "type": t, "nullable": True, "metadata": {}}
            for n, t in [
                ("i8", "byte"),
                ("i16", "short"),
                ("i64", "long"),
                ("f32", "float"),
                ("f64", "double"),
                ("b", "boolean"),
                ("s", "string"),
                ("bin", "binary"),
                ("dec", "decimal(10,2)"),
                ("d", "date"),
                ("ts", "timestamp"),
                ("ts_ntz", "timestamp_ntz"),
                (
                    "st",
                    {
                        "type": "struct",
                        "fields": [{"name": "a`b", "type": "integer", "nullable": True, "metadata": {}}],
                    },
                ),
                ("l", {"type": "array", "elementType": "long", "containsNull": True}),
                ("m", {"type": "map", "keyType": "string", "valueType": "long", "valueContainsNull": True}),
                (
                    "mi",
                    {"type": "map", "keyType": "integer", "valueType": "string", "valueContainsNull": True},
                ),
            ]
        ],
    }
)


def test_row_changes_ddl_reads_every_type(spark: SparkSession) -> None:
    """Plain JSON records of every column type, as the encoder writes them, parse with the DDL exactly."""
    import datetime as dt
    import math
    from decimal import Decimal

    import pyarrow as pa
    from pyspark.sql import functions as F

    from deltamirror.core.schema import parse_schema, to_arrow_schema
    from deltamirror.mirror.records.row_changes import RowChangesOptions, VersionRows

    arrow = to_arrow_schema(parse_schema(TYPES_SCHEMA)).append(pa.field("_change_type", pa.string()))
    row = {
        "i8": -1,
        "i16": 300,
        "i64": 2**40,
        "f32": float("inf"),
        "f64": float("nan"),
        "b": True,
        "s": 'é"\n',
        "bin": b"\x00\xff",
        "dec": Decimal("-12.30"),
        "d": dt.date(1969, 12, 31),
        "ts": dt.datetime(2024, 1, 2, 3, 4, 5, 678901, tzinfo=dt.UTC),
        "ts_ntz": dt.datetime(1960, 1, 1, 0, 0, 0, 1),
        "st": {"a`b": 1},
        "l": [1, None],
        "m": [("k", 1)],
        "mi": [(1, "a")],
        "_change_type": "insert",
    }
    options = RowChangesOptions(
        changes_topic="t.changes", transaction_topic="t.transaction", table_name="t", table_id="x"
    )
    batch = pa.RecordBatch.from_pylist([row], schema=arrow)
    records = VersionRows(options, lambda: [batch], version=0, ts_ms=1).records()
    (value,) = [r.value for chunk in records for r in chunk if r.topic == "t.changes"]
    assert value is not None
    parsed = (
        spark.createDataFrame([(value.decode(),)], "value STRING")
        .select(F.from_json("value", row_changes_ddl(TYPES_SCHEMA)).alias("e"))
        .select(
            "e.after.*",
            F.date_from_unix_date("e.after.d").alias("date"),
            F.unix_micros(F.timestamp_micros("e.after.ts")).alias("ts_again"),
        )
        .collect()[0]
        .asDict(recursive=True)
    )
    assert math.isnan(parsed.pop("f64")) and parsed.pop("f32") == math.inf
    assert parsed == {
        "i8": -1,
        "i16": 300,
        "i64": 2**40,
        "b": True,
        "s": 'é"\n',
        "bin": bytearray(b"\x00\xff"),
        "dec": Decimal("-12.30"),
        "d": -1,
        "ts": 1704164645678901,
        "ts_ntz": -315619199999999,
        "st": {"a`b": 1},
        "l": [1, None],
        "m": {"k": 1},
        "mi": [["1", "a"]],
        "date": dt.date(1969, 12, 31),
        "ts_again": 1704164645678901,
    }
