"""The row-change formats: one class each, chosen once from the setting; the payload is the same in all.

The bytes of each format are pinned by test_row_changes.py and test_debezium_compat.py (Kafka
Connect's own JsonConverter reads them); these check the seam: which class a setting chooses, that
the two formats carry one payload, and that a format added as one class changes every record of a
version (changes and transaction metadata) and nothing else.
"""

from __future__ import annotations

import json
import typing
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import pyarrow as pa
import pytest

from deltamirror.core.schema import StructType
from deltamirror.core.schema_types import parse_schema
from deltamirror.mirror.records import row_formats
from deltamirror.mirror.records.record import Record
from deltamirror.mirror.records.row_changes import RowChangesOptions, VersionRows
from deltamirror.mirror.records.row_formats import (
    ROW_CHANGE_SERIALIZERS,
    ROW_CHANGES_FORMATS,
    ConnectJsonRowChanges,
    JsonRowChanges,
    row_change_serializer,
)
from deltamirror.mirror.records.spark_ddl import row_changes_ddl, row_changes_key_ddl
from deltamirror.producer.settings import RowChangesConfig

BATCH = pa.record_batch(
    {
        "id": pa.array([1, 2], pa.int64()),
        "price": pa.array([1.5, None], pa.float64()),
        "_change_type": pa.array(["insert", "delete"]),
    }
)


def _options(fmt: str, **over: Any) -> RowChangesOptions:
    return RowChangesOptions(
        changes_topic="deltamirror.t.changes",
        transaction_topic="deltamirror.t.transaction",
        table_name="t",
        table_id="tid-1",
        key_columns=("id",),
        format=fmt,  # type: ignore[arg-type]
        **over,
    )


def _records(options: RowChangesOptions) -> list[Record]:
    rows = VersionRows(options, lambda: [BATCH], version=5, ts_ms=1_700_000_000_123)
    return [r for chunk in rows.records() for r in chunk]


def test_every_format_the_setting_allows_is_one_class_and_no_other() -> None:
    allowed = typing.get_args(RowChangesConfig.model_fields["format"].annotation)
    assert allowed == ROW_CHANGES_FORMATS
    assert [row_change_serializer(f).format for f in allowed] == list(allowed)
    assert tuple(ROW_CHANGE_SERIALIZERS) == ROW_CHANGES_FORMATS  # the registry formats, once loaded
    assert row_change_serializer("json") is JsonRowChanges
    assert row_change_serializer("json-schema") is ConnectJsonRowChanges
    assert _options("json-schema").serializer is ConnectJsonRowChanges  # chosen once, with the options
    with pytest.raises(ValueError, match="'protobuf' is not one deltamirror writes"):
        _options("protobuf")


def test_both_formats_carry_the_same_payload() -> None:
    plain, connect = _records(_options("json")), _records(_options("json-schema"))
    assert [r.topic for r in plain] == [r.topic for r in connect]
    for p, c in zip(plain, connect, strict=True):
        assert p.value is not None and c.value is not None
        wrapped_key, wrapped_value = json.loads(c.key), json.loads(c.value)
        assert wrapped_key["payload"] == json.loads(p.key) and "schema" in wrapped_key
        assert wrapped_value["payload"] == json.loads(p.value) and "schema" in wrapped_value
    assert json.loads(connect[1].value or b"")["schema"]["name"] == "deltamirror.t.changes.Envelope"


class _Framed:
    """A format made for the test: the JSON payload between two markers."""

    format: ClassVar[str] = "framed"
    image_type: ClassVar[pa.DataType] = pa.large_string()

    def __init__(
        self,
        topic: str,
        fields: Mapping[str, pa.Field],
        columns: Sequence[str],
        key_columns: Sequence[str],
        **seam: Any,
    ) -> None:
        self.columns = list(columns)

    def column_values(self, column: pa.Array) -> list[Any]:
        return JsonRowChanges.column_values(JsonRowChanges("", {}, (), ()), column)

    def key(self, payload: bytes) -> bytes:
        return b"<k>" + payload

    def value(self, payload: bytes) -> bytes:
        return b"<v>" + payload

    @staticmethod
    def transaction(key: Mapping[str, Any], payload: Mapping[str, Any]) -> tuple[bytes, bytes]:
        return b"<tk>" + json.dumps(key).encode(), b"<tv>" + json.dumps(payload).encode()

    @classmethod
    def value_ddl(cls, schema: StructType) -> str:
        return "framed " + ",".join(f.name for f in schema.fields)

    @classmethod
    def key_ddl(cls, fields: StructType) -> str:
        return "framed key " + ",".join(f.name for f in fields.fields)


def test_a_format_added_as_one_class_writes_every_record_of_a_version(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(row_formats.ROW_CHANGE_SERIALIZERS, "framed", _Framed)
    framed, plain = _records(_options("framed")), _records(_options("json"))
    assert [r.topic for r in framed] == [r.topic for r in plain]
    changes = [(f, p) for f, p in zip(framed, plain, strict=True) if f.topic.endswith(".changes")]
    assert changes and all(
        f.key == b"<k>" + p.key and f.value == b"<v>" + (p.value or b"") for f, p in changes
    )
    begin, end = framed[0], framed[-1]
    assert begin.key.startswith(b"<tk>") and (begin.value or b"").startswith(b"<tv>")
    assert json.loads((end.value or b"")[4:])["status"] == "END"


SCHEMA = json.dumps(
    {
        "type": "struct",
        "fields": [
            {"name": "id", "type": "long", "nullable": True, "metadata": {}},
            {"name": "price", "type": "decimal(10,2)", "nullable": True, "metadata": {}},
        ],
    }
)


def test_each_format_s_class_says_its_spark_ddl_and_the_ddl_functions_look_it_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for fmt, cls in ROW_CHANGE_SERIALIZERS.items():
        if fmt in row_formats.REGISTRY_FORMATS:  # read with the registered schema, not a DDL
            with pytest.raises(ValueError, match="no Spark DDL"):
                row_changes_ddl(SCHEMA, fmt=fmt)  # type: ignore[arg-type]
            continue
        assert row_changes_ddl(SCHEMA, fmt=fmt) == cls.value_ddl(parse_schema(SCHEMA))  # type: ignore[arg-type]
    assert "DECIMAL(10,2)" in row_changes_ddl(SCHEMA, fmt="json")
    assert "BINARY" in row_changes_ddl(SCHEMA, fmt="json-schema") and "DECIMAL" not in row_changes_ddl(
        SCHEMA, fmt="json-schema"
    )
    monkeypatch.setitem(row_formats.ROW_CHANGE_SERIALIZERS, "framed", _Framed)
    assert row_changes_ddl(SCHEMA, fmt="framed") == "framed id,price"  # type: ignore[arg-type]
    assert row_changes_key_ddl(SCHEMA, ["id"], fmt="framed") == "framed key id"  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no Spark DDL"):
        row_changes_ddl(SCHEMA, fmt="avro")
    with pytest.raises(ValueError, match="'protobuf' is not one deltamirror writes"):
        row_changes_ddl(SCHEMA, fmt="protobuf")  # type: ignore[arg-type]


def test_the_options_keep_any_sequence_of_key_columns_as_a_tuple() -> None:
    options = RowChangesOptions(
        changes_topic="c", transaction_topic="t", table_name="n", table_id="i", key_columns=["id", "x"]
    )
    assert options.key_columns == ("id", "x") and hash(options)
