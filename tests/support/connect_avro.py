"""A standalone Kafka Connect worker with Apicurio Registry's AvroConverter and connect-file's sink.

The consumer a Kafka Connect user runs for Avro row changes: ``ConnectStandalone`` (connect-runtime
4.3.1) with ``io.apicurio.registry.utils.converter.AvroConverter`` (2.4.2.Final, the registry's
version) for keys and values, set to read the Confluent wire format (``as-confluent``, 4-byte ids,
which are the registry's content ids), and ``FileStreamSinkConnector`` writing each record's value as
Connect prints it (``Struct{...}``) to a file. The jars come from Maven Central, pinned by SHA-256
in ``tests/jvm/connect_avro_artifacts.json`` and fetched and verified as the other JVM checks'
(:mod:`support.debezium_jvm`).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from deltamirror.devkafka import jars as kafka_jars
from support.debezium_jvm import CONNECT_AVRO, classpath


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def converter_settings(prefix: str, registry_ccompat_url: str) -> dict[str, str]:
    """The converter's settings (docs/avro.md shows them): Apicurio's own API, the Confluent format."""
    native = registry_ccompat_url.split("/apis/")[0] + "/apis/registry/v2"
    return {
        prefix: "io.apicurio.registry.utils.converter.AvroConverter",
        f"{prefix}.apicurio.registry.url": native,
        f"{prefix}.apicurio.registry.as-confluent": "true",  # magic byte + 4-byte id, not 8
        f"{prefix}.apicurio.registry.use-id": "contentId",  # the ids of the ccompat API
        f"{prefix}.apicurio.registry.headers.enabled": "false",  # the id is in the payload
    }


def _properties(path: Path, settings: dict[str, str]) -> Path:
    path.write_text("".join(f"{k}={v}\n" for k, v in settings.items()), encoding="utf-8")
    return path


def file_sink_lines(
    bootstrap: str, registry_ccompat_url: str, topic: str, expected: int, work: Path, timeout_s: float = 180
) -> list[str]:
    """Run the worker until its sink file holds ``expected`` lines (or the worker dies, or the time is
    up: then RuntimeError with the log's end); the worker is stopped before returning."""
    jars = classpath(CONNECT_AVRO)
    work.mkdir(parents=True, exist_ok=True)
    out = work / "sink.txt"
    worker = _properties(
        work / "worker.properties",
        {
            "bootstrap.servers": bootstrap,
            **converter_settings("key.converter", registry_ccompat_url),
            **converter_settings("value.converter", registry_ccompat_url),
            "offset.storage.file.filename": str(work / "offsets"),
            "offset.flush.interval.ms": "1000",
            "listeners": f"http://127.0.0.1:{_free_port()}",
            "consumer.isolation.level": "read_committed",
            "consumer.auto.offset.reset": "earliest",
        },
    )
    sink = _properties(
        work / "sink.properties",
        {
            "name": "deltamirror-avro-file-sink",
            "connector.class": "org.apache.kafka.connect.file.FileStreamSinkConnector",
            "tasks.max": "1",
            "topics": topic,
            "file": str(out),
        },
    )
    log = work / "worker.log"
    cmd = [
        str(kafka_jars.find_java()),
        "-Xmx256m",
        "-XX:TieredStopAtLevel=1",
        "-XX:+UseSerialGC",
        "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
        "-cp",
        os.pathsep.join(map(str, jars)),
        CONNECT_AVRO.main_class,
        str(worker),
        str(sink),
    ]
    with log.open("wb") as log_file:
        proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            lines = out.read_text(encoding="utf-8").splitlines() if out.exists() else []
            if len(lines) >= expected:
                return lines
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = log.read_text(encoding="utf-8", errors="replace")[-4000:]
                state = f"exited with {proc.returncode}" if proc.poll() is not None else "timed out"
                raise RuntimeError(
                    f"the Connect worker {state} with {len(lines)} of {expected} lines: {tail}"
                )
            time.sleep(0.2)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
