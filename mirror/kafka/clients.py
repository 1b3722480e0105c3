"""The one place a Kafka client of deltamirror is made: its librdkafka logs never reach stderr raw.

Left alone, librdkafka writes a raw line to stderr (``%3|1712…|FAIL|rdkafka#producer-1| …``) for
every failed connection attempt. Every producer, consumer and admin client of the project is made
here, by :func:`producer`, :func:`consumer` or :func:`admin`, and each is given a ``logger``: the
caller's (a :class:`~deltamirror.mirror.kafka.connection.KafkaConnectionReporter`, which also turns the
client's errors into deltamirror's one-line warnings), or else :data:`RDKAFKA_LOGS`, which hands
librdkafka's lines to the ``deltamirror.librdkafka`` logger at DEBUG. ``tests/test_architecture.py``
holds every other module to this: none calls confluent-kafka's constructors itself.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient


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


def producer(config: Mapping[str, Any]) -> Producer:
    """A librdkafka producer whose logs are routed (:func:`routed`)."""
    return Producer(routed(config))


def consumer(config: Mapping[str, Any]) -> Consumer:
    """A librdkafka consumer whose logs are routed (:func:`routed`)."""
    return Consumer(routed(config))


def admin(config: Mapping[str, Any]) -> AdminClient:
    """A librdkafka admin client whose logs are routed (:func:`routed`)."""
    return AdminClient(routed(config))


__all__ = ["RDKAFKA_LOGS", "RdkafkaLogs", "admin", "consumer", "producer", "routed"]
