"""Net changes over a range: the effect of a change feed on each row, not every step it took.

A cache to invalidate or a service re-seeding itself wants, for a range of versions, one event per
row: what the range did to it. With key columns (unique per row at every version), a row's first
and last change in the range say it all: the first tells whether the row existed before the range
(a ``delete`` or ``update_preimage`` comes first), the last whether it exists after (an ``insert``
or ``update_postimage`` comes last). So each key gives

- ``insert`` (the last state) for a row that did not exist before and does after,
- ``delete`` (the state before the range) for a row that existed before and does not after,
- ``update_preimage`` (before) then ``update_postimage`` (after) for a row that existed on both
  sides with other values,
- nothing for a row inserted and deleted inside the range, or changed back to what it was (its
  ``_row_commit_version``, when row ids are read, is not a value: a row rewritten with its own
  values is unchanged).

Without key columns a row is its values: the feed is a difference of two multisets of rows, and
each distinct row gives as many ``insert`` or ``delete`` rows as the range added or removed of it
(an update is then a delete and an insert, never paired). Either way the result equals the
difference between the table's state before the range and after it.

``_commit_version`` and ``_commit_timestamp`` of a net row are those of the row's last change. Rows
are taken in version order, a version's removed images (``delete``, ``update_preimage``) before its
added ones whatever the order a writer gave them in (delta-rs writes an update's post-images
first), and come out in the order of their last change. The whole range's change rows are held in Arrow while
grouping (grouping and taking are Arrow kernels: no Python object per row).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import pyarrow as pa

from deltamirror.core.compute import pc

from ..errors import NetChangesError
from ..row_tracking import ROW_COMMIT_VERSION
from .cdf_columns import CDF_COLUMNS, CHANGE_TYPE, COMMIT_TIMESTAMP, COMMIT_VERSION

_SEQ = "__dm_seq"
_SIGN = "__dm_sign"
_ADDS = ("insert", "update_postimage")
_REMOVES = ("delete", "update_preimage")


def _arange(n: int) -> pa.Array:
    """0 … n-1 as int64, built by Arrow."""
    return pc.indices_nonzero(pc.is_null(pa.nulls(n))).cast(pa.int64())


def _repeat(indices: pa.Array | pa.ChunkedArray, counts: pa.Array | pa.ChunkedArray) -> pa.Array:
    """Each of ``indices`` repeated its count's times, built by Arrow (a list per index)."""
    counts = pa.chunked_array([counts]) if isinstance(counts, pa.Array) else counts
    lengths = counts.combine_chunks().cast(pa.int64())
    offsets = pa.concat_arrays([pa.array([0], pa.int64()), pc.cumulative_sum(lengths)])
    total = offsets[-1].as_py()
    lists = pa.LargeListArray.from_arrays(offsets, pa.nulls(total))
    return pc.take(indices, pc.list_parent_indices(lists))


def _numbered(rows: pa.Table) -> pa.Table:
    kinds = rows.column(CHANGE_TYPE)
    adds = pc.is_in(kinds, value_set=pa.array(_ADDS))
    removes = pc.is_in(kinds, value_set=pa.array(_REMOVES))
    unknown = pc.invert(pc.or_(adds, removes))
    if pc.any(unknown).as_py():
        bad = pc.filter(kinds, unknown)[0].as_py()
        raise NetChangesError(f"a change row has _change_type {bad!r}: no net change can be made of it")
    sign = pc.if_else(adds, 1, -1).cast(pa.int64())
    # a version's removes before its adds: a writer may put an update's post-image first (delta-rs
    # does), and a row's state before a version is its removed image, after it its added one
    order = pa.table({"v": rows.column(COMMIT_VERSION), "s": sign, "i": _arange(rows.num_rows)})
    at = pc.sort_indices(order, sort_keys=[("v", "ascending"), ("s", "ascending"), ("i", "ascending")])
    rows = rows.append_column(_SIGN, sign).take(at)
    return rows.append_column(_SEQ, _arange(rows.num_rows)).select([*rows.schema.names, _SEQ])


def _data_columns(schema: pa.Schema) -> list[str]:
    return [name for name in schema.names if name not in CDF_COLUMNS]


def _groupable(rows: pa.Table, columns: Sequence[str], table: str | None, what: str) -> None:
    for name in columns:
        if name not in rows.schema.names:
            raise NetChangesError(
                f"no column {name!r} in the change feed to key rows by", table=table, column=name
            )
        kind = rows.schema.field(name).type
        if pa.types.is_nested(kind):
            raise NetChangesError(
                f"column {name!r} ({kind}) cannot {what}: give key columns of simple types",
                table=table,
                column=name,
            )


def _with_cdf(data: pa.Table, kind: str, last: pa.Table) -> pa.Table:
    """``data``'s columns, then the three CDF columns: ``kind``, and the version and timestamp of ``last``."""
    out = data.append_column(CHANGE_TYPE, pa.repeat(pa.scalar(kind, pa.string()), data.num_rows))
    out = out.append_column(COMMIT_VERSION, last.column(COMMIT_VERSION))
    return out.append_column(COMMIT_TIMESTAMP, last.column(COMMIT_TIMESTAMP))


def _same_values(a: pa.Table, b: pa.Table, columns: Sequence[str]) -> pa.ChunkedArray | pa.Array:
    """Per row, whether ``a`` and ``b`` hold the same values (nulls equal to nulls); a nested column
    counts as changed."""
    same: pa.ChunkedArray | pa.Array = pa.repeat(pa.scalar(True), a.num_rows)
    for name in columns:
        x, y = a.column(name), b.column(name)
        if pa.types.is_nested(x.type):
            equal = pa.repeat(pa.scalar(False), a.num_rows)
        else:
            both_null = pc.and_(pc.is_null(x), pc.is_null(y))
            equal = pc.or_(pc.fill_null(pc.equal(x, y), False), both_null)
        same = pc.and_(same, equal)
    return same


def _keyed(rows: pa.Table, keys: Sequence[str], data: list[str], table: str | None) -> pa.Table:
    grouped = rows.group_by(list(keys), use_threads=False).aggregate(
        [(_SEQ, "min"), (_SEQ, "max"), (_SIGN, "sum")]
    )
    first = rows.take(grouped.column(f"{_SEQ}_min"))
    last = rows.take(grouped.column(f"{_SEQ}_max"))
    before = pc.is_in(first.column(CHANGE_TYPE), value_set=pa.array(_REMOVES))
    after = pc.is_in(last.column(CHANGE_TYPE), value_set=pa.array(_ADDS))
    # a key unique at every version changes by at most one row: after - before == the signs' sum
    expected = pc.subtract(pc.cast(after, pa.int64()), pc.cast(before, pa.int64()))
    clash = pc.not_equal(grouped.column(f"{_SIGN}_sum"), expected)
    if pc.any(clash).as_py():
        key = {k: grouped.column(k)[pc.index(clash, True).as_py()].as_py() for k in keys}
        raise NetChangesError(
            f"the key columns {', '.join(keys)} are not unique: the range adds or removes more than one "
            f"row with key {key} at a time",
            table=table,
        )
    inserted = pc.and_(pc.invert(before), after)
    deleted = pc.and_(before, pc.invert(after))
    # a row's commit version is where it was last written, not a value: a row rewritten with the
    # values it had (an UPDATE that changes nothing, a change undone) is unchanged over the range
    values = [name for name in data if name != ROW_COMMIT_VERSION]
    changed = pc.and_(pc.and_(before, after), pc.invert(_same_values(first, last, values)))
    parts = [
        (inserted, 0, last, "insert"),
        (deleted, 0, first, "delete"),
        (changed, 0, first, "update_preimage"),
        (changed, 1, last, "update_postimage"),
    ]
    order = last.column(_SEQ)
    tables, seqs, subs = [], [], []
    for mask, sub, source, kind in parts:
        picked = _with_cdf(source.filter(mask).select(data), kind, last.filter(mask))
        tables.append(picked)
        seqs.append(pc.filter(order, mask))
        subs.append(pa.repeat(pa.scalar(sub, pa.int64()), picked.num_rows))
    # in the order of each row's last change; a pre-image right before its post-image
    keys_of_order = pa.table(
        {
            "seq": pa.chunked_array([c for s in seqs for c in s.chunks], pa.int64()),
            "sub": pa.chunked_array(subs),
        }
    )
    at = pc.sort_indices(keys_of_order, sort_keys=[("seq", "ascending"), ("sub", "ascending")])
    return pa.concat_tables(tables).take(at)


def _unkeyed(rows: pa.Table, data: list[str], table: str | None) -> pa.Table:
    _groupable(rows, data, table, "identify a row without key columns")
    grouped = rows.group_by(data, use_threads=False).aggregate([(_SIGN, "sum"), (_SEQ, "max")])
    net = grouped.column(f"{_SIGN}_sum")
    moved = pc.not_equal(net, 0)
    last_seq = pc.filter(grouped.column(f"{_SEQ}_max"), moved)
    counts = pc.abs(pc.filter(net, moved))
    # a distinct row added (or removed) k times more than removed (added) gives k rows
    each = _repeat(_arange(len(last_seq)), counts)
    seq = pc.take(last_seq, each)
    adds = pc.greater(pc.take(pc.filter(net, moved), each), 0)
    at = pc.sort_indices(seq)
    chosen = rows.take(pc.take(seq, at))
    kinds = pc.if_else(pc.take(adds, at), "insert", "delete")
    out = chosen.select(data).append_column(CHANGE_TYPE, kinds.cast(pa.string()))
    out = out.append_column(COMMIT_VERSION, chosen.column(COMMIT_VERSION))
    return out.append_column(COMMIT_TIMESTAMP, chosen.column(COMMIT_TIMESTAMP))


def net_changes(
    batches: Iterable[pa.RecordBatch] | pa.Table,
    keys: Sequence[str] | None = None,
    *,
    schema: pa.Schema | None = None,
    table: str | None = None,
) -> pa.Table:
    """The net effect of change-feed rows (in commit order, as :func:`read_changes` gives them) on
    each row: see the module's text. ``keys`` name columns unique per row at every version; without
    them a row is its values. ``schema`` is needed when ``batches`` may be empty; ``table`` names
    the table in errors."""
    if isinstance(batches, pa.Table):
        rows = batches
    else:
        collected = list(batches)
        if not collected and schema is None:
            raise NetChangesError("no change rows and no schema to give an empty result", table=table)
        rows = pa.Table.from_batches(collected, schema=schema)
    data = _data_columns(rows.schema)
    if keys is not None:
        if not keys:
            raise NetChangesError("key columns named, but none given", table=table)
        _groupable(rows, keys, table, "be a key column")
    if rows.num_rows == 0:
        return rows.select([*data, *CDF_COLUMNS])
    rows = _numbered(rows.select([*data, *CDF_COLUMNS]))
    out = _keyed(rows, keys, data, table) if keys else _unkeyed(rows, data, table)
    return out.select([*data, *CDF_COLUMNS])


__all__ = ["NetChangesError", "net_changes"]
