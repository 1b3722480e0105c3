"""``changes``: a table's change data feed between two versions or timestamps, as delta-spark reads it."""

from __future__ import annotations

import argparse

from .common import add_output_arguments, add_table_argument, open_table_from_args, parse_columns
from .progress import ProgressLine, add_progress_argument, wanted


def _add_changes(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "changes",
        help="the change data feed (row-level changes) of a table",
        description="Print the rows that changed between two versions (both inclusive), each with "
        "_change_type (insert, delete, update_preimage, update_postimage), _commit_version and "
        "_commit_timestamp, with delta-spark's semantics. The table needs "
        "delta.enableChangeDataFeed=true over the whole range. Timestamps print as "
        "2026-01-01T00:00:05.500Z in jsonl and csv; csv cannot hold struct, array or map columns. "
        "On a terminal, stderr shows the versions read.",
    )
    add_table_argument(p)
    start = p.add_mutually_exclusive_group(required=True)
    start.add_argument("--starting-version", type=int, metavar="N", help="first version to read")
    start.add_argument(
        "--starting-timestamp",
        metavar="TS",
        help="start at the first commit at or after TS (ISO-8601, e.g. 2026-01-01T00:00:05.500Z)",
    )
    end = p.add_mutually_exclusive_group()
    end.add_argument("--ending-version", type=int, metavar="M", help="last version to read (default: latest)")
    end.add_argument("--ending-timestamp", metavar="TS", help="end at the last commit at or before TS")
    p.add_argument(
        "--columns",
        metavar="A,B",
        help="only these table columns, comma-separated, in this order (partition columns too); only "
        "they are read from the data files. The CDF columns always follow. A name the table does not "
        "have is refused before any row is read",
    )
    p.add_argument(
        "--row-ids",
        action="store_true",
        help="also _row_id and _row_commit_version after the CDF columns, as delta-spark's "
        "_metadata.row_id and _metadata.row_commit_version give them (tables with row tracking, "
        "delta.enableRowTracking=true, only; refused otherwise). They are read from data files: "
        "a version with change data files is read from its data files, matched by row id",
    )
    p.add_argument(
        "--net",
        action="store_true",
        help="one row per changed row: what the range did to it (insert, delete, or an update's "
        "pre- and post-image), nothing for a row inserted and deleted inside it; rows are told "
        "apart by --key, else by all their values",
    )
    p.add_argument(
        "--key",
        metavar="A,B",
        help="with --net: the columns that identify a row (unique at every version; with --row-ids "
        "the default is _row_id)",
    )
    add_output_arguments(p, ["jsonl", "parquet", "csv"], "jsonl")
    add_progress_argument(p)
    p.set_defaults(handler=cmd_changes)


#: each command of this module and what adds its parser (build_parser takes the one that runs)
PARSERS = {
    "changes": _add_changes,
}


def cmd_changes(args: argparse.Namespace) -> int:
    from deltamirror.core.changes import read_changes
    from deltamirror.core.errors import InvalidArgumentError

    from .output import check_csv_schema, open_output, write_batches

    if args.key is not None and not args.net:
        raise InvalidArgumentError("--key names the columns --net tells rows apart by: give --net too")
    table = open_table_from_args(args)
    columns = parse_columns(args.columns)
    keys = parse_columns(args.key, "--key")
    if args.row_ids and args.net and keys is None:  # a row id is what identifies a row
        from deltamirror.core.changes import ROW_ID

        keys = [ROW_ID]
    with ProgressLine(wanted(args)) as line:
        feed = read_changes(
            table,
            starting_version=args.starting_version,
            starting_timestamp=args.starting_timestamp,
            ending_version=args.ending_version,
            ending_timestamp=args.ending_timestamp,
            columns=columns,
            progress=line.callback("changes", "versions"),
            row_ids=args.row_ids,
        )
        if args.format == "csv":
            check_csv_schema(feed.schema)
        if args.net:  # the whole range is read before a row can be told: then written at once
            from deltamirror.core.changes import net_changes

            net = net_changes(feed, keys, schema=feed.schema, table=table.uri)
            with open_output(args.output) as out:
                write_batches(net.to_batches(), net.schema, args.format, out)
            return 0
        with open_output(args.output) as out:
            write_batches(feed, feed.schema, args.format, out)
    return 0
