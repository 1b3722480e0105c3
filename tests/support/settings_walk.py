"""Every setting of deltamirror, enumerated from where it is defined: the command line's parser
(every subcommand, nested ones included) and the pydantic settings models (walked field by field).

A setting is named by its identity, the key of the observer registry in
``tests/cli/test_every_setting.py``:

- a flag or argument: ``"<command path> <dest>"``, e.g. ``"consume-snapshot max_items"``,
  ``"local kafka start port"``; the top-level ``--version`` is ``" version"`` (empty command path);
- a model field: ``"<Model>.<path>"`` with ``[]`` for a list's items, e.g.
  ``"WatchConfig.tables[].row_changes.tombstones"``.
"""

from __future__ import annotations

import argparse
import typing
from collections.abc import Iterator

from pydantic import BaseModel

#: the models whose keys a user writes (a configuration file, a library caller); KafkaSection and
#: ConsumerSection are what the consumer commands read of a file (its ``kafka:`` and ``consumer:``)
SETTINGS_MODELS = (
    "deltamirror.producer.settings:WatchConfig",
    "deltamirror.mirror.settings:KafkaSection",
    "deltamirror.consumer.settings:ConsumerSection",
)


def flags(parser: argparse.ArgumentParser | None = None, path: tuple[str, ...] = ()) -> Iterator[str]:
    """``"<command> <dest>"`` of every argument of every (sub)command but ``--help``."""
    if parser is None:
        from deltamirror.cli.main import build_parser

        parser = build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from flags(child, (*path, name))
            continue
        yield f"{' '.join(path)} {action.dest}"


def commands(parser: argparse.ArgumentParser | None = None, path: tuple[str, ...] = ()) -> Iterator[str]:
    """Every leaf command (``"local kafka start"``)."""
    if parser is None:
        from deltamirror.cli.main import build_parser

        parser = build_parser()
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs and path:
        yield " ".join(path)
    for action in subs:
        for name, child in action.choices.items():
            yield from commands(child, (*path, name))


def _models_in(annotation: object) -> list[type[BaseModel]]:
    found: list[type[BaseModel]] = []
    for arg in typing.get_args(annotation) or (annotation,):
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            found.append(arg)
        elif typing.get_args(arg):
            found += _models_in(arg)
    return found


def model_fields(model: type[BaseModel], prefix: str = "") -> Iterator[str]:
    """The leaf fields of ``model``, nested models walked (``tables[].row_changes.format``)."""
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        nested = _models_in(field.annotation)
        if not nested:
            yield path
            continue
        many = typing.get_origin(field.annotation) is list
        for sub in nested:
            yield from model_fields(sub, path + ("[]." if many else "."))


def settings() -> list[str]:
    """Every setting's identity: flags first, then each model's fields."""
    import importlib

    out = list(flags())
    for spec in SETTINGS_MODELS:
        module, name = spec.split(":")
        model = getattr(importlib.import_module(module), name)
        out += [f"{name}.{path}" for path in model_fields(model)]
    return out
