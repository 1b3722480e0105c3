"""What ``consume-snapshot`` and ``invalidate`` do, as one frozen model each.

:class:`SnapshotSettings` and :class:`InvalidateSettings` (both :class:`SourceSettings`) are made
once per run from three layers, merged by :func:`deltamirror.mirror.settings.merge_layers` and
validated once: the configuration file (``--config``), the ``DELTAMIRROR_*`` environment variables
(one per flag: ``--max-items`` is ``DELTAMIRROR_MAX_ITEMS``) and the flags, a later layer winning
field by field (flags > environment > file > defaults). The command line only declares the flags
(``deltamirror.cli.consumer_cmds``) and runs what the model says.

The file is the watcher's (``--config``): its ``kafka:`` section says how to reach the brokers, and
its ``consumer:`` section which records the consumers take (docs/events.md, "The consumers'
boundary"). Each key has a flag of the same name, which replaces the key's value when given::

    consumer:
      allow_table_locations: [s3://lake/sales]    # --allow-table-location (repeatable)
      allow_path_prefixes: [s3://lake/source]     # --allow-path-prefix (repeatable)
      on_bad_record: dead-letter                  # --on-bad-record stop | skip | dead-letter
      bad_record_topic: deltamirror.refused       # --bad-record-topic
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    model_validator,
)

from deltamirror.core.errors import ConfigError
from deltamirror.mirror.records.boundary import OnBadRecord
from deltamirror.mirror.settings import KafkaSettings, Refused, SettingsModel, settings_error, spelled
from deltamirror.mirror.topic_names import default_commits_topic, topic_name_problem


class ConsumerSettings(SettingsModel):
    """Which records a consumer takes, and what it does with one it refuses: the keys of the file's
    ``consumer:`` section, checked alone for their names and types (their combinations, with the
    flags' and the environment's values, are checked once merged: :class:`SourceSettings`)."""

    allow_table_locations: list[str] = Field(default_factory=list)
    allow_path_prefixes: list[str] = Field(default_factory=list)
    on_bad_record: OnBadRecord = "stop"
    bad_record_topic: str | None = Field(default=None, min_length=1, pattern=r"^\S+$")


class ConsumerSection(BaseModel):
    """A configuration file read for its ``consumer:`` section (the others are the watcher's)."""

    model_config = ConfigDict(frozen=True, extra="ignore", hide_input_in_errors=True)

    consumer: ConsumerSettings = Field(default_factory=ConsumerSettings)


def file_section(section: Any, source: str) -> dict[str, Any]:
    """The keys a file's ``consumer:`` section gives (None: none), checked for their names and
    types; a ConfigError naming ``source`` and the key otherwise."""
    if section is None:
        return {}
    if not isinstance(section, Mapping):
        raise ConfigError(
            "invalid configuration: consumer: expected a mapping of keys to values", file=source
        )
    try:
        given = ConsumerSection.model_validate({"consumer": section}).consumer
    except ValidationError as exc:
        raise settings_error(exc, ConsumerSection, source=source) from None
    return given.model_dump(exclude_unset=True)


#: the defaults of the settings whose absence is told apart from their default (a refused
#: combination): the library's own (tests hold them equal)
CHECKPOINT_VERSIONS = 100
CHECKPOINT_S = 60.0
MAX_ITEMS = 1000
BACKOFF_S = 0.5
MAX_BACKOFF_S = 30.0
MAX_ATTEMPTS = 5
TIMEOUT_S = 30.0


def _finite_at_least_0(value: float) -> bool:
    return value >= 0 and math.isfinite(value)


class SourceSettings(SettingsModel):
    """What ``consume-snapshot`` and ``invalidate`` share: the topics, the group, the state, the
    metrics server, and which records they take (the file's ``consumer:`` keys).

    Made by :func:`deltamirror.mirror.settings.merge_layers` from the configuration file, the
    ``DELTAMIRROR_*`` environment variables and the flags (in that order, the later winning), and
    checked once as a whole: a combination that cannot take effect is refused in one sentence
    naming each setting as it was given (flag, variable or key). ``None``: not given (the default
    applies; the properties below resolve it).
    """

    # its validator (and each command's) is built when a command first validates one: a command
    # builds its own only, not this base's nor the other command's (~8 ms each at every start)
    model_config = ConfigDict(defer_build=True)

    kafka: KafkaSettings
    topic: str | None = None
    #: "": the watcher's default pair of ``topic`` (see :attr:`commits_topic_name`)
    commits_topic: str | None = None
    group_id: str | None = None
    once: bool = False
    state_dir: str | None = None
    checkpoint_interval_versions: int | None = None
    checkpoint_interval_s: float | None = None
    metrics_port: int | None = None
    metrics_host: str | None = None
    max_items: int | None = None
    allow_table_locations: list[str] = Field(default_factory=list)
    allow_path_prefixes: list[str] = Field(default_factory=list)
    on_bad_record: OnBadRecord = "stop"
    bad_record_topic: str | None = None

    @model_validator(mode="after")
    def _source_rules(self, info: ValidationInfo) -> SourceSettings:
        for problem in self._source_problems(lambda field: spelled(info, field)):
            raise Refused(problem)
        return self

    def _source_problems(self, say: Callable[[str], str]) -> Iterator[str]:
        """Every refusal of the shared settings, in the order they are said (the first is)."""
        if self.topic is None:
            yield f"the following arguments are required: {say('topic')}"
            return
        problem = topic_name_problem(self.topic)
        if problem is not None:
            yield f"{say('topic')}: {problem}"
        if self.commits_topic:
            problem = topic_name_problem(self.commits_topic.strip())
            if problem is not None:
                yield f"{say('commits_topic')}: {problem}"
        for field in ("group_id", "state_dir"):
            value = getattr(self, field)
            if value is not None and not value.strip():
                yield f"{say(field)} is empty"
        if self.max_items is not None and self.max_items < 0:
            yield f"{say('max_items')} must be 0 or more"
        yield from self._max_items_problems(say)
        if self.metrics_host is not None and self.metrics_port is None:
            yield f"{say('metrics_host')} goes with {say('metrics_port')}"
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            yield f"{say('metrics_port')} must be 0-65535"
        for field in ("checkpoint_interval_versions", "checkpoint_interval_s"):
            value = getattr(self, field)
            if value is None:
                continue
            if self.state_dir is None:
                yield f"{say(field)} goes with {say('state_dir')}: without one nothing is saved"
            if not _finite_at_least_0(value):
                yield f"{say(field)} must be 0 or more"
        if self.on_bad_record == "dead-letter" and self.bad_record_topic is None:
            yield (
                f"{say('on_bad_record')} dead-letter needs {say('bad_record_topic')} "
                "(where refused records go)"
            )
        if self.on_bad_record != "dead-letter" and self.bad_record_topic is not None:
            yield (
                f"{say('bad_record_topic')} goes with {say('on_bad_record')} dead-letter, "
                f"not {self.on_bad_record}"
            )
        if self.bad_record_topic is not None:
            problem = topic_name_problem(self.bad_record_topic)
            if problem is not None:
                yield f"{say('bad_record_topic')}: {problem}"
            if self.bad_record_topic in self.read_topics:
                # each refused record copied back into the input is read, refused and copied again
                yield f"{say('bad_record_topic')} {self.bad_record_topic} is a topic this command reads"

    def _max_items_problems(self, say: Callable[[str], str]) -> Iterator[str]:
        return iter(())

    # --- the settings resolved ------------------------------------------------------------------

    @property
    def actions_topic(self) -> str:
        assert self.topic is not None  # required: the validation says so
        return self.topic

    @property
    def read_topics(self) -> tuple[str, ...]:
        """The topics this command reads: the actions topic and, with one, the commits topic (the
        one named or the default pair's: a topic written to must be neither)."""
        commits = self.commits_topic_name
        return (self.actions_topic,) if commits is None else (self.actions_topic, commits)

    @property
    def commits_topic_name(self) -> str | None:
        """The commits topic read too (None: none): the one named, or the watcher's default pair."""
        if self.commits_topic is None:
            return None
        return self.commits_topic.strip() or default_commits_topic(self.actions_topic.strip())

    @property
    def checkpoint_every_versions(self) -> int | None:
        """Save after this many applied versions (None: not on a count)."""
        value = self.checkpoint_interval_versions
        return (CHECKPOINT_VERSIONS if value is None else value) or None

    @property
    def checkpoint_every_s(self) -> float | None:
        """Save this long after the first change since the last save (None: not on time)."""
        value = self.checkpoint_interval_s
        return (CHECKPOINT_S if value is None else value) or None

    @property
    def items(self) -> int:
        """The longest list of paths or partitions in a document."""
        return MAX_ITEMS if self.max_items is None else self.max_items


class SnapshotSettings(SourceSettings):
    """``deltamirror consume-snapshot``: :class:`SourceSettings` and what it prints."""

    format: Literal["counts", "jsonl"] = "counts"

    def _max_items_problems(self, say: Callable[[str], str]) -> Iterator[str]:
        if self.max_items is not None and self.format == "counts":
            yield (
                f"{say('max_items')} goes with {say('format')} jsonl: {say('format')} counts prints "
                "counts, not lists"
            )


class InvalidateSettings(SourceSettings):
    """``deltamirror invalidate``: :class:`SourceSettings`, the target and its retries."""

    exec: str | None = None
    webhook: str | None = None
    #: ``NAME: VALUE`` each (the flag's form), secret (an Authorization header); :attr:`header_map`
    #: has them parsed and revealed, for the webhook
    headers: list[SecretStr] = Field(default_factory=list)
    dead_letter_topic: str | None = None
    max_attempts: int = MAX_ATTEMPTS
    backoff: float | None = None
    max_backoff: float | None = None
    timeout: float = TIMEOUT_S

    @model_validator(mode="after")
    def _invalidate_rules(self, info: ValidationInfo) -> InvalidateSettings:
        for problem in self._invalidate_problems(lambda field: spelled(info, field)):
            raise Refused(problem)
        return self

    def _invalidate_problems(self, say: Callable[[str], str]) -> Iterator[str]:
        if (self.exec is None) == (self.webhook is None):
            if self.exec is None:
                yield f"one of the arguments {say('exec')} {say('webhook')} is required"
            else:
                yield f"{say('exec')} and {say('webhook')}: give one target, not both"
        if self.headers and self.webhook is None:
            yield f"{say('headers')} goes with {say('webhook')}"
        if not (self.timeout > 0 and math.isfinite(self.timeout)):
            yield f"{say('timeout')} must be more than 0 s"
        if self.max_attempts < 0:
            yield f"{say('max_attempts')} must be 0 (no limit) or more"
        for field in ("backoff", "max_backoff"):
            value = getattr(self, field)
            if value is None:
                continue
            if not _finite_at_least_0(value):
                yield f"{say(field)} must be 0 s or more"
            if self.max_attempts == 1:
                yield f"{say(field)} goes with a {say('max_attempts')} above 1: with 1 nothing is retried"
        if self.max_backoff_s < self.backoff_s:
            yield (
                f"{say('max_backoff')} {self.max_backoff_s:g} is less than {say('backoff')} "
                f"{self.backoff_s:g}: the first wait would be cut to it"
            )
        if self.dead_letter_topic is not None:
            problem = topic_name_problem(self.dead_letter_topic)
            if problem is not None:
                yield f"{say('dead_letter_topic')}: {problem}"
            if self.max_attempts == 0:
                yield (
                    f"{say('dead_letter_topic')} goes with a {say('max_attempts')} above 0: with 0 a "
                    "version is retried until it is delivered, never given up"
                )
            if self.dead_letter_topic in self.read_topics:  # the commits topic named or derived
                yield f"{say('dead_letter_topic')} {self.dead_letter_topic} is a topic this command reads"
        for position, secret in enumerate(self.headers, start=1):
            name, sep, _ = secret.get_secret_value().partition(":")
            if not sep or not name.strip() or any(c.isspace() for c in name.strip()):
                # the text may be a bare token: named by its position, never echoed
                yield f"{say('headers')} #{position} is not 'NAME: VALUE'"

    @property
    def backoff_s(self) -> float:
        return BACKOFF_S if self.backoff is None else self.backoff

    @property
    def max_backoff_s(self) -> float:
        return MAX_BACKOFF_S if self.max_backoff is None else self.max_backoff

    @property
    def header_map(self) -> dict[str, str]:
        """The ``headers`` as a mapping (valid: the validation said so)."""
        out: dict[str, str] = {}
        for secret in self.headers:
            name, _, value = secret.get_secret_value().partition(":")
            out[name.strip()] = value.strip()
        return out


__all__ = [
    "BACKOFF_S",
    "CHECKPOINT_S",
    "CHECKPOINT_VERSIONS",
    "MAX_ATTEMPTS",
    "MAX_BACKOFF_S",
    "MAX_ITEMS",
    "TIMEOUT_S",
    "ConsumerSection",
    "ConsumerSettings",
    "InvalidateSettings",
    "SnapshotSettings",
    "SourceSettings",
    "file_section",
]
