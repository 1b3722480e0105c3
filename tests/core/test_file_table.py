"""A snapshot's files read a checkpoint's stats only when asked, and then the log's own values.

The oracle for the stats is the log itself, read here with pyarrow and ``json`` alone: the
checkpoint's parts (and the sidecars its ``sidecar`` actions name), then the commits after it, the
last ``add`` of a path giving its stats.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from deltamirror.core import action_schema
from deltamirror.core.errors import CorruptLogError
from deltamirror.core.file_table import FileTable, merge_survivors
from deltamirror.core.table import open_table
from support.synthetic import SyntheticTable, write_checkpoint_table

TABLES = Path(__file__).resolve().parent.parent / "data" / "tables"
#: one table per kind of checkpoint: classic multi-part, V2 parquet and JSON with and without
#: sidecars, many row groups
CHECKPOINT_KINDS = [
    "golden__multi-part-checkpoint",
    "kj__kernel-pagination-multi-part-checkpoints",
    "golden__v2-checkpoint-parquet",
    "golden__v2-checkpoint-json",
    "krs__v2-checkpoints-json-with-sidecars",
    "krs__v2-checkpoints-json-without-sidecars",
    "krs__parquet_row_group_skipping",
]


def _adds_of_parquet(path: Path) -> tuple[list[dict[str, Any]], list[str]]:
    table = pq.read_table(path)
    adds = [a for a in table.column("add").to_pylist() if a] if "add" in table.column_names else []
    sidecars = (
        [s["path"] for s in table.column("sidecar").to_pylist() if s]
        if "sidecar" in table.column_names
        else []
    )
    return adds, sidecars


def _adds_of_json(path: Path) -> tuple[list[dict[str, Any]], list[str]]:
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [a["add"] for a in lines if "add" in a], [a["sidecar"]["path"] for a in lines if "sidecar" in a]


def _stats_in_log(root: Path, checkpoint_names: list[str], version: int) -> dict[str, str | None]:
    """Each path's stats as the log says them (the last add of the path wins)."""
    log = root / "_delta_log"
    out: dict[str, str | None] = {}
    sidecars: list[str] = []
    for name in checkpoint_names:
        adds, named = (_adds_of_json if name.endswith(".json") else _adds_of_parquet)(log / name)
        sidecars += named
        out.update((a["path"], a.get("stats")) for a in adds)
    for name in sidecars:
        out.update((a["path"], a.get("stats")) for a in _adds_of_parquet(log / "_sidecars" / name)[0])
    checkpoint_version = int(checkpoint_names[0].split(".")[0])
    for v in range(checkpoint_version + 1, version + 1):
        out.update((a["path"], a.get("stats")) for a in _adds_of_json(log / f"{v:020d}.json")[0])
    return out


@pytest.mark.parametrize("table_id", CHECKPOINT_KINDS)
def test_stats_match_the_log_across_checkpoint_kinds(table_id: str) -> None:
    snap = open_table(str(TABLES / table_id)).snapshot(check_features=False)
    assert snap.segment.checkpoint is not None
    files = snap.files
    assert files.deferred == ["stats"] and files.num_rows > 0
    expected = _stats_in_log(TABLES / table_id, [f.name for f in snap.segment.checkpoint.files], snap.version)
    paths = files["path"].to_pylist()
    assert len(set(paths)) == len(paths)
    assert files["stats"].to_pylist() == [expected[p] for p in paths]
    assert files.deferred == []


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> SyntheticTable:
    return write_checkpoint_table(tmp_path_factory.mktemp("files") / "t", 3000, 8, row_group_size=1000)


def test_listing_and_counting_read_no_stats(synthetic: SyntheticTable) -> None:
    files = open_table(synthetic.root).snapshot().files
    assert files.num_rows == len(files) == synthetic.active_files
    assert files.schema == action_schema.ADD and files.column_names == action_schema.ADD.names
    assert files["path"].null_count == 0 and files.column("size").null_count == 0
    assert files.select(["path", "deletionVector"]).num_rows == synthetic.active_files
    assert "stats" not in files.drop_columns(["stats"]).column_names
    assert files.deferred == ["stats"]

    stats = files["stats"]
    assert files.deferred == []
    log = Path(synthetic.root)
    names = [p.name for p in (log / "_delta_log").glob("*.checkpoint.parquet")]
    expected = _stats_in_log(log, names, synthetic.version)
    assert stats.to_pylist() == [expected[p] for p in files["path"].to_pylist()]
    assert stats.null_count < 10  # the generator leaves out the stats of few adds


def test_the_whole_table_equals_an_eager_read(synthetic: SyntheticTable) -> None:
    files = open_table(synthetic.root).snapshot().files
    other = open_table(synthetic.root).snapshot().files
    table = files.to_table()
    assert isinstance(table, pa.Table) and files.deferred == []
    assert files.equals(other) and files == other and other.deferred == []
    assert files.equals(table) and not files.equals(table.slice(1))
    assert files.to_pylist()[0] == table.slice(0, 1).to_pylist()[0]  # any other Table method
    assert pickle.loads(pickle.dumps(files)).equals(table)
    assert pa.table(files).equals(table)  # the Arrow C stream
    assert "deferred" not in repr(files) and f"num_rows={table.num_rows}" in repr(files)


def test_stats_of_a_vanished_checkpoint_are_refused(tmp_path: Path) -> None:
    root = tmp_path / "t"
    copy = write_checkpoint_table(root, 500, 2)
    files = open_table(str(root)).snapshot().files
    Path(copy.checkpoint).unlink()
    assert files.num_rows == copy.active_files  # what was read stays
    with pytest.raises(CorruptLogError, match="disappeared before the snapshot read its files' stats"):
        files["stats"]


def test_stats_of_a_rewritten_checkpoint_are_refused(tmp_path: Path) -> None:
    root = tmp_path / "t"
    copy = write_checkpoint_table(root, 500, 2)
    files = open_table(str(root)).snapshot().files
    table = pq.read_table(copy.checkpoint)
    pq.write_table(table.slice(0, table.num_rows - 7), copy.checkpoint)
    with pytest.raises(CorruptLogError, match="checkpoint changed after the snapshot read it"):
        files.to_table()


def test_row_ids_in_some_row_groups_only_are_read(tmp_path: Path) -> None:
    """Row group statistics spare decoding a column null everywhere, never one with values."""
    root = tmp_path / "t"
    copy = write_checkpoint_table(root, 1200, 0, row_group_size=400)
    table = pq.read_table(copy.checkpoint)
    add = table.column("add").combine_chunks()
    index = pa.array(range(len(add)), pa.int64())
    row_ids = pc.if_else(pc.greater_equal(index, 1000), pc.multiply(index, 10), pa.scalar(None, pa.int64()))
    fields = [add.field(i) if f.name != "baseRowId" else row_ids for i, f in enumerate(add.type)]
    add = pa.StructArray.from_arrays(fields, fields=list(add.type), mask=add.is_null())
    table = table.set_column(table.schema.get_field_index("add"), "add", add)
    pq.write_table(table, copy.checkpoint, row_group_size=400)

    files = open_table(str(root)).snapshot().files
    by_path = {a["path"]: a["baseRowId"] for a in add.to_pylist() if a}
    assert files["baseRowId"].to_pylist() == [by_path[p] for p in files["path"].to_pylist()]
    assert files["baseRowId"].null_count < files.num_rows
    assert files["defaultRowCommitVersion"].null_count == files.num_rows


def test_merge_takes_runs_and_scattered_rows() -> None:
    checkpoint = pa.chunked_array([["a", "b"], ["c", None, "e"]])
    rows = pa.chunked_array([[0, 1, 3, 4, None]], pa.uint64())
    placeholder = pa.chunked_array([[None, None, None, None, "y"]], pa.string())
    assert merge_survivors(checkpoint, rows, placeholder).to_pylist() == ["a", "b", None, "e", "y"]
    rows = pa.chunked_array([[4, None, 0, 2]], pa.uint64())  # not in order: taken row by row
    placeholder = pa.chunked_array([[None, "x", None, None]], pa.string())
    assert merge_survivors(checkpoint, rows, placeholder).to_pylist() == ["e", "x", "a", "c"]


def test_a_file_table_without_deferred_columns_is_its_table() -> None:
    table = action_schema.ADD.empty_table()
    files = FileTable(table)
    assert files.deferred == [] and files.to_table() is table and files.num_rows == 0
    with pytest.raises(AttributeError):
        files.no_such_method  # noqa: B018
