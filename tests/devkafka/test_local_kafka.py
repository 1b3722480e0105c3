"""`deltamirror local kafka`: the pinned jars, the cache, java detection, and a real broker."""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import socket
import time
import uuid
from importlib import resources
from pathlib import Path

import pytest

from deltamirror.cli.local_kafka_cmd import PARSERS
from deltamirror.core.errors import ConfigError, EnvironmentMissingError
from deltamirror.devkafka import broker as local_kafka
from deltamirror.devkafka import jars as kafka_jars
from deltamirror.devkafka.broker import LocalKafka
from deltamirror.devkafka.jars import ArtifactPin, ensure_jars, verify_jar
from deltamirror.devkafka.processes import process_alive
from deltamirror.mirror.errors import KafkaError
from support.kafka import new_topic


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _pin_for(data: bytes, artifact: str = "thing") -> ArtifactPin:
    return ArtifactPin("org.example.sub", artifact, "1.0", hashlib.sha256(data).hexdigest(), len(data))


def _fake_repo(root: Path, files: dict[ArtifactPin, bytes]) -> str:
    for pin, data in files.items():
        path = root / pin.repo_path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return root.as_uri()


def _cli(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="deltamirror")
    PARSERS["local"](parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(list(argv))
    rc: int = args.handler(args)
    return rc


# --- no broker needed -----------------------------------------------------------------------------


def test_pinned_artifacts_are_well_formed() -> None:
    raw = resources.files("deltamirror.devkafka").joinpath("kafka_artifacts.json").read_text("utf-8")
    doc = json.loads(raw)
    version = doc["kafka_version"]
    assert re.fullmatch(r"4\.\d+\.\d+", version)
    artifacts = doc["artifacts"]
    assert len(artifacts) > 10
    for entry in artifacts:
        assert set(entry) == {"group", "artifact", "version", "sha256", "size"}, entry
        assert re.fullmatch(r"[0-9a-f]{64}", entry["sha256"]), entry
        assert isinstance(entry["size"], int) and entry["size"] > 0, entry
        assert all(isinstance(entry[k], str) and entry[k] for k in ("group", "artifact", "version"))
    coordinates = {(e["group"], e["artifact"]): e["version"] for e in artifacts}
    assert len(coordinates) == len(artifacts), "an artifact is pinned twice"
    assert coordinates[("org.apache.kafka", f"kafka_{doc['scala_version']}")] == version
    assert coordinates[("org.apache.kafka", "kafka-clients")] == version
    assert ("org.slf4j", "slf4j-api") in coordinates
    assert ("org.apache.logging.log4j", "log4j-slf4j-impl") in coordinates, "no slf4j log backend"
    assert doc["broker_main_class"] and doc["storage_tool_main_class"]
    # the admin tools' own jar, on top of the broker's classpath, fetched only when a tool runs
    tools = doc["tool_artifacts"]
    assert [(t["group"], t["artifact"], t["version"]) for t in tools] == [
        ("org.apache.kafka", "kafka-tools", version)
    ]
    assert all(re.fullmatch(r"[0-9a-f]{64}", t["sha256"]) and t["size"] > 0 for t in tools)
    assert not {(t["group"], t["artifact"]) for t in tools} & set(coordinates)
    assert doc["transactions_tool_main_class"] == "org.apache.kafka.tools.TransactionsCommand"


def test_verify_jar_rejects_and_deletes_a_corrupt_file(tmp_path: Path) -> None:
    good = b"PK\x03\x04 pretend this is a jar"
    pin = _pin_for(good)
    path = tmp_path / pin.file_name
    path.write_bytes(good)
    verify_jar(path, pin)
    assert path.read_bytes() == good

    path.write_bytes(b"X" * len(good))  # same size, other bytes: only the hash can tell
    with pytest.raises(KafkaError, match="checksum mismatch"):
        verify_jar(path, pin)
    assert not path.exists()

    path.write_bytes(good[:-3])  # truncated download
    with pytest.raises(KafkaError, match="checksum mismatch"):
        verify_jar(path, pin)
    assert not path.exists()


def test_ensure_jars_downloads_once_and_heals_a_corrupt_cache(tmp_path: Path) -> None:
    payloads = {_pin_for(b"first jar", "a"): b"first jar", _pin_for(b"second jar!", "b"): b"second jar!"}
    pins = list(payloads)
    repo_dir = tmp_path / "repo"
    repo = _fake_repo(repo_dir, payloads)
    cache = tmp_path / "cache"

    paths = ensure_jars(pins, cache_dir=cache, repo=repo)
    assert [p.read_bytes() for p in paths] == [payloads[p] for p in pins]
    assert sorted(p.name for p in cache.iterdir() if not p.name.startswith(".")) == ["a-1.0.jar", "b-1.0.jar"]

    shutil.rmtree(repo_dir)  # verified jars are never fetched again
    assert ensure_jars(pins, cache_dir=cache, repo=repo) == paths

    paths[0].write_bytes(b"garbage!!")  # a corrupt cached jar is detected and fetched again
    with pytest.raises(KafkaError, match="cannot download"):
        ensure_jars(pins, cache_dir=cache, repo=repo)
    _fake_repo(repo_dir, payloads)
    assert ensure_jars(pins, cache_dir=cache, repo=repo)[0].read_bytes() == b"first jar"


def test_ensure_jars_refuses_bytes_that_do_not_match_the_pin(tmp_path: Path) -> None:
    pin = _pin_for(b"the real jar")
    repo = _fake_repo(tmp_path / "repo", {pin: b"a tampered jar"})
    cache = tmp_path / "cache"
    with pytest.raises(KafkaError, match="checksum mismatch"):
        ensure_jars([pin], cache_dir=cache, repo=repo)
    assert [p.name for p in cache.iterdir()] == [".lock"]  # neither the jar nor a .part file is left


def test_maven_repo_can_be_overridden_by_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pin = _pin_for(b"mirrored jar")
    monkeypatch.setenv(
        "DELTAMIRROR_MAVEN_REPO", _fake_repo(tmp_path / "mirror", {pin: b"mirrored jar"}) + "/"
    )
    [path] = ensure_jars([pin], cache_dir=tmp_path / "cache")
    assert path.read_bytes() == b"mirrored jar"


def test_default_locations_follow_xdg_cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert kafka_jars.jar_cache_dir("9.9.9") == tmp_path / "deltamirror" / "kafka" / "9.9.9"
    assert LocalKafka(port=19092).data_dir == tmp_path / "deltamirror" / "kafka-data" / "19092"


def test_missing_java_is_an_environment_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setattr(shutil, "which", lambda *_a, **_k: None)
    with pytest.raises(EnvironmentMissingError, match=r"Java 17\+ is required"):
        LocalKafka(port=_free_port(), data_dir=tmp_path).start()
    assert not (tmp_path / "broker.pid").exists()


@pytest.mark.parametrize(
    ("banner", "found"),
    [('openjdk version "11.0.22" 2024-01-16', "11"), ('java version "1.8.0_392"', "8")],
)
def test_old_java_is_an_environment_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, banner: str, found: str
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "java"
    fake.write_text(f"#!/bin/sh\necho '{banner}' >&2\n")
    fake.chmod(0o755)
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(bin_dir))
    with pytest.raises(EnvironmentMissingError, match=rf"found Java {found} at"):
        kafka_jars.find_java()


def test_port_taken_by_another_program_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        with pytest.raises(ConfigError, match=f"port {port} .* already in use"):
            LocalKafka(port=port, data_dir=tmp_path).start()


def test_a_data_dir_stays_bound_to_its_port(tmp_path: Path) -> None:
    port = _free_port()
    (tmp_path / "server.properties").write_text(
        f"listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{port + 1}\n"
    )
    with pytest.raises(ConfigError, match=f"use --port {port}"):
        LocalKafka(port=port + 2, data_dir=tmp_path).start()


def test_cli_status_and_stop_without_a_broker(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    port = str(_free_port())
    assert _cli("local", "kafka", "status", "--port", port, "--data-dir", str(tmp_path)) == 3
    assert capsys.readouterr().out == f"kafka not running (port {port}, data {tmp_path.resolve()})\n"
    assert _cli("local", "kafka", "stop", "--port", port, "--data-dir", str(tmp_path)) == 0
    assert "was not running" in capsys.readouterr().out


# --- with a broker --------------------------------------------------------------------------------


def _consume_values(bootstrap: str, topic: str, isolation: str, expected: int) -> list[str]:
    """Read partition 0 from the start until ``expected`` values arrived, then 1 s more for extras."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"test-{uuid.uuid4()}",  # required, unused: assign() skips group coordination
            "enable.auto.commit": False,
            "isolation.level": isolation,
        }
    )
    values: list[str] = []
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        deadline = time.monotonic() + 60
        quiet_until: float | None = None
        while time.monotonic() < deadline and (quiet_until is None or time.monotonic() < quiet_until):
            msg = consumer.poll(0.2)
            if msg is not None:
                assert msg.error() is None, msg.error()
                value = msg.value()
                assert value is not None
                values.append(value.decode())
            if quiet_until is None and len(values) >= expected:
                quiet_until = time.monotonic() + 1.0
    finally:
        consumer.close()
    return values


@pytest.mark.kafka
def test_transactions_are_atomic_for_read_committed_consumers(kafka_bootstrap: str) -> None:
    from confluent_kafka import Producer

    topic = new_topic(kafka_bootstrap, f"dm-test-txn-{uuid.uuid4().hex[:12]}")
    producer = Producer(
        {
            "bootstrap.servers": kafka_bootstrap,
            "enable.idempotence": True,
            "transactional.id": f"dm-test-{uuid.uuid4()}",
        }
    )
    producer.init_transactions(30)
    batches = {
        "commit-1": [f"c1-{i}" for i in range(5)],
        "abort": [f"ab-{i}" for i in range(5)],
        "commit-2": [f"c2-{i}" for i in range(5)],
    }
    for name, values in batches.items():
        producer.begin_transaction()
        for value in values:
            producer.produce(topic, key=name.encode(), value=value.encode())
        producer.flush(30)  # the aborted records really reach the log
        if name == "abort":
            producer.abort_transaction(30)
        else:
            producer.commit_transaction(30)

    committed = batches["commit-1"] + batches["commit-2"]
    everything = committed[:5] + batches["abort"] + committed[5:]
    assert _consume_values(kafka_bootstrap, topic, "read_committed", len(committed)) == committed
    assert _consume_values(kafka_bootstrap, topic, "read_uncommitted", len(everything)) == everything


@pytest.mark.isolated  # its own broker
@pytest.mark.kafka
@pytest.mark.slow
def test_local_kafka_lifecycle_through_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    try:
        kafka_jars.find_java()
    except EnvironmentMissingError as exc:
        pytest.skip(str(exc))
    port = _free_port()
    while not local_kafka._port_is_free(port + 1):
        port = _free_port()
    data = str(tmp_path / "kafka")
    opts = ("--port", str(port), "--data-dir", data)
    try:
        assert _cli("local", "kafka", "start", *opts) == 0
        first = capsys.readouterr().out
        assert first.startswith(f"kafka running at 127.0.0.1:{port} (pid ")
        pid = int(first.split("(pid ")[1].split(",")[0])
        assert process_alive(pid)

        assert _cli("local", "kafka", "start", *opts) == 0  # idempotent: the same broker
        assert capsys.readouterr().out == first
        assert _cli("local", "kafka", "status", *opts) == 0
        assert f"(pid {pid}, Kafka " in capsys.readouterr().out
        new_topic(f"127.0.0.1:{port}", "lifecycle")
        # the remedy for a hanging transaction reaches the broker named by --port and --data-dir
        assert _cli("local", "kafka", "abort-hanging", *opts, "--max-transaction-timeout", "0") == 0
        assert capsys.readouterr().out == f"no hanging transaction on the broker at 127.0.0.1:{port}\n"
    finally:
        assert _cli("local", "kafka", "stop", *opts) == 0
    assert f"kafka stopped (pid {pid}" in capsys.readouterr().out
    assert not process_alive(pid)
    assert not (tmp_path / "kafka" / "broker.pid").exists()
    assert local_kafka._port_is_free(port)
    assert _cli("local", "kafka", "status", *opts) == 3
    assert "kafka not running" in capsys.readouterr().out


@pytest.mark.kafka
def test_a_start_is_not_answered_by_another_broker_on_its_port(kafka_bootstrap: str, tmp_path: Path) -> None:
    """The port is checked free, then the broker binds it: another broker that took the port in
    between answered the readiness check, and the start passed for one that was not running (a
    test then froze its own broker and talked to the other: a commit that should have timed out
    succeeded). The broker answering must be of the data dir's cluster."""
    from deltamirror.devkafka.broker import KAFKA_LOG_DIRS, _wait_until_ready
    from deltamirror.mirror.errors import KafkaError

    logs = tmp_path / KAFKA_LOG_DIRS
    logs.mkdir()
    (logs / "meta.properties").write_text("node.id=1\nversion=1\ncluster.id=not-the-session-s-cluster\n")
    with pytest.raises(KafkaError, match="another broker"):
        _wait_until_ready(kafka_bootstrap, 3.0, None, tmp_path)
