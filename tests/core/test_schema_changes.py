"""What a version's metaData changed in a table's shape, classed: on real writers' logs (type
widening by delta-rs and delta-spark, a column added), and on each rule by a metaData changed by
hand from a real one."""

from __future__ import annotations

import json
from typing import Any

import pytest

from deltamirror.core.models import Metadata
from deltamirror.core.schema_changes import schema_change, widens
from deltamirror.core.schema_types import parse_schema
from support.tables import TABLES


def _metadatas(table_id: str) -> dict[int, Metadata]:
    out = {}
    for path in sorted((TABLES / table_id / "_delta_log").glob("*.json")):
        for line in path.read_text().splitlines():
            action = json.loads(line)
            if "metaData" in action:
                out[int(path.stem)] = Metadata.model_validate(action["metaData"])
    return out


def _said(
    previous: Metadata, current: Metadata
) -> tuple[str, list[tuple[str, str, str | None, str | None]]] | None:
    change = schema_change(previous, current)
    if change is None:
        return None
    return change.change_class, [(c.change, ".".join(c.column), c.before, c.after) for c in change.changes]


def test_type_widening_written_by_a_real_writer_is_widening_column_by_column() -> None:
    metas = _metadatas("krs__type-widening")
    assert _said(metas[0], metas[1]) is None  # a property set: no schema change
    change_class, changes = _said(metas[1], metas[2]) or ("", [])
    assert change_class == "widening"
    assert ("widen", "int_long", "integer", "long") in changes
    assert ("widen", "decimal_decimal_greater_scale", "decimal(10,2)", "decimal(20,5)") in changes
    assert ("widen", "date_timestamp_ntz", "date", "timestamp_ntz") in changes
    assert {c[0] for c in changes} == {"widen"} and len(changes) == 13


def test_widening_inside_structs_maps_and_arrays_names_the_protocols_field_paths() -> None:
    metas = _metadatas("golden__type-widening-nested")
    assert _said(metas[1], metas[2]) == (
        "widening",
        [
            ("widen", "struct.a", "integer", "long"),
            ("widen", "map.key", "integer", "long"),
            ("widen", "map.value", "integer", "long"),
            ("widen", "array.element", "integer", "long"),
        ],
    )


def test_a_column_added_by_a_real_writer_is_additive() -> None:
    metas = _metadatas("golden__time-travel-schema-changes-b")
    assert _said(metas[0], metas[1]) == ("additive", [("add", "part", None, "long")])


def _with(meta: Metadata, fields: list[dict[str, Any]] | None = None, **changes: Any) -> Metadata:
    data = meta.model_dump(by_alias=True, exclude_none=True)
    if fields is not None:
        data["schemaString"] = json.dumps({"type": "struct", "fields": fields})
    data.update(changes)
    return Metadata.model_validate(data)


def _field(name: str, type_: Any, *, nullable: bool = True, cid: int | None = None) -> dict[str, Any]:
    metadata = (
        {}
        if cid is None
        else {"delta.columnMapping.id": cid, "delta.columnMapping.physicalName": f"col-{cid}"}
    )
    return {"name": name, "type": type_, "nullable": nullable, "metadata": metadata}


BASE = _metadatas("krs__cdf-column-mapping-name-mode")[0]  # id, name, value under column mapping (name)
MAPPED = [_field("id", "long", cid=1), _field("name", "string", cid=2), _field("value", "double", cid=3)]
#: a nested type as a change says it: its JSON, keys sorted
_struct_text = json.dumps(
    {"fields": [_field("x", "integer", cid=5)], "type": "struct"}, separators=(",", ":"), sort_keys=True
)


@pytest.mark.parametrize(
    ("fields", "changes", "expected"),
    [
        (
            [_field("id", "long", cid=1), _field("label", "string", cid=2), _field("value", "double", cid=3)],
            {},
            ("rename", [("rename", "label", "name", "label")]),
        ),
        (
            [_field("id", "long", cid=1), _field("value", "double", cid=3)],
            {},
            ("drop", [("drop", "name", None, None)]),
        ),
        (
            [*MAPPED[:2], _field("value", "string", cid=3)],
            {},
            ("incompatible", [("retype", "value", "double", "string")]),
        ),
        (
            [_field("id", "long", cid=1, nullable=False), *MAPPED[1:]],
            {},
            ("incompatible", [("notNull", "id", None, None)]),
        ),
        (
            [*MAPPED, _field("extra", {"type": "struct", "fields": [_field("x", "integer", cid=5)]}, cid=4)],
            {},
            ("additive", [("add", "extra", None, _struct_text)]),
        ),
        (
            [
                *MAPPED[:2],
                _field("value", {"type": "struct", "fields": [_field("x", "integer", cid=5)]}, cid=3),
            ],
            {},
            ("incompatible", [("retype", "value", "double", _struct_text)]),
        ),
        (MAPPED, {"partitionColumns": ["name"]}, ("incompatible", [("partitioning", "", "", "name")])),
        (
            [
                _field("id", "long", cid=1),
                _field("name", "string", cid=2),
                _field("value", "decimal(10,2)", cid=3),
            ],
            {},
            ("incompatible", [("retype", "value", "double", "decimal(10,2)")]),
        ),
    ],
    ids=[
        "rename",
        "drop",
        "retype",
        "not-null",
        "nested-add",
        "to-struct",
        "partitioning",
        "double-to-decimal",
    ],
)
def test_each_rule_on_a_real_metadata_changed_by_hand(
    fields: list[dict[str, Any]], changes: dict[str, Any], expected: Any
) -> None:
    assert _said(BASE, _with(BASE, fields, **changes)) == expected


def test_without_column_mapping_a_rename_is_a_drop_and_an_add() -> None:
    plain = _metadatas("golden__time-travel-schema-changes-b")[1]
    renamed = _with(plain, [_field("id", "long"), _field("p", "long")])
    assert _said(plain, renamed) == ("drop", [("drop", "part", None, None), ("add", "p", None, "long")])


def test_column_mapping_turned_on_is_additive_and_the_properties_are_named() -> None:
    plain = _metadatas("golden__time-travel-schema-changes-b")[1]
    config = {"delta.columnMapping.mode": "name", "delta.columnMapping.maxColumnId": "2"}
    mapped = _with(plain, [_field("id", "long", cid=1), _field("part", "long", cid=2)], configuration=config)
    change = schema_change(plain, mapped)
    assert change is not None and change.change_class == "additive"
    assert [(c.change, c.before, c.after) for c in change.changes] == [("columnMapping", "none", "name")]
    assert change.properties == {
        "delta.columnMapping.maxColumnId": (None, "2"),
        "delta.columnMapping.mode": (None, "name"),
    }
    off = schema_change(mapped, plain)
    assert off is not None and off.change_class == "incompatible"


@pytest.mark.parametrize(
    ("before", "after", "wider"),
    [
        ("byte", "short", True),
        ("short", "long", True),
        ("long", "integer", False),
        ("float", "double", True),
        ("integer", "double", True),
        ("long", "double", False),
        ("date", "timestamp_ntz", True),
        ("date", "timestamp", False),
        ("decimal(10,2)", "decimal(12,4)", True),
        ("decimal(10,2)", "decimal(12,5)", False),
        ("decimal(10,2)", "decimal(10,2)", False),
        ("long", "decimal(20,0)", True),
        ("long", "decimal(20,1)", False),
        ("string", "binary", False),
    ],
)
def test_widens_follows_the_protocols_type_widening(before: str, after: str, wider: bool) -> None:
    def t(name: str) -> Any:
        return parse_schema(json.dumps({"type": "struct", "fields": [_field("c", name)]})).fields[0].type

    assert widens(t(before), t(after)) is wider
