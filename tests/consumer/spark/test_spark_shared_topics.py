"""The Spark source over a discover prefix's shared topics (``topics: shared``): a stream of one
table reads that table's rows only, though the other table's records share the partition."""

from __future__ import annotations

import contextlib
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from support.spark import spark  # noqa: F401
from support.watching import shared_watch_settings

pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.timeout(600)]


def _write(path: Path, first: int, versions: int) -> None:
    from deltalake import write_deltalake

    for v in range(versions):
        ids = [first + 10 * v, first + 10 * v + 1]
        rows = pa.table({"id": pa.array(ids, pa.int64()), "name": pa.array([f"n{i}" for i in ids])})
        write_deltalake(str(path), rows, mode="append", configuration={"delta.enableChangeDataFeed": "true"})


def test_a_stream_of_one_table_on_shared_topics_reads_its_rows_only(
    spark: Any,  # noqa: F811
    kafka_bootstrap: str,
    tmp_path: Path,
) -> None:
    from deltamirror.consumer.mirror_changes import MirrorIndex, MirrorSettings
    from deltamirror.consumer.spark.source import register
    from deltamirror.mirror.errors import KafkaError
    from deltamirror.producer.service import WatchService
    from deltamirror.producer.settings import WatchConfig

    lake = tmp_path / "lake"
    _write(lake / "a", 100, 3)
    _write(lake / "b", 500, 2)
    name = f"sp-{uuid.uuid4().hex[:8]}"
    cfg = WatchConfig.model_validate(shared_watch_settings(kafka_bootstrap, lake, name))
    topics = f"deltamirror.{name}"
    service = WatchService(cfg, stop_budget_s=5.0)
    service.start()
    try:
        for table, versions in (("a", 3), ("b", 2)):  # every version of both tables published
            index = MirrorIndex(
                MirrorSettings(kafka_bootstrap, f"{topics}.actions", f"{topics}.commits", str(lake / table))
            )
            deadline = time.monotonic() + 120
            while index.latest != versions - 1:
                assert time.monotonic() < deadline, f"{table}: the watcher published up to {index.latest}"
                time.sleep(0.2)
                with contextlib.suppress(KafkaError):  # the topics are not created yet
                    index.refresh()
        register(spark)
        got: dict[str, list[tuple[int, str, int]]] = {}
        for table in ("a",):  # one query: a stream's start is most of this test's time
            rows: list[Any] = []

            def collect(df: Any, _id: int, rows: list[Any] = rows) -> None:
                rows.extend(df.collect())

            query = (
                spark.readStream.format("deltamirror")
                .option("kafka.bootstrap.servers", kafka_bootstrap)
                .option("actionsTopic", f"{topics}.actions")
                .option("commitsTopic", f"{topics}.commits")
                .option("startingVersion", 0)
                .load(str(lake / table))
                .writeStream.foreachBatch(collect)
                .option("checkpointLocation", str(tmp_path / f"cp-{table}"))
                .trigger(availableNow=True)
                .start()
            )
            query.awaitTermination()
            assert query.exception() is None, str(query.exception())
            got[table] = sorted((r["id"], r["_change_type"], r["_commit_version"]) for r in rows)
    finally:
        service.request_stop()
        assert service.wait(30), "the watcher did not stop"
        service.close()
    assert got["a"] == [(100 + 10 * v + i, "insert", v) for v in range(3) for i in (0, 1)]
