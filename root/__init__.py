"""deltamirror: mirror a Delta table's ``_delta_log`` into Kafka, and read it back.

The packages, each with its supported names in its ``__all__`` (everything else is private and may
move without notice): :mod:`deltamirror.core` (the Delta protocol), :mod:`deltamirror.mirror` (the
wire), :mod:`deltamirror.producer` (``watch``), :mod:`deltamirror.consumer` (snapshots,
invalidation, the Spark source), :mod:`deltamirror.ops` (metrics and health),
:mod:`deltamirror.cli` (the command) and :mod:`deltamirror.devkafka` (a local broker for development).
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("deltamirror")
except PackageNotFoundError:  # pragma: no cover - run from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = ["__version__"]
