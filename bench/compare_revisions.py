"""Did this change make deltamirror slower? Two revisions of this repo, timed the way the project asks.

Each contender runs in its own process from its own tree: a revision is checked out with
``git worktree add --detach /tmp/dm-rev-<sha>`` (reused when present) and imported through a link
tree ``/tmp/dm-rev-<sha>-site/deltamirror/{core,mirror,ops,producer,consumer,cli}`` (``deltamirror``
stays a namespace package); ``worktree`` means /work/main as it is now. The child drops every other
``sys.path`` entry that holds a ``deltamirror`` (the editable install), warms up once, times one
call (``perf_counter`` and ``process_time``; its peak RSS, warm-up included, and RSS after imports
are reported beside) and fails unless every ``deltamirror`` module it
loaded lies in its tree.

Contenders alternate, the order turning each round, so background load hits both alike; the
verdict is the median of the per-round ratios new / base, with their IQR and min-max, next to the
load average before and after and the raw seconds of every round.

Workloads (tables cached under bench/.data, built by the benches' own generators when missing):
  snapshot  open_table(T).snapshot() and its file list (Arrow) of bench_snapshot.py's 1M-file table
  changes   read_changes over the whole range of bench_changes.py's CDF table, every batch consumed
  changes-columns  the same, projected to columns id and n (the bench's change-feed-columns group)
  scan      iter_event_values (producer.offline_events, else producer.service) over
            bench_producer.py's 200k-action log, every value consumed
  rows      the JSON row-change records (format json, key column id) of two versions of 200k
            generated rows each: inserts, then an update of every row (pre- and post-images, paired
            into "u" events in memory); VersionRows alone, no table, no Kafka

    python bench/compare_revisions.py [--base HEAD] [--new worktree] [--rounds 7]
                                      [--workload snapshot --workload scan ...]

Results: a markdown table on stdout and bench/results/compare-<workload>.json.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
DATA = BENCH / ".data"
RESULTS = BENCH / "results"
PACKAGES = ("core", "mirror", "ops", "producer", "consumer", "cli")
WORKLOADS = ("snapshot", "changes", "changes-columns", "scan", "rows")
#: the rows workload: change rows per version (an insert version, then an update of every row)
ROWS = 200_000
SCAN_MODULES = ("deltamirror.producer.publishing.offline_events", "deltamirror.producer.service")


# --- child side: one workload, one tree, one process ----------------------------------------------


def _isolate(site: str) -> None:
    """Only ``site`` may provide deltamirror: else a module missing from an old revision would be
    picked up silently from the editable install of the working tree."""
    sys.path[:] = [
        p for p in sys.path if p == site or not os.path.isdir(os.path.join(p or ".", "deltamirror"))
    ]


def _find_iter_event_values() -> tuple[Any, str]:
    """The offline encoder, from whichever producer module has it in this revision."""
    import importlib

    for name in SCAN_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise  # the module is there but broken: not a reason to time another one
            continue
        if hasattr(module, "iter_event_values"):
            return module.iter_event_values, name
    raise SystemExit(f"no iter_event_values in {', '.join(SCAN_MODULES)}")


def _driver(workload: str, root: str) -> tuple[Any, str]:
    """The call to time, and the module it comes from."""
    if workload == "snapshot":
        from deltamirror.core.table import open_table

        def snapshot() -> dict[str, int]:
            snap = open_table(root).snapshot()
            return {"files": snap.files.num_rows, "version": snap.version}

        return snapshot, "deltamirror.core.table"
    if workload == "changes":
        from deltamirror.core import open_table
        from deltamirror.core.changes import read_changes

        def changes() -> dict[str, int]:
            return {"rows": sum(b.num_rows for b in read_changes(open_table(root), starting_version=0))}

        return changes, "deltamirror.core.changes"
    if workload == "changes-columns":
        from deltamirror.core import open_table
        from deltamirror.core.changes import read_changes

        def changes_columns() -> dict[str, int]:
            feed = read_changes(open_table(root), starting_version=0, columns=["id", "n"])
            return {"rows": sum(b.num_rows for b in feed)}

        return changes_columns, "deltamirror.core.changes"
    if workload == "scan":
        iter_event_values, name = _find_iter_event_values()

        def scan() -> dict[str, int]:
            records = size = 0
            for value in iter_event_values(root):
                records += 1
                size += len(value)
            return {"records": records, "bytes": size}

        return scan, name
    if workload == "rows":
        return _rows_driver(), "deltamirror.mirror.records.row_changes"
    raise SystemExit(f"unknown workload {workload!r}")


def _rows_driver() -> Any:
    import datetime
    from decimal import Decimal

    import pyarrow as pa

    from deltamirror.mirror.records.row_changes import RowChangesOptions, VersionRows

    n = ROWS
    ids = pa.array(range(n), pa.int64())
    columns = {
        "id": ids,
        "name": pa.array([f"name {i}" for i in range(n)]),
        "price": pa.array([Decimal(i) / 100 for i in range(n)], pa.decimal128(12, 2)),
        "at": pa.array([datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)] * n, pa.timestamp("us", "UTC")),
        "score": pa.array([i * 0.5 for i in range(n)], pa.float64()),
    }
    inserts = pa.table({**columns, "_change_type": pa.array(["insert"] * n)})
    pre = pa.table({**columns, "_change_type": pa.array(["update_preimage"] * n)})
    post = pa.table(
        {
            **columns,
            "score": pa.array([i * 0.5 + 1 for i in range(n)]),
            "_change_type": pa.array(["update_postimage"] * n),
        }
    )
    updates = pa.concat_tables([post, pre])  # every post-image before its pre-image, as delta-rs writes them
    options = RowChangesOptions("b.changes", "b.transaction", "b", "tid", key_columns=("id",))

    def rows() -> dict[str, int]:
        records = size = 0
        for version, table in ((0, inserts), (1, updates)):
            batches = table.to_batches(max_chunksize=8192)
            for chunk in VersionRows(options, lambda b=batches: b, version=version, ts_ms=1).records():
                for r in chunk:
                    records += 1
                    size += len(r.value or b"") + len(r.key or b"")
        return {"records": records, "bytes": size}

    return rows


def _inside(file: str, tree: str) -> bool:
    return os.path.realpath(file).startswith(tree + os.sep)


def _status_mb(key: str) -> float:
    """A ``/proc/self/status`` figure (VmHWM: peak RSS, warm-up included) in MB."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def child(workload: str, tree: str, site: str, root: str) -> int:
    _isolate(site)
    call, module = _driver(workload, root)
    rss_after_imports = _status_mb("VmRSS")
    t0 = time.perf_counter()
    call()  # warm-up: page cache, lazy imports, .pyc files
    warmup_s = time.perf_counter() - t0
    cpu0, t0 = time.process_time(), time.perf_counter()
    check = call()
    seconds, cpu_s = time.perf_counter() - t0, time.process_time() - cpu0
    import deltamirror.core

    core_file = os.path.realpath(str(deltamirror.core.__file__))
    files = {name: getattr(mod, "__file__", None) for name, mod in list(sys.modules.items())}
    stray = [n for n, f in files.items() if n.startswith("deltamirror.") and f and not _inside(f, tree)]
    result = {"seconds": seconds, "cpu_s": cpu_s, "warmup_s": warmup_s, "check": check}
    result |= {"peak_rss_mb": _status_mb("VmHWM"), "rss_after_imports_mb": rss_after_imports}
    result |= {"module": module, "core_file": core_file}
    print(json.dumps(result))
    if stray:
        print(f"modules loaded from outside {tree}: {', '.join(stray)}", file=sys.stderr)
        return 3
    return 0


# --- parent side -------------------------------------------------------------------------------------


@dataclass
class Contender:
    role: str  # "base" or "new"
    rev: str  # as given: a revision or "worktree"
    sha: str | None
    tree: Path
    site: Path


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(REPO), *args], check=True, capture_output=True, text=True
    ).stdout.strip()


def _link_tree(tree: Path, site: Path) -> None:
    package = site / "deltamirror"
    package.mkdir(parents=True, exist_ok=True)
    if (package / "__init__.py").exists():
        raise SystemExit(f"{package} must stay a namespace package: remove its __init__.py")
    for name in PACKAGES:
        link, target = package / name, tree / name
        if link.is_symlink():
            link.unlink()
        if (target / "__init__.py").is_file():
            link.symlink_to(target, target_is_directory=True)


def contender(role: str, rev: str) -> Contender:
    if rev == "worktree":
        sha, tree, site = None, REPO, Path("/tmp/dm-rev-worktree-site")
    else:
        sha = _git("rev-parse", "--verify", f"{rev}^{{commit}}")
        tree = Path(f"/tmp/dm-rev-{sha[:12]}")
        site = Path(f"{tree}-site")
        if not (tree / ".git").exists():
            _git("worktree", "add", "--detach", str(tree), sha)
        head = subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True, text=True)
        if head.stdout.strip() != sha:
            raise SystemExit(f"{tree} is not a checkout of {sha}: remove it (git worktree remove {tree})")
    _link_tree(tree.resolve(), site)
    return Contender(role, rev, sha, tree.resolve(), site)


def ensure_data(workload: str) -> str:
    """The table a workload reads, built by its bench's own generator the first time."""
    sys.path.insert(0, str(BENCH))
    if workload == "snapshot":
        from make_checkpoint_table import ensure_table

        return str(ensure_table(1_000_000, 100)["root"])
    if workload in ("changes", "changes-columns"):
        if not (DATA / "changes" / "bench_info.json").is_file():
            from bench_changes import build_table

            build_table(DATA / "changes", 1000, 1500)
        return str(DATA / "changes")
    if workload == "rows":
        return ""  # generated in the child
    if (DATA / "producer" / "table-200x1000" / "bench-manifest.json").is_file():
        return str(DATA / "producer" / "table-200x1000")  # as bench_producer names it: no import needed
    from bench_producer import ensure_table as ensure_producer_table

    return str(ensure_producer_table(200_000, 200, DATA / "producer")["root"])


def run_child(c: Contender, workload: str, root: str) -> dict[str, Any]:
    python = REPO / ".venv" / "bin" / "python"
    cmd = [str(python if python.exists() else sys.executable), __file__, "--child", workload]
    cmd += [str(c.tree), str(c.site), root]
    env = {**os.environ, "PYTHONPATH": str(c.site)}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=BENCH)
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-8:])
        raise SystemExit(f"{workload} on {c.role} ({c.rev}) failed (exit {done.returncode}):\n{tail}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    if not _inside(result["core_file"], str(c.tree)):
        raise SystemExit(f"{c.role} imported deltamirror.core from {result['core_file']}, not {c.tree}")
    return result


def measure(workload: str, contenders: list[Contender], rounds: int) -> dict[str, Any]:
    root = ensure_data(workload)
    load_before = os.getloadavg()
    runs: list[dict[str, Any]] = []
    for r in range(rounds):
        order = contenders[r % 2 :] + contenders[: r % 2]  # rotate: neither always runs first
        got = {}
        for c in order:
            got[c.role] = run_child(c, workload, root)
            print(
                f"  {workload} round {r + 1}/{rounds} {c.role}: {got[c.role]['seconds']:.3f} s",
                file=sys.stderr,
            )
        base, new = got["base"], got["new"]
        runs.append(
            {
                "order": [c.role for c in order],
                "base": base,
                "new": new,
                "ratio": new["seconds"] / base["seconds"],
                "cpu_ratio": new["cpu_s"] / base["cpu_s"],
                "peak_rss_ratio": new["peak_rss_mb"] / base["peak_rss_mb"],
            }
        )
    ratios = [run["ratio"] for run in runs]
    q1, _, q3 = statistics.quantiles(ratios, n=4, method="inclusive") if len(ratios) > 1 else ratios * 3
    return {
        "workload": workload,
        "table": root,
        "rounds": rounds,
        "contenders": {c.role: {"rev": c.rev, "sha": c.sha, "tree": str(c.tree)} for c in contenders},
        "modules": {role: runs[0][role]["module"] for role in ("base", "new")},
        "median_ratio": statistics.median(ratios),
        "iqr": [q1, q3],
        "min_max": [min(ratios), max(ratios)],
        "median_cpu_ratio": statistics.median(run["cpu_ratio"] for run in runs),
        "median_peak_rss_ratio": statistics.median(run["peak_rss_ratio"] for run in runs),
        "median_peak_rss_mb": {
            role: statistics.median(run[role]["peak_rss_mb"] for run in runs) for role in ("base", "new")
        },
        "median_rss_after_imports_mb": {
            role: statistics.median(run[role]["rss_after_imports_mb"] for run in runs)
            for role in ("base", "new")
        },
        "median_seconds": {
            role: statistics.median(run[role]["seconds"] for run in runs) for role in ("base", "new")
        },
        "same_output": all(run["base"]["check"] == run["new"]["check"] for run in runs),
        "load_avg_before": list(load_before),
        "load_avg_after": list(os.getloadavg()),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "runs": runs,
    }


def markdown(results: list[dict[str, Any]]) -> str:
    first = results[0]["contenders"]
    label = {role: f"{c['rev']}" + (f" ({c['sha'][:9]})" if c["sha"] else "") for role, c in first.items()}
    lines = [
        f"base = {label['base']}, new = {label['new']}; {results[0]['rounds']} rounds, order rotated, "
        f"{os.cpu_count()} CPUs. Ratio = new / base per round (> 1: new is slower).",
        "",
        "| workload | base s | new s | new/base (median) | IQR | min-max | CPU new/base | peak RSS base / new MB (new/base) | load 1 min before -> after | same output |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for res in results:
        s, (q1, q3), (lo, hi) = res["median_seconds"], res["iqr"], res["min_max"]
        rss = res["median_peak_rss_mb"]
        load = f"{res['load_avg_before'][0]:.2f} -> {res['load_avg_after'][0]:.2f}"
        lines.append(
            f"| {res['workload']} | {s['base']:.3f} | {s['new']:.3f} | **{res['median_ratio']:.3f}** | "
            f"{q1:.3f}-{q3:.3f} | {lo:.3f}-{hi:.3f} | {res['median_cpu_ratio']:.3f} | "
            f"{rss['base']:.1f} / {rss['new']:.1f} ({res['median_peak_rss_ratio']:.3f}) | {load} | "
            f"{'yes' if res['same_output'] else 'NO'} |"
        )
    busiest = max(max(r["load_avg_before"][0], r["load_avg_after"][0]) for r in results)
    if busiest > (os.cpu_count() or 1):
        lines += [
            "",
            f"WARNING: load average up to {busiest:.1f} on {os.cpu_count()} CPUs: the ratios are noisy.",
        ]
    for res in results:
        lines += ["", f"{res['workload']}: seconds per round (first to run marked *)", ""]
        lines += ["| round | base s | new s | new/base | base CPU s | new CPU s | CPU new/base |"]
        lines += ["|---:|---:|---:|---:|---:|---:|---:|"]
        for i, run in enumerate(res["runs"], 1):
            mark = {role: "*" if run["order"][0] == role else "" for role in ("base", "new")}
            lines.append(
                f"| {i} | {run['base']['seconds']:.3f}{mark['base']} | {run['new']['seconds']:.3f}{mark['new']} "
                f"| {run['ratio']:.3f} | {run['base']['cpu_s']:.3f} | {run['new']['cpu_s']:.3f} "
                f"| {run['cpu_ratio']:.3f} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--base", default="HEAD", help="a git revision, or 'worktree' (default HEAD)")
    parser.add_argument("--new", default="worktree", help="a git revision, or 'worktree' (the default)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--workload", action="append", choices=WORKLOADS, help="repeatable; default: all")
    parser.add_argument("--output-dir", type=Path, default=RESULTS)
    parser.add_argument(
        "--child", nargs=4, metavar=("WORKLOAD", "TREE", "SITE", "ROOT"), help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    if args.child:
        return child(*args.child)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")

    contenders = [contender("base", args.base), contender("new", args.new)]
    results = []
    for workload in args.workload or WORKLOADS:
        res = measure(workload, contenders, args.rounds)
        res["markdown"] = markdown([res])
        args.output_dir.mkdir(parents=True, exist_ok=True)
        (args.output_dir / f"compare-{workload}.json").write_text(json.dumps(res, indent=2) + "\n")
        results.append(res)
    print(markdown(results))
    written = [str(args.output_dir / f"compare-{r['workload']}.json") for r in results]
    print(f"\nwrote {', '.join(written)}")
    if not all(r["same_output"] for r in results):
        print("base and new disagree on a workload's output (rows, files or records)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
