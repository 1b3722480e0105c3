"""``make chaos``: the seeded fault campaign on a local broker; prints one row per fault class.

python tests/chaos [--seed N] [--duration S] [--size ci|full] [--class N]... [--report PATH]

``--size ci`` runs classes 1-6 (classes 7 and 8, kill -9 during a net catch-up or a signal's net
block, only when named).

Exit 0 when in every class enough faults landed and the checker found nothing lost, duplicated,
out of order or different; 1 otherwise.
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE.parent.parent / "bench")]  # tests/ and bench/

from chaos.campaign import SIZES, run_campaign  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tests/chaos", description=__doc__)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--size", choices=sorted(SIZES), default="full")
    parser.add_argument("--duration", type=float, help="seconds of faults per class (default: the size's)")
    parser.add_argument(
        "--class", dest="classes", type=int, action="append", choices=range(1, 9), metavar="N"
    )
    parser.add_argument(
        "--report", metavar="PATH", help="also write the table and every fault's evidence here"
    )
    parser.add_argument("--keep", action="store_true", help="keep the work folder (tables, logs)")
    args = parser.parse_args(argv)
    # SIGTERM unwinds like Ctrl-C: every class's processes and the broker are stopped on the way out
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    work = Path(tempfile.mkdtemp(prefix="deltamirror-chaos-"))
    started = time.monotonic()
    text, ok = run_campaign(work, args.seed, args.size, args.duration, args.classes)
    text += f"\n\n{time.monotonic() - started:.0f} s in all; work folder {work}"
    print(text, flush=True)
    if args.report:
        Path(args.report).parent.mkdir(parents=True, exist_ok=True)
        Path(args.report).write_text(text + "\n")
    if not args.keep and ok:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
