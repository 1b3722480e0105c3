"""The kernels over a table's active files: what a version changed, found without a pass per file.

The state keeps its files as one Arrow table with the columns of a checkpoint's ``add``; a version
is reconciled with it by core's replay (:func:`deltamirror.core.replay.reconcile`). What is here
answers the questions around that: where the files of the state a version names are
(:class:`PathIndex`: no pass over the state per version), which files a version or a snapshot made disappear
(:func:`gone`, :func:`snapshot_changes`), and keeping the table's chunks few (:func:`compact`).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable
from itertools import accumulate, pairwise

import pyarrow as pa

from deltamirror.core.compute import pc
from deltamirror.core.replay import file_keys

#: the files table is made contiguous again when its chunks exceed this, or one per ROWS_PER_CHUNK
MAX_CHUNKS = 64
ROWS_PER_CHUNK = 4096
#: the length of the all-null array a type's all-null chunks are slices of (longer when needed)
ROWS_PER_SHARED_NULLS = 65_536
#: a run of the path index this long keeps its positions only (it reads the state's paths)
KEEP_PATHS_BELOW = 65_536
#: such a run keeps one path in this many (its fences)
FENCE_EVERY = 64


class _SearchSorted:
    def __get__(self, obj: object, owner: type | None = None) -> bool:
        return hasattr(pc, "search_sorted")


class PathIndex:
    """Where the state's rows of given paths are, found without a pass over every file.

    Sorted runs of row positions (ordered by canonical path): a run per version, merged with the
    run before it when that one is not more than twice as long, so there are few runs and a path
    is sorted again only a few times. Positions are those of the state's table, dead rows
    included (the state skips them): the index only grows until the state drops its dead rows
    (:meth:`drop`) or it is twice the state (then it is built again).

    A run keeps its paths (sorted, searched by ``search_sorted``) while it is small; a run of
    :data:`KEEP_PATHS_BELOW` rows or more, when the index is given ``lookup`` (the canonical
    paths of the state's rows at given positions), keeps only its positions and one path in
    :data:`FENCE_EVERY` (its fences, with where they are in the run): a probe's rows lie between
    two fences, and only that window's paths are read from the state. The index then holds no
    second copy of the state's paths. Without pyarrow's ``search_sorted`` the state makes a pass
    per version instead.
    """

    #: whether pyarrow has ``search_sorted`` (asked when first needed: asking imports pyarrow.compute)
    available: bool = _SearchSorted()  # type: ignore[assignment]

    def __init__(
        self,
        paths: pa.Array | pa.ChunkedArray,
        first: int = 0,
        *,
        lookup: Callable[[pa.Array], pa.Array] | None = None,
    ) -> None:
        #: (sorted paths or None, their positions, fences or None), oldest first
        self._runs: list[tuple[pa.Array | None, pa.Array, _Fences | None]] = []
        self.size = 0
        self._next = first
        self._lookup = lookup
        self._distinct: bool | None = None
        self.extend(paths, first)

    def extend(self, paths: pa.Array | pa.ChunkedArray, first: int | None = None) -> None:
        """``paths`` of the rows at positions ``first`` on (by default, after the last ones given).

        A run that must be merged reads the paths it does not keep through ``lookup``: those of
        rows given before (the state's table holds them), never of ``paths``."""
        first = self._next if first is None else first
        self._next = first + len(paths)
        if len(paths) == 0:
            return
        positions = positions_from(first, len(paths))
        if not self._runs and self._lookup is not None and len(paths) >= KEEP_PATHS_BELOW:
            # the first run of a large index (the state's files): never sorted whole, nor copied
            # (its chunks are read where they are: no contiguous copy of every path)
            order = pc.array_sort_indices(paths)
            if isinstance(order, pa.ChunkedArray):
                order = order.combine_chunks()
            self.size += len(paths)
            self._distinct = not paths.null_count and _sorted_distinct(paths, order)
            at = pc.multiply(positions_from(0, (len(paths) + FENCE_EVERY - 1) // FENCE_EVERY), FENCE_EVERY)
            fences = _Fences(take_values(paths, order.take(at)), at)
            self._runs.append((None, positions.take(order), fences))
            return
        # one contiguous copy: a take over chunks would combine them first, then copy them sorted
        given = paths.combine_chunks() if isinstance(paths, pa.ChunkedArray) else paths
        order = pc.array_sort_indices(given)
        self.size += len(given)
        if not self._runs:
            self._distinct = not given.null_count and _sorted_distinct(given, order)
        self._runs.append((given.take(order), positions.take(order), None))
        while len(self._runs) > 1 and len(self._runs[-2][1]) <= 2 * len(self._runs[-1][1]):
            (p2, r2, _), (p1, r1, _) = self._runs.pop(), self._runs.pop()
            merged = pa.concat_arrays([self._values(p1, r1), self._values(p2, r2)])
            rows = pa.concat_arrays([r1, r2])
            order = pc.array_sort_indices(merged)
            self._runs.append((merged.take(order), rows.take(order), None))
        if self._lookup is not None:  # the large runs keep their positions and fences only
            self._runs = [
                (None, r, _Fences.of(p)) if p is not None and len(r) >= KEEP_PATHS_BELOW else (p, r, f)
                for p, r, f in self._runs
            ]

    def _values(self, paths: pa.Array | None, rows: pa.Array) -> pa.Array:
        if paths is not None:
            return paths
        assert self._lookup is not None
        if len(rows) == 0:
            return pa.array([], pa.string())
        found = self._lookup(rows)
        return found.combine_chunks() if isinstance(found, pa.ChunkedArray) else found

    def positions(self, paths: pa.Array) -> pa.Array:
        """The positions of every row whose path is one of ``paths`` (few), dead rows included."""
        found: list[pa.Array] = []
        for run, rows, fences in self._runs:
            if run is not None:
                lo = pc.search_sorted(run, paths, side="left").to_pylist()
                hi = pc.search_sorted(run, paths, side="right").to_pylist()
                found.extend(rows.slice(a, b - a) for a, b in zip(lo, hi, strict=True) if b > a)
            else:
                assert fences is not None
                found.extend(self._fenced(rows, fences, paths))
        return pa.concat_arrays(found) if found else pa.array([], pa.int64())

    def _fenced(self, rows: pa.Array, fences: _Fences, probes: pa.Array) -> list[pa.Array]:
        """A run without paths: each probe's window between two fences, its paths read at once."""
        windows = fences.windows(probes, len(rows))
        values = self._values(None, pa.concat_arrays([rows.slice(a, b - a) for a, b in windows]))
        out: list[pa.Array] = []
        at = 0
        for probe, (a, b) in zip(probes, windows, strict=True):
            window = values.slice(at, b - a)
            at += b - a
            lo = pc.search_sorted(window, probe, side="left").as_py()
            hi = pc.search_sorted(window, probe, side="right").as_py()
            if hi > lo:
                out.append(rows.slice(a + lo, hi - lo))
        return out

    def distinct(self) -> bool:
        """True when the index holds one run (one table's paths) and no path twice in it."""
        return len(self._runs) == 1 and bool(self._distinct)

    def may_hold_any(self, paths: pa.Array | pa.ChunkedArray) -> bool:
        """Whether a row of one of ``paths`` was given (it may be dead since)."""
        if isinstance(paths, pa.ChunkedArray):
            paths = paths.combine_chunks()
        return len(self.positions(paths)) > 0

    def drop(self, dead: pa.Array) -> None:
        """The rows at the sorted positions ``dead`` are gone from the table: the others move up."""
        runs, self._runs, self.size = self._runs, [], 0
        for run, rows, fences in runs:
            keep = pc.invert(pc.is_in(rows, value_set=dead))
            kept = rows.filter(keep)
            moved = pc.subtract(kept, pc.search_sorted(dead, kept, side="left"))
            self._runs.append(
                (
                    run.filter(keep) if run is not None else None,
                    moved,
                    fences.kept(keep) if fences is not None else None,
                )
            )
            self.size += len(kept)
        self._next -= len(dead)


class _Fences:
    """One path in :data:`FENCE_EVERY` of a sorted run, with where each is in the run: every path
    before a fence's place sorts at or before it, every one from it on at or after it (still so
    once rows are dropped, the places moved up: :meth:`kept`)."""

    def __init__(self, values: pa.Array, at: pa.Array) -> None:
        self.values = values
        self.at = at

    @classmethod
    def of(cls, run: pa.Array) -> _Fences:
        at = pc.multiply(positions_from(0, (len(run) + FENCE_EVERY - 1) // FENCE_EVERY), FENCE_EVERY)
        return cls(run.take(at), at)

    def windows(self, probes: pa.Array, n: int) -> list[tuple[int, int]]:
        """Per probe, the places [a, b) of the run its rows are within."""
        below = pc.search_sorted(self.values, probes, side="left").to_pylist()
        upto = pc.search_sorted(self.values, probes, side="right").to_pylist()
        at = self.at.to_pylist() if len(self.at) < 4096 else None
        out = []
        for a, c in zip(below, upto, strict=True):
            lo = 0 if a == 0 else (at[a - 1] if at is not None else self.at[a - 1].as_py())
            hi = n if c >= len(self.values) else (at[c] if at is not None else self.at[c].as_py())
            out.append((lo, hi))
        return out

    def kept(self, keep: pa.Array) -> _Fences:
        """The fences once the run keeps only the rows ``keep`` marks: their places move up."""
        kept = pc.cumulative_sum(pc.cast(keep, pa.int64()))
        # the rows kept before each place (a place may be the run's end: all kept rows)
        before = pa.concat_arrays([pa.array([0], pa.int64()), kept])
        return _Fences(self.values, before.take(self.at))


def take_values(values: pa.Array | pa.ChunkedArray, indices: pa.Array | pa.ChunkedArray) -> pa.Array:
    """``values`` at ``indices``, in that order, read from the chunks that hold them: pyarrow's
    take over a chunked array first combines its chunks (a copy of every value)."""
    if isinstance(indices, pa.ChunkedArray):
        indices = indices.combine_chunks()
    if isinstance(values, pa.Array):
        return values.take(indices)
    if values.num_chunks == 1:
        return values.chunk(0).take(indices)
    if len(indices) == 0:
        return pa.array([], values.type)
    indices = indices.cast(pa.int64())
    lengths = [len(c) for c in values.chunks]
    starts = pa.array(list(accumulate(lengths, initial=0)), pa.int64())
    # the chunk of each index (its last start at or before it), then the indices chunk by chunk
    which = pc.subtract(pc.search_sorted(starts, indices, side="right"), 1)
    by_chunk = pc.sort_indices(which)  # stable: each chunk's indices keep their order
    bounds = pc.search_sorted(which.take(by_chunk), pa.array(range(len(lengths) + 1), pa.int64()))
    bounds_list = bounds.to_pylist()
    local = pc.subtract(indices.take(by_chunk), starts.take(which.take(by_chunk)))
    parts = [
        values.chunk(c).take(local.slice(lo, hi - lo))
        for c, (lo, hi) in enumerate(pairwise(bounds_list))
        if hi > lo
    ]
    gathered = pa.concat_arrays(parts)  # in the order of by_chunk: put back in the order asked
    return gathered.take(pc.sort_indices(by_chunk))


def _sorted_distinct(values: pa.Array | pa.ChunkedArray, order: pa.Array) -> bool:
    """Whether no value repeats, seen in ``order`` (their sort) a slice at a time."""
    step = 65_536
    for start in range(0, len(order), step):
        run = take_values(values, order.slice(start, step + 1))  # one more: the next slice's first
        if len(run) > 1 and pc.any(pc.equal(run.slice(1), run.slice(0, len(run) - 1))).as_py():
            return False
    return True


def take_rows(files: pa.Table, positions: pa.Array) -> pa.Table:
    """The rows at ``positions`` (few), in that order, taken from the chunks that hold them: a take
    over the whole table would first combine its chunks (copy every file)."""
    wanted = positions.to_pylist()
    batches = files.to_batches()
    starts = list(accumulate((b.num_rows for b in batches), initial=0))
    parts: list[pa.RecordBatch] = []
    for at in wanted:
        i = bisect_right(starts, at) - 1
        parts.append(batches[i].slice(at - starts[i], 1))
    return pa.Table.from_batches(parts, files.schema).combine_chunks() if parts else files.slice(0, 0)


def positions_from(first: int, count: int) -> pa.Array:
    """The positions ``first`` to ``first + count - 1``."""
    return pc.add(pc.cumulative_sum(pa.repeat(pa.scalar(1, pa.int64()), count)), first - 1)


def needs_compaction(files: pa.Table) -> bool:
    """Every version adds chunks; kernels slow down with many."""
    return bool(files.num_rows) and files.column(0).num_chunks > max(
        MAX_CHUNKS, files.num_rows // ROWS_PER_CHUNK
    )


def compact(files: pa.Table) -> pa.Table:
    """Each run of small chunks merged into one; chunks of ``ROWS_PER_CHUNK`` rows or more stay.

    Versions of a few files each add a small chunk: merging only those costs their rows, where
    combining the whole table copied every file each time.
    """
    out: list[pa.RecordBatch] = []
    small: list[pa.RecordBatch] = []
    for batch in [*files.to_batches(), None]:
        if batch is None or batch.num_rows >= ROWS_PER_CHUNK:
            if len(small) > 1:
                out.extend(pa.Table.from_batches(small, files.schema).combine_chunks().to_batches())
            else:
                out.extend(small)
            small = []
            if batch is not None:
                out.append(batch)
        else:
            small.append(batch)
    return pa.Table.from_batches(out, files.schema)


#: per type, one all-null array the all-null chunks of the files share (:func:`share_nulls`)
_NULLS: dict[pa.DataType, pa.Array] = {}


def _first_buffer(array: pa.Array) -> int | None:
    for buffer in array.buffers():
        if buffer is not None:
            return int(buffer.address)
    return None


def _shared_nulls(typ: pa.DataType, rows: int) -> pa.Array:
    """``rows`` nulls of ``typ``: a slice of the one all-null array of that type."""
    held = _NULLS.get(typ)
    if held is None or len(held) < rows:
        held = _NULLS[typ] = pa.nulls(max(rows, ROWS_PER_SHARED_NULLS), typ)
    return held.slice(0, rows)


def share_nulls(files: pa.Table) -> pa.Table:
    """``files`` with every chunk that holds only nulls replaced by a slice of one all-null array
    of its type (the same values: every row null).

    Columns a table never sets (a deletion vector, row tracking, clustering, tags) are all nulls,
    yet each chunk of them holds its own zeroed buffers: a struct of six fields is 32 bytes a
    row. Shared, they cost one chunk's worth per type, however many files the state holds.
    """
    columns = []
    changed = False
    for column in files.columns:
        chunks = list(column.chunks)
        replaced = False
        for i, chunk in enumerate(chunks):
            rows = len(chunk)
            if not rows or chunk.null_count != rows:
                continue
            held = _NULLS.get(chunk.type)
            if held is not None and _first_buffer(chunk) == _first_buffer(held):
                continue  # already shared
            chunks[i] = _shared_nulls(chunk.type, rows)
            replaced = changed = True
        columns.append(pa.chunked_array(chunks, column.type) if replaced else column)
    return pa.Table.from_arrays(columns, schema=files.schema) if changed else files


def keys(files: pa.Table) -> pa.Array:
    """The replay keys of file actions (core's: canonical path + NUL + deletion vector id)."""
    return file_keys(files["path"], files["deletionVector"])


def snapshot_changes(before: pa.Table, after: pa.Table) -> tuple[pa.Table, pa.Table]:
    """(files of ``after`` not in ``before``, files of ``before`` not in ``after``), by replay key."""
    if before.num_rows == 0 or after.num_rows == 0:
        return after, before
    before_keys, after_keys = keys(before), keys(after)
    added = after.filter(pc.invert(pc.is_in(after_keys, value_set=before_keys)))
    removed = before.filter(pc.invert(pc.is_in(before_keys, value_set=after_keys)))
    return added, removed


def gone(named: pa.Table, adds: pa.Table, removes: pa.Table, live: pa.Table) -> pa.Table:
    """Of ``named`` (the files of the state whose path a version's actions name), those whose key
    the version touched and that are not active after it. Keys are built only for these rows
    (as core's replay does)."""
    touched = pa.chunked_array([keys(adds), keys(removes)], type=pa.string()).combine_chunks()
    named_keys = keys(named)
    hit = pc.and_(
        pc.is_in(named_keys, value_set=touched), pc.invert(pc.is_in(named_keys, value_set=keys(live)))
    )
    return named.filter(hit)


__all__ = [
    "PathIndex",
    "compact",
    "gone",
    "keys",
    "needs_compaction",
    "positions_from",
    "share_nulls",
    "snapshot_changes",
    "take_rows",
]
