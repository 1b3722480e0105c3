"""The highest version summarized on each of many commits topics, read_committed, read incrementally.

Used by the group tests and by bench/bench_scale.py to see when every table published again after a
member moved: topics appear while it reads (tables are created and discovered meanwhile), so they are
assigned as they come (looked for at most once a second).
"""

from __future__ import annotations

import json
import time
import uuid


class CommitsReader:
    def __init__(self, bootstrap: str, topics: list[str]) -> None:
        from confluent_kafka import Consumer

        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"dm-commits-{uuid.uuid4().hex[:8]}",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "log_level": 0,  # a broker restarted on purpose (the fault campaign) is no news
            }
        )
        self.topics = topics
        self.assigned: set[str] = set()
        self.latest: dict[str, int] = dict.fromkeys(topics, -1)
        self._last_assign = 0.0

    def _assign_new(self) -> None:
        from confluent_kafka import TopicPartition

        missing = [t for t in self.topics if t not in self.assigned]
        if not missing:
            return
        md = self.consumer.list_topics(timeout=10).topics
        ready = [t for t in missing if t in md and md[t].partitions]
        if ready:
            self.assigned.update(ready)
            self.consumer.assign([TopicPartition(t, 0, -2) for t in sorted(self.assigned)])

    def _poll(self) -> None:
        """Assign the topics that appeared (at most once a second), then read what is there."""
        if time.monotonic() - self._last_assign > 1.0:
            self._assign_new()
            self._last_assign = time.monotonic()
        for msg in self.consumer.consume(10_000, timeout=0.1):
            value = msg.value() or b""
            if msg.error() is None and value.startswith(b'{"kind":"commit"'):
                topic = msg.topic() or ""
                self.latest[topic] = max(self.latest[topic], json.loads(value)["version"])

    def wait_all(self, version: int, timeout_s: float) -> float | None:
        """Seconds until every commits topic summarized ``version``; None after ``timeout_s``."""
        return self.wait_each(dict.fromkeys(self.topics, version), timeout_s)

    def wait_each(self, versions: dict[str, int], timeout_s: float) -> float | None:
        """Seconds until each commits topic summarized its version in ``versions``; None after
        ``timeout_s``."""
        started = time.monotonic()
        while time.monotonic() - started < timeout_s:
            self._poll()
            if all(self.latest.get(t, -1) >= v for t, v in versions.items()):
                return time.monotonic() - started
        return None

    def behind(self, version: int) -> list[str]:
        """The topics not yet at ``version``, sorted."""
        return sorted(t for t, v in self.latest.items() if v < version)

    def close(self) -> None:
        self.consumer.close()
