"""Tables shared by a group of watchers: which run here, started and stopped as shards move.

``watch --group NAME`` makes this instance a member of the Kafka consumer group
``<transactional_id_prefix>-<NAME>`` over the assignment topic ``deltamirror.<NAME>.shards``
(:mod:`deltamirror.mirror.group`). A table runs here while its shard
(``murmur2(normalized uri) % shards``) is assigned here:

- assigned: the shard's tables start; the shard's producer (``init_transactions``) fences
  whatever a previous owner left, then the progress topic is read (once for the tables that
  resume together) and each table resumes after its position;
- revoked (a clean rebalance: a member joined or left): the tables stop at their next batch
  boundary, finishing the open transaction, before the callback returns and the shard moves;
- lost (this member was silent past the session timeout): the tables stop too, and an idle one
  commits its progress once more, which the new owner's producer fences: a zombie learns at once.

Exactly once across moves rests on the transactional id being the shard's, not the instance's:
the tables of a shard share one producer (:mod:`.shard_producers`) whose id is the same on every
instance, so the newest owner fences every older one, for all the shard's tables at once
(docs/scale-out.md says why this was chosen over KIP-447's per-instance producer).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from deltamirror.core.errors import ConfigError
from deltamirror.mirror.errors import KafkaError
from deltamirror.mirror.group import GroupStatus, ShardGroup, shard_of
from deltamirror.mirror.topic_names import assignment_topic

from ..metrics import GroupMetrics
from ..settings import GroupSettings, TableConfig

log = logging.getLogger("deltamirror.group")

#: how long a member waits for the tables of new shards to resume before it reports the rebalance
RESUME_REPORT_LIMIT_S = 300.0
#: between attempts to reach the group while the broker does not answer
RETRY_S = 2.0


class ResumingTable(Protocol):
    """A table started here, as the group side watches it resume."""

    @property
    def ready(self) -> threading.Event: ...

    @property
    def stop(self) -> threading.Event: ...


class GroupHost(Protocol):
    """What the group side asks of the service that runs the tables, and all it may use of it."""

    @property
    def stop_budget_s(self) -> float: ...

    def tables(self) -> list[TableConfig]: ...

    def start_tables(self, tables: Sequence[TableConfig]) -> Sequence[ResumingTable | None]:
        """Start each of ``tables`` here (several at once: each start waits on its table's storage),
        in the order given; None for one that is not started."""

    def running_tables(self) -> set[str]: ...

    def release_tables(self, uris: Iterable[str], reason: str, *, wait_s: float) -> list[str]: ...

    def renew_shard_producers(self, shards: set[int]) -> None:
        """Producers left from before a shard went away are not reused for it."""

    def group_ready(self) -> None:
        """The tables of the first assignment resumed: the member is healthy."""

    def fail(self, exc: BaseException) -> None:
        """The membership cannot go on (a configuration refused, a bug): the service stops."""


class TableSharing:
    """The group side of the service (a :class:`GroupHost`): one thread polls the membership."""

    def __init__(
        self,
        host: GroupHost,
        settings: GroupSettings,
        *,
        kafka: dict[str, Any],
        transactional_id_prefix: str,
        max_record_bytes: int,
        metrics: GroupMetrics | None,
    ) -> None:
        self.host = host
        self.settings = settings
        self.metrics = metrics
        self.max_record_bytes = max_record_bytes
        self.group_id = f"{transactional_id_prefix}-{settings.name}"
        self.topic = assignment_topic(settings.name)
        self.group = ShardGroup(
            kafka,
            group_id=self.group_id,
            topic=self.topic,
            shards=settings.shards,
            session_timeout_ms=settings.session_timeout_ms,
            on_assign=self._assigned,
            on_revoke=lambda shards: self._released(shards, "revoked"),
            on_lost=lambda shards: self._released(shards, "lost"),
            on_status=self._status,
        )
        self._leave = threading.Event()
        self._thread: threading.Thread | None = None
        self._first_ready = False

    def shard(self, uri: str) -> int:
        return shard_of(uri, self.settings.shards)

    def owns(self, uri: str) -> bool:
        """Whether the table's shard is assigned here now."""
        return self.shard(uri) in self.group.status.shards

    # --- the membership thread ------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="watch-group", daemon=True)
        self._thread.start()

    def leave(self, timeout_s: float | None) -> bool:
        """Leave the group (call once the tables stopped: the shards move at once); True when left."""
        self._leave.set()
        if self._thread is None:
            return True
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def _run(self) -> None:
        while not self._leave.is_set():
            try:
                self.group.ensure_topic(self.max_record_bytes)
                log.info(
                    "joining group",
                    extra={"group": self.group_id, "topic": self.topic, "shards": self.settings.shards},
                )
                self.group.run(self._leave)
                return
            except ConfigError as exc:
                self.host.fail(exc)
                return
            except KafkaError as exc:
                log.warning("cannot join group %s (retrying): %s", self.group_id, exc)
                self._leave.wait(RETRY_S)
            except Exception as exc:  # a bug: the process must not go on without its membership
                self.host.fail(exc)
                return

    # --- callbacks (on the membership thread) ---------------------------------------------------

    def _status(self, status: GroupStatus) -> None:
        if self.metrics is not None:
            self.metrics.group_status(status.group_id, status.state, status.assignments, status.shards)

    def _assigned(self, shards: set[int]) -> None:
        started = time.monotonic()
        self.host.renew_shard_producers(shards)
        tables = [t for t in self.host.tables() if self.shard(t.normalized_uri) in shards]
        pipelines = [p for p in self.host.start_tables(tables) if p is not None]
        log.info(
            "shards assigned",
            extra={"group": self.group_id, "shards": sorted(shards), "tables": len(pipelines)},
        )
        if self.metrics is not None:
            self.metrics.shards_moved(assigned=len(shards))
        threading.Thread(
            target=self._report_resumed, args=(pipelines, started), name="watch-resumed", daemon=True
        ).start()

    def _report_resumed(self, pipelines: list[ResumingTable], started: float) -> None:
        """When every table of the new shards has resumed: the rebalance's duration, and health."""
        deadline = started + RESUME_REPORT_LIMIT_S
        for pipeline in pipelines:
            while not pipeline.ready.wait(0.2):
                if pipeline.stop.is_set() or time.monotonic() > deadline:
                    return
        took = time.monotonic() - started
        if self.metrics is not None:
            self.metrics.rebalance_took(took)
        log.info(
            "tables of the assigned shards resumed",
            extra={"group": self.group_id, "tables": len(pipelines), "seconds": round(took, 3)},
        )
        if not self._first_ready:
            self._first_ready = True
            self.host.group_ready()

    def _released(self, shards: set[int], reason: str) -> None:
        started = time.monotonic()
        uris = [u for u in self.host.running_tables() if self.shard(u) in shards]
        log.info(
            f"shards {reason}",
            extra={"group": self.group_id, "shards": sorted(shards), "tables": len(uris)},
        )
        left = self.host.release_tables(uris, reason, wait_s=self.host.stop_budget_s)
        took = time.monotonic() - started
        if self.metrics is not None:
            self.metrics.shards_moved(revoked=len(shards))
            self.metrics.rebalance_took(took)
        if left:
            log.warning(
                "%d table(s) of the %s shards did not stop within %.0f s; their next owner fences them",
                len(left),
                reason,
                self.host.stop_budget_s,
                extra={"group": self.group_id},
            )


__all__ = ["GroupHost", "ResumingTable", "TableSharing"]
