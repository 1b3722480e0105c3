"""``make forge``: the whole forged-record campaign on a real broker, a summary and a report.

python tests/forge [--seed N] [--size full|ci] [--report PATH] [--class NAME] [--spark]
(KAFKA_BOOTSTRAP_SERVERS, or a local broker started here as the tests start one.)
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/: `support` as in pytest

from support.forge import mirror_base
from support.forge_cases import check_expectations, generate
from support.forge_runner import Runner, signal_flood
from support.forge_summary import Summary

TABLE_ID = "krs__cdf-table-with-dv"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tests/forge", description=__doc__)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--size", choices=["ci", "full"], default="full")
    parser.add_argument("--report", metavar="PATH", help="write the figures and the table as markdown")
    parser.add_argument("--class", dest="classes", action="append", metavar="NAME", help="only these classes")
    parser.add_argument(
        "--spark", action="store_true", help="also run the Spark source's cases (a SparkSession)"
    )
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds per consumer run")
    args = parser.parse_args(argv)

    cases = generate(args.size, args.seed)
    if args.classes:
        cases = [c for c in cases if c.cls in args.classes]
    problems = check_expectations(cases)
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 2
    summary = Summary()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="deltamirror-forge-") as tmp, _broker(Path(tmp)) as bootstrap:
        base = mirror_base(bootstrap, TABLE_ID, Path(tmp) / "table")
        runner = Runner(bootstrap, base, Path(tmp), timeout_s=args.timeout)
        if args.spark:
            from deltamirror.consumer.spark_source import register
            from support.spark import get_spark_session, use_this_python_for_workers

            use_this_python_for_workers()
            runner.spark = get_spark_session()
            register(runner.spark)
        for i, case in enumerate(cases, start=1):
            try:
                outcomes = runner.run_case(case)
            except Exception as exc:  # a bug of the suite: reported, the run goes on
                summary.suite_errors.append(f"{case.id}: {type(exc).__name__}: {exc}")
                print("E", end="", flush=True)
                continue
            summary.outcomes += outcomes
            print(
                "F" if any(o.failures for o in outcomes) else ".", end="" if i % 50 else f" {i}\n", flush=True
            )
        print()
        if args.size == "full" and not args.classes:
            flood = signal_flood(bootstrap, base.table, Path(tmp))
            summary.notes.append(
                f"flood signals-400x900KB via watch: peak RSS {flood['rss_before_mb']:.0f} -> "
                f"{flood['rss_peak_mb']:.0f} MB, {flood['stderr_mb']:.2f} MB written to stderr"
            )
            # what stays is the Kafka client's own read buffers for 360 MB of records (a bare
            # confluent-kafka consumer reading them peaks higher): nothing of them is kept or logged
            if flood["rss_peak_mb"] - flood["rss_before_mb"] > 250 or flood["stderr_mb"] > 1:
                summary.suite_errors.append("the signal flood was not bounded: " + summary.notes[-1])
    summary.seconds = time.perf_counter() - start
    print(summary.text())
    print(summary.table())
    if args.report:
        Path(args.report).parent.mkdir(parents=True, exist_ok=True)
        Path(args.report).write_text(summary.markdown(args.seed, args.size))
        print(f"report: {args.report}")
    return 1 if summary.failures or summary.suite_errors or summary.applied() else 0


class _broker:
    """KAFKA_BOOTSTRAP_SERVERS, or a local broker for the run (as tests/support/kafka.py starts one)."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.local = None

    def __enter__(self) -> str:
        configured = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
        if configured:
            return configured
        from deltamirror.producer.local_kafka import LocalKafka
        from support.kafka import free_port_pair

        self.local = LocalKafka(port=free_port_pair(), data_dir=self.tmp / "kafka")
        return str(self.local.start())

    def __exit__(self, *exc: object) -> None:
        if self.local is not None:
            self.local.stop()


if __name__ == "__main__":
    sys.exit(main())
