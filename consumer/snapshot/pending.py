"""The version (or snapshot) a table's state is receiving: its events until the last one arrives."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pyarrow as pa

from deltamirror.core.accumulator import ActionAccumulator
from deltamirror.core.errors import CorruptLogError
from deltamirror.mirror.errors import EventStreamError
from deltamirror.mirror.records.events import ActionEvent

from .files import share_nulls

if TYPE_CHECKING:
    from deltamirror.mirror.records.event_batches import Segment

    from .stats_spill import StatsSpill

#: add/remove bodies of a version held as dicts before they are turned into Arrow
BATCH_ROWS = 8192


class PendingVersion:
    """The events of the version (or snapshot) being received, and whether they come in order.

    Its ``add`` and ``remove`` bodies go to core's :class:`~deltamirror.core.accumulator.ActionAccumulator`
    (Arrow every few thousand rows, each row with its index in the version as its ``__order``), as
    log replay's do. The other actions are kept as they were published: the state holds and
    persists them as JSON, where the accumulator would turn them into typed models.

    With a ``spill``, each ``add``'s ``stats`` goes to it as it arrives (the accumulator gets the
    add without it) and :meth:`file_actions` gives the adds with its reference in place of it.
    """

    def __init__(
        self,
        table_id: str,
        version: int,
        snapshot: bool,
        count: int,
        commit_timestamp: int | None = None,
        spill: StatsSpill | None = None,
    ) -> None:
        self.table_id = table_id
        self.version = version
        self.snapshot = snapshot
        self.count = count
        self.commit_timestamp = commit_timestamp
        self.received = 0
        self.others: list[tuple[str, Any]] = []
        self._files = ActionAccumulator(table=table_id, batch_rows=BATCH_ROWS)
        self._spill = spill
        #: the references of the adds' stats in the spill, in the order the adds came
        self._refs: list[pa.Array] = []

    def describe(self) -> str:
        return f"{'snapshot' if self.snapshot else 'version'} {self.version}"

    def take(self, event: ActionEvent) -> None:
        self._take(event.index, event.type, event.action)
        self.received += 1

    def take_segment(self, segment: Segment) -> None:
        """The events of a decoded segment (the next ones of the version, in order): its file
        actions as the Arrow rows the batch decoder made, its other actions as :meth:`take`'s."""
        for name, rows in (("add", segment.adds), ("remove", segment.removes)):
            if rows is not None:
                if name == "add" and self._spill is not None and rows.num_rows:
                    at = rows.schema.get_field_index("stats")
                    self._refs.append(self._spill.put(rows.column(at)))
                    rows = rows.set_column(at, rows.schema.field(at), pa.nulls(rows.num_rows, pa.string()))
                rows = share_nulls(rows)  # held until the version ends: the unset columns cost nothing
                try:
                    self._files.take_file_table(name, rows)
                except CorruptLogError as exc:
                    raise self._misfit(f"a {name} action", f"a checkpoint's {name}", exc) from None
        for index, action_type, action in segment.others:
            self._take(index, action_type, action)
        self.received += segment.stop - segment.start

    def _take(self, index: int, action_type: str, action: Any) -> None:
        """One action of the version (the ``index``-th), as it was published."""
        if action_type == "add" or action_type == "remove":
            if type(action) is not dict:  # parsed JSON: an object is a dict
                raise EventStreamError(
                    f"action {index} ({action_type}) is not an object",
                    table=self.table_id,
                    version=self.version,
                )
            if action_type == "add" and self._spill is not None:
                stats = action.get("stats")
                if stats is not None and type(stats) is not str:
                    raise EventStreamError(
                        f"action {index} (add) has stats that are not a string",
                        table=self.table_id,
                        version=self.version,
                    )
                self._refs.append(self._spill.put(pa.array([stats], pa.string())))
                action = {**action, "stats": None}
            try:
                self._files.take_files(action_type, [action], first_order=index)
            except CorruptLogError as exc:
                raise self._misfit(f"a {action_type} action", f"a checkpoint's {action_type}", exc) from None
        else:
            self.others.append((action_type, action))

    def file_actions(self) -> tuple[pa.Table, pa.Table]:
        """(adds, removes) with ``__order``, as core's reconcile takes them (with a spill, the
        adds' ``stats`` are their references)."""
        try:
            adds, removes = self._files.file_actions()
        except CorruptLogError as exc:
            raise self._misfit("an add or remove action", "a checkpoint's add or remove", exc) from None
        if self._spill is None:
            return adds, removes
        refs = pa.chunked_array(self._refs, pa.int64())
        if len(refs) != adds.num_rows:  # every add went through the spill
            raise AssertionError(f"{adds.num_rows} adds, {len(refs)} stats spilled")
        at = adds.schema.get_field_index("stats")
        return adds.set_column(at, pa.field("stats", pa.int64()), refs), removes

    def _misfit(self, what: str, columns: str, exc: CorruptLogError) -> EventStreamError:
        """The accumulator's refusal, as what it is here: an event that breaks the contract."""
        reason = exc.__cause__ if exc.__cause__ is not None else exc.message
        return EventStreamError(
            f"{what} does not fit the columns of {columns}: {reason}",
            table=self.table_id,
            version=self.version,
        )


__all__ = ["BATCH_ROWS", "PendingVersion"]
