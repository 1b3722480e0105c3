"""Row tracking's row ids and row commit versions of a data file's rows, as the protocol defines them.

A row's (stable) row id is the value of the materialized row-id column (its physical name is the
table's ``delta.rowTracking.materializedRowIdColumnName``) when the data file has that column and
the value is not null; otherwise the ``baseRowId`` of the ``add`` or ``remove`` naming the file plus
the row's physical index in the file (rows a deletion vector removes still count). The row commit
version likewise: the materialized ``delta.rowTracking.materializedRowCommitVersionColumnName``
value, else the action's ``defaultRowCommitVersion``. These are the values delta-spark's
``_metadata.row_id`` and ``_metadata.row_commit_version`` give.

Change data files (``cdc`` actions) carry no row ids a reader may use: the change feed takes a
version's row ids from its data files (:mod:`.changes.rows`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from deltamirror.core.compute import pc

from .constant_columns import repeated_int64
from .errors import CorruptLogError, InvalidArgumentError
from .models import Metadata
from .read import open_parquet, read_error
from .storage import TableStorage

if TYPE_CHECKING:
    from .table import Snapshot

ROW_ID = "_row_id"
ROW_COMMIT_VERSION = "_row_commit_version"
#: the two columns a change feed read with row ids adds after the change feed's own
ROW_ID_COLUMNS = (ROW_ID, ROW_COMMIT_VERSION)

_ENABLED = "delta.enableRowTracking"
_ID_COLUMN = "delta.rowTracking.materializedRowIdColumnName"
_VERSION_COLUMN = "delta.rowTracking.materializedRowCommitVersionColumnName"


def row_tracking_enabled(metadata: Metadata) -> bool:
    """Row tracking is on (``delta.enableRowTracking``): every row has a row id readers may rely on."""
    return metadata.configuration.get(_ENABLED, "false").strip().lower() == "true"


@dataclass(frozen=True)
class RowTracking:
    """The table's materialized row-tracking columns (physical names; None: the table names none)."""

    id_column: str | None
    version_column: str | None

    @classmethod
    def of(cls, metadata: Metadata, *, table: str, version: int) -> RowTracking:
        """The row tracking of a table whose change feed is asked for row ids; refused unless enabled."""
        if not row_tracking_enabled(metadata):
            raise InvalidArgumentError(
                f"row ids were asked for, but the table does not have row tracking enabled "
                f"({_ENABLED} is not true in the metaData in force at version {version})",
                table=table,
                version=version,
            )
        names = {f.name for f in metadata.table_schema.fields}
        clash = [c for c in ROW_ID_COLUMNS if c in names]
        if clash:
            raise InvalidArgumentError(
                f"row ids were asked for, but the table has a column named {clash[0]!r} already",
                table=table,
                version=version,
            )
        config = metadata.configuration
        return cls(config.get(_ID_COLUMN) or None, config.get(_VERSION_COLUMN) or None)

    def of_file(
        self, storage: TableStorage, action: Mapping[str, Any], *, table: str, version: int
    ) -> tuple[pa.Int64Array, pa.Int64Array]:
        """The row ids and row commit versions of every row of the file ``action`` names, by
        physical index (deleted rows included)."""
        path = action["path"]
        pf = open_parquet(storage, path, table=table)
        try:
            present = set(pf.schema_arrow.names)
            wanted = [c for c in (self.id_column, self.version_column) if c is not None and c in present]
            num_rows = pf.metadata.num_rows
            try:
                read = pf.read(columns=wanted, use_threads=False) if wanted else None
            except (OSError, MemoryError, pa.ArrowException) as exc:
                raise read_error(exc, "data file", table, path) from exc
        finally:
            pf.close()

        def materialized(name: str | None) -> pa.Array | None:
            if read is None or name is None or name not in read.column_names:
                return None
            column = read.column(name)
            try:
                return column.combine_chunks().cast(pa.int64())
            except pa.ArrowInvalid as exc:
                raise CorruptLogError(
                    f"materialized row-tracking column {name!r} does not hold 64-bit integers: {exc}",
                    table=table,
                    version=version,
                    file=path,
                ) from None

        ids = _fill(
            materialized(self.id_column),
            num_rows,
            action.get("baseRowId"),
            "baseRowId",
            positional=True,
            where=(table, version, path),
        )
        versions = _fill(
            materialized(self.version_column),
            num_rows,
            action.get("defaultRowCommitVersion"),
            "defaultRowCommitVersion",
            positional=False,
            where=(table, version, path),
        )
        return ids, versions


def _fill(
    values: pa.Array | None,
    num_rows: int,
    default: int | None,
    field: str,
    *,
    positional: bool,
    where: tuple[str, int, str],
) -> pa.Int64Array:
    """The materialized ``values`` where not null, else ``default`` (plus the row index when
    ``positional``). A null that needs a default the action lacks is refused by name."""
    if values is not None and values.null_count == 0:
        return values
    if default is None:
        table, version, path = where
        raise CorruptLogError(
            f"the table has row tracking enabled but the action naming {path!r} has no {field} "
            "(and the file does not materialize it for every row): its rows have no row id",
            table=table,
            version=version,
            file=path,
        )
    generated = _positions(num_rows, default) if positional else repeated_int64(int(default), num_rows)
    if values is None:
        return generated
    return pc.coalesce(values, generated)


def _positions(num_rows: int, base: int) -> pa.Int64Array:
    """``base``, ``base + 1``, ... for ``num_rows`` rows."""
    if num_rows == 0:
        return pa.array([], pa.int64())
    ones = pa.repeat(pa.scalar(1, pa.int64()), num_rows)
    return pc.add(pc.cumulative_sum(ones), int(base) - 1)


def snapshot_batches_with_row_ids(snapshot: Snapshot) -> Iterator[pa.RecordBatch]:
    """The rows of ``snapshot`` (every column, in the table's order) followed by ``_row_id`` and
    ``_row_commit_version``, one data file at a time: what delta-spark's
    ``SELECT *, _metadata.row_id, _metadata.row_commit_version`` reads."""
    from .deletion_vectors import keep_mask, read_deleted_rows
    from .read import read_data_file
    from .schema import column_mapping_mode

    table = snapshot.table
    uri = table.uri
    tracking = RowTracking.of(snapshot.metadata, table=uri, version=snapshot.version)
    snapshot.check_readable()
    files = snapshot.files.to_table()
    if files.num_rows == 0:
        return
    table.storage.check_paths(files.column("path"))
    mode = column_mapping_mode(snapshot.metadata.configuration)
    wanted = ["path", "partitionValues", "deletionVector", "baseRowId", "defaultRowCommitVersion"]
    for chunk in files.select(wanted).to_batches(max_chunksize=1024):
        for action in chunk.to_pylist():
            path = action["path"]
            ids, versions = tracking.of_file(table.storage, action, table=uri, version=snapshot.version)
            dv = action.get("deletionVector")
            deleted = (
                read_deleted_rows(table.storage, dv, table=uri, data_file=path, num_rows=len(ids))
                if dv is not None
                else pa.array([], pa.uint64())
            )
            rows = pc.indices_nonzero(keep_mask(deleted, len(ids), data_file=path))
            if not len(rows):
                continue
            at = 0
            for batch in read_data_file(
                table.storage,
                path,
                schema=snapshot.schema,
                partition_columns=snapshot.partition_columns,
                column_mapping=mode,
                partition_values=dict(action.get("partitionValues") or ()),
                only_rows=rows,
                table=uri,
            ):
                n = batch.num_rows
                taken = rows.slice(at, n)
                yield pa.RecordBatch.from_arrays(
                    [*batch.columns, ids.take(taken), versions.take(taken)],
                    names=[*batch.schema.names, ROW_ID, ROW_COMMIT_VERSION],
                )
                at += n
