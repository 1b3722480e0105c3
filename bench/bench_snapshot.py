"""Loading the file list of a 1M-file Delta table: deltamirror beside delta-rs and bare pyarrow.

Each measurement runs in a fresh Python process, so its peak RSS (``VmHWM``) is the cost of one
load and nothing earlier. Time is wall time around the load only (imports excluded,
reported separately as RSS after imports). After one warm-up round (page cache, lazy imports),
``--reps`` rounds run the contenders in turn, so background load hits them alike; the medians are
reported.

Contenders:
- deltamirror: ``open_table(path).snapshot()``, then ``snap.files.num_rows``;
- delta-rs: ``deltalake.DeltaTable(path)`` (which replays the log and loads the file list eagerly),
  then ``get_add_actions()`` (the file list as Arrow); both steps are timed;
- pyarrow: ``pq.read_table(checkpoint, columns=["add"])``, the floor: reading the bytes at all.

The active-file counts of deltamirror and delta-rs must equal each other and the generator's own
count, or the script exits non-zero. Results: a markdown table on stdout, bench/results/snapshot.json.

    python bench/bench_snapshot.py [--files 1000000] [--commits 100] [--reps 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
RESULTS = BENCH / "results" / "snapshot.json"
DATA = BENCH / ".data"
sys.path.insert(0, str(BENCH))

from harness import Clock  # noqa: E402  (standard library only: a child imports nothing heavy here)

CONTENDERS = ("deltamirror", "delta-rs", "pyarrow")


# --- contenders: each a function bench/run.py runs in a fresh process (harness.Clock) ---------------


def setup(clock: Clock, params: dict[str, Any]) -> dict[str, Any]:
    """The 1M-file table (make_checkpoint_table, cached under bench/.data): its root and checkpoint."""
    from make_checkpoint_table import ensure_table

    clock.start()
    manifest = ensure_table(params["files"], params["commits"], data_dir=Path(params.get("data_dir", DATA)))
    clock.stop()
    return {**params, **manifest, "inputs": [manifest["root"]]}


def snapshot_deltamirror(clock: Clock, params: dict[str, Any]) -> dict[str, Any]:
    """Timed: ``open_table(root).snapshot()`` until its file list is in Arrow (``snap.files.num_rows``)."""
    from deltamirror.core.table import open_table

    clock.imported()
    clock.start()
    snap = open_table(params["root"]).snapshot()
    files = snap.files.num_rows
    clock.stop()
    return {"files": files, "version": snap.version}


def snapshot_delta_rs(clock: Clock, params: dict[str, Any]) -> dict[str, Any]:
    """Timed: ``DeltaTable(root)`` (replays the log, loads the file list) + ``get_add_actions()``."""
    from deltalake import DeltaTable

    clock.imported()
    clock.start()
    t0 = time.perf_counter()
    dt = DeltaTable(params["root"])
    t1 = time.perf_counter()
    files = dt.get_add_actions().num_rows
    clock.stop()
    return {
        "files": int(files),
        "version": dt.version(),
        "open_s": t1 - t0,
        "file_list_s": time.perf_counter() - t1,
    }


def snapshot_pyarrow(clock: Clock, params: dict[str, Any]) -> dict[str, Any]:
    """The floor. Timed: ``pq.read_table(checkpoint, columns=["add"])``: reading the bytes at all."""
    import pyarrow.parquet as pq

    clock.imported()
    clock.start()
    rows = pq.read_table(params["checkpoint"], columns=["add"]).num_rows
    clock.stop()
    return {"rows": rows}


CONTENDER_FUNCTIONS = {
    "deltamirror": snapshot_deltamirror,
    "delta-rs": snapshot_delta_rs,
    "pyarrow": snapshot_pyarrow,
}


# --- child side: one load in a fresh process ----------------------------------------------------


def _rss_mb() -> float:
    """Peak RSS of this process so far, in MiB.

    ``VmHWM`` rather than ``getrusage().ru_maxrss``: on Linux ru_maxrss survives fork+exec, so a
    child would report its parent's high-water mark whenever the parent was bigger.
    """
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource  # not Linux: the best there is

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _cpu_s() -> float:
    """CPU seconds of this process, all threads: steadier than wall time on a shared machine."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _child(name: str, root: str, checkpoint: str) -> dict[str, Any]:
    cpu = _cpu_s()
    result = _load(name, root, checkpoint)
    result["cpu_s"] = _cpu_s() - cpu - result.pop("import_cpu_s")
    return result


def _load(name: str, root: str, checkpoint: str) -> dict[str, Any]:
    if name not in CONTENDER_FUNCTIONS:
        raise SystemExit(f"unknown contender {name!r}")
    started_cpu = _cpu_s()
    clock = Clock()
    facts = CONTENDER_FUNCTIONS[name](clock, {"root": root, "checkpoint": checkpoint})
    marks = clock.marks
    return {
        **facts,
        "total_s": marks["stop"]["perf"] - marks["start"]["perf"],
        "import_rss_mb": marks["imported"]["rss_mb"],
        "import_cpu_s": marks["imported"]["cpu"] - started_cpu,
    }


def _run_child(name: str, root: str, checkpoint: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", name, root, checkpoint],
        check=True,
        capture_output=True,
        text=True,
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


# --- parent side ------------------------------------------------------------------------------------


def _median(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in runs if key in r]
    return statistics.median(values) if values else None


def _summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ["total_s", "open_s", "file_list_s", "cpu_s", "peak_rss_mb", "import_rss_mb"]
    out: dict[str, Any] = {k: _median(runs, k) for k in keys if _median(runs, k) is not None}
    out["runs"] = runs
    return out


def _versions() -> dict[str, str]:
    from importlib.metadata import version

    return {p: version(p) for p in ("pyarrow", "deltalake", "deltamirror")} | {
        "python": platform.python_version()
    }


def _markdown(summary: dict[str, dict[str, Any]]) -> str:
    rs, arrow = summary["delta-rs"], summary["pyarrow"]
    lines = [
        "| contender | wall time (median) | vs delta-rs | vs pyarrow | CPU time | peak RSS | RSS after imports |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name in CONTENDERS:
        s = summary[name]
        t = s["total_s"]
        label = name
        if name == "delta-rs":
            label += f" (open {s['open_s']:.2f} s + get_add_actions {s['file_list_s']:.2f} s)"
        if name == "pyarrow":
            label += ' (read_table(columns=["add"]))'
        lines.append(
            f"| {label} | {t:.3f} s | {t / rs['total_s']:.2f}x | {t / arrow['total_s']:.2f}x | {s['cpu_s']:.2f} s "
            f"| {s['peak_rss_mb']:.0f} MB ({s['peak_rss_mb'] / rs['peak_rss_mb']:.2f}x delta-rs) "
            f"| {s['import_rss_mb']:.0f} MB |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--files", type=int, default=1_000_000)
    parser.add_argument("--commits", type=int, default=100)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--data-dir", type=Path, default=DATA)
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--child", nargs=3, metavar=("NAME", "ROOT", "CHECKPOINT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.child:
        result = _child(*args.child)
        result["peak_rss_mb"] = _rss_mb()
        print(json.dumps(result))
        return 0

    from make_checkpoint_table import ensure_table

    manifest = ensure_table(args.files, args.commits, data_dir=args.data_dir)
    root, checkpoint = manifest["root"], manifest["checkpoint"]
    load_before = os.getloadavg()
    for name in CONTENDERS:  # warm-up: page cache, .pyc files
        _run_child(name, root, checkpoint)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in CONTENDERS}
    for _ in range(args.reps):
        for name in CONTENDERS:
            runs[name].append(_run_child(name, root, checkpoint))
    load_after = os.getloadavg()

    counts = {
        "generator": manifest["active_files"],
        "deltamirror": {r["files"] for r in runs["deltamirror"]},
        "delta-rs": {r["files"] for r in runs["delta-rs"]},
    }
    agree = counts["deltamirror"] == counts["delta-rs"] == {manifest["active_files"]}
    summary = {name: _summary(runs[name]) for name in CONTENDERS}
    print(
        f"table: {manifest['checkpoint_files']} files in checkpoint v{manifest['checkpoint_version']} + "
        f"{manifest['commits']} commits -> {manifest['active_files']} active files at v{manifest['version']}; "
        f"{args.reps} reps after a warm-up, {os.cpu_count()} CPUs, load avg {load_before[0]:.1f} -> "
        f"{load_after[0]:.1f}\n"
    )
    print(_markdown(summary))
    print(
        f"\nactive files: deltamirror {sorted(counts['deltamirror'])}, delta-rs {sorted(counts['delta-rs'])}"
    )
    report = {
        "table": manifest,
        "reps": args.reps,
        "cpus": os.cpu_count(),
        "load_avg_before": load_before,
        "load_avg_after": load_after,
        "versions": _versions(),
        "counts_agree": agree,
        "results": summary,
        "markdown": _markdown(summary),
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2, default=sorted) + "\n")
    print(f"wrote {args.output}")
    if not agree:
        print("MISMATCH: deltamirror and delta-rs disagree on the active files", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
