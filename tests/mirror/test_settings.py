"""The Kafka settings every command shares: one model, checked the same way for files and flags."""

from __future__ import annotations

import pytest
from pydantic import SecretStr

from deltamirror.core.errors import ConfigError
from deltamirror.mirror.settings import KafkaSettings

# --- the Kafka settings of the consumer commands ----------------------------------------------


def test_kafka_flags_are_checked_by_the_same_model_and_name_the_flag() -> None:
    names = {"bootstrap_servers": "--bootstrap-servers"}
    settings = KafkaSettings.from_flags({"bootstrap_servers": " a:1 , b:2 "}, names)
    assert settings.librdkafka_config() == {"bootstrap.servers": "a:1,b:2"}
    with pytest.raises(ConfigError) as err:
        KafkaSettings.from_flags({"bootstrap_servers": "a:1,svc:kafka-pw-Zq81@b:2"}, names)
    message = str(err.value)
    assert message.startswith("--bootstrap-servers: entry 2 of 2 holds credentials")
    assert "kafka-pw-Zq81" not in message
    with pytest.raises(ConfigError, match=r"^--bootstrap-servers: required key is missing$"):
        KafkaSettings.from_flags({"bootstrap_servers": None}, names)
    with pytest.raises(ConfigError, match=r"sasl_password: required with sasl_mechanism PLAIN"):
        KafkaSettings.from_flags(
            {
                "bootstrap_servers": "a:1",
                "security_protocol": "sasl_ssl",
                "sasl_mechanism": "plain",
                "sasl_username": "u",
            },
            names,
        )


def test_kafka_settings_redacted_for_logs() -> None:
    settings = KafkaSettings(
        bootstrap_servers="a:1",
        security_protocol="SASL_SSL",
        sasl_mechanism="PLAIN",
        sasl_username="u",
        sasl_password=SecretStr("kafka-pw-Zq81"),
        extra={"sasl.oauthbearer.client.secret": "aws-secret-Xk20", "linger.ms": 5},
    )
    shown = settings.redacted()
    assert shown["sasl_password"] == "***"
    # extra by its property names alone: any librdkafka property may carry a credential
    assert shown["extra"] == ["linger.ms", "sasl.oauthbearer.client.secret"]
    assert "kafka-pw-Zq81" not in repr(settings) and "aws-secret-Xk20" not in str(shown)
