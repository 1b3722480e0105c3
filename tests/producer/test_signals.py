"""``deltamirror signal snapshot TABLE``: the running watcher publishes a fresh snapshot, between two
versions, without a restart (real broker)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from deltamirror.producer.settings import WatchConfig
from deltamirror.producer.signals import Signal, SignalListener

pytestmark = [pytest.mark.kafka]


def test_signal_snapshot_republishes_the_table_between_two_versions(
    kafka_bootstrap: str, tmp_path: Path, kit: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    from deltamirror.cli.main import main
    from deltamirror.producer.service import WatchService

    name = kit.unique("sig")
    table = kit.make_table(tmp_path / name, versions=2)
    signals, progress = kit.unique("signals"), kit.unique("progress")
    cfg = WatchConfig.model_validate(
        {
            "kafka": {"bootstrap_servers": kafka_bootstrap},
            "tables": [{"uri": str(table), "poll_interval_s": 0.2}],
            "signal_topic": signals,
            "progress_topic": progress,
        }
    )
    commits = f"deltamirror.{name}.commits"
    service = WatchService(cfg, stop_budget_s=5.0)
    service.start()

    def summaries(records: list[Any]) -> list[tuple[int, bool]]:
        return [
            (r.json["version"], r.json["snapshot"]) for r in records if r.headers.get("kind") == b"commit"
        ]

    try:
        kit.consume(kafka_bootstrap, [commits], until=lambda rs: summaries(rs) == [(1, True)], timeout_s=30)
        assert service.signals is not None and service.signals.listening.wait(30)
        argv = [
            "signal",
            "snapshot",
            str(table),
            "--bootstrap-servers",
            kafka_bootstrap,
            "--signal-topic",
            signals,
        ]
        assert main(argv) == 0
        sent = json.loads(capsys.readouterr().out)
        assert (sent["signal"], sent["tableUri"]) == ("snapshot", f"file://{table}")
        kit.consume(kafka_bootstrap, [commits], until=lambda rs: len(summaries(rs)) == 2, timeout_s=30)
        kit.append(table)  # version 2 follows the fresh snapshot
        kit.consume(kafka_bootstrap, [commits], until=lambda rs: len(summaries(rs)) == 3, timeout_s=30)
        assert service._failure is None, service._failure
    finally:
        service.request_stop()
        assert service.wait(30), "the watcher did not stop"
        service.close()

    records = kit.consume(kafka_bootstrap, [commits], idle_s=0.5)
    assert summaries(records) == [(1, True), (1, True), (2, False)]
    actions = kit.consume(kafka_bootstrap, [f"deltamirror.{name}.actions"], idle_s=0.5)
    snapshot_events = [r.json for r in actions if r.json["snapshot"]]
    first, second = snapshot_events[: len(snapshot_events) // 2], snapshot_events[len(snapshot_events) // 2 :]
    assert [e["action"] for e in first] == [e["action"] for e in second]  # the same state, again
    assert second[-1]["snapshotEnd"] is True
    assert [r.json["version"] for r in actions if not r.json["snapshot"]] == [2] * (
        len(actions) - len(snapshot_events)
    )
    last = [
        r for r in kit.consume(kafka_bootstrap, [progress], idle_s=0.5) if r.key == f"file://{table}".encode()
    ]
    assert (last[-1].json["version"], last[-1].json["snapshot"]) == (2, False)


def test_old_and_foreign_records_on_the_signal_topic_are_not_acted_on() -> None:
    import threading

    taken: list[Signal] = []
    listener = SignalListener({}, "t", lambda s: taken.append(s) or True, stop=threading.Event())
    old = Signal(kind="snapshot", table_uri="file:///t", id="a", requested_at=listener.started_ms - 1)
    new = Signal(kind="snapshot", table_uri="file:///t", id="b", requested_at=listener.started_ms + 1)
    for offset, value in enumerate(
        [old.to_json_bytes(), b"not json", b'{"kind":"reboot"}', new.to_json_bytes()]
    ):
        listener._take(value, offset)
    assert [s.id for s in taken] == ["b"]
    assert json.loads(new.to_json_bytes())["tableUri"] == "file:///t"
    assert time.time() * 1000 >= listener.started_ms
