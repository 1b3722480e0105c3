"""deltamirror: mirror a Delta table's ``_delta_log`` into Kafka, and read it back.

The packages, each with its supported names in its ``__all__`` (everything else is private and may
move without notice): :mod:`deltamirror.core` (the Delta protocol), :mod:`deltamirror.mirror` (the
wire), :mod:`deltamirror.producer` (``watch``), :mod:`deltamirror.consumer` (snapshots,
invalidation, the Spark source), :mod:`deltamirror.ops` (metrics and health),
:mod:`deltamirror.cli` (the command) and :mod:`deltamirror.devkafka` (a local broker for development).
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    """``__version__``, read from the package's metadata when first asked (reading it cost every
    command's start ~6 ms of CPU)."""
    if name != "__version__":
        raise AttributeError(f"module 'deltamirror' has no attribute {name!r}")
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version("deltamirror")
    except PackageNotFoundError:  # pragma: no cover - run from a source tree that was never installed
        found = "0+unknown"
    globals()["__version__"] = found
    return found


__all__ = ["__version__"]
