"""``snapshot``, ``read`` and ``history``: looking at a table without Kafka."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from typing import Any

from .common import (
    OUTPUT_HELP,
    add_output_arguments,
    add_table_argument,
    add_version_arguments,
    open_table_from_args,
    parse_columns,
)
from .progress import ProgressLine, add_progress_argument, wanted


def _add_snapshot(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "snapshot",
        help="the active files of a table at a version",
        description="Print the table's state: a header (version, timestamp, timestampSource, "
        "metaData, protocol, numFiles) then one record per active file. With --format parquet the "
        "header is in the file's metadata (deltamirror.version, deltamirror.timestamp, ...). On a "
        "terminal, stderr shows the log files read and the files written.",
    )
    add_table_argument(p)
    add_version_arguments(p)
    add_output_arguments(p, ["jsonl", "parquet"], "jsonl")
    add_progress_argument(p)
    p.set_defaults(handler=cmd_snapshot)


def _add_read(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "read",
        help="the rows of a table at a version",
        description="Print the table's rows. Timestamps print as 2026-01-01T00:00:05.500Z in jsonl and "
        "csv (timestamp_ntz without the Z). csv cannot hold struct, array or map columns: choose "
        "the others with --columns, or use jsonl or parquet.",
    )
    add_table_argument(p)
    add_version_arguments(p)
    p.add_argument("--columns", metavar="A,B", help="only these columns, comma-separated (each once)")
    add_output_arguments(p, ["jsonl", "parquet", "csv"], "jsonl")
    add_progress_argument(p)
    p.set_defaults(handler=cmd_read)


def _add_history(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "history",
        help="every version with its resolved timestamp and operation",
        description="Per commit file still in the log, oldest first: resolved commit timestamp and "
        "where it came from (ict, file-time, adjusted-file-time), operation and action counts. A "
        "commit missing between the first and the last, or an empty one, is an error (exit 2), as "
        "is a table whose protocol `read` refuses.",
    )
    add_table_argument(p, reads_named_files=False)  # commit files only: nothing outside to allow
    p.add_argument(
        "--format", choices=["table", "jsonl"], default="table", help="output format (default table)"
    )
    p.add_argument("-o", "--output", metavar="PATH", help=OUTPUT_HELP)
    p.set_defaults(handler=cmd_history)


#: each command of this module and what adds its parser (build_parser takes the one that runs)
PARSERS = {
    "snapshot": _add_snapshot,
    "read": _add_read,
    "history": _add_history,
}


def _snapshot(args: argparse.Namespace, check_features: bool, line: ProgressLine) -> Any:
    table = open_table_from_args(args)
    return table.snapshot(
        version=args.version,
        timestamp=args.timestamp,
        check_features=check_features,
        progress=line.callback("reading the log", "files"),
    )


def cmd_snapshot(args: argparse.Namespace) -> int:
    with ProgressLine(wanted(args)) as line:
        snap = _snapshot(args, check_features=True, line=line)  # refuses what `read` refuses
        _write_snapshot(args, snap, line)
    return 0


def _write_snapshot(args: argparse.Namespace, snap: Any, line: ProgressLine) -> None:
    from deltamirror.core.timestamps import format_iso

    from .output import batch_to_json_rows, open_output, write_jsonl

    if args.format == "parquet":
        import pyarrow.parquet as pq

        with open_output(args.output) as out:
            meta = {
                b"deltamirror.version": str(snap.version).encode(),
                b"deltamirror.timestamp": format_iso(snap.timestamp.timestamp).encode(),
                b"deltamirror.timestampSource": str(snap.timestamp.source).encode(),
                b"deltamirror.metaData": snap.metadata.model_dump_json(
                    by_alias=True, exclude_unset=True
                ).encode(),
                b"deltamirror.protocol": snap.protocol.model_dump_json(
                    by_alias=True, exclude_unset=True
                ).encode(),
            }
            files = snap.files.replace_schema_metadata(meta)
            pq.write_table(files, out)
        return

    header = {
        "version": snap.version,
        "timestamp": format_iso(snap.timestamp.timestamp),
        "timestampSource": str(snap.timestamp.source),
        "metaData": snap.metadata.to_dict(),
        "protocol": snap.protocol.to_dict(),
        "numFiles": snap.files.num_rows,
    }

    total = snap.files.num_rows
    progress = line.callback("writing", "files")

    def records() -> Iterator[dict[str, Any]]:
        yield header
        done = 0
        for batch in snap.files.to_batches(max_chunksize=10_000):
            if progress is not None:
                progress(done, total)
            for row in batch_to_json_rows(batch):
                yield {k: v for k, v in row.items() if v is not None}
            done += batch.num_rows

    with open_output(args.output) as out:
        write_jsonl(records(), out)


def cmd_read(args: argparse.Namespace) -> int:
    from deltamirror.core.arguments import select_columns
    from deltamirror.core.schema import to_arrow_schema

    from .output import check_csv_schema, open_output, write_batches

    columns = parse_columns(args.columns)
    with ProgressLine(wanted(args)) as line:
        snap = _snapshot(args, check_features=True, line=line)
    # the columns as the library matches them (case-insensitively, each once), in the order asked
    selected = select_columns(snap.schema, columns, snap.table.uri)
    schema = to_arrow_schema(snap.schema)
    if selected is not None:
        schema = pa_select(schema, selected)
    if args.format == "csv":
        check_csv_schema(schema)
    with open_output(args.output) as out:
        write_batches(snap.iter_batches(selected), schema, args.format, out)
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
