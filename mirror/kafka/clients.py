"""The one place a Kafka client of deltamirror is made: its librdkafka logs never reach stderr raw.

Left alone, librdkafka writes a raw line to stderr (``%3|1712…|FAIL|rdkafka#producer-1| …``) for
every failed connection attempt. Every producer, consumer and admin client of the project is made
here, by :func:`producer`, :func:`consumer` or :func:`admin`, and each is given a ``logger``: the
caller's (a :class:`~deltamirror.mirror.kafka.connection.KafkaConnectionReporter`, which also turns the
client's errors into deltamirror's one-line warnings), or else :data:`RDKAFKA_LOGS`, which hands
librdkafka's lines to the ``deltamirror.librdkafka`` logger at DEBUG. ``tests/test_architecture.py``
holds every other module to this: none calls confluent-kafka's constructors itself.

A configuration librdkafka refuses (an unknown property in ``kafka.extra``, a value it cannot
take, a TLS file it cannot load) is bad input, not trouble to retry: each maker raises it as a
:class:`~deltamirror.core.errors.ConfigError` naming librdkafka's reason (a value quoted there is
left out: it may be a secret), and :func:`check_config` lets a command refuse it at start, before
any thread of its own has made a client.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient

from deltamirror.core.errors import ConfigError

#: librdkafka quotes the value it refuses: said without it (it may be a password)
_QUOTED_VALUE = re.compile(r'(Invalid value) ".*?" (for)')


class RdkafkaLogs:
    """confluent-kafka's ``logger`` interface: each librdkafka line to ``deltamirror.librdkafka``
    at DEBUG (quiet unless asked for), its own level kept as ``rdkafkaLevel``."""

    def __init__(self) -> None:
        self.logger = logging.getLogger("deltamirror.librdkafka")

    def log(self, level: int, msg: str, *args: Any) -> None:
        if self.logger.isEnabledFor(logging.DEBUG):
            self.logger.debug(msg, *args, extra={"rdkafkaLevel": logging.getLevelName(level)})


#: the logger of a client whose maker gave none
RDKAFKA_LOGS = RdkafkaLogs()


def routed(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` with a ``logger`` (the caller's, else :data:`RDKAFKA_LOGS`): what every client gets."""
    out = dict(config)
    if out.get("logger") is None:
        out["logger"] = RDKAFKA_LOGS
    return out


@contextmanager
def _settings_refused_as_config_error() -> Iterator[None]:
    """A client librdkafka will not make for its settings: a ConfigError (bad input, exit 2)."""
    try:
        yield
    except KafkaException as exc:
        error = exc.args[0] if exc.args else None
        if isinstance(error, KafkaError) and error.code() == KafkaError._INVALID_ARG:
            reason = _QUOTED_VALUE.sub(r"\1 \2", error.str())
            raise ConfigError(f"librdkafka refuses the Kafka settings (kafka:): {reason}") from None
        raise


def producer(config: Mapping[str, Any]) -> Producer:
    """A librdkafka producer whose logs are routed (:func:`routed`)."""
    with _settings_refused_as_config_error():
        return Producer(routed(config))


def consumer(config: Mapping[str, Any]) -> Consumer:
    """A librdkafka consumer whose logs are routed (:func:`routed`)."""
    with _settings_refused_as_config_error():
        return Consumer(routed(config))


def admin(config: Mapping[str, Any]) -> AdminClient:
    """A librdkafka admin client whose logs are routed (:func:`routed`)."""
    with _settings_refused_as_config_error():
        return AdminClient(routed(config))


def check_config(config: Mapping[str, Any]) -> None:
    """A ConfigError now if librdkafka refuses ``config`` (a throw-away admin client is made: it
    connects to nothing until asked)."""
    admin(config)


__all__ = ["RDKAFKA_LOGS", "RdkafkaLogs", "admin", "check_config", "consumer", "producer", "routed"]
