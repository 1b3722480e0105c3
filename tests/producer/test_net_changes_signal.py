"""``deltamirror signal net-changes TABLE --from-version N``: the running owner publishes the net row
changes of versions N to its last published version as one marked BEGIN/END block in a transaction
of its own, then tails on with no gap and no duplicate (real broker)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from deltamirror.producer.settings import WatchConfig
from support.cdf_tables import cdf_table

pytestmark = [pytest.mark.kafka]


def _expected(path: Path, first: int, last: int) -> list[tuple[str, Any, Any]]:
    """Core's net changes over the range, as (op, before, after) by ``id``."""
    from deltamirror.core.changes import net_changes, read_changes
    from deltamirror.core.table import open_table

    feed = read_changes(open_table(str(path)), starting_version=first, ending_version=last)
    net = net_changes(feed, ["id"], schema=feed.schema).to_pylist()
    ops = {"insert": "c", "delete": "d", "update_postimage": "u"}
    out: list[tuple[str, Any, Any]] = []
    pre = {r["id"]: r for r in net if r["_change_type"] == "update_preimage"}
    for r in net:
        kind = r["_change_type"]
        if kind == "update_preimage":
            continue
        row = {"id": r["id"], "name": r["name"]}
        before = row if kind == "delete" else None
        if kind == "update_postimage":
            before = {"id": pre[r["id"]]["id"], "name": pre[r["id"]]["name"]}
        out.append((ops[kind], before, row if kind != "delete" else None))
    return sorted(out, key=str)


def _send(kafka_bootstrap: str, table: Path, signals: str, *extra: str) -> int:
    from deltamirror.cli.main import main

    argv = ["signal", "net-changes", str(table), "--bootstrap-servers", kafka_bootstrap]
    return main([*argv, "--signal-topic", signals, "--wait", "--timeout", "30", *extra])


@pytest.mark.timeout(120)
def test_signal_net_changes_publishes_one_marked_block_equal_to_the_net_changes_then_tails_on(
    kafka_bootstrap: str, tmp_path: Path, kit: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    from deltalake import DeltaTable

    from deltamirror.producer.service import WatchService

    name, plain_name, nocdf_name = kit.unique("ns"), kit.unique("nsplain"), kit.unique("nsnocdf")
    table, plain = tmp_path / name, kit.make_table(tmp_path / plain_name, versions=2)
    nocdf = kit.make_table(tmp_path / nocdf_name, versions=2)  # row changes, but no change data feed
    latest = cdf_table(table)
    signals, progress = kit.unique("signals"), kit.unique("progress")
    cfg = WatchConfig.model_validate(
        {
            "kafka": {"bootstrap_servers": kafka_bootstrap},
            "tables": [
                {"uri": str(table), "poll_interval_s": 0.2, "row_changes": {"key_columns": ["id"]}},
                {"uri": str(plain), "poll_interval_s": 0.2},
                {"uri": str(nocdf), "poll_interval_s": 0.2, "row_changes": {"key_columns": ["id"]}},
            ],
            "signal_topic": signals,
            "progress_topic": progress,
            "txn_max_records": 2,  # the block is one transaction all the same
        }
    )
    changes, txn_topic = f"deltamirror.{name}.changes", f"deltamirror.{name}.transaction"
    commits = f"deltamirror.{name}.commits"
    service = WatchService(cfg, stop_budget_s=5.0)
    service.start()

    def summaries(records: list[Any]) -> list[int]:
        return [r.json["version"] for r in records if r.headers.get("kind") == b"commit"]

    try:
        kit.consume(kafka_bootstrap, [commits], until=lambda rs: summaries(rs) == [latest], timeout_s=30)
        for other in (plain_name, nocdf_name):
            kit.consume(
                kafka_bootstrap,
                [f"deltamirror.{other}.commits"],
                until=lambda rs: len(summaries(rs)) == 1,
                timeout_s=30,
            )
        assert service.signals is not None and service.signals.listening.wait(30)
        initial = len(kit.consume(kafka_bootstrap, [changes], idle_s=0.3))

        # refused by the owner, acknowledged so: one line, exit 2
        assert _send(kafka_bootstrap, table, signals, "--from-version", str(latest + 1)) == 2
        assert "beyond the last version published" in capsys.readouterr().err
        assert _send(kafka_bootstrap, plain, signals, "--from-version", "0") == 2
        assert "publishes no row changes" in capsys.readouterr().err
        assert _send(kafka_bootstrap, nocdf, signals, "--from-version", "0") == 2
        assert "DELTA_MISSING_CHANGE_DATA" in capsys.readouterr().err

        assert _send(kafka_bootstrap, table, signals, "--from-version", "1") == 0
        sent = json.loads(capsys.readouterr().out)
        assert (sent["signal"], sent["fromVersion"], sent["taken"]) == ("net-changes", 1, True)
        expected = _expected(table, 1, latest)
        kit.consume(
            kafka_bootstrap, [changes], until=lambda rs: len(rs) == initial + len(expected), timeout_s=30
        )
        DeltaTable(str(table)).update(updates={"name": "'later'"}, predicate="id = 5")  # tailing goes on
        kit.consume(
            kafka_bootstrap, [commits], until=lambda rs: summaries(rs) == [latest, latest + 1], timeout_s=30
        )
        assert service._failure is None, service._failure
    finally:
        service.request_stop()
        assert service.wait(30), "the watcher did not stop"
        service.close()

    events = [json.loads(r.value) for r in kit.consume(kafka_bootstrap, [changes], idle_s=0.5)]
    block = [e for e in events[initial:] if e["source"]["delta_version"] == latest]
    got = sorted(((e["op"], e["before"], e["after"]) for e in block), key=str)
    assert got == expected and len(expected) == 6  # 0-2 updated, 3-4 deleted, 101 inserted; 100, 5 nothing
    assert [e["source"]["snapshot"] for e in block] == ["true"] * (len(block) - 1) + ["last"]
    assert {e["source"]["snapshot"] for e in events[:initial]} <= {"true", "last"}  # the initial snapshot
    later = events[initial + len(block) :]
    assert [(e["op"], e["after"]["name"], e["source"]["snapshot"]) for e in later] == [
        ("u", "later", "false")
    ]

    # one BEGIN/END block for the net events, alone in its transaction (committed, nothing interleaved)
    txns = [json.loads(r.value) for r in kit.consume(kafka_bootstrap, [txn_topic], idle_s=0.3)]
    ends = [t for t in txns if t["status"] == "END"]
    assert [t["id"].rsplit(":", 1)[1] for t in ends] == [str(latest), str(latest), str(latest + 1)]
    assert ends[1]["event_count"] == len(expected)
