"""Discovered tables on a real broker: the prefix's settings reach them, and a dropped one leaves
nothing behind on the watcher's /metrics."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from deltamirror.producer.metrics import WatcherMetrics
from deltamirror.producer.settings import WatchConfig, merge_overrides

pytestmark = pytest.mark.kafka


def _series_of(metrics: WatcherMetrics, table: str) -> list[str]:
    return [
        sample.name
        for family in metrics.registry.collect()
        for sample in family.samples
        if sample.labels.get("table") == table
    ]


def _wait(condition: Any, what: str, service: Any, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert service._failure is None, service._failure
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_discover_with_row_changes_publishes_the_rows_of_the_tables_found(
    kafka_bootstrap: str, tmp_path: Path, kit: Any
) -> None:
    """As ``watch --discover LAKE --row-changes`` says it: the flag reaches every table found."""
    from deltamirror.producer.service import WatchService

    lake = tmp_path / "lake"
    kit.make_table(lake / "a", versions=2, rows_per_version=3)
    name = kit.unique("rows")
    cfg = merge_overrides(
        {
            "kafka": {"bootstrap_servers": kafka_bootstrap},
            "discover": [{"uri": str(lake), "name": name, "interval_s": 0.3, "poll_interval_s": 0.2}],
            "progress_topic": kit.unique("progress"),
        },
        {"row_changes": True},
    )
    service = WatchService(cfg, stop_budget_s=5.0)
    service.start()
    try:
        changes = kit.consume(
            kafka_bootstrap, [f"deltamirror.{name}.a.changes"], until=lambda rs: len(rs) >= 6, timeout_s=60
        )
    finally:
        service.request_stop()
        assert service.wait(30), "the watcher did not stop"
        service.close()
    assert service._failure is None
    assert len(changes) == 6  # one record per row of the snapshot


def test_a_dropped_table_leaves_no_series_on_metrics(kafka_bootstrap: str, tmp_path: Path, kit: Any) -> None:
    from deltamirror.producer.service import WatchService

    lake = tmp_path / "lake"
    kit.make_table(lake / "a", versions=2)
    kit.make_table(lake / "b", versions=1)
    cfg = WatchConfig.model_validate(
        {
            "kafka": {"bootstrap_servers": kafka_bootstrap},
            "discover": [
                {"uri": str(lake), "name": kit.unique("m"), "interval_s": 0.3, "poll_interval_s": 0.2}
            ],
            "progress_topic": kit.unique("progress"),
        }
    )
    metrics = WatcherMetrics()
    service = WatchService(cfg, metrics=metrics, stop_budget_s=5.0)
    a_uri, b_uri = f"file://{lake}/a", f"file://{lake}/b"
    service.start()
    try:
        _wait(
            lambda: "deltamirror_versions_behind" in _series_of(metrics, a_uri),
            "a was not published",
            service,
        )
        _wait(lambda: "deltamirror_last_published_version" in _series_of(metrics, b_uri), "b", service)
        shutil.rmtree(lake / "a")
        _wait(lambda: a_uri not in {t.normalized_uri for t in service.tables()}, "a not forgotten", service)
        assert _series_of(metrics, a_uri) == []
        assert a_uri not in metrics.health()[1]["tables"]
        assert "deltamirror_last_published_version" in _series_of(metrics, b_uri)  # the others stay
    finally:
        service.request_stop()
        assert service.wait(30), "the watcher did not stop"
        service.close()
    assert service._failure is None
