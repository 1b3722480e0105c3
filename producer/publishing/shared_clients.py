"""The Kafka clients the tables of one watcher share, so that tables do not cost clients.

librdkafka allows about 1,000 clients per process. A running table would otherwise hold a
producer, and while it resumes an admin client (its topic checks) and a consumer (its progress).
Shared here: one admin client for the process (each topic checked once), one read of the
progress topic for the tables that resume together (:class:`~.progress.ProgressBoard`), one read
of a topic's tail for those of them that read it (:class:`~.tails.TailBoard`), and in a
group one transactional producer per shard (:mod:`..group.shard_producers`).
"""

from __future__ import annotations

import threading
from typing import Any

from deltamirror.mirror.kafka.producer import TransactionalPublisher
from deltamirror.mirror.topic_names import TableTopics
from deltamirror.mirror.topics import TopicLimits, TopicManager

from ..group.shard_producers import ShardProducers
from ..settings import WatchConfig
from .progress import ProgressBoard
from .tails import TailBoard


class SharedClients:
    """What the tables of one :class:`~.service.WatchService` share (created on first use)."""

    def __init__(self, cfg: WatchConfig, kafka: dict[str, Any]) -> None:
        self.cfg = cfg
        self.kafka = kafka
        self.progress = ProgressBoard(kafka, cfg.progress_topic, end_offsets=self._end_offsets)
        #: one read of a topic's tail for the tables that resume together (shared topics)
        self.tails = TailBoard(kafka, self._end_offsets)
        self._topics: TopicManager | None = None
        self._closed = False
        self._lock = threading.Lock()
        #: one producer per shard, in a group; None without one (each table has its own producer)
        self.shards = (
            ShardProducers(self._new_publisher, prefix=cfg.transactional_id_prefix, group=cfg.group.name)
            if cfg.group is not None
            else None
        )

    def topics(self) -> TopicManager:
        """The one admin client of the service (created on first use: no broker is needed before)."""
        with self._lock:
            if self._topics is None:
                self._topics = TopicManager(self.kafka, max_record_bytes=self.cfg.max_record_bytes)
            return self._topics

    def reachable(self, timeout_s: float) -> bool:
        """Whether a broker answers a metadata request (the shared admin client); True once closed."""
        with self._lock:
            if self._closed:
                return True
        return self.topics().reachable(timeout_s)

    def close(self) -> None:
        """Let the admin client go (it has no close: the last reference dropped destroys it), so
        that no client of the service outlives it (one would retry a broker that is gone)."""
        with self._lock:
            self._closed = True
            self._topics = None

    def _end_offsets(self, topic: str, committed: bool) -> dict[int, int]:
        return self.topics().end_offsets(topic, committed=committed)

    def _new_publisher(self, transactional_id: str) -> TransactionalPublisher:
        return TransactionalPublisher(
            self.kafka, transactional_id, max_message_bytes=self.cfg.max_record_bytes
        )


def check_topics(
    manager: TopicManager, topics: TableTopics, progress_topic: str, *, rows: bool, fresh: bool
) -> dict[str, TopicLimits]:
    """A table's topics created or checked (``fresh``: asked again), with what each accepts."""
    limits = {
        name: manager.ensure_event_topic(name, fresh=fresh) for name in (topics.actions, topics.commits)
    }
    if rows:
        for name in (topics.changes, topics.transaction):
            limits[name] = manager.ensure_event_topic(name, compacted_ok=True, fresh=fresh)
    manager.ensure_progress_topic(progress_topic, fresh=fresh)
    return limits


__all__ = ["SharedClients", "check_topics"]
