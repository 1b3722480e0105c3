"""The kernels over a table's active files: what a version changed, found without a pass per file.

The state keeps its files as one Arrow table with the columns of a checkpoint's ``add``; a version
is reconciled with it by core's replay (:func:`deltamirror.core.replay.reconcile`). What is here
answers the questions around that: which files of the state a version names (:class:`PathIndex`
skips the pass over the state for an append), which files a version or a snapshot made disappear
(:func:`gone`, :func:`snapshot_changes`), and keeping the table's chunks few (:func:`compact`).
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from deltamirror.core.replay import file_keys

#: the files table is made contiguous again when its chunks exceed this, or one per ROWS_PER_CHUNK
MAX_CHUNKS = 64
ROWS_PER_CHUNK = 4096


class PathIndex:
    """Which paths may be among the state's files, answered without a pass over every file.

    Sorted runs of canonical paths, searched by binary search: a run per version, merged with the
    run before it when that one is not more than twice as long, so there are few runs and a path
    is sorted again only a few times. It only grows: a removed file stays until the index is
    twice the state, then it is built again. So it may say "maybe" for a path no longer there
    (the exact check follows) but never "no" for a path that is. It costs a second copy of the
    paths. Without pyarrow's ``search_sorted`` every version makes the exact check.
    """

    available = hasattr(pc, "search_sorted")

    def __init__(self, paths: pa.Array | pa.ChunkedArray) -> None:
        self._runs: list[pa.Array] = []
        self.size = 0
        self.extend(paths)

    def extend(self, paths: pa.Array | pa.ChunkedArray) -> None:
        if isinstance(paths, pa.ChunkedArray):
            paths = paths.combine_chunks()
        if len(paths) == 0:
            return
        self._runs.append(paths.take(pc.array_sort_indices(paths)))
        self.size += len(paths)
        while len(self._runs) > 1 and len(self._runs[-2]) <= 2 * len(self._runs[-1]):
            last = self._runs.pop()
            merged = pa.concat_arrays([self._runs.pop(), last])
            self._runs.append(merged.take(pc.array_sort_indices(merged)))

    def may_hold_any(self, paths: pa.Array | pa.ChunkedArray) -> bool:
        if isinstance(paths, pa.ChunkedArray):
            paths = paths.combine_chunks()
        for run in self._runs:
            at = pc.min_element_wise(pc.search_sorted(run, paths), len(run) - 1)
            if pc.any(pc.equal(run.take(at), paths)).as_py():
                return True
        return False


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


__all__ = ["PathIndex", "compact", "gone", "keys", "needs_compaction", "snapshot_changes"]
