"""How every command reaches its brokers: one validated Kafka settings model, secrets kept secret.

The watcher (its ``kafka:`` section) and the consumer commands (their flags) build the same
:class:`KafkaSettings`, so the broker list is checked by the same rule, SASL/SSL settings are
checked for consistency the same way, and a password is a ``SecretStr`` everywhere: ``repr()`` and
``str()`` show ``**********``, logs ``***``. It is revealed in one place, the one that hands it to
a client: :meth:`KafkaSettings.librdkafka_config`. ``bootstrap_servers`` refuses credentials
outright (``host:port[,host:port]`` only), so they cannot leak through librdkafka's own messages.

Also the pieces every settings model of deltamirror shares (the watcher's models build on them):
a frozen model that refuses unknown keys, a cross-field problem that names its key, and the
one-line :class:`~deltamirror.core.errors.ConfigError` made from a pydantic ``ValidationError``,
which names the key path (``tables[1].from_version``) or the flag, never the value: a value of a
configuration may be a secret.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Any, TypeVar

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

from deltamirror.core.errors import ConfigError
from deltamirror.core.redact import MASK, is_secret_key, redact_value

from .kafka.connection import bootstrap_servers_problem

SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "GSSAPI", "OAUTHBEARER")
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
#: the properties deltamirror's clients set over the user's (mirror/kafka/consumer.py, producer.py):
#: refused in ``extra`` too, with what to use instead, rather than silently overridden
OWN_KAFKA_KEYS = {
    "group.id": "the consumers take their group from --group-id (or their state directory)",
    "auto.offset.reset": "deltamirror reads from its own position (its state, the group's offsets "
    "or the topic's beginning)",
    "enable.auto.commit": "deltamirror commits offsets itself, once what they cover is handled",
    "enable.auto.offset.store": "deltamirror commits offsets itself, once what they cover is handled",
    "enable.partition.eof": "deltamirror's readers need the end of each partition",
    "acks": "deltamirror's producers set acks=all (exactly-once, at-least-once dead letters)",
    "partitioner": "the watcher sets murmur2_random (the Java client's partitioning of the keys)",
    "delivery.report.only.error": "the watcher sets it itself",
}
#: the fields holding a path to a local file (resolved against a configuration file's directory)
SSL_FILE_FIELDS = ("ssl_ca_location", "ssl_certificate_location", "ssl_key_location")


# --- what every settings model shares -------------------------------------------------------------

ModelT = TypeVar("ModelT", bound=BaseModel)


class SettingsModel(BaseModel):
    """Frozen, unknown keys refused (a typo must not fall back to a default), inputs never echoed."""

    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)


class FieldProblem(ValueError):
    """A cross-field rule broken by one field: lets the error name ``tables[0].from_version``."""

    def __init__(self, field: str | tuple[int | str, ...], message: str) -> None:
        self.loc: tuple[int | str, ...] = (field,) if isinstance(field, str) else field
        self.problem = message
        super().__init__(f"{key_path(self.loc)}: {message}")


def wrap_secrets(value: Any) -> Any:
    """Plain strings under secret-looking keys (at any depth) turned into SecretStr."""
    if not isinstance(value, Mapping):
        return value
    out: dict[Any, Any] = {}
    for key, item in value.items():
        if isinstance(item, Mapping):
            out[key] = wrap_secrets(item)
        elif isinstance(item, str) and is_secret_key(key):
            out[key] = SecretStr(item)
        else:
            out[key] = item
    return out


def reveal(value: Any) -> Any:
    """SecretStr values (at any depth of a mapping) as plain strings: for a client, never a log."""
    if isinstance(value, SecretStr):
        return value.get_secret_value()
    if isinstance(value, Mapping):
        return {k: reveal(v) for k, v in value.items()}
    return value


def for_log(value: Any, key: object = None) -> Any:
    """Plain data with every secret masked: SecretStr, secret-named keys, URL userinfo."""
    if isinstance(value, SecretStr):
        return MASK
    if isinstance(value, Mapping) and not (key is not None and is_secret_key(key)):
        return {k: for_log(v, k) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [for_log(v) for v in value]
    return redact_value(value, key)


def key_path(loc: Sequence[int | str]) -> str:
    """``tables[1].storage_options["a.b"]``: where a problem is, as a person would write it."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", part):
            out += f".{part}" if out else part
        else:
            out += f'["{part}"]'
    return out or "(top level)"


def _field_names_at(root: type[BaseModel], loc: Sequence[int | str]) -> list[str]:
    """The keys the model accepts at ``loc``, to suggest a fix for a typo."""
    model: type[BaseModel] | None = root
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


class Refused(ValueError):
    """A combination refused in one sentence that names its settings itself (as the user gave them:
    see :func:`spelled`); said as it is, with nothing before it."""

    def __init__(self, sentence: str) -> None:
        self.sentence = sentence
        super().__init__(sentence)


def spelled(info: ValidationInfo, field: str) -> str:
    """How the user gave ``field``: a flag, an environment variable, a file's key path (the names
    :func:`merge_layers` passes in the validation context), else the field's own name."""
    names = (info.context or {}).get("names") or {}
    return str(names.get(field, field))


def _describe(error: Mapping[str, Any], root: type[BaseModel], names: Mapping[str, str]) -> str:
    loc = list(error["loc"])
    ctx = error.get("ctx") or {}
    cause = ctx.get("error")
    if isinstance(cause, Refused):
        return cause.sentence
    if isinstance(cause, FieldProblem):
        loc, message = [*loc, *cause.loc], cause.problem
    else:
        message = str(error["msg"]).removeprefix("Value error, ")
        if error["type"] == "extra_forbidden" and loc:
            message = "unknown key"
            close = difflib.get_close_matches(str(loc[-1]), _field_names_at(root, loc[:-1]), n=1)
            if close:
                message += f" (did you mean {close[0]!r}?)"
        elif error["type"] == "missing":
            message = "required key is missing"
    where = names.get(str(loc[0])) if len(loc) == 1 else None
    return f"{where or key_path(loc)}: {message}"


def settings_error(
    exc: ValidationError,
    root: type[BaseModel],
    *,
    source: str | None = None,
    names: Mapping[str, str] | None = None,
) -> ConfigError:
    """One line with every problem; never the offending values (they may be secrets).

    ``names`` maps a top-level field to what the user wrote instead (a flag): a problem with it is
    said as ``--bootstrap-servers: ...``, and the line is not prefixed by ``invalid configuration``.
    """
    problems = [_describe(e, root, names or {}) for e in exc.errors(include_input=False, include_url=False)]
    message = "; ".join(problems) if names else f"invalid configuration: {'; '.join(problems)}"
    return ConfigError(message, file=source)


@dataclass(frozen=True)
class Layer:
    """One source of settings: its values by field (None: not given) and how it spells each field
    (``--max-items``, ``DELTAMIRROR_MAX_ITEMS``, ``consumer.max_items``)."""

    values: Mapping[str, Any]
    names: Mapping[str, str] = dataclass_field(default_factory=dict)


def merge_layers(
    model: type[ModelT],
    layers: Sequence[Layer],
    *,
    source: str | None = None,
    fixed: Mapping[str, Any] | None = None,
    names: Mapping[str, str] | None = None,
) -> ModelT:
    """``model`` from ``layers`` merged once, a later layer over an earlier one field by field (the
    commands pass file, environment, flags: so flags > environment > file > the model's defaults),
    then validated once: a rule may be broken by values from two layers. ``fixed`` are values made
    already (a validated KafkaSettings). A problem is one ConfigError naming each field as the layer
    that gave it spells it (the validators read those names with :func:`spelled`); ``names`` spell
    the fields no layer gave (the flags, usually)."""
    data: dict[str, Any] = {}
    spelling: dict[str, str] = dict(names or {})
    for layer in layers:
        for key, value in layer.values.items():
            if value is None:
                continue
            data[key] = value
            spelling[key] = layer.names.get(key, key)
    try:
        return model.model_validate({**data, **(fixed or {})}, context={"names": spelling})
    except ValidationError as exc:
        raise settings_error(exc, model, source=source, names=spelling) from None


# --- Kafka ----------------------------------------------------------------------------------------


class KafkaSettings(SettingsModel):
    """How to reach the brokers; everything else librdkafka accepts goes in ``extra``."""

    bootstrap_servers: str
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
        known = SECURITY_PROTOCOLS if info.field_name == "security_protocol" else SASL_MECHANISMS
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
            elif not isinstance(item, str | SecretStr):
                # a list or a mapping: librdkafka has no such property value (a comma-separated
                # list is one string); said plainly, not as the union's validator internals
                raise FieldProblem(
                    str(key),
                    "a librdkafka property takes a string, number or bool, not "
                    + ("nothing" if item is None else f"a {type(item).__name__}"),
                )
            out[key] = item
        return wrap_secrets(out)

    @field_validator("extra")
    @classmethod
    def _no_duplicate_or_reserved_keys(cls, value: dict[str, str | SecretStr]) -> dict[str, str | SecretStr]:
        for key in value:
            if key in _TYPED_KAFKA_KEYS:
                raise FieldProblem(key, f"set it with kafka.{_TYPED_KAFKA_KEYS[key]} instead")
            if key in RESERVED_KAFKA_KEYS:
                raise FieldProblem(key, "the watcher sets this property itself (exactly-once delivery)")
            if key in OWN_KAFKA_KEYS:
                raise FieldProblem(key, f"deltamirror sets this property itself: {OWN_KAFKA_KEYS[key]}")
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
            raise FieldProblem(
                sasl_given[0],
                f"SASL settings need security_protocol SASL_SSL or SASL_PLAINTEXT (it is {protocol})",
            )
        ssl_given = [
            name
            for name in (
                "ssl_ca_location",
                "ssl_certificate_location",
                "ssl_key_location",
                "ssl_key_password",
            )
            if getattr(self, name) is not None
        ]
        if ssl_given and not protocol.endswith("SSL"):
            raise FieldProblem(
                ssl_given[0],
                f"TLS settings need security_protocol SSL or SASL_SSL (it is {protocol})",
            )
        if protocol.startswith("SASL_"):
            mechanism = self.sasl_mechanism or "GSSAPI"  # librdkafka's default
            if mechanism in _SASL_NEEDS_PASSWORD:
                for name in ("sasl_username", "sasl_password"):
                    if getattr(self, name) is None:
                        raise FieldProblem(name, f"required with sasl_mechanism {mechanism}")
        return self

    @classmethod
    def from_flags(cls, values: Mapping[str, Any], names: Mapping[str, str]) -> KafkaSettings:
        """Settings given on the command line: a problem names the flag (``--bootstrap-servers: ...``).

        ``values`` maps field names to the flags' values (None: not given); ``names`` maps field
        names to the flags' spelling.
        """
        try:
            return cls.model_validate({k: v for k, v in values.items() if v is not None})
        except ValidationError as exc:
            raise settings_error(exc, cls, names=names) from None

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
                config[key] = reveal(value)
        for key, value in self.extra.items():
            config[key] = reveal(value)
        return config

    def redacted(self) -> dict[str, Any]:
        """The settings as plain data for logs: every secret ``***``, ``extra`` by its keys alone
        (any librdkafka property may carry a credential, whatever its name)."""
        data: dict[str, Any] = for_log(self.model_dump())
        data["extra"] = sorted(self.extra)
        return data


class KafkaSection(BaseModel):
    """A configuration file read for its ``kafka:`` section only (a consumer command's ``--config``).

    The other keys belong to the watcher and are left alone, so one file serves every command.
    """

    model_config = ConfigDict(frozen=True, extra="ignore", hide_input_in_errors=True)

    kafka: KafkaSettings


def validate_kafka_section(
    data: Mapping[str, Any], source: str | None, *, bootstrap_servers: str | None = None
) -> KafkaSettings:
    """``data["kafka"]`` as KafkaSettings (``bootstrap_servers``, when given, replacing the file's).

    A problem is a ConfigError naming ``source`` and the key path (``kafka.sasl_password``).
    """
    raw = dict(data)
    if bootstrap_servers is not None:
        kafka = raw.get("kafka")
        raw["kafka"] = {
            **(kafka if isinstance(kafka, Mapping) else {}),
            "bootstrap_servers": bootstrap_servers,
        }
    try:
        return KafkaSection.model_validate(raw).kafka
    except ValidationError as exc:
        raise settings_error(exc, KafkaSection, source=source) from None


__all__ = [
    "OWN_KAFKA_KEYS",
    "RESERVED_KAFKA_KEYS",
    "SASL_MECHANISMS",
    "SECURITY_PROTOCOLS",
    "SSL_FILE_FIELDS",
    "FieldProblem",
    "KafkaSection",
    "KafkaSettings",
    "Layer",
    "Refused",
    "SettingsModel",
    "for_log",
    "key_path",
    "merge_layers",
    "reveal",
    "settings_error",
    "spelled",
    "validate_kafka_section",
    "wrap_secrets",
]
