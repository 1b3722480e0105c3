"""What the watcher exposes to operators: Prometheus metrics and a health endpoint, on one small server.

The metrics live on a private ``CollectorRegistry`` so that two watchers in one process (tests, a
library user) never share or double-register series. Every metric is labelled by ``table`` (the
table's normalized URI) and prefixed ``deltamirror_``:

=============================================== =====================================================
``deltamirror_last_published_version``          last version whose records are committed to Kafka
``deltamirror_last_commit_timestamp_seconds``   commit timestamp of that version (epoch seconds)
``deltamirror_milliseconds_behind_commit``      publish time minus commit time of that version, as
                                                Debezium's MilliSecondsBehindSource: it measures
                                                latency when caught up and the backlog when catching up
``deltamirror_last_publish_timestamp_seconds``  wall time of the last publish: ``time() - x`` alerts on
                                                a watcher that stopped publishing
``deltamirror_versions_behind``                 versions in the log not yet published
``deltamirror_events_published_total``          action records published (``rate()`` = events/second)
``deltamirror_transactions_committed_total``    Kafka transactions committed
``deltamirror_transactions_aborted_total``      Kafka transactions aborted
``deltamirror_table_up``                        1 while the table is mirrored, 0 while it is stopped
                                                on an error
``deltamirror_table_errors_total``              times the table stopped on an error
``deltamirror_healthy``                         1 when the watcher reports itself healthy
=============================================== =====================================================

``GET /healthz`` answers 200 ``{"status": "ok", ...}`` when the watcher said it is healthy and no
table is stopped on an error, else 503 with the reason; the watcher starts unhealthy ("starting")
until it calls ``set_healthy(True)``, so a container is not marked healthy before it has resumed.
Both endpoints bind to 127.0.0.1 unless told otherwise: they describe the tables being mirrored.

A table URI may hold credentials (``s3://key:secret@bucket/t``): the ``table`` label, the table
names and the reasons of ``/healthz`` are redacted (``s3://***@bucket/t``, core/redact.py).
"""

from __future__ import annotations

import json
import logging
import socket
import socketserver
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, make_wsgi_app

from deltamirror.core.errors import ConfigError
from deltamirror.core.redact import redact

log = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 9464
PREFIX = "deltamirror_"

StartResponse = Callable[..., Any]
WsgiApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


class Metrics(Protocol):
    """What the tables and the service report as they go (``WatcherMetrics``, ``NullMetrics``, a
    bench's recorder): called on the hot path, from every table's thread."""

    def published_version(self, table: str, version: int, commit_ts_ms: int) -> None: ...

    def versions_behind(self, table: str, n: int) -> None: ...

    def event_published(self, table: str, n: int = 1) -> None: ...

    def transaction_committed(self, table: str) -> None: ...

    def transaction_aborted(self, table: str) -> None: ...

    def table_error(self, table: str, reason: str) -> None: ...

    def table_ok(self, table: str) -> None: ...

    def set_healthy(self, ok: bool, reason: str = "") -> None: ...


@runtime_checkable
class ServedMetrics(Metrics, Protocol):
    """Metrics that :func:`serve` can expose: a Prometheus registry and the body of ``/healthz``."""

    @property
    def registry(self) -> CollectorRegistry: ...

    def health(self) -> tuple[bool, dict[str, Any]]: ...


class NullMetrics:
    """Measures nothing: for an embedding that has its own monitoring (it cannot be served)."""

    def published_version(self, table: str, version: int, commit_ts_ms: int) -> None:
        pass

    def versions_behind(self, table: str, n: int) -> None:
        pass

    def event_published(self, table: str, n: int = 1) -> None:
        pass

    def transaction_committed(self, table: str) -> None:
        pass

    def transaction_aborted(self, table: str) -> None:
        pass

    def table_error(self, table: str, reason: str) -> None:
        pass

    def table_ok(self, table: str) -> None:
        pass

    def set_healthy(self, ok: bool, reason: str = "") -> None:
        pass


@dataclass
class _TableHealth:
    #: the table's name as shown (label, /healthz): its URI, redacted
    label: str = ""
    up: bool = True
    reason: str = ""
    last_published_version: int | None = None


class WatcherMetrics:
    """The watcher's measurements; every method is cheap and thread-safe (call it on the hot path)."""

    def __init__(
        self, registry: CollectorRegistry | None = None, *, clock: Callable[[], float] = time.time
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        self._clock = clock
        self._lock = threading.Lock()
        self._healthy = False
        self._reason = "starting"
        self._tables: dict[str, _TableHealth] = {}

        def gauge(name: str, doc: str, labels: tuple[str, ...] = ("table",)) -> Gauge:
            return Gauge(PREFIX + name, doc, labels, registry=self.registry)

        def counter(name: str, doc: str) -> Counter:
            return Counter(PREFIX + name, doc, ("table",), registry=self.registry)

        self._version = gauge("last_published_version", "Last Delta version committed to Kafka.")
        self._commit_ts = gauge(
            "last_commit_timestamp_seconds", "Commit timestamp of the last published version (epoch s)."
        )
        self._behind_ms = gauge(
            "milliseconds_behind_commit",
            "Publish time minus commit time of the last published version, in milliseconds.",
        )
        self._publish_ts = gauge(
            "last_publish_timestamp_seconds", "Wall time when the last version was published (epoch s)."
        )
        self._versions_behind = gauge("versions_behind", "Versions in the log not yet published.")
        self._events = counter("events_published", "Action records published to Kafka.")
        self._commits = counter("transactions_committed", "Kafka transactions committed.")
        self._aborts = counter("transactions_aborted", "Kafka transactions aborted.")
        self._table_up = gauge("table_up", "1 while the table is mirrored, 0 while stopped on an error.")
        self._table_errors = counter("table_errors", "Times the table stopped on an error.")
        self._healthy_gauge = gauge("healthy", "1 when the watcher reports itself healthy.", ())
        self._healthy_gauge.set(0)

    # --- per table --------------------------------------------------------------------------

    def _table(self, table: str) -> _TableHealth:
        """The table's state; on first sight, every per-table series starts at 0 (rate() needs it)."""
        state = self._tables.get(table)
        if state is None:
            with self._lock:
                state = self._tables.get(table)
                if state is None:
                    label = redact(table)
                    for counter in (self._events, self._commits, self._aborts, self._table_errors):
                        counter.labels(label)
                    self._table_up.labels(label).set(1)
                    state = self._tables[table] = _TableHealth(label=label)
        return state

    def published_version(self, table: str, version: int, commit_ts_ms: int) -> None:
        """A version's last transaction committed: record where the table stands."""
        now = self._clock()
        state = self._table(table)
        state.last_published_version = version
        self._version.labels(state.label).set(version)
        self._commit_ts.labels(state.label).set(commit_ts_ms / 1000)
        self._behind_ms.labels(state.label).set(max(0, round(now * 1000) - commit_ts_ms))
        self._publish_ts.labels(state.label).set(now)

    def versions_behind(self, table: str, n: int) -> None:
        self._versions_behind.labels(self._table(table).label).set(n)

    def event_published(self, table: str, n: int = 1) -> None:
        if n < 0:
            raise ValueError(f"event count must be >= 0, got {n}")
        self._events.labels(self._table(table).label).inc(n)

    def transaction_committed(self, table: str) -> None:
        self._commits.labels(self._table(table).label).inc()

    def transaction_aborted(self, table: str) -> None:
        self._aborts.labels(self._table(table).label).inc()

    def table_error(self, table: str, reason: str) -> None:
        """The table stopped on an error (others go on); /healthz reports it until ``table_ok``."""
        state = self._table(table)
        with self._lock:
            was_up, state.up, state.reason = state.up, False, redact(reason)
        self._table_up.labels(state.label).set(0)
        if was_up:
            self._table_errors.labels(state.label).inc()

    def table_ok(self, table: str) -> None:
        state = self._table(table)
        with self._lock:
            state.up, state.reason = True, ""
        self._table_up.labels(state.label).set(1)

    # --- the process ------------------------------------------------------------------------

    def set_healthy(self, ok: bool, reason: str = "") -> None:
        with self._lock:
            self._healthy, self._reason = ok, redact(reason)
        self._healthy_gauge.set(1 if ok else 0)

    def health(self) -> tuple[bool, dict[str, Any]]:
        """(healthy, the JSON body of /healthz)."""
        with self._lock:
            tables = {
                state.label: {
                    "status": "ok" if state.up else "error",
                    **({"reason": state.reason} if not state.up else {}),
                    "lastPublishedVersion": state.last_published_version,
                }
                for _, state in sorted(self._tables.items())
            }
            failing = [state.label for _, state in sorted(self._tables.items()) if not state.up]
            healthy, reason = self._healthy, self._reason
        if healthy and failing:
            reason = f"{len(failing)} table(s) stopped on an error: {', '.join(failing)}"
        ok = healthy and not failing
        if ok:
            status = "ok"
        elif not healthy and reason == "starting":
            status = "starting"
        else:
            status = "unhealthy"
        body: dict[str, Any] = {"status": status, "tables": tables}
        if not ok:
            body["reason"] = reason or "unhealthy"
        return ok, body


# --- the HTTP server --------------------------------------------------------------------------


class _Server(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        log.debug("metrics server: " + format, *args)


def _app(metrics: ServedMetrics) -> WsgiApp:
    metrics_app = make_wsgi_app(metrics.registry)

    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        method = environ.get("REQUEST_METHOD", "GET")
        if method not in ("GET", "HEAD"):
            start_response("405 Method Not Allowed", [("Allow", "GET, HEAD"), ("Content-Length", "0")])
            return [b""]
        if path == "/metrics":
            result: Iterable[bytes] = metrics_app(environ, start_response)
            return result
        if path in ("/healthz", "/health"):
            ok, body = metrics.health()
            payload = json.dumps(body).encode()
            start_response(
                "200 OK" if ok else "503 Service Unavailable",
                [
                    ("Content-Type", "application/json"),
                    ("Content-Length", str(len(payload))),
                    ("Cache-Control", "no-store"),
                ],
            )
            return [b"" if method == "HEAD" else payload]
        payload = b"not found: try /metrics or /healthz\n"
        start_response(
            "404 Not Found", [("Content-Type", "text/plain"), ("Content-Length", str(len(payload)))]
        )
        return [payload]

    return app


class ServerHandle:
    """A running metrics/health server; ``port`` is the bound port (useful when asked for 0)."""

    def __init__(self, server: WSGIServer, thread: threading.Thread) -> None:
        self._server = server
        self._thread = thread
        self._stopped = False
        address = server.server_address
        self.host: str = str(address[0])
        self.port: int = int(address[1])

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def stop(self) -> None:
        """Stop serving and free the port; safe to call twice."""
        if self._stopped:
            return
        self._stopped = True
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> ServerHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve(metrics: ServedMetrics, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT) -> ServerHandle:
    """Serve ``GET /metrics`` (Prometheus text, or OpenMetrics when asked) and ``GET /healthz``.

    Runs in a daemon thread; ``port=0`` picks a free port (read it from the handle).
    """
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    except socket.gaierror as exc:
        raise ConfigError(f"cannot serve metrics on {host}:{port}: {exc.strerror}") from None

    class Server(_Server):
        address_family = family

    try:
        server = make_server(host, port, _app(metrics), server_class=Server, handler_class=_QuietHandler)
    except OSError as exc:
        raise ConfigError(f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}") from None
    # the poll interval bounds how long stop() waits for the serving loop to notice
    thread = threading.Thread(
        target=server.serve_forever, args=(0.1,), name="deltamirror-metrics", daemon=True
    )
    thread.start()
    handle = ServerHandle(server, thread)
    log.info("metrics on %s/metrics, health on %s/healthz", handle.url, handle.url)
    return handle


__all__ = [
    "DEFAULT_HOST",
    "DEFAULT_PORT",
    "Metrics",
    "NullMetrics",
    "ServedMetrics",
    "ServerHandle",
    "WatcherMetrics",
    "serve",
]
