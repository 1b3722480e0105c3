"""A refused login is said once, as a ConfigError, and not followed by "brokers are down" warnings."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import pytest

from deltamirror.core.errors import ConfigError
from deltamirror.mirror.kafka.connection import KafkaConnectionReporter
from deltamirror.mirror.kafka.login_check import check_login, needs_login_check, refuse_wrong_credentials


@dataclass
class _Error:
    code_name: str
    text: str

    def name(self) -> str:
        return self.code_name

    def str(self) -> str:
        return self.text

    def fatal(self) -> bool:
        return False


AUTH = _Error(
    "_AUTHENTICATION",
    "sasl_ssl://b:9094/bootstrap: SASL authentication error: Authentication failed during authentication "
    "due to invalid credentials with SASL mechanism SCRAM-SHA-512 (after 320ms in state AUTH_REQ)",
)


def test_after_a_refused_login_the_brokers_being_down_is_not_said_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fatal: list[ConfigError] = []
    reporter = KafkaConnectionReporter("b:9094", on_fatal=fatal.append)
    with caplog.at_level(logging.INFO, logger="deltamirror.kafka"):
        reporter.on_error(AUTH)
        reporter.on_error(_Error("_ALL_BROKERS_DOWN", "1/1 brokers are down"))
        reporter.on_error(AUTH)
    assert caplog.records == []
    (error,) = fatal
    assert str(error) == (
        "Kafka at b:9094 refused the connection: authentication failed: SASL authentication error: "
        "Authentication failed during authentication due to invalid credentials with SASL mechanism SCRAM-SHA-512"
    )
    with pytest.raises(ConfigError) as raised:
        reporter.check()
    assert raised.value.exit_code == 2


@pytest.mark.parametrize(
    ("protocol", "checked"),
    [
        (None, False),
        ("PLAINTEXT", False),
        ("plaintext", False),
        ("SSL", True),
        ("SASL_SSL", True),
        ("sasl_plaintext", True),
    ],
)
def test_only_clients_that_authenticate_are_checked(protocol: str | None, checked: bool) -> None:
    config = {"bootstrap.servers": "b:1"} | ({} if protocol is None else {"security.protocol": protocol})
    assert needs_login_check(config) is checked


def test_an_unreachable_broker_is_left_to_the_retrying_path() -> None:
    # nothing listens on port 1: no refusal to raise, False after the timeout
    reporter = KafkaConnectionReporter("127.0.0.1:1")
    config = {"bootstrap.servers": "127.0.0.1:1", "security.protocol": "SSL", "log_level": 0}
    assert check_login(config, reporter, timeout_s=1.0) is False
    refuse_wrong_credentials({"bootstrap.servers": "127.0.0.1:1"})  # PLAINTEXT: not even asked


def test_a_certificate_refused_as_a_transport_error_is_a_tls_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fatal: list[ConfigError] = []
    reporter = KafkaConnectionReporter("b:9094", on_fatal=fatal.append)
    transport = _Error(
        "_TRANSPORT",
        "sasl_ssl://b:9094/bootstrap: SSL handshake failed: error:0A000086:SSL routines::"
        "certificate verify failed (after 5ms in state SSL_HANDSHAKE)",
    )
    with caplog.at_level(logging.INFO, logger="deltamirror.kafka"):
        reporter.on_error(transport)
    assert caplog.records == []
    assert [str(e) for e in fatal] == [
        "Kafka at b:9094 refused the connection: TLS failed: error:0A000086:SSL routines::certificate verify failed"
    ]
