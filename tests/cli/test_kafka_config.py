"""Every consumer command reads the watcher's configuration file for its ``kafka:`` section."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from deltamirror.core.errors import ConfigError
from deltamirror.producer.config_file import load_kafka_settings

SECRET = "pw-7c1e0f-do-not-print"

WATCH_CONFIG = """\
kafka:
  bootstrap_servers: broker-a:9093,broker-b:9093
  security_protocol: sasl_ssl
  sasl_mechanism: SCRAM-SHA-512
  sasl_username: mirror
  sasl_password: ${KAFKA_PASSWORD}
  ssl_ca_location: certs/ca.pem
  extra:
    client.id: mirror-reader
tables:
  - uri: /data/sales
    poll_interval_s: 0.5
progress_topic: p
"""


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "deltamirror.cli.main", *args], capture_output=True, text=True, timeout=60
    )


def test_the_kafka_section_of_a_watch_config_is_read_alone(tmp_path: Path) -> None:
    config = tmp_path / "watch.yaml"
    config.write_text(WATCH_CONFIG)
    kafka = load_kafka_settings(config, environ={"KAFKA_PASSWORD": SECRET})
    assert kafka.librdkafka_config() == {
        "bootstrap.servers": "broker-a:9093,broker-b:9093",
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "mirror",
        "sasl.password": SECRET,
        "ssl.ca.location": str(tmp_path / "certs" / "ca.pem"),  # relative to the file, as for watch
        "client.id": "mirror-reader",
    }
    assert SECRET not in repr(kafka) and SECRET not in str(kafka.redacted())


def test_bootstrap_servers_flag_replaces_the_files_list(tmp_path: Path) -> None:
    config = tmp_path / "watch.toml"
    config.write_text('[kafka]\nbootstrap_servers = "a:1"\n')
    assert load_kafka_settings(config, bootstrap_servers="b:2").bootstrap_servers == "b:2"
    # a file without a broker list, given on the command line
    config.write_text('[kafka]\nsecurity_protocol = "SSL"\n')
    assert load_kafka_settings(config, bootstrap_servers="b:2").security_protocol == "SSL"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("tables: [x]\n", "kafka: required key is missing"),
        (
            "kafka: {bootstrap_servers: 'a:1', sasl_pasword: x}\n",
            "kafka.sasl_pasword: unknown key (did you mean 'sasl_password'?)",
        ),
        (
            f"kafka: {{bootstrap_servers: 'a:1', security_protocol: SASL_SSL, sasl_mechanism: PLAIN, "
            f"sasl_password: {SECRET}}}\n",
            "kafka.sasl_username: required with sasl_mechanism PLAIN",
        ),
        (  # the union's validator internals were the message (audit 2026-11-30)
            "kafka: {bootstrap_servers: 'a:1', extra: {linger.ms: [1, 2]}}\n",
            'kafka.extra["linger.ms"]: a librdkafka property takes a string, number or bool, not a list',
        ),
        (
            "kafka: {bootstrap_servers: 'a:1', extra: {linger.ms: ~}}\n",
            'kafka.extra["linger.ms"]: a librdkafka property takes a string, number or bool, not nothing',
        ),
    ],
)
def test_a_bad_kafka_section_names_the_file_and_key_never_the_value(
    tmp_path: Path, text: str, message: str
) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_kafka_settings(config)
    assert str(err.value) == f"invalid configuration: {message} (file={config})"
    assert err.value.exit_code == 2
    assert SECRET not in str(err.value)


@pytest.mark.parametrize("command", [["consume-snapshot"], ["invalidate", "--exec", "true"]])
def test_consumer_commands_take_config_or_bootstrap_servers(tmp_path: Path, command: list[str]) -> None:
    done = _cli(*command, "--topic", "t")
    assert done.returncode == 2
    assert done.stderr.strip() == "deltamirror: error: --bootstrap-servers is required without --config"

    config = tmp_path / "kafka.yaml"
    config.write_text(f"kafka: {{bootstrap_servers: 'a:1', sasl_username: u, sasl_password: {SECRET}}}\n")
    done = _cli(*command, "--config", str(config), "--topic", "t")
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert "kafka.sasl_username: SASL settings need security_protocol SASL_SSL or SASL_PLAINTEXT" in line
    assert SECRET not in done.stdout + done.stderr

    config.write_text("kafka: {bootstrap_servers: 'a:1', ssl_ca_location: /nonexistent/ca.pem}\n")
    done = _cli(*command, "--config", str(config), "--topic", "t")
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert (
        "kafka.ssl_ca_location: TLS settings need security_protocol SSL or SASL_SSL (it is PLAINTEXT)" in line
    )


@pytest.mark.parametrize(
    ("key", "said"),
    [
        ("group.id", "--group-id"),
        ("auto.offset.reset", "its own position"),
        ("enable.auto.commit", "commits offsets itself"),
        ("enable.auto.offset.store", "commits offsets itself"),
        ("enable.partition.eof", "the end of each partition"),
        ("acks", "acks=all"),
        ("partitioner", "murmur2_random"),
        ("delivery.report.only.error", "sets it itself"),
    ],
)
def test_a_property_deltamirror_sets_itself_is_refused_in_extra(
    key: str, said: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """F5 of the 2026-11-30 audit: the consumers' and producers' clients set these over
    kafka.extra, which silently did not take effect."""
    from deltamirror.cli.main import main

    config = tmp_path / "c.yaml"
    config.write_text(f"kafka:\n  bootstrap_servers: 127.0.0.1:1\n  extra:\n    {key}: x\n")
    shown = f'kafka.extra["{key}"]' if "." in key else f"kafka.extra.{key}"
    with pytest.raises(ConfigError) as refused:
        load_kafka_settings(config)
    assert f"{shown}: deltamirror sets this property itself" in refused.value.message
    for command in (["consume-snapshot"], ["invalidate", "--exec", "true"]):
        assert main([*command, "--config", str(config), "--topic", "t.actions", "--once"]) == 2
        err = capsys.readouterr().err
        assert shown in err and said in err and len(err.splitlines()) == 1, err
