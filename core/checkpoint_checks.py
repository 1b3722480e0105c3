"""The checks a checkpoint's file action rows get, as the log boundary checks commit lines, in Arrow.

A checkpoint is log input like a commit (:mod:`.actions`): columns of the types the protocol
gives, required fields present, paths non-empty, sizes non-negative, deletion vector descriptors
well formed. A handful of kernels check them whatever the number of files.
"""

from __future__ import annotations

import pyarrow as pa

from deltamirror.core.compute import pc

from .actions import Where

__all__ = ["check_file_rows"]

#: fields a file action row must have (as a commit line must), by action type
_REQUIRED = {
    "add": ("path", "partitionValues", "size", "modificationTime", "dataChange"),
    "remove": ("path", "dataChange"),
}
_NON_NEGATIVE = ("size", "baseRowId", "defaultRowCommitVersion")
_DV_NON_NEGATIVE = ("offset", "sizeInBytes", "cardinality", "maxRowIndex")


def check_file_rows(kind: str, rows: pa.Table, where: Where) -> None:
    """A checkpoint's ``add`` (or ``remove``) rows, checked as the boundary checks commit lines,
    in Arrow: a handful of kernels whatever the number of files (a null count is free, a minimum
    one pass; deletion vectors are checked on the rows that have one)."""

    def refuse(mask: pa.ChunkedArray | pa.Array, problem: str) -> None:
        if pc.any(mask).as_py():
            row = pc.index(mask, True).as_py()
            raise where.refuse(f"{problem} (checkpoint {kind} row {row})")

    for name in _REQUIRED[kind]:
        if rows[name].null_count:
            refuse(pc.is_null(rows[name]), f"{kind}.{name}: required field missing")
    if rows.num_rows and pc.min(pc.binary_length(rows["path"])).as_py() == 0:
        refuse(pc.equal(pc.binary_length(rows["path"]), 0), f"{kind}.path: expected a non-empty string")
    for name in _NON_NEGATIVE:
        if rows[name].null_count == rows.num_rows:
            continue
        low = pc.min(rows[name]).as_py()
        if low is not None and low < 0:
            refuse(pc.less(rows[name], 0), f"{kind}.{name}: expected a non-negative 64-bit integer")
    dv = rows["deletionVector"]
    if dv.null_count == len(dv):
        return
    present = pc.is_valid(dv)
    dvs = dv.filter(present)  # the few rows with a deletion vector

    def refuse_dv(mask: pa.ChunkedArray | pa.Array, problem: str) -> None:
        if pc.any(mask).as_py():
            row = pc.indices_nonzero(present)[pc.index(mask, True).as_py()].as_py()
            raise where.refuse(f"{problem} (checkpoint {kind} row {row})")

    storage_type = pc.struct_field(dvs, "storageType")
    refuse_dv(
        pc.invert(pc.fill_null(pc.is_in(storage_type, pa.array(["u", "i", "p"])), False)),
        f"{kind}.deletionVector.storageType: expected one of 'u', 'i', 'p'",
    )
    inline = pc.struct_field(dvs, "pathOrInlineDv")
    refuse_dv(
        pc.fill_null(pc.equal(pc.binary_length(inline), 0), True),
        f"{kind}.deletionVector.pathOrInlineDv: expected a non-empty string",
    )
    for name in _DV_NON_NEGATIVE:
        values = pc.struct_field(dvs, name)
        if name in ("sizeInBytes", "cardinality") and values.null_count:
            refuse_dv(pc.is_null(values), f"{kind}.deletionVector.{name}: required field missing")
        low = pc.min(values).as_py()
        if low is not None and low < 0:
            refuse_dv(pc.less(values, 0), f"{kind}.deletionVector.{name}: expected a non-negative integer")
