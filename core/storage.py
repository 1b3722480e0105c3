"""Table storage over fsspec: one picklable object per table that knows its root and credentials.

It is picklable (Spark executors, worker processes) because it carries the URL and storage options
and builds the fsspec filesystem lazily on each side. Listing is done by prefix where the store
can filter server-side (s3, gcs, abfs), so finding the versions after N does not read the whole log.
"""

from __future__ import annotations

import inspect
import os
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import IO, Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from .errors import InvalidTableUriError, StorageError

LOG_DIR = "_delta_log"

#: URL scheme -> the extra of pyproject.toml that installs its fsspec implementation
_EXTRAS = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs", "abfs": "azure", "abfss": "azure", "az": "azure"}

#: a failed storage call is tried this many times in all before its error is raised
STORAGE_ATTEMPTS = 4
#: seconds before the second attempt; doubled before each further one (0.2, 0.4, 0.8)
STORAGE_BACKOFF_S = 0.2
#: errors that say the request, not the storage, was wrong: retrying cannot help
_PERMANENT_ERRORS = (
    FileNotFoundError,
    PermissionError,
    IsADirectoryError,
    NotADirectoryError,
    FileExistsError,
)


@dataclass(frozen=True, slots=True)
class FileInfo:
    """A listed file: its name inside the listed folder, size and modification time (epoch ms)."""

    name: str
    size: int
    modification_time: int


def normalize_table_uri(uri: str) -> str:
    """A stable URI for a table: absolute ``file://`` for local paths, no trailing slash.

    It is the identity of a table in progress records and Kafka keys, so two spellings of the same
    location (``./t``, ``/abs/t/``, ``file:///abs/t``) must give the same string.
    """
    if not uri or not uri.strip():
        raise InvalidTableUriError("empty table location", table=uri)
    parsed = urllib.parse.urlparse(uri)
    if parsed.scheme in ("", "file") or (len(parsed.scheme) == 1 and os.name == "nt"):
        path = parsed.path if parsed.scheme == "file" else uri
        if parsed.scheme == "file" and parsed.netloc not in ("", "localhost"):
            raise InvalidTableUriError("file:// URL with a host is not supported", table=uri)
        return "file://" + os.path.abspath(os.path.expanduser(path)).rstrip("/")
    if parsed.scheme not in fsspec.available_protocols() and parsed.scheme not in fsspec.registry:
        raise InvalidTableUriError(f"unknown storage protocol {parsed.scheme!r}", table=uri)
    return uri.rstrip("/")


def _epoch_ms(info: dict[str, Any]) -> int:
    """fsspec implementations name and type the modification time differently; unify to epoch ms."""
    for key in ("mtime", "LastModified", "last_modified", "updated", "mtime_ns", "created"):
        value = info.get(key)
        if value is None:
            continue
        if key == "mtime_ns":
            return int(value) // 1_000_000
        if isinstance(value, datetime):
            return int(value.timestamp() * 1000)
        if isinstance(value, str):
            return int(datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() * 1000)
        return int(float(value) * 1000)
    return 0


class TableStorage:
    """The files of one table: its log folder, data files and deletion vectors."""

    def __init__(
        self,
        uri: str,
        storage_options: dict[str, Any] | None = None,
        *,
        attempts: int = STORAGE_ATTEMPTS,
        backoff_s: float = STORAGE_BACKOFF_S,
    ) -> None:
        self.uri = normalize_table_uri(uri)
        self.storage_options = dict(storage_options or {})
        self.attempts = max(1, attempts)
        self.backoff_s = backoff_s
        self._fs: fsspec.AbstractFileSystem | None = None
        self._root: str | None = None

    # pickling: credentials travel, the filesystem object (sockets, caches) is rebuilt on arrival
    def __getstate__(self) -> dict[str, Any]:
        return {
            "uri": self.uri,
            "storage_options": self.storage_options,
            "attempts": self.attempts,
            "backoff_s": self.backoff_s,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.uri = state["uri"]
        self.storage_options = state["storage_options"]
        self.attempts = state.get("attempts", STORAGE_ATTEMPTS)
        self.backoff_s = state.get("backoff_s", STORAGE_BACKOFF_S)
        self._fs = None
        self._root = None

    def __repr__(self) -> str:
        return f"TableStorage({self.uri!r})"

    @property
    def fs(self) -> fsspec.AbstractFileSystem:
        if self._fs is None:
            try:
                fs, root = fsspec.core.url_to_fs(self.uri, **self.storage_options)
            except ImportError as exc:
                extra = _EXTRAS.get(self.uri.split(":", 1)[0])
                hint = f" (pip install 'deltamirror[{extra}]')" if extra else ""
                raise InvalidTableUriError(
                    f"storage for this URL needs a package that is not installed: {exc}{hint}", table=self.uri
                ) from exc
            except (ValueError, TypeError) as exc:
                raise InvalidTableUriError(f"cannot open storage: {exc}", table=self.uri) from exc
            self._fs, self._root = fs, root.rstrip("/")
        return self._fs

    @property
    def root(self) -> str:
        """The table root in the filesystem's own path syntax."""
        _ = self.fs
        assert self._root is not None
        return self._root

    @property
    def log_path(self) -> str:
        return f"{self.root}/{LOG_DIR}"

    def log_file(self, name: str) -> str:
        return f"{self.log_path}/{name}"

    # --- paths in the log ---------------------------------------------------------------------

    def data_path(self, path_in_log: str) -> str:
        """Where a path from an add/remove/cdc action lives, in filesystem terms.

        Relative paths in the log are URL-encoded and relative to the table root; absolute ones
        are URIs (``file:/x``, ``s3://b/k``) and are used as they are (decoded).
        """
        if ":" not in path_in_log and "%" not in path_in_log:  # the usual path: nothing to parse
            return f"{self.root}/{path_in_log}"
        parsed = urllib.parse.urlparse(path_in_log)
        if parsed.scheme and len(parsed.scheme) > 1:
            if parsed.scheme == "file":
                return urllib.parse.unquote(parsed.path)
            return self.fs._strip_protocol(urllib.parse.unquote(path_in_log))
        return f"{self.root}/{urllib.parse.unquote(path_in_log)}"

    # --- reading ------------------------------------------------------------------------------

    def _retrying(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Call ``fn``, trying again with backoff on transient errors (timeouts, dropped connections).

        Object stores throttle and time out now and then; one such error must not fail a read or
        stop a watcher. Errors that retrying cannot fix (missing file, no permission) pass at once.
        """
        delay = self.backoff_s
        for attempt in range(1, self.attempts + 1):
            try:
                return fn(*args, **kwargs)
            except _PERMANENT_ERRORS:
                raise
            except (OSError, TimeoutError):
                if attempt == self.attempts:
                    raise
                time.sleep(delay)
                delay *= 2
        raise AssertionError("unreachable")  # pragma: no cover

    def _call(self, what: str, path: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return self._retrying(fn, *args, **kwargs)
        except FileNotFoundError:
            raise
        except (OSError, TimeoutError) as exc:
            raise StorageError(
                f"storage error during {what} (after {self.attempts} attempts): {exc}",
                table=self.uri,
                file=path,
            ) from exc

    def exists(self, path: str) -> bool:
        return bool(self._call("exists", path, self.fs.exists, path))

    def read_bytes(self, path: str, start: int | None = None, end: int | None = None) -> bytes:
        """Read a whole file, or the byte range [start, end). Raises FileNotFoundError."""
        if start is None and end is None:
            if self.uri.startswith("file://"):  # fsspec's cat_file costs several times a local read
                return self._call("read", path, _read_local, path)
            return self._call("read", path, self.fs.cat_file, path)
        return self._call("read", path, self.fs.cat_file, path, start=start, end=end)

    def open(self, path: str, mode: str = "rb") -> IO[bytes]:
        return self._call("open", path, self.fs.open, path, mode)

    def info(self, path: str) -> FileInfo:
        d = self._call("stat", path, self.fs.info, path)
        return FileInfo(path.rsplit("/", 1)[-1], int(d.get("size") or 0), _epoch_ms(d))

    def read_parquet(self, path: str, columns: list[str] | None = None) -> pa.Table:
        with self.open(path) as fh:
            return pq.read_table(fh, columns=columns)

    def parquet_file(self, path: str) -> pq.ParquetFile:
        """A ParquetFile over an fsspec handle; for local paths pyarrow's own (faster) file."""
        if self.uri.startswith("file://"):
            return pq.ParquetFile(path, pre_buffer=True)
        return pq.ParquetFile(self.open(path))

    # --- listing ------------------------------------------------------------------------------

    def _find_takes_prefix(self) -> bool:
        try:
            return "prefix" in inspect.signature(self.fs.find).parameters
        except (TypeError, ValueError):
            return False

    def list_dir(self, folder: str, prefix: str = "") -> list[FileInfo]:
        """Files (not folders) directly in ``folder`` whose names start with ``prefix``.

        Object stores filter by prefix on the server; elsewhere the folder is listed and filtered.
        Hadoop checksum files (``.*.crc``) are never returned.
        """
        if self.uri.startswith("file://"):
            return self._list_local_dir(folder, prefix)
        try:
            if prefix and self._find_takes_prefix():
                entries = self._retrying(
                    self.fs.find, folder, maxdepth=1, detail=True, prefix=prefix
                ).values()
            else:
                entries = self._retrying(self.fs.ls, folder, detail=True)
        except FileNotFoundError:
            return []
        except (OSError, TimeoutError) as exc:
            raise StorageError(
                f"cannot list (after {self.attempts} attempts): {exc}", table=self.uri, file=folder
            ) from exc
        out = []
        for e in entries:
            if e.get("type") == "directory":
                continue
            name = str(e["name"]).rstrip("/").rsplit("/", 1)[-1]
            if not name.startswith(prefix) or (name.startswith(".") and name.endswith(".crc")):
                continue
            out.append(FileInfo(name, int(e.get("size") or 0), _epoch_ms(e)))
        out.sort(key=lambda f: f.name)
        return out

    def _list_local_dir(self, folder: str, prefix: str) -> list[FileInfo]:
        """``list_dir`` on a local disk: one ``scandir`` (fsspec's ``ls`` costs ten times more per file,
        which every snapshot and change feed pays over its whole log segment)."""
        out = []
        try:
            with os.scandir(folder) as entries:
                for e in entries:
                    name = e.name
                    if not name.startswith(prefix) or (name.startswith(".") and name.endswith(".crc")):
                        continue
                    try:
                        if e.is_dir():
                            continue
                        st = e.stat()
                    except FileNotFoundError:  # removed while listed (a cleanup): not there
                        continue
                    out.append(FileInfo(name, st.st_size, int(st.st_mtime * 1000)))
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError as exc:
            raise StorageError(f"cannot list: {exc}", table=self.uri, file=folder) from exc
        out.sort(key=lambda f: f.name)
        return out

    @property
    def lists_whole_folder(self) -> bool:
        """True when any listing of the log reads the whole folder (no server-side prefix filter)."""
        return self.uri.startswith("file://") or not self._find_takes_prefix()

    def iter_log_from(self, start_version: int, block_digits: int = 3) -> Iterator[FileInfo]:
        """Log files of versions >= ``start_version``, in name order.

        Lists one block of 10**block_digits versions at a time by prefix, so the cost grows with
        the number of versions after ``start_version``, not with the length of the log.
        """
        if not self._find_takes_prefix():
            # no server-side filtering: one listing of the folder is the cheapest there is
            yield from (f for f in self.list_log() if _version_of(f.name) >= start_version)
            return
        block = 10**block_digits
        first_block = start_version // block
        listed_any_after = True
        b = first_block
        while listed_any_after:
            prefix = f"{b * block:020d}"[: 20 - block_digits]
            files = [f for f in self.list_dir(self.log_path, prefix) if _version_of(f.name) >= start_version]
            yield from files
            # a block with files up to its last version may continue into the next block
            listed_any_after = any(_version_of(f.name) == (b + 1) * block - 1 for f in files)
            b += 1

    def list_log(self) -> list[FileInfo]:
        """Everything in ``_delta_log`` (no subfolders)."""
        return self.list_dir(self.log_path)


def _read_local(path: str) -> bytes:
    with open(path, "rb") as fh:
        return fh.read()


def _version_of(name: str) -> int:
    head = name.split(".", 1)[0]
    return int(head) if head.isdigit() else -1
