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
from itertools import accumulate

import pyarrow as pa
import pyarrow.compute as pc

from deltamirror.core.replay import file_keys

#: the files table is made contiguous again when its chunks exceed this, or one per ROWS_PER_CHUNK
MAX_CHUNKS = 64
ROWS_PER_CHUNK = 4096
#: a run of the path index this long keeps its positions only (it reads the state's paths)
KEEP_PATHS_BELOW = 65_536


class PathIndex:
    """Where the state's rows of given paths are, found without a pass over every file.

    Sorted runs of row positions (ordered by canonical path), searched by binary search: a run
    per version, merged with the run before it when that one is not more than twice as long, so
    there are few runs and a path is sorted again only a few times. Positions are those of the
    state's table, dead rows included (the state skips them): the index only grows until the
    state drops its dead rows (:meth:`drop`) or it is twice the state (then it is built again).

    A run keeps its paths (sorted, searched by ``search_sorted``) while it is small; a run of
    :data:`KEEP_PATHS_BELOW` rows or more, when the index is given ``lookup`` (the canonical
    paths of the state's rows at given positions), keeps only its positions and reads the paths
    it compares from the state itself, by a binary search of every probe at once: the index
    then holds no second copy of the state's paths. Without pyarrow's ``search_sorted`` the state
    makes a pass per version instead.
    """

    available = hasattr(pc, "search_sorted")

    def __init__(
        self,
        paths: pa.Array | pa.ChunkedArray,
        first: int = 0,
        *,
        lookup: Callable[[pa.Array], pa.Array] | None = None,
    ) -> None:
        #: (sorted paths or None, their positions), oldest first
        self._runs: list[tuple[pa.Array | None, pa.Array]] = []
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
        # one contiguous copy: a take over chunks would combine them first, then copy them sorted
        given = paths.combine_chunks() if isinstance(paths, pa.ChunkedArray) else paths
        order = pc.array_sort_indices(given)
        if not self._runs:
            self._distinct = not given.null_count and _sorted_distinct(given, order)
        if not self._runs and self._lookup is not None and len(given) >= KEEP_PATHS_BELOW:
            # the first run of a large index (the state's files): never sorted whole
            self._runs.append((None, positions.take(order)))
            self.size += len(given)
            return
        self._runs.append((given.take(order), positions.take(order)))
        self.size += len(paths)
        while len(self._runs) > 1 and len(self._runs[-2][1]) <= 2 * len(self._runs[-1][1]):
            (p2, r2), (p1, r1) = self._runs.pop(), self._runs.pop()
            merged = pa.concat_arrays([self._values(p1, r1), self._values(p2, r2)])
            rows = pa.concat_arrays([r1, r2])
            order = pc.array_sort_indices(merged)
            self._runs.append((merged.take(order), rows.take(order)))
        if self._lookup is not None:  # the large runs keep their positions only
            self._runs = [(p if len(r) < KEEP_PATHS_BELOW else None, r) for p, r in self._runs]

    def _values(self, paths: pa.Array | None, rows: pa.Array) -> pa.Array:
        if paths is not None:
            return paths
        assert self._lookup is not None
        found = self._lookup(rows)
        return found.combine_chunks() if isinstance(found, pa.ChunkedArray) else found

    def positions(self, paths: pa.Array) -> pa.Array:
        """The positions of every row whose path is one of ``paths`` (few), dead rows included."""
        found: list[pa.Array] = []
        for run, rows in self._runs:
            if run is not None:
                lo = pc.search_sorted(run, paths, side="left").to_pylist()
                hi = pc.search_sorted(run, paths, side="right").to_pylist()
            else:
                lo = self._bisect(rows, paths, right=False).to_pylist()
                hi = self._bisect(rows, paths, right=True).to_pylist()
            found.extend(rows.slice(a, b - a) for a, b in zip(lo, hi, strict=True) if b > a)
        return pa.concat_arrays(found) if found else pa.array([], pa.int64())

    def _bisect(self, rows: pa.Array, probes: pa.Array, *, right: bool) -> pa.Array:
        """``search_sorted`` of every probe at once over a run that keeps no paths."""
        k, n = len(probes), len(rows)
        lo = pa.repeat(pa.scalar(0, pa.int64()), k)
        hi = pa.repeat(pa.scalar(n, pa.int64()), k)
        last = pa.scalar(n - 1, pa.int64())
        while True:
            active = pc.less(lo, hi)
            if not pc.any(active).as_py():
                return lo
            mid = pc.min_element_wise(pc.divide(pc.add(lo, hi), 2), last)
            values = self._values(None, rows.take(mid))
            before = pc.less_equal(values, probes) if right else pc.less(values, probes)
            up = pc.and_(active, before)
            lo = pc.if_else(up, pc.add(mid, 1), lo)
            hi = pc.if_else(pc.and_(active, pc.invert(before)), mid, hi)

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
        for run, rows in runs:
            keep = pc.invert(pc.is_in(rows, value_set=dead))
            kept = rows.filter(keep)
            moved = pc.subtract(kept, pc.search_sorted(dead, kept, side="left"))
            self._runs.append((run.filter(keep) if run is not None else None, moved))
            self.size += len(kept)
        self._next -= len(dead)


def _sorted_distinct(values: pa.Array, order: pa.Array) -> bool:
    """Whether no value repeats, seen in ``order`` (their sort) a slice at a time."""
    step = 65_536
    for start in range(0, len(order), step):
        run = values.take(order.slice(start, step + 1))  # one more: the next slice's first
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
    "snapshot_changes",
    "take_rows",
]
