"""Kafka's own transaction tool against a local broker: finding and aborting hanging transactions.

A single broker killed mid-commit can leave a transaction that nobody ends (see
:mod:`deltamirror.producer.publishing.hanging`): ``read_committed`` readers stop at it for good, and no
Kafka client library can end another producer's transaction (librdkafka has no admin call for
it). Kafka ships the remedy as ``kafka-transactions.sh``: ``find-hanging`` lists the open
transactions of a broker's partitions whose producer the coordinator no longer has in a
transaction, ``abort`` writes an abort marker for one of them. ``deltamirror local kafka
abort-hanging`` runs that tool's class (``TransactionsCommand``) from the pinned jars
(:func:`~deltamirror.devkafka.jars.ensure_tool_jars`, the broker's and ``kafka-tools``), as an
operator would: every transaction ``find-hanging`` names is aborted.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass

from deltamirror.devkafka.jars import ensure_tool_jars, find_java, load_distribution
from deltamirror.mirror.errors import KafkaError

#: the local broker's node id (``server.properties``: broker and controller in one JVM)
LOCAL_BROKER_ID = 1
#: how long one run of the tool may take (a JVM start, two or three admin requests)
TOOL_TIMEOUT_S = 120.0
#: ``find-hanging`` passes over transactions younger than this (its own default: 15 minutes)
DEFAULT_MAX_TRANSACTION_TIMEOUT_MIN = 0

FIND_HANGING_HEADER = ("Topic", "Partition", "ProducerId", "ProducerEpoch", "CoordinatorEpoch", "StartOffset")


@dataclass(frozen=True)
class HangingTransaction:
    """One row of ``kafka-transactions.sh find-hanging``."""

    topic: str
    partition: int
    producer_id: int
    producer_epoch: int
    coordinator_epoch: int
    start_offset: int

    def __str__(self) -> str:
        return (
            f"{self.topic}[{self.partition}] from offset {self.start_offset} "
            f"(producer id {self.producer_id}, epoch {self.producer_epoch})"
        )


def parse_find_hanging(output: str) -> list[HangingTransaction]:
    """The rows of ``find-hanging``'s table (tab-separated, a header line first); none when it
    found none (it then prints the header alone, or nothing)."""
    rows = [line.split() for line in output.splitlines() if line.strip()]
    header = next((i for i, row in enumerate(rows) if tuple(row[:6]) == FIND_HANGING_HEADER), None)
    if header is None:
        if rows:
            raise KafkaError(f"kafka-transactions.sh find-hanging printed no table: {output.strip()[:500]}")
        return []
    found = []
    for row in rows[header + 1 :]:
        try:
            found.append(HangingTransaction(row[0], *(int(v) for v in row[1:6])))
        except (ValueError, TypeError, IndexError):
            raise KafkaError(
                f"unexpected line from kafka-transactions.sh find-hanging: {' '.join(row)}"
            ) from None
    return found


class TransactionsTool:
    """``kafka-transactions.sh --bootstrap-server BOOTSTRAP ...``, run from the pinned jars."""

    def __init__(self, bootstrap_servers: str) -> None:
        self.bootstrap_servers = bootstrap_servers
        self._command: list[str] | None = None

    def _base(self) -> list[str]:
        if self._command is None:
            java = find_java()
            classpath = os.pathsep.join(str(p) for p in ensure_tool_jars())
            main = load_distribution().transactions_tool_main_class
            self._command = [str(java), "-Xmx256m", "-cp", classpath, main]
        return [*self._command, "--bootstrap-server", self.bootstrap_servers]

    def run(self, *args: str) -> str:
        """The tool's standard output; a KafkaError with what it said when it fails."""
        command = [*self._base(), *args]
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S, check=False
            )
        except subprocess.TimeoutExpired:
            raise KafkaError(
                f"kafka-transactions.sh {args[0]} did not finish within {TOOL_TIMEOUT_S:.0f} s"
            ) from None
        if done.returncode != 0:
            said = (done.stderr.strip() or done.stdout.strip()).splitlines()
            raise KafkaError(
                f"kafka-transactions.sh {' '.join(args)} exited {done.returncode}: "
                f"{said[-1] if said else 'nothing said'}"
            )
        return done.stdout

    def find_hanging(
        self,
        broker_id: int = LOCAL_BROKER_ID,
        *,
        max_transaction_timeout_min: int = DEFAULT_MAX_TRANSACTION_TIMEOUT_MIN,
    ) -> list[HangingTransaction]:
        out = self.run(
            "find-hanging",
            "--broker-id",
            str(broker_id),
            "--max-transaction-timeout",
            str(max_transaction_timeout_min),
        )
        return parse_find_hanging(out)

    def abort(self, hanging: HangingTransaction) -> None:
        self.run(
            "abort",
            "--topic",
            hanging.topic,
            "--partition",
            str(hanging.partition),
            "--start-offset",
            str(hanging.start_offset),
        )


def abort_hanging(
    bootstrap_servers: str,
    *,
    broker_id: int = LOCAL_BROKER_ID,
    max_transaction_timeout_min: int = DEFAULT_MAX_TRANSACTION_TIMEOUT_MIN,
    dry_run: bool = False,
) -> list[HangingTransaction]:
    """Abort every transaction ``find-hanging`` names on ``broker_id``; the ones it named."""
    tool = TransactionsTool(bootstrap_servers)
    hanging = tool.find_hanging(broker_id, max_transaction_timeout_min=max_transaction_timeout_min)
    if not dry_run:
        for txn in hanging:
            tool.abort(txn)
    return hanging


__all__ = [
    "DEFAULT_MAX_TRANSACTION_TIMEOUT_MIN",
    "LOCAL_BROKER_ID",
    "HangingTransaction",
    "TransactionsTool",
    "abort_hanging",
    "parse_find_hanging",
]
