"""`deltamirror local registry`: the pinned build, its checks, the CLI, and a real Schema Registry.

The ``registry`` tests talk to Apicurio Registry (built from Maven Central, in memory) with
confluent-kafka's own Schema Registry client and Avro serializers: the client a Kafka deployment's
Python consumers use.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest

from deltamirror.cli.main import main
from deltamirror.devkafka import registry as local_registry
from deltamirror.devkafka.jars import find_java
from deltamirror.devkafka.registry import BuiltJar, LocalRegistry, RegistryDistribution, verify_build
from deltamirror.mirror.errors import SchemaRegistryError


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _fake_build(root: Path, jars: dict[str, bytes]) -> tuple[Path, Path, RegistryDistribution]:
    """A build dir and the Maven repository it came from, with pins of exactly these bytes."""
    app, repo = root / "app", root / "m2"
    (app / "lib").mkdir(parents=True)
    (app / "runner.jar").write_bytes(b"runner")
    pins = []
    for name, data in jars.items():
        (app / "lib" / name).write_bytes(data)
        repo_path = f"org/example/{name}"
        (repo / repo_path).parent.mkdir(parents=True, exist_ok=True)
        (repo / repo_path).write_bytes(data)
        pins.append(BuiltJar(name, repo_path, hashlib.sha256(data).hexdigest(), len(data)))
    return app, repo, RegistryDistribution("9.9.9", "1.0", "runner.jar", tuple(pins))


# --- no registry needed ---------------------------------------------------------------------------


def test_pins_are_well_formed_and_name_what_the_pom_builds() -> None:
    dist = local_registry.load_registry_distribution()
    pom = local_registry.build_pom()
    assert f"<version>{dist.apicurio_version}</version>" in pom
    assert f"<quarkus.version>{dist.quarkus_version}</quarkus.version>" in pom
    assert dist.runner_jar == f"apicurio-registry-runner-{dist.apicurio_version}-runner.jar"
    names = [jar.file_name for jar in dist.lib]
    assert len(names) == len(set(names)) > 100
    assert f"io.apicurio.apicurio-registry-app-{dist.apicurio_version}.jar" in names
    for jar in dist.lib:
        assert re.fullmatch(r"[0-9a-f]{64}", jar.sha256), jar
        assert jar.size > 0 and jar.repo_path.endswith(".jar"), jar
    doc = json.loads(resources.files("deltamirror.devkafka").joinpath("registry_artifacts.json").read_text())
    assert doc["generated_by"] == "scripts/pin_registry_artifacts.py"


def test_a_build_of_exactly_the_pinned_bytes_passes(tmp_path: Path) -> None:
    app, repo, dist = _fake_build(tmp_path, {"a.jar": b"aaa", "b.jar": b"bbbb"})
    verify_build(app, dist, repo=repo)


def test_a_jar_with_other_bytes_is_refused_and_deleted_in_the_build_and_in_maven_s_cache(
    tmp_path: Path,
) -> None:
    app, repo, dist = _fake_build(tmp_path, {"a.jar": b"aaa", "b.jar": b"bbbb"})
    (app / "lib" / "b.jar").write_bytes(b"bbbX")  # same size, other bytes
    with pytest.raises(SchemaRegistryError, match=r"checksum mismatch for b\.jar") as caught:
        verify_build(app, dist, repo=repo)
    assert caught.value.exit_code == 1
    assert not (app / "lib" / "b.jar").exists()
    assert not (repo / "org/example/b.jar").exists()  # the next build fetches it anew
    assert (app / "lib" / "a.jar").exists()


def test_a_jar_that_is_not_pinned_is_refused(tmp_path: Path) -> None:
    app, repo, dist = _fake_build(tmp_path, {"a.jar": b"aaa"})
    (app / "lib" / "intruder.jar").write_bytes(b"x")
    with pytest.raises(SchemaRegistryError, match=r"not pinned, first intruder\.jar"):
        verify_build(app, dist, repo=repo)


def test_a_build_missing_a_pinned_jar_is_refused(tmp_path: Path) -> None:
    app, repo, dist = _fake_build(tmp_path, {"a.jar": b"aaa", "b.jar": b"bb"})
    (app / "lib" / "a.jar").unlink()
    with pytest.raises(SchemaRegistryError, match=r"lacks the pinned jar a\.jar"):
        verify_build(app, dist, repo=repo)


def test_status_of_no_registry_exits_3(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["local", "registry", "status", "--port", "18099", "--data-dir", str(tmp_path)])
    assert rc == 3
    assert capsys.readouterr().out.strip() == f"registry not running (port 18099, data {tmp_path.resolve()})"


def test_start_without_maven_and_no_build_is_one_line_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        java = find_java()
    except Exception as exc:
        pytest.skip(f"no java: {exc}")
    monkeypatch.setenv("JAVA_HOME", str(java.resolve().parent.parent))
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))  # no mvn anywhere
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # no cached build
    rc = main(["local", "registry", "start", "--port", str(_free_port()), "--data-dir", str(tmp_path / "d")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert len(err) == 2 and err[0].startswith("building Apicurio Registry"), err
    assert err[1].startswith("deltamirror: error: Maven (mvn) is required once"), err
    assert not (tmp_path / "d" / "registry.pid").exists()


def test_a_port_in_use_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        rc = main(["local", "registry", "start", "--port", str(port), "--data-dir", str(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert err[-1].startswith(f"deltamirror: error: port {port} on 127.0.0.1 is already in use"), err


def test_the_users_file_holds_quarkus_digest_of_the_password_never_the_password() -> None:
    text = local_registry.users_file_text("mirror", "pw-1")
    digest = hashlib.md5(b"mirror:Quarkus:pw-1", usedforsecurity=False).hexdigest()
    assert text == f"quarkus.security.users.embedded.users.mirror={digest}\n"
    assert "pw-1" not in text


@pytest.mark.parametrize(
    ("user", "password"), [("a.b", "pw"), ("", "pw"), ("a b", "pw"), ("u", ""), ("u", "a\nb")]
)
def test_a_user_name_quarkus_cannot_key_or_an_empty_or_multiline_password_is_refused(
    tmp_path: Path, user: str, password: str
) -> None:
    from deltamirror.core.errors import InvalidArgumentError

    with pytest.raises(InvalidArgumentError) as caught:
        LocalRegistry(port=18098, data_dir=tmp_path, basic_auth=(user, password))
    assert password == "" or password not in str(caught.value)


def test_a_password_made_for_the_user_is_private_and_reused(tmp_path: Path) -> None:
    made = local_registry.made_password_file(tmp_path / "d")
    first = made.read_text()
    assert made.stat().st_mode & 0o077 == 0 and len(first.strip()) >= 24
    assert local_registry.made_password_file(tmp_path / "d").read_text() == first


def test_a_password_file_without_a_user_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    secret = tmp_path / "pw"
    secret.write_text("hunter2-registry\n")
    rc = main(["local", "registry", "start", "--data-dir", str(tmp_path), "--password-file", str(secret)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err == ["deltamirror: error: --password-file goes with --user"], err


# --- a real registry ------------------------------------------------------------------------------

ROW_SCHEMA = {
    "type": "record",
    "name": "Row",
    "namespace": "deltamirror.test",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "name", "type": ["null", "string"], "default": None},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
    ],
}


@pytest.mark.registry
def test_an_avro_record_round_trips_through_the_registry_with_confluent_kafka_s_serializers(
    schema_registry: str,
) -> None:
    from decimal import Decimal

    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    client = SchemaRegistryClient({"url": schema_registry})
    serializer = AvroSerializer(client, json.dumps(ROW_SCHEMA))
    ctx = SerializationContext("rt.orders", MessageField.VALUE)
    row = {"id": 42, "name": "ada", "amount": Decimal("12.34"), "tags": ["a", "b"]}
    data = serializer(row, ctx)
    assert data is not None

    # registered by the serializer under the topic-name strategy's subject, and named on the wire
    latest = client.get_latest_version("rt.orders-value")
    assert latest.version == 1
    assert json.loads(latest.schema.schema_str)["name"] == "Row"
    assert data[0] == 0 and int.from_bytes(data[1:5], "big") == latest.schema_id  # Confluent wire format

    # a fresh client (no cache): the deserializer fetches the writer's schema by id from the registry
    reader = AvroDeserializer(SchemaRegistryClient({"url": schema_registry}))
    assert reader(data, ctx) == row


@pytest.mark.registry
def test_a_second_schema_is_a_new_version_and_old_records_still_read(schema_registry: str) -> None:
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    client = SchemaRegistryClient({"url": schema_registry})
    ctx = SerializationContext("rt.evolve", MessageField.VALUE)
    v1 = {"type": "record", "name": "E", "fields": [{"name": "id", "type": "long"}]}
    v2 = {**v1, "fields": [*v1["fields"], {"name": "note", "type": ["null", "string"], "default": None}]}
    old = AvroSerializer(client, json.dumps(v1))({"id": 1}, ctx)
    new = AvroSerializer(client, json.dumps(v2))({"id": 2, "note": "n"}, ctx)
    assert old is not None and new is not None
    assert client.get_versions("rt.evolve-value") == [1, 2]
    assert old[1:5] != new[1:5]
    reader = AvroDeserializer(SchemaRegistryClient({"url": schema_registry}))
    assert reader(old, ctx) == {"id": 1}
    assert reader(new, ctx) == {"id": 2, "note": "n"}


@pytest.mark.registry
def test_the_cli_starts_reports_and_stops_a_registry(schema_registry: str, tmp_path: Path) -> None:
    # the session fixture has built the registry already: this start only launches a JVM
    port = _free_port()
    base = [sys.executable, "-m", "deltamirror.cli.main", "local", "registry"]
    where = ["--port", str(port), "--data-dir", str(tmp_path)]
    env = {**os.environ}
    try:
        started = subprocess.run(
            [*base, "start", *where], capture_output=True, text=True, timeout=300, env=env
        )
        assert started.returncode == 0, started.stderr[-2000:]
        url = f"http://127.0.0.1:{port}/apis/ccompat/v7"
        assert started.stdout.startswith(f"registry running at {url} (pid ")
        status = subprocess.run(
            [*base, "status", *where], capture_output=True, text=True, timeout=60, env=env
        )
        assert status.returncode == 0 and url in status.stdout
        again = subprocess.run([*base, "start", *where], capture_output=True, text=True, timeout=120, env=env)
        assert again.returncode == 0 and again.stdout == started.stdout  # the same process, not a second one
    finally:
        stopped = subprocess.run(
            [*base, "stop", *where], capture_output=True, text=True, timeout=120, env=env
        )
    assert stopped.returncode == 0 and stopped.stdout.startswith("registry stopped (pid ")
    status = subprocess.run([*base, "status", *where], capture_output=True, text=True, timeout=60, env=env)
    assert status.returncode == 3
    assert LocalRegistry(port=port, data_dir=tmp_path).status()["running"] is False
