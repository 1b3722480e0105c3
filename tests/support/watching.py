"""Run the watcher in-process against the test broker until a version is published."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any


def watch_until(
    bootstrap: str,
    table: Path | str,
    actions: str,
    until_version: int,
    prefix: str,
    *,
    table_id: str | None = None,
    snapshot_mode: str = "initial",
    timeout_s: float = 40,
    top_settings: dict[str, Any] | None = None,
    **table_settings: Any,
) -> None:
    """Mirror ``table`` to ``actions`` (and its ``.commits`` partner) until ``until_version`` is
    committed; ``top_settings`` go on the WatchConfig itself."""
    from deltamirror.producer import WatchConfig
    from deltamirror.producer.service import WatchService

    mode: dict[str, Any] = {"snapshot_mode": snapshot_mode}
    if snapshot_mode == "from-version":
        mode["from_version"] = table_settings.pop("from_version", 0)
    cfg = WatchConfig.model_validate(
        {
            "kafka": {"bootstrap_servers": bootstrap},
            "tables": [
                {
                    "uri": str(table),
                    **mode,
                    "actions_topic": actions,
                    "commits_topic": actions.replace(".actions", ".commits"),
                    "poll_interval_s": 0.2,
                    **table_settings,
                }
            ],
            "progress_topic": actions.replace(".actions", ".progress"),
            "transactional_id_prefix": prefix,
            **(top_settings or {}),
        }
    )
    service = WatchService(cfg)
    service.start()
    deadline = time.monotonic() + timeout_s
    try:
        while published_version(bootstrap, cfg.tables[0].commits_topic or "", table_id) < until_version:
            assert time.monotonic() < deadline, "the watcher did not publish in time"
            assert service._failure is None, service._failure
            time.sleep(0.3)
    finally:
        service.request_stop()
        assert service.wait(30)
        service.close()


def published_version(bootstrap: str, commits: str, table_id: str | None = None) -> int:
    """The highest version summarized on ``commits`` (read_committed), or -1."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"t-{uuid.uuid4().hex[:8]}",
            "isolation.level": "read_committed",
        }
    )
    try:
        if commits not in consumer.list_topics(timeout=10).topics:
            return -1
        consumer.assign([TopicPartition(commits, 0, -2)])
        best = -1
        while msgs := consumer.consume(500, timeout=1.0):
            for m in msgs:
                if m.error() is None and (m.value() or b"").startswith(b'{"kind":"commit"'):
                    summary = json.loads(m.value() or b"{}")
                    if table_id is None or summary["tableId"] == table_id:
                        best = max(best, summary["version"])
        return best
    finally:
        consumer.close()
