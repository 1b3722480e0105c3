"""Row changes through the real broker: what a read_committed consumer sees, unpaired back into
change rows, equals delta-spark's readChangeFeed and core's change feed; keys, partitions, pairing,
and a kill -9 in the middle of a version's rows."""

from __future__ import annotations

import base64
import json
import os
import signal
import uuid
from collections import Counter
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from deltamirror.core.changes import read_changes
from deltamirror.core.table import open_table
from deltamirror.mirror.topics import murmur2_partition
from support.spark import spark  # noqa: F401
from support.spark_scenarios import (
    normalize_cdf_rows,
    scenario_column_mapping_add_column,
    scenario_delete_dv,
    scenario_merge,
    scenario_merge_dv,
    scenario_update_dv,
    spark_cdf,
)
from support.watching import watch_row_changes, watch_until

pytestmark = [pytest.mark.kafka]

PARTITIONS = 3


def _topics(bootstrap: str, partitions: int = PARTITIONS) -> tuple[str, str, str]:
    """Fresh actions / changes / transaction topic names; the changes topic made with ``partitions``."""
    from confluent_kafka.admin import AdminClient, NewTopic

    name = f"rc-{uuid.uuid4().hex[:10]}"
    changes = f"{name}.changes"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(changes, num_partitions=partitions, replication_factor=1)])[changes].result(
        30
    )
    return f"{name}.actions", changes, f"{name}.transaction"


@dataclass
class _Plain:
    value: bytes | None


def _decoded_decimals(value: dict[str, Any]) -> dict[str, Any]:
    """A json-schema value's payload, its Connect Decimals (base64 unscaled, scale in the schema) as text."""
    payload = value["payload"]
    row_schema = next(f for f in value["schema"]["fields"] if f["field"] == "after")
    for field in row_schema["fields"]:
        if field.get("name") != "org.apache.kafka.connect.data.Decimal":
            continue
        scale = int(field["parameters"]["scale"])
        for image in (payload["before"], payload["after"]):
            if image is not None and image[field["field"]] is not None:
                unscaled = int.from_bytes(base64.b64decode(image[field["field"]]), "big", signed=True)
                image[field["field"]] = str(Decimal(unscaled).scaleb(-scale))
    return payload  # type: ignore[no-any-return]


def _unpaired(records: list[Any]) -> list[dict[str, Any]]:
    """Change records back into change-feed rows (a "u" gives its pre- and post-image)."""
    rows: list[dict[str, Any]] = []
    for r in records:
        if r.value is None:
            continue
        event = json.loads(r.value)
        meta = {
            "_commit_version": event["source"]["delta_version"],
            "_commit_timestamp": event["ts_ms"] * 1000,
        }
        op = event["op"]
        if op == "u":
            rows.append({**event["before"], "_change_type": "update_preimage", **meta})
            rows.append({**event["after"], "_change_type": "update_postimage", **meta})
        elif op == "d":
            rows.append({**event["before"], "_change_type": "delete", **meta})
        else:
            rows.append({**event["after"], "_change_type": "insert", **meta})
    columns = {c for row in rows for c in row}
    return [{c: row.get(c) for c in columns} for row in rows]  # a column added later: null before


def _core_rows(path: str, end: int) -> list[dict[str, Any]]:
    rows = read_changes(open_table(path), starting_version=0, ending_version=end).to_arrow().to_pylist()
    return normalize_cdf_rows(rows)


@pytest.mark.spark
@pytest.mark.timeout(300)
def test_records_equal_delta_spark_change_feed_keys_and_partitions(
    kafka_bootstrap: str,
    tmp_path: Path,
    kit: Any,
    spark: Any,  # noqa: F811
) -> None:
    # updates and deletes by deletion vectors, MERGE, column mapping with an added column
    for make in (scenario_update_dv, scenario_delete_dv, scenario_merge, scenario_column_mapping_add_column):
        scenario = make(spark, str(tmp_path / make.__name__))
        end = open_table(scenario.path).latest_version()
        expected = spark_cdf(spark, scenario.path, 0, end)  # from version 0: one timestamp rule
        actions, changes, txn = _topics(kafka_bootstrap)
        # the topics this test reads: the changes (keys, partitions) and the transaction topic
        watch_row_changes(
            kafka_bootstrap,
            scenario.path,
            actions,
            end,
            {"key_columns": ["id"]},
            changes_topic=changes,
            transaction_topic=txn,
        )
        records = kit.consume(kafka_bootstrap, [changes], idle_s=0.5)
        got = normalize_cdf_rows(_unpaired(records))
        assert got and got == expected, scenario.name
        assert got == _core_rows(scenario.path, end)
        # keyed by the configured key, placed by Kafka's default partitioner
        for r in records:
            event = json.loads(r.value) if r.value else None
            image = (event["after"] or event["before"]) if event else None
            assert json.loads(r.key) == {"id": image["id"]}
            assert r.partition == murmur2_partition(r.key, PARTITIONS)
            assert r.timestamp == event["ts_ms"]
        # an update is one "u" record, paired by key: MERGE updated ids 6-8
        if make is scenario_merge:
            merge = scenario.marks["merge"]
            ops = Counter(
                json.loads(r.value)["op"]
                for r in records
                if json.loads(r.value)["source"]["delta_version"] == merge
            )
            assert ops == {"d": 3, "u": 3, "c": 4}
        # the transaction topic: BEGIN and END per version with rows, END counting the version's events
        per_version = Counter(json.loads(r.value)["source"]["delta_version"] for r in records)
        txns = [json.loads(r.value) for r in kit.consume(kafka_bootstrap, [txn], idle_s=0.3)]
        ends = {t["id"]: t for t in txns if t["status"] == "END"}
        assert [t["status"] for t in txns] == ["BEGIN", "END"] * len(per_version)
        for version, n in per_version.items():
            (end_record,) = [e for tid, e in ends.items() if tid.endswith(f":{version}")]
            assert end_record["event_count"] == n
            assert end_record["data_collections"] == [{"data_collection": changes, "event_count": n}]


@pytest.mark.spark
@pytest.mark.timeout(200)
def test_without_a_key_updates_are_a_delete_and_an_insert_and_the_key_is_the_row(
    kafka_bootstrap: str,
    tmp_path: Path,
    kit: Any,
    spark: Any,  # noqa: F811
) -> None:
    scenario = scenario_merge_dv(spark, str(tmp_path / "merge_dv"))  # deletion vectors, this time
    end = open_table(scenario.path).latest_version()
    unpaired = {"update_preimage": "delete", "update_postimage": "insert"}
    expected = [
        {**row, "_change_type": unpaired.get(row["_change_type"], row["_change_type"])}
        for row in spark_cdf(spark, scenario.path, 0, end)
    ]
    actions, changes, _ = _topics(kafka_bootstrap)
    watch_row_changes(
        kafka_bootstrap, scenario.path, actions, end, {"format": "json-schema", "tombstones": True}
    )
    records = kit.consume(kafka_bootstrap, [changes], idle_s=0.5)
    events = [_decoded_decimals(json.loads(r.value)) for r in records if r.value is not None]
    as_plain = [_Plain(json.dumps(e).encode()) for e in events]
    assert normalize_cdf_rows(_unpaired(as_plain)) == normalize_cdf_rows(expected)
    assert all(e["op"] != "u" for e in events)
    merge = [e for e in events if e["source"]["delta_version"] == scenario.marks["merge"]]
    assert Counter(e["op"] for e in merge) == {"d": 6, "c": 7}  # 3 deletes, 3 updates as d + c, 4 inserts
    tombstones = [r for r in records if r.value is None]
    assert len(tombstones) == sum(e["op"] == "d" for e in events)
    for r in records:
        if r.value is None:
            continue
        event = json.loads(r.value)["payload"]
        assert json.loads(r.key)["payload"] == (event["after"] or event["before"])
        assert r.partition == murmur2_partition(r.key, PARTITIONS)


def _cdf_table(path: Path, rows: int) -> None:
    import pyarrow as pa
    from deltalake import write_deltalake

    data = pa.table(
        {"id": pa.array(range(rows), pa.int64()), "name": pa.array([f"n{i}" for i in range(rows)])}
    )
    write_deltalake(str(path), data, configuration={"delta.enableChangeDataFeed": "true"})


def kill_9_mid_version(setup: Any, kit: Any, bootstrap: str, changes: str, rows: int, log: Path) -> None:
    """Start the watcher and SIGKILL it once the version's rows are partly out: a committed progress
    record says so (``rowOffset``) and a committed row change is there (a progress record alone may
    count only the transaction's BEGIN record)."""
    proc = setup.start_process(log=log)
    try:
        kit.consume(
            bootstrap,
            [setup.progress],
            until=lambda out: any("rowOffset" in (r.json or {}) for r in out),
            timeout_s=90,
        )
        kit.consume(bootstrap, [changes], until=lambda out: len(out) > 0, timeout_s=90)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    at_kill = len(kit.consume(bootstrap, [changes], idle_s=0.3))
    assert 0 < at_kill < rows, "the kill did not land in the middle of the version's rows"


def _rows_from(version: int, changes: str, txn: str, row_changes: dict[str, Any]) -> dict[str, Any]:
    """A table's settings: mirrored from ``version`` with these row changes on these topics."""
    return {
        "snapshot_mode": "from-version",
        "from_version": version,
        "changes_topic": changes,
        "transaction_topic": txn,
        "row_changes": row_changes,
    }


def run_until_the_version_is_out(setup: Any, kit: Any, bootstrap: str, log: Path) -> None:
    """Start the watcher again, until the version's commit summary is out; stop it (exit 0)."""
    proc = setup.start_process(log=log)
    try:
        kit.consume(
            bootstrap,
            [setup.commits],
            until=lambda out: any(r.headers.get("kind") == b"commit" for r in out),
            timeout_s=120,
        )
    finally:
        assert kit.stop_process(proc) == 0


@pytest.mark.timeout(240)
def test_kill_9_in_the_middle_of_a_versions_rows_leaves_each_row_once(
    kafka_bootstrap: str, tmp_path: Path, kit: Any, watch_setup: Any
) -> None:
    rows = 10_000
    table = tmp_path / "big"
    _cdf_table(table, rows)
    _, changes, txn = _topics(kafka_bootstrap, 1)
    setup = watch_setup(
        kafka_bootstrap,
        table,
        table_settings=_rows_from(0, changes, txn, {"key_columns": ["id"]}),
        txn_max_records=25,
    )
    kill_9_mid_version(setup, kit, kafka_bootstrap, changes, rows, tmp_path / "watch.log")
    run_until_the_version_is_out(setup, kit, kafka_bootstrap, tmp_path / "watch.log")
    records = kit.consume(kafka_bootstrap, [changes], idle_s=0.5)
    ids = [json.loads(r.value)["after"]["id"] for r in records]
    assert sorted(ids) == list(range(rows))  # each row once
    assert [json.loads(r.value)["source"]["index"] for r in records] == list(range(rows))
    txns = [json.loads(r.value) for r in kit.consume(kafka_bootstrap, [txn], idle_s=0.3)]
    assert [(t["status"], t["event_count"]) for t in txns] == [("BEGIN", None), ("END", rows)]


@pytest.mark.timeout(240)
def test_kill_9_while_updates_are_paired_through_spill_buckets_leaves_each_row_once(
    kafka_bootstrap: str, tmp_path: Path, kit: Any, watch_setup: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from deltalake import DeltaTable

    rows = 10_000
    table = tmp_path / "updated"
    _cdf_table(table, rows)
    DeltaTable(str(table)).update(updates={"name": "'changed'"})  # post-images first, then pre-images
    spill = tmp_path / "spill"
    spill.mkdir()
    monkeypatch.setenv("TMPDIR", str(spill))  # the watcher's temporary directory
    _, changes, txn = _topics(kafka_bootstrap, 1)
    setup = watch_setup(
        kafka_bootstrap,
        table,
        # 1 MiB: the version's 20,000 update images go through several buckets on disk
        table_settings=_rows_from(1, changes, txn, {"key_columns": ["id"], "pairing_memory_mb": 1}),
        txn_max_records=25,
    )
    kill_9_mid_version(setup, kit, kafka_bootstrap, changes, rows, tmp_path / "watch.log")
    left_by_the_kill = sorted(os.listdir(spill))
    assert left_by_the_kill, "the killed watcher was not pairing through spill files"
    run_until_the_version_is_out(setup, kit, kafka_bootstrap, tmp_path / "watch.log")
    assert sorted(os.listdir(spill)) == left_by_the_kill  # the restart's own spill files are gone
    events = [json.loads(r.value) for r in kit.consume(kafka_bootstrap, [changes], idle_s=0.5)]
    assert [e["source"]["index"] for e in events] == list(range(rows))
    assert {e["op"] for e in events} == {"u"}
    assert sorted(e["after"]["id"] for e in events) == list(range(rows))  # each row once
    assert all(e["before"] == {"id": e["after"]["id"], "name": f"n{e['after']['id']}"} for e in events)
    assert {e["after"]["name"] for e in events} == {"changed"}
    txns = [json.loads(r.value) for r in kit.consume(kafka_bootstrap, [txn], idle_s=0.3)]
    assert [(t["status"], t["event_count"]) for t in txns] == [("BEGIN", None), ("END", rows)]


@pytest.mark.timeout(120)
def test_initial_snapshot_rows_are_read_events_then_the_versions_after_it(
    kafka_bootstrap: str, tmp_path: Path, kit: Any
) -> None:
    table = tmp_path / "snap"
    _cdf_table(table, 5)
    kit.append(table, 2, start=100)  # version 1: the snapshot is of it
    _, changes, txn = _topics(kafka_bootstrap, 2)
    actions, prefix = f"{changes[: -len('.changes')]}.actions", kit.unique("dm")
    settings = {"changes_topic": changes, "transaction_topic": txn, "row_changes": {"key_columns": ["id"]}}
    watch_until(kafka_bootstrap, table, actions, 1, prefix, **settings)
    kit.append(table, 3, start=200)  # version 2, after the snapshot: inserts
    watch_until(kafka_bootstrap, table, actions, 2, prefix, **settings)
    events = [json.loads(r.value) for r in kit.consume(kafka_bootstrap, [changes], idle_s=0.5)]
    snapshot = [e for e in events if e["op"] == "r"]
    assert sorted(e["after"]["id"] for e in snapshot) == [0, 1, 2, 3, 4, 100, 101]
    assert {e["source"]["delta_version"] for e in snapshot} == {1}
    assert sorted(e["source"]["snapshot"] for e in snapshot) == ["last"] + ["true"] * 6
    inserts = [e for e in events if e["op"] != "r"]
    assert sorted(e["after"]["id"] for e in inserts) == [200, 201, 202]
    assert {(e["op"], e["source"]["delta_version"], e["source"]["snapshot"]) for e in inserts} == {
        ("c", 2, "false")
    }


@pytest.mark.timeout(120)
def test_a_filter_projection_and_mask_from_the_settings_reach_the_records_and_their_schema(
    kafka_bootstrap: str, kit: Any
) -> None:
    """The row_changes settings columns, mask, mask_key and where, through watch and the broker:
    the records are those the unit-level tests check against core's change feed (tests/producer/
    test_row_transform.py), and the json-schema format's schema names the published columns only,
    the hmac-masked one as a string."""
    from deltamirror.producer.settings import RowChangesConfig
    from support.row_events import records as unit_records
    from support.tables import TABLES

    settings = {
        "key_columns": ["id"],
        "format": "json-schema",
        "columns": ["id", "name"],
        "mask": {"name": "hmac"},
        "mask_key": "a key of sixteen chars or more",
        "where": [{"column": "birthday", "op": ">=", "value": "2023-12-23"}],
    }
    path = str(TABLES / "krs__cdf-table")
    end = open_table(path).latest_version()
    actions, changes, _ = _topics(kafka_bootstrap)
    watch_row_changes(kafka_bootstrap, path, actions, end, settings)
    got = [json.loads(r.value) for r in kit.consume(kafka_bootstrap, [changes], idle_s=0.5) if r.value]
    unit = unit_records("krs__cdf-table", 0, RowChangesConfig(**settings))
    expected = [json.loads(r.value) for r in unit if r.value and r.topic.endswith(".changes")]

    def said(event: dict[str, Any]) -> tuple[Any, ...]:
        p = event["payload"]
        return p["source"]["delta_version"], p["op"], p["before"], p["after"]

    assert got and sorted(map(repr, map(said, got))) == sorted(map(repr, map(said, expected)))
    assert {said(e)[1] for e in got} == {"c", "d", "u"}  # version 1's updates left the filter: deletes
    after = next(f for f in got[0]["schema"]["fields"] if f["field"] == "after")
    assert {f["field"]: f["type"] for f in after["fields"]} == {"id": "int32", "name": "string"}
    assert all(len((e["payload"]["after"] or e["payload"]["before"])["name"]) == 64 for e in got)
