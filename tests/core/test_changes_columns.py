"""Column projection of the change data feed: ``read_changes(..., columns=[...])``.

The projected feed must be delta-spark's ``readChangeFeed`` with the same ``select`` (here: the
writers' corpus expectations, which are delta-spark's feed of every column, cut to the columns
asked for; tests/core/test_changes_spark.py runs delta-spark's own ``select``), the projection must
reach the Parquet reader (columns left out are never decoded), and a column the table does not
have is refused by name before any data file is opened.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from deltamirror.core.changes import read_changes
from deltamirror.core.errors import InvalidArgumentError, UnknownColumnError
from deltamirror.core.schema import column_mapping_mode, physical_name
from deltamirror.core.table import open_table
from support.corpus import CorpusTable, corpus_tables, expected_cdf, normal_rows, table_location
from support.tables import TABLES

CDF = ["_change_type", "_commit_version", "_commit_timestamp"]
CORPUS = {t.id: t for t in corpus_tables()}

#: (corpus table written by delta-spark, columns asked for): partition columns, column mapping
#: (id mode, a column added later), deletion vectors, a type widened, names in another order and case
PROJECTIONS = [
    ("spark__dml", ["amount", "id"]),
    ("spark__dml", ["part"]),  # a partition column alone: no data column decoded
    ("spark__dml", ["NAME", "part"]),
    ("spark__column_mapping_id", ["score", "part"]),  # id mode; score added after the first writes
    ("spark__column_mapping_id", ["name"]),
    ("spark__dv_row_tracking", ["name", "part"]),
    ("spark__null_partitions", ["p", "v"]),
    ("spark__partition_types", ["dec", "ts", "id"]),
    ("spark__type_widening", ["small"]),
]


def _open(table: CorpusTable) -> Any:
    location, prefixes = table_location(table)
    return open_table(location, allowed_path_prefixes=prefixes)


@pytest.mark.parametrize(("table_id", "columns"), PROJECTIONS, ids=lambda v: str(v))
def test_projection_is_delta_sparks_feed_with_the_same_select(table_id: str, columns: list[str]) -> None:
    table = CORPUS[table_id]
    assert table.writer == "delta-spark"
    cdf = table.expected["cdf"]
    assert cdf is not None and "error" not in cdf
    feed = read_changes(
        _open(table), starting_version=cdf["start"], ending_version=cdf["end"], columns=columns
    )
    got = feed.to_arrow()
    schema = _open(table).snapshot().metadata.table_schema
    names = [schema.field(c).name for c in columns]
    assert got.schema.names == [*names, *CDF]
    kept = [*names, "_change_type", "_commit_version"]  # the corpus keeps no _commit_timestamp
    want = [{c: row[c] for c in kept} for row in expected_cdf(table, cdf["rows"])]
    assert want and normal_rows(got.to_pylist()) == normal_rows(want)


def test_name_mode_projects_by_logical_name() -> None:
    """Column mapping name mode: columns are asked for by their logical names and read from their
    physical columns (``col-<uuid>`` in the files), as the full read gives them."""
    table = open_table(str(TABLES / "krs__cdf-column-mapping-name-mode"))
    metadata = table.snapshot().metadata
    assert column_mapping_mode(metadata.configuration) == "name"
    assert physical_name(metadata.table_schema.field("value"), "name").startswith("col-")
    full = read_changes(table, starting_version=1).to_arrow()
    some = read_changes(table, starting_version=1, columns=["value", "id"]).to_arrow()
    assert some.schema.names == ["value", "id", *CDF]
    assert full.num_rows and some.to_pylist() == full.select(some.schema.names).to_pylist()


# --- the projection reaches the Parquet reader ----------------------------------------------------


class DecodeSpy:
    """Every decode of a data or change data file (``ParquetFile.iter_batches`` of a file the
    storage opened outside ``_delta_log``): the file's columns, the columns asked for, and those
    of the batches decoded."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, table: Any) -> None:
        self.calls: list[tuple[list[str], list[str] | None, set[str]]] = []
        data_files: set[int] = set()
        real_open = type(table.storage).parquet_file
        real_iter = pq.ParquetFile.iter_batches
        spy = self

        def parquet_file(storage: Any, path: str, **kw: Any) -> pq.ParquetFile:
            pf = real_open(storage, path, **kw)
            if "/_delta_log/" not in path:
                data_files.add(id(pf))
            return pf

        def iter_batches(pf: pq.ParquetFile, *args: Any, **kw: Any) -> Iterator[pa.RecordBatch]:
            if id(pf) not in data_files:  # the log's checkpoints
                yield from real_iter(pf, *args, **kw)
                return
            decoded: set[str] = set()
            spy.calls.append((list(pf.schema_arrow.names), kw.get("columns"), decoded))
            for batch in real_iter(pf, *args, **kw):
                decoded.update(batch.schema.names)
                yield batch

        monkeypatch.setattr(type(table.storage), "parquet_file", parquet_file)
        monkeypatch.setattr(pq.ParquetFile, "iter_batches", iter_batches)


def _physical(table: Any, columns: list[str]) -> set[str]:
    metadata = table.snapshot().metadata
    mode = column_mapping_mode(metadata.configuration)
    return {physical_name(metadata.table_schema.field(c), mode) for c in columns}


@pytest.mark.parametrize(
    ("where", "columns", "start"),
    [
        ("corpus:spark__dml", ["amount"], 0),  # data files and change data files (UPDATE, MERGE)
        ("corpus:spark__column_mapping_id", ["score"], 0),  # id mode: _change_type read apart
        ("corpus:spark__dv_row_tracking", ["name"], 0),  # deletion vectors: row groups read one by one
        ("tables:krs__cdf-column-mapping-name-mode", ["value"], 1),  # name mode
    ],
)
def test_only_the_named_columns_are_decoded(
    monkeypatch: pytest.MonkeyPatch, where: str, columns: list[str], start: int
) -> None:
    kind, name = where.split(":")
    table = _open(CORPUS[name]) if kind == "corpus" else open_table(str(TABLES / name))
    wanted = _physical(table, columns) | {"_change_type"}
    spy = DecodeSpy(monkeypatch, table)
    rows = read_changes(table, starting_version=start, columns=columns).to_arrow().num_rows
    assert rows and spy.calls
    left_out = set()
    for file_columns, asked, decoded in spy.calls:
        assert asked is not None, f"every column of a file with {file_columns} was asked for"
        assert set(asked) <= wanted and decoded <= wanted, (asked, decoded, wanted)
        left_out |= set(file_columns) - wanted
    assert left_out, "the files have other columns: the projection left them undecoded"


def test_a_partition_column_alone_decodes_nothing_of_the_data_files(monkeypatch: pytest.MonkeyPatch) -> None:
    """Partition values come from the log: a feed of partition columns only decodes no data column
    (a change data file's ``_change_type`` is the one column read from it)."""
    table = _open(CORPUS["spark__dml"])
    spy = DecodeSpy(monkeypatch, table)
    got = read_changes(table, starting_version=0, columns=["part"]).to_arrow()
    assert got.num_rows
    assert all(decoded <= {"_change_type"} for _, _, decoded in spy.calls)


# --- an unknown column --------------------------------------------------------------------------


def test_an_unknown_column_is_refused_by_name_before_any_data_file_is_opened(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    table = _open(CORPUS["spark__dml"])
    opened: list[str] = []
    real = type(table.storage).parquet_file

    def parquet_file(storage: Any, path: str, **kw: Any) -> Any:
        opened.append(path)
        return real(storage, path, **kw)

    monkeypatch.setattr(type(table.storage), "parquet_file", parquet_file)
    with pytest.raises(UnknownColumnError) as info:
        read_changes(table, starting_version=0, columns=["id", "nope"])
    error = info.value
    assert isinstance(error, InvalidArgumentError)  # the CLI's exit 2
    assert error.column == "nope" and error.table == table.uri
    assert "'nope'" in str(error) and "amount" in str(error)  # says which columns there are
    # the log is read (the read schema is the range's), but no data or change data file
    assert [p for p in opened if "/_delta_log/" not in p] == []


def test_an_unknown_column_of_a_feed_from_actions_is_refused_too() -> None:
    from deltamirror.core.changes import changes_from_actions

    table = _open(CORPUS["spark__dml"])
    snapshot = table.snapshot()
    with pytest.raises(UnknownColumnError) as info:
        changes_from_actions(table, snapshot.metadata, snapshot.version, (), columns=["nope"])
    assert info.value.column == "nope"


def test_snapshot_reads_refuse_an_unknown_column_alike(tmp_path: Path) -> None:
    table = _open(CORPUS["spark__dml"])
    with pytest.raises(UnknownColumnError) as info:
        table.snapshot().to_arrow(columns=["nope"])
    assert info.value.column == "nope" and info.value.table == table.uri
