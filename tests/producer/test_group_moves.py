"""Tables that move between the instances of a group behave as they do on one instance.

Real ``deltamirror watch --discover PREFIX --group G`` processes on the test broker. The first test
follows discovered tables through a table created and one dropped while two instances run, and
one instance stopped with SIGTERM. The second freezes the only owner of every table (SIGSTOP)
while the tables change under it (a table re-created, versions cleaned past what was published, a
new table), so that a standby instance takes them over after the session timeout: each case must
end as docs/events.md and docs/configuration.md describe it for one watcher (and as
tests/producer/test_kafka_watch.py and tests/producer/test_watcher.py check it), not as the group
code happens to do it.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml


def _sibling(name: str) -> Any:
    """A test module beside this one (no package here: loaded by path, never collected twice)."""
    spec = importlib.util.spec_from_file_location(f"_moves_{name}", Path(__file__).with_name(f"{name}.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


group_test = _sibling("test_group")
SESSION_MS = 6000  # the broker's smallest (group.min.session.timeout.ms)
RESUME_LIMIT_S = SESSION_MS / 1000 + 10  # what docs/scale-out.md promises


def watch(config: Path, log: Path, *args: str) -> subprocess.Popen[bytes]:
    out = open(log, "ab")  # noqa: SIM115 (the child keeps it)
    return subprocess.Popen(
        [sys.executable, "-m", "deltamirror.cli.main", "watch", "--config", str(config), *args],
        stdout=out,
        stderr=out,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def write_config(path: Path, bootstrap: str, run: str, discover: list[dict[str, Any]], **top: Any) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "kafka": {"bootstrap_servers": bootstrap},
                "tables": [],
                "discover": discover,
                "progress_topic": f"deltamirror.{run}.progress",
                "transactional_id_prefix": run,
                "use_notifications": False,
                **top,
            }
        )
    )
    return path


def prefix(uri: Path, name: str, mode: str = "initial") -> dict[str, Any]:
    return {"uri": str(uri), "name": name, "interval_s": 0.5, "snapshot_mode": mode, "poll_interval_s": 0.2}


def uri_of(table: Path) -> str:
    from deltamirror.core.storage import normalize_table_uri

    return normalize_table_uri(str(table))


def owners(logs: dict[str, Path], table: Path) -> list[str]:
    """The instances that started the table (one ``resuming table`` line each time)."""
    uri = uri_of(table)
    return [
        name
        for name, log in logs.items()
        for line in group_test.log_lines(log)
        if line.get("msg") == "resuming table" and line.get("table") == uri
    ]


def kinds(records: list[Any]) -> list[bytes]:
    return [r.headers.get("kind", b"") for r in records]


def summaries(records: list[Any]) -> list[dict[str, Any]]:
    return [r.json for r in records if r.headers.get("kind") == b"commit"]


def check_actions(table: Path, actions: list[Any], commits: list[Any]) -> None:
    """One snapshot at the first summarized version, then every later version of the log once, in order."""
    done = summaries(commits)
    assert done and done[0]["snapshot"] and not any(s["snapshot"] for s in done[1:]), table.name
    first = done[0]["version"]
    assert [s["version"] for s in done] == list(range(first, first + len(done))), table.name
    counts = group_test.expected_counts(table)
    expected = [(first, i, True) for i in range(done[0]["actionCount"])] + [
        (v, i, False) for v in range(first + 1, first + len(done)) for i in range(counts[v])
    ]
    events = [r.json for r in actions]
    assert [(e["version"], e["index"], e["snapshot"]) for e in events] == expected, table.name


@pytest.mark.kafka
@pytest.mark.timeout(240)
def test_discovered_tables_are_shared_created_dropped_and_moved_exactly_once(
    kafka_bootstrap: str, tmp_path: Path, kit: Any
) -> None:
    run = f"mv{uuid.uuid4().hex[:6]}"
    lake = tmp_path / "lake"
    tables = [kit.make_table(lake / f"t{i}", versions=1) for i in range(8)]
    config = write_config(
        tmp_path / "w.yaml",
        kafka_bootstrap,
        run,
        [prefix(lake, run)],
        group={"name": "unused", "shards": 16, "session_timeout_ms": SESSION_MS},
    )

    def commits_of(table: Path) -> str:
        return f"deltamirror.{run}.{table.name}.commits"

    logs = {name: tmp_path / f"{name}.log" for name in "ab"}
    procs = {name: watch(config, logs[name], "--discover", str(lake), "--group", run) for name in "ab"}
    reader = group_test.CommitsReader(kafka_bootstrap, [commits_of(t) for t in tables])
    times: dict[str, float] = {}
    try:
        times["start"] = reader.wait_all(0, 120)
        for name in "ab":  # both members hold shards (the second once the first gave some up)
            group_test.wait_for_line(logs[name], "shards assigned", 30, shards=lambda s: s != "[]")

        created = kit.make_table(lake / "t8", versions=1)  # found by a scan while both run
        tables.append(created)
        reader.topics.append(commits_of(created))
        reader.latest[commits_of(created)] = -1
        times["created"] = reader.wait_all(0, 30)
        created_owners = owners(logs, created)

        dropped = tables.pop(1)
        shutil.rmtree(dropped)
        reader.topics.remove(commits_of(dropped))
        del reader.latest[commits_of(dropped)]
        kit.consume(
            kafka_bootstrap,
            [commits_of(dropped)],
            until=lambda records: b"tableDropped" in kinds(records),
            timeout_s=30,
        )
        group_test.commit_all(kit, tables, 1)
        reader.wait_all(1, 30)

        procs["a"].send_signal(signal.SIGTERM)  # its tables move to b and keep publishing
        group_test.commit_all(kit, tables, 2)
        times["SIGTERM"] = reader.wait_all(2, RESUME_LIMIT_S)
        assert procs["a"].wait(30) == 0, logs["a"].read_text()[-3000:]
        group_test.commit_all(kit, tables, 3)
        reader.wait_all(3, 30)
        assert kit.stop_process(procs["b"]) == 0, logs["b"].read_text()[-3000:]
    finally:
        reader.close()
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        print("\ntwo members, discovered tables: " + ", ".join(f"{k} {v:.1f} s" for k, v in times.items()))

    assert len(created_owners) == 1, "a created table starts on exactly one member"
    topics = [
        f"deltamirror.{run}.{t.name}.{kind}" for t in [*tables, dropped] for kind in ("actions", "commits")
    ]
    records = kit.consume(kafka_bootstrap, [*topics, f"deltamirror.{run}.progress"], idle_s=1.0, timeout_s=60)
    by_topic: dict[str, list[Any]] = {}
    for record in records:
        by_topic.setdefault(record.topic, []).append(record)
    for table in tables:
        base = f"deltamirror.{run}.{table.name}"
        check_actions(table, by_topic[f"{base}.actions"], by_topic[f"{base}.commits"])
        assert [s["version"] for s in summaries(by_topic[f"{base}.commits"])] == [0, 1, 2, 3]
    gone = by_topic[f"deltamirror.{run}.{dropped.name}.commits"]
    assert kinds(gone) == [b"commit", b"tableDropped"], kinds(gone)  # once, and the last record
    positions: dict[str, list[tuple[int, int]]] = {}
    for record in by_topic[f"deltamirror.{run}.progress"]:
        if record.value:  # the dropped table's progress ends with a tombstone
            value = record.json
            positions.setdefault(value["tableUri"], []).append((value["version"], value["index"]))
    assert set(positions) == {uri_of(t) for t in [*tables, dropped]}
    for uri, seen in positions.items():
        assert seen == sorted(seen), uri  # never backwards: nothing published twice


@pytest.mark.kafka
@pytest.mark.timeout(240)
def test_a_moved_table_is_recreated_cleaned_heartbeats_and_snapshots_as_on_one_instance(
    kafka_bootstrap: str, tmp_path: Path, kit: Any
) -> None:
    from deltalake import DeltaTable

    from deltamirror.core.table import open_table

    run = f"mw{uuid.uuid4().hex[:6]}"
    initial, needed = tmp_path / "initial", tmp_path / "needed"
    recreated = kit.make_table(initial / "recreated", versions=2)
    gap = kit.make_table(initial / "gap", versions=2)
    idle = kit.make_table(initial / "idle", versions=1)
    gap_needed = kit.make_table(needed / "gap", versions=2)
    config = write_config(
        tmp_path / "w.yaml",
        kafka_bootstrap,
        run,
        [prefix(initial, f"{run}i"), prefix(needed, f"{run}n", "when-needed")],
        heartbeat_interval_s=1.0,
        # one shard: the first member owns every table, the second stands by until it is gone
        group={"name": "unused", "shards": 1, "session_timeout_ms": SESSION_MS},
    )

    def topic(table: Path, kind: str) -> str:
        name = f"{run}i" if table.parent == initial else f"{run}n"
        return f"deltamirror.{name}.{table.name}.{kind}"

    def commits(table: Path, **kw: Any) -> list[Any]:
        records: list[Any] = kit.consume(kafka_bootstrap, [topic(table, "commits")], **kw)
        return records

    logs = {name: tmp_path / f"{name}.log" for name in "ab"}
    procs: dict[str, subprocess.Popen[bytes]] = {}
    args = ("--discover", str(initial), "--discover", str(needed), "--group", run)
    old_id = open_table(str(recreated)).snapshot().metadata.id
    try:
        procs["a"] = watch(config, logs["a"], *args)
        for table, version in ((recreated, 1), (gap, 1), (idle, 0), (gap_needed, 1)):
            commits(
                table, until=lambda rs, v=version: v in [s["version"] for s in summaries(rs)], timeout_s=120
            )
        procs["b"] = watch(config, logs["b"], *args)
        group_test.wait_for_line(logs["b"], "joining group", 60)
        # b is a member holding no shard and has scanned the prefixes (waited for, not slept)
        for table in (recreated, gap, idle, gap_needed):
            group_test.wait_for_line(
                logs["b"], "discovery: new table", 60, table=lambda t, u=uri_of(table): t == u
            )

        procs["a"].send_signal(signal.SIGSTOP)  # the owner is frozen: it sees none of what follows
        frozen = time.time()
        shutil.rmtree(recreated)
        kit.make_table(recreated, versions=4)
        new_id = open_table(str(recreated)).snapshot().metadata.id
        for table in (gap, gap_needed):  # versions 2..4 written, checkpointed at 4, 0..3 cleaned
            for n in range(3):
                kit.append(table, start=100 + n)
            DeltaTable(str(table)).create_checkpoint()
            for v in range(4):
                (table / "_delta_log" / f"{v:020d}.json").unlink()
        created = kit.make_table(initial / "created", versions=2)  # no progress: first owned by b

        # (d) the new table: its snapshot, once
        group_test.wait_for_line(
            logs["b"], "tables of the assigned shards resumed", RESUME_LIMIT_S + 20, tables=lambda n: n >= 5
        )
        took = time.time() - frozen
        commits(created, until=lambda rs: any(s["snapshot"] for s in summaries(rs)), timeout_s=30)
        # (a) the re-created table: tableReplaced, then the new table's snapshot
        commits(recreated, until=lambda rs: any(s["tableId"] == new_id for s in summaries(rs)), timeout_s=30)
        # (b) cleaned past the position: when-needed snapshots again, the default mode stops the table
        commits(gap_needed, until=lambda rs: [s["version"] for s in summaries(rs)][-1:] == [4], timeout_s=30)
        stopped = group_test.wait_for_line(
            logs["b"],
            "table stopped: version 2 is no longer in the log",
            30,
            table=lambda t: t == uri_of(gap),
        )
        # (c) heartbeats from the new owner
        commits(
            idle,
            until=lambda rs: (
                sum(
                    1
                    for r in rs
                    if r.headers.get("kind") == b"heartbeat" and r.json["heartbeatTimestamp"] > frozen * 1000
                )
                >= 2
            ),
            timeout_s=30,
        )

        procs["a"].send_signal(signal.SIGCONT)  # a zombie now: fenced on every table it touches
        time.sleep(3)
        kit.append(created, start=200)  # still mirrored, by b
        commits(created, until=lambda rs: [s["version"] for s in summaries(rs)][-1:] == [2], timeout_s=30)
        for name in "ab":
            assert kit.stop_process(procs[name]) == 0, logs[name].read_text()[-3000:]
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
                proc.wait(10)
    print(f"\none owner frozen, its standby published the moved tables {took:.1f} s later")

    # (a) as test_a_recreated_table_is_announced_and_mirrored_as_new checks it on one instance
    records = commits(recreated, idle_s=1.0)
    replaced = [r.json for r in records if r.headers["kind"] == b"tableReplaced"]
    assert len(replaced) == 1, replaced
    assert (replaced[0]["previousTableId"], replaced[0]["tableId"], replaced[0]["previousVersion"]) == (
        old_id,
        new_id,
        1,
    )
    assert [(s["tableId"], s["version"], s["snapshot"]) for s in summaries(records)] == [
        (old_id, 1, True),
        (new_id, 3, True),
    ]
    assert [k for k in kinds(records) if k != b"heartbeat"] == [b"commit", b"tableReplaced", b"commit"]
    events = [r.json for r in kit.consume(kafka_bootstrap, [topic(recreated, "actions")], idle_s=1.0)]
    ids = [e["tableId"] for e in events]
    assert ids == [old_id] * ids.count(old_id) + [new_id] * ids.count(new_id)
    new_events = [e for e in events if e["tableId"] == new_id]
    assert new_events[0]["snapshot"] and new_events[-1]["snapshotEnd"] and new_events[0]["version"] == 3
    assert [e["index"] for e in new_events] == list(range(len(new_events)))

    # (b) when-needed: a new snapshot at the checkpoint, no re-creation; the default: nothing more
    needed_records = commits(gap_needed, idle_s=1.0)
    assert [(s["version"], s["snapshot"]) for s in summaries(needed_records)] == [(1, True), (4, True)]
    assert b"tableReplaced" not in kinds(needed_records)
    assert [(s["version"], s["snapshot"]) for s in summaries(commits(gap, idle_s=1.0))] == [(1, True)]
    assert stopped["level"] == "error" and "when-needed" in stopped["msg"], stopped

    # (c) the heartbeats name the table's position, as on one instance
    beats = [r.json for r in commits(idle, idle_s=1.0) if r.headers.get("kind") == b"heartbeat"]
    assert all(b["latestVersion"] == 0 and b["tableUri"] == uri_of(idle) for b in beats)

    # (d) one snapshot of the new table, then its next version, all by the standby
    created_records = commits(created, idle_s=1.0)
    assert [(s["version"], s["snapshot"]) for s in summaries(created_records)] == [(1, True), (2, False)]
    assert "b" in owners(logs, created)  # (a zombie may start it too, before it learns: fenced)
    check_actions(
        created,
        kit.consume(kafka_bootstrap, [topic(created, "actions")], idle_s=1.0),
        created_records,
    )


@pytest.mark.kafka
@pytest.mark.timeout(120)
def test_a_table_fenced_while_its_shard_is_still_here_is_started_again(
    kafka_bootstrap: str, tmp_path: Path, kit: Any
) -> None:
    """A zombie that wakes up may start a table it just discovered before it learns that it lost
    the shard: its producer fences the owner's. The owner still holds the shard, so the table must
    run there again (the group's assignment decides), not stay unmirrored until the next rebalance."""
    from deltamirror.mirror.kafka.producer import TransactionalPublisher
    from deltamirror.producer.service import WatchService
    from deltamirror.producer.settings import WatchConfig

    run = f"mz{uuid.uuid4().hex[:6]}"
    table = kit.make_table(tmp_path / run, versions=1)
    cfg = WatchConfig.model_validate(
        {
            "kafka": {"bootstrap_servers": kafka_bootstrap},
            "tables": [
                {
                    "uri": str(table),
                    "snapshot_mode": "from-version",
                    "from_version": 0,
                    "poll_interval_s": 0.2,
                }
            ],
            "progress_topic": f"deltamirror.{run}.progress",
            "transactional_id_prefix": run,
            "use_notifications": False,
            "group": {"name": run, "shards": 1, "session_timeout_ms": SESSION_MS},
        }
    )
    service = WatchService(cfg)
    commits = f"deltamirror.{run}.commits"

    def published(version: int) -> None:
        kit.consume(
            kafka_bootstrap,
            [commits],
            until=lambda rs: any(
                r.json.get("version") == version and r.json.get("tableUri") == uri_of(table) for r in rs
            ),
            timeout_s=45,
        )

    try:
        service.start()
        published(0)
        (pipeline,) = service.pipelines
        zombie = TransactionalPublisher(cfg.kafka.librdkafka_config(), pipeline.txn_id)
        zombie.init()  # what a zombie's new pipeline of the table does first
        zombie.close(5.0)
        kit.write_versions(table, 1, 1, 2)  # the owner's next transaction is fenced
        published(1)
        assert service.running_tables() == {uri_of(table)}
        assert service._failure is None
    finally:
        service.request_stop()
        assert service.wait(30)
        service.close()
