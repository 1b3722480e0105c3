#!/usr/bin/env python3
"""Regenerate devkafka/kafka_artifacts.json, the pinned jar list behind `deltamirror local kafka`.

Users never run Maven: this script is run by a maintainer (with ``mvn`` and a JDK) when moving to a
new Kafka release, and its output is committed. Maven resolves the broker's runtime classpath once,
into a throwaway local repository and with strict checksum checks against Maven Central, so the
SHA-256 written here are those of the files Central serves. At run time
:mod:`deltamirror.devkafka.jars` downloads exactly these files and refuses any other bytes.

Besides the broker's classpath (``artifacts``), ``tool_artifacts`` pins the jars Kafka's admin
tools need on top of it: ``kafka-tools`` alone (its own dependencies serve tools deltamirror does
not run), for ``deltamirror local kafka abort-hanging`` (Kafka's ``TransactionsCommand``).

    python scripts/pin_kafka_artifacts.py --kafka-version 4.4.0
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUTPUT = REPO_ROOT / "devkafka" / "kafka_artifacts.json"

# Kafka's own distribution ships log4j2 behind the slf4j 1.x API; the binding is not a dependency of
# the kafka_2.13 pom (a library must not choose a log backend), so it is added here.
LOG4J_VERSION = "2.26.1"
SCALA_VERSION = "2.13"

#: jars of Kafka's command-line tools run on top of the broker's classpath, without their own dependencies
TOOLS = ("kafka-tools",)

POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>deltamirror.tmp</groupId>
  <artifactId>pin-kafka</artifactId>
  <version>0</version>
  <dependencies>
    <dependency>
      <groupId>org.apache.kafka</groupId>
      <artifactId>kafka_{scala}</artifactId>
      <version>{kafka}</version>
    </dependency>
    <dependency>
      <groupId>org.apache.logging.log4j</groupId>
      <artifactId>log4j-slf4j-impl</artifactId>
      <version>{log4j}</version>
    </dependency>
  </dependencies>
</project>
"""


TOOLS_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>deltamirror.tmp</groupId>
  <artifactId>pin-kafka-tools</artifactId>
  <version>0</version>
  <dependencies>
{dependencies}
  </dependencies>
</project>
"""

TOOL_DEPENDENCY = """    <dependency>
      <groupId>org.apache.kafka</groupId>
      <artifactId>{artifact}</artifactId>
      <version>{kafka}</version>
      <exclusions><exclusion><groupId>*</groupId><artifactId>*</artifactId></exclusion></exclusions>
    </dependency>"""


def resolve_classpath(kafka_version: str, log4j_version: str, workdir: Path, *, tools: bool = False) -> Path:
    """Let Maven copy the runtime closure in repository layout (group/artifact/version/file); with
    ``tools``, the tools' jars alone."""
    workdir.mkdir(parents=True, exist_ok=True)
    if tools:
        dependencies = "\n".join(TOOL_DEPENDENCY.format(artifact=a, kafka=kafka_version) for a in TOOLS)
        pom = TOOLS_POM.format(dependencies=dependencies)
    else:
        pom = POM.format(scala=SCALA_VERSION, kafka=kafka_version, log4j=log4j_version)
    (workdir / "pom.xml").write_text(pom, encoding="utf-8")
    out = workdir / "classpath"
    cmd = [
        "mvn",
        "-B",
        "-q",
        "--strict-checksums",
        f"-Dmaven.repo.local={workdir / 'm2'}",
        "dependency:copy-dependencies",
        "-DincludeScope=runtime",
        "-Dmdep.useRepositoryLayout=true",
        f"-DoutputDirectory={out}",
    ]
    subprocess.run(cmd, cwd=workdir, check=True)
    return out


def describe(classpath_dir: Path) -> list[dict[str, Any]]:
    entries = []
    for jar in sorted(classpath_dir.rglob("*.jar")):
        parts = jar.relative_to(classpath_dir).parts
        group, artifact, version = ".".join(parts[:-3]), parts[-3], parts[-2]
        if jar.name != f"{artifact}-{version}.jar":
            # A classifier or a snapshot would need another URL shape than the one kafka_jars builds.
            raise SystemExit(f"unexpected file name {jar} for {group}:{artifact}:{version}")
        data = jar.read_bytes()
        entries.append(
            {
                "group": group,
                "artifact": artifact,
                "version": version,
                "sha256": hashlib.sha256(data).hexdigest(),
                "size": len(data),
            }
        )
    entries.sort(key=lambda e: (e["group"], e["artifact"]))
    return entries


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--kafka-version", required=True, help="org.apache.kafka:kafka_2.13 version")
    parser.add_argument("--log4j-version", default=LOG4J_VERSION)
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args(argv)
    if shutil.which("mvn") is None:
        print("mvn is required to regenerate the pinned list", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="pin-kafka-") as tmp:
        artifacts = describe(resolve_classpath(args.kafka_version, args.log4j_version, Path(tmp) / "broker"))
        tools = describe(
            resolve_classpath(args.kafka_version, args.log4j_version, Path(tmp) / "tools", tools=True)
        )
    document = {
        "kafka_version": args.kafka_version,
        "scala_version": SCALA_VERSION,
        "broker_main_class": "kafka.Kafka",
        "storage_tool_main_class": "kafka.tools.StorageTool",
        "transactions_tool_main_class": "org.apache.kafka.tools.TransactionsCommand",
        "generated_by": "scripts/pin_kafka_artifacts.py",
        "artifacts": artifacts,
        "tool_artifacts": tools,
    }
    args.output.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    total = sum(a["size"] for a in artifacts)
    print(f"{args.output}: {len(artifacts)} jars, {total / 1e6:.1f} MB, Kafka {args.kafka_version}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
