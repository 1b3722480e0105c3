"""Row ids in the change feed, against delta-spark's ``_metadata.row_id`` / ``row_commit_version``.

The oracle is stored: scripts/write_corpus.py wrote the row-tracking tables with delta-spark and
recorded, at every version, what ``SELECT *, _metadata.row_id, _metadata.row_commit_version`` read
(``rows_with_row_ids``) and delta-spark's ``readChangeFeed`` (``cdf``). No Spark runs here.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from deltamirror.core import open_table
from deltamirror.core.changes import changes_from_actions, read_changes
from deltamirror.core.errors import CorruptLogError, InvalidArgumentError
from deltamirror.core.row_tracking import snapshot_batches_with_row_ids
from support.corpus import CORPUS, CorpusTable, corpus_tables, normal_rows

ROW_ID_TABLES = [
    t for t in corpus_tables() if any("rows_with_row_ids" in v for v in t.expected["versions"].values())
]
IDS = [t.id for t in ROW_ID_TABLES]
_TAKEN = ("delete", "update_preimage")


def _key(row: dict[str, Any]) -> str:
    return json.dumps(row, sort_keys=True)


def _oracle(table: CorpusTable, version: int) -> list[dict[str, Any]]:
    """delta-spark's rows at ``version`` with ``_row_id`` and ``_row_commit_version``."""
    if version < 0:
        return []
    rows = table.expected["versions"][str(version)]["rows_with_row_ids"]
    return normal_rows(
        {
            **{k: v for k, v in r.items() if k not in ("row_id", "row_commit_version")},
            "_row_id": r["row_id"],
            "_row_commit_version": r["row_commit_version"],
        }
        for r in rows
    )


def _feed(table: CorpusTable) -> list[dict[str, Any]]:
    start = table.expected["cdf"]["start"]
    return normal_rows(
        read_changes(open_table(str(table.path)), starting_version=start, row_ids=True).to_arrow().to_pylist()
    )


def test_the_corpus_has_row_id_tables_written_by_delta_spark() -> None:
    """The oracle exists and covers what it claims (a test that would pass on an empty list is none)."""
    assert {"spark__row_ids", "spark__row_ids_dv"} <= set(IDS)
    for table in ROW_ID_TABLES:
        ops = table.entry["operations"]
        assert {"UPDATE", "DELETE", "MERGE", "OPTIMIZE", "WRITE"} <= set(ops)
    dv = next(t for t in ROW_ID_TABLES if t.id == "spark__row_ids_dv")
    assert "deletionVectors" in dv.entry["features"]


@pytest.mark.parametrize("table", ROW_ID_TABLES, ids=IDS)
def test_feed_rows_are_delta_spark_change_feed(table: CorpusTable) -> None:
    """With row ids, the rows (row id columns aside) are delta-spark's readChangeFeed rows, although
    the versions with change data files are read from the data files."""
    ours = normal_rows(
        {k: v for k, v in r.items() if k not in ("_row_id", "_row_commit_version")} for r in _feed(table)
    )
    assert ours == normal_rows(table.expected["cdf"]["rows"])
    # and the same as the feed read without row ids (from the change data files)
    start = table.expected["cdf"]["start"]
    plain = read_changes(open_table(str(table.path)), starting_version=start).to_arrow().to_pylist()
    assert ours == normal_rows(plain)


@pytest.mark.parametrize("table", ROW_ID_TABLES, ids=IDS)
def test_row_ids_are_delta_spark_metadata_row_ids(table: CorpusTable) -> None:
    """Each change row, with its _row_id and _row_commit_version, is a row delta-spark reads: a row
    taken away at v is in version v-1, a row added at v is in version v; and applying a version's
    changes to version v-1 gives version v exactly (no change left out, none too many)."""
    feed = _feed(table)
    latest = max(int(v) for v in table.expected["versions"])
    start = table.expected["cdf"]["start"]
    checked = 0
    for v in range(start, latest + 1):
        rows = [r for r in feed if r["_commit_version"] == v]
        taken = Counter(_key(_strip(r)) for r in rows if r["_change_type"] in _TAKEN)
        added = Counter(_key(_strip(r)) for r in rows if r["_change_type"] not in _TAKEN)
        before = Counter(_key(r) for r in _oracle(table, v - 1))
        after = Counter(_key(r) for r in _oracle(table, v))
        assert not taken - before, f"version {v}: rows taken away that delta-spark did not have"
        assert not added - after, f"version {v}: rows added that delta-spark does not read"
        assert before - taken + added == after, f"version {v}"
        checked += sum(taken.values()) + sum(added.values())
    assert checked == len(feed) > 0


@pytest.mark.parametrize("table", ROW_ID_TABLES, ids=IDS)
def test_updates_keep_their_row_id(table: CorpusTable) -> None:
    """An update's pre- and post-image carry one row id, the post-image this version's commit version."""
    feed = _feed(table)
    pre = {(r["_commit_version"], r["_row_id"]) for r in feed if r["_change_type"] == "update_preimage"}
    post = {(r["_commit_version"], r["_row_id"]) for r in feed if r["_change_type"] == "update_postimage"}
    assert pre == post and pre
    assert all(
        r["_row_commit_version"] == r["_commit_version"]
        for r in feed
        if r["_change_type"] == "update_postimage"
    )


@pytest.mark.parametrize("table", ROW_ID_TABLES, ids=IDS)
def test_snapshot_row_ids_are_delta_spark_metadata_row_ids(table: CorpusTable) -> None:
    """OPTIMIZE included: a snapshot's rows with their row ids are what delta-spark reads."""
    t = open_table(str(table.path))
    for v in table.expected["versions"]:
        rows = [r for b in snapshot_batches_with_row_ids(t.snapshot(version=int(v))) for r in b.to_pylist()]
        assert normal_rows(rows) == _oracle(table, int(v)), f"version {v}"


def test_row_ids_from_mirrored_actions_match_the_planned_feed() -> None:
    """changes_from_actions (the Spark source's and the watcher's way) gives the same row ids."""
    table = next(t for t in ROW_ID_TABLES if t.id == "spark__row_ids_dv")
    dt = open_table(str(table.path))
    snap = dt.snapshot()
    from deltamirror.core.changes import VersionActions

    log = Path(table.path) / "_delta_log"
    versions = []
    for v in range(1, snap.version + 1):
        lines = (log / f"{v:020d}.json").read_text().splitlines()
        actions = [next(iter(json.loads(line).items())) for line in lines if line.strip()]
        versions.append(VersionActions(v, 0, actions))
    feed = (
        changes_from_actions(dt, snap.metadata, snap.version, versions, row_ids=True).to_arrow().to_pylist()
    )
    planned = [r for r in _feed(table) if r["_commit_version"] >= 1]
    assert normal_rows(feed) == normal_rows({**r, "_commit_timestamp": 0} for r in planned)


def test_row_ids_on_a_table_without_row_tracking_are_refused() -> None:
    table = next(t for t in corpus_tables() if t.id == "spark__dml")
    with pytest.raises(InvalidArgumentError, match="row tracking"):
        read_changes(open_table(str(table.path)), starting_version=0, row_ids=True)


def test_an_add_without_base_row_id_is_refused_by_name(tmp_path: Path) -> None:
    """delta-spark sets baseRowId on every add of a row-tracking table; one without it is a corrupt
    log, refused naming the table, the version and the file (never a row id made up)."""
    source = CORPUS / "tables" / "spark__row_ids"
    target = tmp_path / "t"
    shutil.copytree(source, target)
    commit = target / "_delta_log" / f"{2:020d}.json"
    lines = commit.read_text().splitlines()
    out, path = [], None
    for line in lines:
        action = json.loads(line)
        if "add" in action and path is None:
            assert "baseRowId" in action["add"]  # the writer's own add has it
            del action["add"]["baseRowId"]
            path = action["add"]["path"]
        out.append(json.dumps(action))
    commit.write_text("\n".join(out) + "\n")
    assert path is not None
    feed = read_changes(open_table(str(target)), starting_version=2, ending_version=2, row_ids=True)
    with pytest.raises(CorruptLogError, match="baseRowId") as err:
        feed.to_arrow()
    assert err.value.version == 2 and err.value.file == path


def _strip(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k not in ("_change_type", "_commit_version")}
