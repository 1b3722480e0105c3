"""What ``deltamirror watch`` does, as one validated, immutable model: the config file's format.

The configuration file (:mod:`.config_file`), the command line's flags and a library caller all
build the same :class:`WatchConfig`; the field names and aliases here *are* the file's keys.
Unknown keys are refused, since a typo such as ``snapshotmode`` must not silently fall back to a
default. Flags (or a caller's overrides) go over a configuration through one function,
:func:`merge_overrides`, by the rules it states.

Secrets: storage options whose key names a secret (:func:`deltamirror.core.redact.is_secret_key`:
``key``, ``secret``, ``token``, ``password``, ``sas``, ``credential``...) are wrapped into
``SecretStr`` on validation even when written as plain strings, and revealed only by
:meth:`TableConfig.storage_options_plain`, for fsspec; the Kafka settings are
:class:`deltamirror.mirror.settings.KafkaSettings`, shared with every consumer command.
"""

from __future__ import annotations

import contextlib
import fnmatch
from collections.abc import Iterable, Mapping
from datetime import date, datetime, time
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    AfterValidator,
    Field,
    PrivateAttr,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from deltamirror.core.errors import ConfigError, DeltaMirrorError
from deltamirror.core.storage import local_options_problem, normalize_table_uri
from deltamirror.core.timestamps import parse_timestamp
from deltamirror.mirror.records.fragments import OversizePolicy
from deltamirror.mirror.settings import (
    FieldProblem,
    KafkaSettings,
    SettingsModel,
    reveal,
    settings_error,
    wrap_secrets,
)
from deltamirror.mirror.topic_names import (
    NAME_PATTERN,
    PREFIX_NAME_PATTERN,
    PROGRESS_TOPIC,
    SIGNAL_TOPIC,
    TableTopics,
    checked_topic_name,
    default_topics,
    shared_topics,
)

#: where a table without published progress starts: named once here (the watcher takes it; the
#: CLI spells it out so that --help imports no pydantic, and a test holds the two equal)
SnapshotMode = Literal["initial", "latest", "from-version", "from-timestamp", "when-needed"]
SNAPSHOT_MODES: tuple[str, ...] = get_args(SnapshotMode)
# fsspec backends take typed options (s3fs: ``anon: false``; ``client_kwargs: {endpoint_url: ...}``):
# a bool turned into the string "false" would be truthy there, so scalars and nested maps keep their type.
StorageOptionValue = str | SecretStr | bool | int | float | dict[str, Any]

MiB = 1024 * 1024


def _known_location(value: str) -> str:
    """A location deltamirror can normalize (a table's or a discover prefix's), refused in one
    line at load otherwise."""
    try:
        normalize_table_uri(value)
    except DeltaMirrorError as exc:
        raise ValueError(exc.message) from None
    return value


#: a table or discover location, checked where it enters
Location = Annotated[str, AfterValidator(_known_location)]


#: a shorter HMAC key is guessable: the mask would hide nothing
MIN_MASK_KEY_CHARS = 16
#: the comparisons a row predicate may make
PredicateOp = Literal["=", "!=", "<", "<=", ">", ">=", "in", "not in", "is null", "is not null"]


class RowPredicate(SettingsModel):
    """``column op value``: ``in`` and ``not in`` take a list, ``is null`` and ``is not null`` none;
    the value is read as the column's type (dates and timestamps as ISO-8601 text)."""

    column: str
    op: PredicateOp
    value: Any = None

    @model_validator(mode="after")
    def _value_fits_op(self) -> RowPredicate:
        if self.op in ("is null", "is not null"):
            if self.value is not None:
                raise ValueError(f"{self.op!r} takes no value")
        elif self.op in ("in", "not in"):
            if not isinstance(self.value, list) or not self.value:
                raise ValueError(f"{self.op!r} takes a non-empty list of values")
        elif self.value is None or isinstance(self.value, list | dict):
            raise ValueError(f"{self.op!r} takes one value (for null, use 'is null')")
        return self


#: ``deltamirror.mirror.records.row_formats.SubjectNameStrategy``, spelled out (no pyarrow import here)
SubjectNameStrategyName = Literal["topic", "record", "topic-record"]


class SchemaRegistryConfig(SettingsModel):
    """The Schema Registry of a registry-backed row-change format (``row_changes.format: avro`` or ``protobuf``).

    ``url``: the registry's base URL (Confluent's API; Apicurio's ``/apis/ccompat/v7``).
    ``username`` / ``password``: HTTP basic auth (the password a secret: redacted everywhere, handed
    to the registry client only). ``subject_name_strategy``: ``topic`` (``<topic>-key`` /
    ``<topic>-value``), ``record`` (the record's full name) or ``topic-record``.
    ``auto_register``: register the schemas records need (off: they must be registered already).
    """

    url: str = Field(min_length=1)
    username: str | None = None
    password: SecretStr | None = None
    subject_name_strategy: SubjectNameStrategyName = "topic"
    auto_register: bool = True

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL")
        if "@" in value.split("//", 1)[1].split("/", 1)[0]:
            raise ValueError("must not hold credentials: give username and password")
        return value

    @model_validator(mode="after")
    def _password_with_user(self) -> SchemaRegistryConfig:
        if self.password is not None and self.username is None:
            raise ValueError("password is given without username")
        return self


#: the row-change formats that need a Schema Registry
REGISTRY_FORMATS = ("avro", "protobuf")


class RowChangesConfig(SettingsModel):
    """Row-level change events of a table (``deltamirror.mirror.records.row_changes`` has the format).

    ``key_columns``: the row's key (Delta has no primary key); none: on a table with row tracking
    the row id (``{"_row_id": n}``, updates paired by it), else the whole row, and updates are
    published as a delete and an insert. ``tombstones``: a null-value record after each
    delete, for a compacted changes topic. ``pairing_memory_mb``: what pairing a version's update
    images by key may hold in memory; beyond it they spill to temporary files (the system's
    temporary directory, ``TMPDIR``). ``net_catch_up``: with snapshot mode ``from-version`` or
    ``from-timestamp``, the versions from the start to the table's version when the watcher starts
    go out as their net row changes (one event per row), all in one transaction with their actions.
    """

    enabled: bool = True
    key_columns: list[str] = Field(default_factory=list)
    #: ``deltamirror.mirror.records.row_formats.RowChangesFormat``, spelled out: no pyarrow import here
    format: Literal["json", "json-schema", "avro", "protobuf"] = "json"
    #: the Schema Registry of format ``avro`` or ``protobuf`` (required by them, refused with another)
    registry: SchemaRegistryConfig | None = None
    tombstones: bool = False
    pairing_memory_mb: int = Field(default=256, ge=1)
    #: the columns the events carry (None: all), in the table's order; filters may name others
    columns: list[str] | None = None
    #: per column: ``drop`` (left out of the events) or ``hmac`` (its value replaced by the hex
    #: HMAC-SHA256 of its text under ``mask_key``; null stays null)
    mask: dict[str, Literal["drop", "hmac"]] = Field(default_factory=dict)
    #: the HMAC's key (at least 16 characters); required by a ``hmac`` mask, refused without one
    mask_key: SecretStr | None = None
    #: rows kept: those for which every predicate holds (a null compares as false)
    where: list[RowPredicate] = Field(default_factory=list)
    #: a fresh start from a version or timestamp publishes the range up to the table's current
    #: version as net row changes, then every later version as usual
    net_catch_up: bool = False

    @model_validator(mode="after")
    def _transform_problems(self) -> RowChangesConfig:
        if self.format in REGISTRY_FORMATS and self.registry is None:
            raise ValueError(
                f"format {self.format} needs a Schema Registry: give registry: {{url: ...}} (--schema-registry-url)"
            )
        if self.registry is not None and self.format not in REGISTRY_FORMATS:
            raise ValueError(f"registry is given but format {self.format} uses none")
        if self.net_catch_up and not self.enabled:
            raise ValueError("net_catch_up is set but row changes are not enabled")
        hashed = sorted(c for c, how in self.mask.items() if how == "hmac")
        if hashed and self.mask_key is None:
            raise ValueError(f"mask_key is required by the hmac mask of {', '.join(hashed)}")
        if self.mask_key is not None and not hashed:
            raise ValueError("mask_key is given but no column has an hmac mask")
        if self.mask_key is not None and len(self.mask_key.get_secret_value()) < MIN_MASK_KEY_CHARS:
            raise ValueError(f"mask_key must have at least {MIN_MASK_KEY_CHARS} characters")
        published = set(self.columns) if self.columns is not None else None
        for column in self.key_columns:
            if published is not None and column not in published:
                raise ValueError(f"key column {column!r} is not among columns: the key must be published")
            if self.mask.get(column) == "drop":
                raise ValueError(f"key column {column!r} has the mask drop: the key must be published")
        if self.columns is not None and len(set(self.columns)) != len(self.columns):
            raise ValueError("columns names a column twice")
        return self


def _start_problem(snapshot_mode: str, given: Mapping[str, Any]) -> FieldProblem | None:
    """``from_version`` / ``from_timestamp`` given exactly when the snapshot mode needs them."""
    for field, mode in (("from_version", "from-version"), ("from_timestamp", "from-timestamp")):
        if field not in given:
            continue
        present = given[field] is not None
        if snapshot_mode == mode and not present:
            return FieldProblem(field, f"required when snapshot_mode is {mode!r}")
        if present and snapshot_mode != mode:
            return FieldProblem(field, f"only allowed with snapshot_mode {mode!r} (it is {snapshot_mode!r})")
    return None


#: the snapshot modes a net catch-up applies to: those that start at a version of the log
NET_CATCH_UP_MODES = ("from-version", "from-timestamp")


def _net_catch_up_problem(snapshot_mode: str, row_changes: RowChangesConfig | None) -> FieldProblem | None:
    """``row_changes.net_catch_up`` with a snapshot mode that publishes no range of versions."""
    if row_changes is None or not row_changes.net_catch_up or snapshot_mode in NET_CATCH_UP_MODES:
        return None
    return FieldProblem(
        "row_changes",
        f"net_catch_up applies to snapshot_mode from-version or from-timestamp (it is {snapshot_mode!r}: "
        "no range of versions to net)",
    )


#: ``poll_interval_s`` when it is not set, for a table that polls (an object store, a log no file
#: notification watches)
POLL_INTERVAL_S = 1.0
#: ``poll_interval_s`` when it is not set, for a table whose ``_delta_log`` file notifications watch on a
#: local disk: a new commit wakes it at once, so its poll only bounds a notification lost, and each poll
#: of 10,000 idle tables a second cost most of a core (docs/scale-out.md)
NOTIFIED_POLL_INTERVAL_S = 30.0
#: a table due within this long is taken now by the pool, by a worker looking for one anyway: a
#: timed wait for each table due (and a worker woken to wait for the next one) cost two thread
#: wake-ups per idle turn; tables due close together (10,000 tables polled every 30 s: 3 ms
#: apart) are taken one after the other instead. An idle turn may so come this much early, and the
#: duties due at a turn (log checks, heartbeats, liveness) allow for it
DUE_EARLY_S = 0.05


class PerTableSettings(SettingsModel):
    """The settings of one table that a discover prefix also takes, for every table it finds.

    A setting added here is carried to discovered tables by :func:`.discovery.discovered_config`
    without a list to keep in step; one that only a configured table can take goes on
    :class:`TableConfig` and in :data:`TABLE_ONLY` with the reason a prefix refuses it.
    """

    storage_options: dict[str, StorageOptionValue] = Field(default_factory=dict)
    from_timestamp: str | None = None
    #: row-level change events; None (or ``enabled: false``): none are published
    row_changes: RowChangesConfig | None = None
    #: seconds between two looks at the log for the next version; None (not set): :data:`POLL_INTERVAL_S`,
    #: or :data:`NOTIFIED_POLL_INTERVAL_S` while file notifications watch the table's log on a local
    #: disk (a commit wakes the table at once; the poll only bounds a lost notification)
    poll_interval_s: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    #: locations outside the table root its log may name (a shallow clone's source); see open_table
    allowed_path_prefixes: list[str] = Field(default_factory=list)
    #: action events without the ``stats`` and ``tags`` of add and remove actions (per-column
    #: min/max values can reveal what row events mask); they still name every file
    drop_file_stats: bool = False

    @field_validator("storage_options", mode="before")
    @classmethod
    def _secret_options(cls, value: Any) -> Any:
        return wrap_secrets(value)

    @field_validator("from_timestamp", mode="before")
    @classmethod
    def _timestamp_text(cls, value: Any) -> Any:
        # YAML and TOML parse unquoted timestamps into datetime objects; keep the text form
        if isinstance(value, datetime | date | time):
            return value.isoformat()
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)  # epoch milliseconds
        return value

    @field_validator("from_timestamp")
    @classmethod
    def _parsable_timestamp(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                parse_timestamp(value)
            except DeltaMirrorError:
                raise ValueError(
                    "not a timestamp: expected ISO-8601 such as 2026-01-01T00:00:05.500Z"
                ) from None
        return value

    def _local_options_problem(self, uri: str) -> FieldProblem | None:
        """Storage options on a local location: refused, since nothing would take them."""
        problem = local_options_problem(normalize_table_uri(uri), self.storage_options)
        return None if problem is None else FieldProblem("storage_options", problem)

    @property
    def row_changes_on(self) -> bool:
        return self.row_changes is not None and self.row_changes.enabled

    def storage_options_plain(self) -> dict[str, Any]:
        """fsspec options with secrets revealed: pass them to fsspec, never to a log."""
        revealed: dict[str, Any] = reveal(self.storage_options)
        return revealed


def poll_interval(settings: PerTableSettings, *, notified: bool) -> float:
    """The seconds an idle table waits between looks at its log: ``poll_interval_s`` when set, else
    :data:`NOTIFIED_POLL_INTERVAL_S` while file notifications watch its log on a local disk
    (``notified``), else :data:`POLL_INTERVAL_S`."""
    if settings.poll_interval_s is not None:
        return settings.poll_interval_s
    return NOTIFIED_POLL_INTERVAL_S if notified else POLL_INTERVAL_S


class TableConfig(PerTableSettings):
    """One table to mirror: where it is, how to reach it, where to start and where to publish."""

    uri: Location = Field(min_length=1)
    snapshot_mode: SnapshotMode = "initial"
    from_version: int | None = Field(default=None, ge=0)
    actions_topic: str | None = None
    commits_topic: str | None = None
    changes_topic: str | None = None
    transaction_topic: str | None = None
    #: the ``<name>`` of the default topic names (default: the table's directory name)
    topic_name: str | None = Field(default=None, pattern=NAME_PATTERN)
    #: a deleted table (no commit or checkpoint left in its log): ``wait`` retries until it is back,
    #: ``drop`` publishes ``tableDropped`` and stops mirroring it (what discovered tables do)
    when_deleted: Literal["wait", "drop"] = "wait"
    #: a location that holds no table yet is waited for; otherwise ``watch`` refuses it at start
    wait_for_table: bool = False

    #: the table's identity, normalized once where the location enters (see ``normalized_uri``)
    _normalized_uri: str = PrivateAttr(default="")

    def model_post_init(self, context: Any, /) -> None:
        self._normalized_uri = normalize_table_uri(self.uri)  # valid: the field validator said so

    @field_validator("actions_topic", "commits_topic", "changes_topic", "transaction_topic")
    @classmethod
    def _topic(cls, value: str | None) -> str | None:
        return checked_topic_name(value)

    @model_validator(mode="after")
    def _start_matches_mode(self) -> TableConfig:
        problem = _start_problem(
            self.snapshot_mode, {"from_version": self.from_version, "from_timestamp": self.from_timestamp}
        ) or self._local_options_problem(self.uri)
        problem = problem or _net_catch_up_problem(self.snapshot_mode, self.row_changes)
        if problem is not None:
            raise problem
        if self.actions_topic is not None and self.actions_topic == self.commits_topic:
            raise FieldProblem("commits_topic", "must differ from actions_topic")
        named = [
            t
            for t in (self.actions_topic, self.commits_topic, self.changes_topic, self.transaction_topic)
            if t
        ]
        if len(set(named)) != len(named):
            raise FieldProblem(
                "changes_topic", "the actions, commits, changes and transaction topics must differ"
            )
        if not self.row_changes_on:
            for key in ("changes_topic", "transaction_topic"):
                if getattr(self, key) is not None:
                    raise FieldProblem(
                        key,
                        "is given but the table publishes no row changes: give row_changes: (or --row-changes), "
                        f"or leave {key} out",
                    )
        return self

    @property
    def normalized_uri(self) -> str:
        """The table's identity (progress keys, transactional id, topic names, duplicate detection).

        Normalized once, when the settings are made (``normalize_table_uri``: no password, one
        spelling of a location); everything downstream takes this form as it is.
        """
        # read from pydantic's private dict itself: ``self._normalized_uri`` goes through the model's
        # ``__getattr__`` (an AttributeError raised and caught inside), some µs a call, and tables
        # ask this at every turn and hand-off
        uri: str = self.__pydantic_private__["_normalized_uri"]  # type: ignore[index]
        return uri

    def topics(self) -> TableTopics:
        """The one source of the table's topic names: each configured one, else its default."""

        default = default_topics(self.normalized_uri, name=self.topic_name)
        return TableTopics(
            self.actions_topic or default.actions,
            self.commits_topic or default.commits,
            self.changes_topic or default.changes,
            self.transaction_topic or default.transaction,
        )

    @property
    def from_timestamp_ms(self) -> int | None:
        return None if self.from_timestamp is None else parse_timestamp(self.from_timestamp)


#: the settings of a configured table that a discover prefix refuses, and why (each other setting of
#: :class:`TableConfig` but ``uri`` a prefix takes for its tables: :class:`PerTableSettings`, plus
#: ``snapshot_mode``)
TABLE_ONLY: dict[str, str] = {
    "from_version": "a version number names a point in one table's log, not in every table found "
    "under a prefix: use snapshot_mode from-timestamp (from_timestamp), or configure the table "
    "under tables",
    "actions_topic": "the tables found under a prefix each get their own topics (named by their "
    "path), or all the prefix's two shared ones (topics: shared): configure the table under tables "
    "to choose its topics",
    "commits_topic": "see actions_topic",
    "changes_topic": "see actions_topic",
    "transaction_topic": "see actions_topic",
    "topic_name": "a discovered table's topic name is its path below the prefix; give the prefix a "
    "name to put before it",
    "when_deleted": "a discovered table that is deleted is always announced dropped",
    "wait_for_table": "discovery mirrors a table once it exists",
}


def matches_path(relative: str, globs: Iterable[str]) -> bool:
    """``relative`` or one of its parent folders matches one of ``globs`` (``fnmatch``)."""
    parts = relative.split("/")
    paths = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    return any(fnmatch.fnmatchcase(p, g) for g in globs for p in paths)


class DiscoverConfig(PerTableSettings):
    """A prefix under which every Delta table is mirrored (:mod:`.discovery.scan`).

    ``include`` / ``exclude`` are ``fnmatch`` globs over the path relative to ``uri`` (``*`` also
    crosses ``/``); a table is excluded when its path or one of its parent folders matches an
    exclude glob, and, with ``include`` given, kept only when its path or a parent matches one.
    ``name`` goes before the relative path in default topic names (prefixes whose tables share
    relative paths need one each). The per-table settings (:class:`PerTableSettings`, and
    ``snapshot_mode``) apply to every table found; the others (:data:`TABLE_ONLY`) are refused.
    """

    uri: Location = Field(min_length=1)
    include: list[str] = Field(default_factory=list)
    exclude: list[str] = Field(default_factory=list)
    interval_s: float = Field(default=60.0, gt=0, allow_inf_nan=False)
    max_depth: int = Field(default=6, ge=1, le=64)
    name: str | None = Field(default=None, pattern=PREFIX_NAME_PATTERN)
    snapshot_mode: Literal["initial", "latest", "when-needed", "from-timestamp"] = "initial"
    #: ``per-table``: each table found gets topics of its own, named by its path; ``shared``: every
    #: table found publishes to the prefix's two topics (:meth:`shared_topics`), keyed by ``tableId``
    #: as always, so a broker holds two topics for the prefix however many tables it has
    topics: Literal["per-table", "shared"] = "per-table"

    @model_validator(mode="before")
    @classmethod
    def _no_table_only_settings(cls, data: Any) -> Any:
        if isinstance(data, Mapping):
            for key in data:
                if key in TABLE_ONLY:
                    raise FieldProblem(str(key), f"not a setting of a discover prefix: {TABLE_ONLY[key]}")
            if data.get("snapshot_mode") == "from-version":
                raise FieldProblem("snapshot_mode", f"from-version: {TABLE_ONLY['from_version']}")
        return data

    @model_validator(mode="after")
    def _start_matches_mode(self) -> DiscoverConfig:
        problem = _start_problem(
            self.snapshot_mode, {"from_timestamp": self.from_timestamp}
        ) or self._local_options_problem(self.uri)
        problem = problem or _net_catch_up_problem(self.snapshot_mode, self.row_changes)
        if problem is not None:
            raise problem
        if self.topics == "shared" and self.row_changes_on:
            raise FieldProblem(
                "topics",
                "shared cannot take row_changes: a changes topic is never shared (its records are keyed "
                "by the row alone, so the tables' rows would mix); use topics: per-table for tables "
                "with row changes",
            )
        return self

    @property
    def normalized_uri(self) -> str:
        return normalize_table_uri(self.uri)

    def leaves_out(self, relative: str) -> bool:
        """Whether the scan never looks into the folder at ``relative`` (a path under ``uri``): it,
        or a parent folder, matches an exclude glob, or it lies deeper than ``max_depth``."""
        return matches_path(relative, self.exclude) or relative.count("/") + 1 > self.max_depth

    def shared_topics(self) -> TableTopics | None:
        """The actions and commits topics of every table found (``topics: shared``), else None."""
        if self.topics != "shared":
            return None
        return shared_topics(self.normalized_uri, self.name)


class GroupSettings(SettingsModel):
    """``watch --group NAME``: the tables are shared by every watcher of the group (docs/scale-out.md).

    ``shards`` is the number of partitions of the assignment topic ``deltamirror.<name>.shards``
    (every member must use the same); ``session_timeout_ms`` is how long a silent member keeps its
    tables before the group moves them (they resume elsewhere within about this + 10 s).
    """

    name: str = Field(pattern=NAME_PATTERN)
    shards: int = Field(default=64, ge=1, le=10_000)
    session_timeout_ms: int = Field(default=10_000, ge=1000, le=3_600_000)


class WatchConfig(SettingsModel):
    """Everything ``deltamirror watch`` needs.

    ``oversize_policy`` says what happens to a record whose value is larger than
    ``max_record_bytes`` (a huge ``schemaString`` or ``stats``); nothing is ever dropped:

    - ``split``: the record is published as fragment records with the same key, in order and in
      the same transaction, whose headers say which fragment of how many they are;
      ``deltamirror.mirror.records.fragments.KeyedFragments`` joins them again per partition and
      key (on a shared topic, ``topics: shared``, another table's records may come between them).
    - ``fail``: the table stops with an error naming the version and the action index, and resumes
      once the limit (here and on the broker) is raised.
    """

    kafka: KafkaSettings
    tables: list[TableConfig] = Field(default_factory=list)
    #: prefixes whose Delta tables are found and mirrored as they come and go (:mod:`.discovery.scan`)
    discover: list[DiscoverConfig] = Field(default_factory=list)
    progress_topic: str = PROGRESS_TOPIC
    transactional_id_prefix: str = Field(default="deltamirror", min_length=1, pattern=r"^\S+$")
    txn_max_records: int = Field(default=50_000, gt=0)
    txn_max_bytes: int = Field(default=64 * MiB, gt=0)
    txn_max_ms: int = Field(default=1000, gt=0)
    heartbeat_interval_s: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    #: the metrics server's address (None: 127.0.0.1); only with ``metrics_port`` (refused alone)
    metrics_host: str | None = Field(default=None, min_length=1)
    metrics_port: int | None = Field(default=None, ge=0, le=65535)
    max_record_bytes: int = Field(default=1_000_000, ge=1024)
    oversize_policy: OversizePolicy = "split"
    use_notifications: bool = True
    #: where operators' signals (``deltamirror signal snapshot TABLE``) are read from; None: none
    signal_topic: str | None = SIGNAL_TOPIC
    #: share the tables with every watcher of this group (None: run every table here)
    group: GroupSettings | None = None
    #: one status line (info) every this many seconds: what was published, what is behind
    status_interval_s: float = Field(default=60.0, gt=0, allow_inf_nan=False)
    #: a broker that has not answered for this long makes /healthz unhealthy (and says so once)
    broker_timeout_s: float = Field(default=30.0, gt=0, allow_inf_nan=False)
    #: the threads that serve every table (:mod:`.scheduler`); None: 4 per CPU this process may use, at least 4
    workers: int | None = Field(default=None, ge=1, le=1024)

    @field_validator("group", mode="before")
    @classmethod
    def _group_shorthand(cls, value: Any) -> Any:
        """``group: NAME`` (and ``--group NAME``) is a group with the default settings."""
        return {"name": value} if isinstance(value, str) else value

    @field_validator("tables", mode="before")
    @classmethod
    def _uri_shorthand(cls, value: Any) -> Any:
        """``tables: [/data/a, {uri: s3://b/t, ...}]``: a bare string is a table with defaults."""
        if isinstance(value, list | tuple):
            return [{"uri": item} if isinstance(item, str) else item for item in value]
        return value

    @field_validator("discover", mode="before")
    @classmethod
    def _discover_shorthand(cls, value: Any) -> Any:
        """``discover: [s3://lake/, {uri: ..., include: [...]}]``: a bare string is a prefix with defaults."""
        if isinstance(value, list | tuple):
            return [{"uri": item} if isinstance(item, str) else item for item in value]
        return value

    @field_validator("tables")
    @classmethod
    def _distinct_tables(cls, tables: list[TableConfig]) -> list[TableConfig]:
        seen: dict[str, int] = {}
        for i, table in enumerate(tables):
            uri = table.normalized_uri
            if uri in seen:
                raise FieldProblem((i, "uri"), f"same table as tables[{seen[uri]}] ({uri})")
            seen[uri] = i
        return tables

    @field_validator("signal_topic")
    @classmethod
    def _signal_topic(cls, value: str | None) -> str | None:
        return checked_topic_name(value)

    @field_validator("progress_topic")
    @classmethod
    def _progress_topic(cls, value: str) -> str:
        checked = checked_topic_name(value)
        assert checked is not None
        return checked

    @model_validator(mode="after")
    def _topics_and_limits(self) -> WatchConfig:
        if not self.tables and not self.discover:
            raise FieldProblem("tables", "name at least one table, or a prefix under discover")
        if self.metrics_host is not None and self.metrics_port is None:
            raise FieldProblem(
                "metrics_host",
                "goes with metrics_port (--metrics-port): without a port no metrics server is started",
            )
        if self.signal_topic is not None and self.signal_topic == self.progress_topic:
            raise FieldProblem("signal_topic", "must differ from progress_topic")
        for table in self.tables:
            if self.progress_topic in (
                table.actions_topic,
                table.commits_topic,
                table.changes_topic,
                table.transaction_topic,
            ):
                raise FieldProblem(
                    "progress_topic", f"must differ from the event topics of {table.uri} (it is compacted)"
                )
        self._check_shared_topics()
        self._check_nested_prefixes()
        broker_limit = self.kafka.extra.get("message.max.bytes")
        if (
            isinstance(broker_limit, str)
            and broker_limit.isdigit()
            and self.max_record_bytes > int(broker_limit)
        ):
            raise FieldProblem(
                "max_record_bytes", f"larger than kafka.extra.message.max.bytes ({broker_limit})"
            )
        return self

    def shared_topic_owners(self) -> dict[str, str]:
        """Each shared topic (``topics: shared``) -> the normalized location of its discover prefix."""
        owners: dict[str, str] = {}
        for source in self.discover:
            shared = source.shared_topics()
            if shared is not None:
                owners |= dict.fromkeys((shared.actions, shared.commits), source.normalized_uri)
        return owners

    def _check_nested_prefixes(self) -> None:
        """No discover prefix inside another (or the same twice) unless the outer one leaves the
        inner one's folder out (exclude, max_depth): a table under both would be found by the first
        alone, with its settings only, and the other's said nothing."""
        for j, source in enumerate(self.discover):
            uri = source.normalized_uri.rstrip("/")
            for i, outer in enumerate(self.discover[:j]):
                other = outer.normalized_uri.rstrip("/")
                if uri == other:
                    problem = f"is the same prefix as discover[{i}] ({outer.uri})"
                elif uri.startswith(other + "/") and not outer.leaves_out(uri[len(other) + 1 :]):
                    problem = f"lies inside discover[{i}] ({outer.uri})"
                elif other.startswith(uri + "/") and not source.leaves_out(other[len(uri) + 1 :]):
                    problem = f"holds discover[{i}] ({outer.uri})"
                else:
                    continue
                raise FieldProblem(
                    ("discover", j, "uri"),
                    f"{source.uri} {problem}: a table under both would take one prefix's settings "
                    "only; exclude the inner prefix's folder from the outer one (exclude), or keep one "
                    "prefix and configure the tables that need other settings under tables (a "
                    "configured table keeps its own)",
                )

    def _check_shared_topics(self) -> None:
        """A prefix's shared topics are its own: no other prefix, no configured table and not the
        progress or signal topic may name them."""
        seen: dict[str, int] = {}
        for i, source in enumerate(self.discover):
            shared = source.shared_topics()
            if shared is None:
                continue
            for name in (shared.actions, shared.commits):
                if name in seen:
                    raise FieldProblem(
                        f"discover.{i}.name",
                        f"the shared topic {name} is also discover prefix {seen[name]}'s: give the "
                        "prefixes different names",
                    )
                seen[name] = i
                if name in (self.progress_topic, self.signal_topic):
                    raise FieldProblem(f"discover.{i}.name", f"the shared topic {name} is a watcher topic")
        for table in self.tables:
            topics = table.topics()
            published = {topics.actions, topics.commits}
            if table.row_changes_on:
                published |= {topics.changes, topics.transaction}
            taken = sorted(set(seen) & published)
            if taken:
                raise FieldProblem(
                    "tables",
                    f"{table.uri} would publish to {taken[0]}, the shared topic of discover prefix "
                    f"{seen[taken[0]]}: name its topics, or give the prefix a name",
                )


def check_topic_name(value: Any, key: str, source: str | None = None) -> str | None:
    """A topic named outside a :class:`WatchConfig` (a consumer command's flag, or a file's
    ``signal_topic`` read alone by ``deltamirror signal``), checked as WatchConfig checks its topics;
    ``key`` names it in the error, ``source`` the file it comes from. None stays None."""
    if value is None:
        return None
    try:
        if not isinstance(value, str):
            raise ValueError("must be a topic name or null")
        return checked_topic_name(value)
    except ValueError as exc:
        prefix = "invalid configuration: " if source is not None else ""
        raise ConfigError(f"{prefix}{key}: {exc}", file=source) from None


def validate_watch_config(
    data: Mapping[str, Any], source: str | None, *, names: Mapping[str, str] | None = None
) -> WatchConfig:
    """``data`` as a WatchConfig; a ConfigError naming ``source`` and every bad key otherwise (a
    top-level key the user gave otherwise, by flag or variable, named as ``names`` spells it)."""
    try:
        return WatchConfig.model_validate(data)
    except ValidationError as exc:
        raise settings_error(exc, WatchConfig, source=source, names=_top_level_names(names)) from None


def _top_level_names(names: Mapping[str, str] | None) -> dict[str, str] | None:
    """The names of the overrides that set a top-level setting of the same name (the per-table
    ones land in each table, where a problem is named by its key path)."""
    out = {k: v for k, v in (names or {}).items() if k not in TABLE_OVERRIDES and k != "bootstrap_servers"}
    return out or None


# --- overrides: the command line's flags, or a caller's ----------------------------------------------

#: overrides given once for every table: each table's own setting is replaced (storage options: merged)
TABLE_OVERRIDES = (
    "snapshot_mode",
    "from_version",
    "from_timestamp",
    "storage_options",
    "poll_interval_s",
    "row_changes",
    "row_format",
    "schema_registry_url",
    "subject_name_strategy",
    "net_catch_up",
    "wait_for_table",
)
#: the overrides that set a field of ``row_changes`` (and of its ``registry``): the table must have row changes
ROW_CHANGES_OVERRIDES = {
    "row_format": ("format",),
    "schema_registry_url": ("registry", "url"),
    "subject_name_strategy": ("registry", "subject_name_strategy"),
}
#: every name :func:`merge_overrides` accepts: the broker list, tables to add, the per-table
#: settings above, and every top-level setting of WatchConfig
OVERRIDES = frozenset(
    {"bootstrap_servers", "tables", *TABLE_OVERRIDES, *(set(WatchConfig.model_fields) - {"kafka", "tables"})}
)
#: the command line's spelling of an override, for the one line that refuses a combination
FLAG_NAMES = {
    "from_version": "--from-version",
    "wait_for_table": "--wait-for-table",
    "discover": "--discover",
    "net_catch_up": "--net-catch-up",
    "row_format": "--row-format",
    "schema_registry_url": "--schema-registry-url",
    "subject_name_strategy": "--subject-name-strategy",
}


def _entries(value: Any) -> Any:
    """A file's ``tables`` / ``discover`` list as mappings (a bare string is ``{uri: ...}``); any
    other shape is left for the validation to name."""
    if value is None:
        return []
    if not isinstance(value, list | tuple):
        return value
    return [{"uri": e} if isinstance(e, str) else dict(e) if isinstance(e, Mapping) else e for e in value]


def _add_locations(entries: Any, uris: Iterable[str], what: str) -> Any:
    """Copies of ``entries``, then each of ``uris`` not already there by normalized URI (the file's
    entry keeps its settings)."""
    out = _entries(entries)
    if not isinstance(out, list):
        return out  # not a list: the validation says so
    known: set[str] = set()
    for entry in out:
        uri = entry.get("uri") if isinstance(entry, Mapping) else None
        if isinstance(uri, str):
            with contextlib.suppress(DeltaMirrorError):  # the validation names it
                known.add(normalize_table_uri(uri))
    for uri in uris:
        try:
            normalized = normalize_table_uri(uri)
        except DeltaMirrorError as exc:
            raise ConfigError(f"invalid {what} location: {exc.message}", table=uri) from None
        if normalized not in known:
            out.append({"uri": uri})
            known.add(normalized)
    return out


def _flag(name: str, names: Mapping[str, str]) -> str:
    """An override as the user gave it (``names``: a flag or a ``DELTAMIRROR_*`` variable), else as
    the command line spells it."""
    flag = names.get(name) or FLAG_NAMES.get(name)
    return f"{name} ({flag})" if flag else name


def _apply_per_table(
    entry: dict[str, Any], given: Mapping[str, Any], mode: str | None, fields: Any, names: Mapping[str, str]
) -> None:
    """The per-table overrides given, on one table or one discover prefix (``fields``: its model's)."""
    if mode is not None:
        entry["snapshot_mode"] = mode
        for field, needed_by in (("from_version", "from-version"), ("from_timestamp", "from-timestamp")):
            if field not in fields:
                continue
            if field in given:
                entry[field] = given[field]
            elif mode != needed_by or entry.get(field) is None:
                # the entry's own start point stays when the mode given is the one that takes it
                entry[field] = None
    if "storage_options" in given:
        own = entry.get("storage_options")
        entry["storage_options"] = {**(own if isinstance(own, Mapping) else {}), **given["storage_options"]}
    if "poll_interval_s" in given:
        entry["poll_interval_s"] = given["poll_interval_s"]
    if given.get("row_changes"):  # on for every table, each keeping its own key and format
        own = entry.get("row_changes")
        entry["row_changes"] = {**(dict(own) if isinstance(own, Mapping) else {}), "enabled": True}
    elif given.get("row_changes") is False:  # off for every table, whatever the file says
        entry["row_changes"] = None
    for name, path in ROW_CHANGES_OVERRIDES.items():  # a field of the row changes each table has
        if given.get(name) is None:
            continue
        own = entry.get("row_changes")
        if not isinstance(own, Mapping) or not own.get("enabled", True):
            what = "discover prefix" if "include" in fields else "table"
            raise ConfigError(
                f"{_flag(name, names)} sets the row changes' {'.'.join(path)}, and the {what} {entry.get('uri')} "
                "publishes none: give --row-changes too (or row_changes: in the configuration)"
            )
        changed = dict(own)
        if len(path) == 1:
            changed[path[0]] = given[name]
        else:
            inner = changed.get(path[0])
            changed[path[0]] = {**(dict(inner) if isinstance(inner, Mapping) else {}), path[1]: given[name]}
        entry["row_changes"] = changed
    if given.get("net_catch_up") is False:  # off on every table, whatever the file says
        own = entry.get("row_changes")
        if isinstance(own, Mapping) and "net_catch_up" in own:
            entry["row_changes"] = {**own, "net_catch_up": False}
    if given.get("net_catch_up"):  # on the row changes each table has (none: refused by the caller)
        own = entry.get("row_changes")
        if isinstance(own, Mapping) and own.get("enabled", True):
            entry["row_changes"] = {**own, "net_catch_up": True}
        else:
            what = "discover prefix" if "include" in fields else "table"
            raise ConfigError(
                f"{_flag('net_catch_up', names)} nets the row changes of a catch-up, and the {what} "
                f"{entry.get('uri')} publishes none: give --row-changes too (or row_changes: in the "
                "configuration)"
            )
    if "wait_for_table" in given and "wait_for_table" in fields:
        entry["wait_for_table"] = given["wait_for_table"]


def _refuse_what_discovery_cannot_take(
    given: Mapping[str, Any], mode: str | None, data: Mapping[str, Any], names: Mapping[str, str]
) -> None:
    """A per-table override that would not reach the tables discovery finds is refused, in one line."""
    prefixes = data.get("discover")
    if not prefixes:
        return
    if mode == "from-version":
        raise ConfigError(
            f"{_flag('from_version', names)} cannot apply to the tables found under discover prefixes "
            f"({FLAG_NAMES['discover']}): {TABLE_ONLY['from_version']}"
        )
    if given.get("wait_for_table") and not data.get("tables"):
        raise ConfigError(
            f"{_flag('wait_for_table', names)} applies to the tables named (TABLE or tables:), and none is: "
            f"{TABLE_ONLY['wait_for_table']} ({FLAG_NAMES['discover']})"
        )


def merge_overrides(
    cfg: WatchConfig | Mapping[str, Any] | None,
    overrides: Mapping[str, Any],
    *,
    source: str | None = None,
    names: Mapping[str, str] | None = None,
) -> WatchConfig:
    """``cfg`` (a file's settings, validated or not; None: nothing) with the ``overrides`` given on top.

    ``cfg`` may be the raw content of a configuration file (:func:`.config_file.load_config_data`):
    the file and the overrides are merged first and validated once, so a file may leave out what
    the overrides give (its ``kafka`` section, its tables). ``source`` names the file in errors;
    ``names`` how the user gave each override (``--metrics-host``, ``DELTAMIRROR_METRICS_HOST``):
    a refusal or a problem with one names it so (by default, an override is named by its flag).

    An override that is None (or an empty ``tables`` / ``storage_options``) was not given and
    leaves the file's setting, or the default. Given ones:

    - ``bootstrap_servers`` replaces ``kafka.bootstrap_servers`` (the other Kafka settings stay);
    - ``tables`` are added after the file's tables; one already in the file (same normalized URI)
      keeps its file settings;
    - ``snapshot_mode`` / ``from_version`` / ``from_timestamp`` apply to every table and replace the
      file's start settings; ``from_version`` alone implies ``from-version`` (same for timestamps);
      ``snapshot_mode`` alone keeps a table's own ``from_version`` (``from_timestamp``) when the
      mode is the one that takes it;
    - ``storage_options`` are merged into every table's options, the override winning per key;
      ``poll_interval_s`` applies to every table; ``row_changes`` (True) turns row-level change
      events on for every table (each keeping its own key columns and format); ``wait_for_table``
      (True) waits for every named table that does not exist yet; ``net_catch_up`` (True) sets
      ``row_changes.net_catch_up`` on every table and prefix (one without row changes is refused);
      False (a ``DELTAMIRROR_*`` variable set to false) turns each off on every table and prefix,
      whatever the file says (``row_changes`` False: no row changes anywhere);
      ``row_format``, ``schema_registry_url`` and ``subject_name_strategy`` set ``row_changes.format``,
      ``row_changes.registry.url`` and ``.subject_name_strategy`` likewise (refused the same way);
    - ``discover`` URIs are added after the file's prefixes (one already there keeps its settings);
      every per-table override a prefix takes applies to every prefix as to every table (so to the
      tables it finds). One it cannot take is refused: ``from_version`` (a version number names a
      point in one table's log), and ``wait_for_table`` when no table is named;
    - every other name (see :data:`OVERRIDES`) replaces the top-level setting of the same name.

    Without ``cfg``, ``tables`` or ``discover`` must name at least one location. The result is validated again as a
    whole; a bad combination raises ConfigError. An unknown name is a TypeError (a caller's bug).
    """
    given = {
        key: value
        for key, value in overrides.items()
        if value is not None and not (key in ("tables", "storage_options", "discover") and not value)
    }
    unknown = sorted(set(given) - OVERRIDES)
    if unknown:
        raise TypeError(f"unknown override: {', '.join(unknown)}")
    spelled_as = {key: name for key, name in (names or {}).items() if key in given}
    if cfg is None:
        if not given.get("tables") and not given.get("discover"):
            raise ConfigError("no table to watch: name at least one TABLE, --discover URI or --config FILE")
        data: dict[str, Any] = {"kafka": {}, "tables": [], "discover": []}
    elif isinstance(cfg, WatchConfig):
        data = cfg.model_dump()  # python mode keeps SecretStr objects: secrets stay unrevealed
    else:
        data = dict(cfg)
    if "bootstrap_servers" in given:
        kafka = data.get("kafka")
        data["kafka"] = {
            **(kafka if isinstance(kafka, Mapping) else {}),
            "bootstrap_servers": given["bootstrap_servers"],
        }
    mode = given.get("snapshot_mode")
    if mode is None and "from_version" in given:
        mode = "from-version"
    if mode is None and "from_timestamp" in given:
        mode = "from-timestamp"
    for key, what, model in (("tables", "table", TableConfig), ("discover", "discover", DiscoverConfig)):
        entries = _add_locations(data.get(key), given.get(key, ()), what)
        if isinstance(entries, list):
            for entry in entries:
                if isinstance(entry, dict):
                    _apply_per_table(entry, given, mode, model.model_fields, spelled_as)
        data[key] = entries
    _refuse_what_discovery_cannot_take(given, mode, data, spelled_as)
    for key, value in given.items():
        if key not in TABLE_OVERRIDES and key not in ("bootstrap_servers", "tables", "discover"):
            data[key] = value
    if isinstance(given.get("group"), str) and cfg is not None:
        own = cfg.group.model_dump() if isinstance(cfg, WatchConfig) and cfg.group is not None else None
        if not isinstance(cfg, WatchConfig):
            raw = cfg.get("group")
            own = dict(raw) if isinstance(raw, Mapping) else None
        if own is not None:
            data["group"] = {**own, "name": given["group"]}  # keeps the file's settings
    return validate_watch_config(data, source or "command line", names=spelled_as)


__all__ = [
    "FLAG_NAMES",
    "NOTIFIED_POLL_INTERVAL_S",
    "OVERRIDES",
    "POLL_INTERVAL_S",
    "SNAPSHOT_MODES",
    "TABLE_ONLY",
    "TABLE_OVERRIDES",
    "DiscoverConfig",
    "GroupSettings",
    "KafkaSettings",
    "OversizePolicy",
    "PerTableSettings",
    "SnapshotMode",
    "StorageOptionValue",
    "TableConfig",
    "WatchConfig",
    "merge_overrides",
    "poll_interval",
    "validate_watch_config",
]
