"""The writers' corpus through the mirror: the watcher publishes every version of every table to a
real broker; ``consume-snapshot``'s state is the table's files, and the change feed read back from
the mirror is the writer's own change data feed (tests/support/corpus.py).
"""

from __future__ import annotations

import uuid

import pyarrow as pa
import pytest

from deltamirror.consumer.mirror_changes import MirrorIndex, MirrorSettings, read_mirror_versions
from deltamirror.consumer.snapshot import SnapshotConsumer
from deltamirror.core import open_table
from deltamirror.core.changes import changes_from_actions
from deltamirror.core.replay import file_keys
from deltamirror.mirror.records.boundary import RecordRules
from support.corpus import CorpusTable, corpus_tables, expected_cdf, normal_rows, table_location
from support.watching import watch_until

TABLES = corpus_tables()
#: tables whose metaData.id changes within the log (CREATE OR REPLACE TABLE)
REPLACED = {"spark__replace"}


def _keys(files: pa.Table) -> set[str]:
    return set(file_keys(files["path"], files["deletionVector"]).to_pylist())


@pytest.mark.kafka
@pytest.mark.timeout(180)
@pytest.mark.parametrize("table", TABLES, ids=lambda t: t.id)
def test_the_mirror_of_a_writers_table_is_the_table(kafka_bootstrap: str, table: CorpusTable) -> None:
    location, prefixes = table_location(table)
    core = open_table(location, allowed_path_prefixes=prefixes)
    latest = core.latest_version()
    name = f"corpus-{uuid.uuid4().hex[:10]}"
    actions = f"{name}.actions"
    watch_until(
        kafka_bootstrap,
        location,
        actions,
        latest,
        name,
        snapshot_mode="from-version",
        from_version=0,
        allowed_path_prefixes=prefixes,
    )

    # consume-snapshot's state, built from every version's events
    consumer = SnapshotConsumer(
        kafka_bootstrap,
        actions,
        group_id=f"{name}-state",
        rules=RecordRules(allowed_path_prefixes=tuple(prefixes)),  # a shallow clone's source
    )
    consumer.run(once=True)
    snap = core.snapshot()
    state = consumer.tables[snap.metadata.id]  # a replaced table (CREATE OR REPLACE) has a new id
    assert state.version == latest
    assert _keys(state.files) == _keys(snap.files)
    # a table replaced under a new metaData.id is a new table from the replacing version on: its
    # state holds the files of that version on, and says it did not see the table from its start
    assert state.complete == (table.id not in REPLACED)
    want_files = table.expected["versions"][str(latest)].get("num_files")
    if want_files is not None:
        assert state.files.num_rows == want_files

    # the change feed read back from the mirror is the writer's
    cdf = table.expected["cdf"]
    if cdf is None or "error" in cdf:
        return
    settings = MirrorSettings(
        kafka_bootstrap, actions, f"{name}.commits", location, allowed_path_prefixes=tuple(prefixes)
    )
    index = MirrorIndex(settings)
    try:
        index.refresh()
        index.check_available(cdf["start"], cdf["end"])
        partition = index.actions_partition()
        assert index.table_id is not None
        table_id, ts = index.table_id, index.timestamp(cdf["start"])
    finally:
        index.close()
    versions = read_mirror_versions(
        settings,
        table_id=table_id,
        partition=partition,
        start=cdf["start"],
        end=cdf["end"],
        start_timestamp_ms=ts,
    )
    feed = changes_from_actions(core, snap.metadata, snap.version, versions)
    rows = pa.Table.from_batches(list(feed), schema=feed.schema).to_pylist()
    assert normal_rows(rows) == normal_rows(expected_cdf(table, cdf["rows"]))
