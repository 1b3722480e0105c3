"""A wrong password said in a second, not after a long retry loop.

librdkafka treats a failed SASL login like a broken connection: it reconnects with backoff, and it
hands the ``_AUTHENTICATION`` error to ``error_cb`` only when the client's queue is served. A
consumer that is still waiting for a topic's metadata serves nothing, so a typo in a password
looked like "all brokers are down" for the metadata timeout, then exited as retryable (1).

:func:`check_login` asks for metadata once with a throw-away admin client whose callbacks go to
the command's :class:`~deltamirror.mirror.kafka.connection.KafkaConnectionReporter`: a refused login is
then raised as its ConfigError (exit 2, one line, no secret) within a few seconds. Only clients
that authenticate (SASL, SSL) need it; a broker that is merely unreachable is left to the normal
retry path, which says so and keeps trying.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from confluent_kafka import KafkaException

from . import clients
from .connection import KafkaConnectionReporter

#: how long a login may take before the broker is left to the normal, retrying path
DEFAULT_TIMEOUT_S = 8.0
_SLICE_S = 0.5


def needs_login_check(config: Mapping[str, Any]) -> bool:
    """Whether the client authenticates (SASL or TLS): only then can a login be refused."""
    return str(config.get("security.protocol", "PLAINTEXT")).upper() != "PLAINTEXT"


def check_login(
    config: Mapping[str, Any], reporter: KafkaConnectionReporter, *, timeout_s: float = DEFAULT_TIMEOUT_S
) -> bool:
    """True once the brokers answered; the reporter's ConfigError if they refused the login.

    False when they did not answer within ``timeout_s`` (unreachable: the caller's own retries
    report that). ``config`` is a client configuration (secrets revealed); it is never logged.
    """
    client_config = {
        **{k: v for k, v in config.items() if k not in ("logger", "error_cb")},
        **reporter.client_config(),
    }
    admin = clients.admin(client_config)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if admin.list_topics(timeout=_SLICE_S).brokers:
                reporter.check()
                return True
        except KafkaException:
            pass
        admin.poll(0)  # hands the queued errors (a refused login among them) to the reporter
        reporter.check()
        if time.monotonic() >= deadline:
            return False


def refuse_wrong_credentials(config: Mapping[str, Any], *, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
    """For a reader without a reporter of its own (the Spark source): raise a refused login.

    Nothing is logged here; the ConfigError is the one line said. A PLAINTEXT client is not asked.
    """
    if not needs_login_check(config):
        return
    reporter = KafkaConnectionReporter(str(config.get("bootstrap.servers", "")), on_fatal=lambda error: None)
    check_login(config, reporter, timeout_s=timeout_s)


__all__ = ["DEFAULT_TIMEOUT_S", "check_login", "needs_login_check", "refuse_wrong_credentials"]
