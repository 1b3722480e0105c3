"""What a version's ``metaData`` changed in a table's shape, and how hard it is on a reader.

A reader of a table's rows (a consumer of its row events, a stream reading its change feed) keeps
working across some schema changes and not across others. :func:`schema_change` compares the
metaData in force before a version with the version's own and classes each change:

- ``additive``: a nullable column added (at any depth), a column made nullable, column mapping
  turned on (the logical schema readers see is the same);
- ``widening``: a type changed to a wider one, as the protocol's type widening allows
  (byte → short → int → long, float → double, byte/short/int → double, date → timestamp_ntz,
  an integer or a decimal to a decimal that holds every value, ``decimal(p, s)`` to
  ``decimal(p + k1, s + k2)`` with ``k1 >= k2 >= 0``);
- ``rename``: a column renamed (under column mapping: the same column id, another name);
- ``drop``: a column dropped;
- ``incompatible``: a type changed otherwise, a column made non-nullable, a non-nullable column
  added, the partition columns changed, column mapping turned off or changed between ``id`` and
  ``name``.

The change's class is the hardest of its changes (in that order). Columns are matched by their
column mapping id when both schemas have one (so a rename is told from a drop plus an add), by name
otherwise; struct fields are compared at any depth, and the types inside arrays and maps as the
protocol's ``fieldPath`` names them (``element``, ``key``, ``value``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from .models import Metadata
from .schema_types import ArrayType, DataType, DecimalType, MapType, PrimitiveType, StructField, StructType

ChangeClass = Literal["additive", "widening", "rename", "drop", "incompatible"]
#: the classes from the mildest to the hardest
CHANGE_CLASSES: tuple[ChangeClass, ...] = ("additive", "widening", "rename", "drop", "incompatible")
ColumnChangeKind = Literal[
    "add", "drop", "rename", "widen", "retype", "nullable", "notNull", "partitioning", "columnMapping"
]

_MAPPING_MODE = "delta.columnMapping.mode"
_MAPPING_ID = "delta.columnMapping.id"
#: integer widenings (each to every later one) and the decimal that holds each integer type
_INTEGERS = ("byte", "short", "integer", "long")
_INTEGER_DIGITS = {"byte": 3, "short": 5, "integer": 10, "long": 20}
_OTHER_WIDENINGS = {("float", "double"), ("date", "timestamp_ntz")}


@dataclass(frozen=True)
class ColumnChange:
    """One change: ``column`` is the path of the column (its new name; the old one for a drop),
    ``before``/``after`` what changed (a name, a type, a mode, partition columns) as text."""

    change: ColumnChangeKind
    change_class: ChangeClass
    column: tuple[str, ...] = ()
    before: str | None = None
    after: str | None = None


@dataclass(frozen=True)
class SchemaChange:
    """What a version changed in a table's schema, partition columns or column mapping."""

    changes: tuple[ColumnChange, ...]
    #: configuration keys whose value changed: key -> (before, after), None where absent
    properties: Mapping[str, tuple[str | None, str | None]] = field(default_factory=dict)

    @property
    def change_class(self) -> ChangeClass:
        return max((c.change_class for c in self.changes), key=CHANGE_CLASSES.index)


def schema_change(previous: Metadata, current: Metadata) -> SchemaChange | None:
    """The change from ``previous`` to ``current`` (None when the schema, the partition columns and
    the column mapping mode are the same: a property or the description changed, nothing else)."""
    changes: list[ColumnChange] = []
    before_mode = previous.configuration.get(_MAPPING_MODE, "none")
    after_mode = current.configuration.get(_MAPPING_MODE, "none")
    if before_mode != after_mode:
        mildest = before_mode == "none"  # turned on: the logical schema is the same
        changes.append(
            ColumnChange(
                "columnMapping", "additive" if mildest else "incompatible", (), before_mode, after_mode
            )
        )
    if list(previous.partition_columns) != list(current.partition_columns):
        changes.append(
            ColumnChange(
                "partitioning",
                "incompatible",
                (),
                ",".join(previous.partition_columns),
                ",".join(current.partition_columns),
            )
        )
    if previous.schema_string != current.schema_string:
        _compare_structs(previous.table_schema, current.table_schema, (), changes)
    if not changes:
        return None
    keys = sorted(set(previous.configuration) | set(current.configuration))
    properties = {
        k: (previous.configuration.get(k), current.configuration.get(k))
        for k in keys
        if previous.configuration.get(k) != current.configuration.get(k)
    }
    return SchemaChange(tuple(changes), properties)


def widens(before: DataType, after: DataType) -> bool:
    """True when the protocol's type widening allows ``before`` to become ``after``."""
    if isinstance(before, PrimitiveType) and isinstance(after, PrimitiveType):
        b, a = before.name, after.name
        if b in _INTEGERS and a in _INTEGERS:
            return _INTEGERS.index(b) < _INTEGERS.index(a)
        return (b, a) in _OTHER_WIDENINGS or (b in ("byte", "short", "integer") and a == "double")
    if isinstance(after, DecimalType):
        if isinstance(before, DecimalType):
            k1, k2 = after.precision - before.precision, after.scale - before.scale
            return k1 >= k2 >= 0 and (k1, k2) != (0, 0)
        if isinstance(before, PrimitiveType) and before.name in _INTEGER_DIGITS:
            return after.precision - after.scale >= _INTEGER_DIGITS[before.name]
    return False


def _key(f: StructField, by_id: bool) -> object:
    return f.metadata.get(_MAPPING_ID) if by_id else f.name


def _compare_structs(
    before: StructType, after: StructType, path: tuple[str, ...], out: list[ColumnChange]
) -> None:
    by_id = all(_MAPPING_ID in f.metadata for f in (*before.fields, *after.fields)) and bool(before.fields)
    old = {_key(f, by_id): f for f in before.fields}
    new = {_key(f, by_id): f for f in after.fields}
    for key, f in old.items():
        if key not in new:
            out.append(ColumnChange("drop", "drop", (*path, f.name)))
    for key, f in new.items():
        was = old.get(key)
        where = (*path, f.name)
        if was is None:
            out.append(
                ColumnChange("add", "additive" if f.nullable else "incompatible", where, None, _text(f.type))
            )
            continue
        if was.name != f.name:
            out.append(ColumnChange("rename", "rename", where, was.name, f.name))
        if was.nullable != f.nullable:
            kind: ColumnChangeKind = "nullable" if f.nullable else "notNull"
            out.append(ColumnChange(kind, "additive" if f.nullable else "incompatible", where))
        _compare_types(was.type, f.type, where, out)


def _compare_types(before: DataType, after: DataType, path: tuple[str, ...], out: list[ColumnChange]) -> None:
    if isinstance(before, StructType) and isinstance(after, StructType):
        _compare_structs(before, after, path, out)
    elif isinstance(before, ArrayType) and isinstance(after, ArrayType):
        _compare_types(before.element_type, after.element_type, (*path, "element"), out)
        if before.contains_null != after.contains_null:
            kind: ColumnChangeKind = "nullable" if after.contains_null else "notNull"
            out.append(
                ColumnChange(kind, "additive" if after.contains_null else "incompatible", (*path, "element"))
            )
    elif isinstance(before, MapType) and isinstance(after, MapType):
        _compare_types(before.key_type, after.key_type, (*path, "key"), out)
        _compare_types(before.value_type, after.value_type, (*path, "value"), out)
        if before.value_contains_null != after.value_contains_null:
            kind = "nullable" if after.value_contains_null else "notNull"
            out.append(
                ColumnChange(
                    kind, "additive" if after.value_contains_null else "incompatible", (*path, "value")
                )
            )
    elif _text(before) != _text(after):
        if widens(before, after):
            out.append(ColumnChange("widen", "widening", path, _text(before), _text(after)))
        else:
            out.append(ColumnChange("retype", "incompatible", path, _text(before), _text(after)))


def _text(t: DataType) -> str:
    """A type as the protocol spells it (a nested type as its JSON)."""
    value = t.to_json_value()
    if isinstance(value, str):
        return value
    import json

    return json.dumps(value, separators=(",", ":"), sort_keys=True)


__all__ = ["CHANGE_CLASSES", "ChangeClass", "ColumnChange", "SchemaChange", "schema_change", "widens"]
