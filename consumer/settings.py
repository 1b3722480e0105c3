"""The ``consumer:`` section of a configuration file: what ``consume-snapshot`` and ``invalidate`` take.

The same file as the watcher's (``--config``): its ``kafka:`` section says how to reach the
brokers, this one which records the consumers take (docs/events.md, "The consumers' boundary").
Each key has a flag of the same name, which replaces the key's value when given::

    consumer:
      allow_table_locations: [s3://lake/sales]    # --allow-table-location (repeatable)
      allow_path_prefixes: [s3://lake/source]     # --allow-path-prefix (repeatable)
      on_bad_record: dead-letter                  # --on-bad-record stop | skip | dead-letter
      bad_record_topic: deltamirror.refused       # --bad-record-topic
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from deltamirror.core.errors import ConfigError
from deltamirror.mirror.boundary import OnBadRecord
from deltamirror.mirror.settings import SettingsModel, settings_error


class ConsumerSettings(SettingsModel):
    """Which records a consumer takes, and what it does with one it refuses."""

    allow_table_locations: list[str] = Field(default_factory=list)
    allow_path_prefixes: list[str] = Field(default_factory=list)
    on_bad_record: OnBadRecord = "stop"
    bad_record_topic: str | None = Field(default=None, min_length=1, pattern=r"^\S+$")

    @model_validator(mode="after")
    def _topic_with_dead_letter(self) -> ConsumerSettings:
        if self.on_bad_record == "dead-letter" and self.bad_record_topic is None:
            raise ValueError("on_bad_record dead-letter needs bad_record_topic (where refused records go)")
        if self.on_bad_record != "dead-letter" and self.bad_record_topic is not None:
            raise ValueError(
                f"bad_record_topic goes with on_bad_record dead-letter, not {self.on_bad_record}"
            )
        return self


class ConsumerSection(BaseModel):
    """A configuration file read for its ``consumer:`` section (the others are the watcher's)."""

    model_config = ConfigDict(frozen=True, extra="ignore", hide_input_in_errors=True)

    consumer: ConsumerSettings = Field(default_factory=ConsumerSettings)


#: the flag of each key (a problem with a flag's value names the flag)
FLAGS = {
    "allow_table_locations": "--allow-table-location",
    "allow_path_prefixes": "--allow-path-prefix",
    "on_bad_record": "--on-bad-record",
    "bad_record_topic": "--bad-record-topic",
}


def consumer_settings(
    section: Mapping[str, Any] | None, flags: Mapping[str, Any], source: str | None = None
) -> ConsumerSettings:
    """The file's ``consumer:`` section (``section``, None without a file) with the ``flags`` given
    (not None) replacing its keys. One ConfigError naming the key or the flag for any problem."""
    if section is not None and not isinstance(section, Mapping):
        raise ConfigError(
            "invalid configuration: consumer: expected a mapping of keys to values", file=source
        )
    data: dict[str, Any] = dict(section or {})
    given = {k: v for k, v in flags.items() if v is not None}
    try:
        return ConsumerSection.model_validate({"consumer": {**data, **given}}).consumer
    except ValidationError as exc:
        message = settings_error(exc, ConsumerSection, source=source).message
        for key in given:  # a value given by a flag is named by the flag
            message = re.sub(rf"(consumer\.)?\b{key}\b", f"{FLAGS[key]} ({key})", message)
        raise ConfigError(message, file=source) from None


__all__ = ["FLAGS", "ConsumerSection", "ConsumerSettings", "consumer_settings"]
