"""Opens on a local disk whose real path must stay inside the table root (or an allowed prefix).

A path in the log was already held to the root by its components (:class:`~.PathRules`); on a
local disk a symbolic link inside the root could still lead out of it. Every local open therefore
checks the file's real path first. On Linux the file is opened with ``O_PATH``, its real path read
from ``/proc/self/fd/N`` and the very file checked reopened through that name, so a link swapped
meanwhile changes nothing; elsewhere the real path is checked, then opened.

The common case costs one ``openat`` and one ``readlink`` on Linux: the folder of a file is held
open (``O_PATH``) once its real path was checked, and the file is opened relative to it with
``O_NOFOLLOW``. The folder's real path is read again before every open (a folder renamed or
deleted since is let go), and a file that is itself a link takes the long way above, which
resolves it (at most 64 folders are held per table, 256 per process; beyond, the long way). Only
regular files are read. A small parquet file is read whole in one call and decoded from memory.

Only :class:`~deltamirror.core.storage.TableStorage` uses this module: it is part of the one
choke point through which core opens table files.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import threading
import weakref
from collections.abc import Callable
from typing import IO, Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from ..errors import PathOutsideTableError
from ..paths import inside

#: the same file on another filesystem (opened through pyarrow's own local filesystem: handing
#: pyarrow an fsspec filesystem makes it convert that filesystem on every open)
_LOCAL_FS = pafs.LocalFileSystem()
#: Linux: a file opened with O_PATH is reopened race-free through /proc/self/fd/N after its real
#: path was checked; elsewhere the real path is checked, then the file opened by that path
_PROC_FD = hasattr(os, "O_PATH") and os.path.isdir("/proc/self/fd")
#: folders held open to open the files in them with one ``openat``: at most this many (all are
#: let go when the map is full; a table's files sit in few folders, a partitioned one's in more)
FOLDER_HANDLES = 64
#: folders held by every table of the process together: beyond this, files are opened the long way
#: (a watcher of thousands of tables must not spend its descriptors, often 1,024, on folders)
PROCESS_FOLDER_HANDLES = 256
_process_lock = threading.Lock()
_process_held = 0


def _take_handle() -> bool:
    """One of the process's folder handles, if one is left."""
    global _process_held
    with _process_lock:
        if _process_held >= PROCESS_FOLDER_HANDLES:
            return False
        _process_held += 1
        return True


def _give_back(n: int) -> None:
    global _process_held
    with _process_lock:
        _process_held -= n


#: a local parquet file up to this size is read whole in one call and decoded from memory: through
#: pyarrow's file each footer and column chunk is a read call of its own (measured on 39 KB files
#: of bench/bench_changes.py's table: ~280 us per file whole, ~335 us through the file)
WHOLE_PARQUET_BYTES = 4 * 1024 * 1024
_OPEN_CHECKED = (
    os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0) | getattr(os, "O_NONBLOCK", 0)
)
_OPEN_IN_FOLDER = os.O_RDONLY | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)


class _OwnedParquetFile(pq.ParquetFile):  # type: ignore[misc]  # pyarrow has no type hints
    """A ParquetFile over a handle it owns: closing it closes the file (pyarrow leaves a handle it
    was given open)."""

    def close(self, force: bool = False) -> None:
        super().close(force=True)


class LocalFiles:
    """Opens of local files, each refused unless its real path is inside one of ``places``.

    ``places`` gives the folders (the table root, then the local allowed prefixes) when first
    needed: they are resolved to real paths once, on the first open.
    """

    def __init__(self, places: Callable[[], list[str]], table_uri: str) -> None:
        self._places = places
        self._table_uri = table_uri
        self._real_roots: tuple[str, ...] | None = None
        #: folder as named -> (O_PATH descriptor, its real path when checked)
        self._folders: dict[str, tuple[int, str]] = {}
        self._lock = threading.Lock()
        self._finalizer = weakref.finalize(self, _close_folders, self._folders)

    def open(self, path: str) -> IO[bytes]:
        """``path`` opened for streaming."""
        fd, _ = self._open_fd(path)
        return os.fdopen(fd, "rb")

    def read_bytes(self, path: str, start: int | None, end: int | None) -> bytes:
        """The byte range [start, end) of ``path``, clipped to the file's end."""
        fd, size = self._open_fd(path)
        try:
            lo = start or 0
            hi = size if end is None else min(end, size)
            return _read_range(fd, lo, hi)
        finally:
            os.close(fd)

    def parquet_file(self, path: str, **options: Any) -> pq.ParquetFile:
        """A ParquetFile that owns its handle (``close`` closes the file); a small file is read
        whole and decoded from memory (:data:`WHOLE_PARQUET_BYTES`)."""
        if _PROC_FD:
            fd, size = self._open_fd(path)
            try:
                if size <= WHOLE_PARQUET_BYTES:
                    source = pa.BufferReader(_read_range(fd, 0, size))
                else:
                    source = _LOCAL_FS.open_input_file(f"/proc/self/fd/{fd}")
            finally:
                os.close(fd)
        else:
            _, name = self._checked(path)
            source = _LOCAL_FS.open_input_file(name)
        try:
            return _OwnedParquetFile(source, **options)
        except BaseException:
            source.close()
            raise

    def _real_places(self) -> tuple[str, ...]:
        """Real paths of the root and of the local allowed prefixes (symbolic links resolved)."""
        if self._real_roots is None:
            self._real_roots = tuple(os.path.realpath(p) for p in self._places())
        return self._real_roots

    def _check_real(self, real: str, path: str) -> None:
        if not any(inside(real, place) for place in self._real_places()):
            raise PathOutsideTableError(
                f"{path!r} leads through a symbolic link to {real!r}, outside the table root and "
                "every allowed prefix; not read (allow that location with --allow-path-prefix URI "
                "or allowed_path_prefixes)",
                table=self._table_uri,
            )

    def _checked(self, path: str) -> tuple[int, str]:
        """A name that opens ``path``'s file, whose real path was checked, and the descriptor
        (or -1) to close once it is opened. On Linux it is /proc/self/fd/N of an O_PATH descriptor:
        the very file checked, even if a link is swapped meanwhile; elsewhere the real path."""
        if not _PROC_FD:
            real = os.path.realpath(path)
            self._check_real(real, path)
            return -1, real
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        name = f"/proc/self/fd/{fd}"
        try:
            self._check_real(os.readlink(name), path)
        except BaseException:
            os.close(fd)
            raise
        return fd, name

    def _in_checked_folder(self, path: str) -> int | None:
        """``path`` opened for reading relative to its folder, held open once the folder's real
        path was found inside a place; None when the long way must decide: the file is a link, the
        folder is outside (or was renamed or deleted since it was checked: let go), the process
        holds :data:`PROCESS_FOLDER_HANDLES` folders already, or Linux's ``/proc/self/fd`` is not
        there.

        Under a lock: a folder's descriptor is only used, and only closed, while it is held, so a
        thread never opens relative to a descriptor another closed (and the system reused).
        ``O_NONBLOCK``: opening a FIFO where a file should be does not wait for a writer with the
        lock held (the FIFO is then refused as not a regular file); it changes nothing for a
        regular file.
        """
        folder, name = os.path.split(path)
        if not _PROC_FD or not name:
            return None
        with self._lock:
            held = self._folders.get(folder)
            if held is not None and os.readlink(f"/proc/self/fd/{held[0]}") != held[1]:
                self._let_go(folder)  # renamed, or deleted (its link now ends in " (deleted)")
                held = None
            if held is None:
                if len(self._folders) >= FOLDER_HANDLES:
                    _close_folders(self._folders)
                if not _take_handle():
                    return None
                held = _open_folder(folder or ".")
                if held is None or not any(
                    held[1] == place or inside(held[1], place) for place in self._real_places()
                ):
                    if held is not None:
                        os.close(held[0])
                    _give_back(1)
                    return None
                self._folders[folder] = held
            try:
                return os.open(name, _OPEN_IN_FOLDER, dir_fd=held[0])
            except OSError as exc:
                if exc.errno != errno.ELOOP:  # ELOOP: the file is a link
                    self._let_go(folder)  # the long way opens it again and reports what it meets
                return None

    def _let_go(self, folder: str) -> None:
        held = self._folders.pop(folder, None)
        if held is not None:
            os.close(held[0])
            _give_back(1)

    def close(self) -> None:
        """Let go of the folders held open (they are opened again when needed)."""
        with self._lock:
            _close_folders(self._folders)

    def _open_fd(self, path: str) -> tuple[int, int]:
        """A descriptor of ``path`` opened for reading, once its real path was checked (a file
        behind a link out of the root is not even opened), and the file's size. Only a regular
        file is read: a folder is IsADirectoryError, a FIFO, socket or device NotARegularFileError
        (both refusals, not storage trouble to retry)."""
        fd = self._in_checked_folder(path)
        if fd is None:
            held, name = self._checked(path)
            try:
                fd = os.open(name, _OPEN_CHECKED)
            finally:
                if held >= 0:
                    os.close(held)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                if stat.S_ISDIR(st.st_mode):
                    raise IsADirectoryError(errno.EISDIR, "Is a directory")
                raise NotARegularFileError(errno.EINVAL, "not a regular file")
        except BaseException:
            os.close(fd)
            raise
        return fd, st.st_size


class NotARegularFileError(OSError):
    """A FIFO, socket or device where the log names a file: never read (a FIFO would block)."""


def _open_folder(folder: str) -> tuple[int, str] | None:
    """``folder`` opened with ``O_PATH`` and its real path; None if it cannot be (the long way
    reports why: missing, not a folder, no permission)."""
    try:
        fd = os.open(folder, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return fd, os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        os.close(fd)
        return None


def _close_folders(folders: dict[str, tuple[int, str]]) -> None:
    for fd, _ in folders.values():
        with contextlib.suppress(OSError):
            os.close(fd)
    _give_back(len(folders))
    folders.clear()


def _read_range(fd: int, lo: int, hi: int) -> bytes:
    """Bytes [lo, hi) of an open file; fewer if it shrank while read."""
    if hi <= lo:
        return b""
    if lo:
        os.lseek(fd, lo, os.SEEK_SET)
    chunks = []
    remaining = hi - lo
    while remaining > 0:
        chunk = os.read(fd, remaining)
        if not chunk:  # shrank while read
            break
        chunks.append(chunk)
        remaining -= len(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)
