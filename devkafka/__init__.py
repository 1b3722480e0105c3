"""deltamirror.devkafka: a real Apache Kafka broker for laptops, tests and the demo (a tool, not the product).

A single-node KRaft broker run from pinned, checksum-verified jars (``jars.py``, ``kafka_artifacts.json``),
plain or with a SCRAM + TLS listener (``security.py``); Kafka's transaction tool for hanging
transactions (``tools.py``). Used by ``deltamirror local kafka``, the demo
and the test suite; the producer and the consumers never import it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from deltamirror.core.faces import lazy_exports

if TYPE_CHECKING:
    from .broker import LocalKafka

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "LocalKafka": ".broker",
    },
)

__all__ = [
    "LocalKafka",
]
