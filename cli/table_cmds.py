"""``snapshot``, ``read`` and ``history``: looking at a table without Kafka."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from typing import Any

from .common import (
    add_output_arguments,
    add_table_argument,
    add_version_arguments,
    open_table_from_args,
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "snapshot",
        help="the active files of a table at a version",
        description="Print the table's state: a header (version, timestamp, metaData, protocol) "
        "then one record per active file.",
    )
    add_table_argument(p)
    add_version_arguments(p)
    add_output_arguments(p, ["jsonl", "parquet"], "jsonl")
    p.set_defaults(handler=cmd_snapshot)

    p = sub.add_parser("read", help="the rows of a table at a version", description="Print the table's rows.")
    add_table_argument(p)
    add_version_arguments(p)
    p.add_argument("--columns", metavar="A,B", help="only these columns, comma-separated")
    add_output_arguments(p, ["jsonl", "parquet", "csv"], "jsonl")
    p.set_defaults(handler=cmd_read)

    p = sub.add_parser(
        "history",
        help="every version with its resolved timestamp and operation",
        description="Per version still in the log: resolved commit timestamp and where it came from "
        "(ict, file-time, adjusted-file-time), operation and action counts.",
    )
    add_table_argument(p)
    p.add_argument(
        "--format", choices=["table", "jsonl"], default="table", help="output format (default table)"
    )
    p.add_argument("-o", "--output", metavar="PATH", help="write to PATH instead of stdout")
    p.set_defaults(handler=cmd_history)


def _snapshot(args: argparse.Namespace, check_features: bool) -> Any:
    table = open_table_from_args(args)
    return table.snapshot(version=args.version, timestamp=args.timestamp, check_features=check_features)


def cmd_snapshot(args: argparse.Namespace) -> int:
    from deltamirror.core.timestamps import format_iso

    from .output import batch_to_json_rows, open_output, write_jsonl

    snap = _snapshot(args, check_features=False)
    if args.format == "parquet":
        import pyarrow.parquet as pq

        with open_output(args.output) as out:
            meta = {
                b"deltamirror.version": str(snap.version).encode(),
                b"deltamirror.timestamp": format_iso(snap.timestamp.timestamp).encode(),
                b"deltamirror.metaData": snap.metadata.model_dump_json(
                    by_alias=True, exclude_unset=True
                ).encode(),
                b"deltamirror.protocol": snap.protocol.model_dump_json(
                    by_alias=True, exclude_unset=True
                ).encode(),
            }
            files = snap.files.replace_schema_metadata(meta)
            pq.write_table(files, out)
        return 0

    header = {
        "version": snap.version,
        "timestamp": format_iso(snap.timestamp.timestamp),
        "timestampSource": str(snap.timestamp.source),
        "metaData": snap.metadata.to_dict(),
        "protocol": snap.protocol.to_dict(),
        "numFiles": snap.files.num_rows,
    }

    def records() -> Iterator[dict[str, Any]]:
        yield header
        for batch in snap.files.to_batches(max_chunksize=10_000):
            for row in batch_to_json_rows(batch):
                yield {k: v for k, v in row.items() if v is not None}

    with open_output(args.output) as out:
        write_jsonl(records(), out)
    return 0


def cmd_read(args: argparse.Namespace) -> int:
    from deltamirror.core.schema import to_arrow_schema

    from .output import open_output, write_batches

    snap = _snapshot(args, check_features=True)
    columns = [c.strip() for c in args.columns.split(",")] if args.columns else None
    schema = to_arrow_schema(snap.schema)
    if columns is not None:
        from deltamirror.core.errors import InvalidArgumentError

        unknown = [c for c in columns if c not in schema.names]
        if unknown:
            raise InvalidArgumentError(f"no such column: {', '.join(unknown)}", table=snap.table.uri)
        schema = pa_select(schema, columns)
    with open_output(args.output) as out:
        write_batches(snap.iter_batches(columns), schema, args.format, out)
    return 0


def pa_select(schema: Any, columns: list[str]) -> Any:
    import pyarrow as pa

    return pa.schema([schema.field(c) for c in columns])


def cmd_history(args: argparse.Namespace) -> int:
    from deltamirror.core.timestamps import format_iso

    from .output import open_output, write_jsonl

    table = open_table_from_args(args)
    entries = table.history()
    with open_output(args.output) as out:
        if args.format == "jsonl":
            write_jsonl(
                (
                    {
                        "version": e.version,
                        "timestamp": format_iso(e.timestamp.timestamp),
                        "timestampSource": str(e.timestamp.source),
                        "operation": e.operation,
                        "actions": e.action_counts,
                        "commitInfo": e.commit_info.to_dict() if e.commit_info else None,
                    }
                    for e in entries
                ),
                out,
            )
            return 0
        out.write(f"{'VERSION':>8}  {'TIMESTAMP':<24}  {'SOURCE':<18}  {'OPERATION':<24}  ACTIONS\n".encode())
        for e in entries:
            counts = " ".join(f"{k}={v}" for k, v in sorted(e.action_counts.items()))
            line = (
                f"{e.version:>8}  {format_iso(e.timestamp.timestamp):<24}  {e.timestamp.source!s:<18}  "
                f"{(e.operation or '-'):<24}  {counts}\n"
            )
            out.write(line.encode())
    sys.stdout.flush()
    return 0
