"""The watcher against a real broker: exactly once, in order, through crashes, fencing and restarts."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from deltamirror.core.table import open_table
from deltamirror.mirror.records.events import ActionEvent, CommitSummary, ProgressRecord, TableReplaced
from deltamirror.producer import WatchConfig
from deltamirror.producer.pipeline import transactional_id
from deltamirror.producer.service import WatchService
from support.kafka import free_port_pair
from support.tables import copy_table

pytestmark = [pytest.mark.kafka]


def _cfg(setup: Any, **over: Any) -> WatchConfig:
    cfg: WatchConfig = setup.cfg()
    return cfg.model_copy(update=over) if over else cfg


def _run_until(service: WatchService, done: Any, timeout_s: float = 60) -> None:
    service.start()
    deadline = time.monotonic() + timeout_s
    try:
        while not done():
            assert time.monotonic() < deadline, "the watcher did not publish everything in time"
            assert service._failure is None, service._failure
            time.sleep(0.2)
    finally:
        service.request_stop()
        assert service.wait(30), "the watcher did not stop"
        service.close()


def _summaries(records: list[Any]) -> list[dict[str, Any]]:
    return [r.json for r in records if r.headers.get("kind") == b"commit"]


def _last_summary_version(kit: Any, setup: Any) -> int:
    summaries = _summaries(kit.consume(setup.bootstrap, [setup.commits], idle_s=0.3, timeout_s=10))
    return max((s["version"] for s in summaries), default=-1)


def _uncommitted(kit: Any, setup: Any) -> int:
    try:
        return int(kit.uncommitted_records(setup.bootstrap, setup.actions))
    except Exception:  # the watcher has not created the topic yet
        return 0


def _write_atomically(path: Path, text: str) -> None:
    """As Delta writers do: the watcher must never see a half-written commit file."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _assert_exactly(records: list[Any], expected: list[bytes]) -> None:
    got = [r.value for r in records]
    assert len(got) == len(expected), f"{len(got)} records, expected {len(expected)}"
    assert got == expected


@pytest.mark.timeout(180)
def test_every_action_of_every_version_once_in_order_with_its_timestamp(
    kafka_bootstrap: str, tmp_path: Path, kit: Any, watch_setup: Any
) -> None:
    """Two tables in one process: a real log from version 0, and a delta-rs table snapshotted then tailed."""
    old = copy_table("gen__long-log-cdf", tmp_path)
    live = kit.make_table(tmp_path / "live", versions=2)
    setup_old = watch_setup(kafka_bootstrap, old)
    setup_live = watch_setup(kafka_bootstrap, live, table_settings={"snapshot_mode": "initial"})
    cfg_live = setup_live.cfg()
    cfg = _cfg(setup_old, tables=[*setup_old.cfg().tables, *cfg_live.tables], txn_max_records=7)
    service = WatchService(cfg)
    latest_old = open_table(str(old)).latest_version()
    appended = {"done": False}

    def done() -> bool:
        if not appended["done"] and _last_summary_version(kit, setup_live) >= 1:
            for i in range(3):  # commits while the watcher tails the table
                kit.append(live, 2, start=100 + 10 * i)
            appended["done"] = True
        return (
            appended["done"]
            and _last_summary_version(kit, setup_old) >= latest_old
            and _last_summary_version(kit, setup_live) >= 4
        )

    _run_until(service, done, timeout_s=120)

    # the real log: exactly what `deltamirror events` prints, in order, once
    expected = kit.events_output(old)
    records = setup_old.actions_records()
    _assert_exactly(records, expected)
    table = open_table(str(old))
    stamps = {t.version: t.timestamp for t in table.commit_timestamps()}
    for record in records:
        event = ActionEvent.model_validate_json(record.value)
        assert record.key == event.table_id.encode()
        assert record.timestamp == stamps[event.version] == event.commit_timestamp
        assert record.headers["version"] == str(event.version).encode()
        assert record.headers["index"] == str(event.index).encode()
        assert record.headers["type"] == event.type.encode()
    summaries = [CommitSummary.model_validate(s) for s in _summaries(setup_old.commits_records())]
    assert [s.version for s in summaries] == sorted(table.listing(0).commits)
    counts: dict[int, int] = {}
    for record in records:
        event = ActionEvent.model_validate_json(record.value)
        counts[event.version] = counts.get(event.version, 0) + 1
    assert all(s.action_count == counts[s.version] for s in summaries)

    # the live table: its snapshot at version 1, then versions 2..4 as events prints them
    live_records = setup_live.actions_records()
    snap = [r.json for r in live_records if r.json["snapshot"]]
    assert snap and {e["version"] for e in snap} == {1}
    assert [e["index"] for e in snap] == list(range(snap[0]["count"]))
    assert [e.get("snapshotEnd") for e in snap] == [False] * (len(snap) - 1) + [True]
    tail = [r.value for r in live_records if not r.json["snapshot"]]
    assert tail == kit.events_output(live, "--starting-version", "2")

    # each table's progress: its last version, complete
    progress = {r.key: ProgressRecord.model_validate_json(r.value) for r in setup_old.progress_records()}
    last_old = progress[table.uri.encode()]
    assert last_old.version == latest_old and last_old.complete
    assert last_old.transactional_id == transactional_id(cfg.transactional_id_prefix, table.uri)
    assert progress[open_table(str(live)).uri.encode()].version == 4


def _wait_for(condition: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


@pytest.mark.timeout(240)
def test_kill_9_in_the_middle_of_a_transaction_then_restart_loses_and_duplicates_nothing(
    kafka_bootstrap: str, tmp_path: Path, kit: Any, watch_setup: Any
) -> None:
    table = kit.make_table(tmp_path / "t", versions=1)
    kit.write_versions(table, 1, 150, 1000)
    setup = watch_setup(kafka_bootstrap, table, txn_max_records=20_000)
    log_file = tmp_path / "watch.log"
    # A kill between two transactions proves nothing, so kill while records of an open transaction
    # are on the broker, and check afterwards that it stayed open (nothing can commit it any more).
    # The producer may still commit in the moment between the look and the kill: then try again;
    # and when a slow look let it publish everything, give it new versions to publish.
    interrupted = False
    last = 150
    for _ in range(5):
        proc = setup.start_process(log=log_file)
        try:
            _wait_for(
                lambda p=proc, last=last: (
                    p.poll() is not None
                    or _uncommitted(kit, setup) > 0
                    or _last_summary_version(kit, setup) >= last
                ),
                60,
                "an open transaction",
            )
            assert proc.poll() is None, log_file.read_text()[-3000:]
            if _uncommitted(kit, setup) == 0 and _last_summary_version(kit, setup) >= last:
                kit.write_versions(table, last + 1, 50, 1000, prefix=f"more{last}")
                last += 50
                continue
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
        finally:
            if proc.poll() is None:
                proc.kill()
        time.sleep(1)  # the broker may still be writing the marker of a commit the kill did not stop
        if _uncommitted(kit, setup) > 0:
            interrupted = True
            break
    assert interrupted, "no kill landed inside a transaction in 5 tries"
    expected = kit.events_output(table)
    committed_at_kill = len(setup.actions_records(idle_s=0.5))
    assert committed_at_kill < len(expected)

    restarted = setup.start_process(log=log_file)
    try:
        _wait_for(lambda: _last_summary_version(kit, setup) >= last, 180, "the restarted watcher to finish")
    finally:
        assert kit.stop_process(restarted) == 0, log_file.read_text()[-3000:]
    _assert_exactly(setup.actions_records(), expected)
    assert [s["version"] for s in _summaries(setup.commits_records())] == list(range(last + 1))
    everything = kit.consume(kafka_bootstrap, [setup.actions], isolation="read_uncommitted")
    assert len(everything) > len(expected), (
        "the kill did not interrupt a transaction: the test proved nothing"
    )


@pytest.mark.timeout(180)
def test_a_second_watcher_fences_the_first_which_exits_non_zero(
    kafka_bootstrap: str, tmp_path: Path, kit: Any, watch_setup: Any
) -> None:
    table = kit.make_table(tmp_path / "t", versions=3)
    setup = watch_setup(kafka_bootstrap, table)
    log_a, log_b = tmp_path / "a.log", tmp_path / "b.log"
    first = setup.start_process(log=log_a)
    second = None
    try:
        _wait_for(lambda: _last_summary_version(kit, setup) >= 2, 60, "the first watcher")
        second = setup.start_process(log=log_b)
        _wait_for(lambda: b"all tables resumed" in log_b.read_bytes(), 60, "the second watcher to resume")
        kit.append(table, 2, start=500)
        kit.append(table, 2, start=600)
        code = first.wait(60)
        assert code == 1, log_a.read_text()[-3000:]
        assert "fenced" in log_a.read_text()
        _wait_for(lambda: _last_summary_version(kit, setup) >= 4, 60, "the second watcher to publish")
        assert second.poll() is None
    finally:
        if first.poll() is None:
            first.kill()
        if second is not None:
            assert kit.stop_process(second) == 0, log_b.read_text()[-3000:]
    assert "stopped cleanly" in log_b.read_text()
    _assert_exactly(setup.actions_records(), kit.events_output(table))


@pytest.mark.isolated  # its own broker, stopped: none of the session's
@pytest.mark.timeout(300)
def test_broker_stopped_and_restarted_mid_stream_loses_nothing(
    tmp_path: Path, kit: Any, watch_setup: Any
) -> None:
    from deltamirror.devkafka.broker import LocalKafka

    broker = LocalKafka(port=free_port_pair(), data_dir=tmp_path / "kafka")
    bootstrap = broker.start()
    try:
        table = kit.make_table(tmp_path / "t", versions=1)
        kit.write_versions(table, 1, 20, 2000)
        setup = watch_setup(bootstrap, table, txn_max_records=5000)
        service = WatchService(setup.cfg())
        service.start()
        try:
            _wait_for(lambda: _last_summary_version(kit, setup) >= 3, 90, "the first versions")
            broker.stop()
            kit.write_versions(table, 21, 10, 500, prefix="down")  # commits while the broker is down
            time.sleep(3)
            broker.start()
            _wait_for(lambda: _last_summary_version(kit, setup) >= 30, 150, "every version after the restart")
            assert service._failure is None
        finally:
            service.request_stop()
            assert service.wait(60)
            service.close()
        _assert_exactly(setup.actions_records(), kit.events_output(table))
        assert [s["version"] for s in _summaries(setup.commits_records())] == list(range(31))
    finally:
        broker.stop()


@pytest.mark.timeout(240)
def test_a_huge_commit_is_published_in_chunks(
    kafka_bootstrap: str, tmp_path: Path, kit: Any, watch_setup: Any
) -> None:
    import tracemalloc

    table = kit.make_table(tmp_path / "t", versions=1)
    kit.write_versions(table, 1, 1, 200_000)
    setup = watch_setup(kafka_bootstrap, table, txn_max_records=50_000)
    service = WatchService(setup.cfg())
    tracemalloc.start()
    try:
        _run_until(service, lambda: _last_summary_version(kit, setup) >= 1, timeout_s=200)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    size = (table / "_delta_log" / f"{1:020d}.json").stat().st_size
    assert peak < size / 2, f"peak Python memory {peak / 1e6:.0f} MB for a {size / 1e6:.0f} MB commit"
    _assert_exactly(setup.actions_records(timeout_s=120), kit.events_output(table))
    chunks = [
        ProgressRecord.model_validate_json(r.value)
        for r in setup.progress_records()
        if ProgressRecord.model_validate_json(r.value).version == 1
    ]
    assert len(chunks) >= 4, "a 200k-action version must span several transactions"
    assert [c.index for c in chunks] == sorted(c.index for c in chunks)
    assert not any(c.complete for c in chunks[:-1]) and chunks[-1].complete
    summaries = _summaries(setup.commits_records())
    assert [s["version"] for s in summaries] == [0, 1]  # the summary once, with the last chunk


@pytest.mark.timeout(180)
def test_a_recreated_table_is_announced_and_mirrored_as_new(
    kafka_bootstrap: str, tmp_path: Path, kit: Any, watch_setup: Any
) -> None:
    import shutil

    table = kit.make_table(tmp_path / "t", versions=2)
    setup = watch_setup(kafka_bootstrap, table, table_settings={"snapshot_mode": "initial"})
    service = WatchService(setup.cfg())
    old_id = open_table(str(table)).snapshot().metadata.id
    state = {"recreated": False}

    def done() -> bool:
        if not state["recreated"] and _last_summary_version(kit, setup) >= 1:
            shutil.rmtree(table)
            kit.make_table(table, versions=4)
            state["recreated"] = True
        records = kit.consume(kafka_bootstrap, [setup.commits], idle_s=0.3)
        # the watcher may see the new table while it is being written (rmtree, then versions 0..3):
        # it then snapshots an earlier version and mirrors the rest as commits; wait for version 3
        return any(
            r.json["tableId"] != old_id and r.headers.get("kind") == b"commit" and r.json["version"] == 3
            for r in records
        )

    _run_until(service, done, timeout_s=120)
    new_id = open_table(str(table)).snapshot().metadata.id
    commits = setup.commits_records()
    announcements = [
        TableReplaced.model_validate(r.json) for r in commits if r.headers["kind"] == b"tableReplaced"
    ]
    assert len(announcements) == 1
    assert (announcements[0].previous_table_id, announcements[0].table_id) == (old_id, new_id)
    assert announcements[0].previous_version == 1
    events = [r.json for r in setup.actions_records()]
    ids = [e["tableId"] for e in events]
    assert ids == [old_id] * ids.count(old_id) + [new_id] * ids.count(new_id)  # old table, then the new one
    new_events = [e for e in events if e["tableId"] == new_id]
    snapshot = [e for e in new_events if e.get("snapshot")]
    assert new_events[: len(snapshot)] == snapshot, "the new table starts with a snapshot"
    assert snapshot[-1]["snapshotEnd"] and {e["version"] for e in snapshot} == {snapshot[0]["version"]}
    later = sorted({e["version"] for e in new_events[len(snapshot) :]})
    assert later == list(range(snapshot[0]["version"] + 1, 4)), "then every later version once, up to 3"


@pytest.mark.timeout(180)
def test_a_corrupt_commit_stops_the_table_naming_file_and_line_until_fixed(
    kafka_bootstrap: str, tmp_path: Path, kit: Any, watch_setup: Any
) -> None:
    table = kit.make_table(tmp_path / "t", versions=2)
    setup = watch_setup(kafka_bootstrap, table)
    service = WatchService(setup.cfg())
    bad = table / "_delta_log" / f"{2:020d}.json"
    good_lines = (table / "_delta_log" / f"{1:020d}.json").read_text().splitlines()
    state = {"step": 0}

    def done() -> bool:
        if state["step"] == 0 and _last_summary_version(kit, setup) >= 1:
            _write_atomically(bad, good_lines[0] + "\n{not json\n")
            state["step"] = 1
        if state["step"] == 1:
            ok, body = service.metrics.health()
            reason = body["tables"].get(open_table(str(table)).uri, {}).get("reason", "")
            if not ok and str(bad) in reason:
                assert "line=2" in reason and "version=2" in reason
                assert _last_summary_version(kit, setup) == 1  # nothing of version 2, nothing after it
                _write_atomically(bad, "\n".join(good_lines) + "\n")  # the fix
                state["step"] = 2
        return state["step"] == 2 and _last_summary_version(kit, setup) >= 2

    _run_until(service, done, timeout_s=120)
    assert service.metrics.health()[1]["tables"][open_table(str(table)).uri]["status"] == "ok"
    _assert_exactly(setup.actions_records(), kit.events_output(table))


@pytest.mark.timeout(180)
def test_storage_errors_are_retried_and_never_skip_a_version(
    kafka_bootstrap: str, tmp_path: Path, kit: Any, watch_setup: Any
) -> None:
    import random

    import fsspec
    from fsspec.implementations.local import LocalFileSystem

    from deltamirror.producer.publishing.offline_events import iter_event_values

    class FlakyFileSystem(LocalFileSystem):
        """Local files where one call in ten times out (a listing counts as one call)."""

        protocol = "flakyfs"
        rng = random.Random(7)
        failures = 0
        listing = False

        @classmethod
        def _strip_protocol(cls, path: Any) -> Any:
            path = str(path)
            if path.startswith("flakyfs://"):
                path = path[len("flakyfs://") :]
            return super()._strip_protocol(path)

        def _maybe_fail(self) -> None:
            if not FlakyFileSystem.listing and FlakyFileSystem.rng.random() < 0.1:
                FlakyFileSystem.failures += 1
                raise TimeoutError("injected storage timeout")

        def info(self, path: Any, **kw: Any) -> Any:
            self._maybe_fail()
            return super().info(path, **kw)

        def ls(self, path: Any, detail: bool = False, **kw: Any) -> Any:
            self._maybe_fail()
            FlakyFileSystem.listing = True
            try:
                return super().ls(path, detail=detail, **kw)
            finally:
                FlakyFileSystem.listing = False

        def _open(self, path: Any, mode: str = "rb", **kw: Any) -> Any:
            self._maybe_fail()
            return super()._open(path, mode=mode, **kw)

        def cat_file(self, path: Any, start: Any = None, end: Any = None, **kw: Any) -> Any:
            self._maybe_fail()
            return super().cat_file(path, start=start, end=end, **kw)

    fsspec.register_implementation("flakyfs", FlakyFileSystem, clobber=True)
    table = kit.make_table(tmp_path / "t", versions=1)
    kit.write_versions(table, 1, 30, 20)
    uri = f"flakyfs://{table}"
    setup = watch_setup(kafka_bootstrap, table)
    cfg = setup.cfg()
    cfg = cfg.model_copy(update={"tables": [cfg.tables[0].model_copy(update={"uri": uri})]})
    service = WatchService(cfg)
    _run_until(service, lambda: _last_summary_version(kit, setup) >= 30, timeout_s=150)
    assert FlakyFileSystem.failures > 10
    FlakyFileSystem._maybe_fail = lambda self: None  # type: ignore[method-assign]
    expected = list(iter_event_values(uri))
    _assert_exactly(setup.actions_records(), expected)


@pytest.mark.timeout(120)
def test_commit_timestamps_the_topic_refuses_are_clamped_not_stalled(
    kafka_bootstrap: str, tmp_path: Path, kit: Any, watch_setup: Any
) -> None:
    from support.kafka import new_topic

    table = kit.make_table(tmp_path / "t", versions=3)
    log_dir = table / "_delta_log"
    old, future = 978_307_200, 4_102_444_800  # 2001-01-01 and 2100-01-01
    os.utime(log_dir / f"{0:020d}.json", (old, old))
    os.utime(log_dir / f"{2:020d}.json", (future, future))
    setup = watch_setup(kafka_bootstrap, table)
    limits = {"message.timestamp.before.max.ms": str(86_400_000), "message.timestamp.after.max.ms": "3600000"}
    for topic in (setup.actions, setup.commits):
        new_topic(kafka_bootstrap, topic, config=limits)
    service = WatchService(setup.cfg())
    _run_until(service, lambda: _last_summary_version(kit, setup) >= 2, timeout_s=60)
    now = time.time() * 1000
    by_version: dict[int, list[Any]] = {}
    for record in setup.actions_records():
        by_version.setdefault(record.json["version"], []).append(record)
    assert sorted(by_version) == [0, 1, 2]
    for record in by_version[0]:
        assert record.json["commitTimestamp"] == old * 1000
        assert record.headers["clampedFrom"] == str(old * 1000).encode()
        assert abs(record.timestamp - (now - 86_400_000)) < 600_000
    for record in by_version[1]:
        assert "clampedFrom" not in record.headers and record.timestamp == record.json["commitTimestamp"]
    for record in by_version[2]:
        assert record.json["commitTimestamp"] == future * 1000
        assert record.headers["clampedFrom"] == str(future * 1000).encode()
        assert abs(record.timestamp - now) < 600_000
    _assert_exactly(setup.actions_records(), kit.events_output(table))


@pytest.mark.timeout(120)
def test_a_record_over_the_size_limit_is_split_never_dropped(
    kafka_bootstrap: str, tmp_path: Path, kit: Any, watch_setup: Any
) -> None:
    import pyarrow as pa
    from deltalake import write_deltalake

    table = tmp_path / "wide"
    wide = pa.table({f"a_rather_long_column_name_{i:03d}": pa.array([i], pa.int64()) for i in range(60)})
    write_deltalake(str(table), wide)
    setup = watch_setup(kafka_bootstrap, table, max_record_bytes=1024)
    service = WatchService(setup.cfg())
    _run_until(service, lambda: _last_summary_version(kit, setup) >= 0, timeout_s=60)
    expected = kit.events_output(table)
    records = setup.actions_records()
    from deltamirror.mirror.records.fragments import FragmentAssembler

    assembler = FragmentAssembler()
    rebuilt: list[bytes] = []
    for record in records:
        assert len(record.value or b"") <= 1024
        whole = assembler.feed(record.value or b"", list(record.headers.items()))
        if whole is not None:
            rebuilt.append(whole)
    assert any("fragment" in r.headers for r in records)
    assert len(records) > len(expected)  # the metaData action did not fit
    assert rebuilt == expected


@pytest.mark.timeout(120)
def test_the_demo_prints_what_a_subscriber_receives(
    kafka_bootstrap: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from deltamirror.cli.main import main

    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", kafka_bootstrap)
    assert main(["demo", "--dir", str(tmp_path)]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("v")]
    # the demo table has the change data feed on: its UPDATE and DELETE carry a cdc file each
    assert [line.split()[0] for line in lines] == ["v0"] * 3 + ["v1"] * 2 + ["v2"] * 4 + ["v3"] * 4
    assert [line.split()[3] for line in lines if line.split()[3] == "cdc"] == ["cdc", "cdc"]
    assert "snapshot complete" in lines[2]
    assert any("UPDATE" in line for line in lines) and any("DELETE" in line for line in lines)


@pytest.mark.timeout(90)
def test_an_idle_table_gets_heartbeats_even_with_liveness_rewrites_in_between(
    kafka_bootstrap: str, tmp_path: Path, kit: Any, watch_setup: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The periodic progress re-write is not activity: heartbeats must still come at their interval."""
    from deltamirror.producer.publishing import transactions as service_module

    monkeypatch.setattr(service_module, "LIVENESS_INTERVAL_S", 0.3)  # re-writes far more often than beats
    table = kit.make_table(tmp_path / "t", versions=2)
    setup = watch_setup(kafka_bootstrap, table)
    cfg = _cfg(setup, heartbeat_interval_s=1.5)
    service = WatchService(cfg)

    def beats() -> list[dict[str, Any]]:
        records = kit.consume(setup.bootstrap, [setup.commits], idle_s=0.3, timeout_s=10)
        return [r.json for r in records if r.headers.get("kind") == b"heartbeat"]

    _run_until(service, lambda: len(beats()) >= 2, timeout_s=60)
    found = beats()
    assert all(
        b["latestVersion"] == 1 and b["tableUri"] == setup.cfg().tables[0].normalized_uri for b in found
    )
    progress = [r.json for r in setup.progress_records()]
    assert len(progress) > len(found)  # liveness re-writes did happen in between
