"""``make fuzz``: the full mutation campaign, one process, a summary and optionally a report.

python tests/mutation [--seed N] [--size full|ci] [--report PATH] [--class NAME] [--table ID]
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/: `support` as in pytest

from mutation.cases import check_expectations, generate
from mutation.runner import Runner
from mutation.summary import Summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tests/mutation", description=__doc__)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--size", choices=["ci", "full"], default="full")
    parser.add_argument("--report", metavar="PATH", help="write failures by class as markdown")
    parser.add_argument("--class", dest="classes", action="append", metavar="NAME", help="only these classes")
    parser.add_argument("--table", dest="tables", action="append", metavar="ID", help="only these tables")
    parser.add_argument("--subprocess-sample", type=int, default=8, help="cases re-run as processes")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per command")
    parser.add_argument("--limit", type=int, help="at most this many cases")
    args = parser.parse_args(argv)

    cases = generate(args.seed, args.size, tuple(args.tables) if args.tables else None)
    if args.classes:
        cases = [c for c in cases if c.cls in args.classes]
    if args.limit:
        cases = cases[: args.limit]
    problems = check_expectations(cases)
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 2
    summary = Summary()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="deltamirror-mutation-") as tmp:
        runner = Runner(Path(tmp), timeout_s=args.timeout)
        for i, case in enumerate(cases, start=1):
            try:
                outcomes = runner.run_case(case)
            except Exception as exc:  # a bug of the suite, not of deltamirror: report it, go on
                summary.suite_errors.append(f"{case.id}: {type(exc).__name__}: {exc}")
                print("E", end="" if i % 100 else f" {i}/{len(cases)}\n", flush=True)
                continue
            summary.add(outcomes)
            bad = [o for o in outcomes if o.failures]
            mark = "F" if bad else "."
            print(mark, end="" if i % 100 else f" {i}/{len(cases)}\n", flush=True)
        print()
        sample = random.Random(args.seed).sample(cases, min(args.subprocess_sample, len(cases)))
        for case in sample:
            summary.subprocess_problems += runner.subprocess_mismatches(case)
        summary.baseline_failures = {
            f"{t} {c}": why for t, cmds in runner.baseline_failures.items() for c, why in cmds.items()
        }
    summary.seconds = time.perf_counter() - start
    print(summary.text())
    if args.report:
        Path(args.report).parent.mkdir(parents=True, exist_ok=True)
        Path(args.report).write_text(summary.markdown(args.seed, args.size))
        print(f"report: {args.report}")
    figs = summary.figures()
    failed = sum(figs[k] for k in ("tracebacks", "wrong outputs", "over-refusals", "bad refusals"))
    failed += figs["reads outside the root"] + figs["secrets printed"] + len(summary.subprocess_problems)
    failed += len(summary.suite_errors)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
