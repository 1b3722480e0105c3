"""The mutation suite's generator: real tables from tests/data/tables, the mutation classes, seeds.

``generate(seed, size)`` returns the cases: for each class (the classes are fixed) and each table it
applies to, instances drawn with a random generator seeded by (seed, class, table, instance), so a
different seed mutates other lines, fields and numbers within the same classes, and the same seed
gives the same cases. ``size="ci"`` draws two or three tables per class (from a small pool first);
``size="full"`` every applicable table with each class's instance count.

The classes live in lines.py (single log lines), commits.py (commits, the log folder),
checkpoints.py (checkpoints, sidecars, file times), dvs.py (deletion vectors) and
paths.py (paths, data files, naming the table, secrets); the expectations are explained in
core.py.
"""

from __future__ import annotations

import random
import re
from dataclasses import asdict
from typing import Literal

from mutation import checkpoints, commits, dvs, lines, paths
from mutation.core import (
    CLASSES,
    CLI_COMMANDS,
    EXPECTATIONS,
    STRUCTURAL_ALLOWED,
    Case,
    Env,
    TableSpec,
)
from mutation.logs import facts

__all__ = ["CLASSES", "CLI_COMMANDS", "TABLE_SPECS", "Case", "Env", "check_expectations", "generate"]
_REGISTERED = (checkpoints, commits, dvs, lines, paths)

TABLE_SPECS = (
    TableSpec("golden__snapshot-data2-deleted", "JSON-only, removes", ci=True),
    TableSpec("drs__simple_table", "JSON-only, merge/update/delete"),
    TableSpec("krs__cdf-table", "CDF, date partitions, cdc files", ci=True),
    TableSpec("krs__cdf-table-non-partitioned", "CDF, cdc files"),
    TableSpec("krs__cdf-table-with-dv", "CDF with DVs (file and inline), no commitInfo", ci=True),
    TableSpec("drs__cdc_ict_table", "CDF + in-commit timestamps"),
    TableSpec("drs__simple_table_with_checkpoint", "classic checkpoint at the latest version", ci=True),
    TableSpec("kj__basic-dv-with-checkpoint", "classic checkpoints x4, DV files", share=0.7),
    TableSpec("gen__long-log-cdf", "131 commits, CDF, checkpoints at 49 and 99", share=0.4),
    TableSpec("golden__multi-part-checkpoint", "multi-part checkpoint", ci=True),
    TableSpec("golden__v2-checkpoint-parquet", "V2 parquet checkpoint with sidecars", ci=True),
    TableSpec("golden__v2-checkpoint-json", "V2 JSON checkpoint with sidecars", ci=True),
    TableSpec("spark__table-with-dv-small", "DV file, column mapping", ci=True),
    TableSpec("golden__log-replay-dv-key-cases", "DV files, same path with new DVs"),
    TableSpec("spark__partitioned-table-with-dv-large", "DV files, partitions"),
    TableSpec("drs__partition-type-primitives", "partition types"),
    TableSpec("golden__data-reader-partition-values", "every partition type", ci=True),
    TableSpec("krs__timestamp-partitioned-table", "timestamp partition, DV feature"),
    TableSpec("golden__table-with-columnmapping-mode-name", "column mapping (name)"),
    TableSpec("kj__data-reader-partition-values-column-mapping-name", "column mapping, partitions"),
    TableSpec("krs__cdf-column-mapping-name-mode-3-7", "CDF from v1, column mapping, DV feature"),
)

_ID_UNSAFE = re.compile(r"[^\w.:@=+,/%-]")


def generate(
    seed: int, size: Literal["ci", "full"] = "full", tables: tuple[str, ...] | None = None
) -> list[Case]:
    specs = [s for s in TABLE_SPECS if tables is None or s.id in tables]
    cases: list[Case] = []
    seen: set[str] = set()
    for cls in CLASSES.values():
        applicable = [s for s in specs if cls.applies(facts(s.id))]
        if not applicable:
            continue
        if size == "ci":  # two tables per class (three for the numerous ones), from the pool first
            pick = random.Random(f"{seed}|{cls.name}|table")
            pool = [s for s in applicable if s.ci]
            rest = [s for s in applicable if not s.ci]
            ordered = pick.sample(pool, len(pool)) + pick.sample(rest, len(rest))
            plan = [(s, 0) for s in ordered[: 2 if cls.instances == 1 else 3]]
        else:
            share = random.Random(f"{seed}|{cls.name}|share")
            plan = [
                (s, i)
                for s in applicable
                if s.share >= 1 or share.random() < s.share
                for i in range(cls.instances if s.share >= 1 else 1)
            ] or [(applicable[0], 0)]  # every class runs, even if only long logs have what it needs
        for spec, i in plan:
            rng = random.Random(f"{seed}|{cls.name}|{spec.id}|{i}")
            try:
                m = cls.make(facts(spec.id), rng)
            except IndexError:  # the drawn table has nothing of the kind this class mutates
                continue
            if m is None:
                continue
            case = Case(
                **asdict(m) | {"apply": m.apply}, cls=cls.name, table=spec.id, structural=cls.structural
            )
            case.id = f"{cls.name}/{spec.id}/{_ID_UNSAFE.sub('_', m.detail)}"
            if case.id in seen:
                continue
            seen.add(case.id)
            cases.append(case)
    return cases


def check_expectations(cases: list[Case]) -> list[str]:
    """Problems with the declared expectations themselves (a structural class may not say 'open')."""
    problems = []
    for c in cases:
        for command, e in c.expect.items():
            if command not in CLI_COMMANDS or e not in EXPECTATIONS:
                problems.append(f"{c.id}: {command}={e}")
            elif c.structural and e not in STRUCTURAL_ALLOWED:
                problems.append(f"{c.id}: structural class expects {e!r} from {command}")
        if "faithful" in c.expect.values() and not c.marker:
            problems.append(f"{c.id}: 'faithful' without a marker")
    return problems
