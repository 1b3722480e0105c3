"""The options of ``format("deltamirror")``, checked on the driver before anything is planned.

No pyspark here: the options are plain strings, and a bad one must fail with one line naming the
option, as a bad flag does on the command line. The ``kafka.*`` options go through the watcher's
own :class:`~deltamirror.mirror.settings.KafkaSettings` (the same broker-list rule, the same SASL/SSL
consistency checks) under their librdkafka names: ``kafka.security.protocol`` is the
``security_protocol`` setting, anything without a typed setting is passed to the consumer as is.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from deltamirror.core.errors import InvalidArgumentError
from deltamirror.core.storage import normalize_table_uri
from deltamirror.core.table import DeltaTable, open_table
from deltamirror.mirror.settings import RESERVED_KAFKA_KEYS, KafkaSettings
from deltamirror.mirror.topics import default_topics

from .mirror_changes import MirrorSettings

DEFAULT_VERSIONS_PER_PARTITION = 64
KAFKA_PREFIX = "kafka."
STORAGE_PREFIX = "storage."

#: the librdkafka name of each typed Kafka setting: ``security_protocol`` is ``security.protocol``
_KAFKA_FIELDS = {
    **{name.replace("_", "."): name for name in KafkaSettings.model_fields if name != "extra"},
    # librdkafka's other spellings of the same properties
    "metadata.broker.list": "bootstrap_servers",
    "sasl.mechanisms": "sasl_mechanism",
}


@dataclass(frozen=True)
class SourceOptions:
    """What ``.option(...)`` and ``.load(path)`` said, checked: picklable, shipped to the tasks."""

    settings: MirrorSettings
    #: fsspec options: credentials, so never in repr() (Spark logs what it plans)
    storage_options: Mapping[str, str] = field(repr=False)
    starting_version: int | str | None
    versions_per_partition: int

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        uri = options.get("path")
        if not uri:
            raise InvalidArgumentError("give the table location: .load(path)")
        if not options.get("kafka.bootstrap.servers"):
            raise InvalidArgumentError("option kafka.bootstrap.servers is required", table=uri)
        kafka, passed_on = kafka_settings(options, uri)
        defaults = default_topics(normalize_table_uri(uri))  # where the location enters
        storage = {k[len(STORAGE_PREFIX) :]: v for k, v in options.items() if k.startswith(STORAGE_PREFIX)}
        starting: int | str | None = options.get("startingVersion")
        if starting is not None and str(starting).strip().lower() == "latest":
            starting = "latest"
        elif starting is not None:
            starting = non_negative_int("startingVersion", starting, uri)
        per_partition = non_negative_int(
            "versionsPerPartition", options.get("versionsPerPartition", DEFAULT_VERSIONS_PER_PARTITION), uri
        )
        if per_partition == 0:
            raise InvalidArgumentError("option versionsPerPartition must be at least 1", table=uri)
        client = kafka.librdkafka_config()  # plain strings, secrets revealed: for the tasks' consumers
        del client["bootstrap.servers"]
        settings = MirrorSettings(
            bootstrap_servers=kafka.bootstrap_servers,
            actions_topic=options.get("actionsTopic") or defaults.actions,
            commits_topic=options.get("commitsTopic") or defaults.commits,
            table_uri=uri,
            kafka_config={**client, **passed_on},
        )
        return cls(settings, storage, starting, per_partition)

    def table(self) -> DeltaTable:
        return open_table(self.settings.table_uri, dict(self.storage_options))


def kafka_settings(options: Mapping[str, str], table: str) -> tuple[KafkaSettings, dict[str, str]]:
    """The ``kafka.*`` options as KafkaSettings, and those it leaves to the consumer untouched.

    A problem names the option (``option kafka.sasl.username: ...``). The properties the watcher
    reserves for itself (``isolation.level``, ``transactional.id``, ``enable.idempotence``) are not
    refused here: the consumer sets ``isolation.level`` itself and ignores the producer's, as it
    always did.
    """
    values: dict[str, Any] = {}
    names = {name: f"option {KAFKA_PREFIX}{name.replace('_', '.')}" for name in _KAFKA_FIELDS.values()}
    extra: dict[str, str] = {}
    passed_on: dict[str, str] = {}
    for option, value in options.items():
        if not option.startswith(KAFKA_PREFIX):
            continue
        key = option[len(KAFKA_PREFIX) :]
        name = _KAFKA_FIELDS.get(key)
        if name is None:
            (passed_on if key in RESERVED_KAFKA_KEYS else extra)[key] = value
            continue
        if name in values:
            raise InvalidArgumentError(
                f"{names[name]} and option {option} set the same property: give one", table=table
            )
        values[name] = value
        names[name] = f"option {option}"
    return KafkaSettings.from_flags({**values, "extra": extra}, names), passed_on


def non_negative_int(name: str, value: Any, table: str) -> int:
    try:
        number = int(str(value).strip())
    except ValueError:
        raise InvalidArgumentError(
            f"option {name} must be a version number, got {value!r}", table=table
        ) from None
    if number < 0:
        raise InvalidArgumentError(f"option {name} must be >= 0, got {number}", table=table)
    return number


__all__ = ["DEFAULT_VERSIONS_PER_PARTITION", "SourceOptions", "kafka_settings", "non_negative_int"]
