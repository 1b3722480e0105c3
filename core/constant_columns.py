"""Arrow columns of one repeated 64-bit value, built straight from bytes.

The change feed stamps every batch with ``_commit_version`` and ``_commit_timestamp``, and row
tracking fills a file's rows with its ``defaultRowCommitVersion``: ``n`` copies of one value, made
several times faster from a repeated 8-byte buffer than by ``pa.repeat``.
"""

from __future__ import annotations

import struct

import pyarrow as pa

_INT64 = struct.Struct("=q")  # Arrow buffers hold native-endian values


def repeated_int64(value: int, n: int, arrow_type: pa.DataType = pa.int64()) -> pa.Array:
    """``n`` copies of a 64-bit value (int64, timestamp)."""
    return pa.Array.from_buffers(arrow_type, n, [None, pa.py_buffer(_INT64.pack(value) * n)])
