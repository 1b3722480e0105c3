"""A transaction that holds a table's partition past the transaction timeout is reported, then waited out.

Kafka can leave a transaction that nobody ends on a partition (a single broker killed mid-commit
skips its markers at the restart); only an operator can abort it. From the watcher's side it is a
partition whose last stable offset stays below the high watermark while no transaction of its
own is open. Here a transaction of another producer, kept open, holds the table's actions topic
while the watcher starts: the watcher must publish nothing, say which partition and offset (and
the remedy), report the table unhealthy and count the partition, then, once the transaction is
aborted, publish everything exactly once and be healthy again.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import pytest

from deltamirror.producer import pipeline as pipeline_module
from deltamirror.producer.metrics import WatcherMetrics
from deltamirror.producer.service import WatchService
from support.kafka import new_topic

pytestmark = [pytest.mark.kafka]


def _wait_for(condition: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _hanging_gauge(metrics: WatcherMetrics) -> float:
    value = metrics.registry.get_sample_value(
        "deltamirror_hanging_transactions", {"table": metrics_table(metrics)}
    )
    return value if value is not None else -1.0


def metrics_table(metrics: WatcherMetrics) -> str:
    _, body = metrics.health()
    (label,) = body["tables"]
    return str(label)


@pytest.mark.timeout(180)
def test_a_transaction_holding_the_actions_topic_is_reported_then_waited_out(
    kafka_bootstrap: str,
    tmp_path: Path,
    kit: Any,
    watch_setup: Any,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from confluent_kafka import Producer

    table = kit.make_table(tmp_path / "t", versions=3)
    setup = watch_setup(kafka_bootstrap, table)
    new_topic(kafka_bootstrap, setup.actions, 1, {"retention.ms": "-1"})
    holder = Producer(
        {
            "bootstrap.servers": kafka_bootstrap,
            "transactional.id": kit.unique("holder"),
            "transaction.timeout.ms": 300_000,
        }
    )
    holder.init_transactions(30)
    holder.begin_transaction()
    holder.produce(setup.actions, b"held", b"k")
    holder.flush(30)
    assert kit.uncommitted_records(kafka_bootstrap, setup.actions) == 1

    cfg = setup.cfg()
    cfg = cfg.model_copy(
        update={"kafka": cfg.kafka.model_copy(update={"extra": {"transaction.timeout.ms": "5000"}})}
    )
    monkeypatch.setattr(pipeline_module, "HANG_MARGIN_S", 0.5)  # reported 5.5 s after the wait began
    metrics = WatcherMetrics()
    service = WatchService(cfg, metrics=metrics)
    caplog.set_level(logging.INFO, logger="deltamirror")
    service.start()
    try:
        _wait_for(
            lambda: any("transaction hanging on" in r.getMessage() for r in caplog.records), 60, "the report"
        )
        (line,) = [r for r in caplog.records if "transaction hanging on" in r.getMessage()]
        assert line.levelno == logging.ERROR
        message = line.getMessage()
        assert f"{setup.actions}[0]: its records from offset 0 (high watermark 1)" in message
        assert f"abort --topic {setup.actions} --partition 0 --start-offset 0" in message
        assert "find-hanging --broker-id 1" in message
        healthy, body = metrics.health()  # "starting": the table has not resumed yet
        assert not healthy and body["status"] in ("starting", "unhealthy")
        (entry,) = body["tables"].values()
        assert entry["status"] == "error"
        assert entry["reason"] == f"a transaction hangs on {setup.actions}[0] from offset 0"
        assert "1 table(s) stopped on an error" in body["reason"]
        assert _hanging_gauge(metrics) == 1
        assert setup.actions_records(idle_s=0.3) == []  # nothing published past it

        holder.abort_transaction(30)  # what kafka-transactions.sh abort does to a hanging one
        _wait_for(
            lambda: (
                max(
                    (
                        r.json["version"]
                        for r in setup.commits_records(idle_s=0.3)
                        if r.headers.get("kind") == b"commit"
                    ),
                    default=-1,
                )
                >= 2
            ),
            60,
            "every version after the abort",
        )
        assert any("ended; resuming" in r.getMessage() for r in caplog.records)
        assert metrics.health()[0]
        assert _hanging_gauge(metrics) == 0
    finally:
        service.request_stop()
        assert service.wait(30), "the watcher did not stop"
        service.close()
    assert [r.value for r in setup.actions_records(idle_s=0.3)] == kit.events_output(table)


def _summary_versions(setup: Any) -> list[int]:
    return [
        int(r.json["version"])
        for r in setup.commits_records(idle_s=0.3)
        if r.headers.get("kind") == b"commit"
    ]


@pytest.mark.timeout(240)
def test_actions_aborted_under_a_committed_progress_record_are_published_again(
    kafka_bootstrap: str,
    tmp_path: Path,
    kit: Any,
    watch_setup: Any,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The state a broker killed mid-commit leaves, then the operator's remedy: Kafka completed the
    transaction of version 3 on the progress partition but skipped the marker of the actions
    partition, where its records hang until an operator aborts them. The progress topic then claims
    version 3 while the actions topic does not hold it; the watcher must publish version 3 again."""
    import json

    from confluent_kafka import Producer

    table = kit.make_table(tmp_path / "t", versions=3)
    setup = watch_setup(kafka_bootstrap, table)
    service = WatchService(setup.cfg())
    service.start()
    try:
        _wait_for(lambda: max(_summary_versions(setup), default=-1) >= 2, 60, "versions 0 to 2")
    finally:
        service.request_stop()
        assert service.wait(30), "the watcher did not stop"
        service.close()

    kit.append(table, n=4)  # version 3
    version_3 = [json.loads(v) for v in kit.events_output(table, "--starting-version", "3")]
    assert {e["version"] for e in version_3} == {3}
    last = version_3[-1]
    (progress,) = [r for r in setup.progress_records(idle_s=0.3)][-1:]
    claimed = {
        **progress.json,
        "version": 3,
        "index": last["index"],
        "count": last["count"],
        "snapshot": False,
        "commitTimestamp": last["commitTimestamp"],
        "commitTimestampSource": last["commitTimestampSource"],
    }
    claimed.pop("rowOffset", None)
    # the progress partition got its commit marker ...
    writer = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": kit.unique("half-a")})
    writer.init_transactions(30)
    writer.begin_transaction()
    writer.produce(setup.progress, json.dumps(claimed).encode(), progress.key)
    writer.commit_transaction(30)
    # ... the actions partition did not: its records of version 3 hang there
    holder = Producer(
        {
            "bootstrap.servers": kafka_bootstrap,
            "transactional.id": kit.unique("half-b"),
            "transaction.timeout.ms": 300_000,
        }
    )
    holder.init_transactions(30)
    holder.begin_transaction()
    for event in version_3:
        holder.produce(setup.actions, json.dumps(event).encode(), event["tableId"].encode())
    holder.flush(30)
    assert kit.uncommitted_records(kafka_bootstrap, setup.actions) == len(version_3)

    cfg = setup.cfg()
    cfg = cfg.model_copy(
        update={"kafka": cfg.kafka.model_copy(update={"extra": {"transaction.timeout.ms": "5000"}})}
    )
    monkeypatch.setattr(pipeline_module, "HANG_MARGIN_S", 0.5)
    caplog.set_level(logging.INFO, logger="deltamirror")
    service = WatchService(cfg)
    service.start()
    try:
        _wait_for(
            lambda: any("transaction hanging on" in r.getMessage() for r in caplog.records), 60, "the report"
        )
        holder.abort_transaction(30)  # the operator's remedy
        _wait_for(lambda: 3 in _summary_versions(setup), 60, "version 3 published again")
        (warning,) = [r for r in caplog.records if "but the actions topic ends at" in r.getMessage()]
        assert "holds v3#" in warning.getMessage()
        assert "ends at v2#" in warning.getMessage()
    finally:
        service.request_stop()
        assert service.wait(30), "the watcher did not stop"
        service.close()
    assert [r.value for r in setup.actions_records(idle_s=0.3)] == kit.events_output(table)
    assert sorted(_summary_versions(setup)) == [0, 1, 2, 3]
