"""The incremental snapshot against core's own replay, and the snapshot consumer against a real broker."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deltamirror.consumer.snapshot import (
    IncrementalSnapshot,
    Invalidation,
    SnapshotConsumer,
    StateStore,
    TableReplacement,
    file_key,
)
from deltamirror.core.errors import ConfigError
from deltamirror.core.replay import file_keys
from deltamirror.core.table import open_table
from deltamirror.mirror.errors import EventStreamError
from deltamirror.mirror.records.events import ActionEvent, TableReplaced, decode_action_event
from deltamirror.producer.publishing.offline_events import iter_event_values
from deltamirror.producer.tailing.snapshot_events import SnapshotWork
from deltamirror.producer.tailing.summaries import envelope_encoder
from support.records import action_values
from support.tables import TABLES, copy_table, record_rules
from support.watching import watch_until

# tables whose log starts at version 0: updates, DVs, re-added files, canonicalized paths, partitions,
# txns, domain metadata, checkpoints in between
TABLES_FROM_ZERO = [
    "golden__basic-with-inserts-updates",
    "golden__log-replay-dv-key-cases",
    "golden__delete-re-add-same-file-different-transactions",
    "golden__canonicalized-paths-normal-a",
    "golden__basic-with-inserts-deletes-checkpoint",
    "krs__table-with-dv-small",
    "krs__app-txn-no-checkpoint",
    "krs__cdf-table-partitioned",
    "krs__crc-full",
]


def _core_keys(files: pa.Table) -> set[tuple[str, str]]:
    keys = file_keys(files["path"], files["deletionVector"]).to_pylist()
    return {tuple(k.split("\x00", 1)) for k in keys}  # type: ignore[misc]


def _rows_by_key(files: pa.Table) -> dict[tuple[str, str], dict[str, Any]]:
    keys = [tuple(k.split("\x00", 1)) for k in file_keys(files["path"], files["deletionVector"]).to_pylist()]
    cols = ["size", "partitionValues", "deletionVector"]
    rows = files.select(cols).to_pylist()
    for row in rows:
        row["partitionValues"] = dict(row["partitionValues"] or [])
    return dict(zip(keys, rows, strict=True))  # type: ignore[arg-type]


def _by_version(values: list[bytes]) -> dict[int, list[bytes]]:
    out: dict[int, list[bytes]] = defaultdict(list)
    for value in values:
        out[json.loads(value)["version"]].append(value)
    return out


def _assert_matches_core(state: IncrementalSnapshot, table: Any, version: int) -> None:
    snap = table.snapshot(version, check_features=False)
    assert state.version == version
    assert state.file_keys == _core_keys(snap.files), f"files differ at version {version}"
    assert _rows_by_key(state.files) == _rows_by_key(snap.files), f"file rows differ at version {version}"
    assert state.metadata is not None and state.metadata["id"] == snap.metadata.id
    assert state.protocol is not None
    assert state.protocol["minReaderVersion"] == snap.protocol.min_reader_version
    assert {a: t["version"] for a, t in state.txns.items()} == {a: t.version for a, t in snap.txns.items()}
    assert set(state.domains) == set(snap.domains)


@pytest.mark.parametrize("table_id", TABLES_FROM_ZERO)
def test_applying_every_version_gives_cores_snapshot_at_each_version(table_id: str) -> None:
    table = open_table(str(TABLES / table_id))
    values = list(iter_event_values(str(TABLES / table_id)))
    versions = _by_version(values)
    assert min(versions) == 0
    state = IncrementalSnapshot(json.loads(values[0])["tableId"])
    rules: Any = record_rules(table_id)
    for version in sorted(versions):
        *head, last = versions[version]
        assert state.apply_values(head, rules=rules) == []  # nothing changes before the last action
        (applied,) = state.apply_values([last], rules=rules)
        assert applied.version == version and not applied.snapshot
        assert applied.files == state.file_count
        _assert_matches_core(state, table, version)
    assert state.complete
    assert len(state.invalidations()) == len(versions)
    assert state.invalidations() == []


def test_invalidations_name_the_files_added_and_removed_with_their_partitions() -> None:
    table = open_table(str(TABLES / "krs__cdf-table-partitioned"))
    values = list(iter_event_values(table.uri))
    state = IncrementalSnapshot(json.loads(values[0])["tableId"])
    state.apply_values(values)
    for inv in state.invalidations():
        actions = [json.loads(v) for v in values if json.loads(v)["version"] == inv.version]
        adds = {a["action"]["path"] for a in actions if a["type"] == "add"}
        removes = {a["action"]["path"] for a in actions if a["type"] == "remove"}
        assert set(inv.added) == adds
        assert set(inv.removed) == removes - adds
        touched = [a["action"]["partitionValues"] for a in actions if a["type"] in ("add", "remove")]
        assert sorted(map(json.dumps, inv.partitions)) == sorted(
            {json.dumps(p, sort_keys=True) for p in touched}
        )


def _snapshot_values(path: Path | str, version: int) -> list[bytes]:
    """The snapshot events the watcher publishes for ``version`` (its own classes, no Kafka)."""
    snap = open_table(str(path)).snapshot(version, check_features=False)
    work = SnapshotWork(snap, open_table(str(path)).uri, snap.timestamp)
    encoder = envelope_encoder(work)
    out: list[bytes] = []
    for batch in work.batches(1000):
        out.extend(encoder.encode_many(len(out), batch))
    return out


@pytest.mark.parametrize(
    "table_id",
    [
        "golden__basic-with-inserts-deletes-checkpoint",
        "krs__table-with-dv-small",
        "krs__cdf-table-partitioned",
    ],
)
def test_a_snapshot_replaces_the_state_and_tailing_continues_after_it(table_id: str) -> None:
    path = TABLES / table_id
    table = open_table(str(path))
    latest = table.latest_version()
    start = max(1, latest - 2)  # after version 0, which is applied first
    state = IncrementalSnapshot(table.snapshot(check_features=False).metadata.id)
    # an unrelated partial state first: the snapshot must replace it, not merge
    first = list(iter_event_values(str(path), ending_version=0))
    state.apply_values(first)
    snapshot = _snapshot_values(path, start)
    assert state.apply_values(snapshot[:-1]) == []
    assert state.version == 0  # incomplete snapshot: nothing applied yet
    (applied,) = state.apply_values(snapshot[-1:])
    assert applied.snapshot and applied.version == start
    _assert_matches_core(state, table, start)
    gone = _core_keys(table.snapshot(0, check_features=False).files) - state.file_keys
    assert sorted(applied.removed) == sorted(p for p, _ in gone)
    tail = list(iter_event_values(str(path), starting_version=start + 1)) if start < latest else []
    for version, vals in sorted(_by_version(tail).items()):
        state.apply_values(vals)
        _assert_matches_core(state, table, version)


def test_a_snapshot_supersedes_an_unfinished_version() -> None:
    path = TABLES / "golden__basic-with-inserts-updates"
    values = list(iter_event_values(str(path)))
    v0 = _by_version(values)[0]
    v1 = _by_version(values)[1]
    state = IncrementalSnapshot(json.loads(values[0])["tableId"])
    state.apply_values(v0)
    state.apply_values(v1[:1])  # version 1 interrupted
    state.apply_values(_snapshot_values(path, 1))
    assert not state.in_progress
    _assert_matches_core(state, open_table(str(path)), 1)


def test_versions_already_applied_are_skipped_and_gaps_and_disorder_are_errors() -> None:
    path = TABLES / "golden__log-replay-dv-key-cases"
    versions = _by_version(list(iter_event_values(str(path))))
    table_id = json.loads(versions[0][0])["tableId"]
    state = IncrementalSnapshot(table_id)
    state.apply_values(versions[0])
    assert state.apply_values(versions[0]) == []  # a re-read after a restart
    assert state.skipped_events == len(versions[0])
    with pytest.raises(EventStreamError, match="versions are missing"):
        IncrementalSnapshot(table_id).apply_values([*versions[0], *versions[2]])
    assert len(versions[1]) > 2
    with pytest.raises(EventStreamError, match="arrived after action 0"):
        IncrementalSnapshot(table_id).apply_values([*versions[0], versions[1][0], versions[1][2]])
    with pytest.raises(EventStreamError, match="without the actions"):
        IncrementalSnapshot(table_id).apply_values([*versions[0], versions[1][-1]])
    with pytest.raises(EventStreamError, match="starts while version 1 is incomplete"):
        IncrementalSnapshot(table_id).apply_values([*versions[0], versions[1][0], versions[2][0]])
    with pytest.raises(EventStreamError, match="not an action event"):
        decode_action_event(b'{"tableId": "x"}')


def test_state_round_trips_through_json() -> None:
    path = TABLES / "golden__log-replay-dv-key-cases"
    values = list(iter_event_values(str(path)))
    state = IncrementalSnapshot(json.loads(values[0])["tableId"])
    state.apply_values(values)
    again = IncrementalSnapshot.from_json(json.loads(json.dumps(state.to_json())))
    assert again.version == state.version and again.complete
    assert again.files.equals(state.files)
    assert again.metadata == state.metadata and again.txns == state.txns


def _partition_set(values: list[dict[str, str | None]]) -> set[str]:
    return {json.dumps(v, sort_keys=True) for v in values}


@pytest.mark.parametrize("table_id", TABLES_FROM_ZERO)
def test_invalidations_are_the_difference_between_cores_snapshots(table_id: str) -> None:
    """Per version: removed = files of core's snapshot before and not after; added = files after
    that an add of the version names; partitions = theirs (computed here from core and the raw
    actions, not with the consumer's code)."""
    table = open_table(str(TABLES / table_id))
    values = list(iter_event_values(str(TABLES / table_id)))
    state = IncrementalSnapshot(json.loads(values[0])["tableId"])
    before: dict[tuple[str, str], dict[str, Any]] = {}
    for version, vals in sorted(_by_version(values).items()):
        (inv,) = state.apply_values(vals, rules=record_rules(table_id))  # type: ignore[arg-type]
        after = _rows_by_key(table.snapshot(version, check_features=False).files)
        actions = [json.loads(v) for v in vals]
        add_keys = {file_key(a["action"]) for a in actions if a["type"] == "add"}
        added = add_keys & set(after)
        removed = set(before) - set(after)
        assert sorted(inv.added) == sorted(p for p, _ in added), f"version {version}"
        assert sorted(inv.removed) == sorted(p for p, _ in removed), f"version {version}"
        expected_partitions = [after[k]["partitionValues"] for k in added]
        expected_partitions += [before[k]["partitionValues"] for k in removed]
        assert _partition_set(list(inv.partitions)) == _partition_set(expected_partitions)
        assert len(inv.partitions) == len(_partition_set(list(inv.partitions)))  # distinct
        before = after


PROTOCOL = ("protocol", {"minReaderVersion": 1, "minWriterVersion": 2})
METADATA = (
    "metaData",
    {"id": "t", "format": {"provider": "parquet"}, "partitionColumns": [], "configuration": {}},
)


def _add(path: str, part: str, **extra: Any) -> tuple[str, dict[str, Any]]:
    action = {
        "path": path,
        "partitionValues": {"p": part},
        "size": 1,
        "modificationTime": 0,
        "dataChange": True,
    }
    return "add", {**action, **extra}


def _remove(path: str, part: str, **extra: Any) -> tuple[str, dict[str, Any]]:
    return "remove", {"path": path, "partitionValues": {"p": part}, "dataChange": True, **extra}


def test_a_file_added_twice_in_one_version_is_kept_once_as_its_last_add() -> None:
    """Appends take a short way (no reconcile); it must not apply when a version names a file twice,
    by the same path or by two spellings of it, even without a remove."""
    state = IncrementalSnapshot("t")
    state.apply_values(action_values(0, [PROTOCOL, METADATA]))
    (inv,) = state.apply_values(
        action_values(
            1,
            [
                _add("file:/t/a", "1", stats="first"),
                _add("b", "2"),
                _add("/t/a", "1", stats="last"),  # the canonical path of file:/t/a
            ],
        )
    )
    assert inv.files == 2 and sorted(inv.added) == ["/t/a", "b"]
    (inv,) = state.apply_values(
        action_values(2, [_add("c", "3", stats="first"), _add("c", "3", stats="again")])
    )
    assert inv.files == 3 and inv.added == ("c",)
    rows = {r["path"]: r["stats"] for r in state.files.to_pylist()}
    assert rows == {"/t/a": "last", "b": None, "c": "again"}


def test_invalidation_of_rewrites_dv_updates_and_snapshots_in_one_version() -> None:
    dv = {
        "storageType": "u",
        "pathOrInlineDv": "ab^-aqEH.-t@S}K{vb[*k^",
        "offset": 4,
        "sizeInBytes": 40,
        "cardinality": 6,
    }
    state = IncrementalSnapshot("t")
    state.apply_values(
        action_values(
            0,
            [
                PROTOCOL,
                METADATA,
                _add("a", "1"),
                _add("b", "2"),
                _add("c", "3"),
                _add("file:/t/d", "4"),
            ],
        )
    )
    (inv,) = state.apply_values(
        action_values(
            1,
            [
                _remove("a", "1"),
                _add("a", "1", stats="new"),  # the same key removed and written again: added only
                _remove("b", "2"),
                _add("b", "2", deletionVector=dv),  # a DV update: another key, the path in both lists
                _add("e", "5"),
                _remove("e", "5"),  # added and removed within the version: neither
                _remove("/t/d", "4"),  # the canonical path of file:/t/d
            ],
        )
    )
    assert sorted(inv.added) == ["a", "b"] and sorted(inv.removed) == ["/t/d", "b"]
    assert _partition_set(list(inv.partitions)) == _partition_set([{"p": "1"}, {"p": "2"}, {"p": "4"}])
    assert inv.files == 3
    rows = {(r["path"], r["deletionVector"] is not None): r for r in state.files.to_pylist()}
    assert set(rows) == {("a", False), ("b", True), ("c", False)} and rows["a", False]["stats"] == "new"
    # a snapshot is compared with the state it replaces
    (snap,) = state.apply_values(
        action_values(
            5,
            [
                PROTOCOL,
                METADATA,
                _add("c", "3"),
                _add("f", "6"),
            ],
            snapshot=True,
        )
    )
    assert snap.snapshot and sorted(snap.added) == ["f"] and sorted(snap.removed) == ["a", "b"]
    assert _partition_set(list(snap.partitions)) == _partition_set([{"p": "6"}, {"p": "1"}, {"p": "2"}])
    assert state.file_keys == {("c", ""), ("f", "")}


def test_files_is_one_arrow_table_with_the_columns_of_an_add() -> None:
    from deltamirror.core.action_schema import ADD

    values = list(iter_event_values(str(TABLES / "golden__basic-with-inserts-deletes-checkpoint")))
    state = IncrementalSnapshot(json.loads(values[0])["tableId"])
    state.apply_values(values)
    assert state.files.schema == ADD
    assert state.files is state.files  # the state itself, not rebuilt per access
    assert state.files.num_rows == state.file_count == len(state.file_keys)


def test_an_add_that_does_not_fit_the_add_columns_is_an_event_stream_error() -> None:
    values = list(iter_event_values(str(TABLES / "golden__basic-with-inserts-updates"), ending_version=0))
    events = [json.loads(v) for v in values]
    first_add = next(e for e in events if e["type"] == "add")
    first_add["action"]["size"] = "not a number"
    state = IncrementalSnapshot(events[0]["tableId"])
    with pytest.raises(EventStreamError, match=r"add\.size: expected a non-negative 64-bit integer") as info:
        state.apply_values([json.dumps(e) for e in events])
    assert info.value.version == 0
    assert state.version is None  # nothing applied


# --- persistence --------------------------------------------------------------------------------


def _applied(table_id: str, **versions: int) -> IncrementalSnapshot:
    values = list(iter_event_values(str(TABLES / table_id), **versions))
    state = IncrementalSnapshot(json.loads(values[0])["tableId"])
    state.apply_values(values, rules=record_rules(table_id))  # type: ignore[arg-type]
    return state


def _assert_same_state(a: IncrementalSnapshot, b: IncrementalSnapshot) -> None:
    assert (a.table_id, a.table_uri, a.version, a.complete) == (
        b.table_id,
        b.table_uri,
        b.version,
        b.complete,
    )
    assert a.files.equals(b.files)
    assert (a.metadata, a.protocol, a.txns, a.domains) == (b.metadata, b.protocol, b.txns, b.domains)


def _folder(root: Path) -> Path:
    """The one table folder of a state directory."""
    (folder,) = (p for p in (root / "tables").iterdir() if p.is_dir())
    return folder


@pytest.mark.parametrize("table_id", TABLES_FROM_ZERO)
def test_state_store_round_trips_each_table_as_a_delta_checkpoint_folder(
    table_id: str, tmp_path: Path
) -> None:
    state = _applied(table_id)
    store = StateStore(tmp_path, "t.actions")
    store.save([state], {0: 42})
    folder = _folder(tmp_path)
    assert folder == store.folder(state.table_id)
    v = f"{state.version:020d}"
    assert sorted(p.name for p in (folder / "_delta_log").iterdir()) == [
        f"{v}.checkpoint.parquet",
        f"{v}.json",
        "_last_checkpoint",
    ]
    assert list((tmp_path / "tables").iterdir()) == [folder]
    offsets = json.loads((tmp_path / "offsets.json").read_text())
    assert offsets["format"] == 3 and offsets["partitions"] == {"0": 42}
    assert offsets["tables"] == {
        state.table_id: {
            "folder": f"tables/{folder.name}",
            "version": state.version,
            "tableUri": state.table_uri,
        }
    }
    tables, loaded_offsets = StateStore(tmp_path, "t.actions").load()
    assert loaded_offsets == {0: 42}
    _assert_same_state(tables[state.table_id], state)
    # the loaded state goes on like the original: core's snapshot at the latest version
    table = open_table(str(TABLES / table_id))
    _assert_matches_core(tables[state.table_id], table, table.latest_version())


def test_a_newer_save_keeps_the_previous_checkpoint_and_leftovers_are_cleaned_on_load(tmp_path: Path) -> None:
    path = TABLES / "golden__log-replay-dv-key-cases"
    versions = _by_version(list(iter_event_values(str(path))))
    assert len(versions) >= 3
    state = IncrementalSnapshot(json.loads(versions[0][0])["tableId"])
    store = StateStore(tmp_path, "t.actions")
    for v in range(3):
        state.apply_values(versions[v])
        store.save([state], {0: v + 1})
    log_dir = _folder(tmp_path) / "_delta_log"

    def names() -> list[str]:
        return sorted(p.name for p in log_dir.iterdir())

    kept = [f"{v:020d}.{kind}" for v in (1, 2) for kind in ("checkpoint.parquet", "json")]
    # the version-0 checkpoint went once version 2's was saved; version 1's stays for a reader
    assert names() == sorted([*kept, "_last_checkpoint"])
    # what a crash in the middle of a save leaves: a checkpoint the hint does not name yet, a temp
    # file, a table folder without a hint, a temp offsets file
    (log_dir / f"{9:020d}.checkpoint.parquet").write_bytes(b"partial")
    (log_dir / f".{9:020d}.json.tmp").write_bytes(b"{")
    (tmp_path / "tables" / "0123456789abcdef" / "_delta_log").mkdir(parents=True)
    tables, _ = StateStore(tmp_path, "t.actions").load()
    assert names() == sorted([*kept, "_last_checkpoint"])
    assert [p.name for p in (tmp_path / "tables").iterdir()] == [log_dir.parent.name]
    _assert_matches_core(tables[state.table_id], open_table(str(path)), 2)


def _format_2_store(root: Path, state: IncrementalSnapshot, offsets: dict[str, int]) -> None:
    """A state directory as deltamirror wrote it before format 3: a sidecar beside a Parquet file."""
    import pyarrow.parquet as pq

    tables_dir = root / "tables"
    tables_dir.mkdir(parents=True)
    name = f"aaaaaaaaaaaaaaaa-v{state.version}-00000000.parquet"
    pq.write_table(state.files, tables_dir / name)
    sidecar = state.sidecar(name)
    assert sidecar["format"] == 2
    (tables_dir / "aaaaaaaaaaaaaaaa.json").write_text(json.dumps(sidecar))
    (tables_dir / "bbbbbbbbbbbbbbbb-v1-00000000.parquet").write_bytes(b"a leftover")
    (root / "offsets.json").write_text(json.dumps({"topic": "t.actions", "partitions": offsets}))


@pytest.mark.parametrize("legacy_format", [1, 2])
def test_format_1_and_2_state_dirs_are_read_and_migrated_to_checkpoint_folders(
    tmp_path: Path, legacy_format: int
) -> None:
    state = _applied("krs__cdf-table-partitioned")
    tables_dir = tmp_path / "tables"
    if legacy_format == 1:
        # one JSON document per table, every add inline
        legacy = state.to_json()
        assert legacy["format"] == 1 and len(legacy["files"]) == state.file_count
        tables_dir.mkdir(parents=True)
        (tables_dir / "aaaaaaaaaaaaaaaa.json").write_text(json.dumps(legacy))
        (tmp_path / "offsets.json").write_text(json.dumps({"topic": "t.actions", "partitions": {"0": 7}}))
    else:
        _format_2_store(tmp_path, state, {"0": 7})
    tables, offsets = StateStore(tmp_path, "t.actions").load()
    assert offsets == {0: 7}
    loaded = tables[state.table_id]
    assert loaded.file_keys == state.file_keys and loaded.version == state.version
    assert _rows_by_key(loaded.files) == _rows_by_key(state.files)
    # rewritten as format 3 at once: a folder, offsets.json in format 3, the old files gone
    folder = _folder(tmp_path)
    assert [p.name for p in tables_dir.iterdir()] == [folder.name]
    assert json.loads((tmp_path / "offsets.json").read_text())["format"] == 3
    again, _ = StateStore(tmp_path, "t.actions").load()
    assert again[state.table_id].files.equals(loaded.files)


def test_a_migration_cut_short_is_finished_from_the_folder_it_wrote(tmp_path: Path) -> None:
    """A crash after a table's folder was written and before the old files went: the folder is in
    force (the old files would give the same state), and the old files go."""
    state = _applied("krs__cdf-table-partitioned")
    _format_2_store(tmp_path, state, {"0": 7})
    StateStore(tmp_path, "t.actions").write_tables([state])
    assert len(list((tmp_path / "tables").glob("*.json"))) == 1
    tables, offsets = StateStore(tmp_path, "t.actions").load()
    assert offsets == {0: 7}
    _assert_same_state(tables[state.table_id], state)
    assert [p.name for p in (tmp_path / "tables").iterdir()] == [_folder(tmp_path).name]


def test_unknown_state_formats_and_damaged_state_dirs_are_refused(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    state = _applied("golden__basic-with-inserts-updates")
    StateStore(tmp_path, "t.actions").save([state], {0: 1})
    with pytest.raises(ConfigError, match="not 'other'"):
        StateStore(tmp_path, "other").load()
    checkpoint = next((_folder(tmp_path) / "_delta_log").glob("*.checkpoint.parquet"))
    good = checkpoint.read_bytes()
    # a checkpoint cut short
    checkpoint.write_bytes(good[: len(good) // 2])
    with pytest.raises(ConfigError, match="delete"):
        StateStore(tmp_path, "t.actions").load()
    # a checkpoint of a newer format, or not the consumer's (no document in its footer)
    table = pq.read_table(pa.BufferReader(good))
    document = json.loads(table.schema.metadata[b"deltamirror.state"])
    pq.write_table(
        table.replace_schema_metadata({b"deltamirror.state": json.dumps({**document, "format": 4})}),
        checkpoint,
    )
    with pytest.raises(ConfigError, match="format 4"):
        StateStore(tmp_path, "t.actions").load()
    pq.write_table(table.replace_schema_metadata({}), checkpoint)
    with pytest.raises(ConfigError, match="not a state this consumer wrote"):
        StateStore(tmp_path, "t.actions").load()
    # a document whose file count is not the checkpoint's
    pq.write_table(
        table.replace_schema_metadata(
            {b"deltamirror.state": json.dumps({**document, "fileCount": table.num_rows + 1})}
        ),
        checkpoint,
    )
    with pytest.raises(ConfigError, match="delete"):
        StateStore(tmp_path, "t.actions").load()
    checkpoint.write_bytes(good)
    assert StateStore(tmp_path, "t.actions").load()[0][state.table_id].files.equals(state.files)
    # offsets.json or an old-style file of a format this deltamirror does not know
    offsets = json.loads((tmp_path / "offsets.json").read_text())
    (tmp_path / "offsets.json").write_text(json.dumps({**offsets, "format": 9}))
    with pytest.raises(ConfigError, match="format 9"):
        StateStore(tmp_path, "t.actions").load()
    (tmp_path / "offsets.json").write_text(json.dumps(offsets))
    (tmp_path / "tables" / "cccccccccccccccc.json").write_text(json.dumps({"format": 5}))
    with pytest.raises(ConfigError, match="format 5"):
        StateStore(tmp_path, "t.actions").load()


def test_a_restart_continues_from_the_unfinished_version_without_the_broker(tmp_path: Path) -> None:
    path = TABLES / "golden__log-replay-dv-key-cases"
    table = open_table(str(path))
    values = list(iter_event_values(str(path)))
    versions = _by_version(values)
    cut = len(versions[0]) + len(versions[1]) + 1  # versions 0 and 1, and the first action of 2
    applied: list[Invalidation] = []
    first = SnapshotConsumer(
        "unused:9092",
        "t.actions",
        state_dir=tmp_path,
        on_applied=lambda i, _: applied.append(i),
        checkpoint_interval_versions=2,
    )
    for offset, value in enumerate(values[:cut]):
        first.handle("t.actions", 0, offset, value)
    assert applied == []  # reported at the batch's checkpoint
    restart_at = len(versions[0]) + len(versions[1])
    # what a checkpoint stores for the group commit (the real broker's side: the loop tests)
    assert first.position.offsets == {0: restart_at}
    first.checkpoint()  # two versions applied: a save is due
    assert [i.version for i in applied] == [0, 1] and first.saves == 1

    second = SnapshotConsumer("unused:9092", "t.actions", state_dir=tmp_path)
    assert second.position.offsets == {0: restart_at}
    (state,) = second.tables.values()
    _assert_matches_core(state, table, 1)
    for offset in range(restart_at, len(values)):
        second.handle("t.actions", 0, offset, values[offset])
    second.checkpoint()
    assert second.saves == 0  # not due (100 versions or 60 s by default) ...
    second.save()  # ... but the loop's end saves
    assert state.skipped_events == 0
    _assert_matches_core(state, table, table.latest_version())
    # read again from the start (e.g. offsets lost): every event is skipped, nothing changes
    third = SnapshotConsumer("unused:9092", "t.actions", state_dir=tmp_path)
    for offset, value in enumerate(values):
        third.handle("t.actions", 0, offset, value)
    (state3,) = third.tables.values()
    assert state3.skipped_events == len(values)
    _assert_same_state(state3, state)


# --- re-created tables --------------------------------------------------------------------------

OLD_TABLE = "golden__log-replay-dv-key-cases"
NEW_TABLE = "krs__cdf-table-partitioned"


#: where both tables are, one after the other (the new table's events are rewritten to say so)
LOCATION = "file://" + str(TABLES / OLD_TABLE)


def _at_the_old_location(values: list[bytes]) -> list[bytes]:
    new_uri = json.dumps("file://" + str(TABLES / NEW_TABLE)).encode()
    return [
        v.replace(b'"tableUri":' + new_uri, b'"tableUri":' + json.dumps(LOCATION).encode()) for v in values
    ]


def _replaced_value(old: str, new: str, previous_version: int) -> bytes:
    return TableReplaced(
        schema_version=1,
        table_uri=LOCATION,
        table_id=new,
        previous_table_id=old,
        previous_version=previous_version,
        reason="version 0 was written again",
        detected_at=1,
    ).to_json_bytes()


@pytest.mark.parametrize("notice_first", [False, True])
def test_table_replaced_drops_the_previous_tables_state_and_files(tmp_path: Path, notice_first: bool) -> None:
    old_values = list(iter_event_values(str(TABLES / OLD_TABLE)))
    new_values = _at_the_old_location(list(iter_event_values(str(TABLES / NEW_TABLE))))
    old_id, new_id = json.loads(old_values[0])["tableId"], json.loads(new_values[0])["tableId"]
    assert old_id != new_id and json.loads(new_values[0])["tableUri"] == LOCATION
    old_latest = open_table(str(TABLES / OLD_TABLE)).latest_version()
    notices: list[TableReplacement] = []
    order: list[str] = []

    def consumer() -> SnapshotConsumer:
        return SnapshotConsumer(
            "unused:9092",
            "t.actions",
            commits_topic="t.commits",
            state_dir=tmp_path,
            on_applied=lambda inv, _: order.append(f"{inv.table_id}@{inv.version}"),
            on_replaced=lambda n: (notices.append(n), order.append("replaced")),
            checkpoint_interval_versions=1,  # a save at each checkpoint
        )

    first = consumer()
    for offset, value in enumerate(old_values):
        first.handle("t.actions", 0, offset, value)
    first.checkpoint()
    old_folder = _folder(tmp_path)
    old_files = first.tables[old_id].file_count
    assert order == [f"{old_id}@{v}" for v in range(old_latest + 1)]
    order.clear()

    # the commits topic: a record of a kind a newer watcher may write is skipped, then the notice
    second = consumer()
    commits = [b'{"kind":"somethingNew","schemaVersion":1}', _replaced_value(old_id, new_id, old_latest)]
    headers = [[("kind", b"somethingNew")], [("kind", b"tableReplaced")]]
    actions = list(enumerate(new_values, start=len(old_values)))
    if notice_first:
        for offset, (value, hdrs) in enumerate(zip(commits, headers, strict=True)):
            second.handle("t.commits", 0, offset, value, hdrs)
        # old events read again after the notice (e.g. actions lagging): skipped, no new state
        for offset, value in enumerate(old_values):
            second.handle("t.actions", 0, offset, value)
        assert old_id not in second.tables and second.skipped_retired_events == len(old_values)
    for offset, value in actions:
        second.handle("t.actions", 0, offset, value)
    if not notice_first:
        for offset, (value, hdrs) in enumerate(zip(commits, headers, strict=True)):
            second.handle("t.commits", 0, offset, value, hdrs)
    assert second.position.commits_offsets == {0: 2}  # what the checkpoint stores for the group
    assert second.unknown_kinds == 1
    second.checkpoint()

    (notice,) = notices
    assert (notice.previous_table_id, notice.table_id, notice.previous_version) == (
        old_id,
        new_id,
        old_latest,
    )
    assert (notice.dropped_version, notice.dropped_files) == (old_latest, old_files)
    new_latest = open_table(str(TABLES / NEW_TABLE)).latest_version()
    applied_new = [f"{new_id}@{v}" for v in range(new_latest + 1)]
    assert order == (["replaced", *applied_new] if notice_first else [*applied_new, "replaced"])
    assert set(second.tables) == {new_id}
    # on disk: the new table only; the previous one's folder is gone
    assert not old_folder.exists()
    assert _folder(tmp_path) == StateStore(tmp_path, "t.actions").folder(new_id)
    offsets = json.loads((tmp_path / "offsets.json").read_text())
    assert offsets["retired"] == {old_id: old_latest} and offsets["commitsTopic"] == "t.commits"

    # a restart: the new table is there, the old one's events are still skipped
    third = consumer()
    assert set(third.tables) == {new_id} and third.position.commits_offsets == {0: 2}
    _assert_matches_core(third.tables[new_id], open_table(str(TABLES / NEW_TABLE)), new_latest)
    for offset, value in enumerate(old_values):
        third.handle("t.actions", 0, offset, value)
    assert set(third.tables) == {new_id}


def test_a_crash_after_the_offsets_but_before_the_drop_is_finished_on_load(tmp_path: Path) -> None:
    state = _applied(OLD_TABLE)
    store = StateStore(tmp_path, "t.actions", "t.commits")
    store.save([state], {0: 13})
    # step 2 done (the id is retired in offsets.json), step 3 (deleting its files) not
    store.save([], {0: 13}, commits_offsets={0: 1}, retired={state.table_id: 3})
    assert _folder(tmp_path).is_dir()
    tables, _ = StateStore(tmp_path, "t.actions", "t.commits").load()
    assert tables == {}
    assert list((tmp_path / "tables").iterdir()) == []


def test_a_state_dir_of_another_commits_topic_is_refused(tmp_path: Path) -> None:
    StateStore(tmp_path, "t.actions", "t.commits").save([], {0: 1}, commits_offsets={0: 5})
    with pytest.raises(ConfigError, match=r"commits topic 't\.commits'"):
        StateStore(tmp_path, "t.actions", "other.commits").load()
    # following no commits topic any more keeps the retired ids; starting to follow one reads it all
    assert StateStore(tmp_path, "t.actions").load_all()[1].commits_offsets == {}
    assert StateStore(tmp_path, "t.actions", "t.commits").load_all()[1].commits_offsets == {0: 5}


# --- against a real broker ----------------------------------------------------------------------


@dataclass(frozen=True)
class Mirrored:
    """A copy of a table, topics of its own (named as the watcher names them with ``name``) and a
    state dir, for a test that runs the watcher and a consumer on them."""

    bootstrap: str
    table: Path
    name: str
    state_dir: Path
    latest: int

    @property
    def actions(self) -> str:
        return f"{self.name}.actions"

    @property
    def commits(self) -> str:
        return f"{self.name}.commits"

    def watch(self, until_version: int, table_id: str | None = None) -> None:
        """Run the watcher in-process (snapshot first) until ``until_version`` is published."""
        watch_until(self.bootstrap, self.table, self.actions, until_version, self.name, table_id=table_id)

    def consume_once(self, *extra: str) -> list[dict[str, Any]]:
        """``consume-snapshot --once`` on the actions topic with the state dir: its output lines."""
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "deltamirror.cli.main",
                "consume-snapshot",
                "--bootstrap-servers",
                self.bootstrap,
                "--topic",
                self.actions,
                "--state-dir",
                str(self.state_dir),
                "--once",
                *extra,
            ],
            capture_output=True,
            timeout=40,
        )
        assert done.returncode == 0, done.stderr.decode()[-2000:]
        return [json.loads(line) for line in done.stdout.splitlines() if line]


@pytest.fixture
def mirrored(kafka_bootstrap: str, tmp_path: Path) -> Mirrored:
    table = copy_table("golden__basic-with-inserts-updates", tmp_path)
    name = f"dmsc-{uuid.uuid4().hex[:10]}"
    return Mirrored(kafka_bootstrap, table, name, tmp_path / "state", open_table(str(table)).latest_version())


@pytest.mark.kafka
@pytest.mark.timeout(120)
def test_consumer_follows_the_watcher_and_resumes_from_its_state_dir(
    kafka_bootstrap: str, mirrored: Mirrored
) -> None:
    from deltalake import write_deltalake

    table, actions, state_dir, latest = mirrored.table, mirrored.actions, mirrored.state_dir, mirrored.latest
    core = open_table(str(table))
    mirrored.watch(latest)

    lines = mirrored.consume_once()
    assert [(line["version"], line["snapshot"]) for line in lines] == [(latest, True)]
    assert lines[0]["files"] == core.snapshot(latest).files.num_rows
    (persisted,) = StateStore(state_dir, actions).load()[0].values()
    assert persisted.file_keys == _core_keys(core.snapshot(latest).files)
    assert _folder(state_dir).is_dir()

    # another commit (delta-rs writes to the copied table), published, then the same state dir
    write_deltalake(str(table), open_table(str(table)).snapshot(latest).to_arrow().slice(0, 3), mode="append")
    mirrored.watch(latest + 1)
    lines = mirrored.consume_once()
    after = open_table(str(table)).snapshot(latest + 1)
    assert lines == [
        {
            "tableId": after.metadata.id,
            "version": latest + 1,
            "files": after.files.num_rows,
            "added": 1,
            "removed": 0,
            "snapshot": False,
        }
    ]

    # the library API, from scratch (no state dir): the whole topic gives the same state
    seen: list[Invalidation] = []
    consumer = SnapshotConsumer(kafka_bootstrap, actions, on_applied=lambda inv, _: seen.append(inv))
    consumer.run(once=True)
    assert [(i.version, i.snapshot) for i in seen] == [(latest, True), (latest + 1, False)]
    (state,) = consumer.tables.values()
    assert state.file_keys == _core_keys(after.files) and state.complete
    assert mirrored.consume_once() == []  # nothing new: nothing applied


@pytest.mark.kafka
@pytest.mark.timeout(120)
def test_a_long_running_consumer_waits_for_its_topic_applies_as_records_come_and_commits(
    kafka_bootstrap: str, mirrored: Mirrored
) -> None:
    import threading
    import time

    from confluent_kafka import Consumer, TopicPartition

    actions, group, latest = mirrored.actions, f"{mirrored.name}-group", mirrored.latest
    seen: list[Invalidation] = []
    consumer = SnapshotConsumer(
        kafka_bootstrap,
        actions,
        group_id=group,
        state_dir=mirrored.state_dir,
        on_applied=lambda inv, _: seen.append(inv),
    )
    errors: list[BaseException] = []

    def run() -> None:
        try:
            consumer.run(topic_timeout_s=5)  # the topic does not exist yet: it is waited for
        except BaseException as exc:  # reported by the test's thread
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    time.sleep(2)
    assert thread.is_alive() and not errors and seen == []
    mirrored.watch(latest)
    deadline = time.monotonic() + 60
    while not seen and time.monotonic() < deadline and thread.is_alive():
        time.sleep(0.2)
    consumer.request_stop()
    thread.join(30)
    assert not thread.is_alive() and not errors
    assert [(i.version, i.snapshot) for i in seen] == [(latest, True)]
    position = StateStore(mirrored.state_dir, actions).load()[1]
    assert position == consumer.position.offsets and sum(position.values()) > 0
    # the group's offsets are what the state says (for lag in Kafka's tools), committed on close
    reader = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": group})
    try:
        committed = reader.committed([TopicPartition(actions, p) for p in position], timeout=10)
    finally:
        reader.close()
    assert {tp.partition: tp.offset for tp in committed} == position


@pytest.mark.timeout(60)
def test_a_consumer_stopped_while_waiting_for_its_topic_returns() -> None:
    """No broker answers: without ``once`` the metadata is asked again until the stop."""
    import threading

    stop = threading.Event()
    consumer = SnapshotConsumer("127.0.0.1:1", "never.actions", stop=stop)
    thread = threading.Thread(target=consumer.run, daemon=True)
    thread.start()
    thread.join(1.5)
    assert thread.is_alive()  # still asking
    stop.set()
    thread.join(15)
    assert not thread.is_alive()


def test_events_model_is_the_contract() -> None:
    """decode_action_event accepts exactly what the encoder writes (guards a drift between the two)."""
    value = next(iter(iter_event_values(str(TABLES / "golden__basic-with-inserts-updates"))))
    assert decode_action_event(value) == ActionEvent.model_validate_json(value)


@pytest.mark.kafka
@pytest.mark.timeout(180)
def test_a_recreated_table_drops_the_previous_state_with_commits_topic(
    kafka_bootstrap: str, mirrored: Mirrored
) -> None:
    import shutil

    from deltalake import write_deltalake

    table, actions, state_dir = mirrored.table, mirrored.actions, mirrored.state_dir
    old = open_table(str(table)).snapshot()
    mirrored.watch(old.version)
    lines = mirrored.consume_once("--commits-topic", mirrored.commits)
    assert [(line["tableId"], line["version"]) for line in lines] == [(old.metadata.id, old.version)]

    # the table deleted and written again at the same place: another metaData.id, version 0 again
    rows = old.to_arrow()
    shutil.rmtree(table)
    write_deltalake(str(table), rows.slice(0, 5))
    write_deltalake(str(table), rows.slice(5, 5), mode="append")
    new = open_table(str(table)).snapshot()
    assert new.metadata.id != old.metadata.id
    mirrored.watch(new.version, table_id=new.metadata.id)

    lines = mirrored.consume_once("--commits-topic", mirrored.commits)
    replaced = [line for line in lines if line.get("kind") == "tableReplaced"]
    assert replaced == [
        {
            "kind": "tableReplaced",
            "tableId": new.metadata.id,
            "previousTableId": old.metadata.id,
            "previousVersion": old.version,
            "droppedVersion": old.version,
            "droppedFiles": old.files.num_rows,
            "tableUri": new.table.uri,
        }
    ]
    applied = [line for line in lines if "kind" not in line]
    assert {line["tableId"] for line in applied} == {new.metadata.id}
    assert applied[-1]["version"] == new.version and applied[-1]["files"] == new.files.num_rows
    (state,) = StateStore(state_dir, actions, mirrored.commits).load()[0].values()
    assert state.table_id == new.metadata.id and state.file_keys == _core_keys(new.files)
    assert _folder(state_dir) == StateStore(state_dir, actions).folder(new.metadata.id)

    # from scratch, the library reads both topics from their beginning and ends the same
    notices: list[TableReplacement] = []
    consumer = SnapshotConsumer(
        kafka_bootstrap, actions, commits_topic=mirrored.commits, on_replaced=notices.append
    )
    consumer.run(once=True)
    assert list(consumer.tables) == [new.metadata.id]
    assert [(n.previous_table_id, n.table_id) for n in notices] == [(old.metadata.id, new.metadata.id)]
    assert consumer.retired == {old.metadata.id: old.version}


def test_cli_refuses_to_guess_the_commits_topic_of_a_non_default_actions_topic() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "deltamirror.cli.main",
            "consume-snapshot",
            "--bootstrap-servers",
            "127.0.0.1:1",
            "--topic",
            "orders-events",
            "--commits-topic",
        ],
        capture_output=True,
        timeout=30,
    )
    assert done.returncode == 2
    assert b"give the commits topic by name" in done.stderr


@settings(max_examples=200, deadline=None)
@given(
    batches=st.lists(
        st.lists(st.sampled_from([f"p{i}" for i in range(40)] + ["file:/x", "/x"]), max_size=12), max_size=25
    ),
    probes=st.lists(st.sampled_from([f"p{i}" for i in range(50)] + ["/x"]), min_size=1, max_size=5),
)
def test_the_path_index_never_misses_a_path_it_was_given(batches: list[list[str]], probes: list[str]) -> None:
    """The index behind the append shortcut: "no" must be right; "maybe" may be wrong."""
    from deltamirror.consumer.snapshot.files import PathIndex

    if not PathIndex.available:
        pytest.skip("pyarrow without search_sorted")
    index = PathIndex(pa.array([], pa.string()))
    given_paths: set[str] = set()
    for batch in batches:
        index.extend(pa.array(batch, pa.string()))
        given_paths.update(batch)
    assert index.size == sum(map(len, batches))
    # nothing was removed here, so the answer is exact (the index compares paths as given)
    assert index.may_hold_any(pa.array(probes, pa.string())) == any(p in given_paths for p in probes)


@settings(max_examples=200, deadline=None)
@given(
    batches=st.lists(st.lists(st.sampled_from([f"p{i}" for i in range(30)]), max_size=12), max_size=12),
    drops=st.lists(st.lists(st.integers(0, 200), max_size=8), max_size=12),
    probes=st.lists(st.sampled_from([f"p{i}" for i in range(35)]), min_size=1, max_size=5, unique=True),
)
def test_the_path_index_reading_the_states_paths_finds_exactly_their_rows(
    batches: list[list[str]], drops: list[list[int]], probes: list[str]
) -> None:
    """Runs that keep only positions (they read the paths through ``lookup``, as the state's
    index does) find every row of a path, after merges and after rows are dropped."""
    from deltamirror.consumer.snapshot import files as files_module
    from deltamirror.consumer.snapshot.files import PathIndex

    if not PathIndex.available:
        pytest.skip("pyarrow without search_sorted")
    table: list[str] = []  # the rows the positions are of
    original = files_module.KEEP_PATHS_BELOW, files_module.FENCE_EVERY
    files_module.KEEP_PATHS_BELOW, files_module.FENCE_EVERY = 4, 2  # most runs keep fences only
    try:
        index = PathIndex(
            pa.array([], pa.string()),
            lookup=lambda rows: pa.array([table[r] for r in rows.to_pylist()], pa.string()),
        )
        for batch, drop in zip(batches, drops + [[]] * len(batches), strict=False):
            index.extend(pa.array(batch, pa.string()), len(table))
            table += batch
            dead = sorted({d for d in drop if d < len(table)})
            if dead:
                index.drop(pa.array(dead, pa.int64()))
                table = [p for i, p in enumerate(table) if i not in set(dead)]
            found = sorted(index.positions(pa.array(probes, pa.string())).to_pylist())
            assert found == sorted(i for i, p in enumerate(table) if p in probes)
            assert index.size == len(table)
    finally:
        files_module.KEEP_PATHS_BELOW, files_module.FENCE_EVERY = original


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.lists(st.sampled_from(["a", "b", "c", "dd", None]), max_size=6), min_size=1, max_size=8),
    st.lists(st.integers(0, 60), max_size=30),
)
def test_values_taken_from_chunks_are_those_of_a_take_over_the_combined_chunks(
    chunks: list[list[str | None]], wanted: list[int]
) -> None:
    """``take_values`` reads each value from its chunk (empty chunks and nulls included) and gives
    them in the order asked, as a take over the combined chunks does."""
    from deltamirror.consumer.snapshot.files import take_values

    values = pa.chunked_array([pa.array(c, pa.string()) for c in chunks], pa.string())
    indices = pa.array([w for w in wanted if w < len(values)], pa.int64())
    expected = values.combine_chunks().take(indices)
    assert take_values(values, indices).equals(expected)
    assert take_values(values, pa.chunked_array([indices], pa.int64())).equals(expected)


def test_a_large_first_run_of_chunked_paths_is_indexed_without_a_copy_of_them() -> None:
    """The state's files come in chunks: the index of the first (large) run sorts them where they
    are, holds positions and fences only, and finds every row of a path, as an index built from
    the combined paths does."""
    from deltamirror.consumer.snapshot import files as files_module
    from deltamirror.consumer.snapshot.files import PathIndex, take_values

    if not PathIndex.available:
        pytest.skip("pyarrow without search_sorted")
    names = [f"part={i % 7}/f-{(i * 7919) % 5000:05d}.parquet" for i in range(5000)]
    chunked = pa.chunked_array([pa.array(names[i : i + 333], pa.string()) for i in range(0, 5000, 333)])
    original = files_module.KEEP_PATHS_BELOW
    files_module.KEEP_PATHS_BELOW = 1000
    try:
        index = PathIndex(chunked, lookup=lambda rows: take_values(chunked, rows))
        flat = PathIndex(chunked.combine_chunks(), lookup=lambda rows: take_values(chunked, rows))
    finally:
        files_module.KEEP_PATHS_BELOW = original
    assert index.distinct() and index.size == 5000
    probes = pa.array([names[0], names[4321], names[2500], "part=0/none.parquet"], pa.string())
    expected = sorted(i for i, n in enumerate(names) if n in probes.to_pylist())
    assert sorted(index.positions(probes).to_pylist()) == expected
    assert sorted(flat.positions(probes).to_pylist()) == expected


def test_handle_joins_split_records_per_key_and_resumes_before_one_still_in_part() -> None:
    """On a shared topic another table's records come between a split record's fragments: each
    table's record is joined on its own, and the position never passes the first fragment of a
    record still in part (a restart there would read its later fragments alone and lose it)."""
    from deltamirror.mirror.records.fragments import split_oversize

    def version0(table: str, path: str) -> list[bytes]:
        meta = ("metaData", {**METADATA[1], "id": table, "description": "d" * 3000})
        return action_values(
            0, [meta, PROTOCOL, _add(path, "1")], table_id=table, table_uri=f"file:///{table}"
        )

    values_a, headers_a = split_oversize(version0("a", "x"), [[]] * 3, 1024, "split")
    a = [(b"a", v, h) for v, h in zip(values_a, headers_a, strict=True)]
    b = [(b"b", v, []) for v in version0("b", "y")]
    assert a[0][2] and a[1][2]  # a's version begins with its metaData's fragments
    order = [*a[:2], *b, *a[2:]]  # b's version whole between them
    consumer = SnapshotConsumer("unused:9092", "t.actions")
    positions = []
    for offset, (key, value, headers) in enumerate(order):
        consumer.handle("t.actions", 0, offset, value, headers, key=key)
        positions.append(consumer.position.offsets.get(0))
    assert sorted(s.table_id for s in consumer.tables.values()) == ["a", "b"]
    assert all(len(s.files) == 1 and not s.in_progress for s in consumer.tables.values())
    # b's version applied while a's first record is still in part: the position stays before it
    assert consumer.tables["b"] is not None and positions[1 + len(b)] == 0
    assert positions[-1] == len(order)
