#!/usr/bin/env python3
"""Create the small Delta table the docker-compose demo mirrors: four versions, change data feed on.

    python scripts/make_demo_table.py /data/demo

Version 0 creates the table (three orders), 1 appends two, 2 updates one, 3 deletes one, so a
subscriber sees add, remove and cdc actions. The table is written by delta-rs (``deltalake``), an
independent Delta writer, rather than by deltamirror itself. If a table already exists at the path
it is left untouched (exit 0): the compose service runs on every ``docker compose up``, and the
watcher already mirrors that table.
"""

from __future__ import annotations

import argparse
import sys
from datetime import date

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

SCHEMA = pa.schema(
    [
        pa.field("order_id", pa.int64(), nullable=False),
        pa.field("customer", pa.string()),
        pa.field("amount", pa.decimal128(10, 2)),
        pa.field("status", pa.string()),
        pa.field("order_date", pa.date32()),
    ]
)


def _orders(rows: list[tuple[int, str, str, str, date]]) -> pa.Table:
    from decimal import Decimal

    columns = list(zip(*rows, strict=True))
    return pa.table(
        {
            "order_id": pa.array(columns[0], pa.int64()),
            "customer": pa.array(columns[1], pa.string()),
            "amount": pa.array([Decimal(a) for a in columns[2]], pa.decimal128(10, 2)),
            "status": pa.array(columns[3], pa.string()),
            "order_date": pa.array(columns[4], pa.date32()),
        },
        schema=SCHEMA,
    )


def make_demo_table(path: str) -> bool:
    """Create the table; False when one already exists there (nothing is written)."""
    if DeltaTable.is_deltatable(path):
        return False
    write_deltalake(
        path,
        _orders(
            [
                (1, "ada", "19.99", "placed", date(2026, 1, 5)),
                (2, "grace", "5.00", "placed", date(2026, 1, 5)),
                (3, "linus", "42.50", "placed", date(2026, 1, 6)),
            ]
        ),
        mode="error",
        name="demo_orders",
        description="deltamirror demo table",
        configuration={"delta.enableChangeDataFeed": "true"},
    )
    write_deltalake(
        path,
        _orders(
            [
                (4, "barbara", "12.00", "placed", date(2026, 1, 7)),
                (5, "ken", "7.25", "placed", date(2026, 1, 7)),
            ]
        ),
        mode="append",
    )
    table = DeltaTable(path)
    table.update(updates={"status": "'shipped'"}, predicate="order_id = 1")
    table.delete(predicate="order_id = 2")
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("path", help="where to create the table (a local path)")
    args = parser.parse_args(argv)
    if make_demo_table(args.path):
        version = DeltaTable(args.path).version()
        print(f"created demo table at {args.path} (versions 0..{version})")
    else:
        print(f"a Delta table already exists at {args.path}; left as it is")
    return 0


if __name__ == "__main__":
    sys.exit(main())
