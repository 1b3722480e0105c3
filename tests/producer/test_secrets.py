"""No secret in any output: log lines, error messages, /metrics and /healthz, the CLI's stderr.

Credentials are put in every URL-valued field (the table URI, storage options such as
``endpoint_url`` and ``client_kwargs``, the broker list, a config file) and in secret-named keys;
each output is searched for the secret values. Every test also checks that the redacted form is
there, so a test cannot pass because nothing was printed at all.
"""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from deltamirror.core.errors import ConfigError, TableNotFoundError
from deltamirror.core.redact import MASK, RedactingFilter, is_secret_key, redact, redact_value
from deltamirror.producer import load_config, redacted
from deltamirror.producer.log_format import configure_logging
from deltamirror.producer.metrics import WatcherMetrics, serve

# one recognisable value per place a credential can hide
URI_SECRET = "uri-secret-Aa11"
ENDPOINT_SECRET = "endpoint-secret-Bb22"
NESTED_SECRET = "nested-endpoint-secret-Cc33"
OPTION_SECRET = "option-secret-Dd44"
KAFKA_SECRET = "kafka-secret-Ee55"
SASL_SECRET = "sasl-secret-Ff66"
ALL_SECRETS = (URI_SECRET, ENDPOINT_SECRET, NESTED_SECRET, OPTION_SECRET, KAFKA_SECRET, SASL_SECRET)

SECRET_URI = f"memory://AKIAUSER:{URI_SECRET}@bucket/events"


def assert_no_secret(text: str) -> None:
    for secret in ALL_SECRETS:
        assert secret not in text, f"{secret} printed:\n{text[:3000]}"


# --- the redaction function -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # userinfo of any scheme, anywhere in a text
        ("s3://AKIA:abc123@bucket/t", "s3://***@bucket/t"),
        ("abfss://user:pw@acct.dfs.core.windows.net/t", "abfss://***@acct.dfs.core.windows.net/t"),
        ("https://ghp_token@github.com/x", "https://***@github.com/x"),
        ("cannot open http://u:p@minio:9000/b (retrying)", "cannot open http://***@minio:9000/b (retrying)"),
        ("s3://AKIA:abc/def+ghi@bucket/t", "s3://***@bucket/t"),  # AWS secrets hold '/'
        ("s3://key:p@ss@bucket/t", "s3://***@bucket/t"),  # and '@' unescaped
        ("s3://a:b@x/t,gs://c:d@y/u", "s3://***@x/t,gs://***@y/u"),
        # userinfo without a scheme: a broker list
        ("user:pw@broker:9092,other:9092", "***@broker:9092,other:9092"),
        # secret-named keys: kwargs, query strings, reprs, JSON
        ("Client(key=AKIA1, secret='a b', region=eu)", "Client(key=***, secret='***', region=eu)"),
        (
            "https://a.blob.core.windows.net/c?sv=2020&sig=abc%2F&se=1",
            "https://a.blob.core.windows.net/c?sv=2020&sig=***&se=1",
        ),
        ("{'password': 'hunter2', 'region': 'eu'}", "{'password': '***', 'region': 'eu'}"),
        (
            '{"aws_session_token": 12, "sasl.jaas.config": "x y"}',
            '{"aws_session_token": "***", "sasl.jaas.config": "***"}',
        ),
        (
            "ssl.key.password=pw ssl.key.location=/etc/k.pem",
            "ssl.key.password=*** ssl.key.location=/etc/k.pem",
        ),
        # nothing to hide: unchanged
        ("s3://bucket/path/part=a@b/file.parquet", None),
        ("file:///tmp/t", None),
        ("kafka.sasl_password: required with sasl_mechanism PLAIN", None),
        ('{"sasl_password": null, "token": ""}', None),
        ("mail bob@example.com", None),
    ],
)
def test_redact(text: str, expected: str | None) -> None:
    assert redact(text) == (expected if expected is not None else text)
    assert redact(redact(text)) == redact(text)  # applied twice (filter, then formatter): the same


def test_redacted_json_stays_json() -> None:
    text = json.dumps({"token": 12, "uri": "s3://k:s@b/t", "note": "password=abc", "secret": None})
    assert json.loads(redact(text)) == {
        "token": MASK,
        "uri": "s3://***@b/t",
        "note": "password=***",
        "secret": None,
    }


@pytest.mark.parametrize(
    "key",
    [
        "password",
        "sasl_password",
        "PASSWORD",
        "secret",
        "client_secret",
        "token",
        "sas_token",
        "aws_session_token",
        "key",
        "access_key",
        "aws_access_key_id",
        "account_key",
        "credential",
        "credentials",
        "sasl.username",
        "sasl.oauthbearer.config",
        "ssl.key.pem",
        "ssl.keystore.password",
        "private_key",
        "private_key_id",
        "sas",
        "sig",
        "connection_string",
    ],
)
def test_secret_keys(key: str) -> None:
    assert is_secret_key(key)


@pytest.mark.parametrize(
    "key",
    [
        "endpoint_url",
        "region",
        "account_name",
        "anon",
        "ssl.key.location",
        "ssl_ca_location",
        "client.id",
        "uri",
    ],
)
def test_keys_that_are_not_secret(key: str) -> None:
    assert not is_secret_key(key)


def test_redact_value_masks_whole_values_under_secret_keys() -> None:
    value = {
        "uri": "s3://k:s@b/t",
        "storage_options": {
            "token": {"refresh_token": "rt"},  # gcsfs: a dict
            "client_kwargs": {"endpoint_url": "http://u:p@h:9000", "region_name": "eu"},
            "anon": False,
            "retries": 3,
        },
        "tables": [("a", "password=x")],
    }
    assert redact_value(value) == {
        "uri": "s3://***@b/t",
        "storage_options": {
            "token": MASK,
            "client_kwargs": {"endpoint_url": "http://***@h:9000", "region_name": "eu"},
            "anon": False,
            "retries": 3,
        },
        "tables": [["a", "password=***"]],
    }


# a secret of any shape, as long as it cannot be told from its surroundings by a separator
_SECRET_TEXT = st.text(
    alphabet=st.characters(min_codepoint=33, max_codepoint=126, blacklist_characters="\"'<>,;&)}]\\"),
    min_size=6,
    max_size=40,
).map(lambda s: f"Q{s}")


@settings(max_examples=300, deadline=None)
@given(secret=_SECRET_TEXT)
def test_no_secret_survives_any_template(secret: str) -> None:
    templates = [
        "s3://AKIAUSER:{}@bucket/table",
        "failed: GET http://minio:{}@minio.local:9000/b/_delta_log (retrying)",
        "brokers a:1,svc:{}@b:2",
        "options(password={}, region=eu)",
        "?sv=1&sig={}&se=2",
        '{{"client_secret": "{}"}}',
    ]
    for template in templates:
        assert secret not in redact(template.format(secret)), template


def test_error_messages_are_redacted() -> None:
    error = TableNotFoundError("no _delta_log at s3://AKIA:x-Aa@b/t", table=SECRET_URI, file="t?sig=zz")
    assert str(error) == ("no _delta_log at s3://***@b/t (table=memory://***@bucket/events, file=t?sig=***)")
    assert "x-Aa" not in repr(str(error))


# --- logs ----------------------------------------------------------------------------------------


def test_json_log_lines_are_redacted() -> None:
    stream = io.StringIO()
    configure_logging(logging.DEBUG, stream)
    try:
        log = logging.getLogger("deltamirror.test")
        log.info("opening %s", SECRET_URI, extra={"table": SECRET_URI, "options": {"secret": OPTION_SECRET}})
        try:
            raise ValueError(f"endpoint http://minio:{ENDPOINT_SECRET}@minio:9000 refused")
        except ValueError as exc:
            log.error("storage failed", exc_info=exc)
        log.warning("kafka: %s", f"sasl.password={SASL_SECRET}")
    finally:
        logging.getLogger("deltamirror").handlers.clear()
        logging.getLogger("deltamirror").propagate = True
    text = stream.getvalue()
    assert_no_secret(text)
    lines = [json.loads(line) for line in text.splitlines()]
    assert lines[0]["msg"] == "opening memory://***@bucket/events"
    assert lines[0]["table"] == "memory://***@bucket/events"
    assert "http://***@minio:9000" in lines[1]["error"] and "http://***@minio:9000" in lines[1]["traceback"]
    assert lines[2]["msg"] == "kafka: sasl.password=***"


def test_the_redacting_filter_on_any_handler(caplog: pytest.LogCaptureFixture) -> None:
    """For handlers that are not ours (a consumer command's basicConfig): the record itself is redacted."""
    caplog.handler.addFilter(RedactingFilter())
    log = logging.getLogger("deltamirror.test")
    with caplog.at_level(logging.INFO, logger="deltamirror.test"):
        log.info("table %s", SECRET_URI, extra={"endpoint": f"http://u:{ENDPOINT_SECRET}@h"})
        try:
            raise OSError(f"token={OPTION_SECRET}")
        except OSError:
            log.exception("failed")
    assert_no_secret(caplog.text)
    assert_no_secret(repr([(r.msg, r.args, r.exc_text, r.__dict__.get("endpoint")) for r in caplog.records]))
    assert caplog.records[0].getMessage() == "table memory://***@bucket/events"
    assert "token=***" in caplog.text


# --- configuration ---------------------------------------------------------------------------------


def secret_config(tmp_path: Path, table: str, **top: Any) -> Path:
    """A config with a credential in every URL-valued field and in secret-named keys."""
    data = {
        "kafka": {
            "bootstrap_servers": top.pop("bootstrap", "127.0.0.1:9"),
            "security_protocol": "SASL_PLAINTEXT",
            "sasl_mechanism": "PLAIN",
            "sasl_username": "svc",
            "sasl_password": SASL_SECRET,
            "extra": {"sasl.oauthbearer.client.secret": KAFKA_SECRET, "client.id": "visible"},
        },
        "tables": [
            {"uri": table, "actions_topic": "t.actions", "commits_topic": "t.commits"},
            {
                "uri": SECRET_URI,
                "wait_for_table": True,  # a memory table: none is there yet
                # storage options are for object stores (a local table refuses them)
                "storage_options": {
                    "endpoint_url": f"http://minio:{ENDPOINT_SECRET}@minio:9000",
                    "client_kwargs": {"endpoint_url": f"https://svc:{NESTED_SECRET}@s3.local"},
                    "secret": OPTION_SECRET,
                },
            },
        ],
        **top,
    }
    path = tmp_path / "secret.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_the_logged_configuration_has_no_secret(tmp_path: Path) -> None:
    cfg = load_config(secret_config(tmp_path, str(tmp_path / "t")))
    text = json.dumps(redacted(cfg))
    assert_no_secret(text)
    data = redacted(cfg)
    options = data["tables"][1]["storage_options"]
    assert options["endpoint_url"] == "http://***@minio:9000"
    assert options["client_kwargs"]["endpoint_url"] == "https://***@s3.local"
    assert data["tables"][1]["uri"] == "memory://***@bucket/events"
    assert "client.id" in data["kafka"]["extra"] and "visible" not in text  # keys only
    # the clients still get the real values
    assert cfg.tables[1].storage_options_plain()["endpoint_url"].endswith(f"{ENDPOINT_SECRET}@minio:9000")


def test_a_broker_list_with_credentials_is_refused_in_the_config_file(tmp_path: Path) -> None:
    path = secret_config(tmp_path, str(tmp_path / "t"), bootstrap=f"svc:{KAFKA_SECRET}@broker:9092")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert "kafka.bootstrap_servers: the entry holds credentials" in str(err.value)
    assert_no_secret(str(err.value))


# --- metrics -------------------------------------------------------------------------------------


def test_metrics_and_health_never_show_credentials() -> None:
    metrics = WatcherMetrics()
    metrics.published_version(SECRET_URI, 3, 1_700_000_000_000)
    metrics.event_published(SECRET_URI, 5)
    metrics.table_error(SECRET_URI, f"cannot read {SECRET_URI}: token={OPTION_SECRET}")
    metrics.set_healthy(False, f"fenced on {SECRET_URI}")
    with serve(metrics, port=0) as server:
        bodies = []
        for path in ("/metrics", "/healthz"):
            try:
                with urllib.request.urlopen(server.url + path, timeout=5) as resp:
                    bodies.append(resp.read().decode())
            except urllib.error.HTTPError as err:  # 503: unhealthy
                bodies.append(err.read().decode())
    assert_no_secret("\n".join(bodies))
    assert 'deltamirror_last_published_version{table="memory://***@bucket/events"} 3.0' in bodies[0]
    health = json.loads(bodies[1])
    assert health["tables"]["memory://***@bucket/events"]["reason"] == (
        "cannot read memory://***@bucket/events: token=***"
    )
    assert health["reason"] == (  # the watcher's reason, then the tables stopped on an error
        "fenced on memory://***@bucket/events; 1 table(s) stopped on an error: memory://***@bucket/events"
    )


# --- the command line ------------------------------------------------------------------------------


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "deltamirror.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


@pytest.mark.parametrize("command", ["events", "history", "snapshot"])
def test_cli_errors_about_a_table_uri_with_credentials(command: str) -> None:
    done = cli(
        command,
        SECRET_URI,
        "-S",
        f"endpoint_url=http://u:{ENDPOINT_SECRET}@h",
        "-S",
        f"secret={OPTION_SECRET}",
    )
    assert done.returncode == 2, done.stderr
    assert_no_secret(done.stdout + done.stderr)
    # the table's identity carries no password at all: the message names the table without it
    assert "(table=memory://bucket/events)" in done.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["watch", "--bootstrap-servers", f"svc:{KAFKA_SECRET}@broker:9092", "/tmp/t"],
        ["watch", "--bootstrap-servers", f"SASL_SSL://svc:{KAFKA_SECRET}@broker:9092", "/tmp/t"],
        [
            "consume-snapshot",
            "--bootstrap-servers",
            f"broker:9092,svc:{KAFKA_SECRET}@b2:9092",
            "--topic",
            "t",
        ],
    ],
)
def test_cli_refuses_a_broker_list_with_credentials(args: list[str]) -> None:
    done = cli(*args)
    assert done.returncode == 2, done.stderr
    assert_no_secret(done.stdout + done.stderr)
    assert "holds credentials" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_spark_option_refuses_a_broker_list_with_credentials() -> None:
    pytest.importorskip("pyspark")
    from deltamirror.consumer.spark.options import SourceOptions

    with pytest.raises(ConfigError) as err:
        SourceOptions.parse({"path": "/tmp/t", "kafka.bootstrap.servers": f"svc:{KAFKA_SECRET}@b:9092"})
    assert str(err.value).startswith("option kafka.bootstrap.servers: the entry holds credentials")
    assert_no_secret(str(err.value))


def test_watch_process_prints_no_secret_in_logs_metrics_or_health(tmp_path: Path, kit: Any) -> None:
    """The real command, against an unreachable broker, with credentials everywhere a URL goes."""
    table = kit.make_table(tmp_path / "t", versions=1)
    metrics_port = closed_port()
    config = secret_config(
        tmp_path, str(table), bootstrap=f"127.0.0.1:{closed_port()}", metrics_port=metrics_port
    )
    err_path = tmp_path / "stderr.log"
    with open(err_path, "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "deltamirror.cli.main", "watch", "--config", str(config)],
            stdout=subprocess.PIPE,
            stderr=err,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    bodies = []
    try:
        deadline = time.monotonic() + 30
        for path in ("/metrics", "/healthz"):
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}{path}", timeout=2) as resp:
                        bodies.append(resp.read().decode())
                    break
                except urllib.error.HTTPError as exc:  # 503 while starting
                    bodies.append(exc.read().decode())
                    break
                except OSError:
                    assert time.monotonic() < deadline, err_path.read_text()
                    time.sleep(0.2)
        while "unreachable" not in err_path.read_text():  # the first failed attempts are reported
            assert time.monotonic() < deadline + 60, err_path.read_text()
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=20)
    stderr = err_path.read_text()
    assert proc.returncode == 0, stderr
    assert_no_secret(stderr + out.decode() + "\n".join(bodies))
    # what was printed is there, redacted
    starting = next(json.loads(line) for line in stderr.splitlines() if '"starting"' in line)
    config_text = starting["config"]
    assert "http://***@minio:9000" in config_text and "memory://***@bucket/events" in config_text
    assert "deltamirror_healthy" in bodies[0]
    assert "unreachable" in stderr


# librdkafka properties that can carry a credential without a secret-looking name: any value of
# kafka.extra is shown by its key alone
EXTRA_SECRETS = {
    "client.rack": "rack-secret-Gg77",
    "ssl.keystore.password": "keystore-secret-Hh88",
    "socket.keepalive.enable": "true",  # even a harmless value: keys only
}


@pytest.mark.kafka
@pytest.mark.timeout(180)
def test_kafka_extra_values_are_never_logged(
    kafka_bootstrap: str, tmp_path: Path, kit: Any, watch_setup: Any
) -> None:
    """A watch start on the real broker, until it has published: no value of ``kafka.extra`` in any
    line it printed (the starting line names the keys), the librdkafka lines included."""
    bootstrap = kafka_bootstrap
    table = kit.make_table(tmp_path / "t", versions=2)
    setup = watch_setup(bootstrap, table)
    data = yaml.safe_load(setup.config.read_text())
    data["kafka"]["extra"] = EXTRA_SECRETS
    setup.config.write_text(yaml.safe_dump(data))
    log = tmp_path / "watch.log"
    proc = setup.start_process(log=log)
    try:
        deadline = time.monotonic() + 90
        while not any(
            r.headers.get("kind") == b"commit" and r.json["version"] == 1
            for r in setup.commits_records(idle_s=0.3)
        ):
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
    finally:
        assert kit.stop_process(proc) == 0, log.read_text()
    text = log.read_text()
    for value in ("rack-secret-Gg77", "keystore-secret-Hh88"):
        assert value not in text, f"{value} printed:\n{text[:3000]}"
    starting = next(json.loads(line) for line in text.splitlines() if '"starting"' in line)
    assert json.loads(starting["config"])["kafka"]["extra"] == sorted(EXTRA_SECRETS)
