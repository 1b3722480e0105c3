"""What operators see: the one metrics and health HTTP server every long-running command serves.

``GET /metrics`` (Prometheus) and ``GET /healthz`` for anything that has a Prometheus registry and
can say whether it is healthy (:class:`Served`): the watcher's ``WatcherMetrics``, the consumers'
``ConsumerMetrics``. What is measured belongs to each command; how it is served is written once
here. Imports only ``deltamirror.core``, the standard library and ``prometheus_client``; the
producer and the consumers import it.
"""

from .server import DEFAULT_HOST, Served, ServerHandle, app, serve

__all__ = ["DEFAULT_HOST", "Served", "ServerHandle", "app", "serve"]
