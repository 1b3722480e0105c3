"""Writing Arrow records as JSON lines, Parquet or CSV: the CLI's stable output contract.

JSON lines and CSV print values the same way, so that a script can switch formats: dates
``YYYY-MM-DD``, timestamps ISO-8601 as :func:`format_timestamp` writes them (UTC with ``Z``;
timestamp_ntz without), decimals as strings (no float rounding), binary as base64; JSON lines
also hold nested values (maps as objects), which CSV cannot.

An ``-o`` file is written under a temporary name in its directory and renamed over the target
only once everything is written, so a command that fails midway leaves no file that looks
complete.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
import os
import stat
import sys
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from typing import IO, Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

_EPOCH = dt.datetime(1970, 1, 1)
_US = dt.timedelta(microseconds=1)


# --- timestamps -------------------------------------------------------------------------------


def format_timestamp(epoch_us: int, *, utc: bool = True) -> str:
    """The one timestamp layout of every output: ``2026-01-01T00:00:05.500Z``.

    Milliseconds always; three more digits only when the value has microseconds (Delta stores
    microseconds, and dropping them would change the data). ``Z`` marks UTC; a timestamp_ntz
    (``utc=False``) has no offset, as delta-spark prints it. Commit timestamps, epoch
    milliseconds, print exactly as ``core.timestamps.format_iso`` prints them.
    """
    seconds, micros = divmod(epoch_us, 1_000_000)
    millis, rest = divmod(micros, 1000)
    text = (_EPOCH + dt.timedelta(seconds=seconds)).isoformat() + f".{millis:03d}"
    if rest:
        text += f"{rest:03d}"
    return text + "Z" if utc else text


def _epoch_us(value: dt.datetime) -> int:
    if value.tzinfo is not None:
        value = value.astimezone(dt.UTC).replace(tzinfo=None)
    return (value - _EPOCH) // _US


def format_timestamp_array(array: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """:func:`format_timestamp` over a whole timestamp column, without a Python object per value."""
    typ = array.type
    micros = array.cast(pa.timestamp("us", typ.tz)).cast(pa.int64())  # UTC whatever the zone
    # whole seconds rounded down, also before 1970, so that the fraction is never negative
    seconds = pc.floor_temporal(micros.cast(pa.timestamp("us")), unit="second").cast(pa.int64())
    whole = pc.strftime(pc.divide(seconds, 1_000_000).cast(pa.timestamp("s")), format="%Y-%m-%dT%H:%M:%S")
    fraction = pc.subtract(micros, seconds)
    millis = pc.utf8_lpad(pc.cast(pc.divide(fraction, 1000), pa.string()), width=3, padding="0")
    rest = pc.subtract(fraction, pc.multiply(pc.divide(fraction, 1000), 1000))
    rest_text = pc.if_else(
        pc.equal(rest, 0), "", pc.utf8_lpad(pc.cast(rest, pa.string()), width=3, padding="0")
    )
    suffix = "Z" if typ.tz is not None else ""
    return pc.binary_join_element_wise(whole, ".", millis, rest_text, suffix, "")


# --- values -----------------------------------------------------------------------------------


def _default(value: Any) -> Any:
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    raise TypeError(f"cannot encode {type(value).__name__}")


def to_json_value(value: Any, typ: pa.DataType) -> Any:
    """One Arrow value (from ``to_pylist``) to its JSON form, guided by its Arrow type."""
    if value is None:
        return None
    if pa.types.is_timestamp(typ):
        if isinstance(value, dt.datetime):
            return format_timestamp(_epoch_us(value), utc=typ.tz is not None)
        return str(value)
    if pa.types.is_date(typ):
        return value.isoformat()
    if pa.types.is_decimal(typ):
        return str(value)
    if _is_binary(typ):
        return base64.b64encode(value).decode("ascii")
    if pa.types.is_map(typ):
        return {str(to_json_value(k, typ.key_type)): to_json_value(v, typ.item_type) for k, v in value}
    if pa.types.is_struct(typ):
        return {f.name: to_json_value(value.get(f.name), f.type) for f in typ}
    if pa.types.is_list(typ) or pa.types.is_large_list(typ) or pa.types.is_fixed_size_list(typ):
        return [to_json_value(v, typ.value_type) for v in value]
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return str(value)  # NaN/Infinity are not JSON
    return value


def _is_binary(typ: pa.DataType) -> bool:
    return bool(
        pa.types.is_binary(typ) or pa.types.is_large_binary(typ) or pa.types.is_fixed_size_binary(typ)
    )


def _is_nested(typ: pa.DataType) -> bool:
    return bool(pa.types.is_nested(typ))


_PLAIN = (pa.types.is_integer, pa.types.is_string, pa.types.is_boolean, pa.types.is_large_string)


def batch_to_json_rows(batch: pa.RecordBatch) -> Iterator[dict[str, Any]]:
    columns = []
    for field, col in zip(batch.schema, batch.columns, strict=True):
        if pa.types.is_timestamp(field.type):
            values = format_timestamp_array(col).to_pylist()
        else:
            values = col.to_pylist()
            if not any(check(field.type) for check in _PLAIN):
                values = [to_json_value(v, field.type) for v in values]
        columns.append(values)
    names = batch.schema.names
    for i in range(batch.num_rows):
        yield {name: columns[j][i] for j, name in enumerate(names)}


def dumps(obj: Any) -> bytes:
    """One JSON document. orjson, and the standard library for the rare value orjson refuses: an
    integer beyond 64 bits, which free-form fields such as ``commitInfo`` may hold (valid JSON, and
    printed as the log has it), or a string that is not valid Unicode (escaped, never dropped)."""
    try:
        return orjson.dumps(obj, default=_default, option=orjson.OPT_NON_STR_KEYS)
    except TypeError:
        return json.dumps(obj, default=_default, separators=(",", ":"), allow_nan=False).encode()


# --- CSV --------------------------------------------------------------------------------------


def check_csv_schema(schema: pa.Schema) -> None:
    """Refuse, before anything is read or written, columns that CSV cannot hold."""
    from deltamirror.core.errors import InvalidArgumentError

    nested = [f"{f.name} ({_kind(f.type)})" for f in schema if _is_nested(f.type)]
    if nested:
        raise InvalidArgumentError(
            f"--format csv cannot hold nested columns: {', '.join(nested)}; "
            "use --format jsonl or --format parquet, or leave them out with --columns"
        )


def _kind(typ: pa.DataType) -> str:
    if pa.types.is_struct(typ):
        return "struct"
    if pa.types.is_map(typ):
        return "map"
    if pa.types.is_list(typ) or pa.types.is_large_list(typ) or pa.types.is_fixed_size_list(typ):
        return "array"
    return str(typ)


def _csv_batch(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Timestamps and binary as JSON lines print them; every other column as Arrow writes it."""
    columns = []
    for field, col in zip(batch.schema, batch.columns, strict=True):
        if pa.types.is_timestamp(field.type):
            col = format_timestamp_array(col)
        elif _is_binary(field.type):
            col = pa.array([to_json_value(v, field.type) for v in col.to_pylist()], pa.string())
        columns.append(col)
    return pa.RecordBatch.from_arrays(columns, names=batch.schema.names)


def _csv_schema(schema: pa.Schema) -> pa.Schema:
    return pa.schema(
        [
            pa.field(f.name, pa.string(), f.nullable)
            if pa.types.is_timestamp(f.type) or _is_binary(f.type)
            else f
            for f in schema
        ]
    )


# --- the output file --------------------------------------------------------------------------


def check_output_path(path: str) -> None:
    """Refuse an ``-o`` that cannot be written, before any work starts."""
    from deltamirror.core.errors import InvalidArgumentError

    if path == "-":
        return
    target = os.path.realpath(path) if os.path.islink(path) else path
    if path.endswith(("/", os.sep)) or os.path.isdir(target):
        raise InvalidArgumentError(
            f"-o {path}: is a directory; give a file name, such as {path.rstrip('/')}/out"
        )
    directory = os.path.dirname(target) or "."
    if not os.path.exists(directory):
        raise InvalidArgumentError(f"-o {path}: directory {directory} does not exist")
    if not os.path.isdir(directory):
        raise InvalidArgumentError(f"-o {path}: {directory} is not a directory")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise InvalidArgumentError(f"-o {path}: directory {directory} is not writable")
    if os.path.exists(target) and os.path.isfile(target) and not os.access(target, os.W_OK):
        raise InvalidArgumentError(f"-o {path}: the file is not writable")


@contextmanager
def open_output(path: str | None) -> Iterator[IO[bytes]]:
    """stdout, or ``path`` written under a temporary name and renamed over it at the end.

    On any failure (or Ctrl-C) the temporary is removed and an existing ``path`` is left as it
    was. A device or a pipe (``-o /dev/null``) is written in place: it cannot be renamed over.
    """
    if path is None or path == "-":
        yield sys.stdout.buffer
        sys.stdout.buffer.flush()
        return
    check_output_path(path)
    target = os.path.realpath(path) if os.path.islink(path) else path
    if os.path.exists(target) and not os.path.isfile(target):
        with open(target, "wb") as fh:
            yield fh
        return
    directory, name = os.path.split(os.path.abspath(target))
    fd, temporary = tempfile.mkstemp(prefix=f".{name}.", suffix=".partial", dir=directory)
    try:
        with os.fdopen(fd, "wb") as fh:
            yield fh
        os.chmod(temporary, _mode_for(target))
        os.replace(temporary, target)
    except BaseException:
        with suppress(FileNotFoundError):
            os.unlink(temporary)
        raise


def _mode_for(target: str) -> int:
    """The mode ``open(target, "w")`` would leave: the existing file's, or 0666 less the umask."""
    try:
        return stat.S_IMODE(os.stat(target).st_mode)
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


# --- writers ----------------------------------------------------------------------------------


def write_jsonl(objs: Iterable[dict[str, Any]], out: IO[bytes]) -> int:
    n = 0
    for obj in objs:
        out.write(dumps(obj))
        out.write(b"\n")
        n += 1
    return n


def _in_order(batches: Iterable[pa.RecordBatch], names: list[str]) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        yield batch if batch.schema.names == names else batch.select(names)


def write_batches(batches: Iterable[pa.RecordBatch], schema: pa.Schema, fmt: str, out: IO[bytes]) -> int:
    """Stream batches in ``fmt`` (jsonl, parquet, csv); returns the number of rows.

    Columns come out in ``schema``'s order (``--columns b,a`` prints b first), whatever order a
    batch holds them in: CSV writes cells by position, under the schema's header.
    """
    rows = 0
    batches = _in_order(batches, schema.names)
    if fmt == "jsonl":
        for batch in batches:
            rows += write_jsonl(batch_to_json_rows(batch), out)
        return rows
    if fmt == "parquet":
        with pq.ParquetWriter(out, schema) as writer:
            for batch in batches:
                writer.write_batch(batch)
                rows += batch.num_rows
        return rows
    if fmt == "csv":
        check_csv_schema(schema)
        with pacsv.CSVWriter(out, _csv_schema(schema)) as csv_writer:
            for batch in batches:
                csv_writer.write_batch(_csv_batch(batch))
                rows += batch.num_rows
        return rows
    raise ValueError(f"unknown format {fmt}")
