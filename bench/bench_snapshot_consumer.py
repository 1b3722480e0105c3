"""The snapshot consumer on a 1M-file table: apply rate with the state saved as a Delta checkpoint at
its interval, what one save costs, and a restart (loading the saved state) in a fresh process.

1. State: core's snapshot of the synthetic table (``make_checkpoint_table``: 1M files in a
   checkpoint, 100 commits after it) at its checkpoint version becomes the consumer's state.
2. Apply rate: the table's commits after the checkpoint, as the watcher's events (without Kafka),
   given to ``SnapshotConsumer.handle``, one version per batch with ``checkpoint()`` after each, for
   ``checkpoint_interval_versions`` None (never saved: applying alone), 100 (the default) and 10.
   Reported: versions/s and actions/s including the saves, the number of saves and their time.
3. Restart: ``StateStore(dir).load_all()`` of the state saved by the interval-100 run (version
   checkpoint + 100), each in a fresh process (imports excluded), median of ``--reps`` after one
   warm-up: wall time, CPU time (all threads), peak RSS. The loaded files must be the generator's
   active-file count, and (once, in the parent) the same replay keys as core's snapshot at that
   version, or the script exits non-zero.

The machine may be shared: the load average is printed; CPU time is the steadier figure.

    python bench/bench_snapshot_consumer.py [--files 1000000] [--commits 100] [--reps 5]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
RESULTS = BENCH / "results" / "snapshot-consumer.json"
TOPIC = "bench.actions"
sys.path.insert(0, str(BENCH))

from bench_snapshot import _cpu_s, _rss_mb  # noqa: E402
from make_checkpoint_table import DATA, ensure_table  # noqa: E402

INTERVALS: tuple[int | None, ...] = (None, 100, 10)


# --- child side: one restart in a fresh process ---------------------------------------------------


def _child(state_dir: str) -> dict[str, Any]:
    from deltamirror.consumer.snapshot import StateStore

    imported_rss = _rss_mb()
    cpu = _cpu_s()
    t0 = time.perf_counter()
    tables, _ = StateStore(state_dir, TOPIC).load_all()
    total = time.perf_counter() - t0
    (state,) = tables.values()
    return {
        "total_s": total,
        "cpu_s": _cpu_s() - cpu,
        "files": state.file_count,
        "version": state.version,
        "import_rss_mb": imported_rss,
        "peak_rss_mb": _rss_mb(),
    }


def _run_child(state_dir: Path) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", str(state_dir)], check=True, capture_output=True, text=True
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


# --- parent side ----------------------------------------------------------------------------------


def _initial_state(root: str, version: int) -> Any:
    """core's snapshot at ``version`` as the consumer's state (the actions as JSON, as published)."""
    from deltamirror.consumer.snapshot import IncrementalSnapshot
    from deltamirror.core.table import open_table

    snap = open_table(root).snapshot(version)
    state = IncrementalSnapshot(snap.metadata.id, f"file://{root}")
    document = state.document() | {
        "version": snap.version,
        "complete": True,
        "metaData": json.loads(snap.metadata.model_dump_json(by_alias=True, exclude_none=True)),
        "protocol": json.loads(snap.protocol.model_dump_json(by_alias=True, exclude_none=True)),
    }
    return IncrementalSnapshot.from_document(document, snap.files)


def _apply_run(
    state: Any, versions: list[list[bytes]], interval: int | None, state_dir: Path
) -> dict[str, Any]:
    from deltamirror.consumer.snapshot import IncrementalSnapshot, SnapshotConsumer

    consumer = SnapshotConsumer(
        "unused:9092",
        TOPIC,
        state_dir=state_dir,
        checkpoint_interval_versions=interval,
        checkpoint_interval_s=None,
    )
    # the same starting state each run (its Arrow files are shared, never changed in place)
    consumer.tables[state.table_id] = IncrementalSnapshot.from_document(state.document(), state.files)
    offset = 0
    save_s = 0.0
    actions = 0
    cpu = _cpu_s()
    t0 = time.perf_counter()
    for records in versions:
        for value in records:
            consumer.handle(TOPIC, 0, offset, value)
            offset += 1
        actions += len(records)
        saves = consumer.saves
        s0 = time.perf_counter()
        consumer.checkpoint()
        if consumer.saves > saves:
            save_s += time.perf_counter() - s0
    total = time.perf_counter() - t0
    return {
        "interval_versions": interval,
        "versions": len(versions),
        "actions": actions,
        "total_s": total,
        "cpu_s": _cpu_s() - cpu,
        "versions_per_s": len(versions) / total,
        "actions_per_s": actions / total,
        "saves": consumer.saves,
        "save_s": save_s,
        "files": consumer.tables[state.table_id].file_count,
        "version": consumer.tables[state.table_id].version,
    }


def _same_keys(state_dir: Path, root: str, version: int) -> bool:
    from deltamirror.consumer.snapshot import StateStore
    from deltamirror.core.replay import file_keys
    from deltamirror.core.table import open_table

    (state,) = StateStore(state_dir, TOPIC).load_all()[0].values()
    snap = open_table(root).snapshot(version)
    ours = file_keys(state.files["path"], state.files["deletionVector"]).sort()
    theirs = file_keys(snap.files["path"], snap.files["deletionVector"]).sort()
    return state.version == version and bool(ours.equals(theirs))


def _versions() -> dict[str, str]:
    from importlib.metadata import version

    return {p: version(p) for p in ("pyarrow", "deltamirror")} | {"python": platform.python_version()}


def _markdown(apply: list[dict[str, Any]], restart: dict[str, Any], save: dict[str, Any]) -> str:
    lines = [
        "| checkpoint_interval_versions | versions/s | actions/s | saves | time in saves |",
        "|---|---:|---:|---:|---:|",
    ]
    for run in apply:
        interval = run["interval_versions"] if run["interval_versions"] is not None else "None (no save)"
        lines.append(
            f"| {interval} | {run['versions_per_s']:.1f} | {run['actions_per_s']:.0f} | {run['saves']} "
            f"| {run['save_s']:.2f} s |"
        )
    lines += [
        "",
        "| 1M-file state | wall (median) | CPU | peak RSS | size |",
        "|---|---:|---:|---:|---:|",
        f"| save (checkpoint + marker + hint + offsets) | {save['total_s']:.2f} s | {save['cpu_s']:.2f} s | | "
        f"{save['size_mb']:.0f} MB |",
        f"| restart (StateStore.load_all, fresh process) | {restart['total_s']:.3f} s | {restart['cpu_s']:.2f} s "
        f"| {restart['peak_rss_mb']:.0f} MB | |",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--files", type=int, default=1_000_000)
    parser.add_argument("--commits", type=int, default=100)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--data-dir", type=Path, default=DATA)
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--child", metavar="STATE_DIR", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.child:
        print(json.dumps(_child(args.child)))
        return 0

    from deltamirror.consumer.snapshot import StateStore
    from deltamirror.producer.offline_events import iter_event_values

    manifest = ensure_table(args.files, args.commits, data_dir=args.data_dir)
    root, start, latest = manifest["root"], manifest["checkpoint_version"], manifest["version"]
    load_before = os.getloadavg()
    state = _initial_state(root, start)
    by_version: dict[int, list[bytes]] = {}
    for value in iter_event_values(root, starting_version=start + 1):
        by_version.setdefault(json.loads(value)["version"], []).append(value)
    versions = [by_version[v] for v in sorted(by_version)]

    work = Path(tempfile.mkdtemp(prefix="bench-snapshot-consumer-"))
    try:
        saves = []
        for i in range(2):  # one save of the whole state, twice (the second with a warm page cache)
            store = StateStore(work / f"save-{i}", TOPIC)
            cpu, t0 = _cpu_s(), time.perf_counter()
            store.save([state], {0: 0})
            saves.append({"total_s": time.perf_counter() - t0, "cpu_s": _cpu_s() - cpu})
        folder = store.folder(state.table_id) / "_delta_log"
        size_mb = sum(p.stat().st_size for p in folder.iterdir()) / 2**20
        save = {**saves[-1], "size_mb": size_mb, "runs": saves}

        apply = [_apply_run(state, versions, interval, work / f"apply-{interval}") for interval in INTERVALS]
        saved_dir = work / "apply-100"
        agree = _same_keys(saved_dir, root, latest) and all(
            r["files"] == manifest["active_files"] and r["version"] == latest for r in apply
        )
        _run_child(saved_dir)  # warm-up
        runs = [_run_child(saved_dir) for _ in range(args.reps)]
        agree = agree and all(r["files"] == manifest["active_files"] and r["version"] == latest for r in runs)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    load_after = os.getloadavg()
    restart = {k: statistics.median(r[k] for r in runs) for k in ("total_s", "cpu_s", "peak_rss_mb")}
    restart["runs"] = runs
    print(
        f"state: {manifest['active_files']} files, versions {start} -> {latest} ({len(versions)} versions, "
        f"{sum(map(len, versions))} actions); {args.reps} restarts after a warm-up; {os.cpu_count()} CPUs, "
        f"load avg {load_before[0]:.1f} -> {load_after[0]:.1f}\n"
    )
    print(_markdown(apply, restart, save))
    report = {
        "table": manifest,
        "reps": args.reps,
        "cpus": os.cpu_count(),
        "load_avg_before": load_before,
        "load_avg_after": load_after,
        "versions": _versions(),
        "state_matches_core": agree,
        "apply": apply,
        "save": save,
        "restart": restart,
        "markdown": _markdown(apply, restart, save),
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {args.output}")
    if not agree:
        print("MISMATCH: the saved or loaded state is not core's snapshot", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
