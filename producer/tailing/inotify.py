"""Linux inotify for many folders on one file descriptor and one thread.

watchdog's observer, shared, still runs one emitter thread per watched folder: a watcher of 5,000
tables would hold 5,000 idle threads for notifications alone. inotify itself needs one instance
for any number of watches (the watch limit, ``fs.inotify.max_user_watches``, is in the hundreds
of thousands), so on Linux the process reads them all itself, on one thread that sleeps in
``poll`` until the kernel has an event.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import select
import struct
import sys
import threading
from collections.abc import Callable

log = logging.getLogger("deltamirror.producer.watcher")

IN_CLOSE_WRITE = 0x00000008
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000
IN_ISDIR = 0x40000000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC

#: what a new commit makes: its file created (put-if-absent), moved in (rename), or closed after writing
COMMIT_MASK = IN_CREATE | IN_MOVED_TO | IN_CLOSE_WRITE | IN_ONLYDIR
_EVENT = struct.Struct("iIII")
_READ_SIZE = 64 * 1024


def available() -> bool:
    return sys.platform.startswith("linux") and _libc() is not None


_LIBC: ctypes.CDLL | None = None


def _libc() -> ctypes.CDLL | None:
    global _LIBC
    if _LIBC is None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)  # the process's own symbols: libc's among them
            libc.inotify_init1.argtypes = [ctypes.c_int]
            libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
            libc.inotify_rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]
        except (OSError, AttributeError):
            return None
        _LIBC = libc
    return _LIBC


def _raise_errno(what: str, path: str = "") -> None:
    code = ctypes.get_errno()
    raise OSError(code, f"{what}: {os.strerror(code)}", *([path] if path else []))


class InotifyObserver:
    """One inotify instance: ``watch(folder, on_event)`` calls ``on_event()`` on the reader thread
    when a file is created, moved in or closed after writing in ``folder``.

    ``on_event`` also runs when the kernel dropped events (queue overflow) and when the folder's
    watch ended (the folder was deleted): the caller then probes, as after any notification.
    """

    def __init__(self) -> None:
        self._fd = -1
        self._lock = threading.Lock()
        self._callbacks: dict[int, set[Callable[[], None]]] = {}
        self._thread: threading.Thread | None = None
        self._wake_r = self._wake_w = -1

    def start(self) -> None:
        libc = _libc()
        if libc is None:
            raise OSError(errno.ENOSYS, "inotify is not available")
        fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            _raise_errno("inotify_init1")
        self._fd = fd
        self._wake_r, self._wake_w = os.pipe()
        self._thread = threading.Thread(target=self._read_loop, name="deltamirror-inotify", daemon=True)
        self._thread.start()

    def watch(self, folder: str, on_event: Callable[[], None]) -> tuple[int, Callable[[], None]]:
        libc = _libc()
        assert libc is not None and self._fd >= 0, "start() first"
        wd = libc.inotify_add_watch(self._fd, os.fsencode(folder), COMMIT_MASK)
        if wd < 0:
            _raise_errno("inotify_add_watch", folder)
        with self._lock:
            self._callbacks.setdefault(wd, set()).add(on_event)
        return wd, on_event

    def unwatch(self, handle: tuple[int, Callable[[], None]]) -> None:
        wd, on_event = handle
        with self._lock:
            callbacks = self._callbacks.get(wd)
            if callbacks is None:
                return
            callbacks.discard(on_event)
            if callbacks:
                return
            del self._callbacks[wd]
        libc = _libc()
        if libc is not None and self._fd >= 0:
            libc.inotify_rm_watch(self._fd, wd)  # EINVAL when the folder is gone already: fine

    def watching(self, handle: tuple[int, Callable[[], None]]) -> bool:
        """False once the kernel ended the watch (its folder was deleted)."""
        wd, on_event = handle
        with self._lock:
            return on_event in self._callbacks.get(wd, ())

    def stop(self) -> None:
        if self._wake_w >= 0:
            os.write(self._wake_w, b"x")

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def _read_loop(self) -> None:
        poller = select.poll()
        poller.register(self._fd, select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        try:
            while True:
                ready = {fd for fd, _ in poller.poll()}
                if self._wake_r in ready:
                    return
                try:
                    data = os.read(self._fd, _READ_SIZE)
                except BlockingIOError:
                    continue
                self._dispatch(data)
        except OSError as exc:  # the descriptor broke: tables poll (a notification only shortens a wait)
            log.warning("file notifications stopped (%s); polling", exc)
        finally:
            os.close(self._fd)
            os.close(self._wake_r)
            os.close(self._wake_w)
            self._fd = self._wake_r = self._wake_w = -1

    def _dispatch(self, data: bytes) -> None:
        woken: set[Callable[[], None]] = set()
        offset = 0
        with self._lock:
            while offset + _EVENT.size <= len(data):
                wd, mask, _cookie, length = _EVENT.unpack_from(data, offset)
                offset += _EVENT.size + length
                if mask & IN_Q_OVERFLOW:
                    for callbacks in self._callbacks.values():
                        woken.update(callbacks)
                elif mask & IN_IGNORED:
                    woken.update(self._callbacks.pop(wd, ()))
                elif not mask & IN_ISDIR:
                    woken.update(self._callbacks.get(wd, ()))
        for on_event in woken:
            on_event()


__all__ = ["COMMIT_MASK", "InotifyObserver", "available"]
