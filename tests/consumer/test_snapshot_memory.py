"""What the snapshot consumer does to hold less memory changes none of what it holds or saves:
all-null chunks shared, removed rows dropped per part at a save, the base's row groups read for a
save in parts, pyarrow's pool chosen and freed memory given back.

Expectations come from a state that does none of it (or from the table's own log), never from the
code under test."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import deltamirror.consumer.snapshot.pending as pending_module
import deltamirror.consumer.snapshot.state as state_module
from deltamirror.consumer.snapshot import IncrementalSnapshot, SnapshotConsumer, StateStore
from deltamirror.consumer.snapshot.files import share_nulls
from deltamirror.consumer.snapshot.table_folder import write_folder
from deltamirror.core import action_schema
from deltamirror.core.memory import POOL_ENV, give_back, use_returning_pool
from deltamirror.producer.publishing.offline_events import iter_event_values
from support.tables import TABLES

TABLE = TABLES / "golden__dv-partitioned-with-checkpoint"


def _values() -> list[bytes | str]:
    return list(iter_event_values(str(TABLE)))


def _first_buffer(array: pa.Array) -> int:
    return next(b.address for b in array.buffers() if b is not None)


def _state(values: list[bytes | str]) -> IncrementalSnapshot:
    state = IncrementalSnapshot(json.loads(values[0])["tableId"])
    state.apply_values(values)
    return state


def test_all_null_chunks_share_one_buffer_and_keep_their_values() -> None:
    dv = action_schema.ADD.field("deletionVector").type
    set_dv = pa.array(
        [{"storageType": "u", "pathOrInlineDv": "ab", "offset": 1, "sizeInBytes": 2, "cardinality": 3}], dv
    )
    column = pa.chunked_array([pa.nulls(3, dv), set_dv, pa.nulls(5, dv)], dv)
    table = pa.table({"deletionVector": column, "size": pa.chunked_array([[1, 2, 3], [4], [5] * 5])})
    shared = share_nulls(table)
    assert shared.equals(table)
    first, middle, last = shared["deletionVector"].chunks
    assert _first_buffer(first) == _first_buffer(last)  # one buffer for both all-null chunks
    assert middle.equals(set_dv) and _first_buffer(middle) == _first_buffer(set_dv)  # untouched
    assert shared["size"].chunks[0] is not None and shared["size"].equals(table["size"])
    assert share_nulls(shared) is shared  # already shared: nothing to do


def test_a_state_with_shared_nulls_holds_and_saves_what_one_without_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    values = _values()
    shared = _state(values)
    with monkeypatch.context() as m:
        m.setattr(state_module, "share_nulls", lambda t: t)
        m.setattr(pending_module, "share_nulls", lambda t: t)
        plain = _state(values)
    assert shared.files.equals(plain.files)
    chunks = [c for c in shared.files["baseRowId"].chunks if c.null_count == len(c) and len(c)]
    assert chunks and len({_first_buffer(c) for c in chunks}) == 1
    one = pq.read_table(write_folder(shared, tmp_path / "shared"))
    two = pq.read_table(write_folder(plain, tmp_path / "plain"))
    assert one.equals(two)


def test_a_save_drops_the_removed_rows_part_by_part() -> None:
    """The parts a save writes are the live files, with the rows removed since dropped from each
    part; the state keeps its own rows until they are read."""
    values = _values()
    ends = [i + 1 for i, v in enumerate(values) if _is_last(v)]
    checked = 0
    for end in ends:
        state = _state(values[:end])
        if not state._dead:
            continue
        parts = list(state.file_batches(3))
        assert all(0 < p.num_rows <= 3 for p in parts)
        assert state._dead  # the save's parts did not drop them from the state
        assert pa.concat_tables(parts).equals(state.files)
        checked += 1
    assert checked, "some version of the table removes a file the state holds"


def _is_last(value: bytes | str) -> bool:
    event = json.loads(value)
    return bool(event["index"] == event["count"] - 1)


def test_a_loaded_state_gives_its_stats_in_parts_as_whole(tmp_path: Path) -> None:
    """Stats read from the saved checkpoint a few rows at a time (a save after a restart) are
    those of the state that never stopped."""
    values = _values()
    in_memory = _state(values)
    first = SnapshotConsumer("unused:9092", "t.actions", state_dir=tmp_path)
    for offset, value in enumerate(values):
        first.handle("t.actions", 0, offset, value)
    first.save()
    (loaded,) = SnapshotConsumer("unused:9092", "t.actions", state_dir=tmp_path).tables.values()
    assert loaded.stats_on_disk
    assert pa.concat_tables(list(loaded.file_batches(2))).equals(in_memory.files)
    (again,) = StateStore(tmp_path, "t.actions").load()[0].values()
    assert again.files.equals(in_memory.files)


def test_the_pool_is_jemalloc_unless_the_user_chose_one(monkeypatch: pytest.MonkeyPatch) -> None:
    before = pa.default_memory_pool()
    try:
        monkeypatch.setenv(POOL_ENV, "system")
        pa.set_memory_pool(pa.system_memory_pool())
        assert use_returning_pool() == "system"  # the user's choice stands
        monkeypatch.delenv(POOL_ENV)
        try:
            pa.jemalloc_memory_pool()
        except NotImplementedError:
            expected = "system"
        else:
            expected = "jemalloc"
        assert use_returning_pool() == expected
        kept = pa.array(["a file"] * 1000)
        give_back()
        assert kept.to_pylist() == ["a file"] * 1000  # what is held stays
    finally:
        pa.set_memory_pool(before)


def test_the_commands_run_their_consumer_on_the_returning_pool_a_library_user_keeps_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from deltamirror.cli.consumer_cmds import _run

    monkeypatch.delenv(POOL_ENV, raising=False)
    before = pa.default_memory_pool()
    seen: list[str] = []

    class Consumer:  # the command's part only: what pool the consumer's run starts on
        def run(self, once: bool) -> None:
            seen.append(pa.default_memory_pool().backend_name)

    try:
        pa.set_memory_pool(pa.system_memory_pool())
        _run(Consumer(), once=True)
        try:
            pa.jemalloc_memory_pool()
        except NotImplementedError:
            assert seen == ["system"]
        else:
            assert seen == ["jemalloc"]
    finally:
        pa.set_memory_pool(before)
    import inspect

    from deltamirror.consumer.snapshot import loop

    assert "use_returning_pool" not in inspect.getsource(loop.SnapshotConsumer)  # the library's own run
