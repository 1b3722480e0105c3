"""The mirror over a secured broker: SASL_SSL with SCRAM-SHA-512 and a certificate of a local CA.

One broker for the module's tests (``secure_kafka``), started by the real
``deltamirror local kafka start --security scram-tls``; the real ``watch`` and ``consume-snapshot``
processes read the same configuration file, the password coming from the environment
(``${DM_TEST_KAFKA_PASSWORD}``) as a deployment would give it.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from support.kafka import SecureBroker
from support.spark import spark  # noqa: F401
from support.tables import copy_table
from support.watching import published_version

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(180)]

TABLE_ID = "krs__cdf-table-partitioned"  # change data feed on: the Spark source reads it
PASSWORD_ENV = "DM_TEST_KAFKA_PASSWORD"


def _cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "deltamirror.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        check=False,
    )


def _config(broker: SecureBroker, path: Path, name: str, table: Path | None = None) -> Path:
    """A watch configuration: the start's kafka: section, the password as ${VAR}."""
    kafka = {**broker.kafka, "sasl_password": f"${{{PASSWORD_ENV}}}"}
    doc: dict[str, Any] = {"kafka": kafka}
    if table is not None:
        doc["tables"] = [
            {
                "uri": str(table),
                "actions_topic": f"{name}.actions",
                "commits_topic": f"{name}.commits",
                "poll_interval_s": 0.2,
            }
        ]
        doc["progress_topic"] = f"{name}.progress"
        doc["transactional_id_prefix"] = name
    path.write_text(yaml.safe_dump(doc))
    return path


def _active_files(table: Path) -> tuple[int, int]:
    """(latest version, active files) replayed here from the log's JSON commits."""
    active: set[str] = set()
    commits = sorted((table / "_delta_log").glob("*.json"))
    for commit in commits:
        for line in commit.read_text().splitlines():
            action = json.loads(line) if line.strip() else {}
            if "add" in action:
                active.add(action["add"]["path"])
            elif "remove" in action:
                active.discard(action["remove"]["path"])
    return int(commits[-1].stem), len(active)


def _assert_no_secret(broker: SecureBroker, *texts: str) -> None:
    for text in texts:
        for secret in broker.secrets:
            assert secret not in text


def test_start_prints_the_client_settings_but_not_the_password(secure_kafka: SecureBroker) -> None:
    out = secure_kafka.start_output
    security = secure_kafka.data_dir / "security"
    for line in (
        f"bootstrap_servers: {secure_kafka.bootstrap}",
        "security_protocol: SASL_SSL",
        "sasl_mechanism: SCRAM-SHA-512",
        "sasl_username: deltamirror",
        f"sasl_password: (in {security / 'scram-password'})",
        f"ssl_ca_location: {security / 'ca.pem'}",
    ):
        assert line in out
    _assert_no_secret(secure_kafka, out)
    # the PLAINTEXT listener is unchanged, the secured one is another port
    assert f"kafka running at {secure_kafka.plaintext}" in out
    assert secure_kafka.bootstrap != secure_kafka.plaintext
    assert secure_kafka.kafka["ssl_ca_location"] == str(security / "ca.pem")
    assert (security / "ca.pem").read_text().startswith("-----BEGIN CERTIFICATE-----")
    for private in ("scram-password", "keystore-password", "kafka-client.yaml", "server.p12", "ca.key"):
        assert stat.S_IMODE((security / private).stat().st_mode) == 0o600, private
    assert stat.S_IMODE((secure_kafka.data_dir / "server.properties").stat().st_mode) == 0o600

    status = _cli(
        "local", "kafka", "status", "--port", str(secure_kafka.port), "--data-dir", str(secure_kafka.data_dir)
    )
    assert status.returncode == 0, status.stderr
    assert f"SASL_SSL at {secure_kafka.bootstrap}" in status.stdout


class Published:
    """A table mirrored by the real ``watch`` over SASL_SSL only, and what it logged."""

    def __init__(self, broker: SecureBroker, table: Path, name: str, config: Path, watch_log: str) -> None:
        self.broker = broker
        self.table = table
        self.name = name
        self.config = config
        self.watch_log = watch_log
        self.env = {PASSWORD_ENV: broker.password}


@pytest.fixture(scope="module")
def published(secure_kafka: SecureBroker, tmp_path_factory: pytest.TempPathFactory) -> Published:
    root = tmp_path_factory.mktemp("secure-mirror")
    table = copy_table(TABLE_ID, root)
    name = f"dmsec-{uuid.uuid4().hex[:10]}"
    config = _config(secure_kafka, root / "watch.yaml", name, table)
    env = {**os.environ, PASSWORD_ENV: secure_kafka.password, "PYTHONUNBUFFERED": "1"}
    latest, _ = _active_files(table)
    err_path = root / "watch.err"
    with err_path.open("w") as err:
        watch = subprocess.Popen(
            [sys.executable, "-m", "deltamirror.cli.main", "watch", "--config", str(config), "--no-progress"],
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=env,
        )
    try:
        deadline = time.monotonic() + 60
        # the PLAINTEXT listener of the same broker only to know when to look: the watcher has only SASL_SSL
        while published_version(secure_kafka.plaintext, f"{name}.commits") < latest:
            assert watch.poll() is None, err_path.read_text()[-2000:]
            assert time.monotonic() < deadline, "the watcher did not publish over SASL_SSL in time"
            time.sleep(0.3)
    finally:
        watch.send_signal(signal.SIGTERM)
        assert watch.wait(30) == 0, err_path.read_text()[-2000:]
    return Published(secure_kafka, table, name, config, err_path.read_text())


def test_watch_and_consume_snapshot_over_sasl_ssl_with_one_config_file(published: Published) -> None:
    latest, files = _active_files(published.table)
    done = _cli(
        "consume-snapshot",
        "--config",
        str(published.config),
        "--topic",
        f"{published.name}.actions",
        "--once",
        env=published.env,
    )
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(line["version"], line["files"], line["snapshot"]) for line in lines] == [(latest, files, True)]
    assert '\\"security_protocol\\": \\"SASL_SSL\\"' in published.watch_log  # its (redacted) settings
    broker_log = (published.broker.data_dir / "server.log").read_text(errors="replace")
    _assert_no_secret(published.broker, published.watch_log, done.stdout, done.stderr, broker_log)


@pytest.mark.spark
def test_the_spark_source_reads_the_mirror_over_sasl_ssl(
    published: Published,
    spark: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    from deltalake import DeltaTable
    from pyspark.errors import StreamingQueryException

    from deltamirror.consumer.spark.source import register

    register(spark)
    kafka = published.broker.kafka
    reader = spark.readStream.format("deltamirror")
    for key, value in {
        "kafka.bootstrap.servers": kafka["bootstrap_servers"],
        "kafka.security.protocol": kafka["security_protocol"],
        "kafka.sasl.mechanism": kafka["sasl_mechanism"],
        "kafka.sasl.username": kafka["sasl_username"],
        "kafka.sasl.password": published.broker.password,
        "kafka.ssl.ca.location": kafka["ssl_ca_location"],
        "actionsTopic": f"{published.name}.actions",
        "commitsTopic": f"{published.name}.commits",
    }.items():
        reader = reader.option(key, value)
    stream = reader.load(str(published.table))
    _assert_no_secret(published.broker, stream._jdf.queryExecution().toString())
    rows: list[dict[str, Any]] = []
    query = (
        stream.writeStream.foreachBatch(lambda df, _: rows.extend(r.asDict() for r in df.collect()))
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    assert query.exception() is None, str(query.exception())
    # the table as inserts at its latest version, as delta-rs reads it
    expected = DeltaTable(str(published.table)).to_pyarrow_table().to_pylist()
    latest, _ = _active_files(published.table)
    assert {(r["_change_type"], r["_commit_version"]) for r in rows} == {("insert", latest)}
    data = sorted(tuple(r[c] for c in ("id", "text", "part")) for r in rows)
    assert data == sorted(tuple(r[c] for c in ("id", "text", "part")) for r in expected)

    # a wrong password fails the query at its first plan, with the one line, without the password
    wrong = f"not-{published.broker.password}"
    failed = (
        reader.option("kafka.sasl.password", wrong)
        .load(str(published.table))
        .writeStream.foreachBatch(lambda df, _: None)
        .option("checkpointLocation", str(tmp_path / "checkpoint-wrong"))
        .trigger(availableNow=True)
        .start()
    )
    with pytest.raises(StreamingQueryException) as err:
        failed.awaitTermination()
    # the login check's line (the old path: "cannot read the metadata" after a 30 s timeout)
    assert f"Kafka at {kafka['bootstrap_servers']} refused the connection: authentication failed" in str(
        err.value
    )
    assert wrong not in str(err.value)
    _assert_no_secret(published.broker, str(err.value))


@pytest.mark.parametrize(
    "command",
    [
        ["consume-snapshot", "--once"],
        ["invalidate", "--once", "--exec", "true"],
    ],
)
def test_a_wrong_password_fails_fast_with_one_line_and_exit_2(
    secure_kafka: SecureBroker, tmp_path: Path, command: list[str]
) -> None:
    config = _config(secure_kafka, tmp_path / "kafka.yaml", "unused")
    wrong = f"not-{secure_kafka.password}-{uuid.uuid4().hex}"
    started = time.monotonic()
    done = _cli(
        command[0], "--config", str(config), "--topic", "any.actions", *command[1:], env={PASSWORD_ENV: wrong}
    )
    elapsed = time.monotonic() - started
    assert done.returncode == 2, done.stderr
    # a refused login is not retried: the metadata timeout alone would be 30 s (a busy machine
    # takes seconds to start the process itself)
    assert elapsed < 25, f"took {elapsed:.1f} s"
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"deltamirror: error: Kafka at {secure_kafka.bootstrap} refused the connection: ")
    assert "authentication failed" in line
    assert wrong not in done.stdout + done.stderr
    _assert_no_secret(secure_kafka, done.stdout + done.stderr)


def test_a_client_without_the_ca_is_refused_as_a_tls_failure(
    secure_kafka: SecureBroker, tmp_path: Path
) -> None:
    kafka = {k: v for k, v in secure_kafka.kafka.items() if k != "ssl_ca_location"}
    config = tmp_path / "no-ca.yaml"
    config.write_text(yaml.safe_dump({"kafka": kafka}))
    done = _cli("consume-snapshot", "--config", str(config), "--topic", "any.actions", "--once")
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "refused the connection: TLS failed" in line
    _assert_no_secret(secure_kafka, done.stdout + done.stderr)


def test_watch_with_a_wrong_password_stops_fast_with_exit_2(
    secure_kafka: SecureBroker, tmp_path: Path
) -> None:
    table = copy_table(TABLE_ID, tmp_path)
    config = _config(secure_kafka, tmp_path / "watch.yaml", f"dmsecw-{uuid.uuid4().hex[:10]}", table)
    wrong = f"not-{secure_kafka.password}-{uuid.uuid4().hex}"
    started = time.monotonic()
    done = _cli("watch", "--config", str(config), "--no-progress", env={PASSWORD_ENV: wrong})
    assert done.returncode == 2, done.stderr[-2000:]
    assert time.monotonic() - started < 25
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"deltamirror: error: Kafka at {secure_kafka.bootstrap} refused the connection: ")
    assert wrong not in done.stdout + done.stderr
    _assert_no_secret(secure_kafka, done.stdout + done.stderr)
