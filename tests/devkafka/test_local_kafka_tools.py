"""`deltamirror local kafka abort-hanging`: Kafka's TransactionsCommand from the pinned jars.

A transaction Kafka leaves hanging in the wild needs a broker killed at the right moment (the fault
campaign's class 3 makes them, and uses this command to end them). Here: the tool's table is read
as Kafka prints it; a transaction that is alive is neither named nor aborted; and transactions the
coordinator lost (made deterministically: open transactions on a broker restarted without its
``__transaction_state`` log) are named by ``--dry-run`` and left open, passed over while younger
than ``--max-transaction-timeout``, and aborted otherwise.
"""

from __future__ import annotations

import argparse
import uuid
from pathlib import Path
from typing import Any

import pytest

from deltamirror.cli.local_kafka_cmd import PARSERS
from deltamirror.devkafka.tools import (
    HangingTransaction,
    TransactionsTool,
    abort_hanging,
    parse_find_hanging,
)
from deltamirror.mirror.errors import KafkaError
from support.kafka import new_topic, uncommitted_records

#: what kafka-transactions.sh 4.4.0 find-hanging printed for the two partitions a broker killed
#: mid-commit left in a transaction (the fault campaign, seed 11: its progress topic stuck at 705)
FOUND = (
    "Topic                             \tPartition\tProducerId\tProducerEpoch\tCoordinatorEpoch\t"
    "StartOffset\tLastTimestamp\tDuration(min)\t\n"
    "chaos-11-broker.broker-t00.actions\t0        \t15        \t2            \t4               \t"
    "24796      \t1795837685175\t119          \t\n"
    "chaos-11-broker.progress          \t0        \t15        \t2            \t4               \t"
    "705        \t1795837685223\t119          \t\n"
)


def test_find_hanging_output_is_read_row_by_row() -> None:
    assert parse_find_hanging(FOUND) == [
        HangingTransaction("chaos-11-broker.broker-t00.actions", 0, 15, 2, 4, 24796),
        HangingTransaction("chaos-11-broker.progress", 0, 15, 2, 4, 705),
    ]
    assert parse_find_hanging(FOUND.splitlines()[0] + "\n") == []
    assert parse_find_hanging("") == []
    with pytest.raises(KafkaError, match="printed no table"):
        parse_find_hanging("Exception in thread main: something else\n")
    with pytest.raises(KafkaError, match="unexpected line"):
        parse_find_hanging(FOUND.splitlines()[0] + "\nt\tzero\t1\t2\t3\t4\n")


def _cli(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="deltamirror")
    PARSERS["local"](parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(list(argv))
    rc: int = args.handler(args)
    return rc


def test_cli_without_a_broker_exits_3(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _cli("local", "kafka", "abort-hanging", "--port", "1", "--data-dir", str(tmp_path)) == 3
    assert capsys.readouterr().out.startswith("kafka not running (port 1, data ")


@pytest.mark.kafka
@pytest.mark.timeout(180)
def test_a_live_transaction_is_not_hanging_and_is_left_alone(kafka_bootstrap: str) -> None:
    from confluent_kafka import Producer

    topic = new_topic(kafka_bootstrap, f"dm-test-hang-{uuid.uuid4().hex[:12]}")
    producer = Producer(
        {
            "bootstrap.servers": kafka_bootstrap,
            "transactional.id": f"dm-test-live-{uuid.uuid4().hex[:8]}",
            "transaction.timeout.ms": 300_000,
        }
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, b"open", b"k")
    producer.flush(30)
    assert uncommitted_records(kafka_bootstrap, topic) == 1
    try:
        tool = TransactionsTool(kafka_bootstrap)
        assert [h for h in tool.find_hanging() if h.topic == topic] == []
        found = abort_hanging(kafka_bootstrap)
        assert [h for h in found if h.topic == topic] == []
        assert uncommitted_records(kafka_bootstrap, topic) == 1  # still open: not aborted
        producer.commit_transaction(30)  # and it still commits (an aborted one would refuse)
        with pytest.raises(KafkaError, match=r"abort --topic .* exited"):
            tool.abort(HangingTransaction(topic, 0, 1, 0, 0, 0))  # nothing open there
    finally:
        producer.flush(5)


def _open_transaction(bootstrap: str, topic: str, age_min: int) -> Any:
    """A transaction left open on ``topic``, its record stamped ``age_min`` minutes ago (what
    find-hanging measures a transaction's age by: its producer's last timestamp)."""
    import time

    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": f"dm-test-{topic}",
            "transaction.timeout.ms": 900_000,
        }
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, b"open", b"k", timestamp=int(time.time() * 1000) - age_min * 60_000)
    producer.flush(30)
    return producer  # never committed; dropped while the broker is stopped, it ends nothing


@pytest.mark.isolated  # its own broker
@pytest.mark.kafka
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_abort_hanging_dry_run_and_max_transaction_timeout_on_transactions_the_coordinator_lost(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two transactions hang on a broker started by ``deltamirror local kafka start``: their records
    are on their partitions, open, but the transaction coordinator no longer knows them (its
    ``__transaction_state`` log is gone, as when the coordinator lost it). One was last written 30
    minutes ago, the other now. ``--dry-run`` names both and aborts none; ``--max-transaction-timeout
    10`` passes over the young one and aborts the old one; then the young one is aborted too."""
    import gc
    import shutil

    from support.kafka import free_port_pair

    port = free_port_pair()
    data = tmp_path / "kafka"
    opts = ("--port", str(port), "--data-dir", str(data))
    bootstrap = f"127.0.0.1:{port}"
    old, young = f"old-{uuid.uuid4().hex[:8]}", f"young-{uuid.uuid4().hex[:8]}"
    try:
        assert _cli("local", "kafka", "start", *opts) == 0
        producers = []
        for topic, age_min in ((old, 30), (young, 0)):
            new_topic(bootstrap, topic)
            producers.append(_open_transaction(bootstrap, topic, age_min))
        assert _cli("local", "kafka", "stop", *opts) == 0
        producers.clear()  # gone while the broker is stopped: they end nothing
        gc.collect()
        for state in (data / "kafka-logs").glob("__transaction_state-*"):
            shutil.rmtree(state)
        assert _cli("local", "kafka", "start", *opts) == 0
        assert uncommitted_records(bootstrap, old) == uncommitted_records(bootstrap, young) == 1
        capsys.readouterr()

        def said() -> list[str]:
            return capsys.readouterr().out.splitlines()

        # --dry-run: both named, none aborted (the records stay open: the last stable offset holds)
        assert _cli("local", "kafka", "abort-hanging", *opts, "--dry-run") == 0
        lines = said()
        assert sorted(line.split(": ")[-1].split("[")[0] for line in lines) == [old, young], lines
        assert all(line.startswith("hanging (not aborted: --dry-run): ") for line in lines), lines
        assert uncommitted_records(bootstrap, old) == uncommitted_records(bootstrap, young) == 1

        # --max-transaction-timeout 10: the one open for 30 minutes only
        assert _cli("local", "kafka", "abort-hanging", *opts, "--max-transaction-timeout", "10") == 0
        assert said() == [
            f"aborted: {old}[0] from offset 0 (producer id {_producer_id(lines, old)}, epoch 0)"
        ]
        assert uncommitted_records(bootstrap, old) == 0
        assert uncommitted_records(bootstrap, young) == 1  # younger than the bound: left alone

        # the default (0): every hanging transaction, the young one included
        assert _cli("local", "kafka", "abort-hanging", *opts) == 0
        assert [line.split(": ")[-1].split("[")[0] for line in said()] == [young]
        assert uncommitted_records(bootstrap, young) == 0
        assert _cli("local", "kafka", "abort-hanging", *opts) == 0
        assert said() == [f"no hanging transaction on the broker at {bootstrap}"]
    finally:
        _cli("local", "kafka", "stop", *opts)


def _producer_id(lines: list[str], topic: str) -> str:
    (line,) = [line for line in lines if f": {topic}[" in line]
    return line.split("producer id ")[1].split(",")[0]
