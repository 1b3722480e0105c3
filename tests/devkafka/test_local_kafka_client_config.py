"""The client configuration ``local kafka start`` writes is dumped from the Kafka settings model and
read back by the parser every consumer command's ``--config`` uses: the same settings, whatever
characters the password holds."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from pydantic import SecretStr

from deltamirror.devkafka.security import (
    SecureClientSettings,
    kafka_section_yaml,
    write_client_config,
)
from deltamirror.mirror.settings import KafkaSettings
from deltamirror.producer.config_file import load_kafka_settings

AWKWARD = "it's: a #secret, {x} [y] 'z' \"q\" & *anchor ~ null"


def test_the_scram_tls_client_file_loads_back_through_the_config_parser(tmp_path: Path) -> None:
    (tmp_path / "ca.pem").write_text("-----BEGIN CERTIFICATE-----\n")
    (tmp_path / "scram-password").write_text(AWKWARD + "\n")
    settings = SecureClientSettings(
        bootstrap_servers="127.0.0.1:19093",
        ca_file=tmp_path / "ca.pem",
        password_file=tmp_path / "scram-password",
        config_file=tmp_path / "kafka-client.yaml",
    )
    write_client_config(settings)
    assert stat.S_IMODE(settings.config_file.stat().st_mode) == 0o600
    assert settings.config_file.read_text().startswith("# The local broker's SASL_SSL listener")
    loaded = load_kafka_settings(settings.config_file, environ={})
    assert loaded.librdkafka_config() == {
        "bootstrap.servers": "127.0.0.1:19093",
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "deltamirror",
        "sasl.password": AWKWARD,
        "ssl.ca.location": str(tmp_path / "ca.pem"),
    }
    assert AWKWARD not in str(loaded) and AWKWARD not in repr(loaded.model_dump())


@pytest.mark.kafka
def test_a_plaintext_section_round_trips_and_connects(kafka_bootstrap: str, tmp_path: Path) -> None:
    from confluent_kafka.admin import AdminClient

    kafka = KafkaSettings(
        bootstrap_servers=kafka_bootstrap,
        extra={"client.id": "round-trip", "socket.keepalive.enable": "true", "sasl.oauthbearer.config": "x"},
    )
    path = tmp_path / "kafka.yaml"
    path.write_text(kafka_section_yaml(kafka))
    loaded = load_kafka_settings(path, environ={})
    assert loaded == kafka
    assert isinstance(loaded.extra["sasl.oauthbearer.config"], SecretStr)  # still a secret once read
    config = loaded.librdkafka_config()
    assert config["client.id"] == "round-trip" and config["bootstrap.servers"] == kafka_bootstrap
    assert AdminClient(config).list_topics(timeout=30).brokers  # it reaches the broker
