"""Rows of a Delta table: its data files opened, streamed and filtered, in the logical schema.

Each file is held to the table root before it is opened, streamed row group by row group so a
large file never sits in memory whole, made logical by :mod:`.file_columns` (column mapping,
missing columns, partition values) and filtered by its deletion vector, which drops rows by their
index in the file. A failure names the file and says whether retrying can help.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from deltamirror.core.compute import pc

from . import deletion_vectors
from .errors import (
    CorruptDataFileError,
    DataFileNotFoundError,
    DeletionVectorError,
    SchemaError,
    StorageError,
)
from .file_columns import AppendColumns, schema_reader
from .schema import ColumnMappingMode, StructType, column_mapping_mode
from .storage import NotARegularFileError, TableStorage

__all__ = ["BATCH_SIZE", "AppendColumns", "open_parquet", "read_data_file", "read_error", "read_snapshot"]

BATCH_SIZE = 65_536


# --- reading one file -----------------------------------------------------------------------


def open_parquet(
    storage: TableStorage, path_in_log: str, *, table: str | None = None, kind: str = "data file"
) -> pq.ParquetFile:
    """A data file (or change data file) the log names, opened: the path is held to the table root
    first (nothing outside is opened), and failures say which file and whether to retry.

    Pre-buffering coalesces a remote file's reads into few requests; on a local disk it only adds work.
    The caller closes the file.
    """
    table = table if table is not None else storage.uri
    fs_path = storage.resolve(path_in_log, kind=kind)
    try:
        return storage.parquet_file(
            fs_path, pre_buffer=not storage.is_local, coerce_int96_timestamp_unit="us"
        )
    except FileNotFoundError as exc:
        raise DataFileNotFoundError(
            f"{kind} referenced by the log is missing (vacuumed?)", table=table, file=path_in_log
        ) from exc
    except (OSError, pa.ArrowException) as exc:
        raise read_error(exc, kind, table, path_in_log) from exc


def read_error(exc: BaseException, kind: str, table: str, path_in_log: str) -> Exception:
    """What a failure opening or decoding a parquet file means: a corrupt file (exit 2, retrying
    cannot help) or trouble with the storage (exit 1).

    pyarrow reports a bad file as ArrowInvalid (no magic bytes, truncated) or as a bare OSError
    without errno (bad thrift, corrupt pages); the storage's own errors keep their types (an
    errno, a timeout, a connection error), as pyarrow re-raises the Python exception it was given.
    """
    if isinstance(exc, (IsADirectoryError, NotARegularFileError)):  # a folder or FIFO named as a file
        return CorruptDataFileError(f"{kind} is not a regular file", table=table, file=path_in_log)
    if isinstance(exc, MemoryError):  # a size in a corrupt footer, or a file beyond this machine
        return CorruptDataFileError(
            f"{kind} cannot be decoded in memory: {one_line(exc)}", table=table, file=path_in_log
        )
    if (isinstance(exc, pa.ArrowException) and not isinstance(exc, OSError)) or (
        type(exc) is OSError and exc.errno is None
    ):
        return CorruptDataFileError(
            f"{kind} is not a readable Parquet file: {one_line(exc)}", table=table, file=path_in_log
        )
    return StorageError(f"cannot read {kind}: {one_line(exc)}", table=table, file=path_in_log)


def one_line(exc: BaseException, limit: int = 200) -> str:
    """An error's text as one printable line (pyarrow's may hold newlines and raw bytes)."""
    text = str(exc).strip().split("\n", 1)[0]
    text = "".join(c if c.isprintable() else "?" for c in text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def read_data_file(
    storage: TableStorage,
    path_in_log: str,
    *,
    schema: StructType,
    partition_columns: Sequence[str],
    column_mapping: ColumnMappingMode,
    partition_values: Mapping[str, str | None],
    deletion_vector: Mapping[str, Any] | None = None,
    columns: Sequence[str] | None = None,
    only_rows: pa.UInt64Array | None = None,
    table: str | None = None,
    use_threads: bool = True,
    append: AppendColumns | None = None,
    kind: str = "data file",
) -> Iterator[pa.RecordBatch]:
    """The live rows of one data file, in the logical schema (``columns`` only, in table order),
    followed by the ``append`` columns if given. ``kind`` names the file in errors ("change data
    file").

    ``only_rows`` keeps exactly those row indexes (the change feed's rows whose DV bit flipped) and
    replaces the deletion vector; otherwise rows the deletion vector deletes are dropped.
    Partition columns are constants parsed from ``partition_values`` (keys: physical names).
    ``use_threads=False`` decodes on the calling thread only: for small files read on worker
    threads, where pyarrow's own thread pool would cost more than it gives.
    """
    table = table if table is not None else storage.uri
    reader = schema_reader(schema, partition_columns, column_mapping, columns)
    constants = reader.constants(partition_values, table, path_in_log)
    pf = open_parquet(storage, path_in_log, table=table, kind=kind)
    try:
        layout = reader.file_columns(pf.schema_arrow, table, path_in_log)

        def assemble(raw: pa.RecordBatch | None, num_rows: int) -> pa.RecordBatch:
            return reader.assemble(layout, constants, raw, num_rows, append)

        try:
            yield from _stream(
                pf,
                layout.read_names,
                layout.columns_arg,
                assemble,
                _row_filter(storage, pf, deletion_vector, only_rows, table, path_in_log),
                use_threads,
            )
        except DeletionVectorError as exc:
            if exc.table is None:
                exc.table, exc.file = table, path_in_log
            raise
        except (OSError, MemoryError, pa.ArrowException) as exc:
            raise read_error(exc, kind, table, path_in_log) from exc
    finally:
        pf.close()


def _row_filter(
    storage: TableStorage,
    pf: pq.ParquetFile,
    deletion_vector: Mapping[str, Any] | None,
    only_rows: pa.UInt64Array | None,
    table: str,
    path_in_log: str,
) -> pa.BooleanArray | None:
    """Which rows of the file survive, as a mask over the whole file (None: all of them).

    A mask, not row indexes: pyarrow 26 cannot ``take`` from string_view columns (what delta-rs
    files read as), and the mask is applied only after columns are made logical.
    """
    if only_rows is not None:
        num_rows = pf.metadata.num_rows
        try:
            wanted = deletion_vectors.keep_mask(only_rows, num_rows, data_file=path_in_log)
        except DeletionVectorError:
            highest = pc.max(only_rows).as_py()
            raise DeletionVectorError(
                f"row {highest} requested but the data file has {num_rows} rows",
                table=table,
                file=path_in_log,
            ) from None
        return pc.invert(wanted)
    if deletion_vector is None:
        return None
    deleted = deletion_vectors.read_deleted_rows(
        storage, deletion_vector, table=table, data_file=path_in_log, num_rows=pf.metadata.num_rows
    )
    if len(deleted) == 0:
        return None
    return deletion_vectors.keep_mask(deleted, pf.metadata.num_rows, data_file=path_in_log)


def _stream(
    pf: pq.ParquetFile,
    read_names: list[str],
    columns_arg: list[str] | None,
    assemble: Callable[[pa.RecordBatch | None, int], pa.RecordBatch],
    keep: pa.BooleanArray | None,
    use_threads: bool,
) -> Iterator[pa.RecordBatch]:
    if keep is None and read_names:  # every row: no row group needs to be looked at
        for raw in pf.iter_batches(batch_size=BATCH_SIZE, columns=columns_arg, use_threads=use_threads):
            if raw.num_rows:
                yield assemble(raw, raw.num_rows)
        return
    metadata = pf.metadata
    start = 0
    for rg in range(metadata.num_row_groups):
        rg_rows = metadata.row_group(rg).num_rows
        rg_start, start = start, start + rg_rows
        if rg_rows == 0 or (keep is not None and not pc.any(keep.slice(rg_start, rg_rows)).as_py()):
            continue
        if not read_names:  # only partition columns or columns absent from the file
            batches: Iterable[tuple[pa.RecordBatch | None, int]] = (
                (None, min(BATCH_SIZE, rg_rows - offset)) for offset in range(0, rg_rows, BATCH_SIZE)
            )
        else:
            batches = (
                (raw, raw.num_rows)
                for raw in pf.iter_batches(
                    batch_size=BATCH_SIZE, row_groups=[rg], columns=columns_arg, use_threads=use_threads
                )
            )
        offset = rg_start
        for raw, n in batches:
            out = assemble(raw, n)
            if keep is not None:
                out = out.filter(keep.slice(offset, n))
            offset += n
            if out.num_rows:
                yield out


# --- reading a snapshot ---------------------------------------------------------------------


def read_snapshot(
    storage: TableStorage,
    files: pa.Table,
    *,
    schema: StructType,
    partition_columns: Sequence[str],
    configuration: Mapping[str, str],
    columns: Sequence[str] | None = None,
    table: str | None = None,
) -> Iterator[pa.RecordBatch]:
    """The rows of every active file (``path``, ``partitionValues``, ``deletionVector`` columns)."""
    mode = column_mapping_mode(configuration)
    if files.num_rows == 0:
        return
    wanted = [c for c in ("path", "partitionValues", "deletionVector") if c in files.column_names]
    if "path" not in wanted:
        raise SchemaError("the files table has no 'path' column", table=table)
    # every path of the snapshot is held to the table root before the first file is opened
    storage.check_paths(files.column("path"))
    if "deletionVector" in wanted:
        deletion_vectors.check_dv_paths(storage, files.column("deletionVector"))
    for chunk in files.select(wanted).to_batches(max_chunksize=1024):
        for row in chunk.to_pylist():
            yield from read_data_file(
                storage,
                row["path"],
                schema=schema,
                partition_columns=partition_columns,
                column_mapping=mode,
                partition_values=dict(row.get("partitionValues") or ()),
                deletion_vector=row.get("deletionVector"),
                columns=columns,
                table=table,
            )
