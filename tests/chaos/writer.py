"""The campaign's writer: delta-rs (the ``deltalake`` package) committing a seeded mix of operations.

Every table is created by :meth:`Writer.create` (version 0: partitioned by ``bucket``, change data
feed on, ``id`` unique, so that row changes pair updates by key). Each :meth:`Writer.step` commits
one operation to one table, chosen by the writer's own seeded random generator:

- ``append``: 1-20 rows in one file;
- ``large-append``: 2,000-6,000 rows over 60-300 buckets, one file each (a version of many actions);
- ``update`` / ``delete``: rows whose ``id`` falls in a seeded residue class (with the change data
  feed on, the version has ``cdc`` files: updates give pre- and post-images);
- ``optimize``: ``OPTIMIZE`` (compaction: removes and adds with ``dataChange: false``);
- ``metadata``: a table property set (a ``metaData`` action);
- ``app-txn``: an append carrying an application transaction (a ``txn`` action).

A thread (:meth:`Writer.run_until`) commits until its stop event is set; the writer never runs two
operations at once on one table (delta-rs writes with optimistic concurrency, and a lost race is a
failed operation here, not a campaign fault).
"""

from __future__ import annotations

import random
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

OPERATIONS = {
    "append": 30,
    "large-append": 8,
    "update": 15,
    "delete": 8,
    "optimize": 4,
    "metadata": 5,
    "app-txn": 10,
}
CDF = {"delta.enableChangeDataFeed": "true"}


@dataclass
class Writer:
    tables: list[Path]
    seed: int
    #: largest pause between two commits (seconds; each pause drawn from the writer's generator)
    max_pause_s: float = 0.3
    #: weights of the operations (a class may favour large versions)
    weights: dict[str, int] = field(default_factory=lambda: dict(OPERATIONS))
    committed: Counter[str] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self._next_id: dict[Path, int] = {}
        self._lock = threading.Lock()

    def _rows(self, table: Path, n: int, buckets: int) -> pa.Table:
        start = self._next_id.get(table, 0)
        self._next_id[table] = start + n
        ids = list(range(start, start + n))
        return pa.table(
            {
                "id": pa.array(ids, pa.int64()),
                "bucket": pa.array([i % buckets for i in ids], pa.int32()),
                "name": pa.array([f"n{i}" for i in ids]),
                "amount": pa.array([i * 0.5 for i in ids], pa.float64()),
            }
        )

    def create(self) -> None:
        """Version 0 of every table: a few rows, partitioned by bucket, change data feed on."""
        from deltalake import write_deltalake

        for table in self.tables:
            write_deltalake(
                str(table), self._rows(table, 8, 4), partition_by=["bucket"], configuration=CDF, mode="error"
            )

    def step(self, table: Path | None = None, operation: str | None = None) -> tuple[Path, str]:
        """Commit one operation (seeded unless given); returns what was committed."""
        with self._lock:
            table = table if table is not None else self.rng.choice(self.tables)
            if operation is None:
                names = list(self.weights)
                operation = self.rng.choices(names, [self.weights[n] for n in names])[0]
            self._commit(table, operation)
            self.committed[operation] += 1
            return table, operation

    def _commit(self, table: Path, operation: str) -> None:
        from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

        rng = self.rng
        if operation == "append":
            write_deltalake(str(table), self._rows(table, rng.randint(1, 20), 8), mode="append")
        elif operation == "large-append":
            buckets = rng.randint(60, 300)
            write_deltalake(str(table), self._rows(table, rng.randint(2000, 6000), buckets), mode="append")
        elif operation == "app-txn":
            txn = Transaction(app_id=f"chaos-{rng.randrange(3)}", version=self.committed["app-txn"] + 1)
            write_deltalake(
                str(table),
                self._rows(table, rng.randint(1, 5), 8),
                mode="append",
                commit_properties=CommitProperties(app_transactions=[txn]),
            )
        elif operation == "update":
            modulus = rng.randint(5, 40)
            DeltaTable(str(table)).update(
                updates={"name": f"'u{rng.randrange(10**6)}'", "amount": "amount + 1"},
                predicate=f"id % {modulus} = {rng.randrange(modulus)}",
            )
        elif operation == "delete":
            modulus = rng.randint(20, 80)
            DeltaTable(str(table)).delete(predicate=f"id % {modulus} = {rng.randrange(modulus)}")
        elif operation == "optimize":
            DeltaTable(str(table)).optimize.compact()
        elif operation == "metadata":
            days = rng.randint(30, 90)
            DeltaTable(str(table)).alter.set_table_properties(
                {"delta.logRetentionDuration": f"interval {days} days"}
            )
        else:
            raise ValueError(f"unknown operation {operation}")

    def run_until(self, stop: threading.Event) -> threading.Thread:
        """Commit in a thread until ``stop`` is set (a seeded pause between commits)."""

        def loop() -> None:
            while not stop.is_set():
                try:
                    self.step()
                except Exception as exc:  # delta-rs refusing an operation: said in the report
                    self.errors.append(f"{type(exc).__name__}: {exc}")
                    if len(self.errors) > 20:
                        return
                stop.wait(self.rng.uniform(0, self.max_pause_s))

        thread = threading.Thread(target=loop, name="chaos-writer", daemon=True)
        thread.start()
        return thread
