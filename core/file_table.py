"""A snapshot's active files: an Arrow table whose largest column is read when first used.

A checkpoint's ``add.stats`` JSON strings are most of its bytes (a million files: ~240 MB of
stats beside ~80 MB of paths), yet listing, counting and reading a table's files never looks at
them. Replay reads every other column and decides which checkpoint rows survive; a
:class:`FileTable` holds those columns and reads a deferred column (from the checkpoint, for the
surviving rows only) the first time anything asks for it, then keeps it.

It answers as a ``pyarrow.Table`` does: ``num_rows``, ``schema``, ``column_names``,
``column(...)``, ``files["path"]`` and ``select`` of loaded columns never read a deferred one;
every other ``pyarrow.Table`` method (``to_pylist``, ``filter``, ``to_batches``...) runs on the
whole table (:meth:`FileTable.to_table`), reading what is deferred first. Only ``isinstance`` and
functions that demand a real ``pyarrow.Table`` (``pq.write_table``) need ``to_table()``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import pyarrow as pa

from deltamirror.core.compute import pc

__all__ = ["CHECKPOINT_ROW", "FileTable", "shared_nulls", "with_deferred"]

#: the column replay carries through ``reconcile``: each checkpoint row's place among the
#: checkpoint's adds (where its deferred columns are read from); null on a commit's adds
CHECKPOINT_ROW = "__checkpoint_row"
CHECKPOINT_ROW_TYPE = pa.uint64()

Loader = Callable[[], pa.ChunkedArray]
_MAX_RUNS = 64  # runs of surviving rows kept as slices whatever the size
_MIN_ROWS_PER_RUN = 256  # beyond that many runs, the average run must hold this many rows


class FileTable:
    """Active files (one row per file, the columns of a checkpoint's ``add``), some read lazily."""

    __slots__ = ("_lazy", "_lock", "_table")

    def __init__(self, table: pa.Table, lazy: Mapping[str, Loader] | None = None) -> None:
        #: every column, those in ``_lazy`` as placeholders of the right type
        self._table = table
        self._lazy = dict(lazy or {})
        self._lock = threading.Lock()

    # --- answered without reading a deferred column --------------------------------------------

    @property
    def num_rows(self) -> int:
        return int(self._table.num_rows)

    def __len__(self) -> int:
        return self.num_rows

    @property
    def num_columns(self) -> int:
        return int(self._table.num_columns)

    @property
    def shape(self) -> tuple[int, int]:
        return self.num_rows, self.num_columns

    @property
    def column_names(self) -> list[str]:
        return list(self._table.column_names)

    @property
    def schema(self) -> pa.Schema:
        return self._table.schema

    @property
    def deferred(self) -> list[str]:
        """The columns not read yet."""
        return sorted(self._lazy)

    def field(self, i: int | str) -> pa.Field:
        return self._table.field(i)

    def column(self, i: int | str) -> pa.ChunkedArray:
        name = self._table.field(i).name
        if name in self._lazy:
            self._load(name)
        return self._table.column(i)

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, int | str):
            return self.column(key)
        return self.to_table()[key]

    def select(self, columns: Iterable[int | str]) -> pa.Table:
        columns = list(columns)
        for c in columns:
            if self._table.field(c).name in self._lazy:
                self._load(self._table.field(c).name)
        return self._table.select(columns)

    def drop_columns(self, columns: str | Iterable[str]) -> pa.Table:
        dropped = {columns} if isinstance(columns, str) else set(columns)
        self._load_all(exclude=dropped)
        return self._table.drop_columns(list(dropped))

    @property
    def columns(self) -> list[pa.ChunkedArray]:
        return list(self.to_table().columns)

    # --- the whole table ------------------------------------------------------------------------

    def to_table(self) -> pa.Table:
        """The files as a ``pyarrow.Table``, every deferred column read (once)."""
        self._load_all()
        return self._table

    def equals(self, other: Any, check_metadata: bool = False) -> bool:
        if isinstance(other, FileTable):
            other = other.to_table()
        return bool(self.to_table().equals(other, check_metadata=check_metadata))

    def __eq__(self, other: object) -> bool:
        try:
            return self.equals(other)
        except TypeError:
            return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable (columns load), as pyarrow.Table is unhashable

    def __arrow_c_stream__(self, requested_schema: Any = None) -> Any:
        return self.to_table().__arrow_c_stream__(requested_schema)

    def __reduce__(self) -> tuple[Callable[[pa.Table], FileTable], tuple[pa.Table]]:
        return FileTable, (self.to_table(),)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in FileTable.__slots__:
            raise AttributeError(name)
        return getattr(self.to_table(), name)

    def __repr__(self) -> str:
        deferred = f", deferred={self.deferred}" if self._lazy else ""
        return f"FileTable(num_rows={self.num_rows}, columns={self.column_names}{deferred})"

    # --- loading --------------------------------------------------------------------------------

    def _load_all(self, exclude: Iterable[str] = ()) -> None:
        for name in sorted(set(self._lazy) - set(exclude)):
            self._load(name)

    def _load(self, name: str) -> None:
        with self._lock:
            loader = self._lazy.get(name)
            if loader is None:  # loaded meanwhile
                return
            column = loader()
            field = self._table.schema.field(name)
            if len(column) != self._table.num_rows or column.type != field.type:
                raise AssertionError(
                    f"deferred column {name!r}: {len(column)} values of {column.type} for "
                    f"{self._table.num_rows} rows of {field.type}"
                )
            index = self._table.schema.get_field_index(name)
            self._table = self._table.set_column(index, field, column)
            del self._lazy[name]


def with_deferred(files: pa.Table, deferred: Mapping[str, Loader]) -> FileTable:
    """The files replay reconciled, their :data:`CHECKPOINT_ROW` column turned into deferred columns.

    ``files`` holds each column of ``deferred`` as a placeholder: null on a checkpoint's row, the
    value on a commit's. ``deferred[name]()`` reads that column for every add row of the
    checkpoint, in :data:`CHECKPOINT_ROW` order; the surviving rows' values replace the
    placeholders when the column is first used.
    """
    if CHECKPOINT_ROW not in files.column_names:
        return FileTable(files)
    rows = files.column(CHECKPOINT_ROW)
    table = files.drop_columns([CHECKPOINT_ROW])
    if rows.null_count == len(rows) or not deferred:
        return FileTable(table)
    return FileTable(
        table,
        {name: _survivors(read, rows, table.column(name)) for name, read in deferred.items()},
    )


def shared_nulls(table: pa.Table) -> pa.Table:
    """``table`` with its all-null columns sharing one zeroed buffer.

    A checkpoint's tags, row ids and clustering provider are null on most tables, and the deletion
    vector struct on many; each would otherwise hold its own buffers of a value per row (a
    million files: 8 MB per integer column, six children for the deletion vector).
    """
    n = table.num_rows
    empty = [i for i, c in enumerate(table.columns) if n and c.null_count == n]
    if len(empty) < 2 and not any(pa.types.is_nested(table.schema.field(i).type) for i in empty):
        return table
    nulls = pa.nulls(n, pa.struct([table.schema.field(i) for i in empty]))
    for k, i in enumerate(empty):
        table = table.set_column(i, table.schema.field(i), nulls.field(k))
    return table


def _survivors(read: Loader, rows: pa.ChunkedArray, placeholder: pa.ChunkedArray) -> Loader:
    def load() -> pa.ChunkedArray:
        return merge_survivors(read(), rows, placeholder)

    return load


def merge_survivors(
    checkpoint: pa.ChunkedArray, rows: pa.ChunkedArray, placeholder: pa.ChunkedArray
) -> pa.ChunkedArray:
    """A column of the files: ``checkpoint[rows[i]]`` where ``rows[i]`` is set, else ``placeholder[i]``.

    Replay keeps the surviving checkpoint rows first and in order, then the commits' adds: the
    checkpoint's values are then taken as slices of runs (no copy of a string), and the commits'
    appended. Any other layout is taken row by row.
    """
    kept = len(rows) - rows.null_count
    if rows.slice(0, kept).null_count == 0:
        runs = _runs(rows.slice(0, kept).combine_chunks())
        if runs is not None:
            pieces = [checkpoint.slice(start, length) for start, length in runs]
            chunks = [c for p in pieces for c in p.chunks] + placeholder.slice(kept).chunks
            return pa.chunked_array(chunks, type=placeholder.type)
    taken = checkpoint.take(rows)
    return pc.coalesce(taken, placeholder)


def _runs(indices: pa.Array) -> list[tuple[int, int]] | None:
    """(start, length) of consecutive runs of ascending ``indices``; None when they are not
    ascending or too scattered for slices to beat a copy."""
    n = len(indices)
    if n == 0:
        return []
    signed = pc.cast(indices, pa.int64())
    steps = pc.subtract(signed.slice(1), signed.slice(0, n - 1))
    if n > 1 and pc.min(steps).as_py() < 1:
        return None
    breaks = pc.indices_nonzero(pc.not_equal(steps, 1)).to_pylist()
    if len(breaks) > 2 * max(_MAX_RUNS, n // _MIN_ROWS_PER_RUN):
        return None
    starts = [0, *(b + 1 for b in breaks)]
    ends = [*(b + 1 for b in breaks), n]
    firsts = signed.take(pa.array(starts, pa.int64())).to_pylist()
    return [(first, b - a) for first, a, b in zip(firsts, starts, ends, strict=True)]
