"""Warm the delta-spark jar cache once (CI runs this before pytest) so Spark tests don't pay the download.

Starts the oracle SparkSession with exactly the configuration the tests use (tests/support/spark.py),
which makes Ivy resolve io.delta:delta-spark into .cache/ivy, runs one tiny Delta write to prove the
jars load, stops it and prints the elapsed time.

    python scripts/fetch_spark_jars.py          # Ivy (spark.jars.packages) into .cache/ivy
    python scripts/fetch_spark_jars.py --mvn    # fallback: mvn copy-dependencies into .cache/jars

The test session picks up .cache/jars automatically when it holds a delta-spark jar. Like the test
session, it runs Spark's Python workers with this interpreter (support.spark sets PYSPARK_PYTHON),
never with whatever `python3` comes first on PATH.
Exit code 0 on success, 1 when pyspark is missing or the jars cannot be resolved.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "tests"))

from support import spark as spark_support  # noqa: E402

POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>deltamirror</groupId><artifactId>spark-oracle-jars</artifactId><version>0</version>
  <dependencies>
    <dependency><groupId>{g}</groupId><artifactId>{a}</artifactId><version>{v}</version></dependency>
  </dependencies>
</project>
"""


def fetch_with_maven() -> None:
    group, artifact, version = spark_support.DELTA_SPARK_PACKAGE.split(":")
    with tempfile.TemporaryDirectory() as tmp:
        pom = Path(tmp) / "pom.xml"
        pom.write_text(POM.format(g=group, a=artifact, v=version))
        # Spark and Scala already ship inside pyspark/jars: copy only what delta-spark adds.
        subprocess.run(
            [
                "mvn",
                "-q",
                "-f",
                str(pom),
                "dependency:copy-dependencies",
                f"-DoutputDirectory={spark_support.JARS_DIR}",
                "-DincludeScope=runtime",
                "-DexcludeGroupIds=org.apache.spark,org.scala-lang",
            ],
            check=True,
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mvn", action="store_true", help="fetch with Maven into .cache/jars instead of Ivy")
    args = parser.parse_args()
    try:
        import pyspark
    except ImportError:
        print("pyspark is not installed: pip install -e .[spark]", file=sys.stderr)
        return 1

    started = time.monotonic()
    if args.mvn:
        fetch_with_maven()
        print(f"mvn copy-dependencies: {time.monotonic() - started:.1f}s -> {spark_support.JARS_DIR}")

    t0 = time.monotonic()
    session = spark_support.get_spark_session()
    t_session = time.monotonic() - t0
    with tempfile.TemporaryDirectory() as tmp:
        session.range(3).write.format("delta").save(str(Path(tmp) / "t"))
        n = session.read.format("delta").load(str(Path(tmp) / "t")).count()
    spark_support.stop_spark_session()
    if n != 3:
        print(f"delta round trip returned {n} rows, expected 3", file=sys.stderr)
        return 1
    conf = spark_support.spark_conf("<tmp>")
    if "spark.jars" in conf:
        source = f"spark.jars from {spark_support.JARS_DIR}"
    else:
        source = f"spark.jars.packages={conf['spark.jars.packages']}"
    print(f"pyspark {pyspark.__version__}; {source}")
    print(f"first SparkSession: {t_session:.1f}s; total: {time.monotonic() - started:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
