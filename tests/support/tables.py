"""The real Delta tables under tests/data (copied from the shared conformance set) and their index."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from functools import cache
from pathlib import Path

DATA = Path(__file__).resolve().parent.parent / "data"
TABLES = DATA / "tables"
EXPECTED = DATA / "expected"


@dataclass(frozen=True)
class TableCase:
    id: str
    features: str
    data: str
    expected: str
    notes: str

    @property
    def path(self) -> Path:
        return TABLES / self.id

    @property
    def must_fail(self) -> bool:
        return "MUST FAIL" in self.expected

    @property
    def has_data(self) -> bool:
        return self.data == "all files present"

    @property
    def golden_dir(self) -> Path | None:
        if not self.expected.startswith("snapshot: expected/golden_snapshot/"):
            return None
        return EXPECTED / "golden_snapshot" / self.id.removeprefix("golden__")


@cache
def table_cases() -> list[TableCase]:
    rows = json.loads((DATA / "index.json").read_text())
    return [
        TableCase(r["id"], r["features"] or "", r["data"], r["expected"] or "", r["notes"] or "")
        for r in rows
    ]


def case(table_id: str) -> TableCase:
    return next(c for c in table_cases() if c.id == table_id)


def copy_table(table_id: str, dest: Path) -> Path:
    """A private, writable copy of a table (tests that change a log must not touch tests/data)."""
    target = dest / table_id
    shutil.copytree(TABLES / table_id, target)
    return target


def record_rules(table_id: str) -> object:
    """What a consumer of ``table_id``'s mirror must allow (a deltamirror.mirror.boundary.RecordRules):
    golden__canonicalized-paths-normal-a's log names /some/unqualified/absolute/path, outside its
    root, which a reader takes only under an allowed prefix (as core reads its data only then)."""
    from deltamirror.mirror.boundary import RecordRules

    if table_id == "golden__canonicalized-paths-normal-a":
        return RecordRules(allowed_path_prefixes=["/some"])
    return RecordRules()
