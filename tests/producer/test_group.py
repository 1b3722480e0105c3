"""A group of real ``deltamirror watch`` processes sharing tables through Kafka's group protocol.

Instances are SIGKILLed, SIGTERMed, SIGSTOPped past the session timeout and SIGCONTed, and a new
one joins, while every table gets commits; afterwards a read_committed reader must see every
version of every table exactly once, in order, on the actions, commits and progress topics. The
time until the tables of a departed instance publish again is measured and printed.

``make scale-test`` runs the same with 200 tables and the default session timeout
(``DELTAMIRROR_GROUP_TABLES``, ``DELTAMIRROR_GROUP_SESSION_MS``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from support import commits_reader

TABLES = int(os.environ.get("DELTAMIRROR_GROUP_TABLES", "20"))
SESSION_MS = int(os.environ.get("DELTAMIRROR_GROUP_SESSION_MS", "6000"))
#: what the group promises: a moved table publishes again within the session timeout + 10 s
RESUME_LIMIT_S = SESSION_MS / 1000 + 10
ADDS_PER_COMMIT = 2


class CommitsReader(commits_reader.CommitsReader):
    """The shared reader, whose wait fails the test when a topic stays behind."""

    def wait_all(self, version: int, timeout_s: float) -> float:  # type: ignore[override]
        took = super().wait_all(version, timeout_s)
        assert took is not None, f"not at version {version}: {self.behind(version)[:5]}"
        return took


def start(config: Path, log: Path) -> subprocess.Popen[bytes]:
    out = open(log, "ab")  # noqa: SIM115 (the child keeps it)
    return subprocess.Popen(
        [sys.executable, "-m", "deltamirror.cli.main", "watch", "--config", str(config)],
        stdout=out,
        stderr=out,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def log_lines(log: Path) -> list[dict[str, Any]]:
    lines = []
    for line in log.read_text().splitlines():
        try:
            lines.append(json.loads(line))
        except ValueError:
            continue
    return lines


def wait_for_line(
    log: Path, message: str, timeout_s: float, since: int = 0, **fields: Callable[[Any], bool]
) -> dict[str, Any]:
    """The first log line from line ``since`` on whose message starts with ``message`` (and whose
    ``fields`` pass their checks)."""
    deadline = time.monotonic() + timeout_s
    while True:
        for line in log_lines(log)[since:]:
            if str(line.get("msg", "")).startswith(message) and all(
                check(line.get(key)) for key, check in fields.items()
            ):
                return line
        assert time.monotonic() < deadline, f"no {message!r} in {log.name}:\n{log.read_text()[-3000:]}"
        time.sleep(0.2)


def commit_all(kit: Any, tables: list[Path], version: int) -> None:
    for table in tables:
        kit.write_versions(table, version, 1, ADDS_PER_COMMIT)


def expected_counts(table: Path) -> list[int]:
    """Actions per version, counted from the log's own lines (one action per line)."""
    log = table / "_delta_log"
    versions = sorted(int(p.name[:20]) for p in log.glob("*.json"))
    assert versions == list(range(len(versions)))
    return [len((log / f"{v:020d}.json").read_text().splitlines()) for v in versions]


@pytest.mark.kafka
@pytest.mark.timeout(600)
def test_a_group_moves_tables_exactly_once_through_kill_term_pause_and_join(
    kafka_bootstrap: str, tmp_path: Path, kit: Any
) -> None:
    run = uuid.uuid4().hex[:6]
    tables = [kit.make_table(tmp_path / f"g{run}_{i:03d}", versions=1) for i in range(TABLES)]
    actions = [f"deltamirror.g{run}_{i:03d}.actions" for i in range(TABLES)]
    commits = [f"deltamirror.g{run}_{i:03d}.commits" for i in range(TABLES)]
    progress = f"deltamirror.g{run}.progress"
    config = tmp_path / "group.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "kafka": {"bootstrap_servers": kafka_bootstrap},
                "tables": [
                    {
                        "uri": str(t),
                        "snapshot_mode": "from-version",
                        "from_version": 0,
                        "poll_interval_s": 0.2,
                    }
                    for t in tables
                ],
                "progress_topic": progress,
                "transactional_id_prefix": f"g{run}",
                "use_notifications": False,
                "group": {"name": f"g{run}", "shards": 32, "session_timeout_ms": SESSION_MS},
            }
        )
    )
    logs = {name: tmp_path / f"{name}.log" for name in "abcd"}
    procs: dict[str, subprocess.Popen[bytes]] = {}
    reader = CommitsReader(kafka_bootstrap, commits)
    times: dict[str, float] = {}
    try:
        for name in "abc":
            procs[name] = start(config, logs[name])
        reader.wait_all(0, 180)

        procs["a"].kill()  # SIGKILL: its tables move once the session times out
        procs["a"].wait(10)
        commit_all(kit, tables, 1)
        times["SIGKILL"] = reader.wait_all(1, RESUME_LIMIT_S + 30)

        procs["d"] = start(config, logs["d"])  # a new member: shards move to it cooperatively
        wait_for_line(logs["d"], "tables of the assigned shards resumed", 60, tables=lambda n: n > 0)
        commit_all(kit, tables, 2)
        times["join"] = reader.wait_all(2, 60)

        procs["b"].send_signal(signal.SIGTERM)  # leaves the group at once, transactions finished
        commit_all(kit, tables, 3)
        times["SIGTERM"] = reader.wait_all(3, RESUME_LIMIT_S + 30)
        assert procs["b"].wait(30) == 0, logs["b"].read_text()[-3000:]

        seen = len(log_lines(logs["c"]))
        procs["c"].send_signal(signal.SIGSTOP)  # a zombie: thrown out after the session timeout
        try:
            commit_all(kit, tables, 4)
            times["SIGSTOP"] = reader.wait_all(4, RESUME_LIMIT_S + 30)
        finally:
            procs["c"].send_signal(signal.SIGCONT)
        # its tables were taken over: its next commit is fenced and each table released, not fatal
        fenced = wait_for_line(logs["c"], "table released", 30, since=seen)
        assert fenced.get("reason") == "fenced", fenced
        assert "fenced" in fenced["msg"], fenced
        commit_all(kit, tables, 5)
        reader.wait_all(5, 60)
        assert procs["c"].poll() is None, "a fenced table must not stop the instance"
        for name in "cd":
            assert kit.stop_process(procs[name]) == 0, logs[name].read_text()[-3000:]
    finally:
        reader.close()
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
                proc.wait(10)
        print(
            f"\n{TABLES} tables, session timeout {SESSION_MS} ms: every table published again "
            + ", ".join(f"{k} {v:.1f} s" for k, v in times.items())
            + " after the event"
        )
    for event in ("SIGKILL", "SIGTERM", "SIGSTOP"):
        assert times[event] <= RESUME_LIMIT_S, times

    # exactly once, in order: actions (version, index) as the log has them, one summary per version
    records = kit.consume(kafka_bootstrap, [*actions, *commits, progress], idle_s=1.0, timeout_s=60)
    by_topic: dict[str, list[Any]] = {}
    for record in records:
        by_topic.setdefault(record.topic, []).append(record)
    final: dict[str, tuple[int, int]] = {}
    for table, act, com in zip(tables, actions, commits, strict=True):
        counts = expected_counts(table)
        events = [r.json for r in by_topic.get(act, [])]
        assert [(e["version"], e["index"]) for e in events] == [
            (v, i) for v, n in enumerate(counts) for i in range(n)
        ], table.name
        summaries = [r.json for r in by_topic.get(com, []) if r.headers.get("kind") == b"commit"]
        assert [s["version"] for s in summaries] == list(range(len(counts))), table.name
        final[events[0]["tableUri"]] = (len(counts) - 1, counts[-1] - 1)
    positions: dict[str, list[tuple[int, int]]] = {}
    for record in by_topic.get(progress, []):
        value = record.json
        positions.setdefault(value["tableUri"], []).append((value["version"], value["index"]))
    assert set(positions) == set(final)
    for uri, seen_positions in positions.items():
        assert seen_positions == sorted(seen_positions), uri  # never backwards: nothing published twice
        assert seen_positions[-1] == final[uri], uri


# --- the pieces -------------------------------------------------------------------------------------


def test_a_table_shard_is_kafkas_murmur2_partition_of_its_uri() -> None:
    from deltamirror.mirror.group import shard_of
    from deltamirror.mirror.topic_names import assignment_topic

    # Kafka's own test vectors (org.apache.kafka.common.utils.UtilsTest): murmur2("21") = -973932308
    assert shard_of("21", 64) == (-973932308 & 0x7FFFFFFF) % 64
    assert shard_of("abc", 7) == (479470107 & 0x7FFFFFFF) % 7
    assert assignment_topic("lake") == "deltamirror.lake.shards"


def test_group_settings_from_the_file_and_the_flag(tmp_path: Path) -> None:
    from deltamirror.core.errors import ConfigError
    from deltamirror.producer import load_config
    from deltamirror.producer.settings import merge_overrides

    path = tmp_path / "w.yaml"
    path.write_text("kafka: {bootstrap_servers: 'localhost:9092'}\ntables: [/data/t]\ngroup: lake\n")
    cfg = load_config(path, environ={})
    assert cfg.group is not None
    assert (cfg.group.name, cfg.group.shards, cfg.group.session_timeout_ms) == ("lake", 64, 10_000)
    path.write_text(
        "kafka: {bootstrap_servers: 'localhost:9092'}\ntables: [/data/t]\n"
        "group: {name: lake, shards: 8, session_timeout_ms: 6000}\n"
    )
    merged = merge_overrides(load_config(path, environ={}), {"group": "other"})
    assert merged.group is not None
    assert (merged.group.name, merged.group.shards, merged.group.session_timeout_ms) == ("other", 8, 6000)
    alone = merge_overrides(None, {"bootstrap_servers": "b:9092", "tables": ["/t"], "group": "g"})
    assert alone.group is not None and alone.group.shards == 64
    assert merge_overrides(None, {"bootstrap_servers": "b:9092", "tables": ["/t"]}).group is None
    with pytest.raises(ConfigError, match=r"group\.name"):
        merge_overrides(None, {"bootstrap_servers": "b:9092", "tables": ["/t"], "group": "no spaces"})
    path.write_text("kafka: {bootstrap_servers: 'b:1'}\ntables: [/t]\ngroup: {name: g, shards: 0}\n")
    with pytest.raises(ConfigError, match=r"group\.shards"):
        load_config(path, environ={})


def test_healthz_reports_the_group_state_and_forgets_a_table_that_moved() -> None:
    from deltamirror.producer.metrics import WatcherMetrics

    metrics = WatcherMetrics()
    metrics.set_healthy(True)
    metrics.published_version("file:///t", 3, 1000)
    metrics.group_status("dm-lake", "joined", 2, frozenset({3, 1}))
    ok, body = metrics.health()
    assert ok
    assert body["group"] == {"id": "dm-lake", "state": "joined", "assignments": 2, "ownedShards": [1, 3]}
    assert "file:///t" in body["tables"]
    metrics.table_released("file:///t", "revoked")
    metrics.shards_moved(assigned=2, revoked=1)
    metrics.group_status("dm-lake", "not joined", 2, frozenset())
    ok, body = metrics.health()
    assert not ok
    assert body["reason"] == "not joined to group dm-lake"
    assert body["tables"] == {}
    sample = metrics.registry.get_sample_value
    assert sample("deltamirror_group_shards_assigned_total") == 2
    assert sample("deltamirror_group_shards_revoked_total") == 1
    assert sample("deltamirror_group_tables_released_total", {"reason": "revoked"}) == 1
    assert sample("deltamirror_group_owned_shards") == 0
    assert sample("deltamirror_last_published_version", {"table": "file:///t"}) is None


@pytest.mark.kafka
def test_an_assignment_topic_with_another_shard_count_is_a_config_error(kafka_bootstrap: str) -> None:
    from deltamirror.core.errors import ConfigError
    from deltamirror.mirror.group import ShardGroup

    def group(shards: int) -> ShardGroup:
        return ShardGroup(
            {"bootstrap.servers": kafka_bootstrap},
            group_id="unused",
            topic=f"deltamirror.t{uuid.uuid4().hex[:8]}.shards",
            shards=shards,
            session_timeout_ms=6000,
            on_assign=lambda s: None,
            on_revoke=lambda s: None,
            on_lost=lambda s: None,
        )

    first = group(4)
    first.ensure_topic()
    first.ensure_topic()  # the same count: fine
    second = group(8)
    second.topic = first.topic
    with pytest.raises(ConfigError, match=r"has 4 partitions but group\.shards is 8"):
        second.ensure_topic()


@pytest.mark.kafka
@pytest.mark.timeout(120)
def test_tables_added_and_removed_while_a_group_member_runs(
    kafka_bootstrap: str, tmp_path: Path, kit: Any
) -> None:
    """The dynamic table set: a table added runs once its shard is here; a removed one stops."""
    from deltamirror.producer.service import WatchService
    from deltamirror.producer.settings import TableConfig, WatchConfig

    run = uuid.uuid4().hex[:6]
    first, second = (kit.make_table(tmp_path / f"d{run}_{i}", versions=1) for i in range(2))
    table = {"snapshot_mode": "from-version", "from_version": 0, "poll_interval_s": 0.2}
    cfg = WatchConfig.model_validate(
        {
            "kafka": {"bootstrap_servers": kafka_bootstrap},
            "tables": [{"uri": str(first), **table}],
            "progress_topic": f"deltamirror.d{run}.progress",
            "transactional_id_prefix": f"d{run}",
            "use_notifications": False,
            "group": {"name": f"d{run}", "shards": 4, "session_timeout_ms": 6000},
        }
    )
    service = WatchService(cfg)
    reader = CommitsReader(kafka_bootstrap, [f"deltamirror.d{run}_0.commits"])
    try:
        service.start()
        reader.wait_all(0, 60)
        added = TableConfig.model_validate({"uri": str(second), **table})
        service.add_table(added)
        service.add_table(added)  # idempotent
        assert service.running_tables() == {cfg.tables[0].normalized_uri, added.normalized_uri}
        reader.topics.append(f"deltamirror.d{run}_1.commits")
        reader.latest[reader.topics[-1]] = -1
        reader.wait_all(0, 60)
        service.remove_table(added.normalized_uri, reason="removed by the test")
        deadline = time.monotonic() + 30
        while added.normalized_uri in service.running_tables():
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert service.running_tables() == {cfg.tables[0].normalized_uri}
        assert service._failure is None
    finally:
        reader.close()
        service.request_stop()
        assert service.wait(30)
        service.close()
