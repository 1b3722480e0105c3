"""An idle table costs the same whatever its log's length: probes, never a periodic listing.

Calls are counted where they reach storage (a real local folder through ``TableStorage``, and an
fsspec in-memory file system standing for an object store), not on a mock of the watcher.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec
import pytest

from deltamirror.core.errors import LogGapError
from deltamirror.producer.tailing.watcher import TableWatcher
from deltamirror.producer.tailing.work import CommitWork, PositionWork

SCHEMA = {"type": "struct", "fields": [{"name": "id", "type": "long", "nullable": True, "metadata": {}}]}


def commit_lines(version: int) -> str:
    lines: list[dict[str, Any]] = [
        {"commitInfo": {"timestamp": 1_700_000_000_000 + version, "operation": "WRITE"}}
    ]
    if version == 0:
        lines.append({"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}})
        lines.append(
            {
                "metaData": {
                    "id": "idle-table",
                    "format": {"provider": "parquet", "options": {}},
                    "schemaString": json.dumps(SCHEMA),
                    "partitionColumns": [],
                    "configuration": {},
                    "createdTime": 1_700_000_000_000,
                }
            }
        )
    add = {
        "path": f"part-{version}.parquet",
        "partitionValues": {},
        "size": 10,
        "modificationTime": 1,
        "dataChange": True,
    }
    lines.append({"add": add})
    return "".join(json.dumps(line) + "\n" for line in lines)


def write_log(log: Path, versions: range) -> None:
    log.mkdir(parents=True, exist_ok=True)
    for v in versions:
        (log / f"{v:020d}.json").write_text(commit_lines(v))


class Counting:
    """Counts the calls that reach a storage object's methods (wrapping them on the instance)."""

    def __init__(self, target: Any, names: tuple[str, ...]) -> None:
        self.calls: Counter[str] = Counter()
        for name in names:
            real = getattr(target, name)
            setattr(target, name, self._counted(name, real))

    def _counted(self, name: str, real: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            return real(*args, **kwargs)

        return call


STORAGE_CALLS = ("list_dir", "list_log", "iter_log_from", "info", "exists", "read_bytes", "open")


def idle_watcher(uri: str) -> TableWatcher:
    """A watcher caught up at the latest version, whose every poll runs the periodic checks too."""
    watcher = TableWatcher(uri, mode="latest", check_interval_s=0)
    watcher.start(None)
    assert isinstance(watcher.next_work(), PositionWork)
    assert watcher.next_work() is None
    return watcher


@pytest.mark.parametrize("versions", [5, 1000])
def test_an_idle_poll_on_a_local_log_stats_two_files_and_lists_nothing(tmp_path: Path, versions: int) -> None:
    write_log(tmp_path / "t" / "_delta_log", range(versions))
    watcher = idle_watcher(str(tmp_path / "t"))
    counted = Counting(watcher.storage, STORAGE_CALLS)
    for _ in range(20):
        assert watcher.next_work() is None
    # per poll: <next>.json; per check: 0.json and <cursor>.json (the check runs on every poll here)
    assert counted.calls == Counter(info=60), counted.calls
    # and a commit is still found by the next poll
    write_log(tmp_path / "t" / "_delta_log", range(versions, versions + 1))
    work = watcher.next_work()
    assert isinstance(work, CommitWork) and work.version == versions
    assert counted.calls["list_dir"] == 0
    watcher.close()


@pytest.fixture
def memory_table() -> Iterator[tuple[str, Any]]:
    fs = fsspec.filesystem("memory")
    root = "/idle-cost-table"
    for v in range(300):
        fs.pipe_file(f"{root}/_delta_log/{v:020d}.json", commit_lines(v).encode())
    yield f"memory://{root}", fs
    fs.rm(root, recursive=True)


def test_an_idle_poll_on_an_object_store_is_one_stat_and_never_a_listing(
    memory_table: tuple[str, Any],
) -> None:
    uri, fs = memory_table
    now = [0.0]
    watcher = TableWatcher(uri, mode="latest", check_interval_s=10, clock=lambda: now[0])
    watcher.start(None)
    assert isinstance(watcher.next_work(), PositionWork)
    requests = Counting(fs, ("ls", "find", "info", "cat_file", "open", "_open", "exists", "glob", "walk"))
    for _ in range(10):  # polls between checks: one HEAD each
        assert watcher.next_work() is None
    assert requests.calls == Counter(info=10), requests.calls
    requests.calls.clear()
    for _ in range(10):  # polls that also run the periodic check: 0.json and the cursor's file
        now[0] += 10
        assert watcher.next_work() is None
    assert requests.calls == Counter(info=30), requests.calls
    watcher.close()


def test_versions_cleaned_while_idle_are_still_a_gap(tmp_path: Path) -> None:
    from deltalake import DeltaTable

    log = tmp_path / "t" / "_delta_log"
    write_log(log, range(6))
    watcher = idle_watcher(str(tmp_path / "t"))
    write_log(log, range(6, 8))
    # a writer checkpoints at 7 and cleans everything before it, between two polls
    DeltaTable(str(tmp_path / "t")).create_checkpoint()
    for v in range(7):
        (log / f"{v:020d}.json").unlink()
    counted = Counting(watcher.storage, STORAGE_CALLS)
    with pytest.raises(LogGapError) as info:
        watcher.next_work()
    assert info.value.version == 6
    assert counted.calls["list_dir"] >= 1  # the cursor's file gone: then, and only then, a listing
    watcher.close()


def test_no_read_ahead_thread_stays_while_idle(tmp_path: Path) -> None:
    import threading
    import time

    def readers() -> set[threading.Thread]:
        return {t for t in threading.enumerate() if t.name.startswith("deltamirror-readahead")}

    log = tmp_path / "t" / "_delta_log"
    write_log(log, range(1))
    watcher = idle_watcher(str(tmp_path / "t"))
    before = readers()
    write_log(log, range(1, 6))  # catching up: the next versions are read ahead on a helper thread
    started: set[threading.Thread] = set()
    while isinstance(watcher.next_work(), CommitWork):
        # seen while the work lasts: once idle, the thread may already be gone
        started |= readers() - before
    assert started, "no read-ahead thread was started while catching up"
    deadline = time.monotonic() + 10
    while any(t.is_alive() for t in started) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not any(t.is_alive() for t in started), "a read-ahead thread outlived the work"
    watcher.close()
