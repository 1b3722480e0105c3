"""Deletion vectors (DVs): which rows of a data file are logically deleted.

A DV is a 64-bit Roaring bitmap of row indexes ("portable" serialization, prefixed by a magic
number), stored inline in the log (Z85 text) or in a ``.bin`` file framed by a size and a CRC-32.
The decoder works on whole containers with bytes slicing and pyarrow kernels, never one Python
object per row, so a DV of millions of rows costs milliseconds. Everything here assumes a
little-endian host (as pyarrow buffers do).

Spec: delta-io/delta PROTOCOL.md, "Deletion Vectors" and "Deletion Vector Format"; the 32-bit
container layout is RoaringFormatSpec.
"""

from __future__ import annotations

import base64
import itertools
import struct
import uuid
import zlib
from array import array
from collections.abc import Callable, Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from .errors import DeletionVectorError, PathOutsideTableError
from .paths import redact_userinfo
from .storage import TableStorage

__all__ = [
    "check_dv_paths",
    "decode_bitmap_array",
    "dv_absolute_path",
    "dv_unique_id",
    "dv_unique_ids",
    "keep_mask",
    "read_deleted_rows",
    "z85_decode",
]

# --- Z85 ----------------------------------------------------------------------------------------

_Z85_ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
_B85_ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz!#$%&()*+-;<=>?@^_`{|}~"
# Z85 and RFC 1924 base85 are the same big-endian base-85 arithmetic with different digit symbols,
# so Z85 is decoded by renaming the digits and letting the stdlib do the arithmetic. Every byte
# outside the Z85 alphabet becomes ',' which base85 rejects, so no stray character slips through.
_Z85_TO_B85 = bytes(
    _B85_ALPHABET.encode()[_Z85_ALPHABET.index(chr(b))] if chr(b) in _Z85_ALPHABET else ord(",")
    for b in range(256)
)


def z85_decode(text: str) -> bytes:
    """Decode ZeroMQ Z85 (RFC 32); raises ValueError on bad length, characters or groups.

    Also accepts the padded tail of the Rust ``z85`` crate (used by delta-kernel-rs for inline
    DVs): a last group led by k '#' (1 <= k <= 3) holds 4 - k bytes in its 5 - k digits. No valid
    Z85 group starts with '#' (84 * 85**4 > 2**32), so this never changes a strict decoding.
    """
    if len(text) % 5:
        raise ValueError(f"Z85 text length {len(text)} is not a multiple of 5")
    if text and text[-5] == "#":
        return _z85_strict(text[:-5]) + _z85_padded_tail(text[-5:])
    return _z85_strict(text)


def _z85_strict(text: str) -> bytes:
    try:
        raw = text.encode("ascii")
    except UnicodeEncodeError as exc:
        raise ValueError("Z85 text has non-ASCII characters") from exc
    try:
        return base64.b85decode(raw.translate(_Z85_TO_B85))
    except ValueError as exc:  # a character outside the alphabet, or a group above 2**32 - 1
        raise ValueError(f"invalid Z85 text: {exc}") from exc


def _z85_padded_tail(group: str) -> bytes:
    digits = group.lstrip("#")
    missing = len(group) - len(digits)
    if not 1 <= missing <= 3:
        raise ValueError(f"invalid Z85 group {group!r}")
    value = 0
    for char in digits:
        index = _Z85_ALPHABET.find(char)
        if index < 0:
            raise ValueError(f"invalid Z85 character {char!r}")
        value = value * 85 + index
    size = 4 - missing
    if value >= 1 << (8 * size):
        raise ValueError(f"Z85 tail {group!r} does not fit {size} bytes")
    return value.to_bytes(size, "big")


# --- identity and location ----------------------------------------------------------------------

_UUID_Z85_CHARS = 20


def dv_unique_id(storage_type: str, path_or_inline_dv: str, offset: int | None) -> str:
    """The DV part of a logical file's replay key (the other part is the data file path)."""
    base = f"{storage_type}{path_or_inline_dv}"
    return base if offset is None else f"{base}@{offset}"


def _field_or_nulls(dv: pa.Array | pa.ChunkedArray, name: str, required: bool) -> Any:
    index = dv.type.get_field_index(name)
    if index < 0:
        if required:
            raise DeletionVectorError(f"deletionVector struct has no field {name!r}")
        return pa.nulls(len(dv), pa.string())
    return pc.struct_field(dv, [index])  # null where the whole descriptor is null


def dv_unique_ids(dv: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """:func:`dv_unique_id` over a column of descriptors; null where a file has no DV.

    It feeds replay keys over millions of file actions, hence kernels only. A column that is
    all-null by type (JSON commits where no action had a DV) gives all-null ids.
    """
    if pa.types.is_null(dv.type):
        return pa.nulls(len(dv), pa.string())
    if not pa.types.is_struct(dv.type):
        raise DeletionVectorError(f"deletionVector column has type {dv.type}, expected a struct")
    storage_type = _field_or_nulls(dv, "storageType", required=True)
    path = _field_or_nulls(dv, "pathOrInlineDv", required=True)
    offset = _field_or_nulls(dv, "offset", required=False)
    at_offset = pc.binary_join_element_wise("@", pc.cast(offset, pa.string()), "")
    suffix = pc.coalesce(at_offset, "")
    return pc.binary_join_element_wise(storage_type, path, suffix, "")


def dv_absolute_path(storage: TableStorage, storage_type: str, path_or_inline_dv: str) -> str:
    """Filesystem path of an on-disk DV ('u': relative to the table root, 'p': absolute URI),
    held to the table root like every path in the log (PathOutsideTableError otherwise)."""
    if not isinstance(path_or_inline_dv, str):
        raise DeletionVectorError("deletion vector pathOrInlineDv is not a string", table=storage.uri)
    if storage_type == "u":
        if len(path_or_inline_dv) < _UUID_Z85_CHARS:
            raise DeletionVectorError(
                f"relative deletion vector id {path_or_inline_dv!r} is shorter than a Z85 UUID",
                table=storage.uri,
            )
        prefix = path_or_inline_dv[:-_UUID_Z85_CHARS]
        try:
            dv_uuid = uuid.UUID(bytes=z85_decode(path_or_inline_dv[-_UUID_Z85_CHARS:]))
        except ValueError as exc:
            raise DeletionVectorError(
                f"relative deletion vector id {path_or_inline_dv!r} has no valid UUID: {exc}",
                table=storage.uri,
            ) from exc
        name = f"deletion_vector_{dv_uuid}.bin"
        # the prefix is a folder name the writer chose, joined as it is (not URL-encoded)
        return storage.resolve(f"{prefix}/{name}" if prefix else name, kind="deletion vector", literal=True)
    if storage_type == "p":
        return storage.resolve(path_or_inline_dv, kind="deletion vector")
    if storage_type == "i":
        raise DeletionVectorError("an inline deletion vector has no file", table=storage.uri)
    raise DeletionVectorError(f"unknown deletion vector storageType {storage_type!r}", table=storage.uri)


#: a 'u' prefix that is more than a folder name: it is resolved in full to be refused or allowed
_ODD_PREFIX = r"^/|:|\x00|\.\."


def check_dv_paths(storage: TableStorage, dv: pa.Array | pa.ChunkedArray) -> None:
    """Holds the on-disk DVs of a column of descriptors to the table root, before any is read.

    Absolute ('p') paths go through :meth:`TableStorage.check_paths`; relative ('u') ones differ
    only by their prefix, and only the few distinct prefixes that are not plain folder names are
    resolved one by one.
    """
    if pa.types.is_null(dv.type) or len(dv) == 0 or dv.null_count == len(dv):
        return
    if not pa.types.is_struct(dv.type):
        raise DeletionVectorError(f"deletionVector column has type {dv.type}, expected a struct")
    storage_type = _field_or_nulls(dv, "storageType", required=True)
    path = _field_or_nulls(dv, "pathOrInlineDv", required=True)
    absolute = pc.filter(path, pc.equal(storage_type, "p"))
    storage.check_paths(absolute.drop_null(), kind="deletion vector")
    relative = pc.filter(path, pc.equal(storage_type, "u")).drop_null()
    if len(relative) == 0:
        return
    prefixes = pc.utf8_slice_codeunits(relative, 0, -_UUID_Z85_CHARS)
    odd = pc.filter(prefixes, pc.match_substring_regex(prefixes, _ODD_PREFIX))
    for prefix in pc.unique(odd).to_pylist():
        at = pc.index(prefixes, prefix).as_py()
        dv_absolute_path(storage, "u", relative[at].as_py())


# --- the bitmap format --------------------------------------------------------------------------

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
# every uint16 in order: the low halves of a run [a, b] are the slice [2a, 2b + 2) of this
_ALL_U16 = array("H", range(65536)).tobytes()
_ALL_U16_ARRAY = pa.Array.from_buffers(pa.uint16(), 65536, [None, pa.py_buffer(_ALL_U16)])


class _Malformed(Exception):
    """Internal: a bitmap that does not follow the format; re-raised with the file named."""


class _WrongCount(Exception):
    """Internal: the containers hold another number of rows than the descriptor's cardinality."""

    def __init__(self, found: int) -> None:
        super().__init__(found)
        self.found = found


def _u32(data: memoryview, pos: int, what: str) -> int:
    if pos + 4 > len(data):
        raise _Malformed(f"truncated bitmap: no {what}")
    return int.from_bytes(data[pos : pos + 4], "little")


def _expand_few_runs(runs: memoryview) -> bytes:
    """Values of a run container as uint16 bytes: each run [a, a + n] is a slice of _ALL_U16."""
    pairs = array("H")
    pairs.frombytes(runs)
    pieces, prev_last = [], -1
    for j in range(0, len(pairs), 2):
        first, last = pairs[j], pairs[j] + pairs[j + 1]
        if first <= prev_last or last > 0xFFFF:
            raise _Malformed("a run overlaps another or leaves its container")
        pieces.append(_ALL_U16[2 * first : 2 * last + 2])
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
            1,
        )
        if pc.max(pc.add(firsts, lengths)).as_py() > 0x10000:
            raise _Malformed("a run goes past the end of its container")
        ends = pc.cumulative_sum(lengths)
        shifts = pc.subtract(firsts, pc.subtract(ends, lengths))
        total = ends[-1].as_py()
        positions = pc.cast(pc.indices_nonzero(pa.repeat(pa.scalar(True), total)), pa.int64())
        values = pc.add(positions, pc.run_end_decode(pa.RunEndEncodedArray.from_arrays(ends, shifts)))
        low = pc.cast(values, pa.uint16())
        low_bytes = memoryview(low.buffers()[1]).cast("B")[2 * low.offset :]
        start = 0
        for i, (segment, count) in enumerate(zip(self.lows, self.counts, strict=True)):
            if segment is None:
                self.lows[i] = low_bytes[2 * start : 2 * (start + count)]
                start += count


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
        raise _Malformed("unknown RoaringBitmap cookie")
    header_end = pos + 4 * n
    if header_end + (4 * n if has_offsets else 0) > size:
        raise _Malformed(f"truncated bitmap: container headers end past byte {size}")
    header = array("H")
    header.frombytes(data[pos:header_end])
    pos = header_end + (4 * n if has_offsets else 0)  # containers are read in sequence: skip offsets
    prev_key = -1
    for i in range(n):
        key, cardinality = header[2 * i], header[2 * i + 1] + 1
        if key <= prev_key:
            raise _Malformed("container keys not ascending")
        prev_key = key
        if run_flags is not None and (run_flags[i >> 3] >> (i & 7)) & 1:
            n_runs = int.from_bytes(data[pos : pos + 2], "little")
            runs = data[pos + 2 : pos + 2 + 4 * n_runs]
            pos += 2 + 4 * n_runs
            if pos > size:
                raise _Malformed(f"truncated bitmap: a run container ends past byte {size}")
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
                raise _Malformed(f"truncated bitmap: a bitmap container ends past byte {size}")
            flags = pa.Array.from_buffers(pa.bool_(), 65536, [None, pa.py_buffer(words)])
            picked = pc.filter(_ALL_U16_ARRAY, flags)
            found = len(picked)
            low = memoryview(picked.buffers()[1]).cast("B")[2 * picked.offset : 2 * (picked.offset + found)]
        else:
            low = data[pos : pos + 2 * cardinality]
            pos += 2 * cardinality
            if pos > size:
                raise _Malformed(f"truncated bitmap: an array container ends past byte {size}")
            found = cardinality
        if found != cardinality:
            raise _Malformed("a container holds another number of values than its header says")
        parts.lows.append(low)
        parts.counts.append(cardinality)
        parts.highs.append(bucket_high | key << 16)
    return pos


def _decode(data: bytes | memoryview, cardinality: int | None = None) -> pa.UInt64Array:
    """The row indexes; with ``cardinality``, refused before anything is expanded if the container
    headers count other rows (a few bytes of run containers can describe billions of rows)."""
    view = memoryview(data).cast("B")
    magic = _u32(view, 0, "magic number")
    if magic in _NATIVE_MAGICS:
        raise _Malformed("native RoaringBitmapArray format (magic 1681511376) is not supported")
    if magic != _MAGIC:
        raise _Malformed(f"no deletion vector magic number (expected {_MAGIC})")
    if len(view) < 12:
        raise _Malformed(f"truncated bitmap: no bucket count in {len(view)} bytes")
    n_buckets = int.from_bytes(view[4:12], "little")
    if n_buckets * 12 > len(view) - 12:  # each bucket takes at least 12 bytes
        raise _Malformed(f"more buckets than fit in {len(view)} bytes")
    parts = _Parts()
    pos, prev_key = 12, -1
    for _ in range(n_buckets):
        key = _u32(view, pos, "bucket key")
        if key <= prev_key or key > _MAX_KEY:
            raise _Malformed(f"bucket keys not ascending or above {_MAX_KEY}")
        prev_key = key
        pos = _read_bucket(view, pos + 4, key << 32, parts)
    if pos != len(view):
        raise _Malformed("trailing bytes after the bitmap")
    if cardinality is not None and sum(parts.counts) != cardinality:
        raise _WrongCount(sum(parts.counts))
    if not parts.counts:
        return pa.array([], pa.uint64())
    parts.expand_many_runs()
    low_bytes = b"".join(parts.lows)
    total = len(low_bytes) // 2
    low_values = pa.Array.from_buffers(pa.uint16(), total, [None, pa.py_buffer(low_bytes)])
    run_ends = pa.array(itertools.accumulate(parts.counts), pa.int64())
    high_values = pa.RunEndEncodedArray.from_arrays(run_ends, pa.array(parts.highs, pa.uint64()))
    values: pa.UInt64Array = pc.add(pc.cast(low_values, pa.uint64()), pc.run_end_decode(high_values))
    # keys were checked in order above; this catches unsorted array containers and overlapping runs
    if total > 1 and not pc.all(pc.less(values.slice(0, total - 1), values.slice(1))).as_py():
        raise _Malformed("row indexes are not strictly ascending inside a container")
    return values


def decode_bitmap_array(data: bytes | memoryview) -> pa.UInt64Array:
    """Sorted row indexes of a serialized DV bitmap (magic number + portable 64-bit Roaring)."""
    try:
        return _decode(data)
    except _Malformed as exc:
        raise DeletionVectorError(f"malformed deletion vector: {exc}") from None


# --- reading a descriptor -----------------------------------------------------------------------

_Fail = Callable[[str], DeletionVectorError]
_FILE_FORMAT_VERSION = 1
# DVs near the file start are read from byte 0 so that the format version can be checked for free
_VERSION_CHECK_WINDOW = 4096
#: PROTOCOL.md types sizeInBytes and offset as Int (32-bit signed)
_MAX_INT = 2**31 - 1
#: the largest DV read: a bitmap of every row of a 2**32-row file is 512 MiB; a larger size in the
#: log is corrupt, and reading it would only exhaust memory
MAX_DV_BYTES = 1 << 30


def _int_field(descriptor: Mapping[str, Any], name: str, fail: _Fail) -> int:
    value = descriptor.get(name)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if value is None or isinstance(value, bool):
        raise fail(f"deletion vector descriptor has no valid {name}")
    raise fail(f"deletion vector descriptor has a non-integer {name} ({type(value).__name__})")


def _read_framed(storage: TableStorage, path: str, offset: int, size: int, fail: _Fail) -> memoryview:
    """The bitmap bytes of one DV in a DV file, after checking framing size and CRC-32.

    The range comes from the log: storage reads never go past the file's end, so a size far beyond
    the file costs no memory, and it is refused before its bytes are looked at. No error echoes
    what the file holds (the path may not be a DV file at all).
    """
    start = 0 if offset <= _VERSION_CHECK_WINDOW else offset
    end = offset + 4 + size + 4
    try:
        blob = storage.read_bytes(path, start, end)
    except FileNotFoundError:
        raise fail("deletion vector file not found") from None
    if len(blob) != end - start:
        raise fail(
            f"deletion vector file too short: offset {offset} and sizeInBytes {size} reach byte {end}, "
            f"the file ends before"
        )
    view = memoryview(blob)
    if start == 0 and view[0] != _FILE_FORMAT_VERSION:
        raise fail("not a deletion vector file (unknown format version)")
    at = offset - start
    (framed_size,) = struct.unpack_from(">i", view, at)
    if framed_size != size:
        raise fail(f"deletion vector size in the file differs from sizeInBytes {size}")
    bitmap = view[at + 4 : at + 4 + size]
    (checksum,) = struct.unpack_from(">I", view, at + 4 + size)
    if zlib.crc32(bitmap) != checksum:
        raise fail("deletion vector checksum mismatch")
    return bitmap


def read_deleted_rows(
    storage: TableStorage,
    descriptor: Mapping[str, Any],
    *,
    table: str | None = None,
    data_file: str | None = None,
    num_rows: int | None = None,
) -> pa.UInt64Array:
    """Sorted, unique row indexes a DV deletes, checked against its descriptor.

    Checks: framing size, CRC-32 (on-disk DVs), magic number, that the count equals
    ``cardinality`` and, when given, that no index exceeds ``maxRowIndex``. Every failure,
    including a missing DV file, is a :class:`DeletionVectorError` naming the DV and data file.
    ``num_rows`` (the data file's) bounds ``cardinality`` before anything is read.
    """
    table = table if table is not None else storage.uri
    if not isinstance(descriptor, Mapping):
        raise DeletionVectorError(
            "deletion vector descriptor is not an object", table=table, data_file=data_file
        )
    storage_type = descriptor.get("storageType")
    path_or_inline = descriptor.get("pathOrInlineDv")
    where = "inline" if storage_type == "i" else redact_userinfo(str(path_or_inline))

    def fail(message: str) -> DeletionVectorError:
        return DeletionVectorError(message, table=table, file=where, data_file=data_file)

    if not isinstance(storage_type, str) or not isinstance(path_or_inline, str):
        raise fail("deletion vector descriptor has no storageType/pathOrInlineDv")
    if storage_type != "i":
        try:
            where = dv_absolute_path(storage, storage_type, path_or_inline)
        except DeletionVectorError as exc:
            raise fail(exc.message) from None
        except PathOutsideTableError as exc:
            exc.context.setdefault("data_file", data_file)
            raise
    size = _int_field(descriptor, "sizeInBytes", fail)
    cardinality = _int_field(descriptor, "cardinality", fail)
    if not 0 <= size <= _MAX_INT or cardinality < 0:
        raise fail(f"sizeInBytes ({size}) or cardinality ({cardinality}) out of range")
    if size > MAX_DV_BYTES:
        raise fail(f"sizeInBytes {size} is larger than any deletion vector ({MAX_DV_BYTES} bytes)")
    if num_rows is not None and cardinality > num_rows:
        raise fail(f"cardinality {cardinality} is more than the data file's {num_rows} rows")

    bitmap: bytes | memoryview
    if storage_type == "i":
        try:
            decoded = z85_decode(path_or_inline)
        except ValueError as exc:
            raise fail(f"inline deletion vector is not valid Z85: {exc}") from None
        if not size <= len(decoded) < size + 4:  # Z85 pads the bytes to a multiple of 4
            raise fail(f"inline deletion vector decodes to {len(decoded)} bytes, sizeInBytes is {size}")
        bitmap = decoded[:size]
    else:
        offset = 0 if descriptor.get("offset") is None else _int_field(descriptor, "offset", fail)
        if not 0 <= offset <= _MAX_INT:
            raise fail(f"deletion vector offset {offset} out of range")
        bitmap = _read_framed(storage, where, offset, size, fail)

    try:
        rows = _decode(bitmap, cardinality)
    except _Malformed as exc:
        raise fail(f"malformed deletion vector: {exc}") from None
    except _WrongCount as exc:
        raise fail(f"deletion vector holds {exc.found} rows, cardinality says {cardinality}") from None
    except MemoryError:
        raise fail(f"deletion vector of {cardinality} rows does not fit in memory") from None
    max_row_index = (
        None if descriptor.get("maxRowIndex") is None else _int_field(descriptor, "maxRowIndex", fail)
    )
    if max_row_index is not None and len(rows) and rows[-1].as_py() > max_row_index:
        raise fail(f"deletion vector deletes row {rows[-1].as_py()} beyond maxRowIndex {max_row_index}")
    return rows


# --- applying -----------------------------------------------------------------------------------


def keep_mask(deleted: pa.UInt64Array, num_rows: int, *, data_file: str | None = None) -> pa.BooleanArray:
    """True for each of ``num_rows`` rows the DV does not delete (a filter for the data file).

    A deleted index at or past ``num_rows`` means the DV belongs to another file or the file was
    replaced: that is an error, never something to clip silently.
    """
    if num_rows < 0:
        raise ValueError(f"num_rows must be >= 0, got {num_rows}")
    if len(deleted) == 0:
        return pa.repeat(pa.scalar(True), num_rows)
    highest = pc.max(deleted).as_py()
    if highest >= num_rows:
        raise DeletionVectorError(
            f"deletion vector deletes row {highest} but the data file has {num_rows} rows",
            data_file=data_file,
        )
    indices = deleted.cast(pa.int64())
    if hasattr(pc, "scatter"):  # pyarrow >= 20: one pass writing each deleted position
        marks = pc.scatter(pa.repeat(pa.scalar(False), len(deleted)), indices, max_index=num_rows - 1)
        return pc.is_null(marks)
    return _keep_mask_by_lookup(indices, num_rows)


def _keep_mask_by_lookup(indices: pa.Int64Array, num_rows: int) -> pa.BooleanArray:
    """Fallback for pyarrow without ``scatter``: a hash lookup per row (about 10x slower)."""
    row_numbers = pc.cast(pc.indices_nonzero(pa.repeat(pa.scalar(True), num_rows)), pa.int64())
    return pc.invert(pc.is_in(row_numbers, value_set=indices))
