"""The watcher's configuration file: YAML or TOML in, a validated :class:`WatchConfig` out.

Errors never echo a value of the file (it may be a secret): they name the file, the key path or the
line, and what is wrong. A key given twice in a YAML mapping is an error (PyYAML would keep the last
one silently).

Environment variables: any string value in a config *file* may contain ``${VAR}`` (the variable
must be set) or ``${VAR:-default}`` (default when unset or empty); ``$${`` is a literal ``${``.
Interpolation is done once, on the file's values only: keys are never interpolated, and CLI flags
are taken as given (the shell already expanded them).

Relative local paths in a file (table URIs, ``ssl_*_location``, the ``consumer:`` section's
allowed locations and prefixes) are resolved against the file's
directory, so a config means the same thing whatever the working directory of the watcher.

Logs: :func:`redacted` gives the configuration as plain data with every secret ``***``: SecretStr
values, values under secret-named keys, and the userinfo of URLs in any string (core/redact.py).
"""

from __future__ import annotations

import os
import re
import tomllib
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from deltamirror.core.errors import ConfigError
from deltamirror.mirror.settings import (
    SSL_FILE_FIELDS,
    KafkaSettings,
    for_log,
    key_path,
    validate_kafka_section,
)

from .settings import WatchConfig, check_topic_name, validate_watch_config


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
        return _interpolate_text(value, key_path(loc), source, environ) if "$" in value else value
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
    for key in SSL_FILE_FIELDS:
        resolve(kafka, key)
    consumer = data.get("consumer")
    if isinstance(consumer, dict):  # the consumer commands' section
        for key in ("allow_table_locations", "allow_path_prefixes"):
            entries = consumer.get(key)
            if isinstance(entries, list):
                consumer[key] = [
                    str(base / e) if isinstance(e, str) and e and _is_relative_local_path(e) else e
                    for e in entries
                ]
    for key in ("tables", "discover"):
        entries = data.get(key)
        if isinstance(entries, list):
            for i, entry in enumerate(entries):
                if isinstance(entry, str) and _is_relative_local_path(entry):
                    entries[i] = str(base / entry)
                else:
                    resolve(entry, "uri")


def _read_mapping(path: Path) -> dict[str, Any]:
    raw = _parse_file(path)
    if not isinstance(raw, dict):
        raise ConfigError("the configuration must be a mapping of keys to values", file=str(path))
    return raw


@dataclass(frozen=True)
class ConfigFile:
    """A configuration file parsed once, each section read from it as the commands read it:
    ``${VAR}`` interpolated (from ``environ``) and relative local paths resolved against the file's
    folder, section by section (a section no command asks for is never interpolated: a variable it
    names need not be set). The consumer commands ask for three things of one file: its keys, its
    ``kafka:`` and its ``consumer:`` section; ``signal`` for two or three."""

    path: Path
    raw: Mapping[str, Any]
    environ: Mapping[str, str]

    @classmethod
    def read(cls, path: str | Path, environ: Mapping[str, str] | None = None) -> ConfigFile:
        path = Path(path)
        return cls(path, _read_mapping(path), os.environ if environ is None else environ)

    @property
    def source(self) -> str:
        return str(self.path)

    def unknown_top_level_keys(self, others: tuple[str, ...] = ("consumer",)) -> list[str]:
        """The top-level keys no command knows (a typo such as ``consumr:``): the watcher's settings,
        by name or alias, and ``others`` (the consumer commands' section) are known."""
        known = {*others, *WatchConfig.model_fields}
        known.update(f.alias for f in WatchConfig.model_fields.values() if f.alias)
        return [key for key in self.raw if key not in known]

    def _resolved(self, name: str) -> Any:
        data = {name: _interpolate(self.raw[name], [name], self.source, self.environ)}
        _resolve_relative_paths(data, self.path.resolve().parent)  # as every section's local paths are
        return data[name]

    def section(self, name: str) -> Any:
        """The ``name`` section (None when the file has none), interpolated and its paths resolved."""
        return self._resolved(name) if name in self.raw else None

    def kafka_settings(self, *, bootstrap_servers: str | None = None) -> KafkaSettings:
        """The ``kafka:`` section validated (``bootstrap_servers``, the flag, replaces its broker list)."""
        data = {"kafka": self._resolved("kafka")} if "kafka" in self.raw else {}
        return validate_kafka_section(data, self.source, bootstrap_servers=bootstrap_servers)

    def watch_data(self) -> dict[str, Any]:
        """The watcher's settings, interpolated and resolved, not validated (its ``consumer:``
        section, the consumer commands', left aside): see :func:`load_config_data`."""
        raw = {k: v for k, v in self.raw.items() if k != "consumer"}
        data: dict[str, Any] = _interpolate(raw, [], self.source, self.environ)
        _resolve_relative_paths(data, self.path.resolve().parent)
        return data


def load_config_data(path: str | Path, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A configuration file's content, ``${VAR}`` interpolated and relative paths resolved, not
    validated: for :func:`~.settings.merge_overrides`, which validates it once merged with flags
    (the file need not be whole on its own: the flags may give the brokers or the tables)."""
    return ConfigFile.read(path, environ).watch_data()


def load_config(path: str | Path, environ: Mapping[str, str] | None = None) -> WatchConfig:
    """Read a ``.yaml``/``.yml``/``.toml`` file into a validated :class:`WatchConfig`.

    ``environ`` defaults to ``os.environ`` (for ``${VAR}``). Every problem is a ConfigError whose
    one-line message names the file and the key path.
    """
    return validate_watch_config(load_config_data(path, environ), str(path))


def load_kafka_settings(
    path: str | Path, *, bootstrap_servers: str | None = None, environ: Mapping[str, str] | None = None
) -> KafkaSettings:
    """The ``kafka:`` section of a configuration file, read as :func:`load_config` reads it.

    For the consumer commands' ``--config``: the same file as the watcher's, ``${VAR}`` and
    relative ``ssl_*_location`` paths treated alike; the other sections are not looked at.
    ``bootstrap_servers`` (the ``--bootstrap-servers`` flag) replaces the file's broker list.
    """
    return ConfigFile.read(path, environ).kafka_settings(bootstrap_servers=bootstrap_servers)


@dataclass(frozen=True)
class SignalConfig:
    """What ``deltamirror signal`` takes from a configuration file."""

    kafka: KafkaSettings
    #: where the watchers of the file read signals (None: they read none)
    signal_topic: str | None
    #: the whole configuration, when the file names tables or discover prefixes (a watcher's file)
    watch: WatchConfig | None


def load_signal_config(
    path: str | Path, *, bootstrap_servers: str | None = None, environ: Mapping[str, str] | None = None
) -> SignalConfig:
    """The Kafka settings and the ``signal_topic`` of a file, for ``deltamirror signal``.

    A file that names tables or discover prefixes is a watcher's: it is validated whole, as
    ``watch`` validates it, and returned with them (``bootstrap_servers`` replaces its broker list,
    as the flag does for ``watch``). Any other file is read as the consumer commands read it (its
    ``kafka:`` section), and its ``signal_topic`` key if it has one.
    """
    file = ConfigFile.read(path, environ)
    kafka = file.kafka_settings(bootstrap_servers=bootstrap_servers)
    if "tables" not in file.raw and "discover" not in file.raw:
        topic = file.raw.get("signal_topic", WatchConfig.model_fields["signal_topic"].default)
        topic = _interpolate(topic, ["signal_topic"], file.source, file.environ)
        return SignalConfig(kafka, check_topic_name(topic, "signal_topic", file.source), None)
    data = file.watch_data()  # as watch reads it: its consumer: section left aside
    cfg = validate_watch_config({**data, "kafka": kafka}, file.source)
    return SignalConfig(kafka, cfg.signal_topic, cfg)


def redacted(cfg: WatchConfig) -> dict[str, Any]:
    """The configuration as plain data for logs: no secret, however it was written.

    SecretStr values, values under secret-named keys (at any depth, whatever their type) and the
    userinfo of URLs in any string (a table URI, ``client_kwargs.endpoint_url``) become ``***``.
    ``kafka.extra`` is shown by its keys alone: any librdkafka property may carry a credential
    (a rack id, an engine's data), whatever its name.
    """
    data: dict[str, Any] = for_log(cfg.model_dump())
    data["kafka"]["extra"] = sorted(cfg.kafka.extra)
    return data


__all__ = [
    "ConfigFile",
    "SignalConfig",
    "load_config",
    "load_config_data",
    "load_kafka_settings",
    "load_signal_config",
    "redacted",
]
