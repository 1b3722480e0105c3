"""A table of every Delta type (schema, one row of edge values, one of nulls), for the Avro tests."""

from __future__ import annotations

import datetime
import json
from decimal import Decimal

import pyarrow as pa

from deltamirror.core.schema import parse_schema, to_arrow_schema

EVERY_TYPE = {
    "type": "struct",
    "fields": [
        {"name": "id", "type": "long", "nullable": False, "metadata": {}},
        {"name": "b", "type": "boolean", "nullable": True, "metadata": {}},
        {"name": "i8", "type": "byte", "nullable": True, "metadata": {}},
        {"name": "i16", "type": "short", "nullable": True, "metadata": {}},
        {"name": "i32", "type": "integer", "nullable": True, "metadata": {}},
        {"name": "f32", "type": "float", "nullable": True, "metadata": {}},
        {"name": "f64", "type": "double", "nullable": True, "metadata": {}},
        {"name": "dec", "type": "decimal(38,10)", "nullable": True, "metadata": {}},
        {"name": "small dec", "type": "decimal(5,2)", "nullable": True, "metadata": {}},
        {"name": "s", "type": "string", "nullable": True, "metadata": {}},
        {"name": "bin", "type": "binary", "nullable": True, "metadata": {}},
        {"name": "d", "type": "date", "nullable": True, "metadata": {}},
        {"name": "ts", "type": "timestamp", "nullable": True, "metadata": {}},
        {"name": "ntz", "type": "timestamp_ntz", "nullable": True, "metadata": {}},
        {
            "name": "st",
            "type": {
                "type": "struct",
                "fields": [
                    {"name": "a.b", "type": "integer", "nullable": True, "metadata": {}},
                    {"name": "when", "type": "timestamp", "nullable": True, "metadata": {}},
                    {
                        "name": "inner",
                        "type": {
                            "type": "struct",
                            "fields": [{"name": "d", "type": "date", "nullable": True, "metadata": {}}],
                        },
                        "nullable": True,
                        "metadata": {},
                    },
                ],
            },
            "nullable": True,
            "metadata": {},
        },
        {
            "name": "arr",
            "type": {"type": "array", "elementType": "timestamp_ntz", "containsNull": True},
            "nullable": True,
            "metadata": {},
        },
        {
            "name": "smap",
            "type": {
                "type": "map",
                "keyType": "string",
                "valueType": "decimal(5,2)",
                "valueContainsNull": True,
            },
            "nullable": True,
            "metadata": {},
        },
        {
            "name": "imap",
            "type": {"type": "map", "keyType": "integer", "valueType": "string", "valueContainsNull": False},
            "nullable": True,
            "metadata": {},
        },
        {"name": "v", "type": "variant", "nullable": True, "metadata": {}},
        {"name": "1st col", "type": "string", "nullable": True, "metadata": {}},
        {"name": "1st_col", "type": "string", "nullable": True, "metadata": {}},
    ],
}
UTC = datetime.UTC
ROW = {
    "id": 1,
    "b": True,
    "i8": -128,
    "i16": 32767,
    "i32": -(2**31),
    "f32": 1.5,
    "f64": float("nan"),
    "dec": Decimal("-1234567890123456789012345678.0123456789"),
    "small dec": Decimal("-0.05"),
    "s": "é\n\u0000",
    "bin": b"\x00\xff",
    "d": datetime.date(1969, 12, 31),
    "ts": datetime.datetime(1900, 1, 1, 0, 0, 0, 1, tzinfo=UTC),
    "ntz": datetime.datetime(9999, 12, 31, 23, 59, 59, 999999),
    "st": {
        "a.b": 7,
        "when": datetime.datetime(2024, 2, 29, 12, tzinfo=UTC),
        "inner": {"d": datetime.date(2000, 1, 1)},
    },
    "arr": [datetime.datetime(1970, 1, 1), None],
    "smap": [("k", Decimal("1.25")), ("n", None)],
    "imap": [(3, "three"), (-1, "minus one")],
    "v": {"value": b"\x0c\x01", "metadata": b"\x01\x00\x00"},
    "1st col": "x",
    "1st_col": "y",
}
NULLS = {name: None for name in ROW} | {"id": 2}


def every_type_batch() -> pa.RecordBatch:
    """ROW and NULLS of EVERY_TYPE as core reads them, with the change feed's ``_change_type``."""
    schema = to_arrow_schema(parse_schema(json.dumps(EVERY_TYPE)))
    rows = [ROW, NULLS]
    batch = pa.RecordBatch.from_pylist(rows, schema=schema)
    return batch.append_column("_change_type", pa.array(["insert", "delete"]))
