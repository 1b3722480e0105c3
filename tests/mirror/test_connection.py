"""The broker list deltamirror accepts, and how librdkafka's errors are reported (no Kafka needed)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import pytest

from deltamirror.core.errors import ConfigError
from deltamirror.mirror.kafka.connection import (
    KafkaConnectionReporter,
    bootstrap_servers_problem,
    check_bootstrap_servers,
    describe_error,
)

# --- the broker list ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "normalized"),
    [
        ("localhost:9092", "localhost:9092"),
        ("broker-1.example.com:9093,broker-2.example.com:9093", None),
        (" a:1 , b:2 ", "a:1,b:2"),
        ("10.0.0.1:9092", None),
        ("[::1]:9092", None),
        ("[2001:db8::1]:9093,host-1.example.com:65535", None),
        ("kafka_1:9092", None),  # docker-compose service names
        ("k.:9092", None),
    ],
)
def test_valid_broker_lists(value: str, normalized: str | None) -> None:
    assert bootstrap_servers_problem(value) is None
    assert check_bootstrap_servers(value) == (normalized or value)


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("", "is empty"),
        ("   ", "is empty"),
        ("kafkahost", "has no port"),
        ("kafkahost:", "invalid port"),
        ("host:0", "invalid port"),
        ("host:65536", "invalid port"),
        ("host:9o92", "invalid port"),
        ("user:Sekr3t-pw@host:9092", "holds credentials"),
        ("host:9092,user:Sekr3t-pw@other:9092", "entry 2 of 2 holds credentials"),
        ("Sekr3t-pw@host:9092", "holds credentials"),
        ("PLAINTEXT://host:9092", "has a scheme"),
        ("SASL_SSL://user:Sekr3t-pw@host:9092", "holds credentials"),
        ("::1:9092", "without brackets"),
        ("[::1]", "is not [IPv6 address]:port"),
        ("[zz::1]:9092", "invalid IPv6"),
        ("999.1.1.1:9092", "invalid host name"),
        ("-bad-:9092", "invalid host name"),
        ("bad host:9092", "contains a space"),
        ("a:1,,b:2", "entry 2 of 3 is empty"),
        ("a:1,", "entry 2 of 2 is empty"),
    ],
)
def test_invalid_broker_lists_are_refused_without_quoting_the_value(value: str, problem: str) -> None:
    found = bootstrap_servers_problem(value)
    assert found is not None and problem in found
    with pytest.raises(ConfigError) as err:
        check_bootstrap_servers(value, "--bootstrap-servers")
    message = str(err.value)
    assert message.startswith("--bootstrap-servers: ")
    assert err.value.exit_code == 2
    assert "Sekr3t-pw" not in message
    if value.strip():
        assert value.strip() not in message


# --- librdkafka's errors --------------------------------------------------------------------------


@dataclass
class FakeError:
    """What error_cb receives: confluent_kafka.KafkaError's methods."""

    code_name: str
    text: str
    is_fatal: bool = False

    def name(self) -> str:
        return self.code_name

    def str(self) -> str:
        return self.text

    def fatal(self) -> bool:
        return self.is_fatal


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


REFUSED = "127.0.0.1:1/bootstrap: Connect to ipv4#127.0.0.1:1 failed: Connection refused (after 0ms in state CONNECT)"


@pytest.mark.parametrize(
    ("text", "address", "reason"),
    [
        (REFUSED, "127.0.0.1:1", "Connection refused"),
        (
            "no-such.invalid:9092/bootstrap: Failed to resolve 'no-such.invalid:9092': Name or service not "
            "known (after 3ms in state CONNECT)",
            "no-such.invalid:9092",
            "cannot resolve the host name (Name or service not known)",
        ),
        ("sasl_ssl://b:9093/1: SASL authentication error: bad password=hunter2", "b:9093", None),
        ("1/1 brokers are down", None, "1/1 brokers are down"),
        (  # librdkafka folds repeats into the line: not a part of the reason
            "127.0.0.1:1/bootstrap: Connect to ipv4#127.0.0.1:1 failed: Connection refused (after 0ms in "
            "state CONNECT, 1 identical error(s) suppressed)",
            "127.0.0.1:1",
            "Connection refused",
        ),
    ],
)
def test_describe_error(text: str, address: str | None, reason: str | None) -> None:
    found_address, found_reason = describe_error(text)
    assert found_address == address
    if reason is not None:
        assert found_reason == reason
    assert "hunter2" not in found_reason


def test_transport_errors_give_one_warning_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    reporter = KafkaConnectionReporter("127.0.0.1:1", interval_s=30, clock=clock)
    with caplog.at_level(logging.INFO, logger="deltamirror.kafka"):
        for _ in range(200):  # librdkafka's rate with the broker gone: tens a second
            reporter.on_error(FakeError("_TRANSPORT", REFUSED))
            clock.now += 0.05
        reporter.on_error(FakeError("_ALL_BROKERS_DOWN", "1/1 brokers are down"))
        clock.now += 30
        reporter.on_error(FakeError("_TRANSPORT", REFUSED))
        reporter.reachable()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert [r.getMessage() for r in warnings] == [
        "Kafka at 127.0.0.1:1 unreachable: Connection refused; retrying"
    ] * 2
    assert getattr(warnings[1], "repeated", None) == 199
    assert caplog.records[-1].getMessage() == "Kafka at 127.0.0.1:1 reachable again"
    assert reporter.fatal is None
    reporter.check()


def test_a_quiet_reporter_logs_nothing_and_keeps_the_reason(caplog: pytest.LogCaptureFixture) -> None:
    """For a command that says the reason once, in its error line (``signal``)."""
    reporter = KafkaConnectionReporter("127.0.0.1:1", quiet=True)
    with caplog.at_level(logging.DEBUG, logger="deltamirror"):
        reporter.on_error(FakeError("_TRANSPORT", REFUSED))
        reporter.on_error(FakeError("_ALL_BROKERS_DOWN", "1/1 brokers are down"))
        reporter.on_error(FakeError("_SSL", "b:9093/1: certificate verify failed"))
    assert [r for r in caplog.records if r.levelno >= logging.INFO] == []
    assert reporter.last_reason == "Connection refused"
    with pytest.raises(ConfigError, match="TLS failed"):
        reporter.check()


def test_all_brokers_down_alone_is_reported_in_words(caplog: pytest.LogCaptureFixture) -> None:
    reporter = KafkaConnectionReporter("b:9092")
    with caplog.at_level(logging.WARNING, logger="deltamirror.kafka"):
        reporter.on_error(FakeError("_ALL_BROKERS_DOWN", "0/2 brokers are down"))
    assert caplog.records[-1].getMessage() == "Kafka at b:9092 unreachable: all brokers are down; retrying"


@pytest.mark.parametrize("name", ["_AUTHENTICATION", "SASL_AUTHENTICATION_FAILED", "_SSL"])
def test_an_authentication_failure_is_latched_not_retried(name: str) -> None:
    stopped: list[ConfigError] = []
    reporter = KafkaConnectionReporter("b:9093", on_fatal=stopped.append)
    text = "sasl_ssl://b:9093/bootstrap: SASL authentication error: Authentication failed (password=hunter2)"
    reporter.on_error(FakeError(name, text))
    reporter.on_error(FakeError(name, text))
    assert len(stopped) == 1
    with pytest.raises(ConfigError) as err:
        reporter.check()
    message = str(err.value)
    assert message.startswith("Kafka at b:9093 refused the connection: ")
    assert "hunter2" not in message
    assert err.value.exit_code == 2


def test_librdkafka_log_lines_go_to_debug(caplog: pytest.LogCaptureFixture) -> None:
    reporter = KafkaConnectionReporter("b:9092")
    assert reporter.client_config() == {"logger": reporter, "error_cb": reporter.on_error}
    with caplog.at_level(logging.INFO, logger="deltamirror"):
        reporter.log(logging.ERROR, "%s [%s] %s", "FAIL", "rdkafka#producer-1", REFUSED)
    assert caplog.records == []  # quiet unless asked for
    with caplog.at_level(logging.DEBUG, logger="deltamirror.librdkafka"):
        reporter.log(logging.ERROR, "%s [%s] %s", "FAIL", "rdkafka#producer-1", REFUSED)
    [record] = caplog.records
    assert record.levelno == logging.DEBUG and record.name == "deltamirror.librdkafka"
    assert getattr(record, "rdkafkaLevel", None) == "ERROR"
