"""Flags declared once: each names the setting it gives, and its ``DELTAMIRROR_*`` variable.

A command's flags are a tuple of :class:`Flag`; from it come the parser's arguments
(:meth:`Flag.add_to`), the environment layer (:func:`environment_layer`: the variable of each flag,
``DELTAMIRROR_`` and the flag's long name in capitals, ``-`` as ``_``: ``--max-items`` is
``DELTAMIRROR_MAX_ITEMS``) and the flag layer (:func:`flag_layer`). The settings model of the
command merges them over its file once (``deltamirror.mirror.settings.merge_layers``, or
``merge_overrides`` for ``watch``): flags > environment > file > defaults.

A variable holds what the flag would be given, as text: a number for a number, one of the choices
for a choice, ``true``/``false`` (``1``/``0``, ``yes``/``no``, ``on``/``off``) for a switch, and one
value per line for a repeatable flag. An empty variable is not given; a switch's variable set to
``false`` is given: it turns off what the file turns on. A command reads the variables
of its own flags only: the others (``DELTAMIRROR_VERSION`` and the like that ``invalidate`` sets
for its ``--exec`` command, another command's) are not its settings.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

#: the prefix of every setting's environment variable
ENV_PREFIX = "DELTAMIRROR_"

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")

#: what ``--help`` says of the environment (every command whose flags are declared here)
ENVIRONMENT_HELP = (
    "Every flag may also be given as an environment variable: DELTAMIRROR_ and its long name in "
    "capitals, '-' as '_' (--bootstrap-servers: DELTAMIRROR_BOOTSTRAP_SERVERS); a switch takes "
    "true or false (false turns off what the file turns on), a repeatable flag one value per line. "
    "A flag given wins over its variable, a variable over the --config file, the file over the defaults."
)


@dataclass(frozen=True)
class Flag:
    """One argument of a command and the setting it gives.

    The parsed value is stored under ``dest`` (the setting's name unless said otherwise); ``convert``
    turns the parsed value into the setting's form. Nothing has a default here: a flag not given is
    None, so that the environment, the file or the model's default can apply.
    """

    setting: str
    names: tuple[str, ...]
    help: str
    metavar: str | None = None
    type: Callable[[str], Any] | None = None
    choices: tuple[str, ...] | None = None
    repeatable: bool = False
    convert: Callable[[Any], Any] | None = None
    #: a switch: True when given, None (not given) otherwise
    switch: bool = False
    #: argparse's dest, when it is not the setting's name
    dest_name: str | None = None

    @property
    def dest(self) -> str:
        return self.dest_name or self.setting

    @property
    def flag(self) -> str:
        """The flag's long name (how a problem with its value is said)."""
        return self.names[-1] if self.names else self.metavar or self.setting

    @property
    def env(self) -> str | None:
        """The flag's environment variable (None: a positional argument has none)."""
        if not self.names:
            return None
        return ENV_PREFIX + self.names[-1].lstrip("-").upper().replace("-", "_")

    def add_to(self, parser: argparse.ArgumentParser | Any) -> None:
        if not self.names:  # positional
            parser.add_argument(self.dest, nargs="*", metavar=self.metavar, help=self.help)
            return
        options: dict[str, Any] = {"dest": self.dest, "help": self.help}
        if self.repeatable:
            options["action"] = "append"
        if self.switch:
            options.update(action="store_const", const=True, default=None)
        for key in ("metavar", "type", "choices"):
            if getattr(self, key) is not None:
                options[key] = getattr(self, key)
        parser.add_argument(*self.names, **options)

    def value(self, args: argparse.Namespace) -> Any:
        """The flag's value as the setting takes it (None: not given)."""
        parsed = getattr(args, self.dest)
        if parsed is None or (self.repeatable and not parsed):
            return None
        return self.convert(parsed) if self.convert is not None else parsed

    def from_env(self, environ: Mapping[str, str]) -> Any:
        """The value its variable gives, as the flag would (None: unset or empty); a value the
        flag would refuse is refused naming the variable, never echoing it (it may be a secret)."""
        from deltamirror.core.errors import InvalidArgumentError

        name = self.env
        text = environ.get(name) if name is not None else None
        if name is None or text is None or not text.strip():
            return None
        if self.switch:
            word = text.strip().lower()
            if word not in (*_TRUE, *_FALSE):
                raise InvalidArgumentError(f"{name} must be true or false (1/0, yes/no, on/off)")
            return word in _TRUE  # false turns off what the file turns on
        items = [line.strip() for line in text.splitlines() if line.strip()] if self.repeatable else [text]
        values = [self._parsed(name, item) for item in items]
        parsed: Any = values if self.repeatable else values[0]
        return self.convert(parsed) if self.convert is not None else parsed

    def _parsed(self, name: str, text: str) -> Any:
        from deltamirror.core.errors import InvalidArgumentError

        if self.choices is not None and text not in self.choices:
            raise InvalidArgumentError(f"{name} must be one of {', '.join(self.choices)}")
        if self.type is None:
            return text
        try:
            return self.type(text)
        except (TypeError, ValueError):
            kind = "an integer" if self.type is int else "a number" if self.type is float else "valid"
            raise InvalidArgumentError(f"{name} must be {kind}") from None


def environment_layer(
    flags: Iterable[Flag], environ: Mapping[str, str] | None = None
) -> tuple[dict[str, Any], dict[str, str]]:
    """The settings the ``DELTAMIRROR_*`` variables of ``flags`` give, and each one's variable."""
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    names: dict[str, str] = {}
    for flag in flags:
        value = flag.from_env(environ)
        if value is not None and flag.env is not None:
            values[flag.setting] = value
            names[flag.setting] = flag.env
    return values, names


def flag_layer(flags: Iterable[Flag], args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, str]]:
    """The settings the flags given on the command line give, and each one's flag."""
    values: dict[str, Any] = {}
    names: dict[str, str] = {}
    for flag in flags:
        value = flag.value(args)
        if value is not None:
            values[flag.setting] = value
            names[flag.setting] = flag.flag
    return values, names


def flags_over_environment(
    flags: Iterable[Flag], args: argparse.Namespace, environ: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """Each setting the flags or their variables give (a flag given winning over its variable)."""
    return given_settings(flags, args, environ)[0]


def given_settings(
    flags: Iterable[Flag], args: argparse.Namespace, environ: Mapping[str, str] | None = None
) -> tuple[dict[str, Any], dict[str, str]]:
    """Each setting the flags or their variables give (a flag given winning over its variable), and
    how the user gave each one (``--from-version`` or ``DELTAMIRROR_FROM_VERSION``): a refusal
    names what the user wrote, not a flag they did not use."""
    flags = tuple(flags)
    from_env, env_names = environment_layer(flags, environ)
    given, flag_names = flag_layer(flags, args)
    return {**from_env, **given}, {**env_names, **flag_names}


__all__ = [
    "ENVIRONMENT_HELP",
    "ENV_PREFIX",
    "Flag",
    "environment_layer",
    "flag_layer",
    "flags_over_environment",
    "given_settings",
]
