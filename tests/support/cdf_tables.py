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
