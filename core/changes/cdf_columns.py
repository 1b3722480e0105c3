"""The change data feed's own columns, and the cheap ways to build them per batch.

``_change_type``, ``_commit_version`` and ``_commit_timestamp`` follow the table's columns in
every batch; each batch holds one version, so the last two are one value repeated.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

from ..constant_columns import repeated_int64
from ..errors import CorruptLogError
from ..read import BATCH_SIZE as READ_BATCH_ROWS
from ..read import open_parquet, read_error

if TYPE_CHECKING:
    from ..table import DeltaTable

CHANGE_TYPE = "_change_type"
COMMIT_VERSION = "_commit_version"
COMMIT_TIMESTAMP = "_commit_timestamp"
CDF_COLUMNS = (CHANGE_TYPE, COMMIT_VERSION, COMMIT_TIMESTAMP)
TIMESTAMP_TYPE = pa.timestamp("us", tz="UTC")


@dataclass(frozen=True)
class CommitColumns:
    """The version whose rows a read yields, and its ``_commit_timestamp`` in microseconds."""

    version: int
    timestamp_us: int

    def columns(self, n: int) -> tuple[pa.Array, pa.Array]:
        """``_commit_version`` and ``_commit_timestamp`` for ``n`` rows."""
        return repeated_int64(self.version, n, pa.int64()), repeated_int64(
            self.timestamp_us, n, TIMESTAMP_TYPE
        )


#: "insert"/"delete" columns sliced per batch, grown (doubling, up to the longest batch
#: read_data_file yields) as longer batches come: small files never pay for a 64k-row column
_STRING_RUNS: dict[str, pa.Array] = {}
_FIRST_RUN_ROWS = 4096


def repeated_string(value: str, n: int) -> pa.Array:
    """``n`` copies of a string (``_change_type``): a slice of one shared column."""
    run = _STRING_RUNS.get(value)
    if run is None or n > len(run):
        rows = max(n, _FIRST_RUN_ROWS, 2 * len(run) if run is not None else 0)
        if rows > READ_BATCH_ROWS:  # longer than any batch read: not kept
            return pa.repeat(pa.scalar(value, pa.string()), n)
        run = _STRING_RUNS[value] = pa.repeat(pa.scalar(value, pa.string()), rows)
    return run.slice(0, n)


class ColumnCursor:
    """Consecutive slices of one physical column of a parquet file, read lazily batch by batch."""

    def __init__(self, table: DeltaTable, path: str, column: str) -> None:
        self._file = open_parquet(table.storage, path, table=table.uri, kind="change data file")
        if column not in self._file.schema_arrow.names:
            self._file.close()
            raise CorruptLogError(f"change data file has no {column} column", table=table.uri, file=path)
        self._batches = self._file.iter_batches(columns=[column])
        self._current: pa.Array = pa.array([], pa.string())
        self._table = table.uri
        self._path = path

    def take(self, n: int) -> pa.Array:
        parts = []
        while n:
            if len(self._current) == 0:
                try:
                    self._current = next(self._batches).column(0).cast(pa.string())
                except StopIteration:
                    raise CorruptLogError(
                        "change data file ended early", table=self._table, file=self._path
                    ) from None
                except (OSError, MemoryError, pa.ArrowException) as exc:
                    raise read_error(exc, "change data file", self._table, self._path) from exc
            piece = self._current.slice(0, n)
            parts.append(piece)
            self._current = self._current.slice(len(piece))
            n -= len(piece)
        return pa.concat_arrays(parts) if len(parts) != 1 else parts[0]

    def close(self) -> None:
        self._file.close()
