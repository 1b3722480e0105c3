"""The Protobuf mapping of every Delta type, checked with the real protobuf runtime and
confluent-kafka's own ``ProtobufDeserializer`` (no registry: it parses a framed record as the
message class it is given), first on a table holding every Delta type, then on every readable
table of tests/data. The registry side (subjects, versions, refusals) is
tests/mirror/test_protobuf_registry.py.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pyarrow as pa
import pytest

from deltamirror.core.errors import DeltaMirrorError
from deltamirror.core.schema import StructType, parse_schema
from deltamirror.core.table import open_table
from deltamirror.mirror.records.protobuf_format import ProtobufRowChanges
from deltamirror.mirror.records.row_changes import CDF_COLUMNS
from deltamirror.mirror.records.row_formats import RegistrySettings
from deltamirror.mirror.records.row_records import RowChangesOptions
from support.avro_rows import EVERY_TYPE, NULLS, ROW, every_type_batch
from support.protobuf_rows import arrow_row, row
from support.tables import table_cases

#: a registry is named, never reached: images and schemas need none (the format asks it at the first record)
NO_REGISTRY = RegistrySettings(url="http://registry.invalid:8081")
SCHEMA = parse_schema(json.dumps(EVERY_TYPE))


def _serializer(
    batch: pa.RecordBatch, key_columns: tuple[str, ...] = ("id",), schema: StructType = SCHEMA
) -> ProtobufRowChanges:
    fields = {f.name: f for f in batch.schema}
    columns = [f.name for f in batch.schema if f.name not in CDF_COLUMNS]
    return ProtobufRowChanges(
        "deltamirror.every-type.changes",
        fields,
        columns,
        list(key_columns) or columns,
        table_schema=schema,
        registry=NO_REGISTRY,
    )


def _framed(image: bytes, index: bytes) -> bytes:
    """The Confluent framing ProtobufSerializer writes: magic 0, a 4-byte schema id, the message
    indexes (zig-zag varints: ``\\x00`` for the file's first message, ``\\x02\\x02`` for its second)."""
    return b"\x00\x00\x00\x00\x07" + index + image


def _deserialize(cls: Any, record: bytes) -> Any:
    from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer

    return ProtobufDeserializer(cls, {})(record, None)


def _nan(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    if isinstance(value, dict):
        return {k: _nan(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_nan(v) for v in value)
    return value


def test_the_messages_say_each_delta_type_as_the_docs_table() -> None:
    from google.protobuf.descriptor import FieldDescriptor as F

    s = _serializer(every_type_batch())
    value = s.value_class.DESCRIPTOR
    by_json = {f.json_name: f for f in value.fields}
    assert [f.name for f in s.envelope_class.DESCRIPTOR.fields] == [
        "before",
        "after",
        "source",
        "op",
        "ts_ms",
        "transaction",
    ]
    assert s.envelope_class.DESCRIPTOR.full_name == "deltamirror.every_type.changes.Envelope"
    assert s.value_file.message_type[0].name == "Envelope"  # message index 0: the serializer's one-byte form
    assert by_json["id"].type == F.TYPE_INT64 and not by_json["id"].has_presence  # not nullable
    assert by_json["b"].type == F.TYPE_BOOL and by_json["b"].has_presence  # proto3 optional
    assert {by_json[c].type for c in ("i8", "i16", "i32")} == {F.TYPE_INT32}
    assert (by_json["f32"].type, by_json["f64"].type) == (F.TYPE_FLOAT, F.TYPE_DOUBLE)
    messages = {
        "dec": "confluent.type.Decimal",
        "d": "google.type.Date",
        "ts": "google.protobuf.Timestamp",
        "ntz": "google.type.DateTime",
        "v": "confluent.type.Variant",
        "st": "deltamirror.every_type.changes.Value_st",
        "arr": "deltamirror.every_type.changes.Value_arr_array",  # nullable: wrapped
        "smap": "deltamirror.every_type.changes.Value_smap_map",
    }
    assert {c: by_json[c].message_type.full_name for c in messages} == messages
    arr = by_json["arr"].message_type.fields_by_name["values"]
    assert arr.is_repeated and arr.message_type.name == "Value_arr_element"  # containsNull
    imap = by_json["imap"].message_type.fields_by_name["entries"]
    assert imap.message_type.GetOptions().map_entry  # integer keys: a native map
    names = {f.json_name: f.name for f in value.fields}
    assert (names["1st col"], names["1st_col"], names["small dec"]) == ("_1st_col", "_1st_col_2", "small_dec")
    assert [f.name for f in s.key_class.DESCRIPTOR.fields] == ["id"]


def test_every_delta_type_round_trips_through_the_protobuf_deserializer_row_and_key() -> None:
    batch = every_type_batch()
    s = _serializer(batch)
    values = {n: s.column_values(batch.column(n)) for n in s.columns}
    images = s.images(values, batch.num_rows)
    for image, source in zip(images, (ROW, NULLS), strict=True):
        back = row(_deserialize(s.value_class, _framed(image, b"\x02\x02")), SCHEMA)
        expected = {f.name: arrow_row(source[f.name], f.type) for f in SCHEMA.fields}
        assert _nan(back) == _nan(expected)
    assert images == s.images(values, batch.num_rows)  # the same bytes on every read
    keys = s.key_images(values, batch.num_rows)
    assert [_deserialize(s.key_class, _framed(k, b"\x00")).id for k in keys] == [1, 2]
    whole = _serializer(batch, key_columns=())  # no key columns: the whole row is the key, its bytes
    whole_values = {n: whole.column_values(batch.column(n)) for n in whole.columns}
    assert whole.key_images(whole_values, batch.num_rows) == images
    # in a key, a map is its entries sorted by key, not a map: a record's bytes (Protobuf writes a
    # map's entries in no fixed order from one process to the next) decide its partition
    imap = whole.key_class.DESCRIPTOR.fields_by_name["imap"].message_type.fields_by_name["entries"]
    assert imap.is_repeated and not imap.message_type.GetOptions().map_entry
    key = whole.key_class.FromString(whole.key_images(whole_values, 1)[0])
    assert [(e.key, e.value) for e in key.imap.entries] == [(-1, "minus one"), (3, "three")]


def test_a_map_with_keys_protobuf_maps_cannot_take_is_repeated_entries_in_order() -> None:
    schema = parse_schema(
        json.dumps(
            {
                "type": "struct",
                "fields": [
                    {"name": "id", "type": "long", "nullable": False, "metadata": {}},
                    {
                        "name": "m",
                        "type": {
                            "type": "map",
                            "keyType": "date",
                            "valueType": "double",
                            "valueContainsNull": False,
                        },
                        "nullable": False,
                        "metadata": {},
                    },
                ],
            }
        )
    )
    import datetime

    pairs = [(datetime.date(2020, 1, 2), 1.0), (datetime.date(1999, 1, 1), float("inf"))]
    batch = pa.RecordBatch.from_pylist(
        [{"id": 1, "m": pairs}],
        schema=pa.schema([("id", pa.int64(), False), ("m", pa.map_(pa.date32(), pa.float64()), False)]),
    )
    s = _serializer(batch, schema=schema)
    entries = s.value_class.DESCRIPTOR.fields_by_name["m"]
    assert entries.is_repeated and entries.message_type.name == "Value_m_entry"
    image = s.images({n: s.column_values(batch.column(n)) for n in s.columns}, 1)[0]
    assert row(s.row(image), schema) == {"id": 1, "m": pairs}


def test_column_mapping_ids_are_the_field_numbers() -> None:
    """Numbers that survive a renamed or dropped column: the columns' ``delta.columnMapping.id``."""
    schema = parse_schema(
        json.dumps(
            {
                "type": "struct",
                "fields": [
                    {
                        "name": "b",
                        "type": "string",
                        "nullable": True,
                        "metadata": {"delta.columnMapping.id": 7},
                    },
                    {
                        "name": "a",
                        "type": "long",
                        "nullable": True,
                        "metadata": {"delta.columnMapping.id": 3},
                    },
                ],
            }
        )
    )
    batch = pa.RecordBatch.from_pylist(
        [{"b": "x", "a": 1}], schema=pa.schema([("b", pa.string()), ("a", pa.int64())])
    )
    s = _serializer(batch, key_columns=("a",), schema=schema)
    assert [(f.name, f.number) for f in s.value_class.DESCRIPTOR.fields] == [("b", 7), ("a", 3)]
    assert [(f.name, f.number) for f in s.key_class.DESCRIPTOR.fields] == [("a", 3)]


def _readable_tables() -> list[str]:
    return [c.id for c in table_cases() if c.has_data and not c.must_fail]


@pytest.mark.parametrize("table_id", _readable_tables())
def test_every_readable_table_of_tests_data_round_trips_through_the_protobuf_deserializer(
    table_id: str,
) -> None:
    """Every table's snapshot (first 200 rows of each file) as Protobuf images, read back through
    ProtobufDeserializer equal to Arrow's rows."""
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
        s = _serializer(batch, key_columns=(), schema=schema)
        columns = list(batch.schema.names)
        values = {n: s.column_values(batch.column(n)) for n in columns}
        from deltamirror.mirror.records.avro_types import column_types

        types = StructType(fields=tuple(column_types({f.name: f for f in batch.schema}, columns, schema)))
        for image, arrow in zip(s.images(values, batch.num_rows), batch.to_pylist(), strict=True):
            back = row(_deserialize(s.value_class, _framed(image, b"\x02\x02")), types)
            expected = {f.name: arrow_row(arrow[f.name], f.type) for f in types.fields}
            assert _nan(back) == _nan(expected), table_id


def test_an_unreachable_registry_stops_the_version_before_any_record_naming_table_version_and_subject() -> (
    None
):
    """No registry listens on port 9 of this host (a refused connection, no stand-in)."""
    from deltamirror.mirror.errors import SchemaRegistryUnavailableError
    from deltamirror.mirror.records.row_changes import VersionRows

    options = RowChangesOptions(
        "deltamirror.every-type.changes",
        "deltamirror.every-type.transaction",
        "every-type",
        "tid",
        key_columns=("id",),
        format="protobuf",
        table_schema=SCHEMA,
        registry=RegistrySettings(url="http://127.0.0.1:9", subject_name_strategy="record"),
    )
    batch = every_type_batch()
    chunks = VersionRows(options, lambda: [batch], version=7, ts_ms=5).records()
    with pytest.raises(SchemaRegistryUnavailableError) as caught:
        next(chunks)
    err = caught.value
    assert (err.table, err.version, err.exit_code) == ("every-type", 7, 1)
    assert err.context["subject"] in (
        "deltamirror.every_type.changes.Key",
        "deltamirror.every_type.changes.Envelope",
    )
    assert len(str(err).splitlines()) == 1
