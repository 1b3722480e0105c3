"""The snapshot consumer's state as a Delta checkpoint: opened by delta-rs and by core, and saved at
its interval with a restart that re-reads (never loses) what came after the last save.

Expectations come from core's own snapshot of the original table (and the data it reads from it),
never from the checkpoint writer.
"""

from __future__ import annotations

import json
import shutil
import urllib.parse
from collections import defaultdict
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from deltamirror.consumer.snapshot import IncrementalSnapshot, Invalidation, SnapshotConsumer, StateStore
from deltamirror.core.errors import ConfigError, IncompleteTableStateError
from deltamirror.core.table import open_table
from deltamirror.producer.publishing.offline_events import iter_event_values
from support.tables import TABLES

# deletion vectors (u, rewritten as p), encoded partition paths, txns, domain metadata, V2 checkpoints
READER_TABLES = [
    "krs__table-with-dv-small",
    "golden__dv-partitioned-with-checkpoint",
    "krs__cdf-table-partitioned",
    "krs__app-txn-no-checkpoint",
    "drs__table_with_liquid_clustering",
    "drs__checkpoint-v2-table",
]


def _state(path: Path | str, **versions: int) -> IncrementalSnapshot:
    values = list(iter_event_values(str(path), **versions))
    state = IncrementalSnapshot(json.loads(values[0])["tableId"])
    state.apply_values(values)
    return state


def _saved_folder(state: IncrementalSnapshot, root: Path, *, marker: bool = False) -> Path:
    """The table's folder after a save; without ``marker`` only the checkpoint and its hint stay."""
    store = StateStore(root, "t.actions")
    store.save([state], {0: 1})
    folder = store.folder(state.table_id)
    if not marker:
        (folder / "_delta_log" / f"{state.version:020d}.json").unlink()
    assert sorted(p.name for p in (folder / "_delta_log").iterdir()) == sorted(
        [f"{state.version:020d}.checkpoint.parquet", "_last_checkpoint"]
        + ([f"{state.version:020d}.json"] if marker else [])
    )
    return folder


def _root_uri(table: Path) -> str:
    return "file://" + urllib.parse.quote(str(table.resolve()))


def _absolute(root_uri: str, path: str) -> str:
    return path if path.startswith(("/", "file:")) else f"{root_uri}/{path}"


def _sorted_rows(table: pa.Table) -> list[tuple[Any, ...]]:
    return sorted((tuple(map(repr, row.values())) for row in table.to_pylist()), key=repr)


@pytest.mark.parametrize("table_id", READER_TABLES)
def test_a_checkpoint_folder_opens_in_delta_rs_and_core_as_the_table(table_id: str, tmp_path: Path) -> None:
    from deltalake import DeltaTable

    path = TABLES / table_id
    original = open_table(str(path)).snapshot()
    state = _state(path)
    assert state.version == original.version
    folder = _saved_folder(state, tmp_path)
    root = _root_uri(path)
    expected = {
        _absolute(root, p): (size, dict(pv or []))
        for p, size, pv in zip(
            original.files["path"].to_pylist(),
            original.files["size"].to_pylist(),
            original.files["partitionValues"].to_pylist(),
            strict=True,
        )
    }

    # delta-rs: the version, the table's identity and the file list (absolute paths to the table)
    dt = DeltaTable(str(folder))
    assert dt.version() == original.version
    assert dt.metadata().id == original.metadata.id
    assert dt.metadata().partition_columns == original.partition_columns
    assert dt.protocol().min_reader_version == original.protocol.min_reader_version
    adds = pa.table(dt.get_add_actions(flatten=True))
    assert dict(zip(adds["path"].to_pylist(), adds["size_bytes"].to_pylist(), strict=True)) == {
        p: size for p, (size, _) in expected.items()
    }
    for app_id, txn in original.txns.items():
        assert dt.transaction_version(app_id) == txn.version

    # core: the same snapshot (files, metaData, protocol, txns, domains), and the same rows read
    # through the absolute paths and the rewritten deletion vectors
    snap = open_table(str(folder), allowed_path_prefixes=[root]).snapshot()
    assert snap.version == original.version
    got = {
        p: (size, dict(pv or []))
        for p, size, pv in zip(
            snap.files["path"].to_pylist(),
            snap.files["size"].to_pylist(),
            snap.files["partitionValues"].to_pylist(),
            strict=True,
        )
    }
    assert got == expected
    assert snap.metadata.model_dump() == original.metadata.model_dump()
    assert snap.protocol.model_dump() == original.protocol.model_dump()
    assert {a: t.version for a, t in snap.txns.items()} == {a: t.version for a, t in original.txns.items()}
    assert {d: m.configuration for d, m in snap.domains.items()} == {
        d: m.configuration for d, m in original.domains.items()
    }
    dv_cardinality = [dv["cardinality"] if dv else 0 for dv in original.files["deletionVector"].to_pylist()]
    assert sorted(dv_cardinality) == sorted(
        dv["cardinality"] if dv else 0 for dv in snap.files["deletionVector"].to_pylist()
    )
    assert _sorted_rows(snap.to_arrow()) == _sorted_rows(original.to_arrow())


def test_the_checkpoint_and_its_hint_follow_the_protocol(tmp_path: Path) -> None:
    path = TABLES / "drs__checkpoint-v2-table"  # v2Checkpoint: the checkpoint says which version it is
    state = _state(path)
    folder = _saved_folder(state, tmp_path, marker=True)
    log_dir = folder / "_delta_log"
    checkpoint = log_dir / f"{state.version:020d}.checkpoint.parquet"
    rows = pq.read_table(checkpoint)
    hint = json.loads((log_dir / "_last_checkpoint").read_text())
    assert hint == {
        "version": state.version,
        "size": rows.num_rows,
        "sizeInBytes": checkpoint.stat().st_size,
        "numOfAddFiles": state.file_count,
    }
    kinds = defaultdict(int)
    for row in rows.drop_columns(["deltamirror"]).to_pylist():
        (kind,) = [k for k, v in row.items() if v is not None]  # one action per row
        kinds[kind] += 1
    assert dict(kinds) == {"protocol": 1, "metaData": 1, "checkpointMetadata": 1, "add": state.file_count}
    meta = rows["checkpointMetadata"].drop_null().to_pylist()
    assert meta == [{"version": state.version, "tags": None}]
    protocol = rows["protocol"].drop_null().to_pylist()[0]
    assert protocol["minReaderVersion"] == 3 and "v2Checkpoint" in protocol["readerFeatures"]
    # the marker commit beside it holds a commitInfo only
    (line,) = (log_dir / f"{state.version:020d}.json").read_text().splitlines()
    assert list(json.loads(line)) == ["commitInfo"]
    # below reader 3 / writer 7 the feature lists are null (PROTOCOL.md "Checkpoint Schema")
    old = _state(TABLES / "krs__app-txn-no-checkpoint")
    old_rows = pq.read_table(
        _saved_folder(old, tmp_path / "old") / "_delta_log" / f"{old.version:020d}.checkpoint.parquet"
    )
    (old_protocol,) = old_rows["protocol"].drop_null().to_pylist()
    assert old_protocol["minReaderVersion"] < 3 and old_protocol["readerFeatures"] is None
    assert old_protocol["minWriterVersion"] < 7 and old_protocol["writerFeatures"] is None


def test_a_table_whose_location_needs_percent_encoding_is_read_through_the_folder(tmp_path: Path) -> None:
    """Relative paths are joined to the table URI with its path percent-encoded."""
    table = tmp_path / "a table #1 %20 é"
    shutil.copytree(TABLES / "golden__dv-partitioned-with-checkpoint", table)
    original = open_table(str(table)).snapshot()
    state = _state(table)
    assert state.table_uri == f"file://{table}"  # the watcher's normalized location: not encoded
    folder = _saved_folder(state, tmp_path / "state")
    snap = open_table(str(folder), allowed_path_prefixes=[str(table)]).snapshot()
    assert all(p.startswith(_root_uri(table) + "/") for p in snap.files["path"].to_pylist())
    assert _sorted_rows(snap.to_arrow()) == _sorted_rows(original.to_arrow())


def test_a_partial_state_is_refused_by_every_reader(tmp_path: Path) -> None:
    """A state built from a later version lacks the files added before it: readers must refuse it
    rather than list some of the table's files; the consumer reads it back whole."""
    from deltalake import DeltaTable

    path = TABLES / "golden__dv-partitioned-with-checkpoint"
    state = _state(path, starting_version=5)
    assert not state.complete and state.version == open_table(str(path)).latest_version()
    folder = _saved_folder(state, tmp_path)
    with pytest.raises(IncompleteTableStateError, match="no protocol and no metaData"):
        open_table(str(folder)).snapshot()
    with pytest.raises(Exception, match=r"(?i)protocol|metadata"):
        DeltaTable(str(folder))
    (loaded,) = StateStore(tmp_path, "t.actions").load()[0].values()
    assert loaded.files.equals(state.files) and not loaded.complete
    assert (loaded.metadata, loaded.protocol) == (state.metadata, state.protocol)


# --- the interval and a restart between saves ----------------------------------------------------


def _versions(values: list[bytes]) -> list[list[bytes]]:
    out: dict[int, list[bytes]] = defaultdict(list)
    for value in values:
        out[json.loads(value)["version"]].append(value)
    return [out[v] for v in sorted(out)]


def test_saves_come_at_the_interval_and_a_restart_applies_and_reports_again_what_came_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = TABLES / "golden__dv-partitioned-with-checkpoint"
    table = open_table(str(path))
    values = list(iter_event_values(str(path)))
    versions = _versions(values)
    assert len(versions) >= 10
    now = [1000.0]
    monkeypatch.setattr("deltamirror.consumer.snapshot.loop.time.monotonic", lambda: now[0])
    reported: list[int] = []

    def consumer() -> SnapshotConsumer:
        return SnapshotConsumer(
            "unused:9092",
            "t.actions",
            state_dir=tmp_path,
            on_applied=lambda inv, _: reported.append(inv.version),
            checkpoint_interval_versions=4,
            checkpoint_interval_s=30,
        )

    first = consumer()
    offset = 0
    saved_at: list[int] = []
    for v, records in enumerate(versions[:7]):  # one version per batch
        for value in records:
            first.handle("t.actions", 0, offset, value)
            offset += 1
        first.checkpoint()
        if first.saves > len(saved_at):
            saved_at.append(v)
    assert saved_at == [3]  # after 4 versions
    assert reported == list(range(7))  # reported at each batch, saved or not
    now[0] += 29.9
    first.checkpoint()  # nothing new: nothing happens
    assert first.saves == 1
    now[0] += 0.2
    for value in versions[7]:
        first.handle("t.actions", 0, offset, value)
        offset += 1
    first.checkpoint()  # 30 s after the first change since the save (versions 4 to 7)
    assert first.saves == 2
    for value in versions[8]:
        first.handle("t.actions", 0, offset, value)
        offset += 1
    first.checkpoint()
    assert first.saves == 2 and reported == list(range(9))

    # a crash here (no save since version 7): the restart reads from version 8's first record,
    # applies it again and reports it again
    saved_offset = sum(len(r) for r in versions[:8])
    second = consumer()
    (state,) = second.tables.values()
    assert state.version == 7 and second.position.offsets == {0: saved_offset}
    for o in range(saved_offset, len(values)):
        second.handle("t.actions", 0, o, values[o])
    second.checkpoint()
    assert reported == [*range(9), *range(8, len(versions))]
    assert state.skipped_events == 0
    second.save()
    (loaded,) = StateStore(tmp_path, "t.actions").load()[0].values()
    latest = table.snapshot()
    assert loaded.version == latest.version
    assert sorted(loaded.files["path"].to_pylist()) == sorted(latest.files["path"].to_pylist())


def test_interval_options_are_checked() -> None:
    from deltamirror.core.errors import ConfigError

    for bad in (
        {"checkpoint_interval_versions": 0},
        {"checkpoint_interval_s": 0},
        {"checkpoint_interval_s": -1},
    ):
        with pytest.raises(ConfigError, match="checkpoint_interval"):
            SnapshotConsumer("unused:9092", "t.actions", **bad)  # type: ignore[arg-type]
    consumer = SnapshotConsumer(
        "unused:9092", "t.actions", checkpoint_interval_versions=None, checkpoint_interval_s=None
    )
    assert consumer.checkpoint_interval_versions is None and consumer.checkpoint_interval_s is None


def test_reports_come_before_the_save_that_includes_them(tmp_path: Path) -> None:
    """A report that fails (the consumer dies in it) leaves nothing saved: the restart reports again."""
    values = list(iter_event_values(str(TABLES / "krs__cdf-table-partitioned")))

    def fail(inv: Invalidation, _: IncrementalSnapshot) -> None:
        raise RuntimeError(f"the cache is down at version {inv.version}")

    first = SnapshotConsumer(
        "unused:9092", "t.actions", state_dir=tmp_path, on_applied=fail, checkpoint_interval_versions=1
    )
    for offset, value in enumerate(values):
        first.handle("t.actions", 0, offset, value)
    with pytest.raises(RuntimeError, match="version 0"):
        first.checkpoint()
    assert first.saves == 0
    seen: list[int] = []
    second = SnapshotConsumer(
        "unused:9092", "t.actions", state_dir=tmp_path, on_applied=lambda inv, _: seen.append(inv.version)
    )
    assert second.tables == {} and second.position.offsets == {}
    for offset, value in enumerate(values):
        second.handle("t.actions", 0, offset, value)
    second.checkpoint()
    assert seen == sorted({json.loads(v)["version"] for v in values})


def test_a_save_cut_short_before_the_offsets_only_makes_the_restart_re_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The table's new checkpoint is in force but offsets.json still has the previous save's
    offsets: the restart re-reads the records since then and skips the versions it already has."""
    path = TABLES / "golden__dv-partitioned-with-checkpoint"
    values = list(iter_event_values(str(path)))
    versions = _versions(values)
    first = SnapshotConsumer(
        "unused:9092", "t.actions", state_dir=tmp_path, checkpoint_interval_versions=None
    )
    offset = 0
    for records in versions[:3]:
        for value in records:
            first.handle("t.actions", 0, offset, value)
            offset += 1
    first.checkpoint()
    first.save()
    saved_offset = offset
    for records in versions[3:6]:
        for value in records:
            first.handle("t.actions", 0, offset, value)
            offset += 1
    first.checkpoint()

    def crash(*_: object, **__: object) -> None:
        raise OSError("killed before offsets.json")

    monkeypatch.setattr(StateStore, "_write_position", crash)
    with pytest.raises(OSError, match="killed"):
        first.save()
    monkeypatch.undo()
    second = SnapshotConsumer("unused:9092", "t.actions", state_dir=tmp_path)
    (state,) = second.tables.values()
    assert state.version == 5 and second.position.offsets == {0: saved_offset}
    for o in range(saved_offset, len(values)):
        second.handle("t.actions", 0, o, values[o])
    assert state.skipped_events == sum(len(r) for r in versions[3:6])
    latest = open_table(str(path)).snapshot()
    assert state.version == latest.version
    assert sorted(state.files["path"].to_pylist()) == sorted(latest.files["path"].to_pylist())


# --- the files' stats on disk -------------------------------------------------------------------


@pytest.mark.parametrize("slack", [None, 0], ids=["one-spill", "spill-written-anew-each-version"])
def test_with_a_state_dir_the_stats_stay_on_disk_and_come_back_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, slack: int | None
) -> None:
    """A consumer with a state directory keeps the files' stats on disk, not in memory; a restart
    does not read them from its checkpoint; whenever they are asked for (``files``, a save) they
    are those the table's log has, before and after a restart, a save, and a new spill."""
    import deltamirror.consumer.snapshot.state as state_module

    if slack is not None:
        monkeypatch.setattr(state_module, "SPILL_SLACK_ROWS", slack)
    path = TABLES / "golden__dv-partitioned-with-checkpoint"
    values = list(iter_event_values(str(path)))
    versions = _versions(values)
    half = sum(len(v) for v in versions[: len(versions) // 2])
    in_memory = IncrementalSnapshot(json.loads(values[0])["tableId"])
    in_memory.apply_values(values[:half])

    def handle(consumer: SnapshotConsumer, first: int, last: int) -> None:
        for offset in range(first, last):
            consumer.handle("t.actions", 0, offset, values[offset])
        consumer.checkpoint()

    first = SnapshotConsumer(
        "unused:9092", "t.actions", state_dir=tmp_path, checkpoint_interval_versions=None
    )
    handle(first, 0, half)
    (state,) = first.tables.values()
    assert state.stats_on_disk and not in_memory.stats_on_disk
    assert pa.types.is_integer(state._files.schema.field("stats").type)  # references, not the JSON
    assert state.files.equals(in_memory.files)
    first.save()

    second = SnapshotConsumer(
        "unused:9092", "t.actions", state_dir=tmp_path, checkpoint_interval_versions=None
    )
    (loaded,) = second.tables.values()
    assert loaded.stats_on_disk and loaded.files.equals(in_memory.files)
    handle(second, half, len(values))  # files of the checkpoint and of later versions together
    in_memory.apply_values(values[half:])
    assert loaded.files.equals(in_memory.files)
    second.save()

    (again,) = SnapshotConsumer("unused:9092", "t.actions", state_dir=tmp_path).tables.values()
    assert again.files.equals(in_memory.files)
    core = open_table(str(path)).snapshot().files
    stats = dict(zip(again.files["path"].to_pylist(), again.files["stats"].to_pylist(), strict=True))
    assert stats == dict(zip(core["path"].to_pylist(), core["stats"].to_pylist(), strict=True))
    assert any(stats.values())


@pytest.mark.parametrize("stats_on_disk", [True, False], ids=["state-dir", "store-load"])
def test_a_restart_reads_the_saved_files_only_when_a_version_needs_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stats_on_disk: bool
) -> None:
    """A restart with nothing new to apply reads none of the saved files (their count comes from
    the checkpoint's document); the first version to apply, a read of ``files`` or a save reads
    them, once, and the state is then the one a consumer that never stopped holds."""
    import deltamirror.consumer.snapshot.table_folder as table_folder

    path = TABLES / "golden__dv-partitioned-with-checkpoint"
    values = list(iter_event_values(str(path)))
    versions = _versions(values)
    half = sum(len(v) for v in versions[: len(versions) // 2])
    in_memory = IncrementalSnapshot(json.loads(values[0])["tableId"])
    in_memory.apply_values(values[:half])
    first = SnapshotConsumer("unused:9092", "t.actions", state_dir=tmp_path)
    for offset in range(half):
        first.handle("t.actions", 0, offset, values[offset])
    first.save()

    reads: list[int] = []
    real = table_folder.files_from_rows

    def counted(*args: Any) -> pa.Table:
        reads.append(1)
        return real(*args)

    monkeypatch.setattr(table_folder, "files_from_rows", counted)
    if stats_on_disk:
        second = SnapshotConsumer("unused:9092", "t.actions", state_dir=tmp_path)
        (loaded,) = second.tables.values()
    else:
        (loaded,) = StateStore(tmp_path, "t.actions").load()[0].values()
    assert not loaded.files_loaded and reads == []
    assert (loaded.version, loaded.file_count) == (in_memory.version, in_memory.file_count)
    assert in_memory.file_count > 0
    if stats_on_disk:
        second.checkpoint()  # nothing applied: nothing read, nothing saved
        assert reads == [] and second.saves == 0
        for offset in range(half, len(values)):
            second.handle("t.actions", 0, offset, values[offset])
        assert loaded.files_loaded and reads == [1]
        in_memory.apply_values(values[half:])
    else:
        assert loaded.files.equals(in_memory.files) and reads == [1]
    assert loaded.files.equals(in_memory.files) and reads == [1]
    assert loaded.file_count == in_memory.file_count


def test_a_saved_state_whose_files_do_not_read_is_refused_naming_its_checkpoint(tmp_path: Path) -> None:
    """The files are read when first needed; a checkpoint whose document and rows disagree is
    still refused when the state is loaded, naming the file."""
    state = _state(TABLES / "golden__dv-partitioned-with-checkpoint")
    folder = _saved_folder(state, tmp_path)
    checkpoint = folder / "_delta_log" / f"{state.version:020d}.checkpoint.parquet"
    table = pq.read_table(checkpoint)
    pq.write_table(table.slice(0, table.num_rows - state.file_count - 1), checkpoint)  # footer kept
    with pytest.raises(ConfigError, match=str(checkpoint)):
        StateStore(tmp_path, "t.actions").load()


def test_a_save_holds_none_of_the_versions_it_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What :meth:`SnapshotConsumer.checkpoint` reported (a snapshot's report lists every file of
    the table) is let go before the save it then makes: a save never holds a second copy of the
    paths of every file."""
    import gc
    import weakref

    path = TABLES / "golden__dv-partitioned-with-checkpoint"
    values = list(iter_event_values(str(path)))
    reported: list[weakref.ref[Invalidation]] = []
    alive_at_save: list[int] = []

    def on_applied(invalidation: Invalidation, state: IncrementalSnapshot) -> None:
        reported.append(weakref.ref(invalidation))

    real_save = StateStore.save

    def save(self: StateStore, *args: Any, **kwargs: Any) -> None:
        gc.collect()
        alive_at_save.append(sum(ref() is not None for ref in reported))
        real_save(self, *args, **kwargs)

    monkeypatch.setattr(StateStore, "save", save)
    consumer = SnapshotConsumer(
        "unused:9092", "t.actions", state_dir=tmp_path, on_applied=on_applied, checkpoint_interval_versions=1
    )
    for offset, value in enumerate(values):
        consumer.handle("t.actions", 0, offset, value)
    consumer.checkpoint()  # every version reported, then saved at the interval
    assert reported and consumer.saves == 1
    assert alive_at_save == [0]
