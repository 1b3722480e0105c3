"""The one metrics and health server, through real HTTP requests on an ephemeral port."""

from __future__ import annotations

import json
import socket
import threading
import urllib.error
import urllib.request
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.parser import text_string_to_metric_families

from deltamirror.core.errors import ConfigError
from deltamirror.ops import Served, ServerHandle, serve


class Probe:
    """The smallest thing that can be served: one gauge, and a health the test sets."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.gauge = Gauge("probe_value", "A value the test sets.", registry=self.registry)
        self.ok = True
        self.calls = 0
        self._lock = threading.Lock()

    def health(self) -> tuple[bool, dict[str, Any]]:
        with self._lock:
            self.calls += 1
        return self.ok, {"status": "ok" if self.ok else "unhealthy", "n": self.calls}


def request(url: str, method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def test_a_probe_is_served() -> None:
    assert isinstance(Probe(), Served)
    assert not isinstance(object(), Served)


def test_metrics_and_health_over_http() -> None:
    probe = Probe()
    probe.gauge.set(41.5)
    with serve(probe, port=0) as handle:
        assert handle.host == "127.0.0.1" and handle.port != 0
        status, headers, body = request(handle.url + "/metrics")
        assert status == 200 and headers["Content-Type"].startswith("text/plain")
        samples = {s.name: s.value for f in text_string_to_metric_families(body.decode()) for s in f.samples}
        assert samples == {"probe_value": 41.5}

        status, headers, body = request(handle.url + "/healthz")
        assert (status, headers["Content-Type"], headers["Cache-Control"]) == (
            200,
            "application/json",
            "no-store",
        )
        assert json.loads(body) == {"status": "ok", "n": 1}

        probe.ok = False  # asked again on every request: never cached
        status, _, body = request(handle.url + "/health")
        assert status == 503 and json.loads(body) == {"status": "unhealthy", "n": 2}
        status, headers, body = request(handle.url + "/healthz", "HEAD")
        assert status == 503 and body == b"" and int(headers["Content-Length"]) > 0

        probe.gauge.set(7)  # a scrape reads the registry as it is now
        _, _, body = request(handle.url + "/metrics")
        assert b"probe_value 7.0" in body


def test_other_paths_and_methods() -> None:
    with serve(Probe(), port=0) as handle:
        status, _, body = request(handle.url + "/")
        assert status == 404 and b"/metrics" in body
        status, headers, _ = request(handle.url + "/metrics", "POST")
        assert status == 405 and headers["Allow"] == "GET, HEAD"


def test_stop_frees_the_port_and_a_taken_port_is_a_config_error() -> None:
    handle: ServerHandle = serve(Probe(), port=0)
    port = handle.port
    handle.stop()
    handle.stop()  # twice is fine
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(
            ConfigError, match=rf"cannot serve metrics on 127\.0\.0\.1:{taken.getsockname()[1]}"
        ):
            serve(Probe(), port=taken.getsockname()[1])
    with pytest.raises(ConfigError, match=r"cannot serve metrics on no-such-host\.invalid"):
        serve(Probe(), "no-such-host.invalid", port=0)


def test_the_watcher_serves_through_ops() -> None:
    """producer.metrics keeps its names: serve and ServerHandle are the ones here."""
    from deltamirror.producer import metrics

    assert metrics.ServerHandle is ServerHandle
    with metrics.serve(metrics.WatcherMetrics(), port=0) as handle:
        assert isinstance(handle, ServerHandle)
        status, _, body = request(handle.url + "/healthz")
        assert status == 503 and json.loads(body)["status"] == "starting"
