"""Reading a table's change feed from its mirror, without Spark: planning and reading versions."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from deltamirror.consumer.mirror_changes import MirrorIndex, MirrorSettings, read_mirror_versions
from deltamirror.core.changes import changes_from_actions
from deltamirror.core.table import open_table
from deltamirror.mirror.errors import EventStreamError
from deltamirror.mirror.events import SCHEMA_VERSION, CommitSummary, Heartbeat, TableReplaced
from support.tables import copy_table
from support.watching import watch_until


def _summary(
    version: int, *, table_id: str = "id-1", snapshot: bool = False, uri: str = "file:///data/t"
) -> bytes:
    return CommitSummary(
        schema_version=SCHEMA_VERSION,
        table_id=table_id,
        table_uri=uri,
        version=version,
        commit_timestamp=1_000 + version,
        commit_timestamp_source="file-time",
        snapshot=snapshot,
        action_count=2,
        adds=1,
        removes=0,
        cdc_files=0,
        bytes_added=1,
        bytes_removed=0,
    ).to_json_bytes()


def _heartbeat(version: int) -> bytes:
    return Heartbeat(
        schema_version=SCHEMA_VERSION,
        table_id="id-1",
        table_uri="file:///data/t",
        latest_version=version,
        commit_timestamp=1_000 + version,
        commit_timestamp_source="file-time",
        heartbeat_timestamp=5_000,
    ).to_json_bytes()


def _index(*records: tuple[bytes, str]) -> MirrorIndex:
    index = MirrorIndex(MirrorSettings("unused:1", "t.actions", "t.commits", "/data/t"))
    for value, kind in records:
        index._take(value, kind.encode())
    return index


def test_the_index_knows_which_versions_are_wholly_mirrored() -> None:
    index = _index(
        (_summary(3), "commit"),
        (_summary(4), "commit"),
        (_summary(4, uri="file:///data/other"), "commit"),  # another table on the same topic
        (_heartbeat(4), "heartbeat"),
        (b'{"kind":"aNewKind","schemaVersion":1}', "aNewKind"),  # a kind a newer watcher may write
    )
    assert (index.first, index.latest, index.table_id) == (3, 4, "id-1")
    assert index.unknown_kinds == 1
    index.check_available(3, 4)
    with pytest.raises(EventStreamError, match="its commits start at version 3"):
        index.check_available(2, 4)
    with pytest.raises(EventStreamError, match="not all in the mirror yet"):
        index.check_available(4, 5)


def test_a_snapshot_or_a_jump_is_never_read_as_changes() -> None:
    index = _index(
        (_summary(5, snapshot=True), "commit"),
        (_summary(6), "commit"),
        (_summary(9, snapshot=True), "commit"),
    )
    assert index.first == 6 and index.latest == 9
    index.check_available(6, 6)
    with pytest.raises(EventStreamError, match="versions 7-8 are not in the mirror"):
        index.check_available(6, 9)
    with pytest.raises(EventStreamError, match="as a snapshot"):
        index.check_available(9, 9)


def test_a_recreated_table_stops_the_feed() -> None:
    replaced = TableReplaced(
        schema_version=SCHEMA_VERSION,
        table_uri="file:///data/t",
        table_id="id-2",
        previous_table_id="id-1",
        previous_version=4,
        reason="version 0 has a new metaData.id",
        detected_at=1,
    ).to_json_bytes()
    with pytest.raises(EventStreamError, match="created anew"):
        _index((_summary(3), "commit"), (replaced, "tableReplaced"))
    with pytest.raises(EventStreamError, match="table id changed"):
        _index((_summary(3), "commit"), (_summary(4, table_id="id-2"), "commit"))


# --- against the real broker ---------------------------------------------------------------------


@pytest.mark.kafka
def test_versions_read_from_the_mirror_give_the_logs_change_rows(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    table_dir = copy_table("krs__cdf-table-with-dv", tmp_path)
    table = open_table(str(table_dir))
    latest = table.latest_version()
    actions = f"t-{uuid.uuid4().hex[:10]}.actions"
    watch_until(
        kafka_bootstrap,
        table_dir,
        actions,
        latest,
        f"dm-{uuid.uuid4().hex[:8]}",
        snapshot_mode="from-version",
    )
    settings = MirrorSettings(
        kafka_bootstrap, actions, actions.replace(".actions", ".commits"), str(table_dir)
    )
    index = MirrorIndex(settings)
    try:
        index.refresh()
        assert (index.first, index.latest) == (0, latest)
        start = 1
        index.check_available(start, latest)
        partition = index.actions_partition()
        assert index.table_id is not None
        table_id, ts, ts_last = index.table_id, index.timestamp(start), index.timestamp(latest)
    finally:
        index.close()

    def rows(start_timestamp_ms: int) -> Any:
        versions = read_mirror_versions(
            settings,
            table_id=table_id,
            partition=partition,
            start=start,
            end=latest,
            start_timestamp_ms=start_timestamp_ms,
        )
        snapshot = table.snapshot()
        feed = changes_from_actions(table, snapshot.metadata, snapshot.version, versions)
        return pa.Table.from_batches(list(feed), schema=feed.schema)

    expected = table.changes(starting_version=start).to_arrow()
    assert expected.num_rows > 0
    assert rows(ts).equals(expected)
    # a seek that lands past the start (clamped or rewritten record times) reads from the start
    assert latest > start
    assert rows(ts_last).equals(expected)
    assert rows(ts_last + 10**9).equals(expected)  # no record that late: from the start
