"""Reading small data files ahead on worker threads while the caller consumes the current one.

Decoding parquet releases the GIL, so reading the next small files of a change feed while the
caller consumes the current one uses the other cores; memory stays bounded by reading at most a
few groups of files ahead. The caller's thread is one of the readers: rather than wait for a
group, it reads the next one no worker has started, so one core needs no worker of its own.

A worker pays only when it runs beside the caller. On a machine whose cores are all busy (or a
container whose CPU quota is), a worker gets a fraction of a core, is often preempted while it
holds the GIL and stalls the caller: there the files are read on the caller's thread alone, and
a worker is tried again every few groups.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from ..memory import release_unused_arrow

#: small data files are read ahead on threads (decoding releases the GIL), in groups of at most
#: this many files and bytes, on one worker thread per usable core but one (at least one, at most
#: seven): the caller's thread reads groups too while it waits, so every core decodes and none
#: waits. At most one group per reader is ahead of the one handed out next, which bounds memory.
#: Measured on 2 cores (bench/bench_changes.py's table, peak RSS of interleaved runs): 4-file
#: groups spent a fifth of the time switching threads for the GIL; 16-file groups (and fewer
#: releases, below) took the same CPU as 32-file ones on two workers for ~9 MB less peak; the
#: caller reading instead of a second worker, ~3 MB less again (a thread heap fewer).
PREFETCH_GROUP_FILES = 16
PREFETCH_FIRST_GROUP_FILES = 8
PREFETCH_MAX_BYTES = 16 * 1024 * 1024
_USABLE_CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 2
PREFETCH_THREADS = max(1, min(7, _USABLE_CORES - 1))
PREFETCH_GROUPS = PREFETCH_THREADS + 1
#: a worker that got less CPU than this share of the time it took to read a group (the rest it
#: waited for a core, or for the GIL held by a preempted thread) does not pay: the next groups
#: are read on the caller's thread, then a worker is tried again. Load 5-6 on 2 cores (bench
#: table, 7 interleaved runs): the caller's thread alone took 13% less time and 14% less CPU
#: than with a worker; at load ~3 both took the same time; without load a worker gets ~95%.
MIN_WORKER_CPU_SHARE = 0.4
INLINE_GROUPS = 8


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
    Waiting for a group, the caller reads the first one no worker has started (:class:`_Group`).
    """
    window: deque[_Group] = deque()
    group: list[FileRead] = []
    group_bytes = 0
    # the first groups are small, so the caller gets rows while later groups are decoded
    group_files = PREFETCH_FIRST_GROUP_FILES
    readers = _Readers()
    try:
        for item in reads:
            if item.size is None or item.size > PREFETCH_MAX_BYTES:
                if group:
                    window.append(readers.group(group))
                    group, group_bytes = [], 0
                while window:
                    yield from _handed(readers.next_done(window))
                yield item.version, item.read()
                continue
            if group and group_bytes + item.size > PREFETCH_MAX_BYTES:
                window.append(readers.group(group))
                group, group_bytes = [], 0
            group.append(item)
            group_bytes += item.size
            if len(group) >= group_files:
                window.append(readers.group(group))
                group, group_bytes = [], 0
                group_files = min(group_files * 2, PREFETCH_GROUP_FILES)
            while len(window) > PREFETCH_GROUPS:
                yield from _handed(readers.next_done(window))
        if group:
            window.append(readers.group(group))
        while window:
            yield from _handed(readers.next_done(window))
    finally:
        readers.shutdown()


_Drained = tuple[list[tuple[int, list[pa.RecordBatch]]], Exception | None]
#: a group read by a worker: its reads, and the worker's CPU and wall seconds reading it
_Timed = tuple[_Drained, float, float]


class _Group:
    """A group of reads, handed to the workers or not; the caller reads it if none started it."""

    def __init__(self, reads: list[FileRead], future: Future[_Timed] | None) -> None:
        self._reads = reads
        self._future = future
        self._done: _Drained | None = None
        #: the CPU share the worker that read the group got while reading it
        self.worker_cpu_share: float | None = None

    @property
    def ready(self) -> bool:
        return self._done is not None or (self._future is not None and self._future.done())

    def read_here(self) -> bool:
        """Read the group on this thread if no worker has started it (True if so)."""
        if self._done is None and (self._future is None or self._future.cancel()):
            self._done = _drain(self._reads)
            return True
        return False

    def result(self) -> _Drained:
        if self._done is None:
            if self._future is None:
                self._done = _drain(self._reads)
            else:
                self._done, cpu_s, wall_s = self._future.result()
                self.worker_cpu_share = cpu_s / wall_s if wall_s > 0 else None
        return self._done


class _Readers:
    """The worker threads, used while they get the CPU to run beside the caller.

    A worker that read a group with too small a share of CPU sends the next INLINE_GROUPS groups
    to the caller's thread; then one group goes to a worker again (the others wait for its verdict
    on the caller's thread), and its share decides whether the workers are back.
    """

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=PREFETCH_THREADS, thread_name_prefix="deltamirror-cdf")
        self._inline_left = 0  # groups to read on the caller's thread before a worker is tried again
        self._probe: _Group | None = None  # the group trying a worker again, until handed out

    def group(self, reads: list[FileRead]) -> _Group:
        if self._probe is not None:
            return _Group(reads, None)
        if self._inline_left:
            self._inline_left -= 1
            if self._inline_left:
                return _Group(reads, None)
            self._probe = _Group(reads, self._pool.submit(_timed_drain, reads))
            return self._probe
        return _Group(reads, self._pool.submit(_timed_drain, reads))

    def next_done(self, window: deque[_Group]) -> _Drained:
        """The oldest group's reads; while they are not done, the caller reads the first group of
        the window no worker has started (its rows wait for their turn), instead of waiting idle."""
        oldest = window.popleft()
        if not oldest.ready and not oldest.read_here():
            for later in window:
                if later is not self._probe and (later.read_here() or oldest.ready):
                    break
        done = oldest.result()
        share = oldest.worker_cpu_share
        if oldest is self._probe:
            self._probe = None
            if share is None or share < MIN_WORKER_CPU_SHARE:  # read here: no worker got to it
                self._inline_left = INLINE_GROUPS
        elif share is not None and share < MIN_WORKER_CPU_SHARE and self._probe is None:
            self._inline_left = INLINE_GROUPS
        return done

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


def _timed_drain(group: list[FileRead]) -> _Timed:
    wall, cpu = time.perf_counter(), time.thread_time()
    drained = _drain(group)
    return drained, time.thread_time() - cpu, time.perf_counter() - wall


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


#: a reading thread hands its freed memory back to the OS after this many groups (~256 files):
#: every 4 groups cost a third more page faults (~5% more CPU) for no lower peak (measured on the
#: bench table with 16-file groups)
RELEASE_EVERY_GROUPS = 16
_groups_drained = threading.local()


def _release_unused_memory() -> None:
    """pyarrow's default allocator (mimalloc) keeps a heap per thread and holds on to its freed
    pages, so each prefetch thread would keep the memory of its largest groups; releasing it now
    and then keeps the threads' memory small (every group would cost page faults instead)."""
    drained = getattr(_groups_drained, "count", 0) + 1
    _groups_drained.count = drained
    if drained % RELEASE_EVERY_GROUPS == 0:
        release_unused_arrow()


def _handed(drained: _Drained) -> Iterator[tuple[int, list[pa.RecordBatch]]]:
    done, error = drained
    yield from done
    if error is not None:
        raise error


def prefetchable(action: Mapping[str, Any]) -> bool:
    """Small enough to be read ahead whole on a worker thread (which then decodes it alone)."""
    size = action.get("size")
    return size is not None and size <= PREFETCH_MAX_BYTES
