"""The serialized bitmap of a deletion vector: Delta's magic number, then a 64-bit Roaring bitmap.

The format is Roaring's "portable" serialization of 64-bit values: buckets keyed by the high 32
bits, each a 32-bit RoaringBitmap whose containers (array, bitmap or run) hold the low 16 bits
under a 16-bit key. The decoder works on whole containers with bytes slicing and pyarrow kernels,
never one Python object per row, so a bitmap of millions of rows costs milliseconds. It assumes a
little-endian host (as pyarrow buffers do). Nothing here reads a file: the caller hands bytes in.

Spec: delta-io/delta PROTOCOL.md, "Deletion Vector Format"; the 32-bit container layout is
RoaringFormatSpec.
"""

from __future__ import annotations

import functools
import itertools
from array import array
from typing import Any

import pyarrow as pa

from deltamirror.core.compute import pc

from .errors import DeletionVectorError

__all__ = ["MalformedBitmap", "WrongCardinality", "decode", "decode_bitmap_array"]


_MAGIC = 1681511377
# delta-spark's older "native" layout (PROTOCOL.md's inline example uses it, big-endian); no writer
# emits it by default and kernel-rs does not read it either, so it is named in the error only
_NATIVE_MAGICS = (1681511376, 0xD0D33964)
_COOKIE_NO_RUN = 12346
_COOKIE_RUN = 12347
_NO_OFFSET_THRESHOLD = 4  # run-container bitmaps with fewer containers have no offset header
_ARRAY_MAX = 4096
_BITMAP_BYTES = 8192
_FEW_RUNS = 16  # run containers with more runs are expanded together, with kernels
_MAX_KEY = 0x7FFFFFFF  # Delta requires the top bit of every 32-bit bucket key to be 0


@functools.cache
def _all_u16() -> bytes:
    """Every uint16 in order: the low halves of a run [a, b] are the slice [2a, 2b + 2) of this
    (made on first use: not at import, where most commands never decode a bitmap)."""
    return array("H", range(65536)).tobytes()


@functools.cache
def _all_u16_array() -> pa.Array:
    return pa.Array.from_buffers(pa.uint16(), 65536, [None, pa.py_buffer(_all_u16())])


class MalformedBitmap(Exception):
    """A bitmap that does not follow the format; the reader of a descriptor re-raises it as a
    DeletionVectorError naming the DV and its data file."""


class WrongCardinality(Exception):
    """The containers hold another number of rows than the descriptor's cardinality."""

    def __init__(self, found: int) -> None:
        super().__init__(found)
        self.found = found


def _u32(data: memoryview, pos: int, what: str) -> int:
    if pos + 4 > len(data):
        raise MalformedBitmap(f"truncated bitmap: no {what}")
    return int.from_bytes(data[pos : pos + 4], "little")


def _expand_few_runs(runs: memoryview) -> bytes:
    """Values of a run container as uint16 bytes: each run [a, a + n] is a slice of _all_u16()."""
    all_u16 = _all_u16()
    pairs = array("H")
    pairs.frombytes(runs)
    pieces, prev_last = [], -1
    for j in range(0, len(pairs), 2):
        first, last = pairs[j], pairs[j] + pairs[j + 1]
        if first <= prev_last or last > 0xFFFF:
            raise MalformedBitmap("a run overlaps another or leaves its container")
        pieces.append(all_u16[2 * first : 2 * last + 2])
        prev_last = last
    return b"".join(pieces)


class _Parts:
    """What the containers of one bitmap contribute, in ascending order of their values.

    Per container: its low 16-bit halves as uint16 bytes (``None`` until expanded, for run
    containers with many runs), its value count and the high bits all its values share.
    """

    __slots__ = ("counts", "highs", "lows", "many_runs")

    def __init__(self) -> None:
        self.lows: list[Any] = []
        self.counts: list[int] = []
        self.highs: list[int] = []
        self.many_runs: list[memoryview] = []  # run pairs of the containers whose lows are None

    def expand_many_runs(self) -> None:
        """Expand all many-run containers in one pass of kernels rather than a loop per run.

        Value i of the concatenated output is i plus a per-run constant (the run's first value
        minus the number of values before it), so a run-end-encoded array of those constants
        added to 0..n-1 yields every run. Overlapping runs surface in the global ascending check.
        """
        if not self.many_runs:
            return
        pairs = array("H")
        pairs.frombytes(b"".join(self.many_runs))
        n_runs = len(pairs) // 2
        firsts = pc.cast(
            pa.Array.from_buffers(pa.uint16(), n_runs, [None, pa.py_buffer(pairs[0::2])]), pa.int64()
        )
        lengths = pc.add(
            pc.cast(
                pa.Array.from_buffers(pa.uint16(), n_runs, [None, pa.py_buffer(pairs[1::2])]), pa.int64()
            ),
            _ONE,
        )
        if pc.max(pc.add(firsts, lengths)).as_py() > 0x10000:
            raise MalformedBitmap("a run goes past the end of its container")
        ends = pc.cumulative_sum(lengths)
        shifts = pc.subtract(firsts, pc.subtract(ends, lengths))
        total = ends[-1].as_py()
        positions = pc.cast(pc.indices_nonzero(pa.repeat(_TRUE, total)), pa.int64())
        values = pc.add(positions, pc.run_end_decode(_run_end_encoded(ends, shifts, total)))
        low = pc.cast(values, pa.uint16())
        low_bytes = memoryview(low.buffers()[1]).cast("B")[2 * low.offset :]
        start = 0
        for i, (segment, count) in enumerate(zip(self.lows, self.counts, strict=True)):
            if segment is None:
                self.lows[i] = low_bytes[2 * start : 2 * (start + count)]
                start += count


#: typed scalars: pyarrow infers an untyped Python value's type by trying to import pandas and
#: dateutil, ~45 us per call where they are not installed
_ONE = pa.scalar(1, pa.int64())
_TRUE = pa.scalar(True, pa.bool_())


def _run_end_encoded(run_ends: pa.Int64Array, values: pa.Array, length: int) -> pa.Array:
    """``RunEndEncodedArray.from_arrays`` without its untyped ``pa.scalar`` of the last run end."""
    ree_type = pa.run_end_encoded(pa.int64(), values.type)
    return pa.RunEndEncodedArray.from_buffers(ree_type, length, [None], children=[run_ends, values])


def _read_bucket(data: memoryview, pos: int, bucket_high: int, parts: _Parts) -> int:
    """One portable 32-bit RoaringBitmap whose values all share ``bucket_high``; returns its end."""
    size = len(data)
    cookie = _u32(data, pos, "cookie")
    pos += 4
    run_flags: memoryview | None = None
    if cookie & 0xFFFF == _COOKIE_RUN:
        n = (cookie >> 16) + 1
        run_flags = data[pos : pos + (n + 7) // 8]
        pos += (n + 7) // 8
        has_offsets = n >= _NO_OFFSET_THRESHOLD
    elif cookie == _COOKIE_NO_RUN:
        n = _u32(data, pos, "container count")
        pos += 4
        has_offsets = True
    else:
        raise MalformedBitmap("unknown RoaringBitmap cookie")
    header_end = pos + 4 * n
    if header_end + (4 * n if has_offsets else 0) > size:
        raise MalformedBitmap(f"truncated bitmap: container headers end past byte {size}")
    header = array("H")
    header.frombytes(data[pos:header_end])
    pos = header_end + (4 * n if has_offsets else 0)  # containers are read in sequence: skip offsets
    prev_key = -1
    for i in range(n):
        key, cardinality = header[2 * i], header[2 * i + 1] + 1
        if key <= prev_key:
            raise MalformedBitmap("container keys not ascending")
        prev_key = key
        if run_flags is not None and (run_flags[i >> 3] >> (i & 7)) & 1:
            n_runs = int.from_bytes(data[pos : pos + 2], "little")
            runs = data[pos + 2 : pos + 2 + 4 * n_runs]
            pos += 2 + 4 * n_runs
            if pos > size:
                raise MalformedBitmap(f"truncated bitmap: a run container ends past byte {size}")
            if n_runs > _FEW_RUNS:
                pairs = array("H")
                pairs.frombytes(runs)
                low: Any = None
                found = sum(pairs[1::2]) + n_runs
                parts.many_runs.append(runs)
            else:
                low = _expand_few_runs(runs)
                found = len(low) // 2
        elif cardinality > _ARRAY_MAX:
            # 1024 little-endian words with bit i of byte k for value 8k + i: the bit order of an
            # Arrow boolean buffer, so filtering 0..65535 by it yields the values in order
            words = data[pos : pos + _BITMAP_BYTES]
            pos += _BITMAP_BYTES
            if pos > size:
                raise MalformedBitmap(f"truncated bitmap: a bitmap container ends past byte {size}")
            flags = pa.Array.from_buffers(pa.bool_(), 65536, [None, pa.py_buffer(words)])
            picked = pc.filter(_all_u16_array(), flags)
            found = len(picked)
            low = memoryview(picked.buffers()[1]).cast("B")[2 * picked.offset : 2 * (picked.offset + found)]
        else:
            low = data[pos : pos + 2 * cardinality]
            pos += 2 * cardinality
            if pos > size:
                raise MalformedBitmap(f"truncated bitmap: an array container ends past byte {size}")
            found = cardinality
        if found != cardinality:
            raise MalformedBitmap("a container holds another number of values than its header says")
        parts.lows.append(low)
        parts.counts.append(cardinality)
        parts.highs.append(bucket_high | key << 16)
    return pos


def decode(data: bytes | memoryview, cardinality: int | None = None) -> pa.UInt64Array:
    """The sorted row indexes of a serialized bitmap (MalformedBitmap if it is not one); with
    ``cardinality``, WrongCardinality before anything is expanded if the container headers count
    other rows (a few bytes of run containers can describe billions of rows)."""
    view = memoryview(data).cast("B")
    magic = _u32(view, 0, "magic number")
    if magic in _NATIVE_MAGICS:
        raise MalformedBitmap("native RoaringBitmapArray format (magic 1681511376) is not supported")
    if magic != _MAGIC:
        raise MalformedBitmap(f"no deletion vector magic number (expected {_MAGIC})")
    if len(view) < 12:
        raise MalformedBitmap(f"truncated bitmap: no bucket count in {len(view)} bytes")
    n_buckets = int.from_bytes(view[4:12], "little")
    if n_buckets * 12 > len(view) - 12:  # each bucket takes at least 12 bytes
        raise MalformedBitmap(f"more buckets than fit in {len(view)} bytes")
    parts = _Parts()
    pos, prev_key = 12, -1
    for _ in range(n_buckets):
        key = _u32(view, pos, "bucket key")
        if key <= prev_key or key > _MAX_KEY:
            raise MalformedBitmap(f"bucket keys not ascending or above {_MAX_KEY}")
        prev_key = key
        pos = _read_bucket(view, pos + 4, key << 32, parts)
    if pos != len(view):
        raise MalformedBitmap("trailing bytes after the bitmap")
    if cardinality is not None and sum(parts.counts) != cardinality:
        raise WrongCardinality(sum(parts.counts))
    if not parts.counts:
        return pa.array([], pa.uint64())
    parts.expand_many_runs()
    low_bytes = b"".join(parts.lows)
    total = len(low_bytes) // 2
    low_values = pa.Array.from_buffers(pa.uint16(), total, [None, pa.py_buffer(low_bytes)])
    run_ends = pa.array(itertools.accumulate(parts.counts), pa.int64())
    high_values = _run_end_encoded(run_ends, pa.array(parts.highs, pa.uint64()), total)
    values: pa.UInt64Array = pc.add(pc.cast(low_values, pa.uint64()), pc.run_end_decode(high_values))
    # keys were checked in order above; this catches unsorted array containers and overlapping runs
    if total > 1 and not pc.all(pc.less(values.slice(0, total - 1), values.slice(1))).as_py():
        raise MalformedBitmap("row indexes are not strictly ascending inside a container")
    return values


def decode_bitmap_array(data: bytes | memoryview) -> pa.UInt64Array:
    """Sorted row indexes of a serialized DV bitmap (magic number + portable 64-bit Roaring)."""
    try:
        return decode(data)
    except MalformedBitmap as exc:
        raise DeletionVectorError(f"malformed deletion vector: {exc}") from None
