"""``drop_file_stats``: action events without the stats and tags of add and remove actions, every
file still named; the rest of each action as the log has it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from deltamirror.core.table import open_table
from deltamirror.producer.publishing.transactions import without_file_stats
from support.tables import TABLES
from support.watching import watch_until


def test_stats_and_tags_leave_only_add_and_remove_actions() -> None:
    add = b'{"path":"a.parquet","size":3,"stats":"{\\"numRecords\\":1}","tags":{"INSERTION_TIME":"1"},"dataChange":true}'
    remove = {"path": "b.parquet", "deletionTimestamp": 1, "dataChange": True, "stats": "{}"}
    plain_add = b'{"path":"c.parquet","size":3,"dataChange":true}'
    info = b'{"operation":"WRITE","tags":{"kept":"yes"}}'
    out = without_file_stats([("add", add), ("remove", remove), ("add", plain_add), ("commitInfo", info)])
    assert out[0] == ("add", {"path": "a.parquet", "size": 3, "dataChange": True})
    assert out[1] == ("remove", {"path": "b.parquet", "deletionTimestamp": 1, "dataChange": True})
    assert out[2] == ("add", plain_add)  # nothing to drop: the log's own bytes
    assert out[3] == ("commitInfo", info)
    assert "stats" in remove  # the caller's data is not changed


@pytest.mark.kafka
@pytest.mark.timeout(120)
def test_drop_file_stats_publishes_every_file_without_its_stats(
    kafka_bootstrap: str, kit: Any, tmp_path: Path
) -> None:
    path = TABLES / "krs__cdf-table"
    log = [
        json.loads(line)
        for f in sorted((path / "_delta_log").glob("*.json"))
        for line in f.read_text().splitlines()
    ]
    files = [(name, a[name]) for a in log for name in ("add", "remove") if name in a]
    assert any("stats" in body for _, body in files)  # the premise: the log has stats to drop
    prefix = kit.unique("stats")
    actions = f"{prefix}.actions"
    end = open_table(str(path)).latest_version()
    watch_until(
        kafka_bootstrap, path, actions, end, prefix, snapshot_mode="from-version", drop_file_stats=True
    )
    events = [json.loads(r.value) for r in kit.consume(kafka_bootstrap, [actions], idle_s=0.5)]
    published = [(e["type"], e["action"]) for e in events if e["type"] in ("add", "remove")]
    assert [(n, b["path"]) for n, b in published] == [(n, b["path"]) for n, b in files]
    for (_, got), (_, logged) in zip(published, files, strict=True):
        assert got == {k: v for k, v in logged.items() if k not in ("stats", "tags")}
