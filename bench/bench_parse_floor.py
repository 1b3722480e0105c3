"""What validating the producer's log must cost at least: JSON parsers beside deltamirror's boundary.

The producer bench's log (bench_producer.py's 200 commits of 1,000 add actions, ~900 bytes a
line, mostly the ``stats`` string; ~180 MB) is read by each contender, each in its own process,
in turns (the order turning each round), ``--rounds`` times; after one untimed warm-up call per
process, one call is timed (``perf_counter`` and ``process_time``). Contenders:

  read          every commit file's bytes (TableStorage.read_bytes): the I/O floor
  utf8          read, then decode as UTF-8 (one of the things strict JSON requires)
  arrow-json    read, then pyarrow.json.read_json (C++, types inferred, all cores)
  parse         read, then pydantic_core.from_json per line: parsing alone, no field checked
  boundary      read, then deltamirror.core.actions.read_actions: the log boundary itself
  scan          producer.offline_events.iter_event_values: all the producer does without Kafka

Reported: median seconds and MB/s per contender, and per round the ratio to ``scan`` (its median,
IQR and range), with the load average before and after. The question it answers: how much of a
validated scan is the parse that any strict validator has to do (see bench/compare_revisions.py
for the scan of a revision that did not validate).

    python bench/bench_parse_floor.py [--rounds 5] [--only NAME ...]

Results: a markdown table on stdout and bench/results/parse-floor.json.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
RESULTS = BENCH / "results"
CONTENDERS = ("read", "utf8", "arrow-json", "parse", "boundary", "scan")


def _commit_files(root: str) -> list[str]:
    from deltamirror.core.storage import TableStorage

    storage = TableStorage(root)
    return [storage.log_file(f.name) for f in storage.list_log() if f.name.endswith(".json")]


def _driver(name: str, root: str) -> Any:
    """The call to time: returns a check (what it counted) that must agree between rounds."""
    from deltamirror.core.storage import TableStorage

    storage = TableStorage(root)
    files = _commit_files(root)

    def read_all() -> Any:
        for path in files:
            yield path, storage.read_bytes(path)

    if name == "read":
        return lambda: {"bytes": sum(len(d) for _, d in read_all())}
    if name == "utf8":
        return lambda: {"chars": sum(len(d.decode("utf-8")) for _, d in read_all())}
    if name == "arrow-json":
        import pyarrow.json as pj

        options = pj.ReadOptions(use_threads=True, block_size=1 << 20)
        return lambda: {
            "rows": sum(pj.read_json(io.BytesIO(d), read_options=options).num_rows for _, d in read_all())
        }
    if name == "parse":
        import pydantic_core

        def parse() -> dict[str, int]:
            n = 0
            for _, d in read_all():
                n += len(list(map(pydantic_core.from_json, d.splitlines())))
            return {"lines": n}

        return parse
    if name == "boundary":
        from deltamirror.core.actions import read_actions

        def boundary() -> dict[str, int]:
            n = 0
            for path, d in read_all():
                n += sum(len(run) for run in read_actions(d, table=root, file=path))
            return {"actions": n}

        return boundary
    if name == "scan":
        from deltamirror.producer.offline_events import iter_event_values

        return lambda: {"records": sum(1 for _ in iter_event_values(root))}
    raise SystemExit(f"unknown contender {name!r}")


def child(name: str, root: str) -> int:
    call = _driver(name, root)
    call()  # warm-up: page cache, lazy imports
    cpu0, t0 = time.process_time(), time.perf_counter()
    check = call()
    seconds, cpu_s = time.perf_counter() - t0, time.process_time() - cpu0
    print(json.dumps({"seconds": seconds, "cpu_s": cpu_s, "check": check}))
    return 0


def _run(name: str, root: str) -> dict[str, Any]:
    python = BENCH.parent / ".venv" / "bin" / "python"
    cmd = [str(python if python.exists() else sys.executable), __file__, "--child", name, root]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=BENCH)
    if done.returncode != 0:
        raise SystemExit(f"{name} failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--only", action="append", choices=CONTENDERS, help="these contenders (scan always runs)"
    )
    parser.add_argument("--child", nargs=2, metavar=("NAME", "ROOT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(*args.child)

    sys.path.insert(0, str(BENCH))
    from compare_revisions import ensure_data
    from harness import machine, spread

    root = ensure_data("scan")
    names = [n for n in CONTENDERS if not args.only or n in args.only or n == "scan"]
    size = sum(os.path.getsize(p.removeprefix("file://")) for p in _commit_files(root))
    load_before = os.getloadavg()
    runs: list[dict[str, Any]] = []
    for r in range(args.rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        got = {}
        for name in order:
            got[name] = _run(name, root)
            print(f"  round {r + 1}/{args.rounds} {name}: {got[name]['seconds']:.3f} s", file=sys.stderr)
        runs.append({"order": order, **got})
    load_after = os.getloadavg()

    rows, summary = [], {}
    for name in names:
        seconds = [run[name]["seconds"] for run in runs]
        cpu = [run[name]["cpu_s"] for run in runs]
        ratios = [run[name]["seconds"] / run["scan"]["seconds"] for run in runs]
        med = statistics.median(seconds)
        summary[name] = {
            "median_seconds": med,
            "median_cpu_s": statistics.median(cpu),
            "mb_per_s": size / med / 1e6,
            "ratio_to_scan": spread(ratios),
            "checks": sorted({json.dumps(run[name]["check"]) for run in runs}),
        }
        s = summary[name]["ratio_to_scan"]
        rows.append(
            f"| {name} | {med:.3f} | {statistics.median(cpu):.3f} | {size / med / 1e6:,.0f} | "
            f"**{s['median']:.2f}** | {s['q1']:.2f}-{s['q3']:.2f} | {s['min']:.2f}-{s['max']:.2f} |"
        )
    print(
        f"{size / 1e6:.0f} MB of commits in {root}; {args.rounds} rounds, order turned each round; "
        f"load 1 min {load_before[0]:.2f} -> {load_after[0]:.2f}\n"
    )
    print("| contender | median s | CPU s | MB/s | / scan (median) | IQR | min-max |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    print("\n".join(rows))
    RESULTS.mkdir(exist_ok=True)
    out = {
        "table": root,
        "bytes": size,
        "rounds": args.rounds,
        "contenders": summary,
        "runs": runs,
        "load_avg_before": load_before,
        "load_avg_after": load_after,
        "machine": machine(),
    }
    (RESULTS / "parse-floor.json").write_text(json.dumps(out, indent=2) + "\n")
    print(f"\nwrote {RESULTS / 'parse-floor.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
