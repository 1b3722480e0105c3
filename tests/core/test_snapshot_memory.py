"""Loading a checkpoint of many files creates no Python object per file.

tracemalloc sees every allocation made through Python's allocators and none of Arrow's (its memory
pool is C++), so the traced peak of a snapshot load is what the load costs in Python objects. The
smallest per-file object is far bigger than the bounds below: a path ``str`` is ~140 bytes, a bare
``int`` 28, a list slot 8. The same bounds are shown to catch ``to_pylist`` of the files' paths,
so they can fail. Timings are the benchmark's business (bench/bench_snapshot.py), not this test's.
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from deltamirror.core import action_schema
from deltamirror.core.table import open_table
from support.synthetic import SyntheticTable, write_checkpoint_table

MANY = 200_000
FEW = 2_000
COMMITS = 20
#: traced bytes the load may grow by per checkpoint file: less than one pointer
BYTES_PER_FILE = 8
#: absolute ceiling on the traced peak for MANY files (one dict per file would need > 60 MB)
PEAK_BOUND = 20 * 2**20


@pytest.fixture(scope="module")
def tables(tmp_path_factory: pytest.TempPathFactory) -> dict[int, SyntheticTable]:
    root = tmp_path_factory.mktemp("many_files")
    return {n: write_checkpoint_table(root / f"t{n}", n, COMMITS) for n in (FEW, MANY)}


def _traced_peak(fn: Callable[[], Any]) -> tuple[Any, int]:
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        result = fn()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _load(table: SyntheticTable) -> pa.Table:
    snap = open_table(table.root).snapshot()
    assert snap.version == table.version
    return snap.files


@pytest.mark.slow
def test_checkpoint_load_creates_no_python_object_per_file(tables: dict[int, SyntheticTable]) -> None:
    few, many = tables[FEW], tables[MANY]
    for t in (few, many):  # lazy imports and caches are paid once, not per load
        _load(t)
    files_few, peak_few = _traced_peak(lambda: _load(few))
    files_many, peak_many = _traced_peak(lambda: _load(many))

    # the generator's own bookkeeping is the oracle for the replayed state
    assert files_few.num_rows == few.active_files
    assert files_many.num_rows == many.active_files
    # a DV rewrite replaces a file's key, so every active path is listed once
    assert pc.count_distinct(files_many["path"]).as_py() == many.active_files

    growth = peak_many - peak_few
    per_file = BYTES_PER_FILE * (MANY - FEW)
    assert growth < per_file, f"traced peak grew {growth} B for {MANY - FEW} more files"
    assert peak_many < PEAK_BOUND, f"traced peak {peak_many} B"

    # the bounds catch one Python object per file: a list of the paths alone exceeds both
    paths, peak_paths = _traced_peak(files_many["path"].to_pylist)
    assert len(paths) == MANY
    assert peak_paths - peak_few > per_file
    assert peak_paths > PEAK_BOUND


@pytest.mark.parametrize("n", [0, 1, 2, 7, 300, 5000])
@pytest.mark.parametrize("pattern", ["all", "none", "runs", "sparse", "alternating"])
def test_keep_rows_equals_filter(n: int, pattern: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The zero-copy row selection the load path uses gives exactly what a filter gives."""
    keep_of: dict[str, Callable[[int], bool]] = {
        "all": lambda i: True,
        "none": lambda i: False,
        "runs": lambda i: (i // 97) % 3 != 1,
        "sparse": lambda i: i % 1013 != 5,
        "alternating": lambda i: i % 2 == 0,
    }
    keep = pa.array([keep_of[pattern](i) for i in range(n)], pa.bool_())
    half = n // 2
    table = pa.table({"i": pa.chunked_array([list(range(half)), list(range(half, n))], type=pa.int64())})
    for max_runs in (64, 1):  # slices, and the filter it falls back to
        monkeypatch.setattr(action_schema, "_MAX_RUNS", max_runs)
        kept = action_schema.keep_rows(table, keep)
        assert kept.equals(table.filter(keep))
        assert action_schema.keep_rows(table["i"], keep).equals(table["i"].filter(keep))


def test_generator_is_deterministic(tmp_path: Path) -> None:
    a = write_checkpoint_table(tmp_path / "a", 500, 3, seed=7)
    b = write_checkpoint_table(tmp_path / "b", 500, 3, seed=7)
    assert Path(a.checkpoint).read_bytes() == Path(b.checkpoint).read_bytes()
    assert a.active_files == b.active_files == 500


#: a commit of file entries this large is loaded in a subprocess, its peak RSS measured
BIG_COMMIT_BYTES = 100 * 2**20

_MEASURE = """
import resource, sys
from deltamirror.core import open_table
import pyarrow, pyarrow.compute, pydantic_core  # the interpreter's own cost, paid before the baseline
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
snap = open_table(sys.argv[1]).snapshot()
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(snap.files.num_rows, (peak - base) * 1024)
"""


def write_one_big_commit(root: Path, size: int) -> int:
    """A table whose one commit holds ``size`` bytes of add lines (with stats); its file count."""
    import json

    log = root / "_delta_log"
    log.mkdir(parents=True)
    schema = {"type": "struct", "fields": [{"name": "id", "type": "long", "nullable": True, "metadata": {}}]}
    stats = json.dumps(
        {"numRecords": 10, "minValues": {"id": 0}, "maxValues": {"id": 9}, "nullCount": {"id": 0}}
    )
    head = [
        {"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}},
        {
            "metaData": {
                "id": "big",
                "format": {"provider": "parquet", "options": {}},
                "schemaString": json.dumps(schema),
                "partitionColumns": [],
                "configuration": {},
            }
        },
    ]
    n = written = 0
    with (log / f"{0:020d}.json").open("w") as out:
        out.write("".join(json.dumps(a) + "\n" for a in head))
        while written < size:
            line = json.dumps(
                {
                    "add": {
                        "path": f"part-{n:08d}-0b3f6e3c-1f6d-4d0e-9a4b-6f2b1c9e8d7a.c000.snappy.parquet",
                        "partitionValues": {},
                        "size": 1234,
                        "modificationTime": 1700000000000,
                        "dataChange": True,
                        "stats": stats,
                    }
                },
                separators=(",", ":"),
            )
            out.write(line + "\n")
            written += len(line) + 1
            n += 1
    return n


@pytest.mark.slow
def test_a_large_commit_takes_at_most_twice_its_size(tmp_path: Path) -> None:
    """A snapshot of one commit of file entries holds them as Arrow rows, never all as Python
    objects at once: its memory beyond the interpreter's stays within twice the commit's size
    (measured: 189 MB for 100 MiB; 470 MB when every add was a Python object until the end)."""
    import subprocess
    import sys

    files = write_one_big_commit(tmp_path / "big", BIG_COMMIT_BYTES)
    done = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(tmp_path / "big")],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    rows, grown = map(int, done.stdout.split())
    assert rows == files
    assert grown <= 2 * BIG_COMMIT_BYTES, (
        f"{grown / 2**20:.0f} MB for a {BIG_COMMIT_BYTES / 2**20:.0f} MB commit"
    )
