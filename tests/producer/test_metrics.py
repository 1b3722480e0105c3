"""The metrics and health endpoints, through a real HTTP server on an ephemeral port."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from deltamirror.core.errors import ConfigError
from deltamirror.producer.metrics import ServerHandle, WatcherMetrics, serve

TABLE = "file:///data/demo"
OTHER = "s3://bucket/events"


class FakeClock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1_800_000_000.250)


@pytest.fixture
def metrics(clock: FakeClock) -> WatcherMetrics:
    return WatcherMetrics(clock=clock)


@pytest.fixture
def server(metrics: WatcherMetrics) -> Iterator[ServerHandle]:
    handle = serve(metrics, port=0)
    yield handle
    handle.stop()


def get(url: str) -> tuple[int, str, str]:
    """(status, content type, body), 4xx/5xx included."""
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.headers["Content-Type"], resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.headers["Content-Type"], err.read().decode()


def scrape(handle: ServerHandle) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    status, content_type, body = get(handle.url + "/metrics")
    assert status == 200
    assert content_type.startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, table: str) -> float:
    return samples[(name, (("table", table),))]


def health(handle: ServerHandle) -> tuple[int, dict[str, object]]:
    status, content_type, body = get(handle.url + "/healthz")
    assert content_type == "application/json"
    return status, json.loads(body)


def test_server_binds_loopback_on_an_ephemeral_port(server: ServerHandle) -> None:
    assert server.host == "127.0.0.1"
    assert server.port != 0
    assert server.url == f"http://127.0.0.1:{server.port}"


def test_exposition_carries_every_measurement(
    metrics: WatcherMetrics, server: ServerHandle, clock: FakeClock
) -> None:
    commit_ms = 1_799_999_990_000  # 10.25 s before the fake clock
    metrics.published_version(TABLE, 41, commit_ms - 5000)
    metrics.published_version(TABLE, 42, commit_ms)
    metrics.versions_behind(TABLE, 3)
    metrics.event_published(TABLE, 1000)
    metrics.event_published(TABLE)
    metrics.transaction_committed(TABLE)
    metrics.transaction_committed(TABLE)
    metrics.transaction_aborted(TABLE)

    samples = scrape(server)
    assert value(samples, "deltamirror_last_published_version", TABLE) == 42
    assert value(samples, "deltamirror_last_commit_timestamp_seconds", TABLE) == 1_799_999_990.0
    assert value(samples, "deltamirror_milliseconds_behind_commit", TABLE) == 10_250
    assert value(samples, "deltamirror_last_publish_timestamp_seconds", TABLE) == clock.now
    assert value(samples, "deltamirror_versions_behind", TABLE) == 3
    assert value(samples, "deltamirror_events_published_total", TABLE) == 1001
    assert value(samples, "deltamirror_transactions_committed_total", TABLE) == 2
    assert value(samples, "deltamirror_transactions_aborted_total", TABLE) == 1
    assert value(samples, "deltamirror_table_up", TABLE) == 1
    assert all(name.startswith("deltamirror_") for name, _ in samples)


def test_commit_in_the_future_is_not_negative_lag(metrics: WatcherMetrics, server: ServerHandle) -> None:
    metrics.published_version(TABLE, 1, 1_900_000_000_000)
    assert value(scrape(server), "deltamirror_milliseconds_behind_commit", TABLE) == 0


def test_counters_of_a_new_table_start_at_zero(metrics: WatcherMetrics, server: ServerHandle) -> None:
    """rate() over a series that appears only at its first increment misses that increment."""
    metrics.versions_behind(OTHER, 0)
    samples = scrape(server)
    for name in (
        "deltamirror_events_published_total",
        "deltamirror_transactions_committed_total",
        "deltamirror_transactions_aborted_total",
        "deltamirror_table_errors_total",
        "deltamirror_schema_registry_refusals_total",
    ):
        assert value(samples, name, OTHER) == 0, name


def test_tables_are_separate_series(metrics: WatcherMetrics, server: ServerHandle) -> None:
    metrics.event_published(TABLE, 5)
    metrics.event_published(OTHER, 7)
    samples = scrape(server)
    assert value(samples, "deltamirror_events_published_total", TABLE) == 5
    assert value(samples, "deltamirror_events_published_total", OTHER) == 7


def test_negative_event_count_is_refused(metrics: WatcherMetrics) -> None:
    with pytest.raises(ValueError):
        metrics.event_published(TABLE, -1)


def test_health_transitions(metrics: WatcherMetrics, server: ServerHandle) -> None:
    status, body = health(server)
    assert (status, body["status"]) == (503, "starting")

    metrics.set_healthy(True)
    metrics.published_version(TABLE, 3, 1_799_999_000_000)
    status, body = health(server)
    assert (status, body["status"]) == (200, "ok")
    assert body["tables"] == {TABLE: {"status": "ok", "lastPublishedVersion": 3}}
    assert "reason" not in body
    assert scrape(server)[("deltamirror_healthy", ())] == 1

    metrics.table_error(TABLE, "corrupt commit 00000000000000000004.json line 2")
    metrics.table_error(TABLE, "still corrupt")  # one outage, counted once
    status, body = health(server)
    assert status == 503
    assert body["status"] == "unhealthy"
    assert TABLE in str(body["reason"])
    assert body["tables"][TABLE]["status"] == "error"  # type: ignore[index]
    assert body["tables"][TABLE]["reason"] == "still corrupt"  # type: ignore[index]
    samples = scrape(server)
    assert value(samples, "deltamirror_table_up", TABLE) == 0
    assert value(samples, "deltamirror_table_errors_total", TABLE) == 1

    metrics.table_ok(TABLE)
    status, body = health(server)
    assert (status, body["status"]) == (200, "ok")
    assert value(scrape(server), "deltamirror_table_up", TABLE) == 1

    metrics.set_healthy(False, "broker unreachable for 60 s")
    status, body = health(server)
    assert (status, body["status"], body["reason"]) == (503, "unhealthy", "broker unreachable for 60 s")
    assert scrape(server)[("deltamirror_healthy", ())] == 0


def test_a_registry_refusal_is_counted_once_when_it_stops_the_table(
    metrics: WatcherMetrics, server: ServerHandle
) -> None:
    """What the pipeline calls on each attempt that stops on a refusal: schema_refused, then
    table_error. Counted when the table goes down on it, not on the retries; another error counts
    none; the table's series leave with it."""
    metrics.table_error(TABLE, "corrupt commit")  # another error, then resumed
    metrics.table_ok(TABLE)
    for _ in range(3):
        metrics.schema_refused(TABLE)
        metrics.table_error(TABLE, "the Schema Registry refused the schema (subject=t-value)")
    samples = scrape(server)
    assert value(samples, "deltamirror_schema_registry_refusals_total", TABLE) == 1
    assert value(samples, "deltamirror_table_errors_total", TABLE) == 2
    metrics.forget_table(TABLE)
    assert not [k for k in scrape(server) if k[0].startswith("deltamirror_schema_registry_refusals")]


def test_unknown_path_and_method(server: ServerHandle) -> None:
    status, _, _ = get(server.url + "/nope")
    assert status == 404
    request = urllib.request.Request(server.url + "/metrics", method="POST", data=b"")
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(request, timeout=5)
    assert err.value.code == 405


def test_registry_is_private() -> None:
    before = {m.name for m in REGISTRY.collect()}
    first, second = WatcherMetrics(), WatcherMetrics()  # no "Duplicated timeseries" error
    assert first.registry is not second.registry
    assert {m.name for m in REGISTRY.collect()} == before

    shared = CollectorRegistry()
    mine = WatcherMetrics(shared)
    assert mine.registry is shared
    mine.event_published(TABLE, 2)
    assert shared.get_sample_value("deltamirror_events_published_total", {"table": TABLE}) == 2


def test_stop_frees_the_port_and_is_idempotent(metrics: WatcherMetrics) -> None:
    handle = serve(metrics, port=0)
    port = handle.port
    handle.stop()
    handle.stop()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2)
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))


def test_busy_port_is_a_config_error(metrics: WatcherMetrics) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        with pytest.raises(ConfigError, match="cannot serve metrics"):
            serve(metrics, port=s.getsockname()[1])
