"""The watcher's row changes without a broker: the records of each unit it hands out, unpaired back
into rows, are core's change feed; snapshots as ``"r"``; bad keys and bad change types refused;
the settings and the ``--row-changes`` flag."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from deltamirror.core.errors import ChangeDataNotEnabledError, ConfigError, CorruptDataFileError
from deltamirror.core.table import open_table
from deltamirror.mirror.topic_names import default_topics
from deltamirror.producer.publishing.row_events import RowChangesSource
from deltamirror.producer.settings import RowChangesConfig, TableConfig, WatchConfig, merge_overrides
from deltamirror.producer.tailing.snapshot_events import SnapshotWork
from deltamirror.producer.tailing.watcher import TableWatcher
from deltamirror.producer.tailing.work import CommitWork
from support.row_events import expected_rows as _expected
from support.row_events import records as _records
from support.row_events import unpaired as _unpaired
from support.spark_scenarios import normalize_cdf_rows
from support.tables import TABLES


@pytest.mark.parametrize(
    ("table_id", "start", "key"),
    [
        ("gen__long-log-cdf", 0, ["id", "part"]),
        ("gen__long-log-cdf", 0, []),
        ("krs__cdf-table-with-dv", 0, []),
        ("krs__cdf-table", 0, ["id"]),
        ("krs__cdf-column-mapping-name-mode", 1, ["id"]),
    ],
)
def test_records_unpaired_are_cores_change_feed(table_id: str, start: int, key: list[str]) -> None:
    records = _records(table_id, start, RowChangesConfig(key_columns=key))
    got = normalize_cdf_rows(_unpaired(records))
    expected = _expected(table_id, start, paired=bool(key))
    assert got and got == expected
    ops = {json.loads(r.value)["op"] for r in records if r.value and r.topic.endswith(".changes")}
    assert ("u" in ops) == any(r["_change_type"] == "update_preimage" for r in expected)


def test_a_change_type_no_event_can_say_stops_the_table() -> None:
    with pytest.raises(CorruptDataFileError, match="update_pre"):
        _records("krs__cdf-table-update-ops", 0, RowChangesConfig())


def test_a_key_column_the_table_lacks_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="nope"):
        _records("krs__cdf-table", 0, RowChangesConfig(key_columns=["nope"]))


def test_snapshot_rows_are_read_events_the_last_one_marked() -> None:
    path = str(TABLES / "krs__cdf-table")
    watcher = TableWatcher(path, mode="initial")
    watcher.start(None)
    unit = watcher.next_work()
    assert isinstance(unit, SnapshotWork)
    source = RowChangesSource(watcher.table, RowChangesConfig(key_columns=["id"]), default_topics(path), "t")
    records = [r for chunk in source.rows_of(unit).records() for r in chunk if r.topic.endswith(".changes")]
    events = [json.loads(r.value) for r in records if r.value]
    assert {e["op"] for e in events} == {"r"}
    assert [e["source"]["snapshot"] for e in events] == ["true"] * (len(events) - 1) + ["last"]
    rows = open_table(path).snapshot().to_arrow().to_pylist()
    assert sorted(e["after"]["id"] for e in events) == sorted(r["id"] for r in rows)
    watcher.close()


def test_row_changes_flag_turns_them_on_for_every_table_keeping_their_own_settings() -> None:
    cfg = WatchConfig.model_validate(
        {
            "kafka": {"bootstrap_servers": "localhost:9092"},
            "tables": [
                "/data/a",
                {"uri": "/data/b", "row_changes": {"enabled": False, "key_columns": ["id"]}},
            ],
        }
    )
    assert not any(t.row_changes_on for t in cfg.tables)
    merged = merge_overrides(cfg, {"row_changes": True})
    assert [t.row_changes_on for t in merged.tables] == [True, True]
    assert merged.tables[1].row_changes is not None and merged.tables[1].row_changes.key_columns == ["id"]
    assert merge_overrides(cfg, {"row_changes": None}) == cfg


def test_cli_flag() -> None:
    from deltamirror.cli.main import build_parser

    args = build_parser().parse_args(["watch", "/data/a", "--row-changes"])
    assert args.row_changes is True
    assert build_parser().parse_args(["watch", "/data/a"]).row_changes is None


def test_topics_must_differ_and_format_is_checked() -> None:
    with pytest.raises(ValueError, match="must differ"):
        TableConfig(uri="/data/a", changes_topic="x.y", transaction_topic="x.y")
    with pytest.raises(ValueError, match="format"):
        TableConfig.model_validate({"uri": "/data/a", "row_changes": {"format": "avro"}})
    assert default_topics("file:///data/my-table").changes == "deltamirror.my-table.changes"
    assert default_topics("file:///data/my-table").transaction == "deltamirror.my-table.transaction"


def test_a_version_changing_files_without_the_change_data_feed_stops_the_table(
    tmp_path: Path, kit: Any
) -> None:
    table = kit.make_table(tmp_path / "plain", versions=1)  # delta-rs, no delta.enableChangeDataFeed
    watcher = TableWatcher(str(table), mode="from-version", from_version=0)
    watcher.start(None)
    unit = watcher.next_work()
    assert isinstance(unit, CommitWork)
    source = RowChangesSource(watcher.table, RowChangesConfig(), default_topics(watcher.uri), "t")
    with pytest.raises(ChangeDataNotEnabledError):
        source.rows_of(unit)
    watcher.close()
