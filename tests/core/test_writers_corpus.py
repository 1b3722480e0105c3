"""Every reader reads every table of the writers' corpus as the writer's own reader does.

The corpus (tests/data/corpus, written by scripts/write_corpus.py) holds what delta-spark and
delta-rs write: NULL and empty partition values on adds, removes and change data files, every
partition type, every operation, checkpoints of each kind, deletion vectors, row tracking,
column mapping, type widening, In-Commit Timestamps. Its expectations are what delta-spark
(``spark.read`` at each version, ``DESCRIBE HISTORY``, ``readChangeFeed``) and delta-rs
(``DeltaTable(...).to_pyarrow_table()``, ``history()``, ``load_cdf``) read when the tables were
written: no Spark runs here. A rule of the log boundary that one of these logs breaks is a wrong
rule (tests/core/test_boundary_rules.py names the tables each rule must accept).
"""

from __future__ import annotations

import pytest

from deltamirror.core import open_table
from support.corpus import (
    CorpusTable,
    corpus_tables,
    expected_cdf,
    expected_rows,
    normal_rows,
    table_location,
)

TABLES = corpus_tables()


def _open(table: CorpusTable):  # type: ignore[no-untyped-def]
    location, prefixes = table_location(table)
    return open_table(location, allowed_path_prefixes=prefixes)


def test_the_corpus_covers_both_writers_and_what_the_issue_names() -> None:
    writers = {t.writer for t in TABLES}
    assert writers == {"delta-spark", "delta-rs"}
    covers = " ".join(c for t in TABLES for c in t.entry["covers"])
    for needed in (
        "NULL and empty-string partition values",
        "DELETE",
        "UPDATE",
        "MERGE",
        "OPTIMIZE",
        "RESTORE",
        "SHALLOW CLONE",
        "REPLACE",
        "RENAME COLUMN",
        "DROP COLUMN",
        "type widening",
        "deletion vectors",
        "row tracking",
        "ICT on",
        "V2 checkpoint",
        "multi-part V1 checkpoint",
        "CDF on",
    ):
        assert needed in covers, needed


@pytest.mark.parametrize("table", TABLES, ids=lambda t: t.id)
def test_snapshot_and_read_give_the_writers_rows_at_every_version(table: CorpusTable) -> None:
    expected = table.expected
    delta = _open(table)
    compared = 0
    for version, want in expected["versions"].items():
        if "error" in want:  # the writer's own reader fails there: ours must at least answer
            delta.snapshot(int(version))
            continue
        snap = delta.snapshot(int(version))
        got = snap.to_arrow()
        assert got.column_names == want["columns"], version
        want_rows = expected_rows(table, version, want["rows"])
        assert normal_rows(got.to_pylist()) == normal_rows(want_rows), f"version {version}"
        if want.get("num_files") is not None:
            assert snap.files.num_rows == want["num_files"], version
        compared += 1
    assert compared > 0


@pytest.mark.parametrize("table", TABLES, ids=lambda t: t.id)
def test_history_is_the_writers(table: CorpusTable) -> None:
    got = [(h.version, h.operation) for h in _open(table).history()]
    want = [(h["version"], h["operation"]) for h in table.expected["history"]]
    assert sorted(got) == sorted(want)


CDF_TABLES = [t for t in TABLES if t.expected["cdf"] is not None]


@pytest.mark.parametrize("table", CDF_TABLES, ids=lambda t: t.id)
def test_changes_are_the_writers_change_data_feed(table: CorpusTable) -> None:
    cdf = table.expected["cdf"]
    feed = _open(table).changes(starting_version=cdf["start"], ending_version=cdf["end"]).to_arrow()
    if "error" in cdf:  # the writer cannot read its own feed (recorded): ours answers
        assert feed.num_rows > 0
        return
    assert normal_rows(feed.to_pylist()) == normal_rows(expected_cdf(table, cdf["rows"]))


@pytest.mark.parametrize("table", TABLES, ids=lambda t: t.id)
def test_events_are_given_for_every_version(table: CorpusTable) -> None:
    import orjson

    from deltamirror.producer.publishing.offline_events import iter_event_values

    location, _ = table_location(table)  # made from the commit files alone: no prefix to allow
    versions = {orjson.loads(value)["version"] for value in iter_event_values(location, starting_version=0)}
    assert versions == {h["version"] for h in table.expected["history"]}
