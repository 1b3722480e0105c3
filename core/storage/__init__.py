"""Table storage over fsspec: one picklable object per table that knows its root and credentials.

It is picklable (Spark executors, worker processes) because it carries the URL and storage options
and builds the fsspec filesystem lazily on each side. Listing is done by prefix where the store
can filter server-side (s3, gcs, abfs), so finding the versions after N does not read the whole log.

It is also the one place where table files are opened (the architecture test forbids opens
anywhere else in core), so it is where a path from the log is held to the table root: the log is
untrusted, and a mirror that followed ``../``, ``file:///etc`` or another bucket would read, and
publish, files that are not the table's. ``resolve`` checks a path by its components before
anything is read; on a local disk every open also checks the file's real path, so a symbolic link
inside the root cannot lead out of it.

The package is that choke point: this module (paths, retries, reads, listing), :mod:`.local` (the
real-path-checked opens of a local disk) and :mod:`.uri` (how a table location is spelled).
"""

from __future__ import annotations

import inspect
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import IO, TYPE_CHECKING, Any, cast

import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import InvalidArgumentError, InvalidTableUriError, StorageAccessError, StorageError
from ..paths import SIDECAR_DIR, PathRules
from .local import LocalFiles, NotARegularFileError
from .refusal import storage_refusal
from .uri import normalize_location, normalize_table_uri, without_password

if TYPE_CHECKING:  # fsspec loads with the first filesystem opened (a local table never needs it)
    import fsspec

__all__ = [
    "LOG_DIR",
    "STORAGE_ATTEMPTS",
    "STORAGE_BACKOFF_S",
    "FileInfo",
    "NotARegularFileError",
    "TableStorage",
    "local_options_problem",
    "normalize_location",
    "normalize_table_uri",
    "storage_refusal",
    "without_password",
]

LOG_DIR = "_delta_log"


def local_options_problem(uri: str, options: Iterable[str]) -> str | None:
    """Why storage options cannot go with a location, or None: a local table (``file://``, a path)
    is read with the operating system's files, which take no options, so any given would be
    silently ignored. ``uri`` is normalized (``normalize_table_uri``); only the keys are named."""
    keys = sorted(options)
    if not keys or not uri.startswith("file://"):
        return None
    return (
        f"storage options (-S, storage_options) have no effect on a local table "
        f"({', '.join(keys)}): they are for object "
        "stores (s3://, gs://, abfss://...); remove them"
    )


#: URL scheme -> the extra of pyproject.toml that installs its fsspec implementation
_EXTRAS = {
    "s3": "s3",
    "s3a": "s3",
    "gs": "gcs",
    "gcs": "gcs",
    "abfs": "azure",
    "abfss": "azure",
    "az": "azure",
}

#: a failed storage call is tried this many times in all before its error is raised
STORAGE_ATTEMPTS = 4
#: seconds before the second attempt; doubled before each further one (0.2, 0.4, 0.8)
STORAGE_BACKOFF_S = 0.2
#: errors that say the request, not the storage, was wrong: retrying cannot help
_PERMANENT_ERRORS = (
    FileNotFoundError,
    NotARegularFileError,
    PermissionError,
    IsADirectoryError,
    NotADirectoryError,
    FileExistsError,
)
#: object-store client libraries whose errors are not OSError (a refused connection, a DNS failure)
_CLIENT_LIBRARIES = frozenset({"botocore", "aiobotocore", "aiohttp", "google", "azure"})
#: file sizes remembered (table files are immutable)
_SIZES_KEPT = 1024


@dataclass(frozen=True, slots=True)
class FileInfo:
    """A listed file: its name inside the listed folder, size and modification time (epoch ms)."""

    name: str
    size: int
    modification_time: int


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
    """The files of one table: its log folder, data files and deletion vectors.

    ``allowed_path_prefixes`` are locations outside the table root whose files the log may name
    (a shallow clone's source table): URIs on the table's own store (``s3://other-bucket/src``,
    ``file:///data/src``) or local paths. Nothing else outside the root is ever read.
    """

    def __init__(
        self,
        uri: str,
        storage_options: dict[str, Any] | None = None,
        *,
        attempts: int = STORAGE_ATTEMPTS,
        backoff_s: float = STORAGE_BACKOFF_S,
        allowed_path_prefixes: Iterable[str] = (),
    ) -> None:
        #: the location as given, credentials included: only the filesystem is opened with it
        self._access_uri = normalize_location(uri)
        #: the table's identity (progress records, Kafka keys, messages): never holds a password
        self.uri = without_password(self._access_uri)
        self.storage_options = dict(storage_options or {})
        problem = local_options_problem(self.uri, self.storage_options)
        if problem is not None:
            raise InvalidArgumentError(problem, table=self.uri, argument="storage_options")
        self.attempts = max(1, attempts)
        self.backoff_s = backoff_s
        self.allowed_path_prefixes = tuple(allowed_path_prefixes)
        self._setup()

    def _setup(self) -> None:
        self._fs: fsspec.AbstractFileSystem | None = None
        self._root: str | None = None
        self.is_local = self.uri.startswith("file://")
        self._rules = PathRules(self.uri, self.allowed_path_prefixes)
        self._local = LocalFiles(lambda: [self.root, *(a.path for a in self._rules.allowed)], self.uri)
        self._sizes: dict[str, int] = {}

    # pickling: credentials travel, the filesystem object (sockets, caches) is rebuilt on arrival
    def __getstate__(self) -> dict[str, Any]:
        return {
            "uri": self._access_uri,
            "storage_options": self.storage_options,
            "attempts": self.attempts,
            "backoff_s": self.backoff_s,
            "allowed_path_prefixes": self.allowed_path_prefixes,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._access_uri = state["uri"]
        self.uri = without_password(self._access_uri)
        self.storage_options = state["storage_options"]
        self.attempts = state.get("attempts", STORAGE_ATTEMPTS)
        self.backoff_s = state.get("backoff_s", STORAGE_BACKOFF_S)
        self.allowed_path_prefixes = tuple(state.get("allowed_path_prefixes", ()))
        self._setup()

    def __repr__(self) -> str:
        return f"TableStorage({self.uri!r})"

    @property
    def fs(self) -> fsspec.AbstractFileSystem:
        if self._fs is None:
            options = dict(self.storage_options)
            if self.uri.split(":", 1)[0] in _EXTRAS:
                # a log and a prefix change under us: a cached listing would hide new commits and tables
                options.setdefault("use_listings_cache", False)
            try:
                import fsspec.core  # loaded with the first filesystem: local reads never need it

                fs, root = fsspec.core.url_to_fs(self._access_uri, **options)
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
        if self._root is None and self.is_local and os.name == "posix":
            # the normalized location is file:// + an absolute path: no filesystem object needed
            self._root = self.uri.removeprefix("file://").rstrip("/") or "/"
        if self._root is not None:
            return self._root
        _ = self.fs
        assert self._root is not None
        return self._root

    @property
    def log_path(self) -> str:
        return f"{self.root}/{LOG_DIR}"

    def log_file(self, name: str) -> str:
        return f"{self.log_path}/{name}"

    # --- paths in the log ---------------------------------------------------------------------

    def resolve(self, path_in_log: str, *, kind: str = "data file", literal: bool = False) -> str:
        """Where a file the log names lives, in the filesystem's own syntax, if it is the table's.

        Relative paths are URL-encoded and relative to the table root (a ``sidecar``'s to
        ``_delta_log/_sidecars``); ``literal`` ones are relative and not encoded (a ``u`` deletion
        vector's prefix and file name); absolute ones are URIs or ``/x`` on the table's own store.
        Whatever leads outside the root and the allowed prefixes raises PathOutsideTableError before
        a byte is read (rules: :class:`~deltamirror.core.paths.PathRules`); ``kind`` names the file.
        """
        if isinstance(path_in_log, str) and PathRules.is_plain(path_in_log, literal):
            # the usual path: nothing to decode, nothing to climb, nothing to compare
            return (
                f"{self.root}/{path_in_log}"
                if kind != "sidecar"
                else f"{self.root}/{SIDECAR_DIR}/{path_in_log}"
            )
        place = self._rules.place(path_in_log, kind, literal)
        if self.is_local:
            return place.path
        return str(self.fs._strip_protocol(f"{self._rules.scheme}://{place.netloc}{place.path}"))

    def check_paths(self, paths: pa.Array | pa.ChunkedArray, *, kind: str = "data file") -> None:
        """``resolve`` over a whole column, before any file is opened: a read of many files is
        refused at once, not after printing the rows of the files before the bad one."""
        self._rules.check_column(paths, kind)

    # --- reading ------------------------------------------------------------------------------

    def _retrying(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Call ``fn``, trying again with backoff on transient errors (timeouts, dropped connections).

        Object stores throttle and time out now and then; one such error must not fail a read or
        stop a watcher. Errors that retrying cannot fix (missing file, no permission) pass at once.
        """
        delay = self.backoff_s
        for attempt in range(1, self.attempts + 1):
            try:
                try:
                    return fn(*args, **kwargs)
                except Exception as exc:
                    if type(exc).__module__.split(".", 1)[0] not in _CLIENT_LIBRARIES:
                        raise
                    # not an OSError (botocore's EndpointConnectionError...): a storage error all the same
                    raise ConnectionError(f"{type(exc).__name__}: {exc}") from exc
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
        except _PERMANENT_ERRORS as exc:  # not retried, and not retryable: the request is wrong
            raise StorageAccessError(
                f"storage refused {what}: {exc.strerror or type(exc).__name__}", table=self.uri, file=path
            ) from exc
        except (OSError, TimeoutError) as exc:
            raise StorageError(
                f"storage error during {what} (after {self.attempts} attempts): {exc}",
                table=self.uri,
                file=path,
            ) from exc

    def exists(self, path: str) -> bool:
        if self.is_local:
            return bool(self._call("exists", path, os.path.exists, path))
        return bool(self._call("exists", path, self.fs.exists, path))

    # Every open of a table file is one of the methods below; ``path`` is a log file's
    # (``log_file``) or a path ``resolve`` returned. On a local disk each open checks the real path.

    def read_bytes(self, path: str, start: int | None = None, end: int | None = None) -> bytes:
        """Read a whole file, or the byte range [start, end) clipped to the file's end (so a size
        taken from the log never allocates more than the file holds). Raises FileNotFoundError."""
        if (start is not None and start < 0) or (end is not None and end < 0):
            raise ValueError(f"byte range [{start}, {end}) is negative")
        if self.is_local:  # fsspec's cat_file costs several times a local read
            return cast(bytes, self._call("read", path, self._local.read_bytes, path, start, end))
        if start is None and end is None:
            return cast(bytes, self._call("read", path, self.fs.cat_file, path))
        size = self._size(path)
        lo = start or 0
        hi = size if end is None else min(end, size)
        if hi <= lo:
            return b""
        return cast(bytes, self._call("read", path, self.fs.cat_file, path, start=lo, end=hi))

    def open(self, path: str, mode: str = "rb") -> IO[bytes]:
        """A file opened for streaming (a commit of millions of actions)."""
        if mode != "rb":
            raise ValueError("table files are only opened for reading")
        if self.is_local:
            return cast(IO[bytes], self._call("open", path, self._local.open, path))
        return cast(IO[bytes], self._call("open", path, self.fs.open, path, mode))

    def info(self, path: str) -> FileInfo:
        """A file's size and time; FileNotFoundError when it is missing (one request on S3)."""
        if self.is_local:  # no filesystem object for a local file (and its time in whole ns)
            st = self._call("stat", path, os.stat, path)
            return FileInfo(path.rsplit("/", 1)[-1], st.st_size, st.st_mtime_ns // 1_000_000)
        fs = self.fs
        if hasattr(fs, "call_s3"):  # s3fs
            d = self._call("stat", path, _s3_head, fs, path)
        else:
            d = self._call("stat", path, fs.info, path)
        return FileInfo(path.rsplit("/", 1)[-1], int(d.get("size") or 0), _epoch_ms(d))

    def parquet_file(self, path: str, **options: Any) -> pq.ParquetFile:
        """A ParquetFile that owns its handle (``close`` closes the file); ``options`` go to
        ``pq.ParquetFile`` (``pre_buffer``, ``coerce_int96_timestamp_unit``...).

        Errors are pyarrow's and the filesystem's (FileNotFoundError, ArrowInvalid, OSError): what
        they mean (a missing data file, a corrupt checkpoint) is for the caller to say.
        """
        if self.is_local:
            return self._local.parquet_file(path, **options)
        return pq.ParquetFile(path, filesystem=self.fs, **options)

    def _size(self, path: str) -> int:
        """A file's size, remembered (table files are immutable, and one DV file serves many)."""
        size = self._sizes.get(path)
        if size is None:
            size = self.info(path).size
            if len(self._sizes) >= _SIZES_KEPT:
                self._sizes.clear()
            self._sizes[path] = size
        return size

    # --- listing ------------------------------------------------------------------------------

    def _find_takes_prefix(self) -> bool:
        if self.is_local:  # a local folder is listed whole
            return False
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
                    # whole ns to ms, as info() does (a float of seconds times 1000 came out 1 ms
                    # short for about one stamp in three: the two told one version two times)
                    out.append(FileInfo(name, st.st_size, st.st_mtime_ns // 1_000_000))
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


def _s3_head(fs: Any, path: str) -> dict[str, Any]:
    """s3fs's ``info`` of a missing key is a HEAD and then a LIST (is it a folder?): twice the
    requests, one of them the dearest kind, on every idle poll. A table file is never a folder."""
    bucket, key, _ = fs.split_path(path)
    out = fs.call_s3("head_object", getattr(fs, "kwargs", {}), Bucket=bucket, Key=key)
    return {"size": out.get("ContentLength"), "LastModified": out.get("LastModified")}


def _version_of(name: str) -> int:
    head = name.split(".", 1)[0]
    return int(head) if head.isdigit() else -1
