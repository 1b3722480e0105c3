"""The watcher's settings: one validated, immutable object built from a YAML/TOML file and/or CLI flags.

Why pydantic: the file is user input, so every key is checked at load time with an error that names
the file and the key path (``tables[1].from_version``), instead of a KeyError deep in the watcher.
Unknown keys are refused, since a typo such as ``snapshotmode`` must not silently fall back to a
default.

Secrets: every password or credential is a ``SecretStr``, so ``repr()`` and ``str()`` show
``**********`` and :func:`redacted` ``***``. Storage options and librdkafka pass-through options whose
key names a secret (:func:`deltamirror.core.redact.is_secret_key`: ``key``, ``secret``, ``token``,
``password``, ``sas``, ``credential``...) are wrapped into ``SecretStr`` on validation even when
written as plain strings. Values are revealed in exactly two places, the ones that hand them to a
client: :meth:`KafkaSettings.librdkafka_config` and :meth:`TableConfig.storage_options_plain`.
Credentials inside other values (``endpoint_url: http://user:pass@host``, a table URI with userinfo)
are masked by :func:`redacted` and by every log line and error message (core/redact.py);
``bootstrap_servers`` refuses them outright (``host:port[,host:port]`` only).

Errors never echo a value of the file (it may be a secret): they name the file, the key path or the
line, and what is wrong.

Environment variables: any string value in a config *file* may contain ``${VAR}`` (the variable
must be set) or ``${VAR:-default}`` (default when unset or empty); ``$${`` is a literal ``${``.
Interpolation is done once, on the file's values only: keys are never interpolated, and CLI flags
are taken as given (the shell already expanded them).

Relative local paths in a file (table URIs, ``ssl_*_location``) are resolved against the file's
directory, so a config means the same thing whatever the working directory of the watcher.
"""

from __future__ import annotations

import difflib
import os
import re
import tomllib
import urllib.parse
from collections.abc import Mapping, Sequence
from datetime import date, datetime, time
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from deltamirror.core.errors import ConfigError, DeltaMirrorError
from deltamirror.core.kafka_connection import bootstrap_servers_problem
from deltamirror.core.redact import MASK, is_secret_key, redact_value
from deltamirror.core.storage import normalize_table_uri
from deltamirror.core.timestamps import parse_timestamp

SnapshotMode = Literal["initial", "latest", "from-version", "from-timestamp", "when-needed"]
OversizePolicy = Literal["split", "fail"]
# fsspec backends take typed options (s3fs: ``anon: false``; ``client_kwargs: {endpoint_url: ...}``):
# a bool turned into the string "false" would be truthy there, so scalars and nested maps keep their type.
StorageOptionValue = str | SecretStr | bool | int | float | dict[str, Any]

MiB = 1024 * 1024

_TOPIC_NAME = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
_SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
_SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "GSSAPI", "OAUTHBEARER")
_SASL_NEEDS_PASSWORD = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")

# librdkafka properties with a typed field: set them there, not twice.
_TYPED_KAFKA_KEYS = {
    "bootstrap.servers": "bootstrap_servers",
    "metadata.broker.list": "bootstrap_servers",
    "security.protocol": "security_protocol",
    "sasl.mechanism": "sasl_mechanism",
    "sasl.mechanisms": "sasl_mechanism",
    "sasl.username": "sasl_username",
    "sasl.password": "sasl_password",
    "ssl.ca.location": "ssl_ca_location",
    "ssl.certificate.location": "ssl_certificate_location",
    "ssl.key.location": "ssl_key_location",
    "ssl.key.password": "ssl_key_password",
}
# The watcher sets these itself: exactly-once depends on them (fencing, idempotence, resume reads).
RESERVED_KAFKA_KEYS = frozenset({"transactional.id", "enable.idempotence", "isolation.level"})


class _FieldProblem(ValueError):
    """A cross-field rule broken by one field: lets the error name ``tables[0].from_version``."""

    def __init__(self, field: str | tuple[int | str, ...], message: str) -> None:
        self.loc: tuple[int | str, ...] = (field,) if isinstance(field, str) else field
        self.problem = message
        super().__init__(f"{_key_path(self.loc)}: {message}")


def _wrap_secrets(value: Any) -> Any:
    """Turn plain strings under secret-looking keys (at any depth) into SecretStr."""
    if not isinstance(value, Mapping):
        return value
    out: dict[Any, Any] = {}
    for key, item in value.items():
        if isinstance(item, Mapping):
            out[key] = _wrap_secrets(item)
        elif isinstance(item, str) and is_secret_key(key):
            out[key] = SecretStr(item)
        else:
            out[key] = item
    return out


def _reveal(value: Any) -> Any:
    if isinstance(value, SecretStr):
        return value.get_secret_value()
    if isinstance(value, Mapping):
        return {k: _reveal(v) for k, v in value.items()}
    return value


def _for_log(value: Any, key: object = None) -> Any:
    """Plain data with every secret masked: SecretStr, secret-named keys, URL userinfo."""
    if isinstance(value, SecretStr):
        return MASK
    if isinstance(value, Mapping) and not (key is not None and is_secret_key(key)):
        return {k: _for_log(v, k) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_for_log(v) for v in value]
    return redact_value(value, key)


def _check_topic(name: str | None) -> str | None:
    if name is not None and (not _TOPIC_NAME.match(name) or name in (".", "..")):
        raise ValueError("invalid Kafka topic name: 1 to 249 characters among letters, digits, '.', '_', '-'")
    return name


class _Settings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)


class KafkaSettings(_Settings):
    """How to reach the brokers; everything else librdkafka accepts goes in ``extra``."""

    bootstrap_servers: str = Field(min_length=1)
    security_protocol: str | None = None
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    ssl_ca_location: str | None = None
    ssl_certificate_location: str | None = None
    ssl_key_location: str | None = None
    ssl_key_password: SecretStr | None = None
    extra: dict[str, str | SecretStr] = Field(default_factory=dict)

    @field_validator("bootstrap_servers")
    @classmethod
    def _broker_list(cls, value: str) -> str:
        """host:port[,host:port]: no credentials, no scheme; the value is never quoted back."""
        problem = bootstrap_servers_problem(value)
        if problem is not None:
            raise ValueError(f"{problem}; expected host:port[,host:port...]")
        return ",".join(entry.strip() for entry in value.split(","))

    @field_validator("security_protocol", "sasl_mechanism")
    @classmethod
    def _known_name(cls, value: str | None, info: ValidationInfo) -> str | None:
        """librdkafka names, case-insensitive in the file, upper-case on the wire."""
        if value is None:
            return None
        known = _SECURITY_PROTOCOLS if info.field_name == "security_protocol" else _SASL_MECHANISMS
        if value.upper() not in known:
            raise ValueError(f"must be one of {', '.join(known)}")
        return value.upper()

    @field_validator("extra", mode="before")
    @classmethod
    def _librdkafka_strings(cls, value: Any) -> Any:
        """librdkafka takes every property as a string; YAML/TOML give bools and numbers."""
        if not isinstance(value, Mapping):
            return value
        out: dict[Any, Any] = {}
        for key, item in value.items():
            if isinstance(item, bool):
                item = "true" if item else "false"
            elif isinstance(item, int | float):
                item = str(item)
            out[key] = item
        return _wrap_secrets(out)

    @field_validator("extra")
    @classmethod
    def _no_duplicate_or_reserved_keys(cls, value: dict[str, str | SecretStr]) -> dict[str, str | SecretStr]:
        for key in value:
            if key in _TYPED_KAFKA_KEYS:
                raise _FieldProblem(key, f"set it with kafka.{_TYPED_KAFKA_KEYS[key]} instead")
            if key in RESERVED_KAFKA_KEYS:
                raise _FieldProblem(key, "the watcher sets this property itself (exactly-once delivery)")
        return value

    @model_validator(mode="after")
    def _consistent_security(self) -> KafkaSettings:
        protocol = self.security_protocol or "PLAINTEXT"
        sasl_given = [
            name
            for name in ("sasl_mechanism", "sasl_username", "sasl_password")
            if getattr(self, name) is not None
        ]
        if sasl_given and not protocol.startswith("SASL_"):
            raise _FieldProblem(
                sasl_given[0],
                f"SASL settings need security_protocol SASL_SSL or SASL_PLAINTEXT (it is {protocol})",
            )
        if protocol.startswith("SASL_"):
            mechanism = self.sasl_mechanism or "GSSAPI"  # librdkafka's default
            if mechanism in _SASL_NEEDS_PASSWORD:
                for name in ("sasl_username", "sasl_password"):
                    if getattr(self, name) is None:
                        raise _FieldProblem(name, f"required with sasl_mechanism {mechanism}")
        return self

    def librdkafka_config(self) -> dict[str, str]:
        """The client configuration, secrets revealed: pass it to a client, never to a log."""
        config = {"bootstrap.servers": self.bootstrap_servers}
        typed = {
            "security.protocol": self.security_protocol,
            "sasl.mechanism": self.sasl_mechanism,
            "sasl.username": self.sasl_username,
            "sasl.password": self.sasl_password,
            "ssl.ca.location": self.ssl_ca_location,
            "ssl.certificate.location": self.ssl_certificate_location,
            "ssl.key.location": self.ssl_key_location,
            "ssl.key.password": self.ssl_key_password,
        }
        for key, value in typed.items():
            if value is not None:
                config[key] = _reveal(value)
        for key, value in self.extra.items():
            config[key] = _reveal(value)
        return config


class TableConfig(_Settings):
    """One table to mirror: where it is, how to reach it, where to start and where to publish."""

    uri: str = Field(min_length=1)
    storage_options: dict[str, StorageOptionValue] = Field(default_factory=dict)
    snapshot_mode: SnapshotMode = "initial"
    from_version: int | None = Field(default=None, ge=0)
    from_timestamp: str | None = None
    actions_topic: str | None = None
    commits_topic: str | None = None
    poll_interval_s: float = Field(default=1.0, gt=0)
    #: locations outside the table root its log may name (a shallow clone's source); see open_table
    allowed_path_prefixes: list[str] = Field(default_factory=list)

    @field_validator("uri")
    @classmethod
    def _known_location(cls, value: str) -> str:
        try:
            normalize_table_uri(value)
        except DeltaMirrorError as exc:
            raise ValueError(exc.message) from None
        return value

    @field_validator("storage_options", mode="before")
    @classmethod
    def _secret_options(cls, value: Any) -> Any:
        return _wrap_secrets(value)

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

    @field_validator("actions_topic", "commits_topic")
    @classmethod
    def _topic(cls, value: str | None) -> str | None:
        return _check_topic(value)

    @model_validator(mode="after")
    def _start_matches_mode(self) -> TableConfig:
        for field, mode in (("from_version", "from-version"), ("from_timestamp", "from-timestamp")):
            given = getattr(self, field) is not None
            if self.snapshot_mode == mode and not given:
                raise _FieldProblem(field, f"required when snapshot_mode is {mode!r}")
            if given and self.snapshot_mode != mode:
                raise _FieldProblem(
                    field, f"only allowed with snapshot_mode {mode!r} (it is {self.snapshot_mode!r})"
                )
        if self.actions_topic is not None and self.actions_topic == self.commits_topic:
            raise _FieldProblem("commits_topic", "must differ from actions_topic")
        return self

    @property
    def normalized_uri(self) -> str:
        """The table's identity (progress keys, duplicate detection): see ``normalize_table_uri``."""
        return normalize_table_uri(self.uri)

    @property
    def from_timestamp_ms(self) -> int | None:
        return None if self.from_timestamp is None else parse_timestamp(self.from_timestamp)

    def storage_options_plain(self) -> dict[str, Any]:
        """fsspec options with secrets revealed: pass them to fsspec, never to a log."""
        revealed: dict[str, Any] = _reveal(self.storage_options)
        return revealed


class WatchConfig(_Settings):
    """Everything ``deltamirror watch`` needs.

    ``oversize_policy`` says what happens to a record whose value is larger than
    ``max_record_bytes`` (a huge ``schemaString`` or ``stats``); nothing is ever dropped:

    - ``split``: the record is published as consecutive fragment records with the same key, in the
      same transaction, whose headers say which fragment of how many they are;
      ``deltamirror.core.events.FragmentAssembler`` joins them again.
    - ``fail``: the table stops with an error naming the version and the action index, and resumes
      once the limit (here and on the broker) is raised.
    """

    kafka: KafkaSettings
    tables: list[TableConfig] = Field(min_length=1)
    progress_topic: str = "deltamirror.progress"
    transactional_id_prefix: str = Field(default="deltamirror", min_length=1, pattern=r"^\S+$")
    txn_max_records: int = Field(default=50_000, gt=0)
    txn_max_bytes: int = Field(default=64 * MiB, gt=0)
    txn_max_ms: int = Field(default=1000, gt=0)
    heartbeat_interval_s: float | None = Field(default=None, gt=0)
    metrics_host: str = Field(default="127.0.0.1", min_length=1)
    metrics_port: int | None = Field(default=None, ge=0, le=65535)
    max_record_bytes: int = Field(default=1_000_000, ge=1024)
    oversize_policy: OversizePolicy = "split"
    use_notifications: bool = True

    @field_validator("tables", mode="before")
    @classmethod
    def _uri_shorthand(cls, value: Any) -> Any:
        """``tables: [/data/a, {uri: s3://b/t, ...}]``: a bare string is a table with defaults."""
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
                raise _FieldProblem((i, "uri"), f"same table as tables[{seen[uri]}] ({uri})")
            seen[uri] = i
        return tables

    @field_validator("progress_topic")
    @classmethod
    def _progress_topic(cls, value: str) -> str:
        checked = _check_topic(value)
        assert checked is not None
        return checked

    @model_validator(mode="after")
    def _topics_and_limits(self) -> WatchConfig:
        for table in self.tables:
            if self.progress_topic in (table.actions_topic, table.commits_topic):
                raise _FieldProblem(
                    "progress_topic", f"must differ from the event topics of {table.uri} (it is compacted)"
                )
        broker_limit = self.kafka.extra.get("message.max.bytes")
        if (
            isinstance(broker_limit, str)
            and broker_limit.isdigit()
            and self.max_record_bytes > int(broker_limit)
        ):
            raise _FieldProblem(
                "max_record_bytes", f"larger than kafka.extra.message.max.bytes ({broker_limit})"
            )
        return self


# --- errors -----------------------------------------------------------------------------------


def _key_path(loc: Sequence[int | str]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", part):
            out += f".{part}" if out else part
        else:
            out += f'["{part}"]'
    return out or "(top level)"


def _field_names_at(loc: Sequence[int | str]) -> list[str]:
    """The keys the model accepts at ``loc``, to suggest a fix for a typo."""
    model: type[BaseModel] | None = WatchConfig
    for part in loc:
        if isinstance(part, int) or model is None:
            continue
        field = model.model_fields.get(part)
        if field is None:
            return []
        annotation = field.annotation
        inner = getattr(annotation, "__args__", (annotation,))
        model = next((t for t in inner if isinstance(t, type) and issubclass(t, BaseModel)), None)
    return list(model.model_fields) if model is not None else []


def _describe(error: Mapping[str, Any]) -> str:
    loc = list(error["loc"])
    ctx = error.get("ctx") or {}
    cause = ctx.get("error")
    if isinstance(cause, _FieldProblem):
        return f"{_key_path([*loc, *cause.loc])}: {cause.problem}"
    message = str(error["msg"]).removeprefix("Value error, ")
    if error["type"] == "extra_forbidden" and loc:
        message = "unknown key"
        close = difflib.get_close_matches(str(loc[-1]), _field_names_at(loc[:-1]), n=1)
        if close:
            message += f" (did you mean {close[0]!r}?)"
    elif error["type"] == "missing":
        message = "required key is missing"
    return f"{_key_path(loc)}: {message}"


def _config_error(exc: ValidationError, source: str | None) -> ConfigError:
    """One line with every problem; never the offending values (they may be secrets)."""
    problems = [_describe(e) for e in exc.errors(include_input=False, include_url=False)]
    message = f"invalid configuration: {'; '.join(problems)}"
    return ConfigError(message, file=source)


# --- files ------------------------------------------------------------------------------------


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML keeps the last of two equal keys; in a config file that hides a mistake."""


class _DuplicateKeyError(yaml.constructor.ConstructorError):
    """A key given twice: the message names the key (a name, never a value)."""


def _mapping_without_duplicates(loader: _UniqueKeyLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        if key in seen:
            raise _DuplicateKeyError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_without_duplicates)


def _parse_file(path: Path) -> Any:
    suffix = path.suffix.lower()
    if suffix not in (".yaml", ".yml", ".toml"):
        raise ConfigError("unknown configuration format: use a .yaml, .yml or .toml file", file=str(path))
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError("configuration file not found", file=str(path)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read configuration file: {exc}", file=str(path)) from None
    if suffix == ".toml":
        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"invalid TOML: {_without_values(str(exc))}", file=str(path)) from None
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader subclass: no arbitrary objects
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or "cannot parse"
        if not isinstance(exc, _DuplicateKeyError):
            problem = _without_values(problem)
        where = {"line": mark.line + 1, "column": mark.column + 1} if mark is not None else {}
        raise ConfigError(f"invalid YAML: {problem}", file=str(path), **where) from None


_QUOTED = re.compile(r"'[^'\n]*'|\"[^\"\n]*\"")


def _without_values(problem: str) -> str:
    """A parser's message without the text it quotes from the file (it may be part of a secret).

    What is left names the problem; the line and column say where. A quoted single character
    (``'\\t'``, ``']'``) and a token name (``'<stream end>'``) stay: they are the useful part.
    """

    def keep_short(match: re.Match[str]) -> str:
        inner = match.group(0)[1:-1]
        if len(inner) <= 2 or (inner.startswith("<") and inner.endswith(">")):
            return match.group(0)
        return "(text of the file)"

    return " ".join(_QUOTED.sub(keep_short, problem).split())


_ENV_REF = re.compile(r"\$\$\{|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}|\$\{")


def _interpolate_text(text: str, key: str, source: str, environ: Mapping[str, str]) -> str:
    def substitute(match: re.Match[str]) -> str:
        whole = match.group(0)
        if whole == "$${":
            return "${"
        name, default = match.group(1), match.group(2)
        if name is None:
            raise ConfigError(
                f"{key}: malformed ${{...}}: write ${{VAR}}, ${{VAR:-default}} or $${{ for a literal",
                file=source,
            )
        value = environ.get(name)
        if default is not None and not value:
            return default
        if value is None:
            raise ConfigError(f"{key}: environment variable {name} is not set", file=source)
        return value

    return _ENV_REF.sub(substitute, text)


def _interpolate(value: Any, loc: list[int | str], source: str, environ: Mapping[str, str]) -> Any:
    if isinstance(value, str):
        return _interpolate_text(value, _key_path(loc), source, environ) if "$" in value else value
    if isinstance(value, Mapping):
        return {k: _interpolate(v, [*loc, k], source, environ) for k, v in value.items()}
    if isinstance(value, list):
        return [_interpolate(v, [*loc, i], source, environ) for i, v in enumerate(value)]
    return value


def _is_relative_local_path(text: str) -> bool:
    if text.startswith("~") or os.path.isabs(text):
        return False
    return urllib.parse.urlparse(text).scheme == ""


def _resolve_relative_paths(data: dict[str, Any], base: Path) -> None:
    def resolve(owner: Any, key: str) -> None:
        value = owner.get(key) if isinstance(owner, dict) else None
        if isinstance(value, str) and value and _is_relative_local_path(value):
            owner[key] = str(base / value)

    kafka = data.get("kafka")
    for key in ("ssl_ca_location", "ssl_certificate_location", "ssl_key_location"):
        resolve(kafka, key)
    tables = data.get("tables")
    if isinstance(tables, list):
        for i, table in enumerate(tables):
            if isinstance(table, str) and _is_relative_local_path(table):
                tables[i] = str(base / table)
            else:
                resolve(table, "uri")


def load_config(path: str | Path, environ: Mapping[str, str] | None = None) -> WatchConfig:
    """Read a ``.yaml``/``.yml``/``.toml`` file into a validated :class:`WatchConfig`.

    ``environ`` defaults to ``os.environ`` (for ``${VAR}``). Every problem is a ConfigError whose
    one-line message names the file and the key path.
    """
    path = Path(path)
    source = str(path)
    raw = _parse_file(path)
    if not isinstance(raw, dict):
        raise ConfigError("the configuration must be a mapping of keys to values", file=source)
    data = _interpolate(raw, [], source, os.environ if environ is None else environ)
    _resolve_relative_paths(data, path.resolve().parent)
    try:
        return WatchConfig.model_validate(data)
    except ValidationError as exc:
        raise _config_error(exc, source) from None


# --- command line -----------------------------------------------------------------------------

_TOP_LEVEL_FLAGS = (
    "progress_topic",
    "transactional_id_prefix",
    "txn_max_records",
    "txn_max_bytes",
    "txn_max_ms",
    "heartbeat_interval_s",
    "metrics_host",
    "metrics_port",
    "max_record_bytes",
    "oversize_policy",
    "use_notifications",
)


def _apply_overrides(data: dict[str, Any], flags: Mapping[str, Any]) -> dict[str, Any]:
    """Flags set (not None) win over the data, following the rules in :func:`merge_cli_overrides`."""
    flags = {k: v for k, v in flags.items() if v is not None}
    if "bootstrap_servers" in flags:
        data["kafka"] = {**data.get("kafka", {}), "bootstrap_servers": flags["bootstrap_servers"]}
    tables: list[dict[str, Any]] = [dict(t) for t in data.get("tables", [])]
    known = {normalize_table_uri(t["uri"]) for t in tables}
    for uri in flags.get("tables", []):
        try:
            normalized = normalize_table_uri(uri)
        except DeltaMirrorError as exc:
            raise ConfigError(f"invalid table location: {exc.message}", table=uri) from None
        if normalized not in known:
            tables.append({"uri": uri})
            known.add(normalized)
    mode = flags.get("snapshot_mode")
    if mode is None and "from_version" in flags:
        mode = "from-version"
    if mode is None and "from_timestamp" in flags:
        mode = "from-timestamp"
    for table in tables:
        if mode is not None:
            table["snapshot_mode"] = mode
            table["from_version"] = flags.get("from_version")
            table["from_timestamp"] = flags.get("from_timestamp")
        if "storage_options" in flags:
            table["storage_options"] = {**table.get("storage_options", {}), **flags["storage_options"]}
        if "poll_interval_s" in flags:
            table["poll_interval_s"] = flags["poll_interval_s"]
    data["tables"] = tables
    for name in _TOP_LEVEL_FLAGS:
        if name in flags:
            data[name] = flags[name]
    return data


def _validated(data: dict[str, Any], source: str) -> WatchConfig:
    try:
        return WatchConfig.model_validate(data)
    except ValidationError as exc:
        raise _config_error(exc, source) from None


def merge_cli_overrides(
    cfg: WatchConfig,
    *,
    bootstrap_servers: str | None = None,
    tables: Sequence[str] | None = None,
    snapshot_mode: str | None = None,
    from_version: int | None = None,
    from_timestamp: str | None = None,
    storage_options: Mapping[str, str] | None = None,
    poll_interval_s: float | None = None,
    progress_topic: str | None = None,
    transactional_id_prefix: str | None = None,
    txn_max_records: int | None = None,
    txn_max_bytes: int | None = None,
    txn_max_ms: int | None = None,
    heartbeat_interval_s: float | None = None,
    metrics_host: str | None = None,
    metrics_port: int | None = None,
    max_record_bytes: int | None = None,
    oversize_policy: str | None = None,
    use_notifications: bool | None = None,
) -> WatchConfig:
    """``cfg`` (from a file) with the command-line flags that were given (not None) on top.

    - ``tables`` are added after the file's tables; one already in the file (same normalized URI)
      keeps its file settings.
    - ``snapshot_mode`` / ``from_version`` / ``from_timestamp`` apply to every table and replace the
      file's start settings; ``--from-version`` alone implies ``from-version`` (same for timestamps).
    - ``storage_options`` are merged into every table's options, the flag winning per key;
      ``poll_interval_s`` applies to every table.
    - every other flag replaces the top-level setting of the same name.

    The result is validated again; a bad combination raises ConfigError.
    """
    flags = {
        "bootstrap_servers": bootstrap_servers,
        "tables": list(tables) if tables else None,
        "snapshot_mode": snapshot_mode,
        "from_version": from_version,
        "from_timestamp": from_timestamp,
        "storage_options": dict(storage_options) if storage_options else None,
        "poll_interval_s": poll_interval_s,
        "progress_topic": progress_topic,
        "transactional_id_prefix": transactional_id_prefix,
        "txn_max_records": txn_max_records,
        "txn_max_bytes": txn_max_bytes,
        "txn_max_ms": txn_max_ms,
        "heartbeat_interval_s": heartbeat_interval_s,
        "metrics_host": metrics_host,
        "metrics_port": metrics_port,
        "max_record_bytes": max_record_bytes,
        "oversize_policy": oversize_policy,
        "use_notifications": use_notifications,
    }
    # python mode keeps SecretStr objects as they are, so secrets survive the round trip unrevealed
    data = _apply_overrides(cfg.model_dump(), flags)
    return _validated(data, "command line")


def config_from_args(
    bootstrap_servers: str,
    tables: Sequence[str],
    snapshot_mode: str | None = None,
    *,
    from_version: int | None = None,
    from_timestamp: str | None = None,
    storage_options: Mapping[str, str] | None = None,
    poll_interval_s: float | None = None,
    progress_topic: str | None = None,
    transactional_id_prefix: str | None = None,
    heartbeat_interval_s: float | None = None,
    metrics_host: str | None = None,
    metrics_port: int | None = None,
    use_notifications: bool | None = None,
) -> WatchConfig:
    """A WatchConfig from command-line flags alone (no file): one table entry per location."""
    if not tables:
        raise ConfigError("no table to watch: name at least one TABLE or give --config FILE")
    flags = {
        "bootstrap_servers": bootstrap_servers,
        "tables": list(tables),
        "snapshot_mode": snapshot_mode,
        "from_version": from_version,
        "from_timestamp": from_timestamp,
        "storage_options": dict(storage_options) if storage_options else None,
        "poll_interval_s": poll_interval_s,
        "progress_topic": progress_topic,
        "transactional_id_prefix": transactional_id_prefix,
        "heartbeat_interval_s": heartbeat_interval_s,
        "metrics_host": metrics_host,
        "metrics_port": metrics_port,
        "use_notifications": use_notifications,
    }
    return _validated(_apply_overrides({"kafka": {}, "tables": []}, flags), "command line")


# --- logs -------------------------------------------------------------------------------------


def redacted(cfg: WatchConfig) -> dict[str, Any]:
    """The configuration as plain data for logs: no secret, however it was written.

    SecretStr values, values under secret-named keys (at any depth, whatever their type) and the
    userinfo of URLs in any string (a table URI, ``client_kwargs.endpoint_url``) become ``***``.
    """
    data: dict[str, Any] = _for_log(cfg.model_dump())
    return data


__all__: list[str] = [
    "RESERVED_KAFKA_KEYS",
    "KafkaSettings",
    "OversizePolicy",
    "SnapshotMode",
    "TableConfig",
    "WatchConfig",
    "config_from_args",
    "load_config",
    "merge_cli_overrides",
    "redacted",
]
