"""The campaign's table: one row per fault class, then where each fault hit."""

from __future__ import annotations

from chaos.scene import ClassResult

HEADER = (
    "fault class",
    "faults landed",
    "versions",
    "records",
    "lost",
    "duplicated",
    "out of order",
    "mismatched",
    "",
)


def table(results: list[ClassResult]) -> str:
    rows = [HEADER, tuple("---" for _ in HEADER)]
    for r in results:
        rows.append(
            (
                f"{r.number}. {r.title}",
                f"{r.landed} of {len(r.faults)} (need {r.need})",
                f"{r.tally.versions:,}",
                f"{r.tally.records:,}",
                str(r.tally.lost),
                str(r.tally.duplicated),
                str(r.tally.out_of_order),
                str(r.tally.mismatched),
                "ok" if r.ok else "**FAIL**",
            )
        )
    total = [r.tally for r in results]
    rows.append(
        (
            "all",
            f"{sum(r.landed for r in results)} of {sum(len(r.faults) for r in results)}",
            f"{sum(t.versions for t in total):,}",
            f"{sum(t.records for t in total):,}",
            str(sum(t.lost for t in total)),
            str(sum(t.duplicated for t in total)),
            str(sum(t.out_of_order for t in total)),
            str(sum(t.mismatched for t in total)),
            "ok" if all(r.ok for r in results) else "**FAIL**",
        )
    )
    return "\n".join("| " + " | ".join(row) + " |" for row in rows)


def details(results: list[ClassResult]) -> str:
    out = []
    for r in results:
        out.append(f"\n### {r.number}. {r.title} ({r.seconds:.0f} s)\n")
        out += [f"- {f.describe()}" for f in r.faults]
        out += [f"- note: {n}" for n in r.notes]
        out += [f"- FAILURE: {f}" for f in r.failures]
        out += [f"- PROBLEM: {p}" for p in r.tally.problems[:20]]
        if r.landed < r.need:
            out.append(f"- FAILURE: {r.landed} faults landed, {r.need} needed")
    return "\n".join(out)
