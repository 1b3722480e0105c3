"""Delta types as Spark DDL of the values on the wire: the pieces every format's DDL is made of.

The types are those of the values each row change carries (see :mod:`.row_changes`): dates are
INT days since the epoch, timestamps BIGINT microseconds, binary BINARY (``from_json`` decodes the
base64 text), maps with string keys MAP<STRING, …> and other maps their ``[[key, value], …]``
pairs as ARRAY<ARRAY<STRING>>. A decimal's DDL is the format's own (:mod:`.row_formats`: one
class per format), given here as ``decimal``.
"""

from __future__ import annotations

from collections.abc import Callable

from deltamirror.core.schema import ArrayType, DecimalType, DeltaType, MapType, PrimitiveType, StructType

#: how a format writes a decimal column's Spark type
DecimalDdl = Callable[[DecimalType], str]

SOURCE_DDL = (
    "STRUCT<version: STRING, connector: STRING, name: STRING, ts_ms: BIGINT, snapshot: STRING, db: STRING, "
    "`table`: STRING, table_id: STRING, delta_version: BIGINT, `index`: BIGINT>"
)
TRANSACTION_BLOCK_DDL = "STRUCT<id: STRING, total_order: BIGINT, data_collection_order: BIGINT>"

_PRIMITIVES = {
    "string": "STRING",
    "long": "BIGINT",
    "integer": "INT",
    "short": "SMALLINT",
    "byte": "TINYINT",
    "float": "FLOAT",
    "double": "DOUBLE",
    "boolean": "BOOLEAN",
    "binary": "BINARY",
    "date": "INT",
    "timestamp": "BIGINT",
    "timestamp_ntz": "BIGINT",
}


def quote(name: str) -> str:
    """A column name as a Spark identifier (backticks, a backtick doubled)."""
    return "`" + name.replace("`", "``") + "`"


def type_ddl(t: DeltaType, decimal: DecimalDdl) -> str:
    if isinstance(t, DecimalType):
        return decimal(t)
    if isinstance(t, PrimitiveType):
        ddl = _PRIMITIVES.get(t.name)
        if ddl is None:
            raise ValueError(f"no Spark type for the Delta type {t.name!r} on the changes topic")
        return ddl
    if isinstance(t, ArrayType):
        return f"ARRAY<{type_ddl(t.element_type, decimal)}>"
    if isinstance(t, MapType):
        if isinstance(t.key_type, PrimitiveType) and t.key_type.name == "string":
            return f"MAP<STRING, {type_ddl(t.value_type, decimal)}>"
        return "ARRAY<ARRAY<STRING>>"
    return f"STRUCT<{fields_ddl(t, decimal, sep=': ')}>"


def fields_ddl(schema: StructType, decimal: DecimalDdl, *, sep: str = " ") -> str:
    """The fields of ``schema``, quoted, with their types (``sep``: ``" "`` at the top, ``": "`` in a STRUCT)."""
    return ", ".join(f"{quote(f.name)}{sep}{type_ddl(f.type, decimal)}" for f in schema.fields)


def envelope_ddl(schema: StructType, decimal: DecimalDdl) -> list[tuple[str, str]]:
    """(field, type) of a change event's envelope for a table of ``schema``."""
    image = f"STRUCT<{fields_ddl(schema, decimal, sep=': ')}>"
    return [
        ("before", image),
        ("after", image),
        ("op", "STRING"),
        ("ts_ms", "BIGINT"),
        ("source", SOURCE_DDL),
        ("transaction", TRANSACTION_BLOCK_DDL),
    ]


__all__ = [
    "SOURCE_DDL",
    "TRANSACTION_BLOCK_DDL",
    "DecimalDdl",
    "envelope_ddl",
    "fields_ddl",
    "quote",
    "type_ddl",
]
