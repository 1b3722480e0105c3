"""Debezium's consumers, run on the JVM, as test oracles for the row-change records.

The row-change records claim to be Debezium's envelope: the proof is that the components Debezium
users run accept them. Two small Java programs feed records through the real classes, from Maven
Central, pinned by SHA-256 in ``tests/jvm/*_artifacts.json`` and fetched and verified by the same
code as the broker's jars (:func:`deltamirror.devkafka.jars.ensure_jars`):

- ``tests/jvm/DebeziumCheck.java``: Kafka Connect's ``JsonConverter`` then Debezium's
  ``ExtractNewRecordState`` (:func:`run_checks`): what a Connect sink receives;
- ``tests/jvm/FlinkDebeziumCheck.java``: Flink's ``debezium-json`` format
  (``DebeziumJsonDeserializationSchema``, :func:`run_flink`): the changelog rows (+I, -U, +U, -D)
  a Flink SQL table gets from plain JSON.

Each is compiled once into the cache (keyed by the source and the classpath) and started once per
call: give it all records at once.

Regenerate the pins (a maintainer, with ``mvn``) after moving Kafka, Debezium or Flink:
    .venv/bin/python tests/support/debezium_jvm.py --pin
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

from deltamirror.core.errors import EnvironmentMissingError
from deltamirror.devkafka import jars as kafka_jars

JVM_DIR = Path(__file__).resolve().parents[1] / "jvm"

#: the transform settings of a sink that wants flat rows with the operation and the commit time
FLATTEN = {
    "add.fields": "op,source.ts_ms",
    "delete.tombstone.handling.mode": "rewrite",
}


@dataclass(frozen=True)
class JvmCheck:
    """A Java program of ``tests/jvm`` and the pinned jars it runs with."""

    name: str
    pins: Path
    main_class: str

    @property
    def source(self) -> Path:
        return JVM_DIR / f"{self.main_class}.java"


CONNECT = JvmCheck("debezium", JVM_DIR / "debezium_artifacts.json", "DebeziumCheck")
FLINK = JvmCheck("flink", JVM_DIR / "flink_artifacts.json", "FlinkDebeziumCheck")
#: a standalone Kafka Connect worker (connect-runtime, connect-file's sink) with Apicurio Registry's
#: AvroConverter: not a program of tests/jvm, the worker's own main class (see support/connect_avro.py)
CONNECT_AVRO = JvmCheck(
    "connect-avro", JVM_DIR / "connect_avro_artifacts.json", "org.apache.kafka.connect.cli.ConnectStandalone"
)
#: connect-file is served up to 4.3.1 (4.4.0 is not on Maven Central, checked 2026-11-29): the worker is
#: 4.3.1 throughout (a 4.3 client speaks to the 4.4 broker)
CONNECT_AVRO_KAFKA = "4.3.1"
#: Apicurio's converter at the registry's version (devkafka/registry_pom.xml)
APICURIO_VERSION = "2.4.2.Final"


@dataclass(frozen=True)
class JvmRecord:
    """One Kafka record for the Connect check: ``profile`` names a converter/transform setting."""

    profile: str
    topic: str
    key: bytes | None
    value: bytes | None


def load_pins(check: JvmCheck = CONNECT) -> tuple[dict[str, Any], tuple[kafka_jars.ArtifactPin, ...]]:
    doc: dict[str, Any] = json.loads(check.pins.read_text("utf-8"))
    return doc, tuple(kafka_jars.ArtifactPin(**a) for a in doc["artifacts"])


def classpath(check: JvmCheck = CONNECT) -> list[Path]:
    """The verified jars (downloaded into the project's cache on first use)."""
    _, pins = load_pins(check)
    return kafka_jars.ensure_jars(pins, cache_dir=kafka_jars.cache_root() / "jvm-checks" / check.name)


def _javac(java: Path) -> Path:
    beside = java.with_name("javac")
    if os.access(beside, os.X_OK):
        return beside
    found = shutil.which("javac")
    if found is None:
        raise EnvironmentMissingError(f"javac (a JDK {kafka_jars.MIN_JAVA}+) is required beside {java}")
    return Path(found)


def compiled_classes(check: JvmCheck, jars: Sequence[Path]) -> Path:
    """The compiled check, built once per source and classpath (the cache key)."""
    java = kafka_jars.find_java()
    digest = hashlib.sha256(check.source.read_bytes() + "\n".join(p.name for p in jars).encode())
    out = kafka_jars.cache_root() / "jvm-checks" / "classes" / f"{check.name}-{digest.hexdigest()[:16]}"
    with kafka_jars.exclusive_lock(out.parent / ".lock"):
        if not (out / f"{check.main_class}.class").is_file():
            tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=".build-"))
            try:
                cmd = [str(_javac(java)), "-nowarn", "-d", str(tmp), "-cp", os.pathsep.join(map(str, jars))]
                done = subprocess.run([*cmd, str(check.source)], capture_output=True, text=True, check=False)
                if done.returncode != 0:
                    raise RuntimeError(f"javac failed: {done.stderr.strip()}")
                os.replace(tmp, out)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    return out


def _run(check: JvmCheck, args: Sequence[str], lines: Sequence[str]) -> list[dict[str, Any]]:
    jars = classpath(check)
    classes = compiled_classes(check, jars)
    cmd = [
        str(kafka_jars.find_java()),
        "-XX:TieredStopAtLevel=1",
        "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
        "-cp",
        os.pathsep.join([str(classes), *map(str, jars)]),
        check.main_class,
        *args,
    ]
    done = subprocess.run(
        cmd, input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=300, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"{check.main_class} exited with {done.returncode}: {done.stderr.strip()[-2000:]}")
    # numbers read exactly: 3.14 stays 3.14, a decimal keeps its scale
    results = [json.loads(line, parse_float=Decimal) for line in done.stdout.splitlines() if line.strip()]
    if len(results) != len(lines):
        raise RuntimeError(
            f"{check.main_class} answered {len(results)} of {len(lines)} records: {done.stderr}"
        )
    return results


def run_checks(
    profiles: Mapping[str, Mapping[str, Any]], records: Sequence[JvmRecord]
) -> list[dict[str, Any]]:
    """What Kafka Connect's JsonConverter and Debezium's ExtractNewRecordState make of ``records``.

    ``profiles`` maps a name to ``{"key.schemas.enable": "true"|"false", "value.schemas.enable": ...,
    "transform": {ExtractNewRecordState settings} | None}``. One result per record, in order: a
    record the components refuse has ``error`` set (the exception's class and message); the others
    have ``key``/``value`` as a schemaless sink would see them, ``dropped`` when the transform
    returned no record.
    """
    lines = [
        json.dumps(
            {
                "profile": r.profile,
                "topic": r.topic,
                "key": None if r.key is None else base64.b64encode(r.key).decode(),
                "value": None if r.value is None else base64.b64encode(r.value).decode(),
            }
        )
        for r in records
    ]
    with tempfile.NamedTemporaryFile("w", suffix=".json", encoding="utf-8") as spec:
        json.dump(profiles, spec)
        spec.flush()
        return _run(CONNECT, [spec.name], lines)


def run_flink(row_type: str, values: Sequence[bytes]) -> list[dict[str, Any]]:
    """What Flink's ``debezium-json`` format (schema-include off) makes of each record value.

    ``row_type``: the table's columns as a Flink row type (``ROW<`id` INT, ...>``). One result per
    value: ``error`` (null when accepted) and ``rows``, each ``{"kind": "+I"|"-U"|"+U"|"-D",
    "fields": [text or null, ...]}``.
    """
    return _run(FLINK, [row_type], [base64.b64encode(v).decode() for v in values])


# --- regenerating the pins (maintainers, with mvn) ----------------------------------------------

_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>deltamirror.tmp</groupId>
  <artifactId>pin-jvm-check</artifactId>
  <version>0</version>
  <dependencies>
{dependencies}
    <dependency><groupId>org.slf4j</groupId><artifactId>slf4j-simple</artifactId><version>1.7.36</version></dependency>
  </dependencies>
</project>
"""

#: kafka-clients' compression codecs and the REST API jar: the converter and the transform never load them
_CONNECT_NOT_NEEDED = frozenset({"zstd-jni", "lz4-java", "snappy-java", "jakarta.ws.rs-api"})
#: of flink-table-runtime's 100 MB closure, what the debezium-json format loads (found by leaving each out)
_FLINK_NEEDED = frozenset(
    {
        "flink-json",
        "flink-table-common",
        "flink-table-runtime",
        "flink-core",
        "flink-core-api",
        "flink-annotations",
        "flink-shaded-jackson",
        "flink-shaded-guava",
        "flink-metrics-core",
        "commons-lang3",
        "slf4j-api",
        "slf4j-simple",
    }
)


def _resolve(
    dependencies: Sequence[tuple[str, str, str]], exclusions: Mapping[str, Sequence[tuple[str, str]]] = {}
) -> list[dict[str, Any]]:
    """Resolve the runtime closure with Maven (strict checksums) and describe it as the broker's pins."""
    spec = importlib.util.spec_from_file_location(
        "pin_kafka_artifacts", Path(__file__).resolve().parents[2] / "scripts" / "pin_kafka_artifacts.py"
    )
    assert spec is not None and spec.loader is not None
    pinner = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pinner)

    def excluded(artifact: str) -> str:
        inner = "".join(
            f"<exclusion><groupId>{g}</groupId><artifactId>{a}</artifactId></exclusion>"
            for g, a in exclusions.get(artifact, ())
        )
        return f"<exclusions>{inner}</exclusions>" if inner else ""

    deps = "\n".join(
        f"    <dependency><groupId>{g}</groupId><artifactId>{a}</artifactId><version>{v}</version>"
        f"{excluded(a)}</dependency>"
        for g, a, v in dependencies
    )
    with tempfile.TemporaryDirectory(prefix="pin-jvm-check-") as tmp:
        work = Path(tmp)
        (work / "pom.xml").write_text(_POM.format(dependencies=deps), encoding="utf-8")
        cmd = ["mvn", "-B", "-q", "--strict-checksums", f"-Dmaven.repo.local={work / 'm2'}"]
        cmd += ["dependency:copy-dependencies", "-DincludeScope=runtime", "-Dmdep.useRepositoryLayout=true"]
        subprocess.run([*cmd, f"-DoutputDirectory={work / 'cp'}"], cwd=work, check=True)
        described: list[dict[str, Any]] = pinner.describe(work / "cp")
        return described


def pin(debezium_version: str, flink_version: str) -> None:
    dist = kafka_jars.load_distribution()
    kafka, jackson = (
        dist.kafka_version,
        next(a.version for a in dist.artifacts if a.artifact == "jackson-databind"),
    )
    connect = _resolve(
        [
            ("org.apache.kafka", "connect-json", kafka),
            ("org.apache.kafka", "connect-api", kafka),
            ("org.apache.kafka", "connect-transforms", kafka),
            ("com.fasterxml.jackson.core", "jackson-core", jackson),
            ("io.debezium", "debezium-connect-plugins", debezium_version),
        ]
    )
    flink = _resolve(
        [
            ("org.apache.flink", "flink-json", flink_version),
            ("org.apache.flink", "flink-table-runtime", flink_version),
        ]
    )
    connect_avro = _resolve(
        [
            ("org.apache.kafka", "connect-runtime", CONNECT_AVRO_KAFKA),
            ("org.apache.kafka", "connect-file", CONNECT_AVRO_KAFKA),
            ("io.apicurio", "apicurio-registry-utils-converter", APICURIO_VERSION),
        ],
        # its JSON Schema serde needs org.everit.json.schema, served on jitpack only (as for the
        # registry, devkafka/registry_pom.xml); the Avro converter does not load it
        {"apicurio-registry-utils-converter": [("io.apicurio", "apicurio-registry-serdes-jsonschema-serde")]},
    )
    documents = {
        CONNECT.pins: {
            "kafka_version": kafka,
            "debezium_version": debezium_version,
            "artifacts": [a for a in connect if a["artifact"] not in _CONNECT_NOT_NEEDED],
        },
        FLINK.pins: {
            "flink_version": flink_version,
            "artifacts": [a for a in flink if a["artifact"] in _FLINK_NEEDED],
        },
        CONNECT_AVRO.pins: {
            "kafka_version": CONNECT_AVRO_KAFKA,
            "apicurio_version": APICURIO_VERSION,
            "artifacts": connect_avro,
        },
    }
    for path, doc in documents.items():
        doc["generated_by"] = "python tests/support/debezium_jvm.py --pin"
        path.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
        print(f"{path}: {len(doc['artifacts'])} jars")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--pin", action="store_true", required=True)
    parser.add_argument("--debezium-version", default=load_pins(CONNECT)[0]["debezium_version"])
    parser.add_argument("--flink-version", default=load_pins(FLINK)[0]["flink_version"])
    parsed = parser.parse_args()
    pin(parsed.debezium_version, parsed.flink_version)
    sys.exit(0)
