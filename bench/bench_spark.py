"""Spark: ``readStream.format("deltamirror")`` beside delta-spark's own change-feed stream (and its batch
change feed), on the same tables: contenders for ``bench/run.py`` (each in its own process and JVM).

Tables (``setup``, not timed): written by delta-rs with the change data feed on, by
``bench_changes.build_table`` (appends, UPDATEs and DELETEs with change data files, then DELETEs
with deletion vectors), cached under bench/.data; each is mirrored by the watcher from version 0
into fresh topics before the rounds. ``small`` (a few rows per version, ``maxFilesPerTrigger`` 3:
many micro-batches, so the per-batch overhead decides) and ``large`` (tens of thousands of rows
per version, default trigger options: throughput decides).

Every contender starts its own local[2] SparkSession with delta-spark (the oracle's session of
tests/support/spark.py, with Spark's defaults for whole-stage code generation, adaptive execution
and the JIT restored: the fastest documented form, not the test suite's settings for tiny tables).
"After imports" is after the session started (and, for deltamirror, ``register(spark)``). Timed:

- ``deltamirror`` / ``delta-spark``: one streaming query with ``Trigger.AvailableNow`` from
  ``startingVersion`` 0, each micro-batch consumed by ``foreachBatch`` in one pass that needs
  every column (``count`` and ``sum(hash(every column))``: the rows and a checksum the contenders
  must agree on), from ``start()`` to ``awaitTermination()`` returning. (The ``noop`` sink would
  be cheaper, but the rows its progress reports count are the rows the source scanned: delta-spark
  counts the rows of a file rewritten with a deletion vector, deltamirror only the rows deleted);
- ``delta-spark-batch``: ``spark.read.format("delta").option("readChangeFeed", "true")`` from
  version 0, the same one pass over every column.

Peak memory is the JVM's (``VmHWM``); the Python workers of the deltamirror source are not in it.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
DATA = BENCH / ".data"
sys.path.insert(0, str(BENCH))


def setup(clock: Any, params: dict[str, Any]) -> dict[str, Any]:
    """Build (or reuse) the table and mirror it from version 0 into fresh topics."""
    from bench_changes import build_table

    sys.path.insert(0, str(REPO / "tests"))
    from support.watching import watch_until

    clock.start()
    versions, per_version = params["versions"], params["rows_per_version"]
    path = Path(params.get("data_dir", DATA)) / f"spark-{versions}x{per_version}"
    info_file = path / "bench_info.json"
    if not info_file.is_file():
        build_table(path, versions, per_version)
    import json

    info = json.loads(info_file.read_text())
    last = int(info["versions"]) - 1
    name = f"dmbench-spark-{uuid.uuid4().hex[:8]}"
    actions = f"{name}.actions"
    watch_until(params["bootstrap"], path, actions, last, name, snapshot_mode="from-version", timeout_s=600)
    clock.stop()
    topics = [actions, f"{name}.commits", f"{name}.progress"]
    return {
        **params,
        **info,
        "path": str(path),
        "actions": actions,
        "commits": f"{name}.commits",
        "inputs": [],
        "cleanup": {"topics": topics, "dirs": []},
    }


def _session(work_dir: str) -> Any:
    """The oracle's session with Spark's own performance defaults (see the module docstring)."""
    sys.path.insert(0, str(REPO / "tests"))
    from pyspark.sql import SparkSession

    from support.spark import spark_conf, use_this_python_for_workers

    conf = spark_conf(work_dir)
    for key in (
        "spark.sql.codegen.wholeStage",
        "spark.sql.codegen.factoryMode",
        "spark.sql.adaptive.enabled",
    ):
        conf.pop(key, None)
    conf["spark.driver.extraJavaOptions"] = conf["spark.driver.extraJavaOptions"].replace(
        " -XX:TieredStopAtLevel=1", ""
    )
    conf["spark.app.name"] = "deltamirror-bench"
    use_this_python_for_workers()
    builder = SparkSession.builder
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _jvm_peak_mb(spark: Any) -> float:
    from harness import peak_rss_mb

    return peak_rss_mb(str(spark.sparkContext._jvm.ProcessHandle.current().pid()))


def _count_and_hash(df: Any, by_version: dict[str, list[int]] | None = None) -> tuple[int, int]:
    """One pass that needs every column of every row: the row count and the sum of a hash of each
    row (its columns in name order), which two readers of the same changes must agree on.

    ``by_version`` (smoke runs): the same per ``_commit_version`` into this dict, as [rows, hash of
    the columns but ``_commit_timestamp``, latest ``_commit_timestamp`` in us], so that a
    disagreement names the versions and the part that differ."""
    from pyspark.sql import functions as F

    every_column = F.hash(*[F.col(f"`{c}`") for c in sorted(df.columns)])
    if by_version is None:
        row = df.agg(F.count(F.lit(1)).alias("rows"), F.sum(every_column.cast("long")).alias("h")).collect()[
            0
        ]
        return int(row["rows"]), int(row["h"] or 0)
    data = F.hash(*[F.col(f"`{c}`") for c in sorted(df.columns) if c != "_commit_timestamp"])
    rows = (
        df.groupBy("_commit_version")
        .agg(
            F.count(F.lit(1)).alias("rows"),
            F.sum(every_column.cast("long")).alias("h"),
            F.sum(data.cast("long")).alias("d"),
            F.max(F.unix_micros("_commit_timestamp")).alias("ts"),
        )
        .collect()
    )
    for r in rows:
        old = by_version.setdefault(str(r["_commit_version"]), [0, 0, 0])
        by_version[str(r["_commit_version"])] = [
            old[0] + r["rows"],
            old[1] + int(r["d"]),
            max(old[2], r["ts"]),
        ]
    return sum(int(r["rows"]) for r in rows), sum(int(r["h"] or 0) for r in rows)


def _stream(clock: Any, params: dict[str, Any], ours: bool) -> dict[str, Any]:
    work_dir = tempfile.mkdtemp(prefix="dmbench-spark-")
    try:
        spark = _session(work_dir)
        if ours:
            from deltamirror.consumer.spark.source import register

            register(spark)
        clock.imported()
        clock.start()
        if ours:
            reader = (
                spark.readStream.format("deltamirror")
                .option("kafka.bootstrap.servers", params["bootstrap"])
                .option("actionsTopic", params["actions"])
                .option("commitsTopic", params["commits"])
            )
        else:
            reader = spark.readStream.format("delta").option("readChangeFeed", "true")
        reader = reader.option("startingVersion", "0")
        for key, value in params.get("options", {}).items():
            reader = reader.option(key, str(value))
        totals: list[tuple[int, int]] = []
        by_version: dict[str, list[int]] | None = {} if params.get("by_version") else None

        def every_row(df: Any, _batch_id: int) -> None:
            totals.append(_count_and_hash(df, by_version))

        query = (
            reader.load(params["path"])
            .writeStream.foreachBatch(every_row)
            .option("checkpointLocation", str(Path(work_dir) / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        clock.stop()
        if query.exception() is not None:
            raise SystemExit(f"the query failed: {query.exception()}")
        rows = sum(n for n, _ in totals)
        checksum = sum(h for _, h in totals)
        batches = sum(1 for n, _ in totals if n)
        peak = _jvm_peak_mb(spark)
        spark.stop()
        facts = {"rows": rows, "checksum": checksum, "batches": batches, "peak_rss_mb": peak, "ok": rows > 0}
        if by_version is not None:
            facts["by_version"] = json.dumps(by_version, sort_keys=True)
        return facts
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)


def spark_deltamirror(clock: Any, params: dict[str, Any]) -> dict[str, Any]:
    """``readStream.format("deltamirror")`` from Kafka, AvailableNow; every micro-batch counted and hashed."""
    return _stream(clock, params, ours=True)


def spark_delta_stream(clock: Any, params: dict[str, Any]) -> dict[str, Any]:
    """delta-spark's ``readStream.format("delta").option("readChangeFeed", "true")``, AvailableNow;
    every micro-batch counted and hashed."""
    return _stream(clock, params, ours=False)


def spark_delta_batch(clock: Any, params: dict[str, Any]) -> dict[str, Any]:
    """delta-spark's batch ``readChangeFeed`` from version 0: count and a hash of every column."""
    work_dir = tempfile.mkdtemp(prefix="dmbench-spark-")
    try:
        spark = _session(work_dir)
        clock.imported()
        clock.start()
        df = (
            spark.read.format("delta")
            .option("readChangeFeed", "true")
            .option("startingVersion", "0")
            .load(params["path"])
        )
        by_version: dict[str, list[int]] | None = {} if params.get("by_version") else None
        rows, checksum = _count_and_hash(df, by_version)
        clock.stop()
        peak = _jvm_peak_mb(spark)
        spark.stop()
        facts = {"rows": rows, "checksum": checksum, "peak_rss_mb": peak, "ok": rows > 0}
        if by_version is not None:
            facts["by_version"] = json.dumps(by_version, sort_keys=True)
        return facts
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
