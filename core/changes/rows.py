"""One version's change rows, from its actions: what each file action contributes, and reading it.

Per version (delta-spark's ``CDCReader.changesToDF``):

* with ``cdc`` actions, the rows are those of its change data files, typed by their ``_change_type``;
* otherwise every ``add``/``remove`` with dataChange=true gives inserts/deletes of the rows its own
  deletion vector leaves alive, except that an ``add`` and a ``remove`` of one path are a DV update
  whose rows are those whose deletion bit flipped; a MERGE that reports no changed row gives none.

Where the actions come from (a checked plan of the log, or a mirror of it) is the feeds' business
(:mod:`.feed`); the reads run in order, small ones ahead on threads (:mod:`.prefetch`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from deltamirror.core.compute import pc

from .. import arguments
from ..deletion_vectors import keep_mask, read_deleted_rows
from ..errors import CorruptLogError
from ..log import commit_name
from ..read import AppendColumns, read_data_file
from ..row_tracking import ROW_COMMIT_VERSION, ROW_ID, ROW_ID_COLUMNS, RowTracking
from ..schema import (
    ColumnMappingMode,
    PrimitiveType,
    StructField,
    StructType,
    column_mapping_mode,
    to_arrow_field,
)
from .cdf_columns import (
    CDF_COLUMNS,
    CHANGE_TYPE,
    COMMIT_TIMESTAMP,
    COMMIT_VERSION,
    TIMESTAMP_TYPE,
    ColumnCursor,
    CommitColumns,
    repeated_string,
)
from .file_filter import FileFilter, PartitionFilter
from .prefetch import FileRead, prefetchable, prefetched
from .read_schema import ReadSchema

if TYPE_CHECKING:
    from ..table import DeltaTable

_MERGE_METRICS = ("numTargetRowsInserted", "numTargetRowsUpdated", "numTargetRowsDeleted")
_NO_VALUES: Mapping[str, str | None] = {}
_STRING = PrimitiveType(name="string")


class ChangeRows:
    """Reads change rows of ``table`` with one read schema: the selected columns, then the CDF ones.

    Built once per feed, so that bad ``columns`` or a bad ``partition_filter`` are refused before
    any version is read.
    """

    def __init__(
        self,
        table: DeltaTable,
        read: ReadSchema,
        columns: Sequence[str] | None,
        partition_filter: PartitionFilter | None,
        batch_size: int,
        row_ids: bool = False,
    ) -> None:
        self.table = table
        self.read = read
        #: the table's row tracking when the rows carry their row ids (None: they do not)
        self._tracking = (
            RowTracking.of(read.metadata, table=table.uri, version=read.version) if row_ids else None
        )
        self._batch_size = batch_size
        metadata = read.metadata
        self._table_schema: StructType = metadata.table_schema
        self._mode: ColumnMappingMode = column_mapping_mode(metadata.configuration)
        self._partition_columns = list(metadata.partition_columns)
        self._data_columns = self._select(columns)
        # read batches come in table order: asked for in that order, they need no reordering
        chosen = set(self._data_columns)
        self._in_table_order = self._tracking is None and self._data_columns == [
            c for c in self._table_schema.names if c in chosen
        ]
        self._data_positions: dict[tuple[str, ...], list[int]] = {}
        # columns=None reads every column without building a projected schema per file
        every = self._data_columns == list(self._table_schema.names)
        self._columns_arg: list[str] | None = None if every else self._data_columns
        self._cdc_schema = StructType(
            fields=(*self._table_schema.fields, StructField(name=CHANGE_TYPE, type=_STRING))
        )
        self._cdc_columns_arg = None if every else [*self._data_columns, CHANGE_TYPE]
        self._filter = FileFilter(
            partition_filter, self._table_schema, self._partition_columns, self._mode, table.uri
        )
        data_fields = [to_arrow_field(self._table_schema.field(c)) for c in self._data_columns]
        self.schema = pa.schema(
            [
                *data_fields,
                pa.field(CHANGE_TYPE, pa.string()),
                pa.field(COMMIT_VERSION, pa.int64()),
                pa.field(COMMIT_TIMESTAMP, TIMESTAMP_TYPE),
                *(
                    [pa.field(ROW_ID, pa.int64()), pa.field(ROW_COMMIT_VERSION, pa.int64())]
                    if self._tracking is not None
                    else []
                ),
            ]
        )

    def _select(self, columns: Sequence[str] | None) -> list[str]:
        if columns is None:
            return list(self._table_schema.names)
        out: list[str] = []
        for name in columns:
            if name in CDF_COLUMNS or (self._tracking is not None and name in ROW_ID_COLUMNS):
                continue
            canonical = arguments.column_name(self._table_schema, name, self.table.uri)
            if canonical not in out:
                out.append(canonical)
        return out

    def batches(self, reads: Iterator[FileRead]) -> Iterator[pa.RecordBatch]:
        """The rows of ``reads`` (in version order) in batches of up to ``batch_size`` rows, each
        from one version."""
        pending: list[pa.RecordBatch] = []
        rows = 0
        current: int | None = None
        for version, batches in prefetched(reads):
            if version != current and rows:
                yield _concat(pending)
                pending, rows = [], 0
            current = version
            for batch in batches:
                n = batch.num_rows
                if rows + n < self._batch_size:  # the usual case: it fits whole
                    if n:
                        pending.append(batch)
                        rows += n
                    continue
                while n:
                    take = min(n, self._batch_size - rows)
                    pending.append(batch.slice(0, take) if take < n else batch)
                    rows += take
                    batch, n = batch.slice(take), n - take
                    if rows == self._batch_size:
                        yield _concat(pending)
                        pending, rows = [], 0
        if rows:
            yield _concat(pending)

    def reads_of(
        self, version: int, timestamp_ms: int, actions: Iterable[tuple[str, Mapping[str, Any]]]
    ) -> Iterator[FileRead]:
        """The file reads that make up one version's rows, in commit order."""
        cdc: list[Mapping[str, Any]] = []
        adds: dict[str, Mapping[str, Any]] = {}
        removes: dict[str, Mapping[str, Any]] = {}
        commit_info: Mapping[str, Any] | None = None
        for name, body in actions:
            if name == "cdc":
                cdc.append(body)
            elif name == "add" and body.get("dataChange", True):
                adds[body["path"]] = body
            elif name == "remove" and body.get("dataChange", True):
                removes[body["path"]] = body
            elif name == "commitInfo" and commit_info is None:
                commit_info = body
        meta = CommitColumns(version, timestamp_ms * 1000)
        if cdc and self._tracking is not None:  # row ids are never read from change data files
            yield from self._derived_reads(self._tracking, adds, removes, meta)
            return
        if cdc:
            for action in cdc:
                if self._filter.keeps(action, version):
                    yield FileRead(version, action.get("size"), partial(self._read_cdc_file, action, meta))
            return
        if commit_info is not None and _is_noop_merge(commit_info):
            return
        for path, add in adds.items():
            remove = removes.get(path)
            if remove is None:
                if self._filter.keeps(add, version):
                    dv = add.get("deletionVector")
                    yield FileRead(
                        version, add.get("size"), partial(self._read_file, add, "insert", meta, dv=dv)
                    )
            else:
                self._check_dv_pair(add, remove, meta)
                if self._filter.keeps(add, version):
                    yield FileRead(version, add.get("size"), partial(self._read_dv_update, add, remove, meta))
        for path, remove in removes.items():
            if path not in adds and self._filter.keeps(remove, version):
                dv = remove.get("deletionVector")
                yield FileRead(
                    version, remove.get("size"), partial(self._read_file, remove, "delete", meta, dv=dv)
                )

    def _check_dv_pair(self, add: Mapping[str, Any], remove: Mapping[str, Any], meta: CommitColumns) -> None:
        if remove.get("deletionVector") is None and add.get("deletionVector") is None:
            raise CorruptLogError(
                f"file {add['path']!r} is both removed and added in one version, neither with a "
                "deletion vector; delta-spark refuses such a change feed too",
                table=self.table.uri,
                version=meta.version,
            )

    def _read_dv_update(
        self, add: Mapping[str, Any], remove: Mapping[str, Any], meta: CommitColumns
    ) -> Iterator[pa.RecordBatch]:
        """Rows whose deletion bit flipped between the removed and the added DV of one file."""
        path = add["path"]
        remove_dv, add_dv = remove.get("deletionVector"), add.get("deletionVector")
        before = self._deleted_rows(remove_dv, path)
        after = self._deleted_rows(add_dv, path)
        newly_deleted = _difference(after, before)
        undeleted = _difference(before, after)
        if len(newly_deleted):
            yield from self._read_file(remove, "delete", meta, only_rows=newly_deleted, partition_from=add)
        if len(undeleted):
            yield from self._read_file(add, "insert", meta, only_rows=undeleted)

    def _deleted_rows(self, descriptor: Mapping[str, Any] | None, path: str) -> pa.UInt64Array:
        if descriptor is None:
            return pa.array([], pa.uint64())
        return read_deleted_rows(self.table.storage, descriptor, table=self.table.uri, data_file=path)

    def _read_file(
        self,
        action: Mapping[str, Any],
        change_type: str,
        meta: CommitColumns,
        *,
        dv: Mapping[str, Any] | None = None,
        only_rows: pa.UInt64Array | None = None,
        partition_from: Mapping[str, Any] | None = None,
    ) -> Iterator[pa.RecordBatch]:
        if self._tracking is not None:
            ids, versions = self._tracking.of_file(
                self.table.storage, action, table=self.table.uri, version=meta.version
            )
            if only_rows is None:
                only_rows = _alive(self._deleted_rows(dv, action["path"]), len(ids), action["path"])
            n = len(only_rows)
            yield from self._read_rows(
                action,
                only_rows,
                repeated_string(change_type, n),
                ids.take(only_rows),
                versions.take(only_rows),
                meta,
                partition_from,
            )
            return
        partition_values = self._partition_values(partition_from or action, meta.version)
        append = None
        if self._in_table_order:  # the CDF columns are added in the same batch

            def cdf_columns(n: int) -> tuple[pa.Array, ...]:
                return repeated_string(change_type, n), *meta.columns(n)

            append = AppendColumns(self.schema, cdf_columns)
        batches = self._read_data_file(
            action, partition_values, deletion_vector=dv, only_rows=only_rows, append=append
        )
        if append is not None:
            yield from batches
            return
        for batch in batches:
            yield self._finish(batch, repeated_string(change_type, batch.num_rows), meta)

    def _derived_reads(
        self,
        tracking: RowTracking,
        adds: Mapping[str, Mapping[str, Any]],
        removes: Mapping[str, Mapping[str, Any]],
        meta: CommitColumns,
    ) -> Iterator[FileRead]:
        """A version with change data files, read from its data files by row id instead.

        The rows the version took away (removed files' live rows, rows a new deletion vector
        deletes) and the rows it added (added files' live rows, rows a deletion vector gave back)
        are matched by row id: a row id on both sides is an update when the added row's commit
        version is this version (``update_preimage`` then ``update_postimage``), a row copied
        unchanged otherwise (no change); a row id on one side only is a delete or an insert. On a
        table with row tracking these are the rows of the version's change data files, each with
        the row id and commit version the protocol lets a reader take from data files only. The
        rows taken away come first, then those added (files in commit order on each side).
        """
        version = meta.version
        uri = self.table.uri
        # (action, its rows in the change (None: those its deletion vector leaves), whether they
        # were taken away, the action with the partition values)
        sides: list[tuple[Mapping[str, Any], pa.UInt64Array | None, bool, Mapping[str, Any] | None]] = []
        for path, add in adds.items():
            remove = removes.get(path)
            if remove is None:
                sides.append((add, None, False, None))
                continue
            self._check_dv_pair(add, remove, meta)
            before = self._deleted_rows(remove.get("deletionVector"), path)
            after = self._deleted_rows(add.get("deletionVector"), path)
            sides.append((remove, _difference(after, before), True, add))
            sides.append((add, _difference(before, after), False, None))
        for path, remove in removes.items():
            if path not in adds:
                sides.append((remove, None, True, None))
        tracked = []
        for action, only, taken, partition_from in sides:
            ids, versions = tracking.of_file(self.table.storage, action, table=uri, version=version)
            path = action["path"]
            rows = only
            if rows is None:
                rows = _alive(self._deleted_rows(action.get("deletionVector"), path), len(ids), path)
            if len(rows) and pc.max(rows).as_py() >= len(ids):
                raise CorruptLogError(
                    f"deletion vector names row {pc.max(rows).as_py()} of a {len(ids)}-row file",
                    table=uri,
                    version=version,
                    file=action["path"],
                )
            tracked.append((action, rows, taken, partition_from, ids.take(rows), versions.take(rows)))
        gone = _unique_ids([t[4] for t in tracked if t[2]], "taken away", uri, version)
        added = [t for t in tracked if not t[2]]
        new_ids = _unique_ids([t[4] for t in added], "added", uri, version)
        new_versions = pa.concat_arrays([t[5] for t in added]) if added else pa.array([], pa.int64())
        # what was taken away first, then what was added: an update's pre-image before its post-image
        for action, rows, taken, partition_from, ids, versions in sorted(tracked, key=lambda t: not t[2]):
            if taken:
                at = pc.index_in(ids, value_set=new_ids)
                matched = pc.is_valid(at)
                updated = pc.and_(matched, pc.equal(pc.fill_null(new_versions.take(at), -1), version))
                kinds = pc.if_else(updated, "update_preimage", "delete")
            else:
                matched = pc.is_in(ids, value_set=gone)
                updated = pc.and_(matched, pc.equal(versions, version))
                kinds = pc.if_else(updated, "update_postimage", "insert")
            changed = pc.or_(pc.invert(matched), updated)  # a matched row not updated was copied
            if not pc.any(changed).as_py() or not self._filter.keeps(partition_from or action, version):
                continue
            yield FileRead(
                version,
                action.get("size"),
                partial(
                    self._read_rows,
                    action,
                    rows.filter(changed),
                    kinds.filter(changed),
                    ids.filter(changed),
                    versions.filter(changed),
                    meta,
                    partition_from,
                ),
            )

    def _read_rows(
        self,
        action: Mapping[str, Any],
        rows: pa.UInt64Array,
        change_types: pa.Array,
        ids: pa.Int64Array,
        versions: pa.Int64Array,
        meta: CommitColumns,
        partition_from: Mapping[str, Any] | None,
    ) -> Iterator[pa.RecordBatch]:
        """The rows ``rows`` of a data file (physical indexes, ascending), with their change types,
        row ids and row commit versions."""
        if not len(rows):
            return
        partition_values = self._partition_values(partition_from or action, meta.version)
        at = 0
        for batch in self._read_data_file(action, partition_values, only_rows=rows):
            n = batch.num_rows
            yield self._finish(
                batch, change_types.slice(at, n), meta, ids.slice(at, n), versions.slice(at, n)
            )
            at += n

    def _read_data_file(
        self, action: Mapping[str, Any], partition_values: Mapping[str, Any], **how: Any
    ) -> Iterator[pa.RecordBatch]:
        """A data file of the table, read with the feed's schema, columns and mapping (``how``: the
        deletion vector, the rows to keep, the columns to append)."""
        return read_data_file(
            self.table.storage,
            action["path"],
            schema=self._table_schema,
            partition_columns=self._partition_columns,
            column_mapping=self._mode,
            partition_values=partition_values,
            columns=self._columns_arg,
            table=self.table.uri,
            use_threads=not prefetchable(action),
            **how,
        )

    def _read_cdc_file(self, action: Mapping[str, Any], meta: CommitColumns) -> Iterator[pa.RecordBatch]:
        """A change data file: the data columns plus its physical ``_change_type`` column."""
        partition_values = self._partition_values(action, meta.version)
        path = action["path"]
        append = None
        if self._mode == "id":  # _change_type has no field id: read it beside the data columns
            cursor = types = ColumnCursor(self.table, path, CHANGE_TYPE)
            schema, columns = self._table_schema, self._columns_arg
            if self._in_table_order:

                def cdf_columns(n: int) -> tuple[pa.Array, ...]:
                    return cursor.take(n), *meta.columns(n)

                append = AppendColumns(self.schema, cdf_columns)
        else:
            types = None
            schema, columns = self._cdc_schema, self._cdc_columns_arg
            if self._in_table_order:  # _change_type is the last column read

                def cdf_columns(n: int) -> tuple[pa.Array, ...]:
                    return meta.columns(n)

                append = AppendColumns(self.schema, cdf_columns)
        change_type_at = len(self._data_columns)
        try:
            for batch in read_data_file(
                self.table.storage,
                path,
                schema=schema,
                partition_columns=self._partition_columns,
                column_mapping=self._mode,
                partition_values=partition_values,
                columns=columns,
                table=self.table.uri,
                use_threads=not prefetchable(action),
                append=append,
                kind="change data file",
            ):
                if append is not None:
                    change_types = batch.column(change_type_at)
                elif types is None:  # _finish keeps the data columns only
                    change_types = batch.column(batch.num_columns - 1)
                else:
                    change_types = types.take(batch.num_rows)
                if change_types.null_count:
                    raise CorruptLogError(
                        "change data file has rows without a _change_type (missing column?)",
                        table=self.table.uri,
                        version=meta.version,
                        file=path,
                    )
                yield batch if append is not None else self._finish(batch, change_types, meta)
        finally:
            if types is not None:
                types.close()

    def _finish(
        self,
        batch: pa.RecordBatch,
        change_types: pa.Array,
        meta: CommitColumns,
        *row_ids: pa.Array,
    ) -> pa.RecordBatch:
        n = batch.num_rows
        names = tuple(batch.schema.names)
        positions = self._data_positions.get(names)
        if positions is None:  # per batch layout (data files, change data files): worked out once
            positions = self._data_positions[names] = [names.index(c) for c in self._data_columns]
        columns = batch.columns
        data = [columns[i] for i in positions]
        return pa.RecordBatch.from_arrays(
            [*data, change_types, *meta.columns(n), *row_ids], schema=self.schema
        )

    def _partition_values(self, action: Mapping[str, Any], version: int) -> Mapping[str, str | None]:
        """The file's ``partitionValues`` (a key the map lacks is a null value, as delta-spark
        reads it)."""
        if not self._partition_columns:  # nothing to read from them
            return _NO_VALUES
        values = action.get("partitionValues")
        if values is None:  # optional on a remove only; its values are not in the log
            raise CorruptLogError(
                f"file action for {action.get('path')!r} has no partitionValues in a partitioned table "
                "(the change feed needs the values of the rows it removes)",
                table=self.table.uri,
                version=version,
                file=self.table.storage.log_file(commit_name(version)),
            )
        return dict(values)  # a key it lacks reads as null (partitions.partition_value_of)


def _concat(batches: list[pa.RecordBatch]) -> pa.RecordBatch:
    return batches[0] if len(batches) == 1 else pa.concat_batches(batches)


def _difference(left: pa.UInt64Array, right: pa.UInt64Array) -> pa.UInt64Array:
    """Rows in ``left`` but not in ``right`` (both sorted and unique, so the result is too)."""
    if len(right) == 0 or len(left) == 0:
        return left
    return left.filter(pc.invert(pc.is_in(left, value_set=right)))


def _alive(deleted: pa.UInt64Array, num_rows: int, path: str) -> pa.UInt64Array:
    """The row indexes of a ``num_rows``-row file that ``deleted`` leaves, ascending."""
    return pc.indices_nonzero(keep_mask(deleted, num_rows, data_file=path))


def _unique_ids(parts: list[pa.Array], side: str, table: str, version: int) -> pa.Array:
    """The row ids of one side of a version, refused if one is there twice (never in a valid log)."""
    ids = pa.concat_arrays(parts) if parts else pa.array([], pa.int64())
    if len(ids) and pc.count_distinct(ids).as_py() != len(ids):
        raise CorruptLogError(
            f"a row id is among the rows the version {side} more than once: row ids are not unique",
            table=table,
            version=version,
        )
    return ids


def _is_noop_merge(commit_info: Mapping[str, Any]) -> bool:
    """delta-spark's ``shouldSkipFileActionsInCommit``: a MERGE reporting 0 rows changed."""
    if commit_info.get("operation") != "MERGE":
        return False
    metrics = commit_info.get("operationMetrics") or {}
    return all(str(metrics.get(name)) == "0" for name in _MERGE_METRICS)
