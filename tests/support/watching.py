"""Run the watcher in-process against the test broker until a version is published."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from deltamirror.producer import WatchConfig


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


def watch_row_changes(
    bootstrap: str,
    table: Path | str,
    actions: str,
    until_version: int,
    row_changes: dict[str, Any],
    *,
    changes_topic: str | None = None,
    transaction_topic: str | None = None,
    **table_settings: Any,
) -> str:
    """:func:`watch_until` from version 0 with ``row_changes`` on, to ``actions`` and its changes
    and transaction topics (by default its ``.changes`` and ``.transaction`` partners), under a
    transactional id prefix of its own; returns the changes topic."""
    changes = changes_topic or actions.replace(".actions", ".changes")
    watch_until(
        bootstrap,
        table,
        actions,
        until_version,
        f"dm-{uuid.uuid4().hex[:10]}",
        snapshot_mode="from-version",
        changes_topic=changes,
        transaction_topic=transaction_topic or actions.replace(".actions", ".transaction"),
        row_changes=row_changes,
        **table_settings,
    )
    return changes


#: a time before every commit of the tables a test writes: a discover prefix from it mirrors the whole log
FROM_THE_START = "2000-01-01T00:00:00Z"


def shared_watch_settings(bootstrap: str, lake: Path | str, name: str, **top: Any) -> dict[str, Any]:
    """The settings of a watcher over every table under ``lake`` on the prefix's shared topics
    (``deltamirror.NAME.actions`` / ``.commits``), each table's whole log, found and polled quickly,
    with a progress topic and transactional ids of ``name``'s; ``top``: more top-level settings."""
    return {
        "kafka": {"bootstrap_servers": bootstrap},
        "discover": [
            {
                "uri": str(lake),
                "name": name,
                "topics": "shared",
                "snapshot_mode": "from-timestamp",
                "from_timestamp": FROM_THE_START,
                "interval_s": 0.3,
                "poll_interval_s": 0.2,
            }
        ],
        "progress_topic": f"{name}.progress",
        "transactional_id_prefix": f"{name}-dm",
        **top,
    }


def discover_config(
    bootstrap: str, lake: Path | str, name: str, *, poll_interval_s: float = 0.2, **top: Any
) -> WatchConfig:
    """The :class:`~deltamirror.producer.WatchConfig` of a watcher that discovers the tables under
    ``lake`` (named ``name``, each on its own topics), found every 0.3 s and polled every
    ``poll_interval_s``; ``top``: the top-level settings (``progress_topic`` at least)."""
    from deltamirror.producer import WatchConfig

    return WatchConfig.model_validate(
        {
            "kafka": {"bootstrap_servers": bootstrap},
            "discover": [
                {"uri": str(lake), "name": name, "interval_s": 0.3, "poll_interval_s": poll_interval_s}
            ],
            **top,
        }
    )


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


class RecordingService:
    """What discovery hands the watch service (the host of its tables), recorded: the tables
    added, those removed with the reason, and the ones running."""

    def __init__(self) -> None:
        self.added: list[Any] = []
        self.removed: list[tuple[str, str]] = []
        self.running: set[str] = set()

    def add_table(self, table: Any) -> None:
        self.added.append(table)
        self.running.add(table.normalized_uri)

    def add_tables(self, tables: Any, *, each: Any = None) -> dict[str, Any]:
        """What the watch service does for a scan's new tables, one by one: none refused."""
        for table in tables:
            if each is not None:
                each(table)
            self.add_table(table)
        return {}

    def remove_table(self, normalized_uri: str, *, reason: str) -> None:
        self.removed.append((normalized_uri, reason))

    def running_tables(self) -> set[str]:
        return set(self.running)
