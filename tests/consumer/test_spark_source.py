"""The Structured Streaming source over the mirror, against delta-spark's own streaming change feed.

Each table is written by delta-spark, mirrored by the real watcher into the real broker, and read
twice with the same trigger: by ``format("deltamirror")`` from Kafka, and by delta-spark's
``readStream.format("delta").option("readChangeFeed", "true")`` from the log. The rows must be equal,
``_commit_timestamp`` included, and a restarted query must read exactly the versions it has not.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from support.spark import spark  # noqa: F401
from support.spark_scenarios import CDF, DV, _create, _insert, _merge, _sql, normalize_cdf_rows
from support.watching import watch_until

pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.timeout(600)]


def _run(stream: Any, checkpoint: Path) -> list[dict[str, Any]]:
    """Everything the stream has now (trigger availableNow), as plain rows; the query then stops."""
    rows: list[dict[str, Any]] = []

    def collect(df: Any, _batch_id: int) -> None:
        rows.extend(r.asDict(recursive=True) for r in df.collect())

    query = (
        stream.writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    if query.exception() is not None:
        raise AssertionError(str(query.exception()))
    return rows


class Mirror:
    """A delta-spark table, its topics, and both streams over it."""

    def __init__(self, session: Any, bootstrap: str, root: Path) -> None:
        from deltamirror.consumer.spark_source import register

        register(session)
        self.spark = session
        self.bootstrap = bootstrap
        self.root = root
        self.path = str(root / "table")
        name = f"t-{uuid.uuid4().hex[:10]}"
        self.actions = f"{name}.actions"
        self.prefix = f"dm-{name}"

    def publish(self, version: int, **kw: Any) -> None:
        watch_until(
            self.bootstrap, self.path, self.actions, version, self.prefix, snapshot_mode="from-version", **kw
        )

    def ours(self, **options: Any) -> Any:
        reader = (
            self.spark.readStream.format("deltamirror")
            .option("kafka.bootstrap.servers", self.bootstrap)
            .option("actionsTopic", self.actions)
            .option("commitsTopic", self.actions.replace(".actions", ".commits"))
        )
        for key, value in options.items():
            reader = reader.option(key, str(value))
        return reader.load(self.path)

    def theirs(self, **options: Any) -> Any:
        reader = self.spark.readStream.format("delta").option("readChangeFeed", "true")
        for key, value in options.items():
            reader = reader.option(key, str(value))
        return reader.load(self.path)

    def both(self, name: str, **options: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        ours = _run(self.ours(**options), self.root / f"ours-{name}")
        theirs = _run(self.theirs(**options), self.root / f"theirs-{name}")
        return normalize_cdf_rows(ours), normalize_cdf_rows(theirs)


@pytest.fixture
def mirror(spark: Any, kafka_bootstrap: str, tmp_path: Path) -> Mirror:  # noqa: F811
    return Mirror(spark, kafka_bootstrap, tmp_path)


def _changes(m: Mirror) -> int:
    """Inserts, an UPDATE and a DELETE with deletion vectors, and a MERGE: versions 0-4."""
    _create(m.spark, m.path, CDF, DV, rows=(0, 12))
    _insert(m.spark, m.path, 12, 24)
    _sql(m.spark, m.path, "UPDATE {t} SET name = concat(name, '-u') WHERE id % 5 = 0")
    _sql(m.spark, m.path, "DELETE FROM {t} WHERE id IN (3, 13)")
    return _merge(m.spark, m.path)


def test_from_a_starting_version_then_restarted_matches_delta_spark(mirror: Mirror) -> None:
    last = _changes(mirror)
    mirror.publish(last)
    ours, theirs = mirror.both("a", startingVersion=0)
    assert theirs and {r["_change_type"] for r in theirs} >= {"insert", "delete", "update_preimage"}
    assert ours == theirs

    # new commits; both queries restart from their checkpoints and read only those
    _sql(mirror.spark, mirror.path, "UPDATE {t} SET amount = amount + 1 WHERE id > 15")
    last = _insert(mirror.spark, mirror.path, 100, 105)
    mirror.publish(last)
    ours, theirs = mirror.both("a", startingVersion=0)
    assert {r["_commit_version"] for r in theirs} == {last - 1, last}
    assert ours == theirs
    # and once more with nothing new: nothing is read twice
    assert mirror.both("a", startingVersion=0) == ([], [])


def test_without_a_starting_version_the_first_batch_is_the_table_as_inserts(mirror: Mirror) -> None:
    last = _changes(mirror)
    mirror.publish(last)
    ours, theirs = mirror.both("s")
    assert {(r["_change_type"], r["_commit_version"]) for r in theirs} == {("insert", last)}
    assert ours == theirs
    last = _sql(mirror.spark, mirror.path, "DELETE FROM {t} WHERE id < 10")
    mirror.publish(last)
    ours, theirs = mirror.both("s")
    assert ours == theirs and {r["_commit_version"] for r in ours} == {last}


def test_versions_spread_over_several_tasks_and_a_latest_start(mirror: Mirror) -> None:
    _create(mirror.spark, mirror.path, CDF)
    for lo in range(0, 50, 10):
        _insert(mirror.spark, mirror.path, lo, lo + 10)
    last = _sql(mirror.spark, mirror.path, "UPDATE {t} SET name = 'x' WHERE id % 7 = 0")
    mirror.publish(last)
    ours = normalize_cdf_rows(_run(mirror.ours(startingVersion=1, versionsPerPartition=2), mirror.root / "p"))
    theirs = normalize_cdf_rows(_run(mirror.theirs(startingVersion=1), mirror.root / "p-theirs"))
    assert ours == theirs and len({r["_commit_version"] for r in ours}) == last
    # "latest": only what is committed after the query starts
    assert _run(mirror.ours(startingVersion="latest"), mirror.root / "l") == []
    last = _insert(mirror.spark, mirror.path, 200, 203)
    mirror.publish(last)
    rows = _run(mirror.ours(startingVersion="latest"), mirror.root / "l")
    assert sorted(r["id"] for r in rows) == [200, 201, 202]


def _started(stream: Any, checkpoint: Path, rows: list[dict[str, Any]]) -> Any:
    def collect(df: Any, _batch_id: int) -> None:
        rows.extend(r.asDict(recursive=True) for r in df.collect())

    return stream.writeStream.foreachBatch(collect).option("checkpointLocation", str(checkpoint)).start()


def test_a_schema_change_while_running_fails_the_query_as_in_delta_spark(mirror: Mirror) -> None:
    _create(mirror.spark, mirror.path, CDF, rows=(0, 5))
    mirror.publish(0)
    ours_rows: list[dict[str, Any]] = []
    theirs_rows: list[dict[str, Any]] = []
    ours = _started(mirror.ours(startingVersion=0), mirror.root / "c", ours_rows)
    theirs = _started(mirror.theirs(startingVersion=0), mirror.root / "c-theirs", theirs_rows)
    try:
        ours.processAllAvailable()
        theirs.processAllAvailable()
        assert len(ours_rows) == len(theirs_rows) == 5
        _sql(mirror.spark, mirror.path, "ALTER TABLE {t} ADD COLUMNS (extra STRING)")
        last = _sql(mirror.spark, mirror.path, "INSERT INTO {t} SELECT 50, 'n', 1.0, 'e'")
        mirror.publish(last)
        with pytest.raises(Exception, match="DELTA_SCHEMA_CHANGED_WITH_VERSION"):
            ours.processAllAvailable()
        with pytest.raises(Exception, match="DELTA_SCHEMA_CHANGED"):
            theirs.processAllAvailable()
    finally:
        ours.stop()
        theirs.stop()
    # restarted, both read on with the new schema
    ours_after = normalize_cdf_rows(_run(mirror.ours(startingVersion=0), mirror.root / "c"))
    theirs_after = normalize_cdf_rows(_run(mirror.theirs(startingVersion=0), mirror.root / "c-theirs"))
    assert ours_after == theirs_after and [r["extra"] for r in ours_after] == ["e"]


def test_bad_options_are_refused_by_name(mirror: Mirror) -> None:
    _create(mirror.spark, mirror.path, CDF, rows=(0, 2))
    mirror.publish(0)
    with pytest.raises(Exception, match="startingVersion"):
        _run(mirror.ours(startingVersion="soon"), mirror.root / "bad")
    with pytest.raises(Exception, match=r"kafka\.bootstrap\.servers"):
        mirror.spark.readStream.format("deltamirror").load(mirror.path)
    with pytest.raises(Exception, match="DELTA_CDC_START_VERSION_AFTER_LATEST"):
        _run(mirror.ours(startingVersion=7), mirror.root / "after")
