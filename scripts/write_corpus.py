#!/usr/bin/env python3
"""Write the writers' corpus: small Delta tables written by delta-spark and by delta-rs, with what
each writer's own reader reads from them.

    python scripts/write_corpus.py OUT_DIR [--only NAME ...] [--writer spark|delta-rs]

OUT_DIR/tables/<writer>__<name>/ holds each table; OUT_DIR/expected/<writer>__<name>.json what the
writer's own reader reads: the rows and file count at every version, the history (version and
operation), and the change data feed over the versions where it is on. OUT_DIR/index.json says
what each table covers and which writer (and version) wrote it, and lists what a writer could not
produce (with the writer's own error). Everything written under a fixed root
(:data:`WRITE_ROOT`) and then moved to OUT_DIR, so that the absolute paths a shallow clone's log
names are the same on every machine that reads the corpus (see ``tests/support/corpus.py``).

Rows are normalized to JSON (decimals as strings, timestamps as UTC epoch microseconds, dates as ISO
text, binary as hex); the change feed leaves out ``_commit_timestamp`` (delta-spark takes it from a
commit file's modification time unless In-Commit Timestamps are on, which a copy does not keep).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "tests"))

from support.corpus import WRITE_ROOT, normal_rows  # noqa: E402

# --- a table and what it covers --------------------------------------------------------------------


@dataclass
class Written:
    name: str
    writer: str
    covers: list[str]
    cdf_from: int | None = None  # first version of the change feed to compare (None: CDF off)
    notes: str = ""
    marks: dict[str, int] = field(default_factory=dict)
    row_ids: bool = False  # also record delta-spark's _metadata.row_id / row_commit_version per version


@dataclass
class Corpus:
    out: Path
    versions: dict[str, str]
    tables: list[dict[str, Any]] = field(default_factory=list)
    not_produced: list[dict[str, str]] = field(default_factory=list)
    only: frozenset[str] = frozenset()

    def refused(self, writer: str, artifact: str, exc: BaseException) -> None:
        first = next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        self.not_produced.append({"writer": writer, "artifact": artifact, "error": first[:400]})
        print(f"not produced by {writer}: {artifact}: {first[:200]}", file=sys.stderr)


def _latest(path: Path) -> int:
    return max(int(p.name[:20]) for p in (path / "_delta_log").glob("*.json") if p.name[:20].isdigit())


def _log_facts(path: Path) -> dict[str, Any]:
    """What the log holds, as read from its files (for the index)."""
    log = path / "_delta_log"
    names = sorted(p.name for p in log.iterdir())
    facts: dict[str, Any] = {
        "commits": sum(1 for n in names if n.endswith(".json") and n[:20].isdigit() and len(n) == 25),
        "checkpoints": sorted(
            {n.split(".checkpoint")[0].lstrip("0") or "0" for n in names if ".checkpoint" in n}
        ),
        "multipart_checkpoint": any(".checkpoint.0000000001." in n for n in names),
        "v2_checkpoint": any(
            ".checkpoint." in n and n.split(".checkpoint.")[1].count(".") == 1 and "-" in n for n in names
        ),
        "sidecars": (log / "_sidecars").is_dir() and any((log / "_sidecars").iterdir()),
        "compacted": [n for n in names if n.endswith(".compacted.json")],
    }
    operations: list[str] = []
    features: set[str] = set()
    ict = False
    for name in names:
        if not (name.endswith(".json") and len(name) == 25):
            continue
        for line in (log / name).read_text().splitlines():
            action = json.loads(line) if line.strip() else {}
            if "commitInfo" in action:
                operations.append(action["commitInfo"].get("operation", "?"))
                ict = ict or "inCommitTimestamp" in action["commitInfo"]
            if "protocol" in action:
                p = action["protocol"]
                features.update(p.get("readerFeatures") or [])
                features.update(p.get("writerFeatures") or [])
    facts["operations"] = operations
    facts["features"] = sorted(features)
    facts["in_commit_timestamps"] = ict
    return facts


# --- delta-spark ------------------------------------------------------------------------------------


def spark_expected(spark: Any, path: Path, written: Written) -> dict[str, Any]:
    from pyspark.sql import functions as F
    from pyspark.sql.types import BinaryType, TimestampNTZType, TimestampType

    def collect(df: Any) -> list[dict[str, Any]]:
        cols = []
        for f in df.schema.fields:
            c = F.col(f"`{f.name}`")
            if isinstance(f.dataType, TimestampType | TimestampNTZType):
                c = F.unix_micros(c.cast("timestamp") if isinstance(f.dataType, TimestampNTZType) else c)
            elif isinstance(f.dataType, BinaryType):
                c = F.when(c.isNull(), None).otherwise(F.concat(F.lit("0x"), F.lower(F.hex(c))))
            cols.append(c.alias(f.name))
        return normal_rows(r.asDict(recursive=True) for r in df.select(*cols).collect())

    latest = _latest(path)
    history = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").select("version", "operation").collect()
    known = {int(r["version"]) for r in history}
    versions: dict[str, Any] = {}
    for v in range(latest + 1):
        if v not in known:
            continue
        try:
            df = spark.read.format("delta").option("versionAsOf", v).load(str(path))
            rows = collect(df)
            with_ids = (
                collect(df.select("*", "_metadata.row_id", "_metadata.row_commit_version"))
                if written.row_ids
                else None
            )
            detail = spark.sql(f"DESCRIBE DETAIL delta.`{path}`") if v == latest else None
            versions[str(v)] = {
                "rows": rows,
                "columns": [f.name for f in df.schema.fields],
                "num_files": None if detail is None else int(detail.collect()[0]["numFiles"]),
            }
            if with_ids is not None:
                versions[str(v)]["rows_with_row_ids"] = with_ids
        except Exception as exc:  # a version the writer cannot read (files cleaned): recorded as such
            versions[str(v)] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    cdf = None
    if written.cdf_from is not None:
        df = (
            spark.read.format("delta")
            .option("readChangeFeed", "true")
            .option("startingVersion", str(written.cdf_from))
            .option("endingVersion", str(latest))
            .load(str(path))
        )
        cdf = {"start": written.cdf_from, "end": latest, "rows": collect(df.drop("_commit_timestamp"))}
    return {
        "history": sorted(
            ({"version": int(r["version"]), "operation": r["operation"]} for r in history),
            key=lambda h: h["version"],
        ),
        "versions": versions,
        "cdf": cdf,
    }


def spark_tables(spark: Any, root: Path, corpus: Corpus) -> list[tuple[Written, Path]]:
    out: list[tuple[Written, Path]] = []

    def sql(text: str) -> None:
        spark.sql(text)

    def table(name: str, covers: list[str], build: Callable[[str], Written | None]) -> None:
        if corpus.only and name not in corpus.only:
            return
        path = root / f"spark__{name}"
        shutil.rmtree(path, ignore_errors=True)
        try:
            written = build(f"delta.`{path}`")
        except Exception as exc:
            traceback.print_exc()
            corpus.refused("delta-spark", name, exc)
            shutil.rmtree(path, ignore_errors=True)
            return
        if written is not None:
            out.append((written, path))

    cdf = "'delta.enableChangeDataFeed' = 'true'"

    def checkpoint(t: str) -> None:
        """A checkpoint of the table's latest version, as delta-spark's own checkpoint writer makes it."""
        location = t[len("delta.`") : -1]
        spark._jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, location).checkpoint()

    def null_partitions(t: str) -> Written:
        sql(
            f"CREATE TABLE {t} (id INT, v STRING, p STRING) USING delta PARTITIONED BY (p) TBLPROPERTIES ({cdf})"
        )
        sql(f"INSERT INTO {t} VALUES (1, 'a', NULL), (2, 'b', ''), (3, 'c', 'x'), (4, 'd', NULL)")
        sql(f"DELETE FROM {t} WHERE p IS NULL AND id = 1")
        sql(f"UPDATE {t} SET v = 'bb' WHERE p IS NULL")
        sql(f"DELETE FROM {t} WHERE p IS NULL")
        sql(f"INSERT INTO {t} VALUES (5, 'e', NULL)")
        sql(
            f"MERGE INTO {t} AS x USING (SELECT 5 AS id, 'ee' AS v, CAST(NULL AS STRING) AS p) AS s "
            "ON x.id = s.id WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"
        )
        return Written(
            "null_partitions",
            "delta-spark",
            [
                "NULL and empty-string partition values on add, remove and cdc",
                "remove with partitionValues {} after DELETE WHERE p IS NULL",
                "DELETE",
                "UPDATE",
                "MERGE",
                "CDF on",
            ],
            cdf_from=0,
        )

    table("null_partitions", [], null_partitions)

    def null_partitions_dv(t: str) -> Written:
        sql(
            f"CREATE TABLE {t} (id INT, v STRING, p STRING) USING delta PARTITIONED BY (p) "
            f"TBLPROPERTIES ({cdf}, 'delta.enableDeletionVectors' = 'true')"
        )
        sql(
            f"INSERT INTO {t} SELECT * FROM VALUES (1, 'a', NULL), (2, 'b', NULL), (3, 'c', 'x'), (4, 'd', 'x') AS s(id, v, p)"
        )
        sql(f"DELETE FROM {t} WHERE id = 1")
        sql(f"UPDATE {t} SET v = 'bb' WHERE id = 2")
        sql(f"DELETE FROM {t} WHERE p IS NULL")
        return Written(
            "null_partitions_dv",
            "delta-spark",
            [
                "NULL partition values with deletion vectors (add re-written with its DV)",
                "DELETE",
                "UPDATE",
                "CDF on",
            ],
            cdf_from=0,
        )

    table("null_partitions_dv", [], null_partitions_dv)

    def partition_types(t: str) -> Written:
        sql(
            f"CREATE TABLE {t} (id INT, s STRING, i INT, l BIGINT, sh SMALLINT, b TINYINT, bo BOOLEAN, d DATE, "
            "ts TIMESTAMP, tsn TIMESTAMP_NTZ, dec DECIMAL(10,2), f FLOAT, db DOUBLE) USING delta "
            "PARTITIONED BY (s, i, l, sh, b, bo, d, ts, tsn, dec, f, db) "
            f"TBLPROPERTIES ({cdf})"
        )
        sql(
            f"INSERT INTO {t} VALUES "
            "(1, 'a b/c=d%', -1, 9223372036854775807, -32768, -128, true, DATE'2024-02-29', "
            "TIMESTAMP'2024-01-02 03:04:05.123456', TIMESTAMP_NTZ'2024-01-02 03:04:05.5', 12345678.91, 1.5, -2.25), "
            "(2, '', 0, 0, 0, 0, false, DATE'1970-01-01', TIMESTAMP'1970-01-01 00:00:00', "
            "TIMESTAMP_NTZ'1970-01-01 00:00:00', 0.00, 0.0, -0.0), "
            "(3, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)"
        )
        sql(f"UPDATE {t} SET id = id + 10 WHERE i IS NULL")
        sql(f"DELETE FROM {t} WHERE s IS NULL")
        sql(f"DELETE FROM {t} WHERE i = 0")
        return Written(
            "partition_types",
            "delta-spark",
            [
                "partition columns of every type (string, int, long, short, byte, boolean, date, timestamp, "
                "timestamp_ntz, decimal, float, double), NULL in each",
                "UPDATE",
                "DELETE",
                "CDF on",
            ],
            cdf_from=0,
        )

    table("partition_types", [], partition_types)

    def binary_partition(t: str) -> Written:
        sql(f"CREATE TABLE {t} (id INT, bin BINARY) USING delta PARTITIONED BY (bin)")
        sql(f"INSERT INTO {t} VALUES (1, X'616263'), (2, NULL), (3, X'')")
        return Written("binary_partition", "delta-spark", ["binary partition column"], cdf_from=None)

    table("binary_partition", [], binary_partition)

    def dml(t: str) -> Written:
        sql(
            f"CREATE TABLE {t} (id BIGINT, name STRING, amount DECIMAL(10,2), part STRING) USING delta "
            f"PARTITIONED BY (part) TBLPROPERTIES ({cdf}, 'delta.checkpointInterval' = '4')"
        )
        sql(f"INSERT INTO {t} VALUES (1, 'a', 1.10, 'x'), (2, 'b', 2.20, 'y'), (3, 'c', 3.30, 'x')")
        sql(f"INSERT INTO {t} VALUES (4, 'd', 4.40, 'y')")
        sql(f"UPDATE {t} SET amount = amount * 2 WHERE id IN (1, 4)")
        sql(f"DELETE FROM {t} WHERE id = 2")
        sql(
            f"MERGE INTO {t} AS x USING (SELECT * FROM VALUES (3L, 'c2', 3.33BD, 'x'), (5L, 'e', 5.50BD, 'z') "
            "AS s(id, name, amount, part)) AS s ON x.id = s.id "
            "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"
        )
        sql(f"OPTIMIZE {t} ZORDER BY (id)")
        sql(f"INSERT OVERWRITE {t} VALUES (6, 'f', 6.60, 'x')")
        sql(f"INSERT INTO {t} VALUES (7, 'g', 7.70, 'y')")
        sql(f"RESTORE TABLE {t} TO VERSION AS OF 5")
        sql(f"INSERT INTO {t} VALUES (8, 'h', 8.80, NULL)")
        return Written(
            "dml",
            "delta-spark",
            [
                "WRITE append",
                "WRITE overwrite",
                "UPDATE",
                "DELETE",
                "MERGE",
                "OPTIMIZE ZORDER BY",
                "RESTORE",
                "V1 checkpoints (checkpointInterval 4)",
                "CDF on",
                "ICT off",
            ],
            cdf_from=0,
        )

    table("dml", [], dml)

    def dv_row_tracking(t: str) -> Written:
        sql(
            f"CREATE TABLE {t} (id BIGINT, name STRING, part STRING) USING delta PARTITIONED BY (part) "
            f"TBLPROPERTIES ({cdf}, 'delta.enableDeletionVectors' = 'true', 'delta.enableRowTracking' = 'true', "
            "'delta.enableInCommitTimestamps' = 'true', 'delta.checkpointPolicy' = 'v2', "
            "'delta.checkpointInterval' = '3')"
        )
        sql(
            f"INSERT INTO {t} SELECT * FROM VALUES (1L, 'a', 'x'), (2L, 'b', 'x'), (3L, 'c', 'y'), (4L, 'd', 'y') AS s(id, name, part)"
        )
        sql(f"DELETE FROM {t} WHERE id = 1")
        sql(f"UPDATE {t} SET name = 'cc' WHERE id = 3")
        sql(
            f"MERGE INTO {t} AS x USING (SELECT * FROM VALUES (2L, 'b2', 'x'), (9L, 'i', NULL) AS s(id, name, part)) AS s "
            "ON x.id = s.id WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"
        )
        sql(f"OPTIMIZE {t}")
        sql(f"DELETE FROM {t} WHERE id = 4")
        sql(f"INSERT INTO {t} VALUES (10, 'j', 'x')")
        return Written(
            "dv_row_tracking",
            "delta-spark",
            [
                "deletion vectors",
                "row tracking (baseRowId, defaultRowCommitVersion, domainMetadata)",
                "ICT on",
                "V2 checkpoints (checkpointPolicy v2, interval 3)",
                "DELETE",
                "UPDATE",
                "MERGE",
                "OPTIMIZE",
                "CDF on",
            ],
            cdf_from=0,
        )

    table("dv_row_tracking", [], dv_row_tracking)

    def row_ids(t: str, dvs: bool) -> Written:
        """Row tracking through every kind of rewrite: delta-spark's _metadata.row_id and
        row_commit_version are recorded at every version (the row-id oracle of the change feed)."""
        name = "row_ids_dv" if dvs else "row_ids"
        sql(
            f"CREATE TABLE {t} (id BIGINT, name STRING, part STRING) USING delta PARTITIONED BY (part) "
            f"TBLPROPERTIES ({cdf}, 'delta.enableRowTracking' = 'true', "
            f"'delta.enableDeletionVectors' = '{str(dvs).lower()}')"
        )
        # two files per partition (two inserts), several rows each
        sql(
            f"INSERT INTO {t} SELECT * FROM VALUES (1L, 'a', 'x'), (2L, 'b', 'x'), (3L, 'c', 'x'), "
            "(4L, 'd', 'y'), (5L, 'e', 'y') AS s(id, name, part)"
        )
        sql(
            f"INSERT INTO {t} SELECT * FROM VALUES (6L, 'f', 'x'), (7L, 'g', 'y'), (8L, 'h', 'y') AS s(id, name, part)"
        )
        sql(f"UPDATE {t} SET name = 'bb' WHERE id = 2")
        sql(f"DELETE FROM {t} WHERE id = 4")
        sql(
            f"MERGE INTO {t} AS x USING (SELECT * FROM VALUES (3L, 'c2', 'x'), (5L, NULL, 'y'), (9L, 'i', 'y') "
            "AS s(id, name, part)) AS s ON x.id = s.id "
            "WHEN MATCHED AND s.name IS NULL THEN DELETE "
            "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"
        )
        sql(f"OPTIMIZE {t}")
        sql(f"UPDATE {t} SET name = 'hh' WHERE id = 8")  # a row whose id is materialized by OPTIMIZE
        sql(f"UPDATE {t} SET name = name WHERE id = 6")  # an update that changes no value
        sql(f"DELETE FROM {t} WHERE part = 'y'")  # whole files removed
        sql(f"INSERT INTO {t} VALUES (10, 'j', 'x')")
        return Written(
            name,
            "delta-spark",
            [
                "row tracking with delta-spark's _metadata.row_id and row_commit_version at every version",
                f"deletion vectors {'on' if dvs else 'off'}",
                "WRITE append",
                "UPDATE (before and after OPTIMIZE, and one that changes no value)",
                "DELETE (some rows, whole files)",
                "MERGE (update, delete, insert)",
                "OPTIMIZE",
                "CDF on",
            ],
            cdf_from=0,
            row_ids=True,
        )

    table("row_ids", [], lambda t: row_ids(t, False))
    table("row_ids_dv", [], lambda t: row_ids(t, True))

    def v2_sidecars(t: str) -> Written:
        sql(
            f"CREATE TABLE {t} (id BIGINT, part STRING) USING delta PARTITIONED BY (part) "
            "TBLPROPERTIES ('delta.checkpointPolicy' = 'v2')"
        )
        for i in range(3):
            sql(f"INSERT INTO {t} VALUES ({i}, 'p{i % 2}')")
        spark.conf.set("spark.databricks.delta.checkpointV2.topLevelFileFormat", "json")
        spark.conf.set("spark.databricks.delta.checkpoint.partSize", "1")
        checkpoint(t)
        sql(f"DELETE FROM {t} WHERE id = 0")
        spark.conf.set("spark.databricks.delta.checkpointV2.topLevelFileFormat", "parquet")
        checkpoint(t)
        spark.conf.unset("spark.databricks.delta.checkpointV2.topLevelFileFormat")
        spark.conf.unset("spark.databricks.delta.checkpoint.partSize")
        sql(f"INSERT INTO {t} VALUES (5, NULL)")
        return Written(
            "v2_sidecars",
            "delta-spark",
            [
                "V2 checkpoint, JSON top level with sidecars",
                "V2 checkpoint, parquet top level with sidecars",
                "DELETE",
                "CDF off",
                "ICT off",
            ],
        )

    table("v2_sidecars", [], v2_sidecars)

    def multipart(t: str) -> Written:
        sql(f"CREATE TABLE {t} (id BIGINT, part STRING) USING delta PARTITIONED BY (part)")
        for i in range(4):
            sql(f"INSERT INTO {t} VALUES ({i}, 'p{i}')")
        spark.conf.set("spark.databricks.delta.checkpoint.partSize", "2")
        checkpoint(t)
        spark.conf.unset("spark.databricks.delta.checkpoint.partSize")
        sql(f"DELETE FROM {t} WHERE id = 1")
        return Written("multipart_checkpoint", "delta-spark", ["multi-part V1 checkpoint", "DELETE"])

    table("multipart_checkpoint", [], multipart)

    def column_mapping(t: str) -> Written:
        sql(
            f"CREATE TABLE {t} (id BIGINT, name STRING, extra STRING, part STRING) USING delta PARTITIONED BY (part) "
            "TBLPROPERTIES ('delta.columnMapping.mode' = 'name')"
        )
        sql(f"INSERT INTO {t} VALUES (1, 'a', 'e1', 'x'), (2, 'b', 'e2', NULL)")
        sql(f"ALTER TABLE {t} RENAME COLUMN name TO label")
        sql(f"ALTER TABLE {t} RENAME COLUMN part TO region")
        sql(f"INSERT INTO {t} VALUES (3, 'c', 'e3', 'y')")
        sql(f"ALTER TABLE {t} DROP COLUMN extra")
        sql(f"INSERT INTO {t} VALUES (4, 'd', NULL)")
        sql(f"DELETE FROM {t} WHERE region IS NULL")
        return Written(
            "column_mapping",
            "delta-spark",
            [
                "column mapping name mode",
                "RENAME COLUMN (data and partition column)",
                "DROP COLUMN",
                "DELETE",
                "CDF off",
            ],
        )

    table("column_mapping", [], column_mapping)

    def column_mapping_id(t: str) -> Written:
        sql(
            f"CREATE TABLE {t} (id BIGINT, name STRING, part INT) USING delta PARTITIONED BY (part) "
            f"TBLPROPERTIES ('delta.columnMapping.mode' = 'id', {cdf})"
        )
        sql(f"INSERT INTO {t} VALUES (1, 'a', 1), (2, 'b', NULL)")
        sql(f"UPDATE {t} SET name = 'bb' WHERE part IS NULL")
        sql(f"ALTER TABLE {t} ADD COLUMN (score DOUBLE)")
        sql(f"INSERT INTO {t} VALUES (3, 'c', 2, 0.5)")
        return Written(
            "column_mapping_id",
            "delta-spark",
            [
                "column mapping id mode",
                "ADD COLUMN",
                "UPDATE",
                "CDF on",
            ],
            cdf_from=0,
        )

    table("column_mapping_id", [], column_mapping_id)

    def type_widening(t: str) -> Written:
        sql(
            f"CREATE TABLE {t} (id INT, small SMALLINT, part STRING) USING delta PARTITIONED BY (part) "
            f"TBLPROPERTIES ('delta.enableTypeWidening' = 'true', {cdf})"
        )
        sql(f"INSERT INTO {t} VALUES (1, 1, 'x'), (2, 2, NULL)")
        sql(f"ALTER TABLE {t} ALTER COLUMN small TYPE INT")
        sql(f"ALTER TABLE {t} ALTER COLUMN id TYPE BIGINT")
        sql(f"INSERT INTO {t} VALUES (3000000000, 100000, 'y')")
        sql(f"UPDATE {t} SET small = small + 1 WHERE id = 1")
        return Written(
            "type_widening",
            "delta-spark",
            [
                "type widening (short to int, int to long)",
                "UPDATE",
                "CDF on",
            ],
            cdf_from=3,
        )

    table("type_widening", [], type_widening)

    def replace(t: str) -> Written:
        # a catalog table at the path: delta-spark replaces the schema of a table it knows by name
        location = t[len("delta.`") : -1]
        sql("DROP TABLE IF EXISTS corpus_replace")
        sql(f"CREATE TABLE corpus_replace (id INT, v STRING) USING delta LOCATION '{location}'")
        sql("INSERT INTO corpus_replace VALUES (1, 'a'), (2, 'b')")
        sql(
            "CREATE OR REPLACE TABLE corpus_replace (id BIGINT, w STRING, part STRING) USING delta "
            f"PARTITIONED BY (part) LOCATION '{location}'"
        )
        sql("INSERT INTO corpus_replace VALUES (3, 'c', 'x'), (4, 'd', NULL)")
        sql(
            f"REPLACE TABLE corpus_replace USING delta PARTITIONED BY (part) LOCATION '{location}' "
            "AS SELECT * FROM VALUES (5L, 'e', 'z') AS s(id, w, part)"
        )
        sql("DROP TABLE corpus_replace")  # the catalog entry only: the files stay
        return Written(
            "replace",
            "delta-spark",
            [
                "CREATE OR REPLACE TABLE (new schema and partitioning)",
                "REPLACE TABLE AS SELECT",
            ],
        )

    table("replace", [], replace)

    def clones(t: str) -> Written | None:
        source = root / "spark__dml"
        if not source.exists():
            raise RuntimeError("the dml table is the clones' source and was not written")
        sql(f"CREATE TABLE {t} SHALLOW CLONE delta.`{source}` VERSION AS OF 5")
        sql(f"INSERT INTO {t} VALUES (20, 't', 2.00, 'x')")
        sql(f"DELETE FROM {t} WHERE id = 1")
        return Written(
            "shallow_clone",
            "delta-spark",
            [
                "SHALLOW CLONE (absolute paths into the source table)",
                "DELETE",
                "WRITE",
            ],
            notes=f"adds name the source's files by absolute path under {WRITE_ROOT}",
        )

    table("shallow_clone", [], clones)

    def deep_clone(t: str) -> Written:
        source = root / "spark__dml"
        sql(f"CREATE TABLE {t} CLONE delta.`{source}`")
        sql(f"DELETE FROM {t} WHERE id = 6")
        return Written("deep_clone", "delta-spark", ["CLONE (deep)", "DELETE"])

    table("deep_clone", [], deep_clone)

    def deep_nesting(t: str) -> Written:
        depth = 70
        ddl = "x INT"
        for _ in range(depth):
            ddl = f"s STRUCT<{ddl}>"
        sql(f"CREATE TABLE {t} (id INT, {ddl}) USING delta")
        value = "1"
        for _ in range(depth):
            value = f"named_struct('x', {value})" if value == "1" else f"named_struct('s', {value})"
        sql(f"INSERT INTO {t} SELECT 1, {value}")
        return Written("deep_nesting", "delta-spark", [f"a schema of {depth} nested struct levels"])

    table("deep_nesting", [], deep_nesting)
    return out


# --- delta-rs -----------------------------------------------------------------------------------------


def rs_expected(path: Path, written: Written) -> dict[str, Any]:
    import pyarrow as pa
    from deltalake import DeltaTable

    def rows_of(table: pa.Table) -> list[dict[str, Any]]:
        return normal_rows(table.to_pylist())

    dt_ = DeltaTable(str(path))
    latest = dt_.version()
    history = sorted(
        ({"version": int(h["version"]), "operation": h.get("operation")} for h in dt_.history()),
        key=lambda h: h["version"],
    )
    versions: dict[str, Any] = {}
    for h in history:
        v = h["version"]
        try:
            at = DeltaTable(str(path), version=v)
            data = at.to_pyarrow_table()
            versions[str(v)] = {
                "rows": rows_of(data),
                "columns": data.column_names,
                "num_files": len(at.file_uris()) if v == latest else None,
            }
        except Exception as exc:
            versions[str(v)] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    cdf = None
    if written.cdf_from is not None:
        try:
            reader = dt_.load_cdf(starting_version=written.cdf_from, ending_version=latest)
            table = pa.table(reader.read_all()) if not isinstance(reader, pa.Table) else reader
            rows = rows_of(table.drop_columns(["_commit_timestamp"]))
            cdf = {"start": written.cdf_from, "end": latest, "rows": rows}
        except Exception as exc:  # the writer's reader fails on its own table: recorded as such
            cdf = {"start": written.cdf_from, "end": latest, "error": f"{type(exc).__name__}: {exc}"[:300]}
    return {"history": history, "versions": versions, "cdf": cdf}


def rs_tables(root: Path, corpus: Corpus) -> list[tuple[Written, Path]]:
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    out: list[tuple[Written, Path]] = []

    def table(name: str, build: Callable[[str], Written | None]) -> None:
        if corpus.only and name not in corpus.only:
            return
        path = root / f"delta-rs__{name}"
        shutil.rmtree(path, ignore_errors=True)
        try:
            written = build(str(path))
        except Exception as exc:
            traceback.print_exc()
            corpus.refused("delta-rs", name, exc)
            shutil.rmtree(path, ignore_errors=True)
            return
        if written is not None:
            out.append((written, path))

    cdf = {"delta.enableChangeDataFeed": "true"}

    def null_partitions(p: str) -> Written:
        schema = pa.schema([("id", pa.int32()), ("v", pa.string()), ("p", pa.string())])
        write_deltalake(
            p,
            pa.table({"id": [1, 2, 3, 4], "v": list("abcd"), "p": [None, "", "x", None]}, schema),
            partition_by=["p"],
            configuration=cdf,
        )
        DeltaTable(p).delete("p IS NULL AND id = 1")
        DeltaTable(p).update(updates={"v": "'bb'"}, predicate="p IS NULL")
        DeltaTable(p).delete("p IS NULL")
        write_deltalake(p, pa.table({"id": [5], "v": ["e"], "p": [None]}, schema), mode="append")
        src = pa.table({"id": [5, 6], "v": ["ee", "f"], "p": [None, ""]}, schema)
        (
            DeltaTable(p)
            .merge(src, "t.id = s.id", source_alias="s", target_alias="t")
            .when_matched_update_all()
            .when_not_matched_insert_all()
            .execute()
        )
        return Written(
            "null_partitions",
            "delta-rs",
            [
                "NULL and empty-string partition values on add, remove and cdc",
                "DELETE",
                "UPDATE",
                "MERGE",
                "WRITE append",
                "CDF on",
            ],
            cdf_from=0,
        )

    table("null_partitions", null_partitions)

    def partition_types(p: str) -> Written:
        import decimal

        schema = pa.schema(
            [
                ("id", pa.int32()),
                ("s", pa.string()),
                ("i", pa.int32()),
                ("l", pa.int64()),
                ("sh", pa.int16()),
                ("b", pa.int8()),
                ("bo", pa.bool_()),
                ("d", pa.date32()),
                ("ts", pa.timestamp("us", "UTC")),
                ("tsn", pa.timestamp("us")),
                ("dec", pa.decimal128(10, 2)),
                ("f", pa.float32()),
                ("db", pa.float64()),
            ]
        )
        data = {
            "id": [1, 2, 3],
            "s": ["a b/c=d%", "", None],
            "i": [-1, 0, None],
            "l": [2**63 - 1, 0, None],
            "sh": [-32768, 0, None],
            "b": [-128, 0, None],
            "bo": [True, False, None],
            "d": [dt.date(2024, 2, 29), dt.date(1970, 1, 1), None],
            "ts": [
                dt.datetime(2024, 1, 2, 3, 4, 5, 123456, tzinfo=dt.UTC),
                dt.datetime(1970, 1, 1, tzinfo=dt.UTC),
                None,
            ],
            "tsn": [dt.datetime(2024, 1, 2, 3, 4, 5, 500000), dt.datetime(1970, 1, 1), None],
            "dec": [decimal.Decimal("12345678.91"), decimal.Decimal("0.00"), None],
            "f": [1.5, 0.0, None],
            "db": [-2.25, -0.0, None],
        }
        parts = [n for n in schema.names if n != "id"]
        write_deltalake(p, pa.table(data, schema), partition_by=parts, configuration=cdf)
        DeltaTable(p).delete("s IS NULL")
        DeltaTable(p).delete("i = 0")
        return Written(
            "partition_types",
            "delta-rs",
            [
                "partition columns of every type (string, int, long, short, byte, boolean, date, timestamp, "
                "timestamp_ntz, decimal, float, double), NULL in each",
                "DELETE",
                "CDF on",
            ],
            cdf_from=0,
        )

    table("partition_types", partition_types)

    def dml(p: str) -> Written:
        schema = pa.schema([("id", pa.int64()), ("name", pa.string()), ("part", pa.string())])

        def rows(ids: list[int], parts: list[str | None]) -> pa.Table:
            return pa.table({"id": ids, "name": [f"n{i}" for i in ids], "part": parts}, schema)

        write_deltalake(
            p,
            rows([1, 2, 3], ["x", "y", "x"]),
            partition_by=["part"],
            configuration={**cdf, "delta.checkpointInterval": "3"},
        )
        write_deltalake(p, rows([4], ["y"]), mode="append")
        DeltaTable(p).update(updates={"name": "'upd'"}, predicate="id = 1")
        DeltaTable(p).delete("id = 2")
        (
            DeltaTable(p)
            .merge(rows([3, 5], ["x", None]), "t.id = s.id", source_alias="s", target_alias="t")
            .when_matched_update_all()
            .when_not_matched_insert_all()
            .execute()
        )
        DeltaTable(p).optimize.compact()
        DeltaTable(p).optimize.z_order(["id"])
        DeltaTable(p).create_checkpoint()
        write_deltalake(p, rows([6], ["x"]), mode="overwrite")
        write_deltalake(p, rows([7], ["y"]), mode="append")
        DeltaTable(p).restore(4)
        write_deltalake(p, rows([8], [None]), mode="append")
        return Written(
            "dml",
            "delta-rs",
            [
                "WRITE append",
                "WRITE overwrite",
                "UPDATE",
                "DELETE",
                "MERGE",
                "OPTIMIZE compact",
                "OPTIMIZE ZORDER",
                "RESTORE",
                "V1 checkpoint (create_checkpoint, and checkpointInterval 3)",
                "CDF on",
                "ICT off",
            ],
            cdf_from=0,
        )

    table("dml", dml)

    def ict(p: str) -> Written:
        schema = pa.schema([("id", pa.int64()), ("part", pa.string())])
        write_deltalake(
            p,
            pa.table({"id": [1, 2], "part": ["a", None]}, schema),
            partition_by=["part"],
            configuration={**cdf, "delta.enableInCommitTimestamps": "true"},
        )
        write_deltalake(p, pa.table({"id": [3], "part": ["b"]}, schema), mode="append")
        DeltaTable(p).delete("part IS NULL")
        DeltaTable(p).create_checkpoint()
        write_deltalake(p, pa.table({"id": [4], "part": [None]}, schema), mode="append")
        return Written("ict", "delta-rs", ["ICT on", "DELETE", "V1 checkpoint", "CDF on"], cdf_from=0)

    table("ict", ict)

    def column_mapping(p: str) -> Written:
        schema = pa.schema([("id", pa.int64()), ("name", pa.string())])
        write_deltalake(
            p,
            pa.table({"id": [1], "name": ["a"]}, schema),
            configuration={"delta.columnMapping.mode": "name"},
        )
        write_deltalake(p, pa.table({"id": [2], "name": ["b"]}, schema), mode="append")
        return Written("column_mapping", "delta-rs", ["column mapping name mode (written by delta-rs)"])

    table("column_mapping", column_mapping)

    def deletion_vectors(p: str) -> Written:
        schema = pa.schema([("id", pa.int64())])
        write_deltalake(
            p, pa.table({"id": [1, 2, 3]}, schema), configuration={"delta.enableDeletionVectors": "true"}
        )
        DeltaTable(p).delete("id = 2")
        dvs = [
            line
            for f in (Path(p) / "_delta_log").glob("*.json")
            for line in f.read_text().splitlines()
            if '"deletionVector":{' in line
        ]
        if not dvs:
            raise RuntimeError("delta-rs rewrote the file instead of writing a deletion vector")
        return Written("deletion_vectors", "delta-rs", ["deletion vectors"])

    table("deletion_vectors", deletion_vectors)
    return out


# --- main -------------------------------------------------------------------------------------------


def write(out: Path, writers: set[str], only: frozenset[str] = frozenset()) -> None:
    import deltalake
    import pyspark

    from support import spark as spark_support

    versions = {
        "delta-spark": spark_support.DELTA_SPARK_PACKAGE.rsplit(":", 1)[-1],
        "spark": pyspark.__version__,
        "delta-rs": deltalake.__version__,
    }
    corpus = Corpus(out, versions, only=only)
    root = WRITE_ROOT
    if not only:
        shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True, exist_ok=True)
    written: list[tuple[Written, Path, dict[str, Any]]] = []
    if "spark" in writers:
        spark = spark_support.get_spark_session()
        for w, path in spark_tables(spark, root, corpus):
            written.append((w, path, spark_expected(spark, path, w)))
    if "delta-rs" in writers:
        for w, path in rs_tables(root, corpus):
            written.append((w, path, rs_expected(path, w)))
    (out / "tables").mkdir(parents=True, exist_ok=True)
    (out / "expected").mkdir(parents=True, exist_ok=True)
    for w, path, expected in written:
        target = out / "tables" / path.name
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(path, target)
        for crc in target.rglob(".*.crc"):  # Hadoop's checksums of each file: not the table
            crc.unlink()
        facts = _log_facts(target)
        entry = {
            "id": path.name,
            "writer": w.writer,
            "writer_version": versions[w.writer],
            "covers": w.covers,
            "cdf_from": w.cdf_from,
            "notes": w.notes,
            **facts,
        }
        corpus.tables.append(entry)
        (out / "expected" / f"{path.name}.json").write_text(
            json.dumps({**entry, **expected}, indent=1, sort_keys=True) + "\n"
        )
    index_path = out / "index.json"
    old = json.loads(index_path.read_text()) if index_path.exists() else {"tables": [], "not_produced": []}
    rerun = {t["id"] for t in corpus.tables}
    tried = {(n["writer"], n["artifact"]) for n in corpus.not_produced}
    tried |= {(w.writer, w.name) for w, _, _ in written}
    index = {
        "writers": versions,
        "write_root": str(WRITE_ROOT),
        "tables": sorted(
            [t for t in old["tables"] if t["id"] not in rerun] + corpus.tables, key=lambda t: t["id"]
        ),
        "not_produced": sorted(
            [n for n in old["not_produced"] if (n["writer"], n["artifact"]) not in tried]
            + corpus.not_produced,
            key=lambda n: (n["writer"], n["artifact"]),
        ),
    }
    index_path.write_text(json.dumps(index, indent=1, sort_keys=True) + "\n")
    write_index_md(out)


def write_index_md(out: Path) -> None:
    """INDEX.md beside index.json: what each table covers, for a person picking one."""
    index = json.loads((out / "index.json").read_text())
    w = index["writers"]
    lines = [
        "# Writers' corpus: index",
        "",
        f"Written by scripts/write_corpus.py with delta-spark {w['delta-spark']} (Spark {w['spark']}) and "
        f"delta-rs {w['delta-rs']} (the `deltalake` package). `expected/<id>.json`: what the writer's own "
        "reader read (rows and file count at every version, history, change data feed). "
        "Machine-readable: index.json.",
        "",
        "| id | writer | covers | operations | checkpoints | features |",
        "|---|---|---|---|---|---|",
    ]
    for t in index["tables"]:
        kinds = [f"v{','.join(t['checkpoints'])}"] if t["checkpoints"] else []
        kinds += ["multi-part"] if t["multipart_checkpoint"] else []
        kinds += ["V2"] if t["v2_checkpoint"] else []
        kinds += ["sidecars"] if t["sidecars"] else []
        lines.append(
            f"| `{t['id']}` | {t['writer']} {t['writer_version']} | {'; '.join(t['covers'])} | "
            f"{', '.join(t['operations'])} | {' '.join(kinds) or '-'} | {', '.join(t['features']) or '-'} |"
        )
    lines += ["", "## What a writer could not produce here", ""]
    lines += [f"- {n['writer']}: {n['artifact']}: {n['error']}" for n in index["not_produced"]]
    (out / "INDEX.md").write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--writer", action="append", choices=["spark", "delta-rs"])
    parser.add_argument("--only", action="append", default=[], help="write only these tables (by name)")
    args = parser.parse_args()
    write(args.out.resolve(), set(args.writer or ["spark", "delta-rs"]), frozenset(args.only))


if __name__ == "__main__":
    main()
