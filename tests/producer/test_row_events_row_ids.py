"""Row events keyed by row id on tables with row tracking, checked against delta-spark's row ids.

The tables and delta-spark's ``_metadata.row_id`` / ``row_commit_version`` at every version are the
stored oracle of tests/data/corpus (scripts/write_corpus.py); no Spark and no broker run here.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest

from deltamirror.mirror.records.record import Record
from deltamirror.mirror.topic_names import default_topics
from deltamirror.producer.publishing.row_events import RowChangesSource
from deltamirror.producer.settings import RowChangesConfig
from deltamirror.producer.tailing.watcher import TableWatcher
from deltamirror.producer.tailing.work import CommitWork, NetCatchUpWork
from support.corpus import CorpusTable, corpus_tables, normal_rows

TABLES = {t.id: t for t in corpus_tables() if t.id in ("spark__row_ids", "spark__row_ids_dv")}


def _records(table: CorpusTable, config: RowChangesConfig, mode: str = "from-version") -> list[Record]:
    watcher = TableWatcher(str(table.path), mode=mode, from_version=0)  # type: ignore[arg-type]
    watcher.start(None)
    source = RowChangesSource(watcher.table, config, default_topics(watcher.uri), "t")
    out: list[Record] = []
    while (unit := watcher.next_work()) is not None:
        out += [r for chunk in source.rows_of(unit).records() for r in chunk]
    watcher.close()
    return [r for r in out if r.topic.endswith(".changes") and r.value is not None]


def _oracle(table: CorpusTable, version: int) -> dict[int, dict[str, Any]]:
    """delta-spark's rows at ``version`` by row id."""
    if version < 0:
        return {}
    rows = table.expected["versions"][str(version)]["rows_with_row_ids"]
    return {
        r["row_id"]: {k: v for k, v in r.items() if k not in ("row_id", "row_commit_version")} for r in rows
    }


@pytest.mark.parametrize("table_id", sorted(TABLES))
def test_events_are_keyed_by_delta_spark_row_ids_and_updates_paired(table_id: str) -> None:
    table = TABLES[table_id]
    records = _records(table, RowChangesConfig())
    cdf = table.expected["cdf"]["rows"]
    updates = Counter(r["_commit_version"] for r in cdf if r["_change_type"] == "update_preimage")
    ops: Counter[str] = Counter()
    paired: Counter[int] = Counter()
    for r in records:
        key = json.loads(r.key)
        assert list(key) == ["_row_id"], key
        event = json.loads(r.value)
        v, row_id = event["source"]["delta_version"], key["_row_id"]
        ops[event["op"]] += 1
        for image in (event["before"], event["after"]):
            assert image is None or ("_row_id" not in image and "_row_commit_version" not in image)
        if event["before"] is not None:  # the row as delta-spark read it, by this row id, before
            assert normal_rows([event["before"]]) == normal_rows([_oracle(table, v - 1)[row_id]])
        if event["after"] is not None:  # and after
            assert normal_rows([event["after"]]) == normal_rows([_oracle(table, v)[row_id]])
        if event["op"] == "u":
            paired[v] += 1
    assert paired == updates and sum(updates.values()) >= 3  # every update paired, none made up
    kinds = Counter(r["_change_type"] for r in cdf)
    assert ops["c"] == kinds["insert"] and ops["d"] == kinds["delete"]


def test_configured_key_columns_still_win() -> None:
    table = TABLES["spark__row_ids"]
    records = _records(table, RowChangesConfig(key_columns=["id"]))
    assert records
    for r in records:
        assert list(json.loads(r.key)) == ["id"]
        event = json.loads(r.value)
        assert all(image is None or "_row_id" not in image for image in (event["before"], event["after"]))


def test_json_schema_key_is_the_row_id() -> None:
    table = TABLES["spark__row_ids_dv"]
    record = _records(table, RowChangesConfig(format="json-schema"))[0]
    key = json.loads(record.key)
    assert key["schema"]["fields"] == [{"type": "int64", "optional": True, "field": "_row_id"}]
    assert isinstance(key["payload"]["_row_id"], int)
    value = json.loads(record.value)
    after = next(f for f in value["schema"]["fields"] if f["field"] == "after")
    assert "_row_id" not in {f["field"] for f in after["fields"]}


def test_snapshot_rows_are_keyed_by_row_id() -> None:
    """An initial snapshot's records have the key its later changes have: the row id."""
    table = TABLES["spark__row_ids_dv"]
    watcher = TableWatcher(str(table.path), mode="initial")
    watcher.start(None)
    source = RowChangesSource(watcher.table, RowChangesConfig(), default_topics(watcher.uri), "t")
    unit = watcher.next_work()
    assert unit is not None and not isinstance(unit, CommitWork)
    records = [r for chunk in source.rows_of(unit).records() for r in chunk if r.topic.endswith(".changes")]
    watcher.close()
    latest = max(int(v) for v in table.expected["versions"])
    oracle = _oracle(table, latest)
    got = {json.loads(r.key)["_row_id"]: json.loads(r.value)["after"] for r in records}
    assert got.keys() == oracle.keys() and got
    for row_id, after in got.items():
        assert normal_rows([after]) == normal_rows([oracle[row_id]])


@pytest.mark.parametrize(
    ("table_id", "first"), [("spark__row_ids", 2), ("spark__row_ids_dv", 3), ("spark__row_ids_dv", 5)]
)
def test_a_net_catch_up_by_row_id_is_delta_spark_s_state_difference(table_id: str, first: int) -> None:
    """The net block of a catch-up from ``first`` on a table delta-spark wrote with row tracking:
    per row id, ``c`` with delta-spark's last row, ``d`` with its row before the range, ``u`` with
    both; nothing for a row the range left as it was. (The broker tests check the one transaction.)"""
    table = TABLES[table_id]
    watcher = TableWatcher(str(table.path), mode="from-version", from_version=first, net_catch_up=True)
    watcher.start(None)
    source = RowChangesSource(watcher.table, RowChangesConfig(), default_topics(watcher.uri), "t")
    catch_up = watcher.next_work()
    assert isinstance(catch_up, NetCatchUpWork) and catch_up.first == first
    records: list[Record] = []
    while (unit := watcher.next_work()) is not None:
        if isinstance(unit, CommitWork) and unit.version == catch_up.last:
            records = [r for chunk in source.net_rows_of(unit, first).records() for r in chunk]
    watcher.close()
    events = [
        (json.loads(r.key)["_row_id"], json.loads(r.value)) for r in records if r.topic.endswith(".changes")
    ]

    before, after = _oracle(table, first - 1), _oracle(table, catch_up.last)
    want = {
        **{k: ("c", None, after[k]) for k in after.keys() - before.keys()},
        **{k: ("d", before[k], None) for k in before.keys() - after.keys()},
        **{k: ("u", before[k], after[k]) for k in before.keys() & after.keys() if before[k] != after[k]},
    }
    got = {row_id: (e["op"], e["before"], e["after"]) for row_id, e in events}
    assert (
        len(got) == len(events)
        and got.keys() == want.keys()
        and {op for op, _, _ in want.values()} >= {"d", "u"}
    )
    for row_id, (op, b, a) in want.items():
        g_op, g_b, g_a = got[row_id]
        assert g_op == op, row_id
        assert (g_b is None) == (b is None) and (b is None or normal_rows([g_b]) == normal_rows([b])), row_id
        assert (g_a is None) == (a is None) and (a is None or normal_rows([g_a]) == normal_rows([a])), row_id
    assert {e["source"]["delta_version"] for _, e in events} == {catch_up.last}
