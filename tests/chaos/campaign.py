"""The campaign: one broker, the fault classes one after the other, the table and the evidence."""

from __future__ import annotations

import os
import time
import traceback
from pathlib import Path

from chaos.broker import Broker
from chaos.faults import CLASSES, TITLES, Plan
from chaos.report import details, table
from chaos.scene import ClassResult, Run

#: classes the ``ci`` size leaves out unless named with --class (the net blocks' kills: a
#: minute or more each, past what the CI subset can spend)
FULL_ONLY = {7, 8}

#: (seconds of faults per class, faults that must land per class, tables of the group)
SIZES = {
    "ci": {"duration_s": 5.0, "need": 1, "tables_group": 10, "broker_kills": False},
    "full": {"duration_s": 60.0, "need": 4, "tables_group": 24},
}


def machine() -> str:
    from harness import load_average
    from harness import machine as describe

    m = describe()
    return f"{m['cpus']} cores, {m['cpu_model']}, {m['memory_gb']} GB; load {load_average()}"


def run_campaign(
    work: Path, seed: int, size: str, duration_s: float | None, only: list[int] | None
) -> tuple[str, bool]:
    settings = dict(SIZES[size])
    if duration_s is not None:
        settings["duration_s"] = duration_s
    plan = Plan(**settings)  # type: ignore[arg-type]
    broker = Broker(work / "kafka")
    broker.start()
    run = Run(broker, work, seed)
    results: list[ClassResult] = []
    header = f"seed {seed}, size {size}, {plan.duration_s:.0f} s of faults per class; {machine()}"
    print(header, flush=True)
    try:
        for number, fn in CLASSES.items():
            if (only and number not in only) or (not only and size == "ci" and number in FULL_ONLY):
                continue
            started = time.monotonic()
            try:
                result = fn(run, plan)
            except Exception as exc:  # the campaign's own trouble, or a hang bounded by a timeout
                result = ClassResult(number, TITLES[number], plan.need)
                result.failures.append(f"{type(exc).__name__}: {exc}")
                result.notes.append("".join(traceback.format_exception(exc))[-3000:])
                if not broker.running():
                    broker.start()
            result.seconds = time.monotonic() - started
            results.append(result)
            print(table([result]).splitlines()[2], flush=True)
    finally:
        try:
            broker.stop()
        except Exception as exc:
            print(f"stopping the broker: {exc}", flush=True)
    text = f"{header}\n\n{table(results)}\n{details(results)}"
    text += f"\n\nafterwards: load {os.getloadavg()[0]:.1f}"
    return text, all(r.ok for r in results)
