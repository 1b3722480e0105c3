"""The two ways to a change feed: planned from the log, or from actions the caller already has.

``read_changes`` resolves and checks the whole range first (:mod:`.plan`, so that a bad range
fails before any row is produced, as in delta-spark), then its :class:`ChangeFeed` streams one data
file at a time. ``changes_from_actions`` plans nothing: its caller (the Spark source, reading a
Kafka mirror of the log) vouches for the versions, and :class:`ActionsChangeFeed` only reads their
rows. Both read rows by the same per-version rules (:mod:`.rows`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from .. import arguments
from ..actions import Where, check_actions
from ..models import Metadata
from .cdf_columns import COMMIT_VERSION
from .file_filter import PartitionFilter
from .plan import Plan, PlannedVersion, plan_changes
from .ranges import TimestampLike
from .read_schema import ReadSchema
from .rows import ChangeRows

if TYPE_CHECKING:
    from ..table import DeltaTable

#: rows per batch unless the caller says otherwise
DEFAULT_BATCH_SIZE = 65_536


def read_changes(
    table: DeltaTable,
    *,
    starting_version: int | None = None,
    starting_timestamp: TimestampLike | None = None,
    ending_version: int | None = None,
    ending_timestamp: TimestampLike | None = None,
    columns: Sequence[str] | None = None,
    partition_filter: PartitionFilter | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    progress: Callable[[int, int], None] | None = None,
    row_ids: bool = False,
) -> ChangeFeed:
    """The change data feed of ``table`` between two bounds (both inclusive).

    A bound is a version or a timestamp (ISO-8601 text, epoch milliseconds or a datetime): the start
    resolves to the first commit at or after it, the end to the last commit at or before it; no end
    means the latest version. ``columns`` selects table columns (the three CDF columns always
    follow). ``partition_filter`` keeps files by partition value before any is opened: a mapping
    ``{column: value or list of values}`` or a callable given ``{column: value}`` for each file.
    Range, feature and schema errors are raised here, before any row is read. ``progress(done,
    total)`` is told, while the feed is iterated, how many of its versions are read.

    ``row_ids=True`` (tables with row tracking only) adds ``_row_id`` and ``_row_commit_version``
    after the change feed's columns, as delta-spark's ``_metadata.row_id`` and
    ``_metadata.row_commit_version`` give them; they come from data files, never from change data
    files, so a version with change data files is read from its data files, matched by row id.
    """
    arguments.change_feed(
        arguments.delta_table("table", table),
        starting_timestamp=starting_timestamp,
        ending_timestamp=ending_timestamp,
        columns=columns,
        partition_filter=partition_filter,
        batch_size=batch_size,
        progress=progress,
        row_ids=row_ids,
    )
    plan = plan_changes(table, starting_version, starting_timestamp, ending_version, ending_timestamp)
    feed = ChangeFeed(table, plan, columns, partition_filter, batch_size, row_ids)
    feed.progress = progress
    return feed


@dataclass(frozen=True)
class VersionActions:
    """One version's actions from wherever they were read (e.g. a Kafka mirror of the log).

    ``actions`` are ``(type, body)`` pairs in commit order with Delta's field names, e.g.
    ``("add", {"path": ..., "dataChange": true, ...})``; ``timestamp_ms`` is the resolved commit
    timestamp, which becomes ``_commit_timestamp``.
    """

    version: int
    timestamp_ms: int
    actions: Iterable[tuple[str, Mapping[str, Any]]]


def changes_from_actions(
    table: DeltaTable,
    metadata: Metadata,
    metadata_version: int,
    versions: Iterable[VersionActions],
    *,
    columns: Sequence[str] | None = None,
    partition_filter: PartitionFilter | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    row_ids: bool = False,
) -> ActionsChangeFeed:
    """The change rows of versions whose actions the caller already has, read with ``metadata``'s schema.

    The same per-version rules as :func:`read_changes`, without reading the log: the caller vouches
    for the versions (change data feed enabled, schema changes readable, reader features supported;
    :func:`~deltamirror.core.changes.check_change_metadata` checks one metaData). Each version's
    actions get the checks a log line gets. ``versions`` is consumed once, lazily, so the returned
    feed can be iterated once only. Data files are read from ``table``'s storage. ``row_ids`` as in
    :func:`read_changes` (``metadata`` must have row tracking enabled).
    """
    uri = arguments.actions_feed(table, metadata, metadata_version, versions)
    arguments.change_feed(
        uri, columns=columns, partition_filter=partition_filter, batch_size=batch_size, row_ids=row_ids
    )
    read = ReadSchema(metadata, metadata_version)
    return ActionsChangeFeed(table, read, versions, columns, partition_filter, batch_size, row_ids)


class ChangeFeed:
    """The rows of a change-feed read: an iterable of record batches in version order.

    Each batch holds rows of one version only. Iterating reads one data file at a time; the feed
    can be iterated more than once (each pass reads the files again).
    """

    #: told (versions read, versions in the feed) as batches go out; see ``read_changes``
    progress: Callable[[int, int], None] | None = None

    def __init__(
        self,
        table: DeltaTable,
        plan: Plan,
        columns: Sequence[str] | None,
        partition_filter: PartitionFilter | None,
        batch_size: int,
        row_ids: bool = False,
    ) -> None:
        self.table = table
        self._plan = plan
        self._rows = ChangeRows(table, plan.read, columns, partition_filter, batch_size, row_ids)
        self.schema: pa.Schema = self._rows.schema

    def __repr__(self) -> str:
        return f"ChangeFeed({self.table.uri!r}, versions {self.start_version}-{self.end_version})"

    @property
    def start_version(self) -> int:
        return self._plan.range.start

    @property
    def end_version(self) -> int:
        """The last version read (the latest one when the requested end is beyond it)."""
        return self._plan.range.end

    @property
    def read_schema_version(self) -> int:
        """The version whose schema the rows are read with."""
        return self._plan.read.version

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        plan, rows = self._plan, self._rows
        reads = (
            read
            for entry in plan.versions
            for read in rows.reads_of(
                entry.version, entry.timestamp_ms, plan.take_actions(self.table, entry.version)
            )
        )
        batches = rows.batches(reads)
        return batches if self.progress is None else _reporting(batches, plan.versions, self.progress)

    def to_arrow(self) -> pa.Table:
        """The whole feed in memory (small ranges and tests; iterate for anything large)."""
        return pa.Table.from_batches(list(self), schema=self.schema)


class ActionsChangeFeed:
    """The rows of versions given with their actions (:func:`changes_from_actions`), in their order.

    No range was planned, so there are no start and end versions to tell, only the read schema's.
    The versions are consumed as the feed is iterated: it can be iterated once.
    """

    def __init__(
        self,
        table: DeltaTable,
        read: ReadSchema,
        versions: Iterable[VersionActions],
        columns: Sequence[str] | None,
        partition_filter: PartitionFilter | None,
        batch_size: int,
        row_ids: bool = False,
    ) -> None:
        self.table = table
        self._rows = ChangeRows(table, read, columns, partition_filter, batch_size, row_ids)
        self.schema: pa.Schema = self._rows.schema
        self._versions = iter(versions)

    def __repr__(self) -> str:
        return f"changes_from_actions({self.table.uri!r}, read with the schema of version {self.read_schema_version})"

    @property
    def read_schema_version(self) -> int:
        """The version whose schema the rows are read with."""
        return self._rows.read.version

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        uri = self.table.uri
        reads = (
            read
            for v in self._versions
            for read in self._rows.reads_of(
                v.version, v.timestamp_ms, check_actions(v.actions, Where(uri, None, v.version))
            )
        )
        return self._rows.batches(reads)

    def to_arrow(self) -> pa.Table:
        """The rest of the feed in memory."""
        return pa.Table.from_batches(list(self), schema=self.schema)


def _reporting(
    batches: Iterator[pa.RecordBatch],
    versions: Sequence[PlannedVersion],
    progress: Callable[[int, int], None],
) -> Iterator[pa.RecordBatch]:
    """``batches`` as they are, telling ``progress`` how many versions are done.

    Every batch holds one version's rows, in version order: a batch of version v means the
    versions before it are read.
    """
    position = {entry.version: i for i, entry in enumerate(versions)}
    progress(0, len(versions))
    for batch in batches:
        progress(position[batch.column(COMMIT_VERSION)[0].as_py()], len(versions))
        yield batch
    progress(len(versions), len(versions))
