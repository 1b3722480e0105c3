"""A small table with the change data feed whose versions exercise netting (delta-rs writes it)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa


def cdf_table(path: Path) -> int:
    """Versions 0-6 with CDF: inserts, updates, deletes, a row inserted and deleted inside the range
    (100), a row changed and changed back (5). Returns the latest version.

    Netted over 1..6 by ``id``: 0-2 updated, 3-4 deleted, 101 inserted; 100 and 5 nothing."""
    from deltalake import DeltaTable, write_deltalake

    data = pa.table({"id": pa.array(range(10), pa.int64()), "name": pa.array([f"n{i}" for i in range(10)])})
    write_deltalake(str(path), data, configuration={"delta.enableChangeDataFeed": "true"})  # v0
    dt = DeltaTable(str(path))
    dt.update(updates={"name": "'up'"}, predicate="id < 3")  # v1
    dt.delete("id = 3 OR id = 4")  # v2
    more = pa.table({"id": pa.array([100, 101], pa.int64()), "name": pa.array(["a", "b"])})
    write_deltalake(str(path), more, mode="append")  # v3
    dt = DeltaTable(str(path))
    dt.delete("id = 100")  # v4: 100 was inserted and deleted inside the range
    dt.update(updates={"name": "'tmp'"}, predicate="id = 5")  # v5
    dt.update(updates={"name": "'n5'"}, predicate="id = 5")  # v6: 5 is as it was
    return DeltaTable(str(path)).version()


def typed_cdf_table(path: Path) -> int:
    """Versions 0-2 with CDF, columns of logical types (decimal, timestamp, date) beside long and string:
    three rows inserted (one name null, dates and times both sides of the epoch), id 1 updated, id 2
    deleted. Returns the latest version."""
    import datetime as dt
    from decimal import Decimal

    from deltalake import DeltaTable, write_deltalake

    schema = pa.schema(
        [
            ("id", pa.int64()),
            ("name", pa.string()),
            ("amount", pa.decimal128(10, 2)),
            ("ts", pa.timestamp("us", tz="UTC")),
            ("day", pa.date32()),
        ]
    )
    rows = [
        {
            "id": i,
            "name": f"n{i}",
            "amount": Decimal(f"{i}.25") - 2,
            "ts": dt.datetime(1969, 12, 31, 23, 59, 59, 999_999, tzinfo=dt.UTC) + dt.timedelta(days=i),
            "day": dt.date(1969, 12, 30) + dt.timedelta(days=i),
        }
        for i in range(3)
    ]
    rows[2]["name"] = None  # a null in a nullable column
    write_deltalake(
        str(path),
        pa.Table.from_pylist(rows, schema=schema),
        configuration={"delta.enableChangeDataFeed": "true"},
    )
    table = DeltaTable(str(path))
    table.update(updates={"name": "'up'", "amount": "amount + 100"}, predicate="id = 1")  # v1
    table.delete("id = 2")  # v2
    return DeltaTable(str(path)).version()
