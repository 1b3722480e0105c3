"""One local SparkSession with delta-spark, shared by every `@pytest.mark.spark` test.

delta-spark is the change-data-feed oracle: its jars are resolved by Ivy from Maven Central into
`.cache/ivy` under the repo (warmed once by `scripts/fetch_spark_jars.py`), so a test run pays the JVM
start (~10 s) but not the download. The session is created lazily on first use, so collecting or
running non-Spark tests never starts a JVM.

Use it by importing the fixture into a test module (or a conftest):
    from support.spark import spark  # noqa: F401
The session itself lives in a module global, so importing the fixture into several modules still
yields ONE JVM per test session.

Spark's Python workers run this interpreter (``sys.executable``), whatever ``python3`` comes first on
PATH and whatever the shell exported: see :func:`use_this_python_for_workers`.
"""

from __future__ import annotations

import atexit
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

REPO_ROOT = Path(__file__).resolve().parents[2]

# delta-spark for Spark 4.2 / Scala 2.13 (its pom depends on spark-sql 4.2.0); pyspark must be 4.2.x.
# 4.4.0, not 4.4.1: the PyPI wheel delta-spark==4.4.1 exists, but Maven Central has no 4.4.1 jar
# (io.delta:delta-spark_4.2_2.13 lists only 4.4.0; .../4.4.1/delta-spark_4.2_2.13-4.4.1.jar is a 404,
# checked again 2026-11-23), so Ivy cannot resolve 4.4.1.
DELTA_SPARK_PACKAGE = os.environ.get("DELTAMIRROR_DELTA_SPARK_PACKAGE", "io.delta:delta-spark_4.2_2.13:4.4.0")
# Spark's own Kafka source, for the recipe that reads the topics with format("kafka") + from_json.
SPARK_KAFKA_PACKAGE = os.environ.get(
    "DELTAMIRROR_SPARK_KAFKA_PACKAGE", "org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0"
)
# spark-avro (Spark's from_avro), for the recipe that reads Avro row changes after the 5-byte Confluent
# header with the schema the registry holds; the version of pyspark, as for the Kafka source.
SPARK_AVRO_PACKAGE = os.environ.get(
    "DELTAMIRROR_SPARK_AVRO_PACKAGE", "org.apache.spark:spark-avro_2.13:4.2.0"
)
#: every package the session resolves: by Ivy, from Maven Central only (ivysettings.xml), each download
#: checked against the checksum Central publishes beside it (Ivy's default `ivy.checksums`)
SPARK_PACKAGES = (DELTA_SPARK_PACKAGE, SPARK_KAFKA_PACKAGE, SPARK_AVRO_PACKAGE)
IVY_DIR = Path(os.environ.get("DELTAMIRROR_IVY_DIR", REPO_ROOT / ".cache" / "ivy"))
#: resolve from Maven Central only (see the file for why not ~/.m2)
IVY_SETTINGS = Path(__file__).with_name("ivysettings.xml")
# Fallback when Ivy cannot resolve: jars copied by `mvn dependency:copy-dependencies` (see
# scripts/fetch_spark_jars.py --mvn). Used only if the directory holds a delta-spark jar.
JARS_DIR = Path(os.environ.get("DELTAMIRROR_SPARK_JARS_DIR", REPO_ROOT / ".cache" / "jars"))


def _fallback_jars() -> list[str]:
    if not JARS_DIR.is_dir():
        return []
    jars = sorted(str(p) for p in JARS_DIR.glob("*.jar"))
    return jars if any("delta-spark" in Path(j).name for j in jars) else []


#: the settings that choose the Python of Spark's workers (and of a spark-submit driver)
PYTHON_ENV = ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")


def use_this_python_for_workers() -> None:
    """Make Spark's Python workers run ``sys.executable``; call before the SparkContext starts.

    In local mode pyspark 4.2 takes the workers' interpreter from ``PYSPARK_PYTHON`` as it is when the
    SparkContext starts (else the ``python3`` on PATH); ``spark.pyspark.python`` given to the builder
    does not reach them (it does with spark-submit), so both are set: the variable for this process,
    the configuration for the record. Measured: with only the configuration, workers ran
    /usr/bin/python3 and could not import pyarrow.
    """
    for name in PYTHON_ENV:
        os.environ[name] = sys.executable


def spark_conf(work_dir: str) -> dict[str, str]:
    """The exact configuration of the oracle session (also printed by fetch_spark_jars.py)."""
    conf = {
        "spark.master": "local[2]",
        "spark.pyspark.python": sys.executable,
        "spark.pyspark.driver.python": sys.executable,
        "spark.app.name": "deltamirror-oracle",
        "spark.driver.memory": "2g",
        "spark.sql.shuffle.partitions": "2",
        "spark.default.parallelism": "2",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        "spark.sql.warehouse.dir": os.path.join(work_dir, "warehouse"),
        # C1-only JIT: a short-lived JVM on 2 cores spends less CPU compiling than it would gain.
        "spark.driver.extraJavaOptions": (
            f"-Dderby.system.home={os.path.join(work_dir, 'derby')} -Duser.timezone=UTC"
            " -XX:TieredStopAtLevel=1"
        ),
        "spark.sql.adaptive.enabled": "false",
        # Tables are tiny: compiling generated code (Janino) costs more CPU than interpreting it.
        "spark.sql.codegen.wholeStage": "false",
        "spark.sql.codegen.factoryMode": "NO_CODEGEN",
        "spark.databricks.delta.snapshotPartitions": "2",
        # Keep scenario tables deterministic: no background auto-compaction / optimize-write.
        "spark.databricks.delta.autoCompact.enabled": "false",
        "spark.databricks.delta.optimizeWrite.enabled": "false",
        # MERGE sources here are deterministic: skip caching them (speed only; commits are the same).
        "spark.databricks.delta.merge.materializeSource": "none",
        # Scenario definitions set table features explicitly; don't let session defaults add any.
        "spark.databricks.delta.properties.defaults.enableDeletionVectors": "false",
    }
    jars = _fallback_jars()
    if jars:
        conf["spark.jars"] = ",".join(jars)
    else:
        conf["spark.jars.packages"] = ",".join(SPARK_PACKAGES)
        conf["spark.jars.ivy"] = str(IVY_DIR)
        conf["spark.jars.ivySettings"] = str(IVY_SETTINGS)
    return conf


_session: Any = None
_work_dir: str | None = None


def get_spark_session() -> SparkSession:
    """Create (once) and return the process-wide oracle session."""
    global _session, _work_dir
    if _session is not None:
        return _session
    from pyspark.sql import SparkSession

    _work_dir = tempfile.mkdtemp(prefix="deltamirror-spark-")
    use_this_python_for_workers()
    builder = SparkSession.builder
    for key, value in spark_conf(_work_dir).items():
        builder = builder.config(key, value)
    try:
        session = builder.getOrCreate()
    except Exception as exc:
        raise RuntimeError(
            f"could not start the delta-spark oracle session ({DELTA_SPARK_PACKAGE}); "
            "warm the jar cache with `python scripts/fetch_spark_jars.py` (or `--mvn`)"
        ) from exc
    session.sparkContext.setLogLevel("ERROR")
    _session = session
    atexit.register(stop_spark_session)
    return session


def stop_spark_session() -> None:
    global _session
    if _session is not None:
        session, _session = _session, None
        session.stop()
    if _work_dir is not None:
        import shutil

        shutil.rmtree(_work_dir, ignore_errors=True)


def _pyspark_missing_reason() -> str | None:
    try:
        import pyspark
    except ImportError as exc:
        return f"pyspark not importable ({exc}); install with `pip install -e .[spark]`"
    if not pyspark.__version__.startswith("4.2."):
        return f"pyspark {pyspark.__version__} installed; {DELTA_SPARK_PACKAGE} needs pyspark 4.2.x"
    return None


def require_pyspark() -> None:
    """Skip the calling test when pyspark 4.2 is missing (fail it under DELTAMIRROR_REQUIRE_ALL)."""
    reason = _pyspark_missing_reason()
    if reason is not None:
        if os.environ.get("DELTAMIRROR_REQUIRE_ALL"):  # CI: a missing oracle is a failure, not a skip
            pytest.fail(reason)
        pytest.skip(reason)


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """The shared delta-spark session (skips the test when pyspark is unavailable)."""
    require_pyspark()
    yield get_spark_session()
    stop_spark_session()
