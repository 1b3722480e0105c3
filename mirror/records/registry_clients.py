"""What the registry-backed row-change formats (``avro``, ``protobuf``) share: one Schema Registry
client per registry settings, confluent-kafka's subject name strategy functions, the subject a
strategy names, and a registry failure as deltamirror's error naming the subject.

No serializer library is imported here (fastavro, protobuf): each format's module imports its own.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

from confluent_kafka.schema_registry import (
    SchemaRegistryClient,
    record_subject_name_strategy,
    topic_record_subject_name_strategy,
    topic_subject_name_strategy,
)
from confluent_kafka.schema_registry.error import SchemaRegistryError as ConfluentRegistryError

from deltamirror.core.errors import ConfigError

from ..errors import SchemaRegistryError, SchemaRegistryUnavailableError
from .row_formats import RegistrySettings

K = TypeVar("K")
V = TypeVar("V")

#: confluent-kafka's strategy function of each ``subject_name_strategy`` setting
SUBJECT_NAME_STRATEGY_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "topic": topic_subject_name_strategy,
    "record": record_subject_name_strategy,
    "topic-record": topic_record_subject_name_strategy,
}

#: guards the shared clients and the formats' serializer caches
lock = threading.Lock()
_clients: dict[RegistrySettings, SchemaRegistryClient] = {}


def registry_client(settings: RegistrySettings) -> SchemaRegistryClient:
    """The registry client of ``settings``, made once (no request until a schema is registered)."""
    with lock:
        client = _clients.get(settings)
        if client is None:
            client = _clients[settings] = SchemaRegistryClient(_client_conf(settings))
        return client


def _client_conf(settings: RegistrySettings) -> dict[str, Any]:
    conf: dict[str, Any] = {"url": settings.url}
    if settings.username is not None:
        password = settings.password.get_secret_value() if settings.password is not None else ""
        conf["basic.auth.user.info"] = f"{settings.username}:{password}"
    return conf


def subject_name(settings: RegistrySettings, topic: str, field: str, record_name: str) -> str:
    """The subject the strategy names for ``field`` (``key`` / ``value``) of ``topic`` whose record
    (Avro) or message (Protobuf) has the full name ``record_name``, as confluent-kafka's functions do."""
    strategy = settings.subject_name_strategy
    if strategy == "record":
        return record_name
    return f"{topic}-{record_name}" if strategy == "topic-record" else f"{topic}-{field}"


def made_once(cache: dict[K, V], key: K, make: Callable[[], V]) -> V:
    """``cache[key]``, made by ``make()`` (outside the lock: it may ask the registry) on first use;
    two threads making it at once keep the first one stored."""
    with lock:
        found = cache.get(key)
    if found is not None:
        return found
    made = make()
    with lock:
        return cache.setdefault(key, made)


#: the HTTP statuses of a registry that refuses the credentials (or their absence)
AUTH_REFUSALS = (401, 403)
#: how long the start's check of a registry's credentials waits for an answer
CHECK_TIMEOUT_S = 5


def credentials_refused(settings: RegistrySettings, status: int) -> str:
    """Which settings to look at when the registry answers 401/403; the password never, not even its length."""
    given = (
        f"the credentials of row_changes.registry.username ({settings.username!r}) and .password"
        if settings.username is not None
        else "calls without credentials"
    )
    return (
        f"the Schema Registry at {settings.url} refuses {given} (HTTP {status}): set "
        "row_changes.registry.username and row_changes.registry.password to a user it accepts"
    )


def check_registry_access(settings: RegistrySettings) -> None:
    """Refuse now (ConfigError, exit 2) a registry that refuses these credentials, or calls without
    any: one read (the subjects). A registry that cannot be reached or fails is left to the first
    record that needs it (retried there, as ever)."""
    # a client of its own: one try, bounded (a registry that does not answer delays no start)
    try:
        client = SchemaRegistryClient(
            {**_client_conf(settings), "timeout": CHECK_TIMEOUT_S, "max.retries": 0}
        )
    except ValueError as exc:  # a url the client cannot take
        raise ConfigError(f"row_changes.registry.url {settings.url!r}: {exc}") from None
    try:
        client.get_subjects()
    except ConfluentRegistryError as exc:
        if exc.http_status_code in AUTH_REFUSALS:
            raise ConfigError(credentials_refused(settings, exc.http_status_code)) from None
    except Exception:  # unreachable or failing: retried where a schema is registered
        return


def registry_error(exc: Exception, subject: str) -> Exception:
    """A registry failure as deltamirror's error naming the subject (a refusal, or unreachable:
    retry later); any other exception (a value the schema cannot take: a bug) as it is."""
    if isinstance(exc, ConfluentRegistryError):
        status = exc.http_status_code
        if status is not None and (status >= 500 or status < 0):
            return SchemaRegistryUnavailableError(
                f"the Schema Registry failed (HTTP {status}): {exc.error_message}", subject=subject
            )
        hint = (
            ": check row_changes.registry.username and row_changes.registry.password"
            if status in AUTH_REFUSALS
            else ""
        )
        return SchemaRegistryError(
            f"the Schema Registry refused the schema (HTTP {status}, error {exc.error_code}): "
            f"{exc.error_message}{hint}",
            subject=subject,
        )
    if isinstance(exc, OSError) or type(exc).__module__.split(".")[0] in ("httpx", "httpx2"):
        return SchemaRegistryUnavailableError(
            f"the Schema Registry cannot be reached: {exc}", subject=subject
        )
    return exc


__all__ = [
    "AUTH_REFUSALS",
    "SUBJECT_NAME_STRATEGY_FUNCTIONS",
    "check_registry_access",
    "credentials_refused",
    "lock",
    "made_once",
    "registry_client",
    "registry_error",
    "subject_name",
]
