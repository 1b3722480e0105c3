"""Log compaction files stand in for the commits they cover when a snapshot is rebuilt, never in the
change feed; one that is not what the protocol says is refused, one that cannot be read is passed over.

The table, ``gen__log-compaction``, is one whose compaction files a real writer wrote: Delta Kernel
Java's post-commit hook (scripts/make_compacted_log_table.py). The oracles are delta-spark's rows
at each version, read from the commits alone (tests/data/expected/snapshot/), and the same table
with its compaction files deleted. That a compaction file was read, and its commits were not, is
seen at the storage: a TableStorage that records the log files it opens.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import IO, Any

import pyarrow as pa
import pytest

from deltamirror.core import open_table
from deltamirror.core.errors import CorruptLogError, DeltaMirrorError, StorageError
from deltamirror.core.log import LogListing, build_segment, compaction_cover
from deltamirror.core.replay import replay
from deltamirror.core.storage import FileInfo, TableStorage
from deltamirror.core.table import DeltaTable, Snapshot
from support.tables import EXPECTED, TABLES, copy_table

TABLE = "gen__log-compaction"
SPEC = json.loads((EXPECTED / "snapshot" / f"{TABLE}__snapshots.json").read_text())
#: the compaction files a replay of each version reads, by the rule of the protocol and kernel-rs:
#: after the checkpoint (at 6), within the version, the widest of those starting at one version
COVER = {3: [(0, 3)], 4: [(0, 3)], 5: [(0, 3)], 11: [(8, 11)], 12: [(8, 12)]}


def compacted(start: int, end: int) -> str:
    return f"{start:020d}.{end:020d}.compacted.json"


def commit(version: int) -> str:
    return f"{version:020d}.json"


class RecordingStorage(TableStorage):
    """A table's storage that records the name of every file it reads (the reads go to disk)."""

    def __init__(self, uri: str) -> None:
        super().__init__(uri)
        self.read: list[str] = []

    def read_bytes(self, path: str, start: int | None = None, end: int | None = None) -> bytes:
        self.read.append(path.rsplit("/", 1)[-1])
        return super().read_bytes(path, start, end)

    def open(self, path: str, mode: str = "rb") -> IO[bytes]:
        self.read.append(path.rsplit("/", 1)[-1])
        return super().open(path, mode)


def recording(path: Path) -> tuple[DeltaTable, RecordingStorage]:
    table = open_table(str(path))
    table.storage = storage = RecordingStorage(str(path))
    return table, storage


def without_compactions(tmp_path: Path, table_id: str = TABLE) -> Path:
    copy = copy_table(table_id, tmp_path)
    for f in (copy / "_delta_log").glob("*.compacted.json"):
        f.unlink()
    return copy


def rows(snap: Snapshot) -> list[list[Any]]:
    return sorted([r["id"], r["part"], r["v"]] for r in snap.to_arrow().to_pylist())


def by_path(files: pa.Table) -> list[dict[str, Any]]:
    return sorted(files.to_pylist(), key=lambda r: (r["path"], json.dumps(r["deletionVector"])))


# --- which files stand in for which commits --------------------------------------------------


def _listing(*ranges: tuple[int, int], size: int = 10) -> LogListing:
    return LogListing(compactions={r: FileInfo(compacted(*r), size, 0) for r in ranges})


@pytest.mark.parametrize(
    ("ranges", "after", "version", "expected"),
    [
        ([(1, 4), (5, 8)], -1, 8, [(1, 4), (5, 8)]),
        ([(1, 4)], -1, 3, []),  # it reaches past the version
        ([(1, 4)], 1, 8, []),  # it starts at the checkpoint: those actions are in the checkpoint
        ([(2, 4), (2, 6)], 1, 8, [(2, 6)]),  # one start: the widest
        ([(2, 4), (3, 8)], 1, 8, [(2, 4)]),  # overlapping: the first wins (greedy, as kernel-rs)
        ([(2, 4), (5, 9)], 1, 8, [(2, 4)]),
        ([(3, 3), (4, 2)], -1, 8, []),  # the protocol requires end > start
    ],
)
def test_the_cover_is_chosen_as_kernel_rs_chooses(
    ranges: list[tuple[int, int]], after: int, version: int, expected: list[tuple[int, int]]
) -> None:
    cover = compaction_cover(_listing(*ranges), after, version)
    assert [(c.start, c.end) for c in cover] == expected


def test_an_empty_compaction_file_is_passed_over_for_a_narrower_one() -> None:
    listing = LogListing(
        compactions={(2, 6): FileInfo(compacted(2, 6), 0, 0), (2, 4): FileInfo(compacted(2, 4), 9, 0)}
    )
    assert [(c.start, c.end) for c in compaction_cover(listing, 1, 8)] == [(2, 4)]


# --- the real writer's table -----------------------------------------------------------------


def test_every_version_reads_as_delta_spark_reads_it() -> None:
    table = open_table(str(TABLES / TABLE))
    assert SPEC["columns"] == ["id", "part", "v"]
    for version, expected in SPEC["versions"].items():
        snap = table.snapshot(int(version))
        assert [(c.start, c.end) for c in snap.segment.compactions] == COVER.get(int(version), [])
        assert rows(snap) == expected, version


def test_the_state_is_the_same_without_the_compaction_files(tmp_path: Path) -> None:
    with_them = open_table(str(TABLES / TABLE))
    without = open_table(str(without_compactions(tmp_path)))
    for version in COVER:
        a, b = with_them.snapshot(version), without.snapshot(version)
        assert a.segment.compactions and not b.segment.compactions
        assert by_path(a.files) == by_path(b.files), version
        assert by_path(a.tombstones) == by_path(b.tombstones), version
        assert (a.metadata, a.protocol, a.txns, a.domains) == (b.metadata, b.protocol, b.txns, b.domains)
        assert a.timestamp == b.timestamp  # a version's own commit says when it was made
    assert with_them.snapshot(12).txns["deltamirror-fixture-app"].version == 11
    assert with_them.snapshot(5).domains and not with_them.snapshot(12).domains  # removed at 11


def test_the_compaction_file_is_read_and_the_commits_it_covers_are_not() -> None:
    table, storage = recording(TABLES / TABLE)
    table.snapshot(12)
    assert compacted(8, 12) in storage.read
    assert commit(7) in storage.read  # after the checkpoint, before the compaction
    assert not {commit(v) for v in range(8, 13)} & set(storage.read)
    assert compacted(8, 11) not in storage.read

    table, storage = recording(TABLES / TABLE)
    table.snapshot(3)  # (the latest metaData, which says whether In-Commit Timestamps apply, is read too)
    assert compacted(0, 3) in storage.read
    assert not {commit(v) for v in range(4)} & set(storage.read)


def test_without_them_the_commits_are_read(tmp_path: Path) -> None:
    table, storage = recording(without_compactions(tmp_path))
    table.snapshot(12)
    assert {commit(v) for v in range(7, 13)} <= set(storage.read)


def test_the_change_feed_reads_every_commit_and_no_compaction_file(tmp_path: Path) -> None:
    table, storage = recording(TABLES / TABLE)
    changes = table.changes(starting_version=1, ending_version=12).to_arrow()
    assert not [name for name in storage.read if name.endswith(".compacted.json")]
    assert {commit(v) for v in (1, 2, 3, 8, 9, 10, 11, 12)} <= set(storage.read)
    expected = open_table(str(without_compactions(tmp_path))).changes(starting_version=1, ending_version=12)
    assert changes.num_rows > 0
    assert (
        changes.sort_by("_commit_version").to_pylist()
        == expected.to_arrow().sort_by("_commit_version").to_pylist()
    )


# --- files that are not what the protocol says -------------------------------------------------


def _passed_over(
    path: Path, version: int, caplog: pytest.LogCaptureFixture, name: str
) -> list[dict[str, Any]]:
    """The rows of ``version`` read with the compaction file ``name`` passed over, with its warning."""
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="deltamirror.core.replay"):
        got = rows(open_table(str(path)).snapshot(version))
    warnings = [r.getMessage() for r in caplog.records if name in r.getMessage()]
    assert len(warnings) == 1 and "passed over" in warnings[0] and "\n" not in warnings[0], warnings
    return got


def test_a_corrupt_compaction_file_is_passed_over_for_its_commits(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    copy = copy_table(TABLE, tmp_path)
    f = copy / "_delta_log" / compacted(8, 12)
    lines = f.read_bytes().splitlines(keepends=True)
    f.write_bytes(b"".join(lines) + b'{"add":{"path":"x.parquet","size":-1}}\n')
    assert _passed_over(copy, 12, caplog, compacted(8, 12)) == SPEC["versions"]["12"]
    assert f"line {len(lines) + 1}" in caplog.records[-1].getMessage()
    assert open_table(str(copy)).snapshot(11).version == 11  # 8.11 is another file
    assert open_table(str(copy)).changes(starting_version=8, ending_version=12).to_arrow().num_rows > 0


def test_a_compaction_file_with_two_metadata_is_passed_over(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    copy = copy_table(TABLE, tmp_path)
    f = copy / "_delta_log" / compacted(0, 3)
    lines = f.read_bytes().splitlines(keepends=True)
    first = next(i for i, line in enumerate(lines) if line.startswith(b'{"metaData"'))
    f.write_bytes(b"".join([*lines, lines[first]]))
    assert _passed_over(copy, 3, caplog, compacted(0, 3)) == SPEC["versions"]["3"]
    assert "second metaData" in caplog.records[-1].getMessage()


def test_a_bad_compaction_file_is_refused_only_when_its_commits_are_gone(tmp_path: Path) -> None:
    copy = copy_table(TABLE, tmp_path)
    f = copy / "_delta_log" / compacted(0, 3)
    lines = f.read_bytes().splitlines(keepends=True)
    first = next(i for i, line in enumerate(lines) if line.startswith(b'{"metaData"'))
    f.write_bytes(b"".join([*lines, lines[first]]))
    (copy / "_delta_log" / commit(2)).unlink()
    with pytest.raises(DeltaMirrorError) as info:  # the segment needs every commit
        open_table(str(copy)).snapshot(3)
    assert info.value.exit_code == 2 and "\n" not in str(info.value) and info.value.version == 2
    # a commit gone between the listing and its read: the refusal names the compaction passed over
    table = open_table(str(copy))
    table.storage = storage = VanishingStorage(str(copy))
    (copy / "_delta_log" / commit(2)).write_bytes(b'{"commitInfo":{}}\n')
    storage.gone = commit(2)
    with pytest.raises(CorruptLogError) as cinfo:
        table.snapshot(3)
    error = cinfo.value
    assert error.exit_code == 2 and "\n" not in str(error)
    assert compacted(0, 3) in error.message and "commit 2, which it covers, is missing" in error.message
    assert "second metaData" in error.message


class VanishingStorage(TableStorage):
    """A commit listed but gone when it is read."""

    gone = ""

    def read_bytes(self, path: str, start: int | None = None, end: int | None = None) -> bytes:
        if path.endswith(self.gone):
            raise FileNotFoundError(path)
        return super().read_bytes(path, start, end)

    def open(self, path: str, mode: str = "rb") -> IO[bytes]:
        if path.endswith(self.gone):
            raise FileNotFoundError(path)
        return super().open(path, mode)


def test_kernel_rs_compaction_files_are_not_reconciled_and_are_passed_over(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """kernel-rs's test table holds compaction files made of the covered commits' lines, newest
    first: a file is added and removed in one of them, so what it says depends on which line a
    reader applies last. Read forward, files removed long ago would come back: they are passed
    over, and the commits (all there) give the rows kernel-rs's read.rs expects of it."""
    expected = [
        (0, "new"),
        (1, "after-large-delete"),
        (2, ""),
        (10, "merge1-insert"),
        (12, "merge2-insert"),
    ]
    with caplog.at_level(logging.WARNING, logger="deltamirror.core.replay"):
        snap = open_table(str(TABLES / "krs__compacted-log-files-table")).snapshot(25)
    assert any("is named by more than one add or remove" in r.getMessage() for r in caplog.records)
    assert sorted((r["id"], r["comment"] or "") for r in snap.to_arrow().to_pylist()) == expected
    snap = open_table(str(without_compactions(tmp_path, "krs__compacted-log-files-table"))).snapshot()
    assert sorted((r["id"], r["comment"] or "") for r in snap.to_arrow().to_pylist()) == expected


# --- files that cannot be read ---------------------------------------------------------------


def test_a_compaction_file_gone_after_the_listing_is_passed_over(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    copy = copy_table(TABLE, tmp_path)
    storage = TableStorage(str(copy))
    segment = build_segment(storage, 12)
    assert [(c.start, c.end) for c in segment.compactions] == [(8, 12)]
    (copy / "_delta_log" / compacted(8, 12)).unlink()
    with caplog.at_level(logging.WARNING, logger="deltamirror.core.log"):
        state = replay(storage, segment)
    assert compacted(8, 12) in caplog.text and "reading commits 8-12" in caplog.text
    assert by_path(state.files) == by_path(open_table(str(TABLES / TABLE)).snapshot(12).files)


class FailingStorage(RecordingStorage):
    """Storage that fails reading compaction files as a flaky store fails, after its retries."""

    def read_bytes(self, path: str, start: int | None = None, end: int | None = None) -> bytes:
        if path.endswith(".compacted.json"):
            raise StorageError("storage error during read (after 4 attempts): timed out", file=path)
        return super().read_bytes(path, start, end)


def test_a_compaction_file_the_storage_fails_to_read_is_passed_over() -> None:
    table = open_table(str(TABLES / TABLE))
    table.storage = storage = FailingStorage(str(TABLES / TABLE))
    assert rows(table.snapshot(12)) == SPEC["versions"]["12"]
    assert {commit(v) for v in range(8, 13)} <= set(storage.read)


def test_empty_compaction_files_are_passed_over(tmp_path: Path) -> None:
    copy = copy_table(TABLE, tmp_path)
    (copy / "_delta_log" / compacted(8, 12)).write_bytes(b"")  # listed with size 0: not chosen
    snap = open_table(str(copy)).snapshot(12)
    assert [(c.start, c.end) for c in snap.segment.compactions] == [(8, 11)]
    assert rows(snap) == SPEC["versions"]["12"]
    (copy / "_delta_log" / compacted(8, 11)).write_bytes(b"\n")  # chosen, holds nothing: its commits
    table, storage = recording(copy)
    assert rows(table.snapshot(12)) == SPEC["versions"]["12"]
    assert {commit(v) for v in range(8, 13)} <= set(storage.read)


# --- timestamps stay each commit's own ----------------------------------------------------------


def test_an_in_commit_timestamp_is_read_from_its_commit(tmp_path: Path) -> None:
    """drs__cdc_ict_table's version 1 carries an In-Commit Timestamp unlike its file time. The
    compaction file 0.1 here is made by the test from the two commits' lines without their
    commitInfo (no file, metaData or protocol repeats, so that is their reconciliation)."""
    copy = copy_table("drs__cdc_ict_table", tmp_path)
    log = copy / "_delta_log"
    lines = [
        line
        for v in (0, 1)
        for line in (log / commit(v)).read_bytes().splitlines(keepends=True)
        if not line.startswith(b'{"commitInfo"')
    ]
    (log / compacted(0, 1)).write_bytes(b"".join(lines))
    table, storage = recording(copy)
    segment = build_segment(storage, 1)
    assert [(c.start, c.end) for c in segment.compactions] == [(0, 1)]
    replay(storage, segment)
    assert [name for name in storage.read if name.endswith(".json")] == [compacted(0, 1)]
    snap = table.snapshot(1)
    ict = json.loads((log / commit(1)).read_bytes().splitlines()[0])["commitInfo"]["inCommitTimestamp"]
    assert snap.timestamp.timestamp == ict != (log / commit(1)).stat().st_mtime_ns // 1_000_000
    plain = open_table(str(TABLES / "drs__cdc_ict_table")).snapshot(1)
    assert snap.timestamp == plain.timestamp
    assert by_path(snap.files) == by_path(plain.files)
