"""File notifications for many tables: one observer per process, and a fallback that polls."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from deltamirror.core.storage import TableStorage
from deltamirror.producer.tailing import waker as waker_module
from deltamirror.producer.tailing.waker import (
    NOTIFIER,
    LogNotifier,
    LogWaker,
    WatchdogObserver,
    default_observer,
)
from deltamirror.producer.tailing.watcher import TableWatcher

TABLES = 200  # above the 128 inotify instances a default Linux gives a user


def tiny_table(path: Path) -> Path:
    """A one-version Delta table, written by hand (200 of them in well under a second)."""
    log = path / "_delta_log"
    log.mkdir(parents=True)
    schema = {"type": "struct", "fields": [{"name": "id", "type": "long", "nullable": True, "metadata": {}}]}
    lines = [
        {"commitInfo": {"timestamp": 1700000000000, "operation": "CREATE TABLE"}},
        {"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}},
        {
            "metaData": {
                "id": f"id-{path.name}",
                "format": {"provider": "parquet", "options": {}},
                "schemaString": json.dumps(schema),
                "partitionColumns": [],
                "configuration": {},
                "createdTime": 1700000000000,
            }
        },
    ]
    (log / f"{0:020d}.json").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def inotify_instances() -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:inotify":
                count += 1
        except OSError:
            continue
    return count


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts inotify instances in /proc")
def test_200_tables_with_notifications_share_one_observer(tmp_path: Path) -> None:
    assert not NOTIFIER.running, "another test left the process's notifier running"
    before_instances = inotify_instances()
    watchers = [TableWatcher(str(tiny_table(tmp_path / f"t{i}")), mode="latest") for i in range(TABLES)]
    wakers = [LogWaker(w.storage) for w in watchers]  # the defaults, as a watch process builds them
    try:
        assert all(w.notifying for w in wakers)
        assert NOTIFIER.watched_folders == TABLES
        assert inotify_instances() - before_instances == 1
        for w in watchers:
            w.start(None)
            assert w.next_work() is not None  # the start position
            assert w.next_work() is None
        # a commit on one table wakes that table, not the others
        timer = threading.Timer(
            0.2, (tmp_path / "t150" / "_delta_log" / f"{1:020d}.json").write_text, ("{}\n",)
        )
        started = time.monotonic()
        timer.start()
        wakers[150].wait(20)
        assert time.monotonic() - started < 10
        started = time.monotonic()
        wakers[3].wait(0.3)
        assert time.monotonic() - started >= 0.3
    finally:
        for w in wakers:
            w.close()
        for wt in watchers:
            wt.close()
    assert not NOTIFIER.running and NOTIFIER.watched_folders == 0
    assert inotify_instances() == before_instances


class _NoInotifyLeft:
    """An observer whose start fails as inotify_init does when no instance is left."""

    def start(self) -> None:
        raise OSError(24, "inotify instance limit reached")


def test_an_observer_that_cannot_start_makes_every_table_poll(tmp_path: Path) -> None:
    notifier = LogNotifier(observer_factory=_NoInotifyLeft)
    wakers = [
        LogWaker(TableStorage(str(tiny_table(tmp_path / f"t{i}"))), notifier=notifier) for i in range(3)
    ]
    assert not any(w.notifying for w in wakers) and not notifier.running
    started = time.monotonic()
    wakers[0].wait(0.3)  # the poll interval, then the caller probes the log
    assert time.monotonic() - started >= 0.3
    stop = threading.Event()
    threading.Timer(0.2, stop.set).start()
    started = time.monotonic()
    wakers[1].wait(20, stop)
    assert time.monotonic() - started < 5
    for w in wakers:
        w.close()


class _RefusingOneFolder:
    """The real observer, refusing to watch one folder as inotify does past its watch limit."""

    def __init__(self, refused: str) -> None:
        self._real = default_observer()
        self._refused = refused

    def watch(self, folder: str, on_event: Any) -> Any:
        if folder == self._refused:
            raise OSError(28, "inotify watch limit reached")
        return self._real.watch(folder, on_event)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def test_a_folder_that_cannot_be_watched_polls_alone(tmp_path: Path) -> None:
    tables = [tiny_table(tmp_path / f"t{i}") for i in range(3)]
    refused = TableStorage(str(tables[1])).log_path
    notifier = LogNotifier(observer_factory=lambda: _RefusingOneFolder(refused))
    wakers = [LogWaker(TableStorage(str(t)), notifier=notifier) for t in tables]
    try:
        assert [w.notifying for w in wakers] == [True, False, True]
        threading.Timer(0.2, (tables[2] / "_delta_log" / f"{1:020d}.json").write_text, ("{}\n",)).start()
        started = time.monotonic()
        wakers[2].wait(20)
        assert time.monotonic() - started < 10
    finally:
        for w in wakers:
            w.close()
    assert not notifier.running


def test_a_log_folder_created_later_is_watched_then(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(waker_module, "RETRY_WATCH_S", 0.0)
    notifier = LogNotifier()
    waker = LogWaker(TableStorage(str(tmp_path / "t")), notifier=notifier)
    try:
        assert not waker.notifying
        waker.wait(0.01)
        assert not waker.notifying  # still no folder: polls, no error
        tiny_table(tmp_path / "t")
        waker.wait(0.01)
        assert waker.notifying and notifier.watched_folders == 1
    finally:
        waker.close()
    assert not notifier.running


def test_a_stop_ends_an_idle_wait_without_slicing_it(tmp_path: Path) -> None:
    notifier = LogNotifier()
    waker = LogWaker(TableStorage(str(tiny_table(tmp_path / "t"))), notifier=notifier)
    stop = threading.Event()
    try:
        threading.Timer(0.3, stop.set).start()
        started = time.monotonic()
        waker.wait(30, stop)
        assert 0.2 < time.monotonic() - started < 5
    finally:
        waker.close()


@pytest.mark.parametrize("backend", [default_observer, WatchdogObserver], ids=["default", "watchdog"])
def test_a_deleted_and_recreated_log_folder_is_watched_again(tmp_path: Path, backend: Any) -> None:
    import shutil

    notifier = LogNotifier(observer_factory=backend)
    table = tiny_table(tmp_path / "t")
    waker = LogWaker(TableStorage(str(table)), notifier=notifier)
    try:
        assert waker.notifying
        shutil.rmtree(table)
        tiny_table(table)  # the table re-created at the same path
        waker.wait(0.5)  # woken by the deletion (inotify), or the poll interval
        waker.wait(0.01)
        threading.Timer(0.2, (table / "_delta_log" / f"{1:020d}.json").write_text, ("{}\n",)).start()
        started = time.monotonic()
        waker.wait(20)
        assert time.monotonic() - started < 10
    finally:
        waker.close()
    assert not notifier.running


def test_a_local_log_watched_by_notifications_is_notified_locally_and_one_on_a_network_mount_is_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An idle table polls every 30 s by default only where a notification sees every commit: not
    on NFS, SMB or a FUSE mount, whose notifications miss other machines' writes."""
    local = tiny_table(tmp_path / "local")
    notifier = LogNotifier()
    waker = LogWaker(TableStorage(str(local)), notifier=notifier)
    off = LogWaker(TableStorage(str(tiny_table(tmp_path / "off"))), enabled=False, notifier=notifier)
    try:
        assert waker.notifying and waker.notified_locally
        assert not off.notifying and not off.notified_locally
    finally:
        waker.close()
        off.close()
    # mounts made up below tmp_path (one device: what a device was found to be is forgotten each time)
    mounts = [(str(tmp_path / "nfs"), "nfs4"), (str(tmp_path / "fuse"), "fuse.sshfs"), ("/", "ext4")]
    monkeypatch.setattr(waker_module, "_mounts", (time.monotonic(), mounts))
    monkeypatch.setattr(waker_module, "_by_device", {})
    remote = tiny_table(tmp_path / "nfs" / "t")
    waker = LogWaker(TableStorage(str(remote)), notifier=notifier)
    try:
        assert waker.notifying and not waker.notified_locally  # watched, but polled as if it were not
    finally:
        waker.close()
    monkeypatch.setattr(waker_module, "_by_device", {})
    assert not waker_module.on_local_disk(str(tiny_table(tmp_path / "fuse" / "t")))
    monkeypatch.setattr(waker_module, "_by_device", {})
    assert waker_module.on_local_disk(str(local))
    assert not notifier.running
