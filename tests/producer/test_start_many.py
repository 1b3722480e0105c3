"""Tables started together (a discovery scan's new tables, a group's assigned shards) are started on
several threads: each start waits on its table's storage and log watch, and one by one 10,000
tables took 44 s to hand over (issue 29). No broker: the service is not started, so the pipelines
are built and never scheduled."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from deltamirror.producer.service import WatchService
from deltamirror.producer.settings import TableConfig, WatchConfig

V0 = "00000000000000000000.json"


def _local_table(path: Path) -> None:
    log = path / "_delta_log"
    log.mkdir(parents=True)
    (log / V0).write_text(
        '{"protocol":{"minReaderVersion":1,"minWriterVersion":2}}\n'
        '{"metaData":{"id":"t","format":{"provider":"parquet","options":{}},'
        '"schemaString":"{\\"type\\":\\"struct\\",\\"fields\\":[]}","partitionColumns":[],'
        '"configuration":{},"createdTime":0}}\n'
    )


def _overlapping_builds(service: WatchService, monkeypatch: pytest.MonkeyPatch) -> set[str]:
    """Every pipeline's construction waits for another one's (a barrier of two, bounded): one by
    one on a single thread, the first waits out the bound and raises BrokenBarrierError."""
    barrier = threading.Barrier(2, timeout=30)
    threads: set[str] = set()
    real = service._new_pipeline

    def built(table: TableConfig) -> Any:
        threads.add(threading.current_thread().name)
        barrier.wait()
        return real(table)

    monkeypatch.setattr(service, "_new_pipeline", built)
    return threads


def test_a_scans_new_tables_are_started_on_several_threads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for i in range(4):
        _local_table(tmp_path / "lake" / f"t{i}")
    cfg = WatchConfig.model_validate(
        {
            "kafka": {"bootstrap_servers": "localhost:1"},
            "discover": [{"uri": str(tmp_path / "lake"), "topics": "shared", "name": "lake"}],
            "oversize_policy": "fail",
            "use_notifications": False,
        }
    )
    service = WatchService(cfg)
    try:
        threads = _overlapping_builds(service, monkeypatch)
        assert service.discovery is not None
        service.discovery.scan_now()
        expected = {f"file://{tmp_path}/lake/t{i}" for i in range(4)}
        assert service.running_tables() == expected
        assert set(service.discovery.tables) == expected
        assert len(threads) >= 2 and threading.current_thread().name not in threads
        service.discovery.scan_now()  # found again: not started again
        assert service.running_tables() == expected
    finally:
        service.close()


def test_a_groups_assigned_tables_are_started_on_several_threads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tables = []
    for i in range(4):
        _local_table(tmp_path / f"t{i}")
        tables.append({"uri": str(tmp_path / f"t{i}"), "snapshot_mode": "latest"})
    cfg = WatchConfig.model_validate(
        {
            "kafka": {"bootstrap_servers": "localhost:1"},
            "tables": tables,
            "use_notifications": False,
            "group": {"name": "g", "shards": 2},
        }
    )
    service = WatchService(cfg)
    try:
        threads = _overlapping_builds(service, monkeypatch)
        assert service.sharing is not None
        service.sharing._assigned({0, 1})  # what the membership thread does on an assignment
        assert service.running_tables() == {t.normalized_uri for t in cfg.tables}
        assert len(threads) >= 2
    finally:
        service.close()
