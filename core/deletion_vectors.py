"""Deletion vectors (DVs): which rows of a data file are logically deleted.

A DV is described in the log by a descriptor: stored inline (Z85 text) or in a ``.bin`` file
framed by a size and a CRC-32, at a path relative to the table (a Z85 UUID) or absolute. This
module finds and reads what a descriptor names, checks it against the descriptor, and turns the
deleted rows into a filter for the data file; the bitmap itself is decoded by :mod:`.roaring`.

Spec: delta-io/delta PROTOCOL.md, "Deletion Vectors" and "Deletion Vector Format".
"""

from __future__ import annotations

import base64
import struct
import uuid
import zlib
from collections.abc import Callable, Mapping
from typing import Any

import pyarrow as pa

from deltamirror.core.compute import pc

from .errors import DeletionVectorError, PathOutsideTableError
from .paths import redact_userinfo
from .roaring import MalformedBitmap, WrongCardinality, decode, decode_bitmap_array
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
        rows = decode(bitmap, cardinality)
    except MalformedBitmap as exc:
        raise fail(f"malformed deletion vector: {exc}") from None
    except WrongCardinality as exc:
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
        return pa.repeat(pa.scalar(True, pa.bool_()), num_rows)
    highest = pc.max(deleted).as_py()
    if highest >= num_rows:
        raise DeletionVectorError(
            f"deletion vector deletes row {highest} but the data file has {num_rows} rows",
            data_file=data_file,
        )
    indices = deleted.cast(pa.int64())
    if hasattr(pc, "scatter"):  # pyarrow >= 20: one pass writing each deleted position
        marks = pc.scatter(
            pa.repeat(pa.scalar(False, pa.bool_()), len(deleted)), indices, max_index=num_rows - 1
        )
        return pc.is_null(marks)
    return _keep_mask_by_lookup(indices, num_rows)


def _keep_mask_by_lookup(indices: pa.Int64Array, num_rows: int) -> pa.BooleanArray:
    """Fallback for pyarrow without ``scatter``: a hash lookup per row (about 10x slower)."""
    row_numbers = pc.cast(pc.indices_nonzero(pa.repeat(pa.scalar(True, pa.bool_()), num_rows)), pa.int64())
    return pc.invert(pc.is_in(row_numbers, value_set=indices))
