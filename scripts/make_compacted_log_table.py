#!/usr/bin/env python3
"""Write tests/data/tables/gen__log-compaction: a table whose log compaction files a real writer wrote.

    python scripts/make_compacted_log_table.py OUT_DIR EXPECTED_JSON

delta-spark writes the data (create, inserts, deletes with deletion vectors, an update, a merge, a
checkpoint at version 6); Delta Kernel Java (the ``delta-kernel-api``/``-defaults`` jars delta-spark
depends on, driven through the Spark JVM) commits a table-property change at versions 3, 7 and 11
with ``TransactionBuilder.withLogCompactionInverval(4)`` and runs the post-commit hooks its commit
returns, so Kernel's own ``LogCompactionWriter`` writes ``0.3``, ``4.7`` and ``8.11`` (Kernel
compacts after version v when (v + 1) % interval == 0). One more, ``8.12`` (overlapping ``8.11``,
wider), is written by the same hook class called directly, as Delta's own ``DeltaTableReadsSuite``
does, with the tombstone retention Kernel's transaction gives it (a week). No compaction file is
written by hand. Kernel's commits also set a ``txn`` and add (3) and remove (11) a domain's
metadata, so the compaction files hold every kind of state. EXPECTED_JSON gets the rows delta-spark
reads at every version from the commits alone.

Why those ranges: ``0.3`` is usable for snapshots 3-5; ``4.7`` starts before the checkpoint at 6
and so is never usable; ``8.11`` and ``8.12`` overlap (a reader takes the wider one for version 12
and the narrower one for 11).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "tests"))

from support import spark as spark_support  # noqa: E402

INTERVAL = 4
RETENTION_MS = 7 * 24 * 3600 * 1000  # delta.deletedFileRetentionDuration's default, one week


def kernel_commit(
    spark: Any, path: str, properties: dict[str, str], txn_version: int, domain: str | None = None
) -> Any:
    """A Kernel Java commit that sets table properties and a txn (and a domain's metadata, or removes
    it: ``domain`` is its configuration, "" to remove it), its post-commit hooks run as a writer does.
    Returns Kernel's engine."""
    jvm = spark._jvm
    kernel = jvm.io.delta.kernel
    engine = kernel.defaults.engine.DefaultEngine.create(spark._jsc.hadoopConfiguration())
    table = kernel.Table.forPath(engine, path)
    props = jvm.java.util.HashMap()
    for key, value in properties.items():
        props.put(key, value)
    builder = table.createTransactionBuilder(engine, "deltamirror-fixture", kernel.Operation.MANUAL_UPDATE)
    builder = builder.withTableProperties(engine, props).withLogCompactionInverval(INTERVAL)
    builder = builder.withTransactionId(engine, "deltamirror-fixture-app", txn_version)
    if domain is not None:
        builder = builder.withDomainMetadataSupported()
    txn = builder.build(engine)
    if domain:
        txn.addDomainMetadata("deltamirror.fixture", domain)
    elif domain == "":
        txn.removeDomainMetadata("deltamirror.fixture")
    result = txn.commit(engine, kernel.utils.CloseableIterable.emptyIterable())
    hooks = [str(h.getType()) for h in result.getPostCommitHooks()]
    for hook in result.getPostCommitHooks():
        hook.threadSafeInvoke(engine)
    print(f"kernel commit {result.getVersion()}: hooks {hooks}", file=sys.stderr)
    return engine


def kernel_compaction(spark: Any, engine: Any, path: str, start: int, end: int) -> None:
    jvm = spark._jvm
    kpath = jvm.io.delta.kernel.internal.fs.Path
    hook = jvm.io.delta.kernel.internal.hook.LogCompactionHook(
        kpath("file:" + path),
        kpath("file:" + path + "/_delta_log"),
        start,
        end,
        int(time.time() * 1000) - RETENTION_MS,
    )
    hook.threadSafeInvoke(engine)


def write_expected(spark: Any, path: str, out: Path) -> None:
    """The rows delta-spark reads at every version, from the commits alone (its own use of
    compaction files turned off): the oracle a reader that uses them is checked against."""
    spark.conf.set("spark.databricks.delta.deltaLog.minorCompaction.useForReads", "false")
    spark.catalog.clearCache()
    columns = ["id", "part", "v"]
    versions = {}
    for version in range(13):
        rows = spark.read.format("delta").option("versionAsOf", version).load(path).select(*columns).collect()
        versions[str(version)] = sorted([list(r) for r in rows], key=lambda r: r[0])
    spec = {
        "table": Path(path).name,
        "kind": "rows at every version, read by delta-spark 4.4.0 from the commits "
        "(spark.databricks.delta.deltaLog.minorCompaction.useForReads=false)",
        "columns": columns,
        "versions": versions,
    }
    out.write_text(json.dumps(spec, indent=1) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("expected", type=Path, help="where the rows delta-spark reads at each version go")
    args = parser.parse_args()
    out: Path = args.out.resolve()
    if out.exists():
        shutil.rmtree(out)
    spark = spark_support.get_spark_session()
    path = str(out)
    sql = spark.sql
    sql(
        f"CREATE TABLE delta.`{path}` (id INT, part STRING, v STRING) USING delta PARTITIONED BY (part) "
        "TBLPROPERTIES ('delta.enableDeletionVectors'='true', 'delta.enableChangeDataFeed'='true', "
        "'delta.checkpointInterval'='6')"
    )  # 0
    insert = f"INSERT INTO delta.`{path}` SELECT /*+ REPARTITION(1) */ * FROM VALUES "
    sql(insert + "(1,'a','one'),(2,'a','two'),(3,'b','three')")  # 1: one file per partition
    sql(insert + "(4,'b','four'),(5,'c','five')")  # 2
    engine = kernel_commit(
        spark, path, {"deltamirror.fixture.step": "3"}, 3, '{"step":3}'
    )  # 3: compaction 0-3
    sql(f"DELETE FROM delta.`{path}` WHERE id = 2")  # 4: a deletion vector
    sql(f"UPDATE delta.`{path}` SET v = 'FIVE' WHERE id = 5")  # 5
    sql(
        f"MERGE INTO delta.`{path}` t USING (SELECT 3 AS id, 'b' AS part, 'THREE' AS v UNION ALL "
        "SELECT 6, 'c', 'six') s ON t.id = s.id "
        "WHEN MATCHED THEN UPDATE SET v = s.v WHEN NOT MATCHED THEN INSERT *"
    )  # 6: checkpoint
    # 7: compaction 4-7 (no more checkpoints: the next would hide the compactions after this one)
    kernel_commit(spark, path, {"deltamirror.fixture.step": "7", "delta.checkpointInterval": "100"}, 7)
    sql(f"DELETE FROM delta.`{path}` WHERE part = 'c'")  # 8: whole files removed
    sql(insert + "(7,'a','seven'),(8,'b','eight'),(9,'c','nine')")  # 9
    sql(f"DELETE FROM delta.`{path}` WHERE id = 1")  # 10: a deletion vector
    kernel_commit(spark, path, {"deltamirror.fixture.step": "11"}, 11, "")  # 11: compaction 8-11
    sql(f"UPDATE delta.`{path}` SET v = 'EIGHT' WHERE id = 8")  # 12
    kernel_compaction(spark, engine, path, 8, 12)
    write_expected(spark, path, args.expected)
    spark_support.stop_spark_session()
    staged = out / "_delta_log" / "_staged_commits"  # Kernel makes it; empty, and git holds no folder
    if staged.is_dir() and not any(staged.iterdir()):
        staged.rmdir()
    for f in sorted((out / "_delta_log").iterdir()):
        print(f.name, f.stat().st_size, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
