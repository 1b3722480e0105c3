"""The incremental snapshot against core's own replay, and the snapshot consumer against a real broker."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from deltamirror.consumer.snapshot import IncrementalSnapshot, Invalidation, SnapshotConsumer, parse_event
from deltamirror.core.errors import EventStreamError
from deltamirror.core.events import ActionEvent
from deltamirror.core.replay import file_keys
from deltamirror.core.table import open_table
from deltamirror.producer.service import encoder_for, iter_event_values
from deltamirror.producer.snapshot_events import SnapshotWork
from support.tables import TABLES, copy_table

# tables whose log starts at version 0: updates, DVs, re-added files, canonicalized paths, partitions,
# txns, domain metadata, checkpoints in between
TABLES_FROM_ZERO = [
    "golden__basic-with-inserts-updates",
    "golden__log-replay-dv-key-cases",
    "golden__delete-re-add-same-file-different-transactions",
    "golden__canonicalized-paths-normal-a",
    "golden__basic-with-inserts-deletes-checkpoint",
    "krs__table-with-dv-small",
    "krs__app-txn-no-checkpoint",
    "krs__cdf-table-partitioned",
    "krs__crc-full",
]


def _core_keys(files: pa.Table) -> set[tuple[str, str]]:
    keys = file_keys(files["path"], files["deletionVector"]).to_pylist()
    return {tuple(k.split("\x00", 1)) for k in keys}  # type: ignore[misc]


def _rows_by_key(files: pa.Table) -> dict[tuple[str, str], dict[str, Any]]:
    keys = [tuple(k.split("\x00", 1)) for k in file_keys(files["path"], files["deletionVector"]).to_pylist()]
    cols = ["size", "partitionValues", "deletionVector"]
    rows = files.select(cols).to_pylist()
    for row in rows:
        row["partitionValues"] = dict(row["partitionValues"] or [])
    return dict(zip(keys, rows, strict=True))  # type: ignore[arg-type]


def _by_version(values: list[bytes]) -> dict[int, list[bytes]]:
    out: dict[int, list[bytes]] = defaultdict(list)
    for value in values:
        out[json.loads(value)["version"]].append(value)
    return out


def _assert_matches_core(state: IncrementalSnapshot, table: Any, version: int) -> None:
    snap = table.snapshot(version, check_features=False)
    assert state.version == version
    assert state.file_keys == _core_keys(snap.files), f"files differ at version {version}"
    assert _rows_by_key(state.files) == _rows_by_key(snap.files), f"file rows differ at version {version}"
    assert state.metadata is not None and state.metadata["id"] == snap.metadata.id
    assert state.protocol is not None
    assert state.protocol["minReaderVersion"] == snap.protocol.min_reader_version
    assert {a: t["version"] for a, t in state.txns.items()} == {a: t.version for a, t in snap.txns.items()}
    assert set(state.domains) == set(snap.domains)


@pytest.mark.parametrize("table_id", TABLES_FROM_ZERO)
def test_applying_every_version_gives_cores_snapshot_at_each_version(table_id: str) -> None:
    table = open_table(str(TABLES / table_id))
    values = list(iter_event_values(str(TABLES / table_id)))
    versions = _by_version(values)
    assert min(versions) == 0
    state = IncrementalSnapshot(json.loads(values[0])["tableId"])
    for version in sorted(versions):
        *head, last = versions[version]
        assert state.apply_values(head) == []  # nothing changes before the last action
        (applied,) = state.apply_values([last])
        assert applied.version == version and not applied.snapshot
        assert applied.files == state.file_count
        _assert_matches_core(state, table, version)
    assert state.complete
    assert len(state.invalidations()) == len(versions)
    assert state.invalidations() == []


def test_invalidations_name_the_files_added_and_removed_with_their_partitions() -> None:
    table = open_table(str(TABLES / "krs__cdf-table-partitioned"))
    values = list(iter_event_values(table.uri))
    state = IncrementalSnapshot(json.loads(values[0])["tableId"])
    state.apply_values(values)
    for inv in state.invalidations():
        actions = [json.loads(v) for v in values if json.loads(v)["version"] == inv.version]
        adds = {a["action"]["path"] for a in actions if a["type"] == "add"}
        removes = {a["action"]["path"] for a in actions if a["type"] == "remove"}
        assert set(inv.added) == adds
        assert set(inv.removed) == removes - adds
        touched = [a["action"]["partitionValues"] for a in actions if a["type"] in ("add", "remove")]
        assert sorted(map(json.dumps, inv.partitions)) == sorted(
            {json.dumps(p, sort_keys=True) for p in touched}
        )


def _snapshot_values(path: Path | str, version: int) -> list[bytes]:
    """The snapshot events the watcher publishes for ``version`` (its own classes, no Kafka)."""
    snap = open_table(str(path)).snapshot(version, check_features=False)
    work = SnapshotWork(snap, open_table(str(path)).uri, snap.timestamp)
    encoder = encoder_for(work)
    out: list[bytes] = []
    for batch in work.batches(1000):
        out.extend(encoder.encode_many(len(out), batch))
    return out


@pytest.mark.parametrize(
    "table_id",
    [
        "golden__basic-with-inserts-deletes-checkpoint",
        "krs__table-with-dv-small",
        "krs__cdf-table-partitioned",
    ],
)
def test_a_snapshot_replaces_the_state_and_tailing_continues_after_it(table_id: str) -> None:
    path = TABLES / table_id
    table = open_table(str(path))
    latest = table.latest_version()
    start = max(1, latest - 2)  # after version 0, which is applied first
    state = IncrementalSnapshot(table.snapshot(check_features=False).metadata.id)
    # an unrelated partial state first: the snapshot must replace it, not merge
    first = list(iter_event_values(str(path), ending_version=0))
    state.apply_values(first)
    snapshot = _snapshot_values(path, start)
    assert state.apply_values(snapshot[:-1]) == []
    assert state.version == 0  # incomplete snapshot: nothing applied yet
    (applied,) = state.apply_values(snapshot[-1:])
    assert applied.snapshot and applied.version == start
    _assert_matches_core(state, table, start)
    gone = _core_keys(table.snapshot(0, check_features=False).files) - state.file_keys
    assert sorted(applied.removed) == sorted(p for p, _ in gone)
    tail = list(iter_event_values(str(path), starting_version=start + 1)) if start < latest else []
    for version, vals in sorted(_by_version(tail).items()):
        state.apply_values(vals)
        _assert_matches_core(state, table, version)


def test_a_snapshot_supersedes_an_unfinished_version() -> None:
    path = TABLES / "golden__basic-with-inserts-updates"
    values = list(iter_event_values(str(path)))
    v0 = _by_version(values)[0]
    v1 = _by_version(values)[1]
    state = IncrementalSnapshot(json.loads(values[0])["tableId"])
    state.apply_values(v0)
    state.apply_values(v1[:1])  # version 1 interrupted
    state.apply_values(_snapshot_values(path, 1))
    assert not state.in_progress
    _assert_matches_core(state, open_table(str(path)), 1)


def test_versions_already_applied_are_skipped_and_gaps_and_disorder_are_errors() -> None:
    path = TABLES / "golden__log-replay-dv-key-cases"
    versions = _by_version(list(iter_event_values(str(path))))
    table_id = json.loads(versions[0][0])["tableId"]
    state = IncrementalSnapshot(table_id)
    state.apply_values(versions[0])
    assert state.apply_values(versions[0]) == []  # a re-read after a restart
    assert state.skipped_events == len(versions[0])
    with pytest.raises(EventStreamError, match="versions are missing"):
        IncrementalSnapshot(table_id).apply_values([*versions[0], *versions[2]])
    assert len(versions[1]) > 2
    with pytest.raises(EventStreamError, match="arrived after action 0"):
        IncrementalSnapshot(table_id).apply_values([*versions[0], versions[1][0], versions[1][2]])
    with pytest.raises(EventStreamError, match="without the actions"):
        IncrementalSnapshot(table_id).apply_values([*versions[0], versions[1][-1]])
    with pytest.raises(EventStreamError, match="starts while version 1 is incomplete"):
        IncrementalSnapshot(table_id).apply_values([*versions[0], versions[1][0], versions[2][0]])
    with pytest.raises(EventStreamError, match="not an action event"):
        parse_event(b'{"tableId": "x"}')


def test_state_round_trips_through_json() -> None:
    path = TABLES / "golden__log-replay-dv-key-cases"
    values = list(iter_event_values(str(path)))
    state = IncrementalSnapshot(json.loads(values[0])["tableId"])
    state.apply_values(values)
    again = IncrementalSnapshot.from_json(json.loads(json.dumps(state.to_json())))
    assert again.version == state.version and again.complete
    assert again.files.equals(state.files)
    assert again.metadata == state.metadata and again.txns == state.txns


# --- against a real broker ----------------------------------------------------------------------


def _watch(bootstrap: str, table: Path, actions: str, until_version: int, prefix: str) -> None:
    """Run the watcher in-process (snapshot first) until ``until_version`` is published."""
    from deltamirror.producer.config import WatchConfig
    from deltamirror.producer.service import WatchService

    cfg = WatchConfig.model_validate(
        {
            "kafka": {"bootstrap_servers": bootstrap},
            "tables": [
                {
                    "uri": str(table),
                    "snapshot_mode": "initial",
                    "actions_topic": actions,
                    "commits_topic": actions.replace(".actions", ".commits"),
                    "poll_interval_s": 0.2,
                }
            ],
            "progress_topic": actions.replace(".actions", ".progress"),
            "transactional_id_prefix": prefix,
        }
    )
    service = WatchService(cfg)
    service.start()
    deadline = time.monotonic() + 40
    try:
        while _published_version(bootstrap, cfg.tables[0].commits_topic or "") < until_version:
            assert time.monotonic() < deadline, "the watcher did not publish in time"
            assert service._failure is None, service._failure
            time.sleep(0.3)
    finally:
        service.request_stop()
        assert service.wait(30)
        service.close()


def _published_version(bootstrap: str, commits: str) -> int:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"t-{uuid.uuid4().hex[:8]}",
            "isolation.level": "read_committed",
        }
    )
    try:
        if commits not in consumer.list_topics(timeout=10).topics:
            return -1
        consumer.assign([TopicPartition(commits, 0, -2)])
        best = -1
        while msgs := consumer.consume(500, timeout=1.0):
            for m in msgs:
                if m.error() is None and (m.value() or b"").startswith(b'{"kind":"commit"'):
                    best = max(best, json.loads(m.value() or b"{}")["version"])
        return best
    finally:
        consumer.close()


def _consume_once(bootstrap: str, topic: str, state_dir: Path) -> list[dict[str, Any]]:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "deltamirror.cli.main",
            "consume-snapshot",
            "--bootstrap-servers",
            bootstrap,
            "--topic",
            topic,
            "--state-dir",
            str(state_dir),
            "--once",
        ],
        capture_output=True,
        timeout=40,
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line]


@pytest.mark.kafka
@pytest.mark.timeout(120)
def test_consumer_follows_the_watcher_and_resumes_from_its_state_dir(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    from deltalake import write_deltalake

    table = copy_table("golden__basic-with-inserts-updates", tmp_path)
    name = f"dmsc-{uuid.uuid4().hex[:10]}"
    actions = f"{name}.actions"
    state_dir = tmp_path / "state"
    core = open_table(str(table))
    latest = core.latest_version()
    _watch(kafka_bootstrap, table, actions, latest, name)

    lines = _consume_once(kafka_bootstrap, actions, state_dir)
    assert [(line["version"], line["snapshot"]) for line in lines] == [(latest, True)]
    assert lines[0]["files"] == core.snapshot(latest).files.num_rows
    persisted = IncrementalSnapshot.from_json(
        json.loads(next((state_dir / "tables").glob("*.json")).read_text())
    )
    assert persisted.file_keys == _core_keys(core.snapshot(latest).files)

    # another commit (delta-rs writes to the copied table), published, then the same state dir
    write_deltalake(str(table), open_table(str(table)).snapshot(latest).to_arrow().slice(0, 3), mode="append")
    _watch(kafka_bootstrap, table, actions, latest + 1, name)
    lines = _consume_once(kafka_bootstrap, actions, state_dir)
    after = open_table(str(table)).snapshot(latest + 1)
    assert lines == [
        {
            "tableId": after.metadata.id,
            "version": latest + 1,
            "files": after.files.num_rows,
            "added": 1,
            "removed": 0,
            "snapshot": False,
        }
    ]

    # the library API, from scratch (no state dir): the whole topic gives the same state
    seen: list[Invalidation] = []
    consumer = SnapshotConsumer(kafka_bootstrap, actions, on_applied=lambda inv, _: seen.append(inv))
    consumer.run(once=True)
    assert [(i.version, i.snapshot) for i in seen] == [(latest, True), (latest + 1, False)]
    (state,) = consumer.tables.values()
    assert state.file_keys == _core_keys(after.files) and state.complete
    assert _consume_once(kafka_bootstrap, actions, state_dir) == []  # nothing new: nothing applied


def test_events_model_is_the_contract() -> None:
    """parse_event accepts exactly what the encoder writes (guards a drift between the two)."""
    value = next(iter(iter_event_values(str(TABLES / "golden__basic-with-inserts-updates"))))
    assert parse_event(value) == ActionEvent.model_validate_json(value)
