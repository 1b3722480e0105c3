"""The consumer side of invalidation: each applied version as a document, acknowledged after delivery.

:class:`InvalidationConsumer` is a :class:`~deltamirror.consumer.snapshot.SnapshotConsumer` that
turns each applied version into a document (:mod:`.payload`) and hands it to ``on_payload``
synchronously, in the order the versions were applied. What the state does not keep (commit
timestamp, operation, the offset of a version's last record) is taken from the same decoded batch
the state applies (the first record of a version, its ``commitInfo``, its last): nothing is parsed
twice.

Acknowledgement. The snapshot consumer stores its offsets before it reports; this one holds them
until every document of the checkpoint was handled, and when one fails (or a stop interrupts it)
stores them capped at the last record of the first document not handled. With
``skip_acknowledged`` the group's committed offsets are the record of what was delivered: a
version whose last record lies before them was handed over, one at or after them was not (or
perhaps was: at least once). A start reads from the saved state (``state_dir``) or the topic's
beginning, applies again what follows, and hands over only the versions not acknowledged. The
snapshot consumer saves a state only after reporting the versions in it, and once a report
failed this one saves nothing more: a saved state never holds a version not handed over.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from deltamirror.core.errors import ConfigError
from deltamirror.mirror.errors import StopRequested, TopicNotFoundError
from deltamirror.mirror.records.events import SchemaChanged, TableDropped, TableReplaced

from ..snapshot import IncrementalSnapshot, Invalidation, SnapshotConsumer, TableReplacement
from .payload import DEFAULT_MAX_ITEMS, Payload, replacement_payload, schema_payload, version_payload

if TYPE_CHECKING:
    from deltamirror.mirror.kafka.consumer import Record
    from deltamirror.mirror.records.event_batches import Envelope, Segment
    from deltamirror.mirror.records.events import ActionEvent

DEFAULT_GROUP_ID = "deltamirror-invalidate"

log = logging.getLogger("deltamirror.consumer.invalidate")


@dataclass
class _Unit:
    """What the state does not keep of a version being read: when, what, and where it ended."""

    version: int
    snapshot: bool
    count: int
    commit_timestamp: int
    operation: str | None = None
    end: tuple[int, int] | None = None  # (partition, offset) of its last record


class _HeldOffsets:
    """Takes the offsets a checkpoint would store, so that they are stored after the reports."""

    def __init__(self) -> None:
        self.offsets: dict[tuple[str, int], int] | None = None

    def store_offsets(self, offsets: Mapping[tuple[str, int], int]) -> None:
        self.offsets = dict(offsets)


class InvalidationConsumer(SnapshotConsumer):
    """A :class:`SnapshotConsumer` that reports each applied version as a document, at least once.

    ``on_payload`` gets each document (:func:`version_payload`, :func:`replacement_payload`) in
    order and must return only once it is handled: the group's offsets are stored after it, and
    an exception stops the run with the offsets of what was handled before it. With
    ``skip_acknowledged`` (``deltamirror invalidate``) the versions that end before the group's
    committed offsets are not reported again; without it every applied version is
    (``consume-snapshot``, whose position is its state directory). Other options are
    SnapshotConsumer's.
    """

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        *,
        on_payload: Callable[[Payload], object],
        max_items: int = DEFAULT_MAX_ITEMS,
        skip_acknowledged: bool = True,
        group_id: str = DEFAULT_GROUP_ID,
        **options: Any,
    ) -> None:
        if max_items < 0:
            raise ConfigError(f"max items must be 0 or more, not {max_items}")
        # deliveries are what this consumer is for: a save bounds what a crash delivers again, so
        # the interval applies while catching up too (a snapshot consumer defers it to save work)
        options.setdefault("catch_up_saves", True)
        super().__init__(
            bootstrap_servers,
            topic,
            group_id=group_id,
            on_applied=self._applied,
            on_replaced=self._replaced,
            on_schema_changed=self._schema_changed,
            **options,
        )
        self.on_payload = on_payload
        self.max_items = max_items
        self.skip_acknowledged = skip_acknowledged
        #: documents not reported again because the group had acknowledged them
        self.acknowledged_before = 0
        self._acked: dict[tuple[str, int], int] = {}
        self._open: dict[str, _Unit] = {}
        self._done: dict[tuple[str, int, bool], _Unit] = {}
        self._replaced_at: dict[TableReplacement, tuple[int, int]] = {}
        #: where each schemaChanged not handed over yet was read: (table id, version) -> (partition, offset)
        self._schema_at: dict[tuple[str, int], tuple[int, int]] = {}
        self._commits_at: tuple[int, int] | None = None
        self._in_flight: tuple[str, tuple[int, int] | None] | None = None
        #: a report failed or was stopped: the state is past a document not handled (see checkpoint)
        self.undelivered = False

    def run(self, *, once: bool = False, topic_timeout_s: float = 30.0) -> None:
        if self.skip_acknowledged:
            self._acked = self._read_acknowledged(once, topic_timeout_s)
        super().run(once=once, topic_timeout_s=topic_timeout_s)

    def _read_acknowledged(self, once: bool, timeout_s: float) -> dict[tuple[str, int], int]:
        """The group's committed offsets; as the run itself, without ``once`` a topic is waited for."""
        from deltamirror.mirror.kafka.consumer import MirrorConsumer

        out: dict[tuple[str, int], int] = {}
        with MirrorConsumer(self.config, group_id=self.group_id) as reader:
            for topic in (self.topic, self.commits_topic):
                if topic is None:
                    continue
                try:
                    partitions = reader.partitions(
                        topic, timeout_s=timeout_s, stop=self.stop_event, wait_for_topic=not once
                    )
                    if partitions:
                        committed = reader.committed(topic, partitions, stop=self.stop_event)
                        out.update({(topic, p): o for p, o in committed.items()})
                except TopicNotFoundError:
                    pass  # nothing acknowledged yet
                except StopRequested:
                    break  # the run stops at once anyway
        if out and not any(self._offsets.values()):
            # a start with no position of its own: what the group acknowledged decides, say so
            log.warning(
                "consumer group %s acknowledged %s: the versions before are not handed over again "
                "(a new receiver needs a consumer group of its own: --group-id, or a new --state-dir)",
                self.group_id,
                ", ".join(f"{t}[{p}] up to offset {o}" for (t, p), o in sorted(out.items())),
            )
        return out

    # --- what the state does not keep ------------------------------------------------------------

    def _take_commits(
        self, partition: int, offset: int, value: bytes, kind: str | None, record: Record | None = None
    ) -> None:
        self._commits_at = (partition, offset)
        try:
            super()._take_commits(partition, offset, value, kind, record)
        finally:
            self._commits_at = None

    def _segment_read(self, segment: Segment, partition: int, offsets: list[int]) -> None:
        """A version's first record opens its unit, its ``commitInfo`` names the operation, its
        last record is where the version ends (decoded once, with the records the state applies)."""
        env = segment.envelope
        if segment.first_index == 0:
            self._open[env.table_id] = _Unit(env.version, env.snapshot, env.count, env.commit_timestamp)
        unit = self._open.get(env.table_id)
        if unit is None:
            return
        if unit.operation is None:
            for _, action_type, action in segment.others:
                operation = action.get("operation") if isinstance(action, dict) else None
                if action_type == "commitInfo" and isinstance(operation, str):
                    unit.operation = operation
                    break
        if segment.last_index + 1 >= unit.count:
            unit.end = (partition, offsets[segment.stop - 1])
            self._done[(env.table_id, unit.version, unit.snapshot)] = unit
            del self._open[env.table_id]

    def _after_apply(
        self,
        state: IncrementalSnapshot,
        head: ActionEvent | Envelope,
        applied: Invalidation | None,
        starts: dict[str, int],
        starts_version: bool,
        first: int,
    ) -> None:
        super()._after_apply(state, head, applied, starts, starts_version, first)
        if applied is None and not state.in_progress:
            # read whole but not applied (the state had it: a re-read, or a republished one):
            # never reported, so not kept either
            self._done.pop((head.table_id, head.version, head.snapshot), None)

    def replace(self, record: TableReplaced | TableDropped) -> TableReplacement:
        notice = super().replace(record)
        if self._commits_at is not None:
            self._replaced_at[notice] = self._commits_at
        return notice

    def schema_changed(self, record: SchemaChanged) -> None:
        super().schema_changed(record)
        if self._commits_at is not None:
            self._schema_at[(record.table_id, record.version)] = self._commits_at

    # --- reports -----------------------------------------------------------------------------------

    def _acknowledged(self, topic: str | None, at: tuple[int, int] | None) -> bool:
        return topic is not None and at is not None and at[1] < self._acked.get((topic, at[0]), 0)

    def _applied(self, invalidation: Invalidation, state: IncrementalSnapshot) -> None:
        unit = self._done.pop((invalidation.table_id, invalidation.version, invalidation.snapshot), None)
        for key in [k for k in self._done if k[0] == invalidation.table_id and k[1] <= invalidation.version]:
            del self._done[key]  # versions the state skipped (applied before): never reported
        end = unit.end if unit is not None else None
        if self._acknowledged(self.topic, end):
            self.acknowledged_before += 1
            return
        payload = version_payload(
            invalidation,
            table_uri=state.table_uri,
            commit_timestamp=unit.commit_timestamp if unit is not None else None,
            operation=unit.operation if unit is not None else None,
            max_items=self.max_items,
        )
        self._in_flight = (self.topic, end)
        self.on_payload(payload)
        self._in_flight = None

    def _replaced(self, notice: TableReplacement) -> None:
        at = self._replaced_at.pop(notice, None)
        if self._acknowledged(self.commits_topic, at):
            self.acknowledged_before += 1
            return
        self._in_flight = (self.commits_topic or "", at)
        self.on_payload(replacement_payload(notice))
        self._in_flight = None

    def _schema_changed(self, record: SchemaChanged) -> None:
        at = self._schema_at.pop((record.table_id, record.version), None)
        if self._acknowledged(self.commits_topic, at):
            self.acknowledged_before += 1
            return
        self._in_flight = (self.commits_topic or "", at)
        self.on_payload(schema_payload(record, max_items=self.max_items))
        self._in_flight = None

    # --- offsets: stored after the reports -----------------------------------------------------------

    def checkpoint(self, consumer: Any = None) -> None:
        """SnapshotConsumer's checkpoint, but the offsets go to ``consumer`` after the reports.

        When a report fails (or a stop interrupts it), the offsets stored are capped at the last
        record of each document not handled yet, so that a restart reports it again, and from
        then on nothing is stored or saved: the state holds a version that was not handed over.
        """
        if self.undelivered:
            return
        held = _HeldOffsets()
        try:
            super().checkpoint(held)
        except BaseException:
            self.undelivered = True
            capped = self._capped(held.offsets) if held.offsets else None
            self._in_flight = None
            if consumer is not None and capped:
                consumer.store_offsets(capped)
            raise
        if consumer is not None and held.offsets:
            consumer.store_offsets(self._never_back(held.offsets))

    def save(self, offsets: Mapping[int, int] | None = None) -> None:
        """SnapshotConsumer's save (``state_dir``), never of a state past a version not handed over."""
        if not self.undelivered:
            super().save(offsets)

    def _never_back(self, offsets: Mapping[tuple[str, int], int]) -> dict[tuple[str, int], int]:
        """A rebuild starts from the beginning: its first offsets must not undo the group's."""
        return {k: max(o, self._acked.get(k, o)) for k, o in offsets.items()}

    def _capped(self, offsets: Mapping[tuple[str, int], int]) -> dict[tuple[str, int], int] | None:
        """The offsets below every document not handled; None when one's position is unknown."""
        pending: list[tuple[str | None, tuple[int, int] | None]] = []
        if self._in_flight is not None:
            pending.append(self._in_flight)
        pending.extend((self.topic, u.end) for u in self._done.values())
        pending.extend((self.commits_topic, at) for at in self._replaced_at.values())
        pending.extend((self.commits_topic, at) for at in self._schema_at.values())
        capped = dict(offsets)
        for topic, at in pending:
            if topic is None or at is None:
                return None
            key = (topic, at[0])
            if key in capped:
                capped[key] = min(capped[key], at[1])
        return self._never_back(capped)


__all__ = ["DEFAULT_GROUP_ID", "InvalidationConsumer"]
