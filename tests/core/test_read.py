"""Reading table rows: golden tables against Spark's expected rows, and hand-made files for the
cases golden tables do not pin down (missing columns, field ids, deletion vectors, streaming)."""

from __future__ import annotations

import datetime as dt
import json
import struct
import zoneinfo
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from deltamirror.core import read as read_module
from deltamirror.core.errors import (
    CorruptLogError,
    DataFileNotFoundError,
    DeletionVectorError,
    SchemaError,
    UnsupportedFeatureError,
)
from deltamirror.core.partitions import parse_partition_map, parse_partition_value, parse_partition_values
from deltamirror.core.read import read_data_file, read_snapshot
from deltamirror.core.schema import (
    DecimalType,
    PrimitiveType,
    StructField,
    StructType,
    parse_schema,
    to_arrow_schema,
)
from deltamirror.core.storage import TableStorage

DATA = Path(__file__).resolve().parents[1] / "data"
TABLES = DATA / "tables"
GOLDEN_EXPECTED = DATA / "expected" / "golden_snapshot"
UTC = dt.UTC

# ---------------------------------------------------------------------------------------------
# helpers: replay JSON commits (the tables below have every commit as JSON) and compare rows


def _dv_key(action: dict[str, Any]) -> tuple[Any, ...] | None:
    dv = action.get("deletionVector")
    return None if not dv else (dv["storageType"], dv["pathOrInlineDv"], dv.get("offset"))


def _replay(table: Path) -> tuple[dict[str, Any], pa.Table]:
    """metaData and active files of the latest version, from the JSON commits alone."""
    meta: dict[str, Any] | None = None
    active: dict[tuple[str, Any], dict[str, Any]] = {}
    for commit in sorted((table / "_delta_log").glob("*.json")):
        for line in commit.read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            action = json.loads(line)
            if "metaData" in action:
                meta = action["metaData"]
            elif "add" in action:
                add = action["add"]
                active[(add["path"], _dv_key(add))] = add
            elif "remove" in action:
                rm = action["remove"]
                active.pop((rm["path"], _dv_key(rm)), None)
    assert meta is not None
    files = pa.Table.from_pylist(
        [
            {
                "path": a["path"],
                "partitionValues": list((a.get("partitionValues") or {}).items()),
                "deletionVector": a.get("deletionVector"),
            }
            for a in active.values()
        ],
        schema=_FILES_SCHEMA,
    )
    return meta, files


_FILES_SCHEMA = pa.schema(
    [
        pa.field("path", pa.string()),
        pa.field("partitionValues", pa.map_(pa.string(), pa.string())),
        pa.field(
            "deletionVector",
            pa.struct(
                [
                    pa.field("storageType", pa.string()),
                    pa.field("pathOrInlineDv", pa.string()),
                    pa.field("offset", pa.int32()),
                    pa.field("sizeInBytes", pa.int32()),
                    pa.field("cardinality", pa.int64()),
                    pa.field("maxRowIndex", pa.int64()),
                ]
            ),
        ),
    ]
)


def _norm(value: Any) -> Any:
    """A hashable, orderable form of a row value (maps and structs as sorted tuples)."""
    if isinstance(value, dict):
        return tuple(sorted((k, _norm(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(_norm(v) for v in value)
    if isinstance(value, float) and value != value:
        return "NaN"
    return value


def _sorted_rows(rows: list[dict[str, Any]]) -> list[Any]:
    return sorted((_norm(r) for r in rows), key=repr)


def _expected_rows(name: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for part in sorted((GOLDEN_EXPECTED / name).glob("part-*.parquet")):
        rows.extend(pq.read_table(part).to_pylist())
    return rows


def _read_table(table: Path, columns: list[str] | None = None) -> tuple[pa.Schema, list[pa.RecordBatch]]:
    meta, files = _replay(table)
    schema = parse_schema(meta["schemaString"])
    batches = list(
        read_snapshot(
            TableStorage(str(table)),
            files,
            schema=schema,
            partition_columns=meta["partitionColumns"],
            configuration=meta.get("configuration") or {},
            columns=columns,
        )
    )
    arrow = to_arrow_schema(schema)
    if columns is not None:
        arrow = pa.schema([f for f in arrow if f.name in columns])
    return arrow, batches


def _rows(batches: list[pa.RecordBatch]) -> list[dict[str, Any]]:
    return [row for b in batches for row in b.to_pylist()]


# ---------------------------------------------------------------------------------------------
# golden tables

REQUIRED = [
    "data-reader-primitives",
    "data-reader-array-primitives",
    "data-reader-array-complex-objects",
    "data-reader-map",
    "data-reader-nested-struct",
    "basic-decimal-table",
    "decimal-various-scale-precision",
    "parquet-all-types",
    "table-with-columnmapping-mode-id",
    "table-with-columnmapping-mode-name",
    "kernel-timestamp-pst",
    "kernel-timestamp-timestamp_micros",
    "time-travel-start",
    "snapshot-data0",
]
# expected rows exist but the table's data files do not (log-only fixtures)
LOG_ONLY = {"deltalog-getChanges", "log-replay-special-characters", "log-replay-special-characters-a"}
# timestamp partition values written in the writer's zone; tested separately below
WRITER_ZONE = {"data-reader-partition-values"}
OTHER_GOLDEN = sorted(
    p.name
    for p in GOLDEN_EXPECTED.iterdir()
    if p.name not in LOG_ONLY | WRITER_ZONE | set(REQUIRED)
    and (TABLES / f"golden__{p.name}" / "_delta_log" / "00000000000000000000.json").exists()
)


def test_required_golden_tables_are_single_commit() -> None:
    for name in REQUIRED:
        commits = list((TABLES / f"golden__{name}" / "_delta_log").glob("*.json"))
        assert len(commits) == 1, name


@pytest.mark.parametrize("name", REQUIRED + OTHER_GOLDEN)
def test_golden_snapshot(name: str) -> None:
    arrow, batches = _read_table(TABLES / f"golden__{name}")
    for batch in batches:
        assert batch.schema == arrow
    expected = _expected_rows(name)
    assert expected, "no expected rows found"
    assert _sorted_rows(_rows(batches)) == _sorted_rows(expected)


def test_partition_values_all_types() -> None:
    """Spark wrote and read this table in America/Los_Angeles; the log keeps the wall clock only.

    Partition timestamps without a zone are read as UTC (the writer's zone is not recorded), so
    ours equal Spark's expected instants shown as Los Angeles wall-clock time.
    """
    _, batches = _read_table(TABLES / "golden__data-reader-partition-values")
    la = zoneinfo.ZoneInfo("America/Los_Angeles")
    expected = _expected_rows("data-reader-partition-values")
    for row in expected:
        ts = row["as_timestamp"]
        if ts is not None:
            row["as_timestamp"] = ts.astimezone(la).replace(tzinfo=UTC)
    got = _rows(batches)
    assert _sorted_rows(got) == _sorted_rows(expected)
    assert {r["as_timestamp"] for r in got} == {dt.datetime(2021, 9, 8, 11, 11, 11, tzinfo=UTC), None}


def test_iso8601_timestamp_partition_values() -> None:
    """The `str` data column spells each row's partition timestamp (UTC)."""
    _, batches = _read_table(TABLES / "golden__kernel-timestamp-partition-col-ISO8601")
    rows = _rows(batches)
    assert len(rows) == 2
    for row in rows:
        assert row["ts"] == dt.datetime.fromisoformat(row["str"]).replace(tzinfo=UTC)


def test_projection_keeps_table_order() -> None:
    arrow, batches = _read_table(TABLES / "golden__kernel-timestamp-pst", columns=["time", "id"])
    assert arrow.names == ["id", "time"]
    assert all(b.schema.names == ["id", "time"] for b in batches)
    full = _rows(_read_table(TABLES / "golden__kernel-timestamp-pst")[1])
    assert _sorted_rows(_rows(batches)) == _sorted_rows([{"id": r["id"], "time": r["time"]} for r in full])


def test_projection_of_partition_column_only() -> None:
    _, batches = _read_table(TABLES / "golden__kernel-timestamp-pst", columns=["part"])
    expected = [{"part": r["part"]} for r in _expected_rows("kernel-timestamp-pst")]
    assert _sorted_rows(_rows(batches)) == _sorted_rows(expected)


# ---------------------------------------------------------------------------------------------
# hand-made data files


def _schema(*fields: dict[str, Any]) -> StructType:
    return parse_schema(json.dumps({"type": "struct", "fields": list(fields)}))


def _f(name: str, type_: Any, metadata: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"name": name, "type": type_, "nullable": True, "metadata": metadata or {}}


def _cm(pid: int, physical: str) -> dict[str, Any]:
    return {"delta.columnMapping.id": pid, "delta.columnMapping.physicalName": physical}


def _read(
    root: Path,
    path: str,
    schema: StructType,
    *,
    mode: str = "none",
    partition_columns: list[str] | None = None,
    partition_values: dict[str, str | None] | None = None,
    **kwargs: Any,
) -> list[pa.RecordBatch]:
    return list(
        read_data_file(
            TableStorage(str(root)),
            path,
            schema=schema,
            partition_columns=partition_columns or [],
            column_mapping=mode,  # type: ignore[arg-type]
            partition_values=partition_values or {},
            **kwargs,
        )
    )


def test_missing_data_file_names_file_and_table(tmp_path: Path) -> None:
    schema = _schema(_f("a", "long"))
    with pytest.raises(DataFileNotFoundError) as err:
        _read(tmp_path, "gone/part-0.parquet", schema, table="my-table")
    assert "gone/part-0.parquet" in str(err.value)
    assert "my-table" in str(err.value)


def _corruptions(good: bytes) -> dict[str, bytes]:
    """Ways a data file is not a readable Parquet file, each known to reach a different pyarrow
    error: no magic bytes, empty, a footer that claims more than the file holds, a footer that
    is not thrift (pyarrow's message then holds a raw byte and a newline), corrupt pages."""
    return {
        "not parquet": b"name,value\n1,2\n" * 20,
        "empty": b"",
        "truncated": good[: len(good) // 2],
        "magic only": b"PAR1PAR1",
        "bad footer": good[:-200] + b"\xff" * 192 + good[-8:],
        "bad pages": good[:1000] + bytes(b ^ 0x5A for b in good[1000:5000]) + good[5000:],
    }


@pytest.mark.parametrize(
    "case", ["not parquet", "empty", "truncated", "magic only", "bad footer", "bad pages"]
)
def test_corrupt_data_file_is_one_line_exit_2(tmp_path: Path, case: str) -> None:
    from deltamirror.core.errors import CorruptDataFileError

    n = 100_000
    pq.write_table(
        pa.table({"a": list(range(n)), "b": [str(i) for i in range(n)]}), tmp_path / "good.parquet"
    )
    (tmp_path / "f.parquet").write_bytes(_corruptions((tmp_path / "good.parquet").read_bytes())[case])
    schema = _schema(_f("a", "long"), _f("b", "string"))
    with pytest.raises(CorruptDataFileError) as err:
        _read(tmp_path, "f.parquet", schema, table="my-table")
    message = str(err.value)
    assert err.value.exit_code == 2
    assert "\n" not in message and message.isprintable()
    assert "f.parquet" in message and "my-table" in message and "not a readable Parquet file" in message


def test_corrupt_data_file_through_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`deltamirror read` of a table whose data file is garbage: one line, exit 2, no traceback."""
    import shutil

    from deltamirror.cli.main import main

    root = tmp_path / "t"
    shutil.copytree(TABLES / "drs__simple_table_with_cdc", root)
    data = root / "part-00000-7444aec4-710a-4a4c-8abe-3323499043e9.c000.snappy.parquet"
    data.write_bytes(b"\x00garbage\nwith a newline" * 10)
    code = main(["read", str(root)])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "not a readable Parquet file" in err and data.name in err


def test_storage_errors_while_decoding_stay_retryable() -> None:
    """A failure of the storage under pyarrow (it re-raises the Python exception) is exit 1."""
    from deltamirror.core.errors import CorruptDataFileError, StorageError

    assert isinstance(read_module.read_error(TimeoutError("slow"), "data file", "t", "f"), StorageError)
    assert isinstance(
        read_module.read_error(ConnectionResetError(104, "reset"), "data file", "t", "f"), StorageError
    )
    assert isinstance(
        read_module.read_error(OSError("Corrupt snappy"), "data file", "t", "f"), CorruptDataFileError
    )
    assert isinstance(
        read_module.read_error(pa.ArrowInvalid("bad"), "data file", "t", "f"), CorruptDataFileError
    )


def test_columns_missing_from_file_are_nulls(tmp_path: Path) -> None:
    """As after ADD COLUMN: the old file has neither `b` nor `s.y`."""
    pq.write_table(
        pa.table({"a": [1, 2], "s": [{"x": 1}, None]}),
        tmp_path / "f.parquet",
    )
    schema = _schema(
        _f("a", "long"),
        _f("b", "string"),
        _f(
            "s",
            {
                "type": "struct",
                "fields": [
                    _f("x", "long"),
                    _f("y", {"type": "array", "elementType": "long", "containsNull": True}),
                ],
            },
        ),
    )
    batches = _read(tmp_path, "f.parquet", schema)
    assert batches[0].schema == to_arrow_schema(schema)
    assert _rows(batches) == [
        {"a": 1, "b": None, "s": {"x": 1, "y": None}},
        {"a": 2, "b": None, "s": None},
    ]


def test_partition_value_comes_from_the_log_even_if_materialized(tmp_path: Path) -> None:
    pq.write_table(pa.table({"v": ["a", "b"], "p": [999, 999]}), tmp_path / "f.parquet")
    schema = _schema(_f("p", "integer"), _f("v", "string"))
    batches = _read(tmp_path, "f.parquet", schema, partition_columns=["p"], partition_values={"p": "7"})
    assert _rows(batches) == [{"p": 7, "v": "a"}, {"p": 7, "v": "b"}]
    batches = _read(tmp_path, "f.parquet", schema, partition_columns=["p"], partition_values={"p": None})
    assert _rows(batches) == [{"p": None, "v": "a"}, {"p": None, "v": "b"}]


def test_name_mode_renames_at_every_level(tmp_path: Path) -> None:
    physical = pa.table(
        {
            "c1": pa.array(
                [{"c2": 1, "c3": [{"c4": "x"}]}],
                pa.struct([("c2", pa.int64()), ("c3", pa.list_(pa.struct([("c4", pa.string())])))]),
            ),
            "c5": pa.array([[("k", {"c6": 2.5})]], pa.map_(pa.string(), pa.struct([("c6", pa.float64())]))),
            "c7": pa.array(["2020-01-01"], pa.string()),  # a logical name in no schema: ignored
        }
    )
    pq.write_table(physical, tmp_path / "f.parquet")
    inner = {"type": "struct", "fields": [_f("d", "string", _cm(4, "c4"))]}
    schema = _schema(
        _f(
            "top",
            {
                "type": "struct",
                "fields": [
                    _f("n", "long", _cm(2, "c2")),
                    _f("arr", {"type": "array", "elementType": inner, "containsNull": True}, _cm(3, "c3")),
                ],
            },
            _cm(1, "c1"),
        ),
        _f(
            "m",
            {
                "type": "map",
                "keyType": "string",
                "valueType": {"type": "struct", "fields": [_f("val", "double", _cm(6, "c6"))]},
                "valueContainsNull": True,
            },
            _cm(5, "c5"),
        ),
        _f("p", "date", _cm(7, "col-p")),
    )
    batches = _read(
        tmp_path,
        "f.parquet",
        schema,
        mode="name",
        partition_columns=["p"],
        partition_values={"col-p": "2021-02-03"},
    )
    assert batches[0].schema == to_arrow_schema(schema)
    assert _rows(batches) == [
        {
            "top": {"n": 1, "arr": [{"d": "x"}]},
            "m": [("k", {"val": 2.5})],
            "p": dt.date(2021, 2, 3),
        }
    ]


def _with_id(name: str, type_: pa.DataType, fid: int) -> pa.Field:
    return pa.field(name, type_, metadata={b"PARQUET:field_id": str(fid).encode()})


def test_id_mode_resolves_by_field_id_not_name(tmp_path: Path) -> None:
    # names deliberately misleading: the file's "a" holds field 2
    file_schema = pa.schema([_with_id("a", pa.int64(), 2), _with_id("b", pa.string(), 1)])
    pq.write_table(pa.table({"a": [10, 20], "b": ["x", "y"]}, schema=file_schema), tmp_path / "f.parquet")
    schema = _schema(
        _f("text", "string", _cm(1, "a")),
        _f("number", "long", _cm(2, "b")),
        _f("added_later", "long", _cm(3, "col-3")),
    )
    assert _rows(_read(tmp_path, "f.parquet", schema, mode="id")) == [
        {"text": "x", "number": 10, "added_later": None},
        {"text": "y", "number": 20, "added_later": None},
    ]


def test_id_mode_refuses_files_without_field_ids(tmp_path: Path) -> None:
    pq.write_table(pa.table({"a": [1]}), tmp_path / "f.parquet")
    with pytest.raises(SchemaError):
        _read(tmp_path, "f.parquet", _schema(_f("a", "long", _cm(1, "a"))), mode="id")


def test_int96_timestamps_beyond_nanosecond_range(tmp_path: Path) -> None:
    values = [
        dt.datetime(1500, 1, 1, 0, 0, 0, 1, tzinfo=UTC),
        dt.datetime(2500, 6, 30, 23, 59, 59, 999999, tzinfo=UTC),
        None,
    ]
    table = pa.table({"t": pa.array(values, pa.timestamp("us", tz="UTC"))})
    pq.write_table(table, tmp_path / "f.parquet", use_deprecated_int96_timestamps=True)
    assert pq.ParquetFile(tmp_path / "f.parquet").schema.column(0).physical_type == "INT96"
    assert [r["t"] for r in _rows(_read(tmp_path, "f.parquet", _schema(_f("t", "timestamp"))))] == values


def test_timestamp_units_and_ntz(tmp_path: Path) -> None:
    instant = dt.datetime(2024, 5, 6, 7, 8, 9, 123000, tzinfo=UTC)
    wall = dt.datetime(2024, 5, 6, 7, 8, 9, 123456)
    pq.write_table(
        pa.table(
            {
                "ms": pa.array([instant], pa.timestamp("ms", tz="UTC")),
                "ns_ntz": pa.array([wall], pa.timestamp("ns")),
            }
        ),
        tmp_path / "f.parquet",
        coerce_timestamps=None,
        version="2.6",
    )
    schema = _schema(_f("ms", "timestamp"), _f("ns_ntz", "timestamp_ntz"))
    batches = _read(tmp_path, "f.parquet", schema)
    assert batches[0].schema == to_arrow_schema(schema)
    assert _rows(batches) == [{"ms": instant, "ns_ntz": wall}]


def test_type_widening(tmp_path: Path) -> None:
    """Files written before a widening type change read as the wider type (PROTOCOL.md "Type widening")."""
    pq.write_table(
        pa.table(
            {
                "b": pa.array([-128, 127], pa.int8()),
                "i": pa.array([2**31 - 1, -5], pa.int32()),
                "f": pa.array([1.5, -0.25], pa.float32()),
                "d": pa.array([Decimal("123.45"), Decimal("-0.01")], pa.decimal128(5, 2)),
                "day": pa.array([dt.date(2020, 2, 29), None], pa.date32()),
                "n": pa.array([7, -8], pa.int16()),
            }
        ),
        tmp_path / "f.parquet",
    )
    schema = _schema(
        _f("b", "long"),
        _f("i", "double"),
        _f("f", "double"),
        _f("d", "decimal(10,4)"),
        _f("day", "timestamp_ntz"),
        _f("n", "decimal(12,2)"),
    )
    assert _rows(_read(tmp_path, "f.parquet", schema)) == [
        {
            "b": -128,
            "i": 2147483647.0,
            "f": 1.5,
            "d": Decimal("123.4500"),
            "day": dt.datetime(2020, 2, 29),
            "n": Decimal("7.00"),
        },
        {"b": 127, "i": -5.0, "f": -0.25, "d": Decimal("-0.0100"), "day": None, "n": Decimal("-8.00")},
    ]


def test_variant_is_struct_of_value_and_metadata(tmp_path: Path) -> None:
    variant_file = pa.struct([("metadata", pa.binary()), ("value", pa.binary())])
    pq.write_table(
        pa.table({"v": pa.array([{"metadata": b"\x01\x00\x00", "value": b"\x0c\x01"}, None], variant_file)}),
        tmp_path / "f.parquet",
    )
    rows = _rows(_read(tmp_path, "f.parquet", _schema(_f("v", "variant"))))
    assert rows == [{"v": {"value": b"\x0c\x01", "metadata": b"\x01\x00\x00"}}, {"v": None}]

    shredded = pa.struct([("metadata", pa.binary()), ("value", pa.binary()), ("typed_value", pa.int64())])
    pq.write_table(
        pa.table({"v": pa.array([{"metadata": b"\x01", "value": None, "typed_value": 5}], shredded)}),
        tmp_path / "g.parquet",
    )
    with pytest.raises(UnsupportedFeatureError):
        _read(tmp_path, "g.parquet", _schema(_f("v", "variant")))


def _many_row_groups(root: Path, n: int = 1000) -> None:
    table = pa.table({"id": pa.array(range(n), pa.int64()), "s": [{"k": i % 7} for i in range(n)]})
    pq.write_table(table, root / "f.parquet", row_group_size=128)
    assert pq.ParquetFile(root / "f.parquet").metadata.num_row_groups > 5


SCHEMA_ID_S = _schema(_f("id", "long"), _f("s", {"type": "struct", "fields": [_f("k", "long")]}))


def test_streams_in_bounded_batches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _many_row_groups(tmp_path)
    monkeypatch.setattr(read_module, "BATCH_SIZE", 50)
    batches = _read(tmp_path, "f.parquet", SCHEMA_ID_S)
    assert len(batches) > 10 and max(b.num_rows for b in batches) <= 50
    assert [r["id"] for r in _rows(batches)] == list(range(1000))


def test_deletion_vector_drops_rows_by_file_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _many_row_groups(tmp_path)
    deleted = sorted({0, 1, 127, 128, 129, 500, 999} | set(range(256, 384)))  # row group 2 entirely
    descriptor = {"storageType": "i", "pathOrInlineDv": "fake", "sizeInBytes": 1, "cardinality": len(deleted)}
    seen: list[Any] = []

    def fake_read_deleted_rows(
        storage: Any, desc: Any, *, table: Any = None, data_file: Any = None, num_rows: Any = None
    ) -> pa.UInt64Array:
        assert num_rows == 1000  # the data file's row count bounds the DV before it is read
        seen.append((desc, data_file))
        return pa.array(deleted, pa.uint64())

    monkeypatch.setattr(read_module.deletion_vectors, "read_deleted_rows", fake_read_deleted_rows)
    monkeypatch.setattr(read_module, "BATCH_SIZE", 50)
    rows = _rows(_read(tmp_path, "f.parquet", SCHEMA_ID_S, deletion_vector=descriptor))
    assert [r["id"] for r in rows] == [i for i in range(1000) if i not in set(deleted)]
    assert all(r["s"] == {"k": r["id"] % 7} for r in rows)
    assert seen == [(descriptor, "f.parquet")]


def test_only_rows_keeps_exactly_those_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _many_row_groups(tmp_path)

    def must_not_read(*args: Any, **kwargs: Any) -> pa.UInt64Array:
        raise AssertionError("only_rows replaces the deletion vector")

    monkeypatch.setattr(read_module.deletion_vectors, "read_deleted_rows", must_not_read)
    monkeypatch.setattr(read_module, "BATCH_SIZE", 50)
    wanted = [999, 3, 3, 130, 0, 640, 641, 642]
    rows = _rows(
        _read(
            tmp_path,
            "f.parquet",
            SCHEMA_ID_S,
            deletion_vector={"storageType": "i", "pathOrInlineDv": "x", "sizeInBytes": 1, "cardinality": 1},
            only_rows=pa.array(wanted, pa.uint64()),
        )
    )
    assert [r["id"] for r in rows] == sorted(set(wanted))
    assert _rows(_read(tmp_path, "f.parquet", SCHEMA_ID_S, only_rows=pa.array([], pa.uint64()))) == []
    with pytest.raises(DeletionVectorError):
        _read(tmp_path, "f.parquet", SCHEMA_ID_S, only_rows=pa.array([1000], pa.uint64()))


def test_real_deletion_vectors_with_only_rows() -> None:
    """A DV table: the deleted rows of each file are exactly the rows only_rows=DV gives back."""
    from deltamirror.core.deletion_vectors import read_deleted_rows

    table = TABLES / "golden__dv-with-columnmapping"
    meta, files = _replay(table)
    schema = parse_schema(meta["schemaString"])
    storage = TableStorage(str(table))
    total_live = total_deleted = 0
    for row in files.to_pylist():
        if row["deletionVector"] is None:
            continue
        common: dict[str, Any] = {
            "schema": schema,
            "partition_columns": meta["partitionColumns"],
            "column_mapping": "name",
            "partition_values": dict(row["partitionValues"]),
        }
        deleted = read_deleted_rows(storage, row["deletionVector"])
        live = _rows(
            list(read_data_file(storage, row["path"], deletion_vector=row["deletionVector"], **common))
        )
        gone = _rows(list(read_data_file(storage, row["path"], only_rows=deleted, **common)))
        everything = _rows(list(read_data_file(storage, row["path"], **common)))
        assert len(gone) == len(deleted)
        assert _sorted_rows(live + gone) == _sorted_rows(everything)
        total_live += len(live)
        total_deleted += len(gone)
    assert total_deleted > 0 and total_live > 0


def _inline_dv(deleted: list[int]) -> dict[str, Any]:
    """An inline ('i') DV descriptor, built from the protocol's layout (not deltamirror's decoder).

    Bitmap: LE magic, portable 64-bit Roaring with one bucket (high 32 bits 0) holding a no-run
    32-bit Roaring of one array container (high 16 bits 0); Z85 over the bytes zero-padded to 4.
    """
    assert deleted == sorted(set(deleted)) and deleted[-1] < 2**16 and len(deleted) <= 4096
    bitmap32 = struct.pack("<II", 12346, 1) + struct.pack("<HH", 0, len(deleted) - 1)
    bitmap32 += struct.pack("<I", len(bitmap32) + 4) + struct.pack(f"<{len(deleted)}H", *deleted)
    bitmap = struct.pack("<IQI", 1681511377, 1, 0) + bitmap32
    padded = bitmap + b"\x00" * (-len(bitmap) % 4)
    digits = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
    text = []
    for i in range(0, len(padded), 4):
        value = int.from_bytes(padded[i : i + 4], "big")
        text.append("".join(digits[value // 85**k % 85] for k in range(4, -1, -1)))
    return {
        "storageType": "i",
        "pathOrInlineDv": "".join(text),
        "sizeInBytes": len(bitmap),
        "cardinality": len(deleted),
    }


@pytest.mark.parametrize("how", ["deletion-vector", "only-rows"])
def test_string_view_columns_with_dropped_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """Files by delta-rs/arrow-rs store an ARROW:schema saying string_view, which pyarrow can
    neither ``take`` from nor ``filter``: rows a DV drops (or only_rows keeps) must still come out,
    as the table's logical string type."""
    n = 300
    names = [
        None if i % 11 == 0 else f"name {i}" + " long enough not to be inlined" * (i % 2) for i in range(n)
    ]
    tags = [None if i % 13 == 0 else {"t": f"t{i % 5}"} for i in range(n)]
    file_schema = pa.schema(
        [("id", pa.int64()), ("name", pa.string_view()), ("s", pa.struct([("t", pa.string_view())]))]
    )
    # three row groups, each written from its own arrays (pyarrow cannot slice string_view)
    with pq.ParquetWriter(tmp_path / "f.parquet", file_schema) as writer:
        for lo in range(0, n, 100):
            rows = range(lo, lo + 100)
            writer.write_table(
                pa.table([list(rows), [names[i] for i in rows], [tags[i] for i in rows]], schema=file_schema)
            )
    stored = pq.ParquetFile(tmp_path / "f.parquet").schema_arrow
    assert stored.field("name").type == pa.string_view()  # the case under test, as read back
    assert stored.field("s").type.field("t").type == pa.string_view()
    assert pq.ParquetFile(tmp_path / "f.parquet").metadata.num_row_groups == 3
    schema = _schema(
        _f("id", "long"), _f("name", "string"), _f("s", {"type": "struct", "fields": [_f("t", "string")]})
    )
    deleted = [0, 5, 99, 100, 101, 150, *range(200, 300)]  # the third row group entirely
    monkeypatch.setattr(read_module, "BATCH_SIZE", 40)
    if how == "deletion-vector":
        batches = _read(tmp_path, "f.parquet", schema, deletion_vector=_inline_dv(deleted))
        kept = [i for i in range(n) if i not in set(deleted)]
    else:
        batches = _read(tmp_path, "f.parquet", schema, only_rows=pa.array(deleted, pa.uint64()))
        kept = deleted
    assert _rows(batches) == [{"id": i, "name": names[i], "s": tags[i]} for i in kept]
    logical = to_arrow_schema(schema)
    assert logical.field("name").type == pa.string()
    for batch in batches:
        assert batch.schema.field("name").type == logical.field("name").type
        assert batch.schema.field("s").type == logical.field("s").type


# ---------------------------------------------------------------------------------------------
# partition values


P = PrimitiveType


@pytest.mark.parametrize(
    ("data_type", "text", "expected"),
    [
        (P(name="string"), "hello", "hello"),
        (P(name="string"), "", None),
        (P(name="long"), "-9223372036854775808", -(2**63)),
        (P(name="integer"), "2147483647", 2**31 - 1),
        (P(name="short"), "-32768", -32768),
        (P(name="byte"), "127", 127),
        (P(name="double"), "1.25", 1.25),
        (P(name="float"), "-0.5", -0.5),
        (P(name="double"), "Infinity", float("inf")),
        (P(name="boolean"), "true", True),
        (P(name="boolean"), "false", False),
        (P(name="date"), "1970-01-01", dt.date(1970, 1, 1)),
        (P(name="timestamp"), "1970-01-01 00:00:00", dt.datetime(1970, 1, 1, tzinfo=UTC)),
        (
            P(name="timestamp"),
            "1970-01-01 00:00:00.123456",
            dt.datetime(1970, 1, 1, 0, 0, 0, 123456, tzinfo=UTC),
        ),
        (
            P(name="timestamp"),
            "1970-01-01T00:00:00.123456Z",
            dt.datetime(1970, 1, 1, 0, 0, 0, 123456, tzinfo=UTC),
        ),
        (P(name="timestamp"), "2024-01-01T10:00:00+02:00", dt.datetime(2024, 1, 1, 8, tzinfo=UTC)),
        (P(name="timestamp_ntz"), "1970-01-01 00:00:00.123456", dt.datetime(1970, 1, 1, 0, 0, 0, 123456)),
        (P(name="binary"), "\u0001\u0002\u0003", b"\x01\x02\x03"),
        (DecimalType(precision=10, scale=2), "-12.5", Decimal("-12.50")),
        (DecimalType(precision=10, scale=10), "0E-10", Decimal("0E-10")),
        (P(name="integer"), None, None),
        (P(name="date"), "", None),
    ],
)
def test_partition_value_serialization(data_type: Any, text: str | None, expected: Any) -> None:
    assert parse_partition_value(text, data_type).as_py() == expected


@pytest.mark.parametrize(
    ("data_type", "text"),
    [
        (P(name="integer"), "abc"),
        (P(name="byte"), "128"),
        (P(name="date"), "2021-13-01"),
        (P(name="boolean"), "maybe"),
    ],
)
def test_bad_partition_values(data_type: Any, text: str) -> None:
    with pytest.raises(CorruptLogError):
        parse_partition_value(text, data_type, column="c")


def test_non_partitionable_type() -> None:
    with pytest.raises(SchemaError):
        parse_partition_values(pa.array(["x"]), P(name="variant"))


def test_partition_map_matches_one_by_one() -> None:
    fields = [
        StructField(name="day", type=P(name="date"), metadata={"delta.columnMapping.physicalName": "col-d"}),
        StructField(name="n", type=P(name="long"), metadata={"delta.columnMapping.physicalName": "col-n"}),
        StructField(
            name="ts", type=P(name="timestamp"), metadata={"delta.columnMapping.physicalName": "col-t"}
        ),
    ]
    maps: list[dict[str, str | None]] = [
        {"col-d": "2020-01-01", "col-n": "5", "col-t": "2020-01-01 01:02:03"},
        {"col-d": None, "col-n": "", "col-t": "2020-01-01T01:02:03Z"},
        {"col-d": "1999-12-31", "col-t": None},
        {},
    ]
    column = pa.array([list(m.items()) for m in maps], pa.map_(pa.string(), pa.string()))
    table = parse_partition_map(column, fields, "name")
    assert table.column_names == ["day", "n", "ts"]
    for i, m in enumerate(maps):
        for f in fields:
            key = f.metadata["delta.columnMapping.physicalName"]
            assert table[f.name][i].as_py() == parse_partition_value(m.get(key), f.type).as_py()


def test_read_snapshot_of_empty_file_list(tmp_path: Path) -> None:
    schema = _schema(_f("a", "long"))
    files = _FILES_SCHEMA.empty_table()
    assert (
        list(
            read_snapshot(
                TableStorage(str(tmp_path)), files, schema=schema, partition_columns=[], configuration={}
            )
        )
        == []
    )
