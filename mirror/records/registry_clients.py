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
            conf: dict[str, Any] = {"url": settings.url}
            if settings.username is not None:
                password = settings.password.get_secret_value() if settings.password is not None else ""
                conf["basic.auth.user.info"] = f"{settings.username}:{password}"
            client = _clients[settings] = SchemaRegistryClient(conf)
        return client


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


def registry_error(exc: Exception, subject: str) -> Exception:
    """A registry failure as deltamirror's error naming the subject (a refusal, or unreachable:
    retry later); any other exception (a value the schema cannot take: a bug) as it is."""
    if isinstance(exc, ConfluentRegistryError):
        status = exc.http_status_code
        if status is not None and (status >= 500 or status < 0):
            return SchemaRegistryUnavailableError(
                f"the Schema Registry failed (HTTP {status}): {exc.error_message}", subject=subject
            )
        return SchemaRegistryError(
            f"the Schema Registry refused the schema (HTTP {status}, error {exc.error_code}): "
            f"{exc.error_message}",
            subject=subject,
        )
    if isinstance(exc, OSError) or type(exc).__module__.split(".")[0] in ("httpx", "httpx2"):
        return SchemaRegistryUnavailableError(
            f"the Schema Registry cannot be reached: {exc}", subject=subject
        )
    return exc


__all__ = [
    "SUBJECT_NAME_STRATEGY_FUNCTIONS",
    "lock",
    "made_once",
    "registry_client",
    "registry_error",
    "subject_name",
]
