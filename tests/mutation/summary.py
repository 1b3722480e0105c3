"""The figures of a mutation run and its report: failures by category, then by mutation class."""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from mutation.core import Case
from mutation.runner import Outcome

# --- summary ----------------------------------------------------------------------------------


@dataclass
class Summary:
    cases: int = 0
    outcomes: list[Outcome] = field(default_factory=list)
    baseline_failures: dict[str, str] = field(default_factory=dict)
    subprocess_problems: list[str] = field(default_factory=list)
    suite_errors: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def add(self, outcomes: list[Outcome]) -> None:
        self.cases += 1
        self.outcomes += outcomes

    def counts(self) -> Counter[str]:
        c: Counter[str] = Counter()
        for o in self.outcomes:
            c[o.category] += 1
            for extra in {x.split(":", 1)[0] for x in o.failures[1:]}:
                if extra in ("read-outside-root", "secret-printed") and extra != o.category:
                    c[extra] += 1
        return c

    def figures(self) -> dict[str, int]:
        c = self.counts()
        return {
            "cases": self.cases,
            "commands": len(self.outcomes),
            "refused": c["refused"],
            "unchanged": c["unchanged"],
            "faithful": c["faithful"],
            "accepted/consistent/open": c["accepted"] + c["consistent"] + c["open"],
            "tracebacks": c["traceback"] + c["timeout"],
            "wrong outputs": c["wrong-output"],
            "over-refusals": c["over-refused"],
            "bad refusals": c["bad-refusal"],
            "reads outside the root": c["read-outside-root"],
            "secrets printed": c["secret-printed"],
        }

    def text(self) -> str:
        figs = self.figures()
        lines = [f"{k:>26}: {v}" for k, v in figs.items()]
        lines.append(f"{'seconds':>26}: {self.seconds:.0f}")
        for t, why in sorted(self.baseline_failures.items()):
            lines.append(f"baseline failure (commands skipped): {t}: {why}")
        lines += [f"subprocess mismatch: {p}" for p in self.subprocess_problems]
        lines += [f"suite error (case not run): {e[:300]}" for e in self.suite_errors]
        return "\n".join(lines)

    def failures_by_class(self) -> dict[str, dict[str, list[Outcome]]]:
        """failure category -> mutation class -> outcomes."""
        out: dict[str, dict[str, list[Outcome]]] = defaultdict(lambda: defaultdict(list))
        for o in self.outcomes:
            for cat in dict.fromkeys(x.split(":", 1)[0] for x in o.failures):
                out[cat][o.case.cls].append(o)
        return out

    def markdown(self, seed: int, size: str) -> str:
        lines = [
            f"# Mutation suite: seed {seed}, size {size}",
            "",
            "```",
            self.text(),
            "```",
            "",
        ]
        for cat, classes in sorted(self.failures_by_class().items()):
            total = sum(len(v) for v in classes.values())
            lines += [f"## {cat} ({total})", ""]
            for cls, outs in sorted(classes.items(), key=lambda kv: -len(kv[1])):
                cmds = Counter(o.command for o in outs)
                lines.append(
                    f"- **{cls}**: {len(outs)} ({', '.join(f'{c} x{n}' for c, n in cmds.most_common())})"
                )
                stems = Counter(_stem(o.case) for o in outs)
                if len(stems) > 1:
                    lines.append("  - what: " + ", ".join(f"{k} x{n}" for k, n in stems.most_common(8)))
                for o in _examples(outs, cat):
                    why = next(x for x in o.failures if x.startswith(cat))
                    lines.append(f"  - `{o.case.id}` {o.command}: {why.split(':', 1)[1].strip()[:260]}")
            lines.append("")
        return "\n".join(lines)


def _stem(case: Case) -> str:
    """What a case mutated, without where and which value: ``add.size`` from ``v3:l2:add.size=12.5``."""
    detail = case.id.split("/", 2)[2]
    detail = re.sub(r"^(v\d+:)?(l\d+:)?", "", detail)
    return re.split(r"[=@]", detail, maxsplit=1)[0][:40]


def _examples(outs: list[Outcome], cat: str) -> list[Outcome]:
    """Two examples with different messages where there are."""
    picked: list[Outcome] = []
    seen: set[str] = set()
    for o in outs:
        why = next(x for x in o.failures if x.startswith(cat))[:80]
        if why not in seen:
            seen.add(why)
            picked.append(o)
        if len(picked) == 2:
            break
    return picked
