"""Actions read in log order, gathered into what they do to a table's state: the one place that
applies them.

Log replay (the commits after a checkpoint), checkpoint reading and a consumer that rebuilds a
table from a stream of action events all meet the same actions and must apply them alike:

- the newest ``metaData`` and ``protocol`` win;
- a ``txn`` is kept per ``appId``, the newest winning;
- a ``domainMetadata`` is kept per domain; a removed one removes its domain from the state it is
  applied over (:meth:`ActionAccumulator.domains_over`);
- the first ``commitInfo`` of each version is kept;
- ``add`` and ``remove`` become Arrow rows, in the columns of a checkpoint's, with their place in
  the log in an ``__order`` column: what :func:`~deltamirror.core.replay.reconcile` takes to pick,
  per file, the action that wins;
- action types this version of deltamirror does not know are counted, never applied.

Usage (a consumer of action events)::

    acc = ActionAccumulator(table=uri, batch_rows=8192)
    for index, (name, body) in enumerate(actions_of_one_version):
        if name in ("add", "remove"):
            acc.take_files(name, [body], first_order=index)
        else:
            acc.take(version, name, body)
    adds, removes = acc.file_actions()
    files, tombstones = reconcile(files, tombstones, adds, removes)
    metadata = acc.metadata or metadata
    txns, domains = acc.txns_over(txns), acc.domains_over(domains)

Bodies are taken as the log boundary (:mod:`.actions`) validated them; a body that does not fit
its model or the Arrow columns is a :class:`~deltamirror.core.errors.CorruptLogError`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
from pydantic import ValidationError

from . import action_schema
from .actions import KNOWN_ACTIONS, field_problem
from .errors import CorruptLogError
from .models import Action, CommitInfo, DomainMetadata, Metadata, Protocol, Txn, model_of

__all__ = ["APPLIED_ACTIONS", "FILE_ROWS", "ORDER", "ActionAccumulator"]

#: the column of an action's place in the log (ascending: later actions have higher numbers)
ORDER = "__order"
#: the non-file actions that change the table state
APPLIED_ACTIONS = frozenset({"metaData", "protocol", "txn", "domainMetadata", "commitInfo"})
#: the Arrow columns of the file actions, by type: a checkpoint's, then ``__order``
FILE_ROWS = {
    "add": action_schema.ADD.append(pa.field(ORDER, pa.int64())),
    "remove": action_schema.REMOVE.append(pa.field(ORDER, pa.int64())),
}


class ActionAccumulator:
    """The actions of consecutive versions (or of one snapshot), applied in log order.

    ``table`` names the table in errors. ``batch_rows`` turns file actions into Arrow every that
    many rows (a long stream then never holds them as Python objects); None keeps them until
    :meth:`file_actions`. Non-file state is public and read directly: ``metadata``,
    ``protocol``, ``txns`` (by appId), ``domains`` (by domain; None: removed by a later
    action), ``commit_infos`` (by version) and ``unknown`` (counts by action type).
    """

    def __init__(self, *, table: str | None = None, batch_rows: int | None = None) -> None:
        self.table = table
        self.batch_rows = batch_rows
        self.metadata: Metadata | None = None
        self.protocol: Protocol | None = None
        self.txns: dict[str, Txn] = {}
        self.domains: dict[str, DomainMetadata | None] = {}
        self.commit_infos: dict[int, CommitInfo] = {}
        self.unknown: dict[str, int] = {}
        self._rows: dict[str, list[Mapping[str, Any]]] = {"add": [], "remove": []}
        self._order: dict[str, list[int]] = {"add": [], "remove": []}
        self._tables: dict[str, list[pa.Table]] = {"add": [], "remove": []}
        #: where the run of small tables (fewer than ``batch_rows`` rows) at the end of _tables starts
        self._small: dict[str, int] = {"add": 0, "remove": 0}

    # --- non-file actions ---------------------------------------------------------------------

    def apply(self, action: Action, version: int | None = None) -> None:
        """One parsed action; those that change no state (``cdc``, ``checkpointMetadata``, an
        unknown type...) are ignored, as is a ``commitInfo`` without its ``version``."""
        if isinstance(action, Metadata):
            self.metadata = action
        elif isinstance(action, Protocol):
            self.protocol = action
        elif isinstance(action, Txn):
            self.txns[action.app_id] = action
        elif isinstance(action, DomainMetadata):
            self.domains[action.domain] = None if action.removed else action
        elif isinstance(action, CommitInfo) and version is not None and version not in self.commit_infos:
            self.commit_infos[version] = action

    def take(self, version: int, name: str, value: Any) -> Action | None:
        """One action of ``version`` by its type name and validated body; the model it became when
        it is one of :data:`APPLIED_ACTIONS`, else None (an unknown type is counted)."""
        if name in APPLIED_ACTIONS:
            try:
                action = model_of(name, value)
            except ValidationError as exc:  # the boundary makes this unreachable for log input
                raise CorruptLogError(field_problem(name, exc), table=self.table) from None
            self.apply(action, version)
            return action
        if name not in KNOWN_ACTIONS:
            self.unknown[name] = self.unknown.get(name, 0) + 1
        return None

    def txns_over(self, base: Mapping[str, Txn]) -> dict[str, Txn]:
        """The txns of ``base`` (an earlier state's) with the taken ones applied over them."""
        out = dict(base)
        out.update(self.txns)
        return out

    def domains_over(self, base: Mapping[str, DomainMetadata | None]) -> dict[str, DomainMetadata]:
        """The domains of ``base`` with the taken ones applied: a removed one is dropped."""
        out = {name: dm for name, dm in base.items() if dm is not None}
        for name, dm in self.domains.items():
            if dm is None:
                out.pop(name, None)
            else:
                out[name] = dm
        return out

    # --- file actions -------------------------------------------------------------------------

    def take_files(self, name: str, values: Sequence[Mapping[str, Any]], first_order: int) -> None:
        """``add`` or ``remove`` actions (validated bodies), in log order: the first has place
        ``first_order`` in the log, each next one the place after."""
        rows = self._rows[name]
        rows += values
        self._order[name] += range(first_order, first_order + len(values))
        if self.batch_rows is not None and len(rows) >= self.batch_rows:
            self._flush(name)

    def take_file_table(self, name: str, rows: pa.Table) -> None:
        """``add`` or ``remove`` rows already in :data:`FILE_ROWS` columns (``__order`` included),
        following those taken before in log order: a reader that decoded them into Arrow itself.

        Small tables are merged into one of ``batch_rows`` rows once that many have come, so that
        a long stream of small batches ends as a few large chunks.
        """
        if rows.schema != FILE_ROWS[name]:
            raise CorruptLogError(f"{name} rows do not have the columns of a checkpoint's", table=self.table)
        if self._rows[name]:
            self._flush(name)
        tables = self._tables[name]
        tables.append(rows)
        limit = self.batch_rows
        if limit is None or rows.num_rows >= limit:
            self._small[name] = len(tables)
            return
        small = tables[self._small[name] :]
        if sum(t.num_rows for t in small) >= limit:
            del tables[self._small[name] :]
            tables.append(pa.concat_tables(small).combine_chunks())
            self._small[name] = len(tables)

    def file_actions(self) -> tuple[pa.Table, pa.Table]:
        """(adds, removes) taken so far, in :data:`FILE_ROWS` columns, as ``reconcile`` takes them."""
        out = []
        for name in ("add", "remove"):
            if self._rows[name] or not self._tables[name]:
                self._flush(name)
            tables = self._tables[name]
            out.append(tables[0] if len(tables) == 1 else pa.concat_tables(tables))
        return out[0], out[1]

    def _flush(self, name: str) -> None:
        schema = action_schema.ADD if name == "add" else action_schema.REMOVE
        try:
            table = pa.Table.from_pylist(self._rows[name], schema=schema)
        except (pa.ArrowException, TypeError, ValueError, OverflowError) as exc:  # unreachable from the log
            raise CorruptLogError(
                f"file actions do not fit the Arrow schema: {exc}", table=self.table
            ) from exc
        order = pa.array(self._order[name], pa.int64())
        self._tables[name].append(table.append_column(pa.field(ORDER, pa.int64()), order))
        self._small[name] = len(self._tables[name])
        self._rows[name], self._order[name] = [], []
