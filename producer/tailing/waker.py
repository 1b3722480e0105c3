"""Waking the producer early on a local file system, when a file appears in ``_delta_log``.

One process watches every local table through ONE notification observer (:class:`LogNotifier`):
one inotify instance (or FSEvents stream, or ReadDirectoryChangesW handle) and one watch per
``_delta_log`` folder. An observer per table ran into the per-user limit on notification
instances (128 on a default Linux) at a few hundred tables, and cost threads per table.

Notifications only shorten the wait: the probe of the log stays the source of truth, so a lost or
spurious notification costs at most one poll interval. That makes every failure a fallback to
polling: a folder that cannot be watched (missing, a watch limit) polls alone; an observer that
cannot start makes every table poll. Object stores have no notifications here: they poll.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections.abc import Callable
from typing import Any

from deltamirror.core.storage import TableStorage

from . import inotify

#: the logger it had in the watcher, where it lived first (log settings name it)
log = logging.getLogger("deltamirror.producer.watcher")

#: how often a table whose ``_delta_log`` did not exist yet tries to be watched again
RETRY_WATCH_S = 30.0
#: how often the one thread that relays stop flags to idle tables looks at them
STOP_RELAY_INTERVAL_S = 0.2

_ONLY_COMMIT_EVENTS = ("created", "moved", "closed")

#: file systems whose notifications miss what other machines (or a VM's host) write there: network
#: and cluster file systems, VM shared folders; a log on one is polled as if no notification watched
#: it (FUSE mounts too: sshfs, s3fs, gcsfuse...)
NETWORK_FILE_SYSTEMS = frozenset(
    {
        "nfs",
        "nfs4",
        "cifs",
        "smb3",
        "smbfs",
        "9p",
        "ceph",
        "glusterfs",
        "lustre",
        "gpfs",
        "afs",
        "davfs",
        "virtiofs",
        "vboxsf",
        "vmhgfs",
        "ocfs2",
        "gfs2",
        "beegfs",
    }
)
#: how long the mount table read from /proc/self/mounts is used before it is read again
MOUNTS_TTL_S = 60.0
_mounts: tuple[float, list[tuple[str, str]]] = (float("-inf"), [])
_mounts_lock = threading.Lock()
_OCTAL = re.compile(r"\\([0-7]{3})")


def _mount_table() -> list[tuple[str, str]]:
    """(mount point, file system type) of every mount, longest mount point first ([] off Linux)."""
    global _mounts
    with _mounts_lock:
        read_at, table = _mounts
        if time.monotonic() - read_at < MOUNTS_TTL_S:
            return table
        try:
            with open("/proc/self/mounts", encoding="utf-8", errors="replace") as fh:
                rows = [line.split() for line in fh]
        except OSError:
            rows = []
        # the mount point escapes spaces, tabs and backslashes as octal (\040)
        table = sorted(
            (
                (_OCTAL.sub(lambda m: chr(int(m.group(1), 8)), row[1]), row[2])
                for row in rows
                if len(row) >= 3
            ),
            key=lambda entry: len(entry[0]),
            reverse=True,
        )
        _mounts = (time.monotonic(), table)
        return table


#: st_dev -> on a local disk: the folders of one device are all local or all not (one stat per table)
_by_device: dict[int, bool] = {}


def on_local_disk(folder: str) -> bool:
    """False when ``folder`` is on a network file system (NFS, SMB...) or a FUSE mount, whose
    notifications do not see other machines' writes; True otherwise, and when it cannot be told."""
    try:
        device = os.stat(folder).st_dev
    except OSError:
        return True
    local = _by_device.get(device)
    if local is None:
        local = True
        path = os.path.realpath(folder)
        for mount_point, fs_type in _mount_table():
            if path == mount_point or path.startswith(mount_point.rstrip("/") + "/"):
                local = fs_type not in NETWORK_FILE_SYSTEMS and not fs_type.startswith("fuse")
                break
        _by_device[device] = local
    return local


class WatchdogObserver:
    """watchdog's observer behind the interface of :class:`~.inotify.InotifyObserver` (macOS,
    Windows, a Linux without a usable libc): one observer, one watch per folder."""

    def __init__(self) -> None:
        from watchdog.observers import Observer

        self._observer = Observer()

    def start(self) -> None:
        self._observer.daemon = True
        self._observer.start()

    def watch(self, folder: str, on_event: Callable[[], None]) -> Any:
        from watchdog.events import DirDeletedEvent, FileSystemEvent, FileSystemEventHandler

        ended = threading.Event()
        own_path = os.fsencode(folder)

        class _OnLogFile(FileSystemEventHandler):
            def on_any_event(self, event: FileSystemEvent) -> None:
                if event.event_type == "deleted" and os.fsencode(event.src_path) == own_path:
                    ended.set()  # the folder itself: its watch is over
                    on_event()
                elif event.event_type in _ONLY_COMMIT_EVENTS and not event.is_directory:
                    on_event()

        try:
            from watchdog.events import FileClosedEvent, FileCreatedEvent, FileMovedEvent

            # only what a new commit makes (and the folder's end): without a filter every read of a
            # commit by the watcher itself (open, close) woke the observer (~0.3 ms of CPU per read)
            only = [FileCreatedEvent, FileMovedEvent, FileClosedEvent, DirDeletedEvent]
            watch = self._observer.schedule(_OnLogFile(), folder, recursive=False, event_filter=only)
        except TypeError:  # watchdog before 5.0 has no filter: every event, as before
            watch = self._observer.schedule(_OnLogFile(), folder, recursive=False)
        return watch, ended

    def unwatch(self, handle: Any) -> None:
        self._observer.unschedule(handle[0])

    def watching(self, handle: Any) -> bool:
        """False once the folder itself was deleted."""
        return not handle[1].is_set()

    def stop(self) -> None:
        self._observer.stop()

    def join(self, timeout: float | None = None) -> None:
        self._observer.join(timeout)


def default_observer() -> Any:
    """inotify read on one thread on Linux; watchdog elsewhere."""
    if inotify.available():
        return inotify.InotifyObserver()
    return WatchdogObserver()


class LogNotifier:
    """One notification observer shared by every table of the process, counted by subscription.

    The observer starts with the first subscription and stops with the last. ``subscribe`` says
    whether the folder is watched; when it is not, the caller polls (and says nothing more than
    one log line: polling is correct, only slower to notice a commit).
    """

    def __init__(self, observer_factory: Callable[[], Any] = default_observer) -> None:
        self._factory = observer_factory
        self._lock = threading.Lock()
        self._observer: Any = None
        #: why the observer could not start: every table of the process polls from then on
        self._broken: str | None = None
        #: watched folder -> (the observer's handle, the events its notifications set)
        self._folders: dict[str, tuple[Any, set[threading.Event]]] = {}

    @property
    def watched_folders(self) -> int:
        with self._lock:
            return len(self._folders)

    @property
    def running(self) -> bool:
        with self._lock:
            return self._observer is not None

    def watching(self, folder: str) -> bool:
        """False once the folder's watch ended (the folder was deleted, maybe made again)."""
        with self._lock:
            entry = self._folders.get(folder)
            return (
                entry is not None and self._observer is not None and bool(self._observer.watching(entry[0]))
            )

    def subscribe(self, folder: str, changed: threading.Event) -> bool:
        """Set ``changed`` whenever a file is created in ``folder``; False if it cannot be watched."""
        with self._lock:
            if self._broken is not None:
                return False
            if self._observer is None and not self._start_observer():
                return False
            entry = self._folders.get(folder)
            # none yet, or its watch ended with the folder: watch the new folder for everyone
            if entry is None or not self._observer.watching(entry[0]):
                events = entry[1] if entry is not None else set()
                try:
                    handle = self._observer.watch(folder, _setter(events))
                except OSError as exc:  # missing folder, or a watch / instance limit: this one polls
                    log.info("no file notifications for %s (%s); polling", folder, exc)
                    self._stop_if_unused()
                    return False
                entry = (handle, events)
                self._folders[folder] = entry
            entry[1].add(changed)
            return True

    def unsubscribe(self, folder: str, changed: threading.Event) -> None:
        with self._lock:
            entry = self._folders.get(folder)
            if entry is None or changed not in entry[1]:
                return
            entry[1].discard(changed)
            if not entry[1]:
                del self._folders[folder]
                if self._observer is not None:
                    try:
                        self._observer.unwatch(entry[0])
                    except (KeyError, OSError) as exc:  # the folder went away with its watch
                        log.debug("unwatching %s: %s", folder, exc)
            self._stop_if_unused()

    # --- under the lock ---------------------------------------------------------------------

    def _start_observer(self) -> bool:
        try:
            observer = self._factory()
            observer.start()
        except (OSError, RuntimeError) as exc:  # no inotify instance left, no backend: all poll
            self._broken = str(exc)
            log.warning("file notifications unavailable (%s); every table polls", exc)
            return False
        self._observer = observer
        return True

    def _stop_if_unused(self) -> None:
        if self._folders or self._observer is None:  # a folder is kept only while it has subscribers
            return
        observer, self._observer = self._observer, None
        observer.stop()
        observer.join(timeout=5)


def _setter(events: set[threading.Event]) -> Callable[[], None]:
    def on_event() -> None:
        for changed in tuple(events):
            changed.set()

    return on_event


#: the process's one notifier (tests build their own)
NOTIFIER = LogNotifier()


class _StopRelay:
    """Sets a waiter's wake event when its stop flag is set.

    ``threading.Event`` cannot wait on two events: waiting in short slices to see the stop cost
    ten wake-ups a second per idle table. One thread for the whole process looks at every
    registered flag a few times a second instead (a flag read is tens of nanoseconds), and ends
    when nobody waits any more.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pairs: set[tuple[threading.Event, threading.Event]] = set()
        self._thread: threading.Thread | None = None

    def add(self, stop: threading.Event, changed: threading.Event) -> None:
        with self._lock:
            self._pairs.add((stop, changed))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._relay, name="deltamirror-stop-relay", daemon=True
                )
                self._thread.start()

    def discard(self, stop: threading.Event, changed: threading.Event) -> None:
        with self._lock:
            self._pairs.discard((stop, changed))

    def _relay(self) -> None:
        while True:
            time.sleep(STOP_RELAY_INTERVAL_S)
            with self._lock:
                stopped = [pair for pair in self._pairs if pair[0].is_set()]
                self._pairs.difference_update(stopped)
                done = not self._pairs
                if done:
                    self._thread = None
            for _, changed in stopped:
                changed.set()
            if done:
                return


_STOP_RELAY = _StopRelay()


class _WakeEvent(threading.Event):
    """An event that also calls its listener when it is set (a notification, a stop relayed)."""

    def __init__(self) -> None:
        super().__init__()
        self.listener: Callable[[], None] | None = None

    def set(self) -> None:
        super().set()
        listener = self.listener
        if listener is not None:
            listener()


class LogWaker:
    """Waits for the next poll, or less when a file appears in a local ``_delta_log``.

    Notifications come from the process's one :class:`LogNotifier` (inotify on Linux, watchdog's
    FSEvents or ReadDirectoryChangesW elsewhere). A waker costs no thread of its own: its wait is
    one blocking wait on an event that a notification, the poll timeout or the stop flag ends.

    A table served by a pool of workers does not wait here: it registers a listener
    (:meth:`listen`), called on the notifier's thread when a file appears, and calls
    :meth:`prepare` before each idle wait instead of :meth:`wait`.
    """

    def __init__(
        self, storage: TableStorage, enabled: bool = True, *, notifier: LogNotifier | None = None
    ) -> None:
        self._changed = _WakeEvent()
        self._notifier = notifier if notifier is not None else NOTIFIER
        self._folder = storage.log_path
        self._wanted = enabled and storage.uri.startswith("file://")
        self._subscribed = False
        #: the watched folder is on a local disk (notifications see every write there)
        self._local = False
        self._next_try = 0.0
        self._stops: set[threading.Event] = set()
        self._closed = False
        if self._wanted:
            self._try_subscribe()

    def _try_subscribe(self) -> None:
        self._next_try = time.monotonic() + RETRY_WATCH_S
        if not os.path.isdir(self._folder):  # no _delta_log yet: poll, try again later
            return
        self._subscribed = self._notifier.subscribe(self._folder, self._changed)
        if not self._subscribed:
            self._wanted = False  # the folder exists and cannot be watched: polling for good
        elif not self._local:
            self._local = on_local_disk(self._folder)

    @property
    def notifying(self) -> bool:
        return self._subscribed

    @property
    def notified_locally(self) -> bool:
        """Notifications watch the log on a local disk: a new commit wakes the table at once, and
        its poll (``poll_interval_s``, longer by default then) only bounds a lost notification."""
        return self._subscribed and self._local

    def listen(self, listener: Callable[[], None] | None) -> None:
        """Call ``listener`` (on the notifier's thread: it must not block) whenever a log file
        event arrives; None: no more calls."""
        self._changed.listener = listener

    def clear(self) -> None:
        """Forget the events seen so far (the table is about to look at its log anyway)."""
        self._changed.clear()

    def prepare(self) -> None:
        """Before an idle wait: watch the folder again if it was deleted (a dropped or re-created
        table), or if it did not exist yet when last tried."""
        if self._subscribed and not self._notifier.watching(self._folder):
            # the folder was deleted (a dropped or re-created table): watch the new one, if any
            self._notifier.unsubscribe(self._folder, self._changed)
            self._subscribed = False
            self._next_try = 0.0
        if self._wanted and not self._subscribed and not self._closed and time.monotonic() >= self._next_try:
            self._try_subscribe()

    def wait(self, timeout: float, stop: threading.Event | None = None) -> None:
        """Return after ``timeout`` seconds, on a log file event, or when ``stop`` is set."""
        self.prepare()
        if stop is not None and stop not in self._stops:
            self._stops.add(stop)
            _STOP_RELAY.add(stop, self._changed)
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or (stop is not None and stop.is_set()):
                return
            if self._changed.wait(left):
                self._changed.clear()
                return

    def close(self) -> None:
        self._closed = True
        self._changed.listener = None
        for stop in self._stops:
            _STOP_RELAY.discard(stop, self._changed)
        self._stops.clear()
        if self._subscribed:
            self._subscribed = False
            self._notifier.unsubscribe(self._folder, self._changed)


__all__ = ["NETWORK_FILE_SYSTEMS", "NOTIFIER", "LogNotifier", "LogWaker", "on_local_disk"]
