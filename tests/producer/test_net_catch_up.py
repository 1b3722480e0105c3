"""A net catch-up through the real broker: the range's row changes netted per key, committed in one
transaction with every action of the range and its progress, then every later version as usual."""

from __future__ import annotations

import json
import os
import signal
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from deltamirror.core.table import open_table
from support.cdf_tables import cdf_table
from support.watching import watch_until

pytestmark = [pytest.mark.kafka]


def _state(path: Path, version: int) -> dict[int, dict[str, Any]]:
    rows = open_table(str(path)).snapshot(version).to_arrow().to_pylist()
    return {r["id"]: r for r in rows}


def _topic_names() -> dict[str, str]:
    name = f"nc-{uuid.uuid4().hex[:10]}"
    return {"actions": f"{name}.actions", "changes": f"{name}.changes", "transaction": f"{name}.transaction"}


def _net_catch_up_watch(
    watch_setup: Any, bootstrap: str, table: Path, topics: dict[str, str], *, txn_max_records: int
) -> Any:
    """A watcher process's set-up: the table from version 0 with a net catch-up keyed by ``id``."""
    return watch_setup(
        bootstrap,
        table,
        table_settings={
            "snapshot_mode": "from-version",
            "from_version": 0,
            "changes_topic": topics["changes"],
            "transaction_topic": topics["transaction"],
            "row_changes": {"key_columns": ["id"], "net_catch_up": True},
        },
        txn_max_records=txn_max_records,
    )


@pytest.mark.timeout(120)
def test_a_net_catch_up_is_one_transaction_equal_to_the_state_difference_then_tailing_goes_on(
    kafka_bootstrap: str, tmp_path: Path, kit: Any
) -> None:
    table = tmp_path / "t"
    latest = cdf_table(table)
    topics, prefix = _topic_names(), kit.unique("dm")
    settings = {
        "snapshot_mode": "from-version",
        "from_version": 1,
        "changes_topic": topics["changes"],
        "transaction_topic": topics["transaction"],
        "row_changes": {"key_columns": ["id"], "net_catch_up": True},
        "txn_max_records": 2,  # a transaction per batch of two records, but for the catch-up
    }
    top = {"txn_max_records": settings.pop("txn_max_records")}
    watch_until(kafka_bootstrap, table, topics["actions"], latest, prefix, top_settings=top, **settings)
    events = [json.loads(r.value) for r in kit.consume(kafka_bootstrap, [topics["changes"]], idle_s=0.5)]

    # the net events: the difference between the state before the range and after it, by key
    before, after = _state(table, 0), _state(table, latest)
    expected = {
        *(("c", None, json.dumps(after[k])) for k in after.keys() - before.keys()),
        *(("d", json.dumps(before[k]), None) for k in before.keys() - after.keys()),
        *(
            ("u", json.dumps(before[k]), json.dumps(after[k]))
            for k in before.keys() & after.keys()
            if before[k] != after[k]
        ),
    }
    got = [
        (e["op"], e["before"] and json.dumps(e["before"]), e["after"] and json.dumps(e["after"]))
        for e in events
    ]
    assert sorted(got, key=str) == sorted(expected, key=str)
    assert len(got) == len(expected) == 6  # ids 0-2 updated, 3-4 deleted, 101 inserted; 100 and 5 nothing
    assert {e["source"]["delta_version"] for e in events} == {latest}
    txns = [json.loads(r.value) for r in kit.consume(kafka_bootstrap, [topics["transaction"]], idle_s=0.3)]
    assert [(t["status"], t["id"].rsplit(":", 1)[1]) for t in txns] == [
        ("BEGIN", str(latest)),
        ("END", str(latest)),
    ]

    # every version's actions and summary are there; one progress record for the whole range
    commits = kit.consume(kafka_bootstrap, [topics["actions"].replace(".actions", ".commits")], idle_s=0.3)
    summaries = [json.loads(r.value)["version"] for r in commits if r.headers.get("kind") == b"commit"]
    assert summaries == list(range(1, latest + 1))
    progress = kit.consume(kafka_bootstrap, [topics["actions"].replace(".actions", ".progress")], idle_s=0.3)
    assert [(json.loads(r.value)["version"]) for r in progress] == [latest]

    # the next version goes out alone, as usual, from where the catch-up ended
    from deltalake import DeltaTable

    DeltaTable(str(table)).update(updates={"name": "'later'"}, predicate="id = 9")
    watch_until(kafka_bootstrap, table, topics["actions"], latest + 1, prefix, top_settings=top, **settings)
    events = [json.loads(r.value) for r in kit.consume(kafka_bootstrap, [topics["changes"]], idle_s=0.5)]
    later = [e for e in events if e["source"]["delta_version"] == latest + 1]
    assert len(events) == 7
    assert [(e["op"], e["before"]["id"], e["after"]["name"]) for e in later] == [("u", 9, "later")]


@pytest.mark.timeout(240)
def test_kill_9_during_a_net_catch_up_leaves_nothing_then_the_restart_publishes_it_whole_once(
    kafka_bootstrap: str, tmp_path: Path, kit: Any, watch_setup: Any
) -> None:
    from deltalake import DeltaTable, write_deltalake

    rows = 100_000  # the rows take seconds to net and encode: the kill lands in the catch-up
    table = tmp_path / "big"
    data = pa.table(
        {"id": pa.array(range(rows), pa.int64()), "name": pa.array([f"n{i}" for i in range(rows)])}
    )
    write_deltalake(str(table), data, configuration={"delta.enableChangeDataFeed": "true"})
    DeltaTable(str(table)).update(updates={"name": "'changed'"})  # v1
    topics = _topic_names()
    setup = _net_catch_up_watch(watch_setup, kafka_bootstrap, table, topics, txn_max_records=25)
    log = tmp_path / "watch.log"
    proc = setup.start_process(log=log)
    try:  # the catch-up's first actions are on the broker, in its open transaction
        kit.consume(
            kafka_bootstrap, [setup.actions], isolation="read_uncommitted", until=lambda out: len(out) > 0
        )
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert kit.uncommitted_records(kafka_bootstrap, setup.actions) > 0, (
        "the kill did not land in the catch-up"
    )
    assert kit.consume(kafka_bootstrap, [setup.actions, setup.commits, setup.progress], idle_s=0.3) == []

    proc = setup.start_process(log=log)
    try:
        kit.consume(
            kafka_bootstrap,
            [setup.commits],
            until=lambda out: any(
                r.json.get("version") == 1 for r in out if r.headers.get("kind") == b"commit"
            ),
            timeout_s=120,
        )
    finally:
        assert kit.stop_process(proc) == 0
    events = [json.loads(r.value) for r in kit.consume(kafka_bootstrap, [topics["changes"]], idle_s=0.5)]
    assert len(events) == rows and {e["op"] for e in events} == {"c"}  # each row once, as it is now
    assert sorted(e["after"]["id"] for e in events) == list(range(rows))
    assert {e["after"]["name"] for e in events} == {"changed"}
    summaries = [r.json for r in kit.consume(kafka_bootstrap, [setup.commits], idle_s=0.3)]
    actions = kit.consume(kafka_bootstrap, [setup.actions], idle_s=0.3)
    assert [s["version"] for s in summaries if s.get("kind") == "commit"] == [0, 1]
    assert len(actions) == sum(s["actionCount"] for s in summaries if s.get("kind") == "commit")


@pytest.mark.timeout(120)
def test_an_error_inside_the_catch_up_publishes_nothing_of_it(
    kafka_bootstrap: str, tmp_path: Path, kit: Any, watch_setup: Any
) -> None:
    import time

    from deltalake import DeltaTable, write_deltalake

    table = tmp_path / "t"
    rows = pa.table({"id": pa.array([1, 2], pa.int64()), "name": pa.array(["a", "b"])})
    write_deltalake(str(table), rows, configuration={"delta.enableChangeDataFeed": "true"})  # v0
    write_deltalake(str(table), rows.slice(0, 1), mode="overwrite")  # v1
    DeltaTable(str(table)).alter.set_table_properties({"delta.enableChangeDataFeed": "false"})  # v2
    write_deltalake(str(table), rows.slice(1), mode="append")  # v3: no change data feed
    topics = _topic_names()
    setup = _net_catch_up_watch(watch_setup, kafka_bootstrap, table, topics, txn_max_records=1)
    log = tmp_path / "watch.log"
    proc = setup.start_process(log=log)
    try:
        deadline = time.monotonic() + 60
        while "table stopped" not in (log.read_text() if log.exists() else ""):
            assert time.monotonic() < deadline and proc.poll() is None, "the table did not stop on the error"
            time.sleep(0.2)
    finally:
        assert kit.stop_process(proc) == 0
    assert "DELTA_MISSING_CHANGE_DATA" in log.read_text()
    # the range's actions were produced before its rows failed: aborted with them, none committed
    assert kit.consume(kafka_bootstrap, [setup.actions, setup.commits, setup.progress], idle_s=0.3) == []
