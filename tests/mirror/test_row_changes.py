"""The row-change envelope: Debezium's fields, the pairing rules, the Connect schema, the resume cut."""

from __future__ import annotations

import base64
import datetime as dt
import json
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest

from deltamirror.mirror.errors import UnrepresentableValueError
from deltamirror.mirror.records.record import Record
from deltamirror.mirror.records.row_changes import (
    RowChangesOptions,
    VersionRows,
    connect_schema,
    skip_records,
)


def _options(**over: Any) -> RowChangesOptions:
    base: dict[str, Any] = {
        "changes_topic": "deltamirror.t.changes",
        "transaction_topic": "deltamirror.t.transaction",
        "table_name": "t",
        "table_id": "tid-1",
        "key_columns": ("id",),
    }
    return RowChangesOptions(**{**base, **over})


def _batch(ids: list[int], names: list[str | None], kinds: list[str]) -> pa.RecordBatch:
    return pa.record_batch(
        {
            "id": pa.array(ids, pa.int64()),
            "name": pa.array(names, pa.string()),
            "_change_type": pa.array(kinds, pa.string()),
            "_commit_version": pa.array([5] * len(ids), pa.int64()),
        }
    )


def _records(options: RowChangesOptions, *batches: pa.RecordBatch, version: int = 5) -> list[Record]:
    rows = VersionRows(options, lambda: list(batches), version=version, ts_ms=1_700_000_000_123)
    return [r for chunk in rows.records() for r in chunk]


def _events(records: list[Record]) -> list[dict[str, Any]]:
    return [json.loads(r.value) for r in records if r.topic.endswith(".changes") and r.value is not None]


def test_envelope_fields_as_debezium_names_them() -> None:
    records = _records(_options(), _batch([1], ["a"], ["insert"]))
    assert [r.topic for r in records] == [
        "deltamirror.t.transaction",
        "deltamirror.t.changes",
        "deltamirror.t.transaction",
    ]
    (event,) = _events(records)
    assert event["op"] == "c" and event["before"] is None and event["after"] == {"id": 1, "name": "a"}
    assert event["ts_ms"] == 1_700_000_000_123
    assert event["source"] == {
        "version": event["source"]["version"],
        "connector": "deltamirror",
        "name": "t",
        "ts_ms": 1_700_000_000_123,
        "snapshot": "false",
        "db": "delta",
        "table": "t",
        "table_id": "tid-1",
        "delta_version": 5,
        "index": 0,
    }
    assert event["transaction"] == {"id": "tid-1:5", "total_order": 1, "data_collection_order": 1}
    assert json.loads(records[1].key) == {"id": 1}
    begin, end = json.loads(records[0].value), json.loads(records[2].value)
    assert begin == {
        "status": "BEGIN",
        "id": "tid-1:5",
        "event_count": None,
        "data_collections": None,
        "ts_ms": 1_700_000_000_123,
    }
    assert end["status"] == "END" and end["event_count"] == 1
    assert end["data_collections"] == [{"data_collection": "deltamirror.t.changes", "event_count": 1}]
    assert json.loads(records[0].key) == {"id": "tid-1:5"}


def test_update_paired_by_configured_key_across_batches() -> None:
    b1 = _batch([1, 2], ["old", "x"], ["update_preimage", "insert"])
    b2 = _batch([1], ["new"], ["update_postimage"])
    events = _events(_records(_options(), b1, b2))
    assert [e["op"] for e in events] == ["c", "u"]
    assert events[1]["before"] == {"id": 1, "name": "old"} and events[1]["after"] == {"id": 1, "name": "new"}
    assert [e["source"]["index"] for e in events] == [0, 1]


def test_without_key_an_update_is_a_delete_and_an_insert_never_paired_by_position() -> None:
    b = _batch([1, 1], ["old", "new"], ["update_preimage", "update_postimage"])
    records = _records(_options(key_columns=()), b)
    events = _events(records)
    assert [e["op"] for e in events] == ["d", "c"]
    assert events[0]["before"] == {"id": 1, "name": "old"} and events[0]["after"] is None
    # the key is the whole row
    assert [json.loads(r.key) for r in records if r.topic.endswith(".changes")] == [
        {"id": 1, "name": "old"},
        {"id": 1, "name": "new"},
    ]


def test_a_key_seen_twice_among_the_update_images_is_not_paired() -> None:
    b = _batch(
        [1, 1, 1, 1, 2, 2],
        ["a", "b", "c", "d", "p", "q"],
        ["update_preimage", "update_postimage"] * 3,
    )
    events = _events(_records(_options(), b))
    assert [e["op"] for e in events] == ["d", "c", "d", "c", "u"]
    assert events[-1]["before"]["name"] == "p" and events[-1]["after"]["name"] == "q"


def test_deletes_get_tombstones_when_asked() -> None:
    records = _records(_options(tombstones=True), _batch([3], ["z"], ["delete"]))
    changes = [r for r in records if r.topic.endswith(".changes")]
    assert [json.loads(r.value)["op"] if r.value else None for r in changes] == ["d", None]
    assert changes[0].key == changes[1].key == b'{"id":3}'
    assert json.loads(records[-1].value)["event_count"] == 1  # tombstones are not events


def test_a_version_without_rows_has_no_records() -> None:
    assert _records(_options(), _batch([], [], [])) == []


def test_skip_records_resumes_exactly_after_a_cut() -> None:
    b1 = _batch([1, 2, 3], ["a", "b", "c"], ["insert", "delete", "insert"])
    b2 = _batch([4], ["d"], ["insert"])
    options = _options(tombstones=True)
    whole = _records(options, b1, b2)
    for cut in range(len(whole) + 1):
        rows = VersionRows(options, lambda: [b1, b2], version=5, ts_ms=1_700_000_000_123)
        rest = [r for chunk in skip_records(rows.records(), cut) for r in chunk]
        assert whole[:cut] + rest == whole


def test_types_in_plain_json() -> None:
    batch = pa.record_batch(
        {
            "id": pa.array([1], pa.int32()),
            "amount": pa.array([Decimal("-12.30")], pa.decimal128(10, 2)),
            "day": pa.array([dt.date(1970, 1, 3)], pa.date32()),
            "at": pa.array(
                [dt.datetime(1970, 1, 1, 0, 0, 1, 5, tzinfo=dt.UTC)], pa.timestamp("us", tz="UTC")
            ),
            "raw": pa.array([b"\x00\xff"], pa.binary()),
            "f": pa.array([float("nan")], pa.float64()),
            "s": pa.array([{"x": dt.datetime(1970, 1, 1, 0, 0, 2)}], pa.struct([("x", pa.timestamp("us"))])),
            "m": pa.array([[("k", 1)]], pa.map_(pa.string(), pa.int64())),
            "l": pa.array([[Decimal("1.5")]], pa.list_(pa.decimal128(4, 1))),
            "_change_type": pa.array(["insert"]),
        }
    )
    (event,) = _events(_records(_options(), batch))
    assert event["after"] == {
        "id": 1,
        "amount": "-12.30",
        "day": 2,
        "at": 1_000_005,
        "raw": base64.b64encode(b"\x00\xff").decode(),
        "f": "NaN",
        "s": {"x": 2_000_000},
        "m": {"k": 1},
        "l": ["1.5"],
    }


def test_json_schema_is_kafka_connects_and_decimals_are_its_logical_type() -> None:
    batch = pa.record_batch(
        {
            "id": pa.array([7], pa.int64()),
            "amount": pa.array([Decimal("-1.28")], pa.decimal128(10, 2)),
            "_change_type": pa.array(["delete"]),
        }
    )
    records = _records(_options(format="json-schema"), batch)
    change = next(r for r in records if r.topic.endswith(".changes"))
    value = json.loads(change.value)
    schema, payload = value["schema"], value["payload"]
    assert schema["type"] == "struct" and schema["name"] == "deltamirror.t.changes.Envelope"
    fields = {f["field"]: f for f in schema["fields"]}
    assert list(fields) == ["before", "after", "source", "op", "ts_ms", "transaction"]
    assert fields["before"]["name"] == "deltamirror.t.changes.Value" and fields["before"]["optional"]
    amount = next(f for f in fields["before"]["fields"] if f["field"] == "amount")
    assert amount["name"] == "org.apache.kafka.connect.data.Decimal"
    assert amount["parameters"]["scale"] == "2"
    unscaled = int.from_bytes(base64.b64decode(payload["before"]["amount"]), "big", signed=True)
    assert unscaled == -128
    key = json.loads(change.key)
    assert key["schema"]["name"] == "deltamirror.t.changes.Key" and key["payload"] == {"id": 7}
    begin = json.loads(records[0].value)
    assert begin["payload"]["status"] == "BEGIN" and begin["schema"]["type"] == "struct"


@pytest.mark.parametrize(
    ("arrow", "connect"),
    [
        (pa.int8(), {"type": "int8"}),
        (pa.int16(), {"type": "int16"}),
        (pa.float32(), {"type": "float"}),
        (pa.bool_(), {"type": "boolean"}),
        (pa.date32(), {"type": "int32", "name": "io.debezium.time.Date", "version": 1}),
        (pa.timestamp("us"), {"type": "int64", "name": "io.debezium.time.MicroTimestamp", "version": 1}),
    ],
)
def test_connect_types(arrow: pa.DataType, connect: dict[str, Any]) -> None:
    assert connect_schema(arrow) == {**connect, "optional": True}


def test_nested_connect_types() -> None:
    t = pa.struct([("a", pa.list_(pa.string())), ("b", pa.map_(pa.int32(), pa.binary()))])
    assert connect_schema(t, optional=False) == {
        "type": "struct",
        "fields": [
            {"type": "array", "items": {"type": "string", "optional": True}, "optional": True, "field": "a"},
            {
                "type": "map",
                "keys": {"type": "int32", "optional": False},
                "values": {"type": "bytes", "optional": True},
                "optional": True,
                "field": "b",
            },
        ],
        "optional": False,
    }


def test_event_text_is_the_json_of_the_envelope() -> None:
    """Built from per-version templates, the bytes are still exactly the JSON of the envelope."""
    options = _options(table_name='t"ä\\', table_id="id-\u00e9")
    batch = _batch([1], ['x"y\u00fc'], ["delete"])
    (event,) = [r.value for r in _records(options, batch) if r.topic.endswith(".changes")]
    data = json.loads(event)
    expected = json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode()
    assert event == expected
    assert list(data) == ["before", "after", "source", "op", "ts_ms", "transaction"]
    assert data["source"]["name"] == 't"ä\\' and data["transaction"]["id"] == "id-\u00e9:5"


def test_json_schema_refuses_a_float_connect_would_read_as_zero() -> None:
    batch = pa.record_batch(
        {"id": pa.array([1]), "f": pa.array([float("inf")]), "_change_type": pa.array(["insert"])}
    )
    with pytest.raises(UnrepresentableValueError, match=r"'f'.*format json") as raised:
        _records(_options(format="json-schema"), batch)
    assert raised.value.version == 5
