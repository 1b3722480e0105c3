"""Waking the producer early on a local file system, when a file appears in ``_delta_log``."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from deltamirror.core.storage import TableStorage

#: the logger it had in the watcher, where it lived first (log settings name it)
log = logging.getLogger("deltamirror.producer.watcher")


class LogWaker:
    """Waits for the next poll, or less when a file appears in a local ``_delta_log``.

    Notifications come from watchdog (inotify, FSEvents, ReadDirectoryChangesW). They only shorten
    the wait: the listing stays the source of truth, so a lost or spurious notification costs at
    most one poll interval. Object stores have no notifications here: there it simply waits.
    """

    def __init__(self, storage: TableStorage, enabled: bool = True) -> None:
        self._changed = threading.Event()
        self._observer: Any = None
        if not enabled or not storage.uri.startswith("file://"):
            return
        from watchdog.events import (
            FileClosedEvent,
            FileCreatedEvent,
            FileMovedEvent,
            FileSystemEvent,
            FileSystemEventHandler,
        )
        from watchdog.observers import Observer

        changed = self._changed

        class _OnLogFile(FileSystemEventHandler):
            def on_any_event(self, event: FileSystemEvent) -> None:
                if event.event_type in ("created", "moved", "closed") and not event.is_directory:
                    changed.set()

        observer = Observer()
        try:
            # only what a new commit makes: without a filter every read of a commit by the watcher
            # itself (open, close) woke three watchdog threads (~0.3 ms of CPU per commit read)
            only = [FileCreatedEvent, FileMovedEvent, FileClosedEvent]
            try:
                observer.schedule(_OnLogFile(), storage.log_path, recursive=False, event_filter=only)
            except TypeError:  # watchdog before 5.0 has no filter: every event, as before
                observer.schedule(_OnLogFile(), storage.log_path, recursive=False)
            observer.daemon = True
            observer.start()
        except OSError as exc:  # no _delta_log yet, or the inotify watch limit reached: just poll
            log.info("no file notifications for %s (%s); polling", storage.log_path, exc)
            return
        self._observer = observer

    @property
    def notifying(self) -> bool:
        return self._observer is not None

    def wait(self, timeout: float, stop: threading.Event | None = None) -> None:
        """Return after ``timeout`` seconds, on a log file event, or when ``stop`` is set."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or (stop is not None and stop.is_set()):
                return
            if self._changed.wait(min(left, 0.1)):
                self._changed.clear()
                return

    def close(self) -> None:
        if self._observer is not None:
            self._observer.stop()
            self._observer.join(timeout=5)
            self._observer = None


__all__ = ["LogWaker"]
