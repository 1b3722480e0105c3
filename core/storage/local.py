"""Opens on a local disk whose real path must stay inside the table root (or an allowed prefix).

A path in the log was already held to the root by its components (:class:`~.PathRules`); on a
local disk a symbolic link inside the root could still lead out of it. Every local open therefore
checks the file's real path first. On Linux the file is opened with ``O_PATH``, its real path read
from ``/proc/self/fd/N`` and the very file checked reopened through that name, so a link swapped
meanwhile changes nothing; elsewhere the real path is checked, then opened.

Only :class:`~deltamirror.core.storage.TableStorage` uses this module: it is part of the one
choke point through which core opens table files.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import IO, Any

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

    def open(self, path: str) -> IO[bytes]:
        """``path`` opened for streaming."""
        return os.fdopen(self._open_fd(path), "rb")

    def read_bytes(self, path: str, start: int | None, end: int | None) -> bytes:
        """The byte range [start, end) of ``path``, clipped to the file's end."""
        fd = self._open_fd(path)
        try:
            size = os.fstat(fd).st_size
            lo = start or 0
            hi = size if end is None else min(end, size)
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
        finally:
            os.close(fd)

    def parquet_file(self, path: str, **options: Any) -> pq.ParquetFile:
        """A ParquetFile that owns its handle (``close`` closes the file)."""
        held, name = self._checked(path)
        try:
            source = _LOCAL_FS.open_input_file(name)
        finally:
            if held >= 0:
                os.close(held)
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

    def _open_fd(self, path: str) -> int:
        """A descriptor of ``path`` opened for reading, once its real path was checked (a file
        behind a link out of the root is not even opened)."""
        held, name = self._checked(path)
        try:
            return os.open(name, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0))
        finally:
            if held >= 0:
                os.close(held)
