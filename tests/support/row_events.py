"""The watcher's row changes read without a broker, and the rows they must be (core's change feed)."""

from __future__ import annotations

import json
from typing import Any

from deltamirror.core.changes import read_changes
from deltamirror.core.table import open_table
from deltamirror.mirror.records.record import Record
from deltamirror.mirror.topic_names import default_topics
from deltamirror.producer.publishing.row_events import RowChangesSource
from deltamirror.producer.settings import RowChangesConfig
from deltamirror.producer.tailing.watcher import TableWatcher
from deltamirror.producer.tailing.work import CommitWork
from support.spark_scenarios import normalize_cdf_rows
from support.tables import TABLES

_UNPAIRED = {"update_preimage": "delete", "update_postimage": "insert"}


def records(table_id: str, start: int, config: RowChangesConfig) -> list[Record]:
    """The records a watcher of ``table_id`` (from ``start``) publishes for its row changes."""
    watcher = TableWatcher(str(TABLES / table_id), mode="from-version", from_version=start)
    watcher.start(None)
    source = RowChangesSource(watcher.table, config, default_topics(watcher.uri), "t")
    out: list[Record] = []
    while (unit := watcher.next_work()) is not None:
        assert isinstance(unit, CommitWork)
        out += [r for chunk in source.rows_of(unit).records() for r in chunk]
    watcher.close()
    return out


def unpaired(records: list[Record]) -> list[dict[str, Any]]:
    """The change rows the events on the changes topic say (an update as its two images)."""
    rows = []
    for r in records:
        if not r.topic.endswith(".changes") or r.value is None:
            continue
        e = json.loads(r.value)
        meta = {"_commit_version": e["source"]["delta_version"], "_commit_timestamp": e["ts_ms"] * 1000}
        if e["op"] == "u":
            rows += [
                {**e["before"], "_change_type": "update_preimage", **meta},
                {**e["after"], "_change_type": "update_postimage", **meta},
            ]
        elif e["op"] == "d":
            rows.append({**e["before"], "_change_type": "delete", **meta})
        else:
            rows.append({**e["after"], "_change_type": "insert", **meta})
    return rows


def expected_rows(table_id: str, start: int, *, paired: bool) -> list[dict[str, Any]]:
    """Core's change feed of ``table_id`` as the events carry it (unpaired updates as delete and
    insert when ``paired`` is false: no key pairs them)."""
    rows = read_changes(open_table(str(TABLES / table_id)), starting_version=start).to_arrow().to_pylist()
    for row in rows:
        if not paired:
            row["_change_type"] = _UNPAIRED.get(row["_change_type"], row["_change_type"])
        for k, v in row.items():
            if k == "_commit_timestamp":
                row[k] = int(v.timestamp() * 1_000_000)
            elif hasattr(v, "toordinal"):  # dates as days since the epoch, as the records carry them
                row[k] = v.toordinal() - 719163
    return normalize_cdf_rows(rows)
