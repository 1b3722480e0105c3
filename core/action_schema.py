"""Arrow types of file actions, shared by commit parsing, checkpoints and snapshots.

Snapshots of a million files are Arrow tables of these columns, never Python objects per file.
The names are Delta's own (camelCase), as in a checkpoint's ``add`` struct.
"""

from __future__ import annotations

import pyarrow as pa

STRING_MAP = pa.map_(pa.string(), pa.string())

DELETION_VECTOR = pa.struct(
    [
        pa.field("storageType", pa.string()),
        pa.field("pathOrInlineDv", pa.string()),
        pa.field("offset", pa.int32()),
        pa.field("sizeInBytes", pa.int32()),
        pa.field("cardinality", pa.int64()),
        pa.field("maxRowIndex", pa.int64()),
    ]
)

ADD = pa.schema(
    [
        pa.field("path", pa.string(), nullable=False),
        pa.field("partitionValues", STRING_MAP),
        pa.field("size", pa.int64()),
        pa.field("modificationTime", pa.int64()),
        pa.field("dataChange", pa.bool_()),
        pa.field("stats", pa.string()),
        pa.field("tags", STRING_MAP),
        pa.field("deletionVector", DELETION_VECTOR),
        pa.field("baseRowId", pa.int64()),
        pa.field("defaultRowCommitVersion", pa.int64()),
        pa.field("clusteringProvider", pa.string()),
    ]
)

REMOVE = pa.schema(
    [
        pa.field("path", pa.string(), nullable=False),
        pa.field("deletionTimestamp", pa.int64()),
        pa.field("dataChange", pa.bool_()),
        pa.field("extendedFileMetadata", pa.bool_()),
        pa.field("partitionValues", STRING_MAP),
        pa.field("size", pa.int64()),
        pa.field("stats", pa.string()),
        pa.field("tags", STRING_MAP),
        pa.field("deletionVector", DELETION_VECTOR),
        pa.field("baseRowId", pa.int64()),
        pa.field("defaultRowCommitVersion", pa.int64()),
    ]
)

CDC = pa.schema(
    [
        pa.field("path", pa.string(), nullable=False),
        pa.field("partitionValues", STRING_MAP),
        pa.field("size", pa.int64()),
        pa.field("dataChange", pa.bool_()),
        pa.field("tags", STRING_MAP),
    ]
)

SCHEMAS = {"add": ADD, "remove": REMOVE, "cdc": CDC}


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """Give a table read from any writer exactly ``schema``: missing columns as nulls, extra dropped.

    Checkpoints from different writers differ in which optional fields they carry and in integer
    widths; replay concatenates them with commit actions, so they must agree.
    """
    columns = []
    for field in schema:
        if field.name in table.column_names:
            col = table.column(field.name)
            if col.type != field.type:
                col = _cast(col, field.type)
            columns.append(col)
        else:
            columns.append(pa.nulls(table.num_rows, field.type))
    return pa.Table.from_arrays(columns, schema=schema)


def _cast(col: pa.ChunkedArray, target: pa.DataType) -> pa.ChunkedArray:
    if pa.types.is_struct(target) and pa.types.is_struct(col.type):
        chunks = []
        for chunk in col.chunks:
            arrays = []
            for f in target:
                idx = chunk.type.get_field_index(f.name)
                child = chunk.field(idx) if idx >= 0 else pa.nulls(len(chunk), f.type)
                arrays.append(child if child.type == f.type else child.cast(f.type))
            chunks.append(pa.StructArray.from_arrays(arrays, fields=list(target), mask=chunk.is_null()))
        return pa.chunked_array(chunks, type=target)
    return col.cast(target)
