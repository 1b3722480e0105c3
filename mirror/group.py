"""Which tables this instance runs, decided by Kafka's own consumer-group protocol.

Every watcher of a group is a member of the consumer group ``<prefix>-<name>`` subscribed to the
assignment topic ``deltamirror.<name>.shards``, which has one partition per shard. A table belongs
to shard ``murmur2(normalized uri) % shards`` (:func:`shard_of`); the group coordinator hands each
partition, hence each shard, to exactly one live member, with the ``cooperative-sticky`` assignor:
a rebalance moves only the shards that must move, and the others keep running. Nothing is ever
produced to the assignment topic and no offset is committed: the topic only gives the group
something to divide. So no coordinator of our own, no extra service, and the broker's session
timeout decides when a silent member is gone.

:class:`ShardGroup` is the membership: one consumer, polled from one thread (:meth:`ShardGroup.run`),
which calls back with the shards gained, revoked (a clean hand-over) or lost (this member was
thrown out: another one may already run them).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka import KafkaError as RdKafkaError

from deltamirror.core.errors import ConfigError

from .errors import KafkaError
from .kafka import clients
from .topics import TopicManager, murmur2_partition

log = logging.getLogger("deltamirror.group")

#: how long one poll of the group consumer waits: callbacks and a stop are served within it
POLL_S = 0.2


def shard_of(table_uri: str, shards: int) -> int:
    """The shard of a table: Kafka's murmur2 of its normalized URI, modulo the number of shards."""
    return murmur2_partition(table_uri.encode(), shards)


@dataclass
class GroupStatus:
    """What ``/healthz`` says about the membership.

    ``state``: ``not joined`` (starting, thrown out, or left), ``rebalancing`` (shards were just
    revoked, the next assignment is pending) or ``joined``. ``assignments`` counts the assignments
    this member received: librdkafka does not expose the group's generation id, and this number
    grows with it, once per rebalance this member took part in.
    """

    group_id: str
    state: str = "not joined"
    assignments: int = 0
    shards: frozenset[int] = field(default_factory=frozenset)


ShardCallback = Callable[[set[int]], None]


class ShardGroup:
    """This instance's membership in a group of watchers (one consumer, one polling thread).

    ``on_assign(shards)`` is called with the shards this member gained (at the end of every
    rebalance it took part in, maybe none), ``on_revoke(shards)`` with
    the ones it must hand over (the callback should stop their tables before it returns: the next
    owner starts them once it does), ``on_lost(shards)`` with the ones it was found to have lost
    (the session expired: another member may already run them, and fencing protects the data).
    The callbacks run on the polling thread.
    """

    def __init__(
        self,
        kafka: Mapping[str, Any],
        *,
        group_id: str,
        topic: str,
        shards: int,
        session_timeout_ms: int,
        on_assign: ShardCallback,
        on_revoke: ShardCallback,
        on_lost: ShardCallback,
        on_status: Callable[[GroupStatus], None] = lambda status: None,
    ) -> None:
        self.kafka = dict(kafka)
        self.topic = topic
        self.shards = shards
        self.session_timeout_ms = session_timeout_ms
        self._on_assign, self._on_revoke, self._on_lost = on_assign, on_revoke, on_lost
        self._on_status = on_status
        self.status = GroupStatus(group_id)
        self._consumer: Consumer | None = None

    # --- the assignment topic -------------------------------------------------------------------

    def ensure_topic(self, max_record_bytes: int = 1_000_000) -> None:
        """Create the assignment topic with one partition per shard, or check the existing one.

        An existing topic with another partition count is a ConfigError: the same table would be
        in different shards for different members, and two of them could run it.
        """
        manager = TopicManager(self.kafka, max_record_bytes=max_record_bytes)
        found = manager.ensure_assignment_topic(self.topic, self.shards)
        if found != self.shards:
            raise ConfigError(
                f"assignment topic {self.topic} has {found} partitions but group.shards is {self.shards}: "
                "every member of a group must use the same number of shards (set group.shards to "
                f"{found}, or use another group name)",
                topic=self.topic,
            )

    # --- membership -----------------------------------------------------------------------------

    def consumer_config(self) -> dict[str, Any]:
        session = self.session_timeout_ms
        return {
            **self.kafka,
            "group.id": self.status.group_id,
            "partition.assignment.strategy": "cooperative-sticky",
            "session.timeout.ms": session,
            "heartbeat.interval.ms": max(100, session // 5),
            # the polling thread blocks while revoked tables finish their transaction
            "max.poll.interval.ms": max(60_000, 6 * session),
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "latest",
        }

    def _set(self, state: str, shards: frozenset[int] | None = None, *, assigned: bool = False) -> None:
        self.status.state = state
        if shards is not None:
            self.status.shards = shards
        if assigned:
            self.status.assignments += 1
        self._on_status(self.status)

    def _assigned(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        gained = {p.partition for p in partitions}
        self._set("joined", self.status.shards | gained, assigned=True)
        self._on_assign(gained)  # even empty: the member is joined

    def _revoked(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        gone = {p.partition for p in partitions}
        self._set("rebalancing", self.status.shards - gone)
        if gone:
            self._on_revoke(gone)

    def _lost(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        gone = {p.partition for p in partitions}
        self._set("not joined", self.status.shards - gone)
        if gone:
            self._on_lost(gone)

    def run(self, stop: threading.Event) -> None:
        """Join the group and serve its callbacks until ``stop`` is set, then leave it.

        Leaving revokes every shard through ``on_revoke`` (the caller has usually stopped the
        tables already) and lets the others take them at once, without waiting for a timeout.
        """
        try:
            consumer = clients.consumer(self.consumer_config())
        except KafkaException as exc:
            raise KafkaError(f"cannot create the group consumer: {exc.args[0]}") from None
        self._consumer = consumer
        try:
            consumer.subscribe(
                [self.topic], on_assign=self._assigned, on_revoke=self._revoked, on_lost=self._lost
            )
            while not stop.is_set():
                msg = consumer.poll(POLL_S)
                error = None if msg is None else msg.error()
                if error is not None and error.code() == RdKafkaError.INVALID_SESSION_TIMEOUT:
                    # the member would never join (the brokers bound it by their
                    # group.min/max.session.timeout.ms): said once, as the setting's problem
                    raise ConfigError(
                        f"group.session_timeout_ms: the brokers refuse {self.session_timeout_ms} ms "
                        "(outside their group.min.session.timeout.ms .. group.max.session.timeout.ms)",
                        topic=self.topic,
                    )
                if error is not None:
                    log.warning("group consumer: %s", error.str(), extra={"topic": self.topic})
        finally:
            started = time.monotonic()
            try:
                consumer.close()  # leaves the group: on_revoke for what is still held
            except (KafkaException, RuntimeError) as exc:
                log.warning("leaving the group failed: %s", exc)
            self._consumer = None
            self._set("not joined", frozenset())
            log.info("left the group", extra={"seconds": round(time.monotonic() - started, 3)})


__all__ = ["GroupStatus", "ShardGroup", "shard_of"]
