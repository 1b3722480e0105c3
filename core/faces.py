"""A package's face: the names it supports, each imported on first use (PEP 562).

Each package of deltamirror lists its API in its ``__init__``'s ``__all__``; everything else is
private and may move without notice. The names load lazily, so importing a package (or one of its
modules) does not import the whole package: the CLI's ``--help`` and Spark's Python workers start
fast.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from importlib import import_module
from typing import Any


def lazy_exports(
    package: str, where: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``, whose names live in the modules ``where`` gives.

    ``where`` maps an exported name to its module, relative to ``package`` (``".settings"``).
    """

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(module, package), name)
        vars(sys.modules[package])[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *where})

    return __getattr__, __dir__


__all__ = ["lazy_exports"]
