"""`deltamirror local kafka abort-hanging`: Kafka's TransactionsCommand from the pinned jars.

A transaction Kafka left hanging needs a broker killed at the right moment (the fault campaign's
class 3 makes them, and uses this command to end them); here, what must hold on any broker: the
tool's table is read as Kafka prints it, and a transaction that is alive is neither named nor
aborted.
"""

from __future__ import annotations

import argparse
import uuid
from pathlib import Path

import pytest

from deltamirror.cli.local_kafka_cmd import register
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
    register(parser.add_subparsers(dest="command", required=True))
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
