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


def _grouped(tmp_path: Path, count: int) -> WatchConfig:
    """``count`` configured tables in a group of two shards (none started until assigned)."""
    for i in range(count):
        _local_table(tmp_path / f"t{i}")
    return WatchConfig.model_validate(
        {
            "kafka": {"bootstrap_servers": "localhost:1"},
            "tables": [{"uri": str(tmp_path / f"t{i}"), "snapshot_mode": "latest"} for i in range(count)],
            "use_notifications": False,
            "group": {"name": "g", "shards": 2},
        }
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
    service = _discovering(tmp_path, 4)
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
    cfg = _grouped(tmp_path, 4)
    service = WatchService(cfg)
    try:
        threads = _overlapping_builds(service, monkeypatch)
        assert service.sharing is not None
        service.sharing._assigned({0, 1})  # what the membership thread does on an assignment
        assert service.running_tables() == {t.normalized_uri for t in cfg.tables}
        assert len(threads) >= 2
    finally:
        service.close()


def _discovering(tmp_path: Path, count: int) -> WatchService:
    for i in range(count):
        _local_table(tmp_path / "lake" / f"t{i}")
    return WatchService(
        WatchConfig.model_validate(
            {
                "kafka": {"bootstrap_servers": "localhost:1"},
                "discover": [{"uri": str(tmp_path / "lake"), "topics": "shared", "name": "lake"}],
                "oversize_policy": "fail",
                "use_notifications": False,
            }
        )
    )


def test_one_table_whose_start_is_refused_is_refused_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A ConfigError from one table's start refused that table alone while tables were started one
    by one; started together, it came out of the whole scan: no table of the scan was recorded as
    found (so none would be noticed dropped) and the discovery thread ended (found by review)."""
    from deltamirror.core.errors import ConfigError

    service = _discovering(tmp_path, 4)
    real = service._new_pipeline
    refused_uri = f"file://{tmp_path}/lake/t2"

    def built(table: TableConfig) -> Any:
        if table.normalized_uri == refused_uri:
            raise ConfigError("refused for the test", table=table.normalized_uri)
        return real(table)

    monkeypatch.setattr(service, "_new_pipeline", built)
    try:
        assert service.discovery is not None
        with caplog.at_level("ERROR", logger="deltamirror"):
            service.discovery.scan_now()
        others = {f"file://{tmp_path}/lake/t{i}" for i in (0, 1, 3)}
        assert service.running_tables() == others
        assert set(service.discovery.tables) == others
        said = [r.getMessage() for r in caplog.records if refused_uri in r.getMessage()]
        assert len(said) == 1 and "refused for the test" in said[0], said
    finally:
        service.close()


def test_tables_are_started_on_daemon_threads_and_one_failure_stops_no_other(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The start threads were a thread pool's, which the interpreter joins at exit: a stop waited on
    a start in progress (a slow store) beyond its budget. They are daemons now, like the discovery
    and membership threads that start tables; and a table whose start fails (a bug: not a refusal)
    is raised only once every other table was tried."""
    cfg = _grouped(tmp_path, 4)
    service = WatchService(cfg)
    real = service._new_pipeline
    daemons: list[bool] = []
    broken = cfg.tables[1].normalized_uri

    def built(table: TableConfig) -> Any:
        daemons.append(threading.current_thread().daemon)
        if table.normalized_uri == broken:
            raise RuntimeError("a bug in one table's start")
        return real(table)

    monkeypatch.setattr(service, "_new_pipeline", built)
    try:
        with pytest.raises(RuntimeError, match="a bug in one table's start"):
            service.start_tables(list(cfg.tables))  # what a group's assignment does
        assert len(daemons) == 4 and all(daemons), daemons
        assert service.running_tables() == {t.normalized_uri for t in cfg.tables} - {broken}
    finally:
        service.close()
