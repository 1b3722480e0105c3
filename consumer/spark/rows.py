"""The Spark source's tasks: the change rows of a run of versions read from the mirror, or of the
initial snapshot.

No pyspark here. The per-version rules are core's (:class:`~deltamirror.core.changes.rows.ChangeRows`,
as :func:`~deltamirror.core.changes.changes_from_actions` applies them); what this module adds is
the stream's own checks on each version's protocol and metaData (delta-spark's streaming rules:
widened types read widened, a schema change after the start fails the query) and its
``failOnDataLoss`` choice for a data file that is gone: fail naming it, or skip it with a warning.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

import pyarrow as pa

from deltamirror.core.actions import Where, check_actions
from deltamirror.core.changes import (
    CHANGE_TYPE,
    COMMIT_TIMESTAMP,
    COMMIT_VERSION,
    DEFAULT_BATCH_SIZE,
    TIMESTAMP_TYPE,
    ReadSchema,
    VersionActions,
    changes_from_actions,
    check_change_metadata,
    check_change_protocol,
    is_cdf_enabled,
)
from deltamirror.core.changes.prefetch import FileRead
from deltamirror.core.changes.rows import ChangeRows
from deltamirror.core.errors import DataFileNotFoundError, SchemaChangedError
from deltamirror.core.models import Metadata, Protocol
from deltamirror.core.row_tracking import (
    ROW_COMMIT_VERSION,
    ROW_ID,
    ROW_ID_COLUMNS,
    snapshot_batches_with_row_ids,
)

from .schema_log import refuse_untracked

if TYPE_CHECKING:
    from deltamirror.core.table import DeltaTable

log = logging.getLogger(__name__)


def feed_schema(
    table: DeltaTable, read: ReadSchema, columns: Sequence[str] | None = None, row_ids: bool = False
) -> pa.Schema:
    """The rows' schema: the read schema's columns (``columns`` only, in that order), then the
    three change-feed columns (then ``_row_id`` and ``_row_commit_version`` with ``row_ids``). A
    column the read schema lacks is an UnknownColumnError; row ids on a table without row tracking
    an InvalidArgumentError."""
    return changes_from_actions(
        table, read.metadata, read.version, (), columns=columns, row_ids=row_ids
    ).schema


def change_rows(
    table: DeltaTable,
    read: ReadSchema,
    versions: Iterable[VersionActions],
    *,
    fail_on_data_loss: bool,
    columns: Sequence[str] | None = None,
    row_ids: bool = False,
) -> Iterator[pa.RecordBatch]:
    """The change rows of ``versions`` (checked as the stream checks them), in order; only
    ``columns`` (None: all) are read from the data files; ``row_ids`` adds the rows' row ids."""
    rows = ChangeRows(table, read, columns, None, DEFAULT_BATCH_SIZE, row_ids)
    reads = (
        _guarded(file_read, fail_on_data_loss)
        for entry in checked_versions(versions, read, table.uri)
        for file_read in rows.reads_of(
            entry.version,
            entry.timestamp_ms,
            check_actions(entry.actions, Where(table.uri, None, entry.version)),
        )
    )
    return rows.batches(reads)


def _guarded(file_read: FileRead, fail_on_data_loss: bool) -> FileRead:
    """``file_read``, but a data file that is gone fails naming the option that skips it, or is skipped."""

    def read() -> Iterator[pa.RecordBatch]:
        produced = False
        try:
            for batch in file_read.read():
                produced = True
                yield batch
        except DataFileNotFoundError as exc:
            if fail_on_data_loss or produced:
                raise DataFileNotFoundError(
                    f"{exc.message}; .option('failOnDataLoss', 'false') skips its change rows",
                    table=exc.table,
                    version=file_read.version,
                    file=exc.file,
                ) from exc
            log.warning(
                "a data file of version %d of %s is missing: its change rows are skipped "
                "(failOnDataLoss=false): %s",
                file_read.version,
                exc.table,
                exc,
            )

    return FileRead(file_read.version, file_read.size, read)


def checked_versions(
    versions: Iterable[VersionActions], read: ReadSchema, table: str
) -> Iterator[VersionActions]:
    """Each version, once its protocol and metaData (if any) are known to be readable with ``read``.

    A version up to the read schema's is read with it when its schema reads so, widened types
    included (delta-spark's stream backfilling); a schema change after it fails the query
    (DELTA_SCHEMA_CHANGED_WITH_VERSION), as delta-spark's stream does: a restart reads on with it.
    """
    for entry in versions:
        actions = list(entry.actions)
        for name, body in actions:
            if name == "protocol":
                check_change_protocol(Protocol.model_validate(body), entry.version, table=table)
            elif name == "metaData":
                metadata = Metadata.model_validate(body)
                refuse_untracked(read.metadata, read.version, metadata, entry.version, table)
                if entry.version <= read.version or not is_cdf_enabled(metadata):
                    check_change_metadata(
                        read, metadata, entry.version, table=table, start=entry.version, allow_widening=True
                    )
                elif metadata.table_schema != read.metadata.table_schema or (
                    metadata.partition_columns != read.metadata.partition_columns
                ):
                    raise SchemaChangedError(
                        f"the schema changed at version {entry.version}, after the stream started reading "
                        f"with that of version {read.version}; restart the query to read with the new schema",
                        table=table,
                        version=entry.version,
                    )
        yield VersionActions(entry.version, entry.timestamp_ms, actions)


def snapshot_rows(
    table: DeltaTable,
    read: ReadSchema,
    version: int,
    timestamp_ms: int,
    columns: Sequence[str] | None = None,
    row_ids: bool = False,
) -> Iterator[pa.RecordBatch]:
    """The table at ``version`` as inserts, as delta-spark begins a stream with no starting option
    (``columns`` only, None: all; ``row_ids``: with each row's row id and row commit version)."""
    schema = feed_schema(table, read, columns, row_ids)
    snapshot = table.snapshot(version=version)
    feed_columns = (CHANGE_TYPE, COMMIT_VERSION, COMMIT_TIMESTAMP, *ROW_ID_COLUMNS)
    names = [f.name for f in schema if f.name not in feed_columns]
    batches = snapshot_batches_with_row_ids(snapshot) if row_ids else snapshot.iter_batches(columns=names)
    for batch in batches:
        n = batch.num_rows
        if n == 0:
            continue
        yield pa.RecordBatch.from_arrays(
            [
                *(batch.column(name) for name in names),
                pa.array(["insert"] * n, pa.string()),
                pa.array([version] * n, pa.int64()),
                pa.array([timestamp_ms * 1000] * n, TIMESTAMP_TYPE),
                *((batch.column(ROW_ID), batch.column(ROW_COMMIT_VERSION)) if row_ids else ()),
            ],
            schema=schema,
        )


__all__ = ["change_rows", "checked_versions", "feed_schema", "snapshot_rows"]
