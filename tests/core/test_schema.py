"""Delta schemas: exact JSON round trip, Arrow mapping, column mapping."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deltamirror.core.errors import SchemaError, UnsupportedFeatureError
from deltamirror.core.schema import (
    PARQUET_FIELD_ID,
    ArrayType,
    DecimalType,
    MapType,
    PrimitiveType,
    StructField,
    StructType,
    column_mapping_mode,
    data_schema,
    parse_schema,
    partition_schema,
    physical_name,
    to_arrow_schema,
    to_physical_arrow_schema,
)

TABLES = Path(__file__).resolve().parents[1] / "data" / "tables"

KNOWN = {
    "string",
    "long",
    "integer",
    "short",
    "byte",
    "float",
    "double",
    "boolean",
    "binary",
    "date",
    "timestamp",
    "timestamp_ntz",
    "variant",
    "void",
}


def _all_schema_strings() -> list[tuple[str, str]]:
    """Every distinct metaData.schemaString in every table's JSON commits, with where it was."""
    seen: dict[str, str] = {}
    for commit in sorted(TABLES.glob("*/_delta_log/*.json")):
        for line in commit.read_text(encoding="utf-8", errors="replace").splitlines():
            if not line.strip():
                continue
            try:
                action = json.loads(line)
            except ValueError:
                continue
            meta = action.get("metaData") if isinstance(action, dict) else None
            if isinstance(meta, dict) and isinstance(meta.get("schemaString"), str):
                seen.setdefault(meta["schemaString"], f"{commit.parent.parent.name}/{commit.name}")
    return [(where, s) for s, where in seen.items()]


ALL_SCHEMAS = _all_schema_strings()


def test_fixture_schemas_found() -> None:
    assert len(ALL_SCHEMAS) > 100


def _type_names(t: Any) -> set[str]:
    if isinstance(t, str):
        return {t.split("(")[0]}
    kind = t.get("type")
    if kind == "struct":
        return set().union(*(_type_names(f["type"]) for f in t["fields"])) if t["fields"] else set()
    if kind == "array":
        return _type_names(t["elementType"])
    if kind == "map":
        return _type_names(t["keyType"]) | _type_names(t["valueType"])
    return {kind}


@pytest.mark.parametrize(("where", "schema_string"), ALL_SCHEMAS, ids=[w for w, _ in ALL_SCHEMAS])
def test_every_fixture_schema_round_trips(where: str, schema_string: str) -> None:
    schema = parse_schema(schema_string)
    out = schema.to_json_string()
    assert json.loads(out) == json.loads(schema_string)
    assert parse_schema(out) == schema
    names = _type_names(json.loads(schema_string)) - {"decimal"}
    if names <= KNOWN:
        arrow = to_arrow_schema(schema)
        assert arrow.names == [f["name"] for f in json.loads(schema_string)["fields"]]
    else:
        with pytest.raises(SchemaError):
            to_arrow_schema(schema)


# the "JSON Encoded Table Schema" example of PROTOCOL.md, "Schema Serialization Format"
SPEC_EXAMPLE = """
{
  "type" : "struct",
  "fields" : [ {"name" : "a", "type" : "integer", "nullable" : false, "metadata" : { } },
   {"name" : "b", "type" : {"type" : "struct", "fields" : [ {
        "name" : "d", "type" : "integer", "nullable" : false, "metadata" : { } } ] },
    "nullable" : true, "metadata" : { } },
   {"name" : "c", "type" : {"type" : "array", "elementType" : "integer", "containsNull" : false },
    "nullable" : true, "metadata" : { } },
   {"name" : "e", "type" : {"type" : "array", "elementType" : {"type" : "struct", "fields" : [ {
          "name" : "d", "type" : "integer", "nullable" : false, "metadata" : { } } ] },
      "containsNull" : true }, "nullable" : true, "metadata" : { } },
   {"name" : "f", "type" : {"type" : "map", "keyType" : "string", "valueType" : "string",
      "valueContainsNull" : true }, "nullable" : true, "metadata" : { } } ]
}
"""


def test_spec_example_types() -> None:
    schema = parse_schema(SPEC_EXAMPLE)
    a, b, c, e, f = schema.fields
    assert a == StructField(name="a", type=PrimitiveType(name="integer"), nullable=False)
    assert isinstance(b.type, StructType) and b.type.fields[0].name == "d"
    assert c.type == ArrayType(element_type=PrimitiveType(name="integer"), contains_null=False)
    assert isinstance(e.type, ArrayType) and isinstance(e.type.element_type, StructType)
    assert f.type == MapType(
        key_type=PrimitiveType(name="string"),
        value_type=PrimitiveType(name="string"),
        value_contains_null=True,
    )
    arrow = to_arrow_schema(schema)
    assert arrow.field("a").type == pa.int32() and not arrow.field("a").nullable
    assert arrow.field("b").type == pa.struct([pa.field("d", pa.int32(), nullable=False)])
    c_type = arrow.field("c").type
    assert pa.types.is_list(c_type) and c_type.value_type == pa.int32() and not c_type.value_field.nullable
    e_type = arrow.field("e").type
    assert e_type.value_type == pa.struct([pa.field("d", pa.int32(), nullable=False)])
    f_type = arrow.field("f").type
    assert pa.types.is_map(f_type) and f_type.key_type == pa.string() and f_type.item_type == pa.string()


@pytest.mark.parametrize(
    ("delta", "arrow"),
    [
        ("long", pa.int64()),
        ("integer", pa.int32()),
        ("short", pa.int16()),
        ("byte", pa.int8()),
        ("float", pa.float32()),
        ("double", pa.float64()),
        ("boolean", pa.bool_()),
        ("string", pa.string()),
        ("binary", pa.binary()),
        ("date", pa.date32()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("timestamp_ntz", pa.timestamp("us")),
        ("decimal(38,18)", pa.decimal128(38, 18)),
        ("decimal(1,0)", pa.decimal128(1, 0)),
        ("variant", pa.struct([pa.field("value", pa.binary()), pa.field("metadata", pa.binary())])),
    ],
)
def test_arrow_types(delta: str, arrow: pa.DataType) -> None:
    schema = parse_schema(json.dumps({"type": "struct", "fields": [_field("x", delta)]}))
    got = to_arrow_schema(schema).field("x").type
    if pa.types.is_struct(arrow):  # variant: compare names and types, not child nullability
        assert [(f.name, f.type) for f in got] == [(f.name, f.type) for f in arrow]
    else:
        assert got == arrow


def _field(
    name: str, type_: Any, nullable: bool = True, metadata: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {"name": name, "type": type_, "nullable": nullable, "metadata": metadata or {}}


def test_decimal_and_unknown_primitives() -> None:
    schema = parse_schema(
        json.dumps(
            {
                "type": "struct",
                "fields": [_field("d", "decimal(12, 3)"), _field("g", "geometry(OGC:CRS84)")],
            }
        )
    )
    d, g = schema.fields
    assert d.type == DecimalType(precision=12, scale=3)
    assert g.type == PrimitiveType(name="geometry(OGC:CRS84)")
    assert json.loads(schema.to_json_string())["fields"][0]["type"] == "decimal(12, 3)"
    with pytest.raises(SchemaError):
        to_arrow_schema(schema)


def test_spelling_kept_exactly() -> None:
    """Object-form variant, keys left out and unknown keys all survive the round trip."""
    original = {
        "type": "struct",
        "fields": [
            {"name": "v", "type": {"type": "array", "elementType": {"type": "variant"}}},
            {"name": "m", "type": "long", "nullable": False, "metadata": {"k": [1, {"x": None}]}, "new": 7},
        ],
        "futureKey": {"a": 1},
    }
    schema = parse_schema(json.dumps(original))
    assert json.loads(schema.to_json_string()) == original
    # semantically the same as the fully spelled schema
    assert schema.fields[0].type == ArrayType(element_type=PrimitiveType(name="variant"))


def test_built_in_code_serialises_every_key() -> None:
    schema = StructType(fields=(StructField(name="x", type=PrimitiveType(name="long")),))
    assert json.loads(schema.to_json_string()) == {
        "type": "struct",
        "fields": [{"name": "x", "type": "long", "nullable": True, "metadata": {}}],
    }


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "{",
        "[]",
        '{"type": "array", "elementType": "long"}',
        '{"type": "struct"}',
        '{"type": "struct", "fields": [{"name": 1, "type": "long"}]}',
        '{"type": "struct", "fields": [{"name": "a"}]}',
        '{"type": "struct", "fields": [{"name": "a", "type": 3}]}',
        '{"type": "struct", "fields": [{"name": "a", "type": {"type": "array"}}]}',
        '{"type": "struct", "fields": [{"name": "a", "type": {"type": "map", "keyType": "long"}}]}',
        '{"type": "struct", "fields": [{"name": "a", "type": "long", "metadata": []}]}',
    ],
)
def test_bad_schemas(bad: str) -> None:
    with pytest.raises(SchemaError):
        parse_schema(bad)


def test_column_mapping_mode() -> None:
    assert column_mapping_mode({}) == "none"
    assert column_mapping_mode({"delta.columnMapping.mode": "none"}) == "none"
    assert column_mapping_mode({"delta.columnMapping.mode": "name"}) == "name"
    assert column_mapping_mode({"delta.columnMapping.mode": "ID"}) == "id"
    with pytest.raises(UnsupportedFeatureError):
        column_mapping_mode({"delta.columnMapping.mode": "position"})


def test_physical_name() -> None:
    mapped = StructField(
        name="logical",
        type=PrimitiveType(name="long"),
        metadata={"delta.columnMapping.id": 3, "delta.columnMapping.physicalName": "col-x"},
    )
    plain = StructField(name="plain", type=PrimitiveType(name="long"))
    assert physical_name(mapped, "none") == "logical"
    assert physical_name(mapped, "name") == "col-x"
    assert physical_name(mapped, "id") == "col-x"
    assert physical_name(plain, "name") == "plain"


def test_partition_and_data_schema() -> None:
    schema = parse_schema(SPEC_EXAMPLE)
    assert partition_schema(schema, ["c", "a"]).names == ["c", "a"]
    assert data_schema(schema, ["c", "a"]).names == ["b", "e", "f"]
    with pytest.raises(SchemaError):
        partition_schema(schema, ["nope"])


def _names_and_ids(t: pa.DataType) -> Any:
    """Names and field ids at every level, ignoring leaf types (files use int96, ns, ...)."""
    if pa.types.is_struct(t):
        return [(f.name, (f.metadata or {}).get(PARQUET_FIELD_ID), _names_and_ids(f.type)) for f in t]
    if pa.types.is_map(t):
        return ("map", _names_and_ids(t.key_type), _names_and_ids(t.item_type))
    if pa.types.is_list(t):
        return ("list", _names_and_ids(t.value_type))
    return None


@pytest.mark.parametrize("mode", ["id", "name"])
def test_physical_schema_matches_the_files_spark_wrote(mode: str) -> None:
    table = TABLES / f"golden__table-with-columnmapping-mode-{mode}"
    commit = (table / "_delta_log" / "00000000000000000000.json").read_text(encoding="utf-8")
    actions = [json.loads(line) for line in commit.splitlines() if line.strip()]
    meta = next(a["metaData"] for a in actions if "metaData" in a)
    path = next(a["add"]["path"] for a in actions if "add" in a)
    schema = parse_schema(meta["schemaString"])
    physical = to_physical_arrow_schema(schema, column_mapping_mode(meta["configuration"]))
    in_file = pq.read_schema(table / path)
    ours = _names_and_ids(pa.struct(list(physical)))
    theirs = _names_and_ids(pa.struct(list(in_file)))
    if mode == "name":  # field ids are only ours to set in id mode
        ours, theirs = _strip_ids(ours), _strip_ids(theirs)
    assert ours == theirs


def _strip_ids(x: Any) -> Any:
    if isinstance(x, list):
        return [(n, None, _strip_ids(c)) for n, _, c in x]
    if isinstance(x, tuple):
        return tuple(_strip_ids(c) for c in x)
    return x


def test_physical_schema_nested_ids() -> None:
    schema = parse_schema(
        json.dumps(
            {
                "type": "struct",
                "fields": [
                    _field(
                        "col1",
                        {"type": "array", "elementType": "integer", "containsNull": True},
                        metadata={
                            "delta.columnMapping.id": 1,
                            "delta.columnMapping.physicalName": "col-aaa",
                            "delta.columnMapping.nested.ids": {"col-aaa.element": 100},
                        },
                    )
                ],
            }
        )
    )
    field = to_physical_arrow_schema(schema, "id").field("col-aaa")
    assert field.metadata == {PARQUET_FIELD_ID: b"1"}
    assert field.type.value_field.metadata == {PARQUET_FIELD_ID: b"100"}
    assert to_arrow_schema(schema).names == ["col1"]


# --- property tests ---------------------------------------------------------------------------

_names = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=8)
_json_scalars = st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.text(max_size=6)
_json_values = st.recursive(
    _json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)
_primitive_json = st.sampled_from(sorted(KNOWN)) | st.builds(
    lambda p, s: f"decimal({p},{min(s, p)})", st.integers(1, 38), st.integers(0, 38)
)
# keys a future writer might add; never one of the keys the node already uses
_extras = st.dictionaries(st.sampled_from(["x-future", "comment", "zz"]), _json_values, max_size=2)


def _maybe_drop(d: dict[str, Any], optional: list[str], drop: list[bool]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if not (k in optional and drop[optional.index(k)])}


def _type_json(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    flags = st.lists(st.booleans(), min_size=2, max_size=2)
    array = st.builds(
        lambda e, n, x, drop: _maybe_drop(
            {"type": "array", "elementType": e, "containsNull": n, **x}, ["containsNull"], drop
        ),
        children,
        st.booleans(),
        _extras,
        flags,
    )
    map_ = st.builds(
        lambda k, v, n, x, drop: _maybe_drop(
            {"type": "map", "keyType": k, "valueType": v, "valueContainsNull": n, **x},
            ["valueContainsNull"],
            drop,
        ),
        children.filter(lambda t: t != "void"),  # Arrow map keys cannot be of the null type
        children,
        st.booleans(),
        _extras,
        flags,
    )
    return array | map_ | _struct_json(children)


def _struct_json(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    field = st.builds(
        lambda name, t, n, meta, x, drop: _maybe_drop(
            {"name": name, "type": t, "nullable": n, "metadata": meta, **x}, ["nullable", "metadata"], drop
        ),
        _names,
        children,
        st.booleans(),
        st.dictionaries(st.text(max_size=10), _json_values, max_size=3),
        _extras,
        st.lists(st.booleans(), min_size=2, max_size=2),
    )
    return st.builds(
        lambda fields, x: {"type": "struct", "fields": fields, **x},
        # a struct's names are distinct case-insensitively (a clash is refused: test below)
        st.lists(field, max_size=4, unique_by=lambda f: f["name"].lower()),
        _extras,
    )


_any_type_json = st.recursive(_primitive_json | st.just({"type": "variant"}), _type_json, max_leaves=8)
_schema_json = _struct_json(_any_type_json)


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(_schema_json)
def test_round_trip_property(original: dict[str, Any]) -> None:
    text = json.dumps(original)
    schema = parse_schema(text)
    assert json.loads(schema.to_json_string()) == original
    again = parse_schema(schema.to_json_string())
    assert again == schema
    assert hash(again) == hash(schema)


@settings(max_examples=100, suppress_health_check=[HealthCheck.too_slow])
@given(_schema_json)
def test_arrow_schema_property(original: dict[str, Any]) -> None:
    """Every schema of known types maps to Arrow with the same names and nullability."""
    schema = parse_schema(json.dumps(original))
    arrow = to_arrow_schema(schema)
    assert arrow.names == [f["name"] for f in original["fields"]]
    # Arrow's null type (Delta's void) is always nullable
    expected = [f.get("nullable", True) or f["type"] == "void" for f in original["fields"]]
    assert [f.nullable for f in arrow] == expected


@pytest.mark.parametrize(
    ("fields", "clash"),
    [
        ([("a", "long"), ("a", "string")], ('"a"', '"a"')),
        ([("Id", "long"), ("x", "long"), ("iD", "string")], ('"Id"', '"iD"')),
    ],
)
def test_field_names_that_clash_are_refused(fields: list[tuple[str, str]], clash: tuple[str, str]) -> None:
    """delta-spark refuses a schema naming one column twice (case-insensitively); a reader that
    took it would keep one column's values and drop the other's."""
    text = json.dumps(
        {
            "type": "struct",
            "fields": [{"name": n, "type": t, "nullable": True, "metadata": {}} for n, t in fields],
        }
    )
    with pytest.raises(SchemaError, match=f"column names {clash[0]} and {clash[1]} name one column"):
        parse_schema(text)


def test_nested_field_names_that_clash_are_refused() -> None:
    inner = {
        "type": "struct",
        "fields": [{"name": n, "type": "long", "nullable": True, "metadata": {}} for n in "bB"],
    }
    text = json.dumps(
        {
            "type": "struct",
            "fields": [
                {
                    "name": "s",
                    "type": {"type": "array", "elementType": inner, "containsNull": True},
                    "nullable": True,
                    "metadata": {},
                }
            ],
        }
    )
    with pytest.raises(SchemaError, match='column names "b" and "B" name one column'):
        parse_schema(text)
