"""The watcher without Kafka: what it hands out, from where, and how it refuses bad input."""

from __future__ import annotations

import json
import shutil
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from deltamirror.core.errors import (
    CorruptLogError,
    LogGapError,
    UnsupportedFeatureError,
)
from deltamirror.core.log import read_commit
from deltamirror.core.table import open_table
from deltamirror.producer.tailing.snapshot_events import SnapshotWork
from deltamirror.producer.tailing.watcher import TableWatcher
from deltamirror.producer.tailing.work import (
    CommitWork,
    Position,
    PositionWork,
    TableReplacedWork,
    Work,
    position_after,
)
from support.tables import TABLES, copy_table


def actions_of(work: CommitWork | SnapshotWork, size: int = 7) -> list[dict[str, Any]]:
    out = []
    for batch in work.batches(size):
        for action_type, body in batch:
            out.append({action_type: json.loads(body) if isinstance(body, bytes) else body})
    return out


def drain(watcher: TableWatcher) -> list[Work]:
    out = []
    while (work := watcher.next_work()) is not None:
        out.append(work)
    return out


def write_commit(table: Path, version: int, lines: list[str]) -> Path:
    path = table / "_delta_log" / f"{version:020d}.json"
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_from_version_hands_out_every_version_as_in_the_log(tmp_path: Path) -> None:
    path = copy_table("gen__long-log-cdf", tmp_path)
    table = open_table(str(path))
    watcher = TableWatcher(str(path), mode="from-version", from_version=0)
    watcher.start(None)
    works = drain(watcher)
    commits = sorted(table.listing(0).commits)
    assert [w.version for w in works] == commits
    expected_ts = {t.version: t for t in table.commit_timestamps()}
    for work in works:
        assert isinstance(work, CommitWork)
        assert actions_of(work) == read_commit(table.storage, work.version)
        assert work.count == len(read_commit(table.storage, work.version))
        assert work.timestamp == expected_ts[work.version]


def test_initial_snapshot_then_tail(tmp_path: Path, kit: Any) -> None:
    path = kit.make_table(tmp_path / "t", versions=3)
    watcher = TableWatcher(str(path), mode="initial")
    watcher.start(None)
    snap_work = watcher.next_work()
    assert isinstance(snap_work, SnapshotWork)
    assert snap_work.version == 2 and snap_work.snapshot
    events = actions_of(snap_work, size=2)
    assert [next(iter(e)) for e in events[:2]] == ["protocol", "metaData"]
    snapshot = open_table(str(path)).snapshot()
    assert [e["add"]["path"] for e in events[2:]] == sorted(snapshot.files["path"].to_pylist())
    assert snap_work.count == len(events) == 2 + snapshot.files.num_rows
    assert events[1]["metaData"]["id"] == snapshot.metadata.id
    assert watcher.next_work() is None
    kit.append(path)
    work = watcher.next_work()
    assert isinstance(work, CommitWork) and work.version == 3 and not work.snapshot
    assert watcher.next_work() is None


def test_snapshot_of_a_checkpointed_table_with_txn_and_deletion_vectors(tmp_path: Path) -> None:
    for table_id in (
        "krs__app-txn-checkpoint",
        "kj__basic-dv-with-checkpoint",
        "golden__v2-checkpoint-parquet",
    ):
        path = TABLES / table_id
        watcher = TableWatcher(str(path), mode="initial")
        watcher.start(None)
        work = watcher.next_work()
        assert isinstance(work, SnapshotWork)
        snapshot = open_table(str(path)).snapshot()
        events = actions_of(work, size=5)
        adds = [e["add"] for e in events if "add" in e]
        assert [a["path"] for a in adds] == sorted(snapshot.files["path"].to_pylist())
        assert all(isinstance(a["size"], int) and "partitionValues" in a for a in adds)
        txns = [e["txn"] for e in events if "txn" in e]
        assert {t["appId"]: t["version"] for t in txns} == {k: t.version for k, t in snapshot.txns.items()}
        dvs = [a for a in adds if "deletionVector" in a]
        assert len(dvs) == sum(1 for d in snapshot.files["deletionVector"].to_pylist() if d is not None)


def test_latest_mode_records_a_start_position_and_publishes_only_new_versions(
    tmp_path: Path, kit: Any
) -> None:
    path = kit.make_table(tmp_path / "t", versions=3)
    watcher = TableWatcher(str(path), mode="latest")
    watcher.start(None)
    start = watcher.next_work()
    assert isinstance(start, PositionWork)
    assert start.position.version == 2 and start.position.complete and start.position.count == 0
    assert watcher.next_work() is None
    kit.append(path)
    kit.append(path)
    assert [w.version for w in drain(watcher)] == [3, 4]  # type: ignore[union-attr]


def test_from_timestamp_starts_at_the_first_version_at_or_after_it(tmp_path: Path) -> None:
    path = TABLES / "gen__long-log-cdf"
    stamps = open_table(str(path)).commit_timestamps()
    target = stamps[3]
    watcher = TableWatcher(str(path), mode="from-timestamp", from_timestamp=target.timestamp - 0)
    watcher.start(None)
    first = watcher.next_work()
    assert isinstance(first, CommitWork)
    assert first.version == min(t.version for t in stamps if t.timestamp >= target.timestamp)


def test_resume_completes_a_partly_published_version_first(tmp_path: Path) -> None:
    path = TABLES / "gen__long-log-cdf"
    table = open_table(str(path))
    watcher = TableWatcher(str(path), mode="from-version", from_version=0)
    watcher.start(None)
    works = drain(watcher)
    big = max(works, key=lambda w: w.count)  # type: ignore[union-attr]
    assert isinstance(big, CommitWork) and big.count >= 3
    partial = position_after(big, 1)
    assert not partial.complete
    resumed = TableWatcher(str(path), mode="initial")  # the mode does not matter with a position
    resumed.start(partial)
    first = resumed.next_work()
    assert isinstance(first, CommitWork)
    assert (first.version, first.start) == (big.version, 2)
    assert actions_of(first) == read_commit(table.storage, big.version)[2:]
    assert first.timestamp == big.timestamp
    rest = drain(resumed)
    assert [w.version for w in rest] == [w.version for w in works if w.version > big.version]  # type: ignore[union-attr]
    # the resolved timestamps after a restart are those of an uninterrupted run
    assert [w.timestamp for w in rest] == [w.timestamp for w in works if w.version > big.version]  # type: ignore[union-attr]


def test_resume_completes_a_partly_published_snapshot(tmp_path: Path) -> None:
    path = TABLES / "gen__long-log-cdf"
    watcher = TableWatcher(str(path), mode="initial")
    watcher.start(None)
    full = watcher.next_work()
    assert isinstance(full, SnapshotWork)
    all_events = actions_of(full)
    assert full.count > 8
    resumed = TableWatcher(str(path), mode="initial")
    resumed.start(position_after(full, 4))
    rest = resumed.next_work()
    assert isinstance(rest, SnapshotWork) and rest.start == 5
    assert actions_of(rest, size=3) == all_events[5:]


def test_a_table_recreated_with_fewer_versions_is_announced(tmp_path: Path, kit: Any) -> None:
    path = kit.make_table(tmp_path / "t", versions=4)
    watcher = TableWatcher(str(path), mode="initial", check_interval_s=0)
    watcher.start(None)
    first = watcher.next_work()
    assert isinstance(first, SnapshotWork)
    old_id = first.table_id
    shutil.rmtree(path)
    kit.make_table(path, versions=2)
    replaced = watcher.next_work()
    assert isinstance(replaced, TableReplacedWork)
    assert replaced.previous_table_id == old_id and replaced.previous_version == 3
    assert replaced.table_id != old_id and "backwards" in replaced.reason
    snap = watcher.next_work()
    assert isinstance(snap, SnapshotWork) and snap.table_id == replaced.table_id and snap.version == 1


def test_a_table_recreated_with_more_versions_is_announced(tmp_path: Path, kit: Any) -> None:
    path = kit.make_table(tmp_path / "t", versions=2)
    watcher = TableWatcher(str(path), mode="from-version", from_version=0)
    watcher.start(None)
    assert [w.version for w in drain(watcher)] == [0, 1]  # type: ignore[union-attr]
    old_id = open_table(str(path)).snapshot().metadata.id
    shutil.rmtree(path)
    kit.make_table(path, versions=4)
    replaced = watcher.next_work()
    assert isinstance(replaced, TableReplacedWork)
    assert replaced.previous_table_id == old_id and "version 0" in replaced.reason
    # a re-created table is mirrored as new: from its version 0 (mode from-version)
    rest = drain(watcher)
    assert [w.version for w in rest] == [0, 1, 2, 3]  # type: ignore[union-attr]
    assert {w.table_id for w in rest} == {replaced.table_id}  # type: ignore[union-attr]


def test_resume_notices_a_table_recreated_while_the_watcher_was_down(tmp_path: Path, kit: Any) -> None:
    path = kit.make_table(tmp_path / "t", versions=3)
    watcher = TableWatcher(str(path), mode="from-version", from_version=0)
    watcher.start(None)
    last = drain(watcher)[-1]
    assert isinstance(last, CommitWork)
    shutil.rmtree(path)
    kit.make_table(path, versions=5)
    again = TableWatcher(str(path), mode="from-version", from_version=0)
    again.start(position_after(last, last.count - 1))
    replaced = again.next_work()
    assert isinstance(replaced, TableReplacedWork) and replaced.previous_table_id == last.table_id


def test_a_corrupt_commit_stops_with_file_and_line_and_resumes_when_fixed(tmp_path: Path, kit: Any) -> None:
    path = kit.make_table(tmp_path / "t", versions=2)
    watcher = TableWatcher(str(path), mode="from-version", from_version=0)
    watcher.start(None)
    assert len(drain(watcher)) == 2
    good = read_commit(open_table(str(path)).storage, 1)
    lines = [json.dumps(a) for a in good]
    bad_file = write_commit(path, 2, [lines[0], '{"add": {"path": "x.parquet", ', *lines[1:]])
    for _ in range(2):  # stays stopped on the same version, never skips it
        with pytest.raises(CorruptLogError) as info:
            watcher.next_work()
        assert info.value.file == str(bad_file) and info.value.line == 2 and info.value.version == 2
    write_commit(path, 2, lines)
    work = watcher.next_work()
    assert isinstance(work, CommitWork) and work.version == 2


def test_an_unsupported_reader_feature_is_refused_by_name(tmp_path: Path, kit: Any) -> None:
    with pytest.raises(UnsupportedFeatureError) as info:
        TableWatcher(str(TABLES / "krs__table-with-geo"), mode="initial").start(None)
    assert info.value.feature == "geospatial"
    path = kit.make_table(tmp_path / "t", versions=1)
    watcher = TableWatcher(str(path), mode="latest")
    watcher.start(None)
    assert isinstance(watcher.next_work(), PositionWork)
    protocol = {
        "protocol": {
            "minReaderVersion": 3,
            "minWriterVersion": 7,
            "readerFeatures": ["someFutureFeature"],
            "writerFeatures": ["someFutureFeature"],
        }
    }
    write_commit(path, 1, [json.dumps({"commitInfo": {"operation": "UPGRADE"}}), json.dumps(protocol)])
    with pytest.raises(UnsupportedFeatureError) as info:
        watcher.next_work()
    assert info.value.feature == "someFutureFeature" and info.value.version == 1


def _cleaned_table(tmp_path: Path, kit: Any) -> tuple[Path, Position]:
    """A table whose versions 1..3 were cleaned after a checkpoint at 4, and a position at 1."""
    from deltalake import DeltaTable

    path = kit.make_table(tmp_path / "t", versions=6)
    watcher = TableWatcher(str(path), mode="from-version", from_version=0)
    watcher.start(None)
    works = drain(watcher)
    DeltaTable(str(path)).create_checkpoint()
    position = position_after(works[1], works[1].count - 1)  # type: ignore[arg-type]
    for v in range(0, 5):
        (path / "_delta_log" / f"{v:020d}.json").unlink()
    return path, position


def test_a_gap_fails_unless_when_needed_then_it_snapshots(tmp_path: Path, kit: Any) -> None:
    path, position = _cleaned_table(tmp_path, kit)
    with pytest.raises(LogGapError) as info:
        TableWatcher(str(path), mode="initial").start(position)
    assert info.value.version == 2
    watcher = TableWatcher(str(path), mode="when-needed")
    watcher.start(position)
    work = watcher.next_work()
    assert isinstance(work, SnapshotWork) and work.version == 5


def test_a_huge_commit_is_streamed_with_bounded_memory(tmp_path: Path, kit: Any) -> None:
    path = kit.make_table(tmp_path / "t", versions=1)
    watcher = TableWatcher(str(path), mode="latest")
    watcher.start(None)
    assert isinstance(watcher.next_work(), PositionWork)
    n = 200_000
    stats = json.dumps(
        {"numRecords": 10, "minValues": {"id": 1}, "maxValues": {"id": 9}, "nullCount": {"id": 0}}
    )
    commit = path / "_delta_log" / f"{1:020d}.json"
    with commit.open("w") as fh:
        fh.write(json.dumps({"commitInfo": {"operation": "WRITE"}}) + "\n")
        for i in range(n):
            add = {
                "path": f"part-{i:08d}.parquet",
                "partitionValues": {},
                "size": 1000 + i,
                "modificationTime": 1,
                "dataChange": True,
                "stats": stats,
            }
            fh.write(json.dumps({"add": add}) + "\n")
    assert commit.stat().st_size > 30_000_000
    tracemalloc.start()
    try:
        work = watcher.next_work()
        assert isinstance(work, CommitWork) and work.count == n + 1
        seen = 0
        last_path = ""
        for batch in work.batches(2000):
            seen += len(batch)
            last_path = json.loads(batch[-1][1])["path"]  # type: ignore[arg-type]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert seen == n + 1 and last_path == f"part-{n - 1:08d}.parquet"
    summary = work.summary()
    assert summary.adds == n and summary.bytes_added == sum(1000 + i for i in range(n))
    assert peak < 20_000_000, (
        f"peak Python memory {peak / 1e6:.1f} MB for a {commit.stat().st_size / 1e6:.0f} MB commit"
    )


def test_log_waker_returns_early_when_a_commit_file_appears(tmp_path: Path) -> None:
    import threading
    import time

    from deltamirror.core.storage import TableStorage
    from deltamirror.producer.tailing.waker import LogWaker

    (tmp_path / "_delta_log").mkdir()
    waker = LogWaker(TableStorage(str(tmp_path)))
    try:
        assert waker.notifying
        timer = threading.Timer(0.3, (tmp_path / "_delta_log" / f"{0:020d}.json").write_text, args=("{}\n",))
        started = time.monotonic()
        timer.start()
        waker.wait(20)
        assert 0.2 < time.monotonic() - started < 10
    finally:
        waker.close()


def test_log_waker_without_notifications_waits_the_poll_or_the_stop(tmp_path: Path) -> None:
    import threading
    import time

    from deltamirror.core.storage import TableStorage
    from deltamirror.producer.tailing.waker import LogWaker

    no_log_yet = LogWaker(TableStorage(str(tmp_path / "missing")))
    memory = LogWaker(TableStorage("memory://t"))
    disabled = LogWaker(TableStorage(str(tmp_path)), enabled=False)
    assert not (no_log_yet.notifying or memory.notifying or disabled.notifying)
    started = time.monotonic()
    memory.wait(0.3)
    assert time.monotonic() - started >= 0.3
    stop = threading.Event()
    stop.set()
    started = time.monotonic()
    memory.wait(20, stop)
    assert time.monotonic() - started < 1


_ODD_LINES = [
    '{"add":{"path":"a","partitionValues":{"d":"1"},"size":10,"modificationTime":1,"dataChange":true}}',
    '{"add": {"path":"c","partitionValues":{"d":"2"},"size":5,"modificationTime":1,"dataChange":true} }',
    "",
    '  {"remove":{"path":"a","partitionValues":{"d":"1"},"size":10,"dataChange":true}}  ',
    '{"add":{"path":"e","partitionValues":{},"size":1,"modificationTime":1,"dataChange":true},"future":{"x":[1]}}',
    '{"remove":{"path":"f","size":3,"partitionValues":{"d":"3"},"dataChange":false,"newField":1e10}}',
    '{"cdc":{"path":"g","partitionValues":{"d":"4"},"size":2,"dataChange":false}}',
    '{"add":{"path":"h\\u00e9","partitionValues":{"d":"1"},"size":7,"modificationTime":1,"dataChange":true}}',
    '{"commitInfo":{"operation":"WRITE","readVersion":0,"isBlindAppend":false}}',
    '{"t\\u0078n":{"appId":"x","version":1}}',
]


@pytest.mark.parametrize("streamed", [False, True], ids=["read-whole", "streamed"])
def test_odd_but_valid_lines_publish_what_a_json_parser_reads(
    tmp_path: Path, kit: Any, monkeypatch: pytest.MonkeyPatch, streamed: bool
) -> None:
    """Whitespace, blank lines, an unknown action beside a known one, escapes: the fast path for
    plain add/remove lines and the general one agree with a plain JSON parser, and so does the summary."""
    from deltamirror.producer.tailing import work as watcher_module

    if streamed:
        monkeypatch.setattr(watcher_module, "SMALL_COMMIT_BYTES", 0)
    path = kit.make_table(tmp_path / "t", versions=1)
    write_commit(path, 1, _ODD_LINES)
    watcher = TableWatcher(str(path), mode="from-version", from_version=1)
    watcher.start(None)
    (work,) = drain(watcher)
    assert isinstance(work, CommitWork)
    reference = [{k: v} for line in _ODD_LINES if line.strip() for k, v in json.loads(line).items()]
    assert actions_of(work, size=3) == reference
    summary = work.summary()
    assert (summary.adds, summary.removes, summary.cdc_files, summary.action_count) == (4, 2, 1, 10)
    assert (summary.bytes_added, summary.bytes_removed) == (10 + 5 + 1 + 7, 10 + 3)
    assert summary.partitions_touched == [{"d": "1"}, {"d": "2"}, {"d": "3"}, {"d": "4"}]
    assert summary.operation == "WRITE" and summary.read_version == 0 and summary.is_blind_append is False


_ADD = '{"add":{"path":"a","partitionValues":{},"size":1,"modificationTime":1,"dataChange":true}}'


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        (
            '{"add":{"path":"b","partitionValues":{},"size":true,"modificationTime":1,"dataChange":true}}',
            "add.size",
        ),
        (
            '{"add":{"path":"d","partitionValues":{},"size":NaN,"modificationTime":1,"dataChange":true}}',
            "add.size",
        ),
        ('{"add":{"path":"e","size":1},"txn":{"appId":"x","version":1}}', "a line holds one action"),
        ('{"add":null}', "add: expected a JSON object"),
        ('{"remove":{"size":3,"dataChange":true}}', "remove.path: required field missing"),
        ('{"commitInfo":{"x":Infinity}}', "commitInfo.x: expected finite numbers"),
        ('{"commitInfo":{"x":"\\udfff"}}', "invalid JSON"),
    ],
)
@pytest.mark.parametrize("streamed", [False, True], ids=["read-whole", "streamed"])
def test_an_invalid_line_stops_the_version_before_anything_is_published(
    tmp_path: Path, kit: Any, monkeypatch: pytest.MonkeyPatch, streamed: bool, line: str, problem: str
) -> None:
    from deltamirror.producer.tailing import work as watcher_module

    if streamed:
        monkeypatch.setattr(watcher_module, "SMALL_COMMIT_BYTES", 0)
    path = kit.make_table(tmp_path / "t", versions=1)
    write_commit(path, 1, [_ADD, _ADD.replace('"a"', '"b"'), line])
    watcher = TableWatcher(str(path), mode="from-version", from_version=1)
    watcher.start(None)
    with pytest.raises(CorruptLogError) as info:
        watcher.next_work()
    assert info.value.line == 3 and info.value.version == 1 and info.value.message.startswith(problem)


def test_commits_read_ahead_are_used_only_while_they_match_their_listing(tmp_path: Path) -> None:
    from deltamirror.core.readahead import CommitReadAhead as CommitPrefetch
    from deltamirror.core.storage import TableStorage

    log = tmp_path / "_delta_log"
    log.mkdir()

    def add(v: int | str) -> bytes:
        return (
            b'{"path":"%s","partitionValues":{},"size":1,"modificationTime":1,"dataChange":true}'
            % str(v).encode()
        )

    for v in range(3):
        (log / f"{v:020d}.json").write_bytes(b'{"add":' + add(v) + b"}\n")
    storage = TableStorage(str(tmp_path))
    infos = [(v, storage.info(storage.log_file(f"{v:020d}.json"))) for v in range(3)]
    prefetch = CommitPrefetch(storage)
    try:
        prefetch.want(infos)  # two at most
        assert prefetch.take(0, infos[0][1]) == b'{"add":' + add(0) + b"}\n"
        assert prefetch.take(0, infos[0][1]) is None  # handed out once
        assert prefetch.take(2, infos[2][1]) is None  # beyond the depth: not read
        (log / f"{1:020d}.json").write_bytes(b'{"add":' + add("changed") + b"}\n")
        changed = storage.info(storage.log_file(f"{1:020d}.json"))
        assert changed != infos[1][1]
        assert prefetch.take(1, changed) is None  # listed again since: read again by the scan
        (log / f"{2:020d}.json").unlink()
        prefetch.want(infos[2:])
        assert prefetch.take(2, infos[2][1]) is None  # a failed read is the scan's to report
    finally:
        prefetch.close()


def test_an_idle_turn_a_little_early_still_checks_the_log(tmp_path: Path, kit: Any) -> None:
    """Found by review: the pool takes a table due within DUE_EARLY_S at once, so an idle turn may
    come that much early. A check due as long as the poll waited (poll and check both 30 s) was
    skipped at such a turn and came a whole poll later, every other turn. A turn up to DUE_EARLY_S
    early now makes the check that is due."""
    from deltamirror.producer.settings import DUE_EARLY_S

    now = [0.0]
    path = kit.make_table(tmp_path / "t", versions=4)
    watcher = TableWatcher(str(path), mode="initial", check_interval_s=30, clock=lambda: now[0])
    watcher.start(None)
    assert list(drain(watcher))  # the snapshot; then idle, the check 30 s away
    shutil.rmtree(path)
    kit.make_table(path, versions=2)  # what only the idle check sees (the log went backwards)
    now[0] = 30 - DUE_EARLY_S * 0.8  # the turn after one poll of 30 s, taken a little early
    assert isinstance(watcher.next_work(), TableReplacedWork)
