"""Writing Arrow records as JSON lines, Parquet or CSV: the CLI's stable output contract.

JSON lines keep scripts simple: dates ``YYYY-MM-DD``, timestamps ISO-8601 (UTC with ``Z``;
timestamp_ntz without), decimals as strings (no float rounding), binary as base64, maps as objects.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import IO, Any

import orjson
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq


def _default(value: Any) -> Any:
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    raise TypeError(f"cannot encode {type(value).__name__}")


def _iso_timestamp(value: dt.datetime) -> str:
    text = value.replace(tzinfo=None).isoformat(timespec="microseconds")
    return text + "Z" if value.tzinfo is not None else text


def to_json_value(value: Any, typ: pa.DataType) -> Any:
    """One Arrow value (from ``to_pylist``) to its JSON form, guided by its Arrow type."""
    if value is None:
        return None
    if pa.types.is_timestamp(typ):
        return _iso_timestamp(value) if isinstance(value, dt.datetime) else str(value)
    if pa.types.is_date(typ):
        return value.isoformat()
    if pa.types.is_decimal(typ):
        return str(value)
    if pa.types.is_binary(typ) or pa.types.is_large_binary(typ) or pa.types.is_fixed_size_binary(typ):
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


_PLAIN = (pa.types.is_integer, pa.types.is_string, pa.types.is_boolean, pa.types.is_large_string)


def batch_to_json_rows(batch: pa.RecordBatch) -> Iterator[dict[str, Any]]:
    columns = []
    for field, col in zip(batch.schema, batch.columns, strict=True):
        values = col.to_pylist()
        if not any(check(field.type) for check in _PLAIN):
            values = [to_json_value(v, field.type) for v in values]
        columns.append(values)
    names = batch.schema.names
    for i in range(batch.num_rows):
        yield {name: columns[j][i] for j, name in enumerate(names)}


def dumps(obj: Any) -> bytes:
    return orjson.dumps(obj, default=_default, option=orjson.OPT_NON_STR_KEYS)


@contextmanager
def open_output(path: str | None) -> Iterator[IO[bytes]]:
    if path is None or path == "-":
        yield sys.stdout.buffer
        sys.stdout.buffer.flush()
        return
    with open(path, "wb") as fh:
        yield fh


def write_jsonl(objs: Iterable[dict[str, Any]], out: IO[bytes]) -> int:
    n = 0
    for obj in objs:
        out.write(dumps(obj))
        out.write(b"\n")
        n += 1
    return n


def write_batches(batches: Iterable[pa.RecordBatch], schema: pa.Schema, fmt: str, out: IO[bytes]) -> int:
    """Stream batches in ``fmt`` (jsonl, parquet, csv); returns the number of rows."""
    rows = 0
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
        with pacsv.CSVWriter(out, schema) as csv_writer:
            for batch in batches:
                csv_writer.write_batch(batch)
                rows += batch.num_rows
        return rows
    raise ValueError(f"unknown format {fmt}")
