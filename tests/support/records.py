"""Read what is on a topic, write the values the watcher writes, and run a watcher in-process until a
condition holds (no fixed waits)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Rec:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: dict[str, bytes] = field(default_factory=dict)

    @property
    def json(self) -> Any:
        import json

        return None if self.value is None else json.loads(self.value)


def action_values(
    version: int,
    actions: Sequence[tuple[str, Any]],
    *,
    snapshot: bool = False,
    table_id: str = "t",
    table_uri: str = "file:///t",
) -> list[bytes]:
    """The actions-topic values of one version (or snapshot) of a made-up table, as the watcher's
    encoder writes them (index 0 on; commit timestamp 1, from In-Commit Timestamps)."""
    from deltamirror.mirror.records.events import EnvelopeEncoder

    encoder = EnvelopeEncoder(
        table_id=table_id,
        table_uri=table_uri,
        version=version,
        commit_timestamp=1,
        commit_timestamp_source="ict",
        count=len(actions),
        snapshot=snapshot,
    )
    return encoder.encode_many(0, list(actions))


def commit_info_value(table_id: str, table_uri: str, version: int, operation: str = "WRITE") -> bytes:
    """The actions-topic value of a version of one action, a ``commitInfo`` (index 0 of 1, commit
    timestamp 1 from In-Commit Timestamps), as the watcher writes it."""
    from deltamirror.mirror import ActionEvent

    return ActionEvent(
        schema_version=1,
        table_id=table_id,
        table_uri=table_uri,
        version=version,
        commit_timestamp=1,
        commit_timestamp_source="ict",
        index=0,
        count=1,
        type="commitInfo",
        snapshot=False,
        action={"operation": operation},
    ).to_json_bytes()


def read_topic(
    kafka: Mapping[str, Any] | str, topic: str, *, isolation: str = "read_committed", timeout_s: float = 30.0
) -> list[Rec]:
    """Every record of ``topic`` from its beginning to its end (each partition read to its end
    once); [] when the topic does not exist."""
    return read_topics(kafka, [topic], isolation=isolation, timeout_s=timeout_s)[topic]


def read_topics(
    kafka: Mapping[str, Any] | str,
    topics: Sequence[str],
    *,
    isolation: str = "read_committed",
    timeout_s: float = 30.0,
) -> dict[str, list[Rec]]:
    """``read_topic`` of each of ``topics`` through one consumer: a test waiting on many tables'
    topics pays for one client and one metadata request, not one per topic."""
    from confluent_kafka import Consumer, TopicPartition

    config = {"bootstrap.servers": kafka} if isinstance(kafka, str) else dict(kafka)
    consumer = Consumer(
        {
            **config,
            "group.id": f"test-{uuid.uuid4().hex[:8]}",
            "isolation.level": isolation,
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
            "logger": _Quiet(),
        }
    )
    out: dict[str, list[Rec]] = {topic: [] for topic in topics}
    try:
        listed = (
            consumer.list_topics(topics[0], timeout=10)
            if len(topics) == 1
            else consumer.list_topics(timeout=10)
        )
        left: set[tuple[str, int]] = set()
        for topic in topics:
            meta = listed.topics.get(topic)
            if meta is not None and meta.error is None:
                left.update((topic, p) for p in meta.partitions)
        if not left:
            return out
        consumer.assign([TopicPartition(topic, p, -2) for topic, p in sorted(left)])
        deadline = time.monotonic() + timeout_s
        while left:
            assert time.monotonic() < deadline, f"{sorted(left)} not read to the end in {timeout_s} s"
            for m in consumer.consume(1000, timeout=0.5):
                if m.error() is not None:
                    if m.error().code() == -191:  # _PARTITION_EOF
                        left.discard((m.topic(), m.partition()))
                    continue
                out[m.topic()].append(
                    Rec(m.topic(), m.partition(), m.offset(), m.key(), m.value(), dict(m.headers() or []))
                )
        return {topic: sorted(recs, key=lambda r: (r.partition, r.offset)) for topic, recs in out.items()}
    finally:
        consumer.close()


class _Quiet:
    def log(self, level: int, msg: str, *args: Any) -> None:
        pass


def wait_for(condition: Callable[[], Any], what: str, timeout_s: float = 60.0, every_s: float = 0.2) -> Any:
    """``condition()`` once it is truthy, polled; an AssertionError naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s} s"
        time.sleep(every_s)


def run_watcher(cfg: Any, until: Callable[[], Any], what: str, timeout_s: float = 60.0) -> Any:
    """A WatchService of ``cfg`` (a WatchConfig or its data) started, ``until()`` waited for, stopped."""
    from deltamirror.producer import WatchConfig
    from deltamirror.producer.service import WatchService

    if not isinstance(cfg, WatchConfig):
        cfg = WatchConfig.model_validate(cfg)
    service = WatchService(cfg, stop_budget_s=5.0)
    service.start()
    try:

        def done() -> Any:
            assert service._failure is None, service._failure
            return until()

        return wait_for(done, what, timeout_s, every_s=0.3)
    finally:
        service.request_stop()
        assert service.wait(30), "the watcher did not stop"
        service.close()
