"""Reading commit files before they are needed: the project's one read-ahead of ``_delta_log``.

Catching up a long log costs a read per version: on an object store a request of tens of
milliseconds, on a local disk a copy of the file. Reads release the GIL, so they can run on helper
threads while the caller's thread decodes, validates or publishes the commit before. Two callers
need this in two shapes:

* the producer hands out one commit at a time and knows only the next few versions (from a
  probe): :meth:`CommitReadAhead.want` starts reading them, :meth:`CommitReadAhead.take` hands one
  over if it still matches its listing. A read ahead is only a hint: one that failed, or a file
  that changed since it was listed, yields None and the caller reads (and reports) it itself.
* the change feed reads a known range of versions in order: :meth:`CommitReadAhead.ordered`
  yields ``(version, bytes)`` in order with a bounded number of reads in flight, and reports a
  missing commit itself (it is the range's answer, not a hint).
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

from deltamirror.core.errors import VersionNotFoundError
from deltamirror.core.log import commit_name
from deltamirror.core.storage import FileInfo, TableStorage

#: commits read ahead by :meth:`CommitReadAhead.want` beyond the one being handled
WANT_DEPTH = 2
#: commit files larger than this are not read ahead by :meth:`CommitReadAhead.want` (the caller
#: streams them instead of holding them whole)
WANT_MAX_BYTES = 16 * 1024 * 1024
#: reads in flight (or done, waiting their turn) in :meth:`CommitReadAhead.ordered`: bounds memory
ORDERED_AHEAD = 64


class CommitReadAhead:
    """Reads a table's commit files on ``threads`` helper threads (started on first use).

    ``depth`` and ``max_bytes`` bound what :meth:`want` reads: memory stays at ``depth`` small
    commits whatever the log's length. (Scanning ahead too was measured slower in the producer:
    the validation holds the GIL, so it only competes with the publishing.)
    """

    def __init__(
        self,
        storage: TableStorage,
        threads: int = 1,
        *,
        depth: int = WANT_DEPTH,
        max_bytes: int = WANT_MAX_BYTES,
    ) -> None:
        if threads < 1:
            raise ValueError(f"threads must be at least 1, not {threads}")
        self.storage = storage
        self.threads = threads
        self.depth = depth
        self.max_bytes = max_bytes
        self._pool: ThreadPoolExecutor | None = None
        self._reads: dict[int, tuple[FileInfo, Future[bytes]]] = {}

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="deltamirror-readahead")
        return self._pool

    # --- one at a time, as hints --------------------------------------------------------------

    def want(self, ahead: Iterable[tuple[int, FileInfo]]) -> None:
        """Start reading these versions (the next ones to handle, in order): the first ``depth``
        of them that are not read already and not larger than ``max_bytes``."""
        for version, info in itertools.islice(ahead, self.depth):
            if version in self._reads or info.size > self.max_bytes:
                continue
            path = self.storage.log_file(commit_name(version))
            self._reads[version] = (info, self._executor().submit(self.storage.read_bytes, path))

    def take(self, version: int, info: FileInfo) -> bytes | None:
        """The bytes of ``version`` if they were read ahead and still match its listing, else None."""
        entry = self._reads.pop(version, None)
        if entry is None:
            return None
        known, future = entry
        if known != info:
            future.cancel()
            return None
        try:
            data = future.result()
        except Exception:  # the caller reads it again and reports what it meets
            return None
        return data if len(data) == info.size else None

    def clear(self) -> None:
        """Forget every read ahead (the caller starts over elsewhere in the log)."""
        for _, future in self._reads.values():
            future.cancel()
        self._reads.clear()

    def close(self) -> None:
        """Stop the helper threads; the object can be used again (they start again on demand)."""
        self.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    # --- a range, in order --------------------------------------------------------------------

    def ordered(
        self,
        versions: Iterable[int],
        *,
        ahead: int = ORDERED_AHEAD,
        missing: type[VersionNotFoundError] = VersionNotFoundError,
    ) -> Iterator[tuple[int, bytes]]:
        """``(version, commit bytes)`` for each of ``versions``, in their order.

        Up to ``ahead`` reads are in flight on ``threads`` threads (a sliding window, so a slow
        read holds up no more than its own turn). A commit that does not exist raises ``missing``
        (``"commit <v> does not exist"``, with table, version and file), when its turn comes.
        With one thread, or on a local disk (which answers faster than a thread hand-off costs,
        and here the caller waits for every read), commits are read in turn on the caller's
        thread. Stopping the iteration early cancels the reads not started yet.
        """
        if self.threads <= 1 or self.storage.is_local:
            for v in versions:
                yield v, self._read(v, missing)
            return
        pool = ThreadPoolExecutor(self.threads, thread_name_prefix="deltamirror-readahead")
        window: deque[tuple[int, Future[bytes]]] = deque()
        todo = iter(versions)
        try:
            for v in itertools.islice(todo, max(1, ahead)):
                window.append((v, pool.submit(self._read, v, missing)))
            while window:
                v, future = window.popleft()
                for nxt in itertools.islice(todo, 1):
                    window.append((nxt, pool.submit(self._read, nxt, missing)))
                yield v, future.result()
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

    def _read(self, version: int, missing: type[VersionNotFoundError]) -> bytes:
        path = self.storage.log_file(commit_name(version))
        try:
            return self.storage.read_bytes(path)
        except FileNotFoundError:
            raise missing(
                f"commit {version} does not exist", table=self.storage.uri, version=version, file=path
            ) from None


__all__ = ["ORDERED_AHEAD", "WANT_DEPTH", "WANT_MAX_BYTES", "CommitReadAhead"]
