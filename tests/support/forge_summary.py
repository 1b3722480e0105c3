"""The figures of a forged-record run: outcomes per class and consumer, failures, flood RSS."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

from support.forge_runner import Outcome

CONSUMER_ORDER = ("consume-snapshot", "invalidate", "mirror-feed", "spark")


@dataclass
class Summary:
    outcomes: list[Outcome] = field(default_factory=list)
    suite_errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def failures(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.failures]

    def applied(self) -> int:
        """Forged records a consumer applied (the figure that must be 0)."""
        return sum(
            1
            for o in self.outcomes
            if o.outcome == "applied" or any(f.startswith("forged-applied") for f in o.failures)
        )

    def table(self) -> str:
        """Markdown: per class, the cases and each consumer's outcomes."""
        by_class: dict[str, dict[str, Counter[str]]] = defaultdict(lambda: defaultdict(Counter))
        cases: dict[str, set[str]] = defaultdict(set)
        for o in self.outcomes:
            by_class[o.case.cls][o.consumer][o.outcome] += 1
            cases[o.case.cls].add(o.case.id)
        header = "| class | cases | " + " | ".join(CONSUMER_ORDER) + " |"
        lines = [header, "|---|---:|" + "---|" * len(CONSUMER_ORDER)]
        for cls in sorted(by_class):
            cells = []
            for consumer in CONSUMER_ORDER:
                counts = by_class[cls].get(consumer)
                cells.append(", ".join(f"{n} {k}" for k, n in sorted(counts.items())) if counts else "—")
            lines.append(f"| {cls} | {len(cases[cls])} | " + " | ".join(cells) + " |")
        return "\n".join(lines)

    def text(self) -> str:
        total = Counter(o.outcome for o in self.outcomes)
        lines = [
            f"cases: {len({o.case.id for o in self.outcomes})}, consumer runs: {len(self.outcomes)}",
            "outcomes: " + ", ".join(f"{n} {k}" for k, n in sorted(total.items())),
            f"forged records applied: {self.applied()}",
            f"failures: {len(self.failures)}",
            f"seconds: {self.seconds:.0f}",
        ]
        for o in self.outcomes:
            if o.rss_mb is not None:
                lines.append(
                    f"flood {o.case.id} via {o.consumer}: {o.outcome}, peak RSS {o.rss_mb:.0f} MB, {o.seconds:.1f} s"
                )
        lines += self.notes
        for o in self.failures:
            lines.append(f"FAIL {o.case.id} {o.consumer}: {'; '.join(o.failures)[:400]}")
        lines += [f"suite error: {e[:300]}" for e in self.suite_errors]
        return "\n".join(lines)

    def markdown(self, seed: int, size: str) -> str:
        return "\n".join(
            [
                f"# Forged-record suite: seed {seed}, size {size}",
                "",
                "```",
                self.text(),
                "```",
                "",
                self.table(),
                "",
            ]
        )


__all__ = ["Summary"]
