"""Memory the process has freed, given back to the system: one place for the allocators' knobs.

pyarrow's pools keep freed pages for reuse. Readers that decode much more than they keep (a
checkpoint read row group by row group, the change feed's prefetch threads, the snapshot
consumer's batches) call :func:`release_unused_arrow` at their own pace.

Reading a large topic, the consumer frees far more than it keeps: each batch of records (the
values, their bodies, the text pyarrow parses) and each save (a checkpoint written a row group at
a time) is let go once used. Two allocators kept that memory in the process, measured on the
1M-file bench topic: pyarrow's default pool (mimalloc) kept about 70 MB after the snapshot's apply and after a save, and glibc's heap
about 60 MB of the records' ``bytes`` (freed between longer-lived objects: the heap's top does
not move, so it is not trimmed by itself).

- :func:`use_returning_pool`: pyarrow's jemalloc pool with a decay of 0 (freed pages are
  returned at once) as the process's default pool, when pyarrow was built with it and the user
  did not choose a pool (``ARROW_DEFAULT_MEMORY_POOL``). Buffers allocated before keep the pool
  they came from (each buffer frees through its own pool).
- :func:`give_back`: asks glibc to return its free pages (``malloc_trim(0)``, Linux with glibc
  only) and the default pool to release what it does not use; the loop calls it after each batch.

Nothing here changes what the consumer computes; it changes when freed memory leaves the process.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

import pyarrow as pa

#: the environment variable with which a user picks pyarrow's pool (then it is left alone)
POOL_ENV = "ARROW_DEFAULT_MEMORY_POOL"

_trim: Callable[[int], int] | None = None
_trim_looked_up = False


def use_returning_pool() -> str:
    """Make jemalloc (decay 0) pyarrow's default pool, unless ``ARROW_DEFAULT_MEMORY_POOL`` is set
    or pyarrow has no jemalloc; the name of the default pool after."""
    if not os.environ.get(POOL_ENV):
        try:
            pool = pa.jemalloc_memory_pool()
        except NotImplementedError:  # a pyarrow built without jemalloc
            pool = None
        if pool is not None:
            pa.jemalloc_set_decay_ms(0)
            pa.set_memory_pool(pool)
    return str(pa.default_memory_pool().backend_name)


def _malloc_trim() -> Callable[[int], int] | None:
    global _trim, _trim_looked_up
    if not _trim_looked_up:
        _trim_looked_up = True
        if sys.platform.startswith("linux"):
            import ctypes  # here: a restart with nothing to read does not import it

            try:
                libc = ctypes.CDLL("libc.so.6")
                _trim = libc.malloc_trim  # absent from musl
            except (OSError, AttributeError):
                _trim = None
    return _trim


def release_unused_arrow() -> None:
    """Hand the pages pyarrow's default pool holds free back to the system (mimalloc keeps them
    per thread; jemalloc with decay 0 has none to hand)."""
    pa.default_memory_pool().release_unused()


def give_back() -> None:
    """Return the free memory of glibc's heap and of pyarrow's default pool to the system."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
    release_unused_arrow()


__all__ = ["POOL_ENV", "give_back", "release_unused_arrow", "use_returning_pool"]
