"""The test data says what it is: a table that tests/data/INDEX.md calls complete reads as shipped.

The index is what a contributor trusts when picking a table for a test; a table it calls complete
whose rows cannot be read (a renamed deletion vector, a placeholder path) would turn the next test
written against it into a puzzle. Tables a reader must refuse are refused by the conformance tests.
"""

from __future__ import annotations

import json

import pytest

from deltamirror.core import open_table
from deltamirror.core.errors import UnsupportedFeatureError
from support.tables import TableCase, table_cases

COMPLETE = [c for c in table_cases() if c.has_data and not c.must_fail]


def test_the_index_names_complete_tables() -> None:
    assert len(COMPLETE) > 100


@pytest.mark.parametrize("case", COMPLETE, ids=lambda c: c.id)
def test_a_complete_table_reads_every_row_as_shipped(case: TableCase) -> None:
    table = open_table(str(case.path))
    try:
        snap = table.snapshot()
    except UnsupportedFeatureError:
        return  # refused by name before any data is read: the conformance tests pin which
    except Exception as exc:  # anything else means the table, or its index line, is wrong
        pytest.fail(f"{case.id}: the index says complete, but the snapshot fails: {exc}")
    try:
        rows = snap.to_arrow()
    except Exception as exc:
        pytest.fail(f"{case.id}: the index says complete, but its rows cannot be read: {exc}")
    # where every file's stats count its records, the rows read are exactly those not deleted
    counts = [_num_records(s) for s in snap.files["stats"].to_pylist()]
    if counts and all(c is not None for c in counts):
        deleted = sum((dv or {}).get("cardinality") or 0 for dv in snap.files["deletionVector"].to_pylist())
        assert rows.num_rows == sum(c for c in counts if c is not None) - deleted


def _num_records(stats: str | None) -> int | None:
    if not stats:
        return None
    value = json.loads(stats).get("numRecords")
    return None if value is None else int(value)
