"""One big commit of file entries: what reading it costs in memory, beside delta-rs.

A table whose version 1 is a single commit file of about ``commit_mb`` MB of ``add`` lines (the
shape delta-spark writes: a partition value, ``stats`` with min/max/null counts of four columns,
the ``tags`` Databricks-style writers add), version 0 creating it. Contenders, each in a fresh
process (``bench/run.py``):

- ``deltamirror``: ``open_table(root).snapshot()`` until its file list is in Arrow;
- ``delta-rs``: ``DeltaTable(root)`` + ``get_add_actions()``.

``memory_x_commit`` is the peak RSS over the process's RSS after its imports, divided by the
commit file's size: what holding the commit's file list costs per byte of the log it came from.
"""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
DATA = BENCH / ".data"
sys.path.insert(0, str(BENCH))

from harness import Clock, peak_rss_mb  # noqa: E402  (bench/ is not a package)

_SCHEMA = {
    "type": "struct",
    "fields": [
        {"name": n, "type": t, "nullable": True, "metadata": {}}
        for n, t in (
            ("id", "long"),
            ("name", "string"),
            ("value", "double"),
            ("ts", "timestamp"),
            ("part", "string"),
        )
    ],
}


def _add_line(n: int) -> str:
    stats = {
        "numRecords": 1000,
        "minValues": {
            "id": n * 1000,
            "name": f"aaaaaaaa{n:08d}",
            "value": 0.5,
            "ts": "2023-11-14T22:13:20.000Z",
        },
        "maxValues": {
            "id": n * 1000 + 999,
            "name": f"zzzzzzzz{n:08d}",
            "value": 999.5,
            "ts": "2023-11-15T22:13:20.000Z",
        },
        "nullCount": {"id": 0, "name": 3, "value": 1, "ts": 0},
    }
    part = f"p{n % 100:03d}"
    add = {
        "path": f"part={part}/part-{n:05d}-{uuid.UUID(int=n)}.c000.snappy.parquet",
        "partitionValues": {"part": part},
        "size": 123_456 + n,
        "modificationTime": 1_700_000_000_000 + n,
        "dataChange": True,
        "stats": json.dumps(stats),
        "tags": {
            "INSERTION_TIME": "1700000000000000",
            "MIN_INSERTION_TIME": "1700000000000000",
            "MAX_INSERTION_TIME": "1700000000000000",
            "OPTIMIZE_TARGET_SIZE": "268435456",
        },
    }
    return json.dumps({"add": add}) + "\n"


def build_table(root: Path, commit_mb: int) -> dict[str, Any]:
    """The table (cached: rebuilt only when ``commit_mb`` changed)."""
    info_file = root / "bench_info.json"
    if info_file.is_file():
        info: dict[str, Any] = json.loads(info_file.read_text())
        if info.get("commit_mb") == commit_mb:
            return info
    log = root / "_delta_log"
    log.mkdir(parents=True, exist_ok=True)
    created = [
        {"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}},
        {
            "metaData": {
                "id": str(uuid.UUID(int=1)),
                "format": {"provider": "parquet", "options": {}},
                "schemaString": json.dumps(_SCHEMA),
                "partitionColumns": ["part"],
                "configuration": {},
                "createdTime": 1_700_000_000_000,
            }
        },
        {"commitInfo": {"timestamp": 1_700_000_000_000, "operation": "CREATE TABLE"}},
    ]
    (log / f"{0:020}.json").write_text("".join(json.dumps(a) + "\n" for a in created))
    target, size, files = commit_mb * 1024 * 1024, 0, 0
    commit = log / f"{1:020}.json"
    with open(commit, "w") as out:
        while size < target:
            line = _add_line(files)
            out.write(line)
            size += len(line)
            files += 1
        out.write(json.dumps({"commitInfo": {"timestamp": 1_700_000_001_000, "operation": "WRITE"}}) + "\n")
    info = {"root": str(root), "commit_mb": commit_mb, "commit_bytes": commit.stat().st_size, "files": files}
    info_file.write_text(json.dumps(info))
    return info


def setup(clock: Clock, params: dict[str, Any]) -> dict[str, Any]:
    """Build (or reuse) the table under bench/.data."""
    clock.start()
    mb = int(params["commit_mb"])
    info = build_table(Path(params.get("data_dir", DATA)) / f"big-commit-{mb}", mb)
    clock.stop()
    return {**params, **info, "inputs": [info["root"]]}


def _memory_facts(clock: Clock, params: dict[str, Any], files: int) -> dict[str, Any]:
    grown = peak_rss_mb() - clock.marks["imported"]["rss_mb"]
    return {
        "files": files,
        "memory_x_commit": grown * 1024 * 1024 / params["commit_bytes"],
        "grown_mb": grown,
    }


def big_commit_deltamirror(clock: Clock, params: dict[str, Any]) -> dict[str, Any]:
    """Timed: ``open_table(root).snapshot()`` until its file list is in Arrow."""
    from deltamirror.core.table import open_table

    clock.imported()
    clock.start()
    files = open_table(params["root"]).snapshot().files.num_rows
    clock.stop()
    return _memory_facts(clock, params, files)


def big_commit_delta_rs(clock: Clock, params: dict[str, Any]) -> dict[str, Any]:
    """Timed: ``DeltaTable(root)`` + ``get_add_actions()``."""
    from deltalake import DeltaTable

    clock.imported()
    clock.start()
    files = DeltaTable(params["root"]).get_add_actions().num_rows
    clock.stop()
    return _memory_facts(clock, params, int(files))
