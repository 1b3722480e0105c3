"""A table stopped on an error says it once, while /healthz and the metrics keep saying it.

The watcher retries a stopped table with a backoff; an error that does not change from one attempt
to the next (a sidecar the log names outside the table's root and every ``allowed_path_prefixes``) is
logged once for the table and the version it stopped on, not once per attempt.
"""

from __future__ import annotations

import logging
import shutil
import threading
from pathlib import Path
from typing import Any

import pytest

from deltamirror.producer import WatchConfig
from deltamirror.producer import pipeline as pipeline_module
from deltamirror.producer.metrics import WatcherMetrics
from deltamirror.producer.service import WatchService
from support.records import wait_for

pytestmark = [pytest.mark.kafka]


TABLES = Path(__file__).resolve().parents[1] / "data" / "tables"


def _sidecar_outside(root: Path, outside: Path) -> Path:
    """A table read from a V2 checkpoint (its commits cleaned up) one of whose sidecars lies outside."""
    shutil.copytree(TABLES / "golden__v2-checkpoint-json", root)
    log = root / "_delta_log"
    for crc in [*log.glob(".*.crc"), *log.glob("_sidecars/.*.crc")]:
        crc.unlink()
    outside.mkdir(parents=True, exist_ok=True)
    sidecar = sorted((log / "_sidecars").iterdir())[0]
    shutil.move(sidecar, outside / sidecar.name)
    (checkpoint,) = log.glob("*.checkpoint.*.json")
    text = checkpoint.read_text().replace(
        f'"path":"{sidecar.name}"', f'"path":"{(outside / sidecar.name).as_uri()}"'
    )
    assert (outside / sidecar.name).as_uri() in text
    checkpoint.write_text(text)
    return root


class _CountingMetrics(WatcherMetrics):
    """The watcher's metrics, counting the attempts that stopped the table."""

    def __init__(self) -> None:
        super().__init__()
        self.errors = 0
        self._count = threading.Lock()

    def table_error(self, table: str, reason: str) -> None:
        with self._count:
            self.errors += 1
        super().table_error(table, reason)


@pytest.mark.timeout(120)
def test_a_path_outside_the_allowed_prefixes_is_logged_once_while_the_table_stays_stopped_on_it(
    kafka_bootstrap: str,
    tmp_path: Path,
    kit: Any,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    table = _sidecar_outside(tmp_path / "t", tmp_path / "outside")
    name = kit.unique("dmonce")
    cfg = WatchConfig.model_validate(
        {
            "kafka": {"bootstrap_servers": kafka_bootstrap},
            "tables": [
                {
                    "uri": str(table),
                    "actions_topic": f"{name}.actions",
                    "commits_topic": f"{name}.commits",
                    "poll_interval_s": 0.1,
                }
            ],
            "progress_topic": f"{name}.progress",
            "transactional_id_prefix": name,
            "signal_topic": None,
        }
    )
    monkeypatch.setattr(pipeline_module, "BACKOFF_MIN_S", 0.05)  # attempts in quick succession
    monkeypatch.setattr(pipeline_module, "BACKOFF_MAX_S", 0.1)
    caplog.set_level(logging.DEBUG, logger="deltamirror")
    metrics = _CountingMetrics()
    service = WatchService(cfg, metrics=metrics, stop_budget_s=5.0)
    service.start()
    try:
        wait_for(lambda: metrics.errors >= 6, "six attempts stopped on the sidecar outside", 60, every_s=0.05)
        healthy, body = metrics.health()
        (entry,) = body["tables"].values()
        assert not healthy and entry["status"] == "error"
        assert "outside the table root" in entry["reason"]
        label = next(iter(body["tables"]))
        assert metrics.registry.get_sample_value("deltamirror_table_up", {"table": label}) == 0
        # another error (the sidecar named elsewhere) is said again, once
        (checkpoint,) = (table / "_delta_log").glob("*.checkpoint.*.json")
        moved = tmp_path / "elsewhere"
        shutil.copytree(tmp_path / "outside", moved)
        checkpoint.write_text(checkpoint.read_text().replace("/outside/", "/elsewhere/"))
        attempts = metrics.errors
        wait_for(
            lambda: metrics.errors >= attempts + 6, "six attempts on the sidecar elsewhere", 60, every_s=0.05
        )
    finally:
        service.request_stop()
        assert service.wait(30), "the watcher did not stop"
        service.close()
    said = [
        r
        for r in caplog.records
        if r.levelno >= logging.WARNING and "outside the table root" in r.getMessage()
    ]
    assert len(said) == 2, [r.getMessage() for r in said]
    assert all(
        r.levelno == logging.ERROR and r.getMessage().startswith("table stopped: sidecar") for r in said
    )
    assert "/outside/" in said[0].getMessage() and "/elsewhere/" in said[1].getMessage()
    again = [r for r in caplog.records if r.getMessage().startswith("table still stopped: sidecar")]
    assert len(again) >= 10 and all(r.levelno == logging.DEBUG for r in again)
