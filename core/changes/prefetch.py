"""Reading small data files ahead on worker threads while the caller consumes the current one.

Decoding parquet releases the GIL, so reading the next small files of a change feed while the
caller consumes the current one uses the other cores; memory stays bounded by reading at most a
few groups of files ahead.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

#: small data files are read ahead on threads (decoding releases the GIL), in groups of at most
#: this many files and bytes, at most this many groups ahead, on one thread per core (at least
#: two, at most eight). Measured on 2 cores: 4 threads of 4-file groups spent a fifth of the
#: time switching threads for the GIL; 2 threads of 32-file groups read the bench table 25% faster
#: for the same peak memory (bench/bench_changes.py).
PREFETCH_GROUP_FILES = 32
PREFETCH_FIRST_GROUP_FILES = 8
PREFETCH_MAX_BYTES = 16 * 1024 * 1024
PREFETCH_GROUPS = 2
PREFETCH_THREADS = max(2, min(8, os.cpu_count() or 2))


@dataclass(frozen=True)
class FileRead:
    """One data file's contribution to a version: its size (bytes, if the log says) and the read."""

    version: int
    size: int | None
    read: Callable[[], Iterator[pa.RecordBatch]]


def prefetched(reads: Iterator[FileRead]) -> Iterator[tuple[int, Iterable[pa.RecordBatch]]]:
    """(version, batches) per read, in order; small files are read ahead on worker threads.

    Decoding parquet releases the GIL, so reading the next small files while the caller consumes
    the current one uses the other cores. Small files go to the workers in groups (a hand-off per
    file costs about what reading a small file does) of at most PREFETCH_GROUP_FILES files and
    PREFETCH_MAX_BYTES, at most PREFETCH_GROUPS groups ahead, so memory stays bounded; a larger
    file, or one of unknown size, is streamed in place once the reads before it are handed out.
    """
    window: deque[Future[_Drained]] = deque()
    group: list[FileRead] = []
    group_bytes = 0
    # the first groups are small, so the caller gets rows while later groups are decoded
    group_files = PREFETCH_FIRST_GROUP_FILES
    pool = ThreadPoolExecutor(max_workers=PREFETCH_THREADS, thread_name_prefix="deltamirror-cdf")
    try:
        for item in reads:
            if item.size is None or item.size > PREFETCH_MAX_BYTES:
                if group:
                    window.append(pool.submit(_drain, group))
                    group, group_bytes = [], 0
                while window:
                    yield from _handed(window.popleft().result())
                yield item.version, item.read()
                continue
            if group and group_bytes + item.size > PREFETCH_MAX_BYTES:
                window.append(pool.submit(_drain, group))
                group, group_bytes = [], 0
            group.append(item)
            group_bytes += item.size
            if len(group) >= group_files:
                window.append(pool.submit(_drain, group))
                group, group_bytes = [], 0
                group_files = min(group_files * 2, PREFETCH_GROUP_FILES)
            while len(window) > PREFETCH_GROUPS:
                yield from _handed(window.popleft().result())
        if group:
            window.append(pool.submit(_drain, group))
        while window:
            yield from _handed(window.popleft().result())
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


_Drained = tuple[list[tuple[int, list[pa.RecordBatch]]], Exception | None]


def _drain(group: list[FileRead]) -> _Drained:
    """The group's reads, up to the first that fails (whose error comes after the reads before it)."""
    done = []
    try:
        for item in group:
            try:
                done.append((item.version, list(item.read())))
            except Exception as exc:  # raised on the caller's thread by _handed, in order
                return done, exc
        return done, None
    finally:
        _release_unused_memory()


#: a prefetch thread hands its freed memory back to the OS after this many groups
RELEASE_EVERY_GROUPS = 4
_groups_drained = threading.local()


def _release_unused_memory() -> None:
    """pyarrow's default allocator (mimalloc) keeps a heap per thread and holds on to its freed
    pages, so each prefetch thread would keep the memory of its largest groups; releasing it now
    and then keeps the threads' memory small (every group would cost page faults instead)."""
    drained = getattr(_groups_drained, "count", 0) + 1
    _groups_drained.count = drained
    if drained % RELEASE_EVERY_GROUPS == 0:
        pa.default_memory_pool().release_unused()


def _handed(drained: _Drained) -> Iterator[tuple[int, list[pa.RecordBatch]]]:
    done, error = drained
    yield from done
    if error is not None:
        raise error


def prefetchable(action: Mapping[str, Any]) -> bool:
    """Small enough to be read ahead whole on a worker thread (which then decodes it alone)."""
    size = action.get("size")
    return size is not None and size <= PREFETCH_MAX_BYTES
