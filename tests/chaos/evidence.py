"""Where a fault hit, from what the broker and the processes show at that moment.

- an open transaction: records of a topic partition above its last stable offset
  (read_uncommitted high watermark minus read_committed one, :class:`support.kafka.TransactionProbe`),
  probed once the killed process is gone, so that nothing can commit them any more;
- mid-version: the table's progress record (read_committed) says the committed part of a version
  stops before its last action (``index + 1 < count``), or before its last row (``rowOffset``);
- a member holding tables: its own log lines (``shards assigned`` / ``shards revoked`` / ``lost``);
- a table move under way: a member that logged ``shards assigned`` and not yet ``tables of the
  assigned shards resumed``.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from chaos.procs import Proc

from support.kafka import TransactionProbe


class ProgressTail:
    """The latest progress record of each table, read_committed, read incrementally."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.latest: dict[str, dict[str, Any]] = {}
        self.consumer: Any = None

    def _ensure(self) -> bool:
        from confluent_kafka import Consumer, TopicPartition

        if self.consumer is None:
            consumer = Consumer(
                {
                    "bootstrap.servers": self.bootstrap,
                    "group.id": f"chaos-progress-{uuid.uuid4().hex[:8]}",
                    "isolation.level": "read_committed",
                    "enable.auto.commit": False,
                    "log_level": 0,
                }
            )
            if self.topic not in consumer.list_topics(timeout=10).topics:
                consumer.close()
                return False
            consumer.assign([TopicPartition(self.topic, 0, -2)])
            self.consumer = consumer
        return True

    def read(self, idle_s: float = 0.3) -> dict[str, dict[str, Any]]:
        """Everything committed so far (until ``idle_s`` without a new record)."""
        if not self._ensure():
            return self.latest
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            batch = self.consumer.consume(10_000, timeout=idle_s)
            for m in batch:
                if m.error() is None and m.value():
                    record = json.loads(m.value())
                    self.latest[record.get("tableUri", (m.key() or b"").decode())] = record
            if not batch:
                break
        return self.latest

    def close(self) -> None:
        if self.consumer is not None:
            self.consumer.close()


def open_transactions(probe: TransactionProbe, partitions: list[tuple[str, int]]) -> dict[str, int]:
    """Records in an open transaction per ``topic[partition]`` (those with any)."""
    out = {}
    for topic, partition in partitions:
        try:
            n = probe.open_records(topic, partition)
        except Exception:  # the topic is not there yet, or the broker is away: nothing seen open
            continue
        if n > 0:
            out[f"{topic}[{partition}]"] = n
    return out


def mid_version(progress: dict[str, dict[str, Any]]) -> list[str]:
    """Tables whose committed position stops inside a version, said as ``table vN i/n [rows r]``."""
    out = []
    for uri, record in progress.items():
        name = uri.rstrip("/").rsplit("/", 1)[-1]
        partial_actions = record["index"] + 1 < record["count"]
        if partial_actions or record.get("rowOffset") is not None:
            rows = f" rows {record['rowOffset']}" if record.get("rowOffset") is not None else ""
            out.append(f"{name} v{record['version']} {record['index'] + 1}/{record['count']}{rows}")
    return out


def held_tables(member: Proc) -> int:
    """Tables the member runs by its log: shards assigned minus shards revoked or lost."""
    held = 0
    for line in member.lines(since_start=member.starts - 1):
        msg = line.get("msg", "")
        if msg == "shards assigned":
            held += int(line.get("tables", 0))
        elif msg in ("shards revoked", "shards lost"):
            held -= int(line.get("tables", 0))
        elif msg.startswith("table released"):
            held -= 1
    return max(held, 0)


def moving(members: list[Proc]) -> list[str]:
    """Members whose latest assignment has not resumed all its tables yet."""
    out = []
    for member in members:
        if not member.alive():
            continue
        pending = False
        for line in member.lines(since_start=member.starts - 1):
            msg = line.get("msg", "")
            if msg == "shards assigned" and int(line.get("tables", 0)) > 0:
                pending = True
            elif msg == "tables of the assigned shards resumed":
                pending = False
        if pending:
            out.append(member.name)
    return out
