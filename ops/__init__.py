"""What operators see: the one metrics and health HTTP server every long-running command serves.

``GET /metrics`` (Prometheus) and ``GET /healthz`` for anything that has a Prometheus registry and
can say whether it is healthy (:class:`Served`): the watcher's ``WatcherMetrics``, the consumers'
``ConsumerMetrics``. What is measured belongs to each command; how it is served is written once
here. Imports only ``deltamirror.core``, the standard library and ``prometheus_client``; the
producer and the consumers import it.
"""

from typing import TYPE_CHECKING

from deltamirror.core.faces import lazy_exports

if TYPE_CHECKING:
    from .server import DEFAULT_HOST, Served, ServerHandle, app, serve

__all__ = ["DEFAULT_HOST", "Served", "ServerHandle", "app", "serve"]

# lazily: deltamirror.ops.stopping (every command takes its signals first) must not import
# prometheus_client and the HTTP server, which only a command serving its metrics needs
__getattr__, __dir__ = lazy_exports(__name__, {name: ".server" for name in __all__})
