"""``GET /metrics`` and ``GET /healthz`` on one small threaded WSGI server, for any :class:`Served`.

The standard library's WSGI server with a thread per request: a scrape never waits behind a slow
one, and nothing beyond ``prometheus_client`` is needed. ``/metrics`` is ``prometheus_client``'s
own app (Prometheus text, or OpenMetrics when the scraper asks for it); ``/healthz`` (also
``/health``) is the JSON of :meth:`Served.health`, 200 when healthy and 503 otherwise, never
cached. Other methods than GET and HEAD are 405, other paths 404.

It binds to 127.0.0.1 unless told otherwise: what it shows describes the tables being served. A
bind that fails (port taken, unknown host) is a :class:`~deltamirror.core.errors.ConfigError`
naming the address, so a command fails at start rather than running unobserved.
"""

from __future__ import annotations

import json
import logging
import socket
import socketserver
import threading
from collections.abc import Callable, Iterable
from typing import Any, Protocol, runtime_checkable
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

from deltamirror.core.errors import ConfigError

log = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"

StartResponse = Callable[..., Any]
WsgiApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


@runtime_checkable
class Served(Protocol):
    """What :func:`serve` exposes: a Prometheus registry and the body of ``/healthz``.

    ``health()`` is called on every request to ``/healthz``, from the server's threads: it must be
    cheap and thread-safe, and its body must already be redacted.
    """

    @property
    def registry(self) -> CollectorRegistry: ...

    def health(self) -> tuple[bool, dict[str, Any]]: ...


class _Server(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        log.debug("metrics server: " + format, *args)


def app(served: Served) -> WsgiApp:
    """The WSGI app of :func:`serve`, for an embedding that runs its own server."""
    metrics_app = make_wsgi_app(served.registry)

    def wsgi(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        method = environ.get("REQUEST_METHOD", "GET")
        if method not in ("GET", "HEAD"):
            start_response("405 Method Not Allowed", [("Allow", "GET, HEAD"), ("Content-Length", "0")])
            return [b""]
        if path == "/metrics":
            result: Iterable[bytes] = metrics_app(environ, start_response)
            return result
        if path in ("/healthz", "/health"):
            ok, body = served.health()
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

    return wsgi


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


def serve(served: Served, host: str = DEFAULT_HOST, *, port: int) -> ServerHandle:
    """Serve ``GET /metrics`` and ``GET /healthz`` of ``served`` on ``host:port`` until stopped.

    Runs in a daemon thread; ``port=0`` picks a free port (read it from the handle). Each command
    has its own default port (the watcher 9464, the consumers 9465).
    """
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    except socket.gaierror as exc:
        raise ConfigError(f"cannot serve metrics on {host}:{port}: {exc.strerror}") from None

    class Server(_Server):
        address_family = family

    try:
        server = make_server(host, port, app(served), server_class=Server, handler_class=_QuietHandler)
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


__all__ = ["DEFAULT_HOST", "Served", "ServerHandle", "app", "serve"]
