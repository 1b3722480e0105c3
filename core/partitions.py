"""Partition values: the strings of ``add.partitionValues`` as typed Arrow values.

PROTOCOL.md "Partition Value Serialization": an empty string or null is null; numbers, booleans
and dates are their text; timestamps are ``YYYY-MM-DD HH:MM:SS[.ffffff]`` (read as UTC: the
writer's zone is not recorded) or ISO-8601 with a zone (``...T...Z``); binary is the string's
bytes (UTF-8), as delta-spark writes and reads it. Under column mapping the keys are physical names.

Parsing is vectorised over an Arrow string column, so the values of many files cost one cast.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa

from deltamirror.core.compute import pc

from .errors import CorruptLogError, SchemaError
from .schema import (
    PRIMITIVE_TYPE_NAMES,
    ColumnMappingMode,
    DecimalType,
    DeltaType,
    PrimitiveType,
    StructField,
    physical_name,
    to_arrow_type,
)

#: every primitive type can be a partition column except variant and void
_PARTITIONABLE = PRIMITIVE_TYPE_NAMES - {"variant", "void"}
# a zone at the end of an ISO-8601 timestamp: Z, +hh:mm, +hhmm, +hh
_ZONED = r"(?:[Zz]|[+-]\d{2}(?::?\d{2})?)$"


def _check_partitionable(data_type: DeltaType, column: str | None) -> pa.DataType:
    if isinstance(data_type, DecimalType) or (
        isinstance(data_type, PrimitiveType) and data_type.name in _PARTITIONABLE
    ):
        return to_arrow_type(data_type)
    raise SchemaError(f"type {data_type.to_json_value()!r} cannot be a partition column", column=column)


#: typed scalars: an untyped Python value costs pyarrow a type inference that tries to import
#: pandas and dateutil (~45 us per call where they are not installed)
_EMPTY = pa.scalar("", pa.string())
_FALSE = pa.scalar(False, pa.bool_())


def parse_partition_values(
    values: pa.Array | pa.ChunkedArray,
    data_type: DeltaType,
    *,
    column: str | None = None,
    table: str | None = None,
    file: str | None = None,
) -> pa.Array:
    """Typed values of one partition column from its serialized strings (null or "" = null)."""
    target = _check_partitionable(data_type, column)
    strings = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    if not pa.types.is_string(strings.type):
        strings = strings.cast(pa.string())
    # "An empty string for any type translates to a null partition value."
    strings = pc.if_else(pc.equal(strings, _EMPTY), pa.scalar(None, pa.string()), strings)
    try:
        if pa.types.is_timestamp(target):
            return _parse_timestamps(strings, target)
        if pa.types.is_binary(target):
            return strings.cast(pa.binary())
        return strings.cast(target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise CorruptLogError(
            f"partition value does not parse as {data_type.to_json_value()}: {exc}",
            table=table,
            file=file,
            column=column,
        ) from exc


def _parse_timestamps(strings: pa.Array, target: pa.TimestampType) -> pa.Array:
    """Both spellings a writer may use: naive wall-clock (taken as UTC) and ISO-8601 with a zone."""
    zoned_mask = pc.fill_null(pc.match_substring_regex(strings, _ZONED), _FALSE)
    utc = pa.timestamp("us", tz="UTC")
    naive = pc.if_else(zoned_mask, pa.scalar(None, pa.string()), strings)
    parsed = naive.cast(pa.timestamp("us")).cast(utc)
    if pc.any(zoned_mask).as_py():
        zoned = pc.if_else(zoned_mask, strings, pa.scalar(None, pa.string()))
        # Arrow's ISO-8601 parser wants "+hh:mm"/"Z"; writers also emit "+hhmm"
        zoned = pc.replace_substring_regex(zoned, r"([+-]\d{2})(\d{2})$", r"\1:\2")
        parsed = pc.if_else(zoned_mask, zoned.cast(utc), parsed)
    return parsed.cast(target)


def parse_partition_value(
    value: str | None,
    data_type: DeltaType,
    *,
    column: str | None = None,
    table: str | None = None,
    file: str | None = None,
) -> pa.Scalar:
    """One typed partition value."""
    array = parse_partition_values(
        pa.array([value], pa.string()), data_type, column=column, table=table, file=file
    )
    return array[0]


def partition_value_of(
    partition_values: Mapping[str, str | None], field: StructField, mode: ColumnMappingMode
) -> str | None:
    """The serialized value of ``field`` in one file's ``partitionValues``.

    Keys are physical names under column mapping; a table upgraded to ``name`` mode keeps the
    logical name as physical name, so the logical key is the fallback.
    """
    key = physical_name(field, mode)
    if key in partition_values:
        return partition_values[key]
    return partition_values.get(field.name)


def parse_partition_map(
    partition_values: pa.Array | pa.ChunkedArray,
    fields: Sequence[StructField],
    mode: ColumnMappingMode,
    *,
    table: str | None = None,
) -> pa.Table:
    """Typed partition columns (logical names) for a column of ``partitionValues`` maps.

    One row per file; vectorised, so it suits a snapshot of many files.
    """
    maps = (
        partition_values.combine_chunks()
        if isinstance(partition_values, pa.ChunkedArray)
        else partition_values
    )
    columns = []
    for field in fields:
        key = physical_name(field, mode)
        strings = pc.map_lookup(maps, pa.scalar(key, pa.string()), "first")
        if key != field.name:
            # physical names are unique uuids: a logical-name key can only be this column's
            by_logical = pc.map_lookup(maps, pa.scalar(field.name, pa.string()), "first")
            strings = pc.coalesce(strings, by_logical)
        columns.append(parse_partition_values(strings, field.type, column=field.name, table=table))
    return pa.table(columns, names=[f.name for f in fields])


def distinct_partitions(
    values: pa.ChunkedArray | pa.Array, limit: int | None = None, *, keep_empty: bool = False
) -> tuple[list[dict[str, Any]], bool]:
    """The distinct ``partitionValues`` maps, first met first, at most ``limit`` of them; null and
    empty maps are left out, or with ``keep_empty`` counted as one empty partition.

    Two maps are the same partition whatever the order of their entries (as in the watcher's
    commit summary). The comparison runs in Arrow, so that only the distinct maps become Python
    objects, not one per file: each entry becomes one integer (dictionary codes of its key and
    value), and each map the string of its entry codes in ascending order. Returns the maps
    (entries in the order of the first file that has them) and whether more than ``limit``
    distinct ones were left out.
    """
    maps = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    map_type = maps.type
    entries = maps.cast(pa.list_(pa.struct([map_type.key_field, map_type.item_field])))
    lengths = pc.fill_null(pc.list_value_length(entries), 0)
    present = (
        pa.array(range(len(maps)), pa.int64()) if keep_empty else pc.indices_nonzero(pc.greater(lengths, 0))
    )
    if not len(present):
        return [], False
    flat = pc.list_flatten(entries)  # null maps add no entries
    keys = pc.dictionary_encode(flat.field(0))
    items = pc.dictionary_encode(flat.field(1), null_encoding="encode")
    codes = pc.add(
        pc.multiply(pc.cast(keys.indices, pa.int64()), len(items.dictionary)),
        pc.cast(items.indices, pa.int64()),
    )
    rows = pc.list_parent_indices(entries)
    if len(codes) > 1:
        same_row = pc.equal(rows.slice(1), rows.slice(0, len(rows) - 1))
        if pc.any(pc.and_(same_row, pc.less(codes.slice(1), codes.slice(0, len(codes) - 1)))).as_py():
            codes = codes.take(
                pc.sort_indices(
                    pa.table({"row": rows, "code": codes}), [("row", "ascending"), ("code", "ascending")]
                )
            )
    offsets = pa.concat_arrays([pa.array([0], pa.int64()), pc.cumulative_sum(pc.cast(lengths, pa.int64()))])
    per_row = pa.LargeListArray.from_arrays(offsets, pc.cast(codes, pa.string()))
    row_keys = pc.binary_join(per_row, ",").take(present)
    firsts = (
        pa.table({"key": row_keys, "row": present})
        .group_by("key", use_threads=False)
        .aggregate([("row", "min")])
        .column("row_min")
    )
    firsts = firsts.take(pc.sort_indices(firsts))
    truncated = limit is not None and len(firsts) > limit
    kept = firsts if limit is None else firsts.slice(0, limit)
    return [dict(v or ()) for v in maps.take(kept).to_pylist()], truncated
