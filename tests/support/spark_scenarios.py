"""Real Delta tables written by delta-spark, and delta-spark's own change data feed over them.

These are the oracle for deltamirror's CDF reader: each `scenario_*` writes a small table through
delta-spark SQL and returns a `Scenario` naming the version range to compare. A comparison test is:

    sc = spark_scenarios.get("merge_dv")          # session-cached, built once
    assert normalize_cdf_rows(mirror_rows(sc.path, sc.start_version, sc.end_version)) == (
        spark_scenarios.rows("merge_dv"))        # == sc.spark_rows(spark), read once per session
    # or, for ranges delta-spark refuses:   sc.spark_error(spark) == sc.expected_error

Every table uses the same base schema (id BIGINT, name STRING, amount DECIMAL(10,2)[, part STRING])
and writes one file per partition per INSERT (`COALESCE(1)`), so the logs stay small and readable.
Scenario tables are shared across tests: treat them as read-only.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import re
import shutil
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# --------------------------------------------------------------------------------------------- model


@dataclass(frozen=True)
class Scenario:
    """A Delta table on disk plus the CDF range [start_version, end_version] to compare."""

    name: str
    path: str
    start_version: int
    end_version: int | None
    notes: str = ""
    # Error class delta-spark raises for this range (None: the read succeeds).
    expected_error: str | None = None
    # Named versions inside the table's history, e.g. {"noop_merge": 3}, so tests need not count commits.
    marks: Mapping[str, int] = field(default_factory=dict)

    def spark_rows(self, spark: SparkSession, **opts: Any) -> list[dict[str, Any]]:
        return spark_cdf(spark, self.path, self.start_version, self.end_version, **opts)

    def spark_error(self, spark: SparkSession, **opts: Any) -> str | None:
        return spark_cdf_error(spark, self.path, start=self.start_version, end=self.end_version, **opts)


# ------------------------------------------------------------------------------------- CDF readers

CDF_META_COLUMNS = ("_change_type", "_commit_version", "_commit_timestamp")
_CHANGE_TYPE_ORDER = {"delete": 0, "update_preimage": 1, "update_postimage": 2, "insert": 3}


def _epoch_micros(value: dt.datetime) -> int:
    # Naive datetimes are TIMESTAMP_NTZ (wall clock, no zone): read them as UTC.
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    delta = value - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _normalize_value(value: Any) -> Any:
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, dt.datetime):
        return _epoch_micros(value)
    if isinstance(value, Mapping):
        return {k: _normalize_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_normalize_value(v) for v in value]
    return value


def _cell_key(value: Any) -> tuple[Any, ...]:
    if value is None:
        return (2,)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return (0, value)
    if isinstance(value, str):
        return (1, "str", value)
    return (1, type(value).__name__, repr(value))


def _is_int_column(rows: list[dict[str, Any]], column: str) -> bool:
    values = [row.get(column) for row in rows]
    return any(v is not None for v in values) and all(
        v is None or (isinstance(v, int) and not isinstance(v, bool)) for v in values
    )


def normalize_cdf_rows(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Canonical form of CDF rows, for comparing any reader's output with `spark_cdf`.

    Decimals become str (scale kept: Decimal("1.50") -> "1.50"), datetimes become int epoch
    microseconds in UTC (naive ones are read as UTC). Rows are sorted by version, change type, then
    the integer data columns (e.g. id) numerically, then the other data columns by name. Idempotent,
    and blind to column order: apply it to e.g. `pyarrow.Table.to_pylist()` and compare with `==`.
    """
    normalized = [{k: _normalize_value(v) for k, v in row.items()} for row in rows]
    data_columns = sorted({k for row in normalized for k in row} - set(CDF_META_COLUMNS))
    int_columns = [c for c in data_columns if _is_int_column(normalized, c)]
    order = [*int_columns, *(c for c in data_columns if c not in int_columns), "_commit_timestamp"]

    def key(row: dict[str, Any]) -> tuple[Any, ...]:
        return (
            row.get("_commit_version", -1),
            _CHANGE_TYPE_ORDER.get(row.get("_change_type", ""), 9),
            tuple(_cell_key(row.get(c)) for c in order),
        )

    normalized.sort(key=key)
    return normalized


def _cdf_reader(spark: SparkSession, start: int | None, end: int | None, opts: Mapping[str, Any]) -> Any:
    reader = spark.read.format("delta").option("readChangeFeed", "true")
    if start is not None:
        reader = reader.option("startingVersion", str(start))
    if end is not None:
        reader = reader.option("endingVersion", str(end))
    for key, value in opts.items():
        reader = reader.option(key, str(value))
    return reader


def spark_cdf(
    spark: SparkSession, path: str, start: int | None, end: int | None = None, **opts: Any
) -> list[dict[str, Any]]:
    """delta-spark's change data feed of `path`, normalized (see `normalize_cdf_rows`).

    Timestamp columns (including `_commit_timestamp`) are converted inside Spark with `unix_micros`,
    so the result does not depend on the Python process's local time zone.
    `opts` are extra reader options (e.g. startingTimestamp=...).
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import TimestampType

    df = _cdf_reader(spark, start, end, opts).load(path)
    projected = [
        F.unix_micros(F.col(f"`{f.name}`")).alias(f.name)
        if isinstance(f.dataType, TimestampType)
        else F.col(f"`{f.name}`")
        for f in df.schema.fields
    ]
    rows = df.select(*projected).collect()
    return normalize_cdf_rows(row.asDict(recursive=True) for row in rows)


_ERROR_CLASS_IN_MESSAGE = re.compile(r"\[([A-Z][A-Z0-9_]+(?:\.[A-Z0-9_]+)*)\]")


def error_class(exc: BaseException) -> str:
    """The Spark/Delta error class of an exception (e.g. DELTA_MISSING_CHANGE_DATA)."""
    get_condition = getattr(exc, "getCondition", None) or getattr(exc, "getErrorClass", None)
    if get_condition is not None:
        try:
            condition = get_condition()
        except Exception:
            condition = None
        if condition:
            return str(condition)
    match = _ERROR_CLASS_IN_MESSAGE.search(str(exc))
    return match.group(1) if match else type(exc).__name__


def spark_cdf_error(
    spark: SparkSession, path: str, start: int | None = 0, end: int | None = None, **opts: Any
) -> str | None:
    """Error class of a failing CDF read of `path` (the read is fully collected), or None if it succeeds."""
    from py4j.protocol import Py4JJavaError  # type: ignore[import-untyped]
    from pyspark.errors import PySparkException

    try:
        _cdf_reader(spark, start, end, opts).load(path).collect()
    except (PySparkException, Py4JJavaError) as exc:
        return error_class(exc)
    return None


# --------------------------------------------------------------------------------- log inspection


def latest_version(path: str) -> int:
    log = Path(path) / "_delta_log"
    return max(int(p.name[:20]) for p in log.glob("*.json") if p.name[:20].isdigit())


def commit_actions(path: str, version: int) -> list[dict[str, Any]]:
    """The actions of one commit, parsed from its JSON file (for notes and scenario self-checks)."""
    text = (Path(path) / "_delta_log" / f"{version:020d}.json").read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def commit_summary(path: str, version: int) -> dict[str, int]:
    """Counts of add/remove/cdc actions in a commit, split by deletion vector and dataChange."""
    counts: dict[str, int] = {}
    for action in commit_actions(path, version):
        for kind in ("add", "remove", "cdc"):
            body = action.get(kind)
            if body is None:
                continue
            key = kind
            if body.get("deletionVector"):
                key += "+dv"
            if kind != "cdc" and not body.get("dataChange", True):
                key += "(dataChange=false)"
            counts[key] = counts.get(key, 0) + 1
    return counts


def commit_info(path: str, version: int) -> dict[str, Any]:
    for action in commit_actions(path, version):
        if "commitInfo" in action:
            return dict(action["commitInfo"])
    return {}


# ------------------------------------------------------------------------------------- SQL helpers

BASE_COLUMNS = "id BIGINT, name STRING, amount DECIMAL(10,2)"
CDF = "'delta.enableChangeDataFeed' = 'true'"
DV = "'delta.enableDeletionVectors' = 'true'"
NO_DV = "'delta.enableDeletionVectors' = 'false'"
CM_NAME = "'delta.columnMapping.mode' = 'name'"


def _t(path: str) -> str:
    return f"delta.`{path}`"


def _create(
    spark: SparkSession,
    path: str,
    *props: str,
    partitioned: bool = False,
    rows: tuple[int, int] | None = None,
) -> int:
    """CREATE TABLE (metadata-only version 0), or CREATE TABLE AS SELECT of `rows` (version 0 with data)."""
    partition = "PARTITIONED BY (part)" if partitioned else ""
    properties = f"TBLPROPERTIES ({', '.join(props)})"
    if rows is None:
        columns = BASE_COLUMNS + (", part STRING" if partitioned else "")
        spark.sql(f"CREATE TABLE {_t(path)} ({columns}) USING delta {partition} {properties}")
    else:
        query = _rows(*rows, partitioned=partitioned)
        spark.sql(f"CREATE TABLE {_t(path)} USING delta {partition} {properties} AS {query}")
    return latest_version(path)


def _rows(lo: int, hi: int, *, partitioned: bool = False, tag: str = "n") -> str:
    """SELECT of ids [lo, hi) in one Spark partition, i.e. one data file per table partition."""
    part = ", IF(id % 2 = 0, 'even', 'odd') AS part" if partitioned else ""
    return (
        f"SELECT /*+ COALESCE(1) */ id, concat('{tag}-', id) AS name, "
        f"CAST(id * 1.25 AS DECIMAL(10,2)) AS amount{part} FROM range({lo}, {hi})"
    )


def _insert(spark: SparkSession, path: str, lo: int, hi: int, *, partitioned: bool = False) -> int:
    spark.sql(f"INSERT INTO {_t(path)} {_rows(lo, hi, partitioned=partitioned)}")
    return latest_version(path)


def _sql(spark: SparkSession, path: str, statement: str) -> int:
    """Run a statement with `{t}` standing for the table; return the version it committed."""
    spark.sql(statement.format(t=_t(path)))
    return latest_version(path)


_MERGE_SOURCE = """
    SELECT /*+ COALESCE(1) */ id, concat('m-', id) AS name, CAST(id * 2 AS DECIMAL(10,2)) AS amount{part},
           CASE WHEN id < 3 THEN 'D' WHEN id < 20 THEN 'U' ELSE 'I' END AS op
    FROM range(0, 24) WHERE id < 3 OR id BETWEEN 6 AND 8 OR id >= 20
"""


def _merge(spark: SparkSession, path: str, *, partitioned: bool = False) -> int:
    """MERGE deleting ids 0-2, updating 6-8 and inserting 20-23 (source has no other rows)."""
    part = ", IF(id % 2 = 0, 'even', 'odd') AS part" if partitioned else ""
    insert_cols = "id, name, amount" + (", part" if partitioned else "")
    return _sql(
        spark,
        path,
        f"""
        MERGE INTO {{t}} AS t USING ({_MERGE_SOURCE.format(part=part)}) AS s ON t.id = s.id
        WHEN MATCHED AND s.op = 'D' THEN DELETE
        WHEN MATCHED THEN UPDATE SET t.name = s.name, t.amount = s.amount
        WHEN NOT MATCHED THEN INSERT ({insert_cols}) VALUES ({", ".join("s." + c for c in insert_cols.split(", "))})
        """,
    )


# --------------------------------------------------------------------------------------- scenarios


def scenario_inserts(spark: SparkSession, path: str) -> Scenario:
    _create(spark, path, CDF)
    first = _insert(spark, path, 0, 10)
    last = _insert(spark, path, 10, 25)
    return Scenario(
        "inserts",
        path,
        0,
        last,
        "plain appends: CDF comes from add actions (no cdc files)",
        marks={"first_insert": first, "second_insert": last},
    )


def scenario_update(spark: SparkSession, path: str) -> Scenario:
    ins = _create(spark, path, CDF, NO_DV, rows=(0, 20))
    upd = _sql(spark, path, "UPDATE {t} SET name = concat(name, '-u'), amount = amount + 1 WHERE id % 4 = 0")
    return Scenario(
        "update",
        path,
        ins,
        upd,
        "copy-on-write UPDATE: remove + add of the rewritten file + one cdc file (_change_data/) with the "
        "pre/post images; the version's CDF comes from the cdc file only",
        marks={"insert": ins, "update": upd},
    )


def scenario_delete(spark: SparkSession, path: str) -> Scenario:
    ins = _create(spark, path, CDF, NO_DV, rows=(0, 20))
    dele = _sql(spark, path, "DELETE FROM {t} WHERE id IN (3, 4, 11)")
    return Scenario(
        "delete",
        path,
        ins,
        dele,
        "copy-on-write DELETE: remove + add of the rewritten file + one cdc file with the delete rows",
        marks={"insert": ins, "delete": dele},
    )


def scenario_merge(spark: SparkSession, path: str) -> Scenario:
    ins = _create(spark, path, CDF, NO_DV, rows=(0, 20))
    merge = _merge(spark, path)
    return Scenario(
        "merge",
        path,
        ins,
        merge,
        "copy-on-write MERGE (delete ids 0-2, update 6-8, insert 20-23): remove 1, add 2, cdc 2",
        marks={"insert": ins, "merge": merge},
    )


def scenario_update_dv(spark: SparkSession, path: str) -> Scenario:
    ins = _create(spark, path, CDF, DV, rows=(0, 20))
    upd = _sql(spark, path, "UPDATE {t} SET name = concat(name, '-u'), amount = amount + 1 WHERE id % 4 = 0")
    return Scenario(
        "update_dv",
        path,
        ins,
        upd,
        "UPDATE with DVs: remove + add+dv of the same path (DV marks the updated rows), add of a new file "
        "with the new rows, and a cdc file; CDF comes from the cdc file only",
        marks={"insert": ins, "update": upd},
    )


def scenario_delete_dv(spark: SparkSession, path: str) -> Scenario:
    ins = _create(spark, path, CDF, DV, rows=(0, 20))
    dele = _sql(spark, path, "DELETE FROM {t} WHERE id IN (3, 4, 11)")
    return Scenario(
        "delete_dv",
        path,
        ins,
        dele,
        "DELETE with DVs: remove + add+dv of the same path and NO cdc file; delete rows are the rows the "
        "new DV marks and the old one did not (CDCReader DV diff)",
        marks={"insert": ins, "delete": dele},
    )


def scenario_merge_dv(spark: SparkSession, path: str) -> Scenario:
    ins = _create(spark, path, CDF, DV, rows=(0, 20))
    merge = _merge(spark, path)
    return Scenario(
        "merge_dv",
        path,
        ins,
        merge,
        "MERGE with DVs: remove + add+dv of the same path, add of a new file (updates + inserts), and a cdc file",
        marks={"insert": ins, "merge": merge},
    )


def scenario_dv_then_whole_file_delete(spark: SparkSession, path: str) -> Scenario:
    _create(spark, path, CDF, DV, rows=(0, 10))  # file A
    file_b = _insert(spark, path, 10, 20)  # file B
    dv_delete = _sql(spark, path, "DELETE FROM {t} WHERE id IN (1, 2)")
    whole = _sql(spark, path, "DELETE FROM {t} WHERE id < 10")
    return Scenario(
        "dv_then_whole_file_delete",
        path,
        dv_delete,
        whole,
        "second DELETE removes every remaining row of a file that already has a DV: delta-spark "
        "writes a lone remove+dv (no add, no cdc); its delete rows exclude the DV-masked rows",
        marks={"file_b": file_b, "dv_delete": dv_delete, "whole_file_delete": whole},
    )


def scenario_noop_merge(spark: SparkSession, path: str) -> Scenario:
    ins = _create(spark, path, CDF, NO_DV, rows=(0, 10))
    # Only a NOT MATCHED BY SOURCE clause whose condition is false: delta-spark still rewrites the file
    # (remove + add with dataChange=true, no cdc file) and commits metrics of 0 changed rows.
    noop = _sql(
        spark,
        path,
        """
        MERGE INTO {t} AS t USING (SELECT id FROM range(100, 105)) AS s ON t.id = s.id
        WHEN NOT MATCHED BY SOURCE AND t.id < 0 THEN DELETE
    """,
    )
    after = _insert(spark, path, 10, 12)
    return Scenario(
        "noop_merge",
        path,
        ins,
        after,
        "MERGE that changes no row but rewrites the file (dataChange=true, no cdc). delta-spark "
        "returns no rows for it because commitInfo is MERGE with numTargetRowsInserted/Updated/"
        "Deleted all '0' (CDCReader.shouldSkipFileActionsInCommit). A MERGE whose source matches "
        "nothing and has only MATCHED clauses commits no version at all in delta-spark 4.4.",
        marks={"insert": ins, "noop_merge": noop, "insert_after": after},
    )


def scenario_restore(spark: SparkSession, path: str) -> Scenario:
    ins = _create(spark, path, CDF, DV, rows=(0, 10))  # file A: ids 0-9
    ins2 = _insert(spark, path, 10, 20)  # file B: ids 10-19
    dele = _sql(spark, path, "DELETE FROM {t} WHERE id IN (1, 2, 12)")  # DVs on A and B
    dele2 = _sql(spark, path, "DELETE FROM {t} WHERE id IN (5, 6)")  # A's DV grows
    restore_dv = _sql(spark, path, f"RESTORE TABLE {{t}} TO VERSION AS OF {dele}")
    restore = _sql(spark, path, f"RESTORE TABLE {{t}} TO VERSION AS OF {ins2}")
    return Scenario(
        "restore",
        path,
        dele,
        restore,
        "two DV deletes, then RESTOREs: to the first delete (remove+dv / add+dv of A, the DV shrinks: "
        "ids 5, 6 come back as inserts) and to before any delete (remove+dv / add without DV of A and "
        "B: ids 1, 2, 12 come back). No cdc file; rows are the DV diff in reverse, nothing else",
        marks={
            "insert": ins,
            "insert2": ins2,
            "dv_delete": dele,
            "dv_delete2": dele2,
            "restore_dv": restore_dv,
            "restore": restore,
        },
    )


def scenario_optimize(spark: SparkSession, path: str) -> Scenario:
    first = _create(spark, path, CDF, DV, rows=(0, 8))
    _insert(spark, path, 8, 16)
    dele = _sql(spark, path, "DELETE FROM {t} WHERE id IN (2, 9)")
    opt = _sql(spark, path, "OPTIMIZE {t}")
    return Scenario(
        "optimize",
        path,
        first,
        opt,
        "OPTIMIZE compacts two files that carry DVs: add / remove+dv all dataChange=false, so no CDF rows",
        marks={"dv_delete": dele, "optimize": opt},
    )


def scenario_merge_partitioned(spark: SparkSession, path: str) -> Scenario:
    ins = _create(spark, path, CDF, NO_DV, rows=(0, 20), partitioned=True)
    merge = _merge(spark, path, partitioned=True)
    return Scenario(
        "merge_partitioned",
        path,
        ins,
        merge,
        "copy-on-write MERGE on a table partitioned by part",
        marks={"insert": ins, "merge": merge},
    )


def scenario_delete_dv_partitioned(spark: SparkSession, path: str) -> Scenario:
    ins = _create(spark, path, CDF, DV, rows=(0, 20), partitioned=True)
    dv_delete = _sql(spark, path, "DELETE FROM {t} WHERE id IN (4, 5, 6)")
    partition_delete = _sql(spark, path, "DELETE FROM {t} WHERE part = 'even'")
    return Scenario(
        "delete_dv_partitioned",
        path,
        ins,
        partition_delete,
        "DV delete hitting both partitions (remove + add+dv each, no cdc), then a metadata-only DELETE of "
        "partition even: a lone remove+dv, whose delete rows exclude the DV-masked rows",
        marks={"insert": ins, "dv_delete": dv_delete, "partition_delete": partition_delete},
    )


def scenario_column_mapping_add_column(spark: SparkSession, path: str) -> Scenario:
    _create(spark, path, CDF, CM_NAME)  # CTAS + CDF + column mapping is refused
    ins = _insert(spark, path, 0, 6)
    add = _sql(spark, path, "ALTER TABLE {t} ADD COLUMN extra STRING")
    ins2 = _sql(
        spark,
        path,
        "INSERT INTO {t} (id, name, amount, extra) SELECT /*+ COALESCE(1) */ id, "
        "concat('n-', id), CAST(id AS DECIMAL(10,2)), concat('x-', id) FROM range(6, 10)",
    )
    upd = _sql(spark, path, "UPDATE {t} SET extra = 'upd' WHERE id IN (1, 7)")
    return Scenario(
        "column_mapping_add_column",
        path,
        ins,
        upd,
        "column mapping name mode; ADD COLUMN inside the range (additive: readable)",
        marks={"insert": ins, "add_column": add, "insert2": ins2, "update": upd},
    )


def scenario_column_mapping_rename(spark: SparkSession, path: str) -> Scenario:
    _create(spark, path, CDF, CM_NAME)  # CTAS + CDF + column mapping is refused
    ins = _insert(spark, path, 0, 6)
    add = _sql(spark, path, "ALTER TABLE {t} ADD COLUMN extra STRING")
    rename = _sql(spark, path, "ALTER TABLE {t} RENAME COLUMN name TO full_name")
    upd = _sql(spark, path, "UPDATE {t} SET full_name = 'upd', extra = 'e' WHERE id = 2")
    return Scenario(
        "column_mapping_rename",
        path,
        ins,
        upd,
        "column mapping name mode; ADD COLUMN and RENAME COLUMN inside the range: delta-spark "
        "refuses the batch read (non-additive column mapping change)",
        expected_error="DELTA_CHANGE_DATA_FEED_INCOMPATIBLE_SCHEMA_CHANGE",
        marks={"insert": ins, "add_column": add, "rename": rename, "update": upd},
    )


def scenario_drop_column_in_range(spark: SparkSession, path: str) -> Scenario:
    _create(spark, path, CDF, CM_NAME)  # CTAS + CDF + column mapping is refused
    ins = _insert(spark, path, 0, 6)
    drop = _sql(spark, path, "ALTER TABLE {t} DROP COLUMN amount")
    ins2 = _sql(spark, path, "INSERT INTO {t} (id, name) VALUES (100, 'after-drop')")
    return Scenario(
        "drop_column_in_range",
        path,
        ins,
        ins2,
        "column mapping name mode; DROP COLUMN inside the range: delta-spark refuses the batch "
        "read (the read schema, of the end version, lacks a column of the start schema)",
        expected_error="DELTA_CHANGE_DATA_FEED_INCOMPATIBLE_DATA_SCHEMA",
        marks={"insert": ins, "drop": drop, "insert2": ins2},
    )


def scenario_ict_from_create(spark: SparkSession, path: str) -> Scenario:
    # CREATE TABLE AS SELECT: version 0 has both the ICT-enabling metadata and data.
    create = _create(spark, path, CDF, "'delta.enableInCommitTimestamps' = 'true'", rows=(0, 5))
    upd = _sql(spark, path, "UPDATE {t} SET amount = 0 WHERE id = 1")
    return Scenario(
        "ict_from_create",
        path,
        create,
        upd,
        "in-commit timestamps from version 0: _commit_timestamp = commitInfo.inCommitTimestamp (ms)",
        marks={"create": create, "insert": create, "update": upd},
    )


def scenario_ict_enabled_mid_history(spark: SparkSession, path: str) -> Scenario:
    ins = _create(spark, path, CDF, rows=(0, 5))
    enable = _sql(
        spark, path, "ALTER TABLE {t} SET TBLPROPERTIES ('delta.enableInCommitTimestamps' = 'true')"
    )
    ins2 = _insert(spark, path, 5, 8)
    upd = _sql(spark, path, "UPDATE {t} SET amount = 0 WHERE id IN (1, 6)")
    return Scenario(
        "ict_enabled_mid_history",
        path,
        ins,
        upd,
        "ICT enabled by ALTER after a commit (the ALTER commit itself carries an ICT): earlier "
        "versions use the commit file's modification time in ms, later ones inCommitTimestamp",
        marks={"insert": ins, "enable_ict": enable, "insert2": ins2, "update": upd},
    )


def scenario_start_after_checkpoint(spark: SparkSession, path: str) -> Scenario:
    _create(spark, path, CDF, "'delta.checkpointInterval' = '2'", rows=(0, 3))
    _insert(spark, path, 3, 5)
    checkpoint = _insert(spark, path, 5, 10)  # version 2: checkpointed
    upd = _sql(spark, path, "UPDATE {t} SET amount = amount * 2 WHERE id < 7")
    last = _insert(spark, path, 10, 12)  # version 4: checkpointed
    return Scenario(
        "start_after_checkpoint",
        path,
        checkpoint + 1,
        last,
        "checkpointInterval=2; range starts right after a checkpoint and ends on one",
        marks={"checkpoint": checkpoint, "update": upd, "last_checkpoint": last},
    )


def scenario_cdf_enabled_later(spark: SparkSession, path: str) -> Scenario:
    ins = _create(spark, path, NO_DV, rows=(0, 5))
    enable = _sql(spark, path, f"ALTER TABLE {{t}} SET TBLPROPERTIES ({CDF})")
    ins2 = _insert(spark, path, 5, 8)
    return Scenario(
        "cdf_enabled_later",
        path,
        ins,
        ins2,
        "change data feed enabled by ALTER after the first insert: a range starting before the "
        "enablement version is refused; one starting at it is readable",
        expected_error="DELTA_MISSING_CHANGE_DATA",
        marks={"insert": ins, "enable_cdf": enable, "insert2": ins2},
    )


def _add_column_after_end(spark: SparkSession, path: str, name: str, *props: str) -> Scenario:
    _create(spark, path, CDF, *props)  # CTAS + CDF + column mapping is refused
    ins = _insert(spark, path, 0, 6)
    upd = _sql(spark, path, "UPDATE {t} SET amount = amount + 1 WHERE id = 2")
    add = _sql(spark, path, "ALTER TABLE {t} ADD COLUMN extra STRING")
    after = _sql(spark, path, "INSERT INTO {t} (id, name, amount, extra) VALUES (50, 'late', 1.00, 'x')")
    mode = (
        "column mapping: delta-spark reads with the END version's schema, rows have no `extra`"
        if props
        else "no column mapping: delta-spark reads with the LATEST schema, rows carry `extra` = None"
    )
    return Scenario(
        name,
        path,
        ins,
        upd,
        f"ADD COLUMN after the end version; {mode}",
        marks={"insert": ins, "update": upd, "add_column": add, "insert_after": after},
    )


def scenario_add_column_after_end(spark: SparkSession, path: str) -> Scenario:
    return _add_column_after_end(spark, path, "add_column_after_end")


def scenario_add_column_after_end_cm(spark: SparkSession, path: str) -> Scenario:
    return _add_column_after_end(spark, path, "add_column_after_end_cm", CM_NAME)


ScenarioBuilder = Callable[["SparkSession", str], Scenario]

ALL_SCENARIOS: dict[str, ScenarioBuilder] = {
    name.removeprefix("scenario_"): fn
    for name, fn in sorted(globals().items())
    if name.startswith("scenario_") and callable(fn)
}


#: scenario tables built at once in the background (Spark's driver work is mostly single-threaded)
PREFETCH_THREADS = 2


class ScenarioCache:
    """Builds each scenario at most once per test session (tables are read-only once built).

    delta-spark's CDF of each scenario's own range is read once too (`rows`, `error`): the oracle
    self-checks and the deltamirror comparisons share it. `prefetch` builds and reads scenarios on
    background threads of the same SparkSession, so tests check one while the next is written.
    """

    def __init__(self, spark: SparkSession, root: Path) -> None:
        self.spark = spark
        self._root = root
        self._built: dict[str, Scenario] = {}
        self._results: dict[str, tuple[list[dict[str, Any]] | None, str | None]] = {}
        self._failed: dict[str, BaseException] = {}
        self._locks = {name: threading.RLock() for name in ALL_SCENARIOS}
        self._pool: ThreadPoolExecutor | None = None
        self._prefetched: dict[str, Future[None]] = {}

    def prefetch(self, names: Iterable[str]) -> None:
        """Build and read these scenarios on background threads, in this order."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(PREFETCH_THREADS, thread_name_prefix="spark-scenario")
        for name in names:
            if name not in self._prefetched:
                self._prefetched[name] = self._pool.submit(self._build_and_read, name)

    def close(self) -> None:
        """Stop prefetching (builds under way finish) before the SparkSession goes."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def get(self, name: str) -> Scenario:
        self._wait(name)
        return self._build(name)

    def result(self, name: str) -> tuple[list[dict[str, Any]] | None, str | None]:
        """(`spark_cdf` rows, None) or (None, error class) of the scenario's own range, read once."""
        self._wait(name)
        return self._read(name)

    def rows(self, name: str) -> list[dict[str, Any]]:
        """`spark_cdf` over the scenario's own range (fails if delta-spark refuses the range)."""
        rows, error = self.result(name)
        if rows is None:
            raise AssertionError(f"delta-spark refused the CDF of scenario {name!r}: {error}")
        return rows

    def error(self, name: str) -> str | None:
        """The error class delta-spark raised for the scenario's own range (None: it read fine)."""
        return self.result(name)[1]

    def copy(self, name: str, dest: Path) -> Path:
        """A private, writable copy of a built scenario table (commit file times are kept)."""
        target = dest / name
        shutil.copytree(self.get(name).path, target)
        return target

    def __iter__(self) -> Iterator[Scenario]:
        return (self.get(name) for name in ALL_SCENARIOS)

    def _wait(self, name: str) -> None:
        future = self._prefetched.get(name)
        if future is not None and not future.cancelled():
            future.result()  # re-raises a failed build

    def _build(self, name: str) -> Scenario:
        with self._locks[name]:
            if name in self._failed:  # a half-built table stays broken: report the original error again
                raise RuntimeError(f"scenario {name!r} failed to build earlier") from self._failed[name]
            if name not in self._built:
                try:
                    self._built[name] = ALL_SCENARIOS[name](self.spark, os.fspath(self._root / name))
                except BaseException as exc:
                    self._failed[name] = exc
                    raise
            return self._built[name]

    def _read(self, name: str) -> tuple[list[dict[str, Any]] | None, str | None]:
        with self._locks[name]:
            if name not in self._results:
                sc = self._build(name)
                error = sc.spark_error(self.spark) if sc.expected_error is not None else None
                self._results[name] = (
                    (None, error) if error is not None else (sc.spark_rows(self.spark), None)
                )
            return self._results[name]

    def _build_and_read(self, name: str) -> None:
        self._build(name)
        # A read that fails here is tried again, and reported, by the test that needs it.
        with contextlib.suppress(Exception):
            self._read(name)


def scenarios_used_by(items: Iterable[pytest.Item]) -> list[str]:
    """Scenario names the selected tests take as their `name` parameter, in test order."""
    names: dict[str, None] = {}
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is None or "spark_scenarios" not in getattr(item, "fixturenames", ()):
            continue
        name = callspec.params.get("name")
        if isinstance(name, str) and name in ALL_SCENARIOS:
            names.setdefault(name, None)
    return list(names)


_cache: ScenarioCache | None = None


@pytest.fixture(scope="session")
def spark_scenarios(
    spark: SparkSession, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[ScenarioCache]:
    """Session-wide cache of scenario tables: `spark_scenarios.get("merge_dv")`.

    Each test module that imports this fixture gets its own session-scoped copy of it from pytest,
    so the cache itself is a module global: every module sees the same tables, built once. The
    scenarios the selected tests are parametrized with are built in the background from the start.
    """
    global _cache
    if _cache is None or _cache.spark is not spark:
        _cache = ScenarioCache(spark, tmp_path_factory.mktemp("spark-scenarios"))
        _cache.prefetch(scenarios_used_by(request.session.items))
    yield _cache
    _cache.close()
