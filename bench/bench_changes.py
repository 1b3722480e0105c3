"""Reading a change data feed of >= 1M changed rows over >= 1,000 versions: deltamirror beside
delta-rs (``load_cdf``) and delta-spark (batch ``readChangeFeed``).

The table (built once under bench/.data/changes, ``--rebuild`` to redo it) is written by delta-rs:
appends (inserts from ``add`` actions), UPDATEs and DELETEs (change data files, with
update_preimage/postimage and delete rows). delta-rs cannot write deletion vectors, so the last
commits are written here by hand as delta-spark would: the protocol gains the deletionVectors
feature, then each DV DELETE removes a file and adds it back with a deletion vector (a DV file in
the documented format), which the change feed must turn into exactly the newly deleted rows.

Each reader runs in a fresh Python process (peak RSS = ``VmHWM`` of that process; for delta-spark,
of the JVM). Time is wall time of reading every row (imports and the JVM start excluded; the JVM
start is reported separately; delta-spark computes a count and a hash of every column in one pass).
After a warm-up round, ``--reps`` rounds run the readers in turn and the medians are reported;
delta-spark, which takes minutes, runs once. Row counts must agree, or the script exits non-zero (delta-rs is
compared on the versions before the DV commits when it cannot read those).

    python bench/bench_changes.py [--versions 1000] [--rows-per-append 1500] [--reps 3] [--no-spark]
                                  [--output PATH]

Results: a table on stdout and bench/results/changes.json (with --no-spark, by default
bench/results/changes-no-spark.json, so that a run without delta-spark never replaces its numbers).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import struct
import subprocess
import sys
import time
import uuid
import zlib
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
DATA = BENCH / ".data" / "changes"
RESULTS = BENCH / "results" / "changes.json"
RESULTS_NO_SPARK = BENCH / "results" / "changes-no-spark.json"
READERS = ("deltamirror", "delta-rs", "delta-spark")
DV_MAGIC = 1681511377


# --- building the table -------------------------------------------------------------------------


def _commit(path: Path, version: int, actions: list[dict[str, Any]]) -> None:
    target = path / "_delta_log" / f"{version:020d}.json"
    with open(target, "x") as fh:  # never overwrite a commit
        fh.write("".join(json.dumps(a) + "\n" for a in actions))


def _dv_bitmap(rows: list[int]) -> bytes:
    """LE magic + portable 64-bit Roaring with one 32-bit bucket (rows < 2**32), by hand.

    Array containers only (at most 4096 values per 16-bit chunk), as the documented format allows.
    """
    chunks: dict[int, list[int]] = {}
    for r in sorted(set(rows)):
        chunks.setdefault(r >> 16, []).append(r & 0xFFFF)
    keys = sorted(chunks)
    body = bytearray(struct.pack("<II", 12346, len(keys)))  # SERIAL_COOKIE_NO_RUNCONTAINER, count
    for k in keys:
        body += struct.pack("<HH", k, len(chunks[k]) - 1)
    offset = len(body) + 4 * len(keys)
    for k in keys:
        body += struct.pack("<I", offset)
        offset += 2 * len(chunks[k])
    for k in keys:
        body += struct.pack(f"<{len(chunks[k])}H", *chunks[k])
    return struct.pack("<I", DV_MAGIC) + struct.pack("<Q", 1) + struct.pack("<I", 0) + bytes(body)


def build_table(path: Path, versions: int, rows_per_append: int, seed: int = 7) -> dict[str, Any]:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from deltalake import DeltaTable, write_deltalake

    if path.exists():
        shutil.rmtree(path)
    rng = random.Random(seed)
    next_id = 0

    def batch(n: int) -> pa.Table:
        nonlocal next_id
        ids = pa.array(range(next_id, next_id + n), pa.int64())
        next_id += n
        return pa.table(
            {
                "id": ids,
                "val": pa.array([f"v{i}" for i in range(ids[0].as_py(), ids[0].as_py() + n)]),
                "n": pa.array([rng.randrange(1000) for _ in range(n)], pa.int64()),
                "ts": pa.array([1_700_000_000_000_000 + i for i in range(n)], pa.timestamp("us", tz="UTC")),
            }
        )

    dv_versions = max(versions // 20, 10)
    rs_versions = versions - dv_versions - 1  # one protocol-upgrade commit before the DV deletes
    write_deltalake(
        str(path),
        batch(rows_per_append),
        configuration={"delta.enableChangeDataFeed": "true"},
    )
    table = DeltaTable(str(path))
    started = time.perf_counter()
    for v in range(1, rs_versions):
        roll = rng.random()
        if roll < 0.70 or next_id < 10 * rows_per_append:
            write_deltalake(table, batch(rows_per_append), mode="append")
        elif roll < 0.93:
            lo = rng.randrange(0, next_id - rows_per_append)
            table.update(predicate=f"id >= {lo} AND id < {lo + rows_per_append}", updates={"n": "n + 1"})
        else:
            lo = rng.randrange(0, next_id - rows_per_append)
            table.delete(predicate=f"id >= {lo} AND id < {lo + rows_per_append // 3}")
        if v % 100 == 0:
            print(
                f"  built {v}/{rs_versions} delta-rs versions ({time.perf_counter() - started:.0f} s)",
                flush=True,
            )
    last_rs = table.version()

    # protocol upgrade for deletion vectors (as ALTER TABLE SET TBLPROPERTIES would write it)
    meta = None
    for line in (path / "_delta_log" / f"{0:020d}.json").read_text().splitlines():
        if line.strip() and "metaData" in json.loads(line):
            meta = json.loads(line)["metaData"]
    assert meta is not None
    meta["configuration"] = {**meta["configuration"], "delta.enableDeletionVectors": "true"}
    version = last_rs + 1
    now = int(time.time() * 1000)
    _commit(
        path,
        version,
        [
            {"commitInfo": {"timestamp": now, "operation": "SET TBLPROPERTIES"}},
            {
                "protocol": {
                    "minReaderVersion": 3,
                    "minWriterVersion": 7,
                    "readerFeatures": ["deletionVectors"],
                    "writerFeatures": ["deletionVectors", "changeDataFeed", "appendOnly", "invariants"],
                }
            },
            {"metaData": meta},
        ],
    )

    # DV deletes: remove a live file, add it back with a DV that deletes a few hundred more rows
    actions = pa.table(DeltaTable(str(path), version=last_rs).get_add_actions(flatten=True))
    live = {f["path"]: f for f in actions.select(["path", "size_bytes"]).to_pylist()}
    dv_of: dict[str, tuple[list[int], dict[str, Any] | None]] = {}
    dv_rows = 0
    for _ in range(dv_versions):
        version += 1
        file_path = rng.choice(sorted(live))
        add = live[file_path]
        num_rows = pq.ParquetFile(path / file_path).metadata.num_rows
        deleted, old_dv = dv_of.get(file_path, ([], None))
        alive = sorted(set(range(num_rows)) - set(deleted))
        newly = rng.sample(alive, min(len(alive) // 2, 300))
        rows = sorted(set(deleted) | set(newly))
        bitmap = _dv_bitmap(rows)
        dv_file = f"deletion_vector_{uuid.uuid4()}.bin"
        blob = b"\x01" + struct.pack(">i", len(bitmap)) + bitmap + struct.pack(">I", zlib.crc32(bitmap))
        (path / dv_file).write_bytes(blob)
        descriptor = {
            "storageType": "p",
            "pathOrInlineDv": (path / dv_file).as_uri(),
            "offset": 1,
            "sizeInBytes": len(bitmap),
            "cardinality": len(rows),
        }
        now = int(time.time() * 1000)
        remove = {
            "path": file_path,
            "deletionTimestamp": now,
            "dataChange": True,
            "extendedFileMetadata": True,
            "partitionValues": {},
            "size": add["size_bytes"],
        }
        if old_dv is not None:
            remove["deletionVector"] = old_dv
        new_add = {
            "path": file_path,
            "partitionValues": {},
            "size": add["size_bytes"],
            "modificationTime": now,
            "dataChange": True,
            "deletionVector": descriptor,
        }
        _commit(
            path,
            version,
            [
                {"commitInfo": {"timestamp": now, "operation": "DELETE", "operationParameters": {}}},
                {"remove": remove},
                {"add": new_add},
            ],
        )
        dv_of[file_path] = (rows, descriptor)
        dv_rows += len(newly)
    info = {
        "versions": version + 1,
        "last_delta_rs_version": last_rs,
        "dv_commits": dv_versions,
        "dv_rows": dv_rows,
    }
    (path / "bench_info.json").write_text(json.dumps(info))
    return info


# --- contenders: each a function bench/run.py runs in a fresh process (harness.Clock) ---------------


def setup(clock: Any, params: dict[str, Any]) -> dict[str, Any]:
    """The change-feed table (built once per size, cached under bench/.data) and the floor's file list.

    The floor reads what a change feed over every version must read at least: the change data
    files of the versions that have them, else the data files added or removed with dataChange.
    """
    versions, per_append = params["versions"], params["rows_per_append"]
    path = (
        DATA if (versions, per_append) == (1000, 1500) else DATA.with_name(f"changes-{versions}x{per_append}")
    )
    clock.start()
    info_file = path / "bench_info.json"
    if params.get("rebuild") or not info_file.exists():
        build_table(path, versions, per_append)
    info = json.loads(info_file.read_text())
    data_files, change_files = _floor_files(path)
    clock.stop()
    return {
        **params,
        **info,
        "path": str(path),
        "data_files": data_files,
        "change_files": change_files,
        "inputs": [str(path)],
    }


def _floor_files(path: Path) -> tuple[list[str], list[str]]:
    from urllib.parse import unquote

    data: list[str] = []
    changes: list[str] = []
    for commit in sorted((path / "_delta_log").glob("*.json")):
        actions = [json.loads(line) for line in commit.read_text().splitlines() if line.strip()]
        cdc = [a["cdc"]["path"] for a in actions if "cdc" in a]
        if cdc:
            changes += cdc
            continue
        for a in actions:
            for kind in ("add", "remove"):
                if kind in a and a[kind].get("dataChange", True):
                    data.append(a[kind]["path"])
    return [str(path / unquote(p)) for p in data], [str(path / unquote(p)) for p in changes]


def changes_deltamirror(clock: Any, params: dict[str, Any]) -> dict[str, Any]:
    """Timed: ``read_changes(open_table(path), starting_version=0)``, every batch consumed."""
    from deltamirror.core import open_table
    from deltamirror.core.changes import read_changes

    clock.imported()
    clock.start()
    feed = read_changes(open_table(params["path"]), starting_version=0, ending_version=params.get("end"))
    rows = sum(b.num_rows for b in feed)
    clock.stop()
    return {"rows": rows}


def changes_delta_rs(clock: Any, params: dict[str, Any]) -> dict[str, Any]:
    """Timed: ``DeltaTable(path).load_cdf(starting_version=0)``, every batch of the reader consumed."""
    from deltalake import DeltaTable

    clock.imported()
    clock.start()
    stream = DeltaTable(params["path"]).load_cdf(starting_version=0, ending_version=params.get("end"))
    rows = 0
    for b in stream:
        rows += b.num_rows
    clock.stop()
    return {"rows": rows}


#: the projection of the projected contenders: two of the table's four columns (the string ``val``
#: and the timestamp ``ts`` are left out), the change-feed columns always following
PROJECTED = ("id", "n")
CDF_COLUMNS = ("_change_type", "_commit_version", "_commit_timestamp")


def changes_projected_deltamirror(clock: Any, params: dict[str, Any]) -> dict[str, Any]:
    """Timed: ``read_changes(open_table(path), starting_version=0, columns=["id", "n"])``, every batch
    consumed (the named columns, then ``_change_type``, ``_commit_version``, ``_commit_timestamp``)."""
    from deltamirror.core import open_table
    from deltamirror.core.changes import read_changes

    clock.imported()
    clock.start()
    feed = read_changes(
        open_table(params["path"]),
        starting_version=0,
        ending_version=params.get("end"),
        columns=list(params.get("columns", PROJECTED)),
    )
    rows = columns = 0
    for b in feed:
        rows += b.num_rows
        columns = b.num_columns
    clock.stop()
    return {"rows": rows, "columns": columns}


def changes_projected_delta_rs(clock: Any, params: dict[str, Any]) -> dict[str, Any]:
    """Timed: ``DeltaTable(path).load_cdf(starting_version=0, columns=["id", "n", "_change_type",
    "_commit_version", "_commit_timestamp"])`` (delta-rs keeps only the columns named, change-feed
    columns included), every batch of the reader consumed."""
    from deltalake import DeltaTable

    clock.imported()
    clock.start()
    stream = DeltaTable(params["path"]).load_cdf(
        starting_version=0,
        ending_version=params.get("end"),
        columns=[*params.get("columns", PROJECTED), *CDF_COLUMNS],
    )
    rows = columns = 0
    for b in stream:
        rows += b.num_rows
        columns = b.num_columns
    clock.stop()
    return {"rows": rows, "columns": columns}


def changes_pyarrow(clock: Any, params: dict[str, Any]) -> dict[str, Any]:
    """The floor. Timed: pyarrow.dataset reading every file of the floor's list (multi-threaded).

    Two datasets (data files; change data files, which have ``_change_type`` too), every column.
    """
    import pyarrow.dataset as ds

    clock.imported()
    clock.start()
    rows = 0
    for files in (params["data_files"], params["change_files"]):
        if files:
            for batch in ds.dataset(files, format="parquet").to_batches():
                rows += batch.num_rows
    clock.stop()
    return {"rows_read": rows, "files": len(params["data_files"]) + len(params["change_files"])}


# --- child side: one read in a fresh process ----------------------------------------------------


def _peak_mb(pid: str = "self") -> float:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def child(reader: str, path: str, end: int | None) -> dict[str, Any]:
    if reader in ("deltamirror", "delta-rs"):
        sys.path.insert(0, str(BENCH))
        from harness import Clock

        clock = Clock()
        read = changes_deltamirror if reader == "deltamirror" else changes_delta_rs
        facts = read(clock, {"path": path, "end": end})
        seconds = clock.marks["stop"]["perf"] - clock.marks["start"]["perf"]
        return {"rows": facts["rows"], "seconds": seconds, "peak_mb": _peak_mb()}
    if reader == "delta-spark":
        sys.path.insert(0, str(REPO / "tests"))
        from support.spark import get_spark_session, stop_spark_session

        started = time.perf_counter()
        spark = get_spark_session()
        jvm_start = time.perf_counter() - started
        started = time.perf_counter()
        reader_ = spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", 0)
        if end is not None:
            reader_ = reader_.option("endingVersion", end)
        df = reader_.load(path)
        from pyspark.sql import functions as F

        # one pass that needs every column of every row (as the other readers produce them)
        every_column = F.hash(*[F.col(f"`{c}`") for c in df.columns])
        result = df.agg(F.count(F.lit(1)).alias("rows"), F.sum(every_column)).collect()[0]
        rows = int(result["rows"])
        seconds = time.perf_counter() - started
        jvm_pid = str(spark.sparkContext._jvm.ProcessHandle.current().pid())
        peak = _peak_mb(jvm_pid)
        stop_spark_session()
        return {"rows": rows, "seconds": seconds, "peak_mb": peak, "jvm_start_seconds": jvm_start}
    raise ValueError(reader)


def run_child(reader: str, path: Path, end: int | None) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", reader, "--path", str(path)]
    if end is not None:
        cmd += ["--end", str(end)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(done.stdout.strip().splitlines()[-1])


# --- parent side --------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--versions", type=int, default=1000)
    parser.add_argument("--rows-per-append", type=int, default=1500)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--rebuild", action="store_true")
    parser.add_argument("--no-spark", action="store_true")
    parser.add_argument("--output", type=Path, help="results file (default: see the module docstring)")
    parser.add_argument("--child", choices=READERS)
    parser.add_argument("--path")
    parser.add_argument("--end", type=int)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.path, args.end)))
        return 0

    info_file = DATA / "bench_info.json"
    if args.rebuild or not info_file.exists():
        print(f"building {DATA} ({args.versions} versions) ...", flush=True)
        started = time.perf_counter()
        build_table(DATA, args.versions, args.rows_per_append)
        print(f"built in {time.perf_counter() - started:.0f} s", flush=True)
    info = json.loads(info_file.read_text())
    readers = [r for r in READERS if not (args.no_spark and r == "delta-spark")]

    results: dict[str, list[dict[str, Any]]] = {r: [] for r in readers}
    rs_range: dict[str, list[dict[str, Any]]] = {"deltamirror": [], "delta-rs": []}
    for rep in range(args.reps + 1):  # round 0 warms the page cache and is not counted
        for reader in readers:
            if reader == "delta-spark" and rep != 1:
                continue  # minutes per run: measured once (after round 0 warmed the page cache)
            result = run_child(reader, DATA, None)
            if rep:
                results[reader].append(result)
        for reader in rs_range:  # the versions delta-rs wrote (no deletion vectors)
            result = run_child(reader, DATA, info["last_delta_rs_version"])
            if rep:
                rs_range[reader].append(result)

    def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
        ok = [r for r in runs if "error" in r] == []
        if not ok:
            return {"error": next(r["error"] for r in runs if "error" in r)}
        out = {
            "rows": runs[0]["rows"],
            "seconds": statistics.median(r["seconds"] for r in runs),
            "peak_mb": statistics.median(r["peak_mb"] for r in runs),
        }
        out["rows_per_second"] = out["rows"] / out["seconds"]
        if "jvm_start_seconds" in runs[0]:
            out["jvm_start_seconds"] = statistics.median(r["jvm_start_seconds"] for r in runs)
        return out

    full = {r: summary(v) for r, v in results.items()}
    partial = {r: summary(v) for r, v in rs_range.items()}
    report = {
        "table": {**info, "path": str(DATA)},
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "reps": args.reps,
        "all_versions": full,
        "delta_rs_versions_only": partial,
    }
    output = args.output or (RESULTS_NO_SPARK if args.no_spark else RESULTS)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(report, indent=2) + "\n")

    print(
        f"\ntable: {info['versions']} versions, {info['dv_commits']} DV deletes; medians of {args.reps} runs"
    )
    for title, block in (
        ("all versions (0-latest)", full),
        (f"versions 0-{info['last_delta_rs_version']} (no DVs)", partial),
    ):
        print(f"\n{title}")
        print("| reader | rows | seconds | rows/s | peak RSS MiB |\n|---|---:|---:|---:|---:|")
        for reader, s in block.items():
            if "error" in s:
                print(f"| {reader} | error: {s['error'][:80]} | | | |")
                continue
            extra = f" (+{s['jvm_start_seconds']:.1f} s JVM start)" if "jvm_start_seconds" in s else ""
            print(
                f"| {reader} | {s['rows']:,} | {s['seconds']:.2f}{extra} | {s['rows_per_second']:,.0f} | {s['peak_mb']:.0f} |"
            )
    counts = {s["rows"] for s in full.values() if "rows" in s}
    partial_counts = {s["rows"] for s in partial.values() if "rows" in s}
    if len(counts) > 1 or len(partial_counts) > 1:
        print("ROW COUNTS DISAGREE", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
