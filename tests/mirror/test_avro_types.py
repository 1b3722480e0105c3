"""The Avro mapping of every Delta type, checked with a real Avro library (fastavro), no registry.

Each generated schema is parsed by ``fastavro.parse_schema``; each row image the ``avro`` format
makes is read back by fastavro's schemaless reader and compared with the row as Arrow reads it,
first on a table holding every Delta type, then on every readable table of tests/data. The
records' registry side (the Confluent wire format, subjects) is tests/mirror/test_avro_registry.py.
"""

from __future__ import annotations

import io
import json
import math
from typing import Any

import fastavro
import pyarrow as pa
import pytest

from deltamirror.core.errors import DeltaMirrorError
from deltamirror.core.schema import VARIANT_ARROW, parse_schema
from deltamirror.core.table import open_table
from deltamirror.mirror.records.avro_format import AvroRowChanges
from deltamirror.mirror.records.avro_types import (
    MAP_ENTRIES,
    ORIGINAL_NAME,
    avro_name,
    envelope_schema,
    field_names,
)
from deltamirror.mirror.records.row_changes import CDF_COLUMNS, VersionRows
from deltamirror.mirror.records.row_formats import RegistrySettings
from deltamirror.mirror.records.row_records import RowChangesOptions
from support.avro_rows import EVERY_TYPE, NULLS, ROW
from support.avro_rows import every_type_batch as _batch
from support.tables import table_cases

#: a registry is named, never reached: images and schemas need none (the format asks it at the first record)
NO_REGISTRY = RegistrySettings(url="http://registry.invalid:8081")


def _serializer(batch: pa.RecordBatch, key_columns: tuple[str, ...] = ("id",)) -> AvroRowChanges:
    options = _options(key_columns)
    fields = {f.name: f for f in batch.schema}
    columns = [f.name for f in batch.schema if f.name not in CDF_COLUMNS]
    return AvroRowChanges(
        options.changes_topic,
        fields,
        columns,
        list(key_columns) or columns,
        table_schema=parse_schema(json.dumps(EVERY_TYPE)),
        registry=NO_REGISTRY,
    )


def _options(key_columns: tuple[str, ...] = ("id",)) -> RowChangesOptions:
    return RowChangesOptions(
        "deltamirror.every-type.changes",
        "deltamirror.every-type.transaction",
        "every-type",
        "tid",
        key_columns=key_columns,
        format="avro",
        table_schema=parse_schema(json.dumps(EVERY_TYPE)),
        registry=NO_REGISTRY,
    )


def _read(image: bytes, schema: dict[str, Any]) -> Any:
    parsed = fastavro.parse_schema(schema)
    return fastavro.schemaless_reader(io.BytesIO(image), parsed, parsed)


def _field(schema: dict[str, Any], name: str) -> dict[str, Any]:
    return next(f for f in schema["fields"] if f.get(ORIGINAL_NAME, f["name"]) == name)


def test_every_schema_parses_and_says_each_delta_type_as_the_docs_table() -> None:
    s = _serializer(_batch())
    for schema in (s.value_schema, s.row_schema, s.key_schema):
        fastavro.parse_schema(schema)  # raises on any invalid name, type or default
    row = s.row_schema

    def t(name: str) -> Any:
        avro = _field(row, name)["type"]
        return avro[1] if isinstance(avro, list) else avro

    assert t("id") == "long" and _field(row, "id")["type"] == "long"  # not nullable: no union
    assert _field(row, "b")["type"] == ["null", "boolean"] and _field(row, "b")["default"] is None
    assert t("i8") == {"type": "int", "connect.type": "int8"}
    assert t("i16") == {"type": "int", "connect.type": "int16"}
    assert (t("i32"), t("f32"), t("f64"), t("s"), t("bin")) == ("int", "float", "double", "string", "bytes")
    assert t("dec") == {"type": "bytes", "logicalType": "decimal", "precision": 38, "scale": 10}
    assert t("d") == {"type": "int", "logicalType": "date"}
    assert t("ts") == {"type": "long", "logicalType": "timestamp-micros"}
    assert t("ntz") == {"type": "long", "logicalType": "local-timestamp-micros"}
    assert t("st")["type"] == "record" and [f["name"] for f in t("st")["fields"]] == ["a_b", "when", "inner"]
    assert t("arr") == {
        "type": "array",
        "items": ["null", {"type": "long", "logicalType": "local-timestamp-micros"}],
    }
    assert t("smap")["type"] == "map"
    imap = t("imap")
    assert imap["type"] == "array" and imap[MAP_ENTRIES] is True
    assert [f["name"] for f in imap["items"]["fields"]] == ["key", "value"]
    assert t("v")["type"] == "record" and t("v")["deltamirror.type"] == "variant"
    envelope = s.value_schema
    assert envelope["name"] == "Envelope" and envelope["namespace"] == "deltamirror.every_type.changes"
    assert [f["name"] for f in envelope["fields"]] == [
        "before",
        "after",
        "source",
        "op",
        "ts_ms",
        "transaction",
    ]
    assert s.key_schema["name"] == "Key" and [f["name"] for f in s.key_schema["fields"]] == ["id"]


def test_names_avro_cannot_take_are_sanitized_unique_and_keep_the_delta_name() -> None:
    assert avro_name("a.b c-d") == "a_b_c_d" and avro_name("1st") == "_1st" and avro_name("ok_1") == "ok_1"
    assert field_names(["1st col", "_1st_col", "x"]) == ["_1st_col", "_1st_col_2", "x"]
    row = _serializer(_batch()).row_schema
    first, second = _field(row, "1st col"), _field(row, "1st_col")
    assert (first["name"], first[ORIGINAL_NAME]) == ("_1st_col", "1st col")
    assert (second["name"], second[ORIGINAL_NAME]) == ("_1st_col_2", "1st_col")
    assert ORIGINAL_NAME not in _field(row, "id")  # a valid name is left as it is, without the property
    record_names: list[str] = []

    def names(t: Any) -> None:
        if isinstance(t, list):
            for x in t:
                names(x)
        elif isinstance(t, dict):
            if t.get("type") == "record":
                record_names.append(t["name"])
                for f in t["fields"]:
                    names(f["type"])
            names(t.get("items"))
            names(t.get("values"))

    names(row)
    assert len(record_names) == len(set(record_names))  # Avro resolves a record name once per schema


def _expected(value: Any, name: str) -> Any:
    """A row's value as fastavro reads it back (logical types as Python values, maps as they are carried)."""
    if name in ("smap",) and value is not None:
        return dict(value)
    if name == "imap" and value is not None:
        return [{"key": k, "value": v} for k, v in value]
    if name == "st" and value is not None:
        return {"a_b": value["a.b"], "when": value["when"], "inner": value["inner"]}
    return value


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return bool(a == b)


def test_every_delta_type_round_trips_through_fastavro_row_and_key() -> None:
    batch = _batch()
    s = _serializer(batch)
    values = {n: s.column_values(batch.column(n)) for n in s.columns}
    images = s.images(values, batch.num_rows)
    for image, source in zip(images, (ROW, NULLS), strict=True):
        back = _read(image, s.row_schema)
        for name, value in source.items():
            avro = _field(s.row_schema, name)["name"]
            assert _same(back[avro], _expected(value, name)), (name, back[avro], value)
        assert repr(s.row(image)) == repr(back)  # the format's own reader agrees (repr: NaN)
    keys = s.key_images(values, batch.num_rows)
    assert [_read(k, s.key_schema) for k in keys] == [{"id": 1}, {"id": 2}]
    whole = _serializer(batch, key_columns=())  # no key columns: the whole row is the key
    assert [f["name"] for f in whole.key_schema["fields"]] == [f["name"] for f in whole.row_schema["fields"]]
    whole_values = {n: whole.column_values(batch.column(n)) for n in whole.columns}
    assert whole.key_images(whole_values, batch.num_rows) == images  # the same bytes: the row's


def test_the_envelope_of_an_update_round_trips_through_fastavro() -> None:
    batch = _batch()
    s = _serializer(batch)
    values = {n: s.column_values(batch.column(n)) for n in s.columns}
    before, after = s.images(values, batch.num_rows)
    envelope = {
        "before": s.row(before),
        "after": s.row(after),
        "source": {
            "version": "1",
            "connector": "deltamirror",
            "name": "every-type",
            "ts_ms": 5,
            "snapshot": "false",
            "db": "delta",
            "table": "every-type",
            "table_id": "tid",
            "delta_version": 3,
            "index": 0,
        },
        "op": "u",
        "ts_ms": 5,
        "transaction": {"id": "tid:3", "total_order": 1, "data_collection_order": 1},
    }
    parsed = fastavro.parse_schema(s.value_schema)
    out = io.BytesIO()
    fastavro.schemaless_writer(out, parsed, envelope)
    back = fastavro.schemaless_reader(io.BytesIO(out.getvalue()), parsed, parsed)
    assert back["op"] == "u" and back["source"] == envelope["source"]
    assert back["after"]["id"] == 2 and back["before"]["id"] == 1 and math.isnan(back["before"]["f64"])


def test_a_keyed_update_pairs_on_avro_images_through_spill_files(tmp_path: Any) -> None:
    """The pairing pass holds binary images (large_binary) and spills them as it spills JSON text."""
    base = _batch()
    n = 300
    ids = list(range(n))
    pre = base.slice(0, 1).to_pylist()[0]
    rows = [{**pre, "id": i} for i in ids] + [{**pre, "id": i, "s": f"after {i}"} for i in ids]
    schema = base.schema
    batch = pa.RecordBatch.from_pylist(
        [
            {**r, "_change_type": t}
            for r, t in zip(rows, ["update_preimage"] * n + ["update_postimage"] * n, strict=True)
        ],
        schema=schema,
    )
    vr = VersionRows(
        _options(), lambda: [batch], version=3, ts_ms=5, pairing_memory_bytes=1, spill_dir=str(tmp_path)
    )
    pairs = vr._pairs()
    assert pairs is not None
    try:
        assert vr.buckets > 1  # spilled
        found = pairs.take(0, 2 * n)
        paired = [
            (k, b, a)
            for k, b, a in zip(
                *(found.column(c).to_pylist() for c in ("key", "before", "after")), strict=True
            )
            if k
        ]
        assert len(paired) == n
        s = vr.encoder(batch.schema).serializer
        assert isinstance(s, AvroRowChanges)
        for key, before, after in paired:
            k = _read(key, s.key_schema)["id"]
            assert s.row(before)["s"] == pre["s"] and s.row(after)["s"] == f"after {k}"
    finally:
        pairs.close()


def _readable_tables() -> list[str]:
    return [c.id for c in table_cases() if c.has_data and not c.must_fail]


@pytest.mark.parametrize("table_id", _readable_tables())
def test_every_readable_table_of_tests_data_round_trips_through_fastavro(table_id: str) -> None:
    """Every table's snapshot (first 200 rows of each file) as Avro images, read back equal to Arrow's rows."""
    case = next(c for c in table_cases() if c.id == table_id)
    try:
        snap = open_table(str(case.path)).snapshot()
        batches = [b.slice(0, 200) for b in snap.iter_batches()]
    except DeltaMirrorError as exc:
        pytest.skip(f"core refuses the table: {exc.message}")
    if not batches or not batches[0].num_columns:
        pytest.skip("no rows")
    schema = snap.metadata.table_schema
    for batch in batches:
        fields = {f.name: f for f in batch.schema}
        columns = list(batch.schema.names)
        s = AvroRowChanges(
            "deltamirror.t.changes", fields, columns, columns, table_schema=schema, registry=NO_REGISTRY
        )
        for avro_schema in (s.value_schema, s.row_schema, s.key_schema):
            fastavro.parse_schema(avro_schema)
        values = {n: s.column_values(batch.column(n)) for n in columns}
        images = s.images(values, batch.num_rows)
        arrow_rows = batch.to_pylist()
        for image, arrow_row in zip(images, arrow_rows, strict=True):
            back = s.row(image)
            assert _norm(back, s.row_schema) == _norm_arrow(arrow_row, batch.schema), table_id


def _norm(record: Any, schema: Any) -> Any:
    """An Avro record read back, keyed by the Delta names, maps as pairs: comparable with Arrow's row."""
    if isinstance(schema, list):
        if record is None:
            return None
        schema = next(t for t in schema if t != "null")
    if record is None:
        return None
    if isinstance(schema, dict):
        kind = schema["type"]
        if kind == "record":
            return {
                f.get(ORIGINAL_NAME, f["name"]): _norm(record[f["name"]], f["type"]) for f in schema["fields"]
            }
        if kind == "array" and schema.get(MAP_ENTRIES):
            value_type = schema["items"]["fields"][1]["type"]
            key_type = schema["items"]["fields"][0]["type"]
            return [(_norm(e["key"], key_type), _norm(e["value"], value_type)) for e in record]
        if kind == "array":
            return [_norm(x, schema["items"]) for x in record]
        if kind == "map":
            return [(k, _norm(v, schema["values"])) for k, v in record.items()]
    return _nan(record)


def _norm_arrow(value: Any, schema: Any = None) -> Any:
    if isinstance(value, dict):
        return {k: _norm_arrow(v) for k, v in value.items()}
    if isinstance(value, list):
        return [
            (_norm_arrow(x[0]), _norm_arrow(x[1])) if isinstance(x, tuple) else _norm_arrow(x) for x in value
        ]
    return _nan(value)


def _nan(value: Any) -> Any:
    return "NaN" if isinstance(value, float) and math.isnan(value) else value


def test_core_s_variant_arrow_is_the_avro_variant_record() -> None:
    """The one Delta type Arrow does not tell apart: the Delta schema names it, its values are the same."""
    assert (
        VARIANT_ARROW.field("value").type == pa.binary()
        and VARIANT_ARROW.field("metadata").type == pa.binary()
    )
    from deltamirror.core.schema import PrimitiveType, StructField

    fields = [StructField(name="v", type=PrimitiveType(name="variant"), nullable=True)]
    t = envelope_schema("x", fields)["fields"][0]["type"][1]["fields"][0]["type"][1]
    assert t["deltamirror.type"] == "variant"


def test_an_unreachable_registry_stops_the_version_before_any_record_naming_table_version_and_subject() -> (
    None
):
    """No registry listens on port 9 of this host (a refused connection, no stand-in): the version's
    first record needs its schema id, so nothing of the version (not even BEGIN) comes out."""
    from deltamirror.mirror.errors import SchemaRegistryUnavailableError

    settings = RegistrySettings(url="http://127.0.0.1:9", subject_name_strategy="topic-record")
    options = RowChangesOptions(
        "deltamirror.every-type.changes",
        "deltamirror.every-type.transaction",
        "every-type",
        "tid",
        key_columns=("id",),
        format="avro",
        table_schema=parse_schema(json.dumps(EVERY_TYPE)),
        registry=settings,
    )
    batch = _batch()
    chunks = VersionRows(options, lambda: [batch], version=7, ts_ms=5).records()
    with pytest.raises(SchemaRegistryUnavailableError) as caught:
        next(chunks)
    err = caught.value
    assert (err.table, err.version, err.exit_code) == ("every-type", 7, 1)
    subject = err.context["subject"]
    assert subject in (
        "deltamirror.every-type.changes-deltamirror.every_type.changes.Key",
        "deltamirror.every-type.changes-deltamirror.every_type.changes.Envelope",
    )
    assert len(str(err).splitlines()) == 1 and subject in str(err)
