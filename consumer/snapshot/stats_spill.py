"""The ``stats`` of a table's active files, kept on disk instead of in memory.

A file's ``stats`` (its column statistics, as JSON) is most of what the state holds of it, and
the state never reads it: only a save (which writes it into the checkpoint) and a reader of
:attr:`~.state.IncrementalSnapshot.files` do. :class:`StatsSpill` keeps them in an anonymous
temporary file (deleted when the process ends, however it ends), written as they arrive, one
Arrow IPC record batch per call of :meth:`StatsSpill.put`; the state keeps, in place of each
file's ``stats``, its reference: its row number in the spill. :meth:`StatsSpill.get` reads
them back, reading only the batches that hold them.

A state loaded from its checkpoint reads no ``stats`` at all: its spill starts with the
checkpoint as its *base* (:meth:`StatsSpill.with_base`), the loaded files referring to their rows
in it (negative references: ``-1 - i`` for the ``i``-th file of the checkpoint), read a row group
at a time when asked for. The base stays open while files refer to it (a save prunes older
checkpoints: the open file stays readable, and its space is given back when the spill is
replaced).

The spill only grows; the state writes a new one (:meth:`StatsSpill.copy`, which moves the
base's rows into the file too) once most of its rows belong to files that are gone.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from deltamirror.core.compute import pc

from .files import positions_from

SCHEMA = pa.schema([pa.field("stats", pa.string())])


class StatsSpill:
    """``stats`` values on disk, each found again by the reference :meth:`put` returned for it."""

    def __init__(self, directory: str | Path | None = None) -> None:
        self.directory = directory
        self._file = tempfile.TemporaryFile(prefix=".stats-", dir=directory)  # noqa: SIM115 (lives with the state)
        self._fd = self._file.fileno()
        #: per batch written: its first reference, where it is in the file and its size
        self._starts: list[int] = []
        self._where: list[tuple[int, int]] = []
        #: references handed out (rows written), and bytes written
        self.rows = 0
        self.bytes = 0
        #: the checkpoint the loaded files' stats are read from, its column, where its files start,
        #: and the first row of each row group
        self._base: pq.ParquetFile | None = None
        self._base_column = ""
        self._base_first = 0
        self._base_groups: list[int] = []
        #: the files of the base (what the state loaded from it)
        self.base_rows = 0
        #: the base's row group read last, and its stats (a save asks for a group's rows in parts)
        self._base_last: tuple[int, pa.Array] | None = None

    @classmethod
    def with_base(
        cls, directory: str | Path | None, base: pq.ParquetFile, column: str, first: int, count: int
    ) -> StatsSpill:
        """A spill whose references ``-1 - i`` (``i`` < ``count``) are the ``column`` of row
        ``first + i`` of ``base``."""
        spill = cls(directory)
        spill._base, spill._base_column, spill._base_first = base, column, first
        groups, at = [], 0
        for i in range(base.metadata.num_row_groups):
            groups.append(at)
            at += base.metadata.row_group(i).num_rows
        spill._base_groups = groups
        spill.base_rows = count
        return spill

    @staticmethod
    def base_refs(count: int) -> pa.Array:
        """The references of the base's ``count`` files, in order."""
        return pc.subtract(pa.scalar(-1, pa.int64()), positions_from(0, count))

    def close(self) -> None:
        self._base_last = None
        self._file.close()
        if self._base is not None:
            self._base.close()
            self._base = None

    def put(self, stats: pa.Array | pa.ChunkedArray) -> pa.Array:
        """Write ``stats`` (strings, nulls kept); their references, in order."""
        n = len(stats)
        if n == 0:
            return pa.array([], pa.int64())
        column = stats.combine_chunks() if isinstance(stats, pa.ChunkedArray) else stats
        message = pa.record_batch([column.cast(pa.string())], schema=SCHEMA).serialize()
        written = os.pwrite(self._fd, message, self.bytes)
        if written != message.size:  # a full disk: never a silently short spill
            raise OSError(f"the stats spill wrote {written} of {message.size} bytes")
        self._starts.append(self.rows)
        self._where.append((self.bytes, message.size))
        refs = positions_from(self.rows, n)
        self.rows += n
        self.bytes += message.size
        return refs

    def get(self, refs: pa.Array | pa.ChunkedArray) -> pa.Array:
        """The ``stats`` of ``refs`` (references this spill handed out), in that order."""
        if isinstance(refs, pa.ChunkedArray):
            refs = refs.combine_chunks()
        if len(refs) == 0:
            return pa.array([], pa.string())
        if self._base is None or not pc.any(pc.less(refs, 0)).as_py():
            return self._get_written(refs)
        in_base = pc.less(refs, 0)
        written = self._get_written(refs.filter(pc.invert(in_base)))
        based = self._get_base(pc.subtract(pa.scalar(-1, pa.int64()), refs.filter(in_base)))
        # each value back in its place: the positions of both kinds, in the order of refs
        values = pa.concat_arrays([written, based])
        where = pc.indices_nonzero(pc.invert(in_base))
        where_base = pc.indices_nonzero(in_base)
        order = pc.sort_indices(pa.concat_arrays([where, where_base]))
        return values.take(order)

    def _get_written(self, refs: pa.Array) -> pa.Array:
        if len(refs) == 0:
            return pa.array([], pa.string())
        starts = pa.array(self._starts, pa.int64())
        batch_of = pc.subtract(pc.search_sorted(starts, refs, side="right"), 1)
        needed = pc.unique(batch_of).sort().to_pylist()
        parts: list[pa.Array] = []
        base = [0] * len(self._starts)  # where each batch read begins in the concatenation
        at = 0
        for b in needed:
            offset, size = self._where[b]
            data = os.pread(self._fd, size, offset)
            if len(data) != size:
                raise OSError(f"the stats spill read {len(data)} of {size} bytes")
            part = pa.ipc.read_record_batch(pa.py_buffer(data), SCHEMA).column(0)
            base[b] = at - self._starts[b]
            at += len(part)
            parts.append(part)
        values = parts[0] if len(parts) == 1 else pa.concat_arrays(parts)
        return values.take(pc.add(refs, pa.array(base, pa.int64()).take(batch_of)))

    def _get_base(self, files: pa.Array) -> pa.Array:
        """The stats of the base's files at positions ``files`` (row group by row group)."""
        assert self._base is not None
        if not len(files):
            return pa.array([], pa.string())
        rows = pc.add(files, self._base_first)
        starts = pa.array(self._base_groups, pa.int64())
        group_of = pc.subtract(pc.search_sorted(starts, rows, side="right"), 1)
        parts: list[pa.Array] = []
        base = [0] * len(self._base_groups)
        at = 0
        for g in pc.unique(group_of).sort().to_pylist():
            if self._base_last is not None and self._base_last[0] == g:
                part = self._base_last[1]
            else:
                table = self._base.read_row_group(g, columns=[self._base_column])
                part = table.column(0).combine_chunks()
                if pa.types.is_struct(part.type):  # a nested column reads as its struct
                    part = pc.struct_field(part, self._base_column.split(".")[-1])
                part = part.cast(pa.string())
            base[g] = at - self._base_groups[g]
            at += len(part)
            parts.append(part)
        self._base_last = (g, part)
        values = parts[0] if len(parts) == 1 else pa.concat_arrays(parts)
        return values.take(pc.add(rows, pa.array(base, pa.int64()).take(group_of)))

    def copy(self, refs: pa.ChunkedArray) -> tuple[StatsSpill, pa.ChunkedArray]:
        """A new spill (in the same directory) holding only ``refs``, chunk by chunk, and their
        references in it."""
        spill = StatsSpill(self.directory)
        try:
            moved = [spill.put(self.get(chunk)) for chunk in refs.chunks]
        except BaseException:
            spill.close()
            raise
        return spill, pa.chunked_array(moved, pa.int64())


__all__ = ["SCHEMA", "StatsSpill"]
