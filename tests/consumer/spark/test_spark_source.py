"""The Structured Streaming source over the mirror, against delta-spark's own streaming change feed.

Each table is written by delta-spark, mirrored by the real watcher into the real broker, and read
twice with the same trigger: by ``format("deltamirror")`` from Kafka, and by delta-spark's
``readStream.format("delta").option("readChangeFeed", "true")`` from the log. The rows must be equal,
``_commit_timestamp`` included, and a restarted query must read exactly the versions it has not.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import uuid
from pathlib import Path
from typing import Any

import pytest

from support.spark import spark  # noqa: F401
from support.spark_scenarios import (
    CDF,
    CDF_META_COLUMNS,
    CM_NAME,
    DV,
    _create,
    _insert,
    _merge,
    _sql,
    commit_actions,
    normalize_cdf_rows,
    spark_cdf_error,
)
from support.watching import watch_until

pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.timeout(600)]


def _run(stream: Any, checkpoint: Path) -> list[dict[str, Any]]:
    """Everything the stream has now (trigger availableNow), as plain rows; the query then stops."""
    return [row for batch in _batches(stream, checkpoint) for row in batch]


def _batches(stream: Any, checkpoint: Path) -> list[list[dict[str, Any]]]:
    """Everything the stream has now (trigger availableNow), one list of rows per non-empty micro-batch."""
    batches: list[list[dict[str, Any]]] = []

    def collect(df: Any, _batch_id: int) -> None:
        rows = [r.asDict(recursive=True) for r in df.collect()]
        if rows:
            batches.append(rows)

    query = (
        stream.writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    if query.exception() is not None:
        raise AssertionError(str(query.exception()))
    return batches


class Mirror:
    """A delta-spark table, its topics, and both streams over it."""

    def __init__(self, session: Any, bootstrap: str, root: Path) -> None:
        from deltamirror.consumer.spark.source import register

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

    # netChanges: each micro-batch's net changes are those of a replay of delta-spark's feed
    netted = _net_batches(mirror, startingVersion=0, keyColumns="id", maxFilesPerTrigger=6)
    assert len(netted) > 1 and [v for versions, _ in netted for v in versions] == list(range(last + 1))
    for versions, rows in netted:
        full = [r for r in theirs if r["_commit_version"] in versions]
        assert normalize_cdf_rows(rows) == normalize_cdf_rows(_net_by_replay(full, "id"))
    kinds = {r["_change_type"] for _, rows in netted for r in rows}
    assert kinds == {"insert", "delete", "update_preimage", "update_postimage"}
    with pytest.raises(Exception, match="option keyColumns names 'nope'"):
        mirror.ours(netChanges="true", keyColumns="nope")

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

    # two files a micro-batch: versions 1-5 add one file each, the UPDATE writes a change data file
    # per file it rewrote; its version is never split, as in delta-spark, whose batches are the same.
    # skipChangeCommits changes nothing in a change feed, in delta-spark as here
    limited = {"startingVersion": 1, "maxFilesPerTrigger": 2, "skipChangeCommits": "true"}
    ours_batches = _batches(mirror.ours(**limited), mirror.root / "m")
    theirs_batches = _batches(mirror.theirs(**limited), mirror.root / "m-theirs")
    assert [_versions(b) for b in ours_batches] == [_versions(b) for b in theirs_batches]
    assert [_versions(b) for b in ours_batches] == [[1, 2], [3, 4], [5], [last]]
    assert normalize_cdf_rows(r for b in ours_batches for r in b) == theirs

    # startingTimestamp: the first commit at or after it (version 3's commit time, from its file)
    at = os.stat(Path(mirror.path) / "_delta_log" / f"{3:020d}.json").st_mtime_ns // 1_000_000
    when = dt.datetime.fromtimestamp(at / 1000, dt.UTC).isoformat(timespec="milliseconds")
    ours, theirs = mirror.both("t", startingTimestamp=when)
    assert ours == theirs and min(r["_commit_version"] for r in ours) == 3
    # "latest": only what is committed after the query starts
    assert _run(mirror.ours(startingVersion="latest"), mirror.root / "l") == []
    last = _insert(mirror.spark, mirror.path, 200, 203)
    mirror.publish(last)
    rows = _run(mirror.ours(startingVersion="latest"), mirror.root / "l")
    assert sorted(r["id"] for r in rows) == [200, 201, 202]


def _versions(rows: list[dict[str, Any]]) -> list[int]:
    return sorted({r["_commit_version"] for r in rows})


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


def test_the_columns_option_is_delta_sparks_stream_with_the_same_select(mirror: Mirror) -> None:
    """Spark's column pruning does not reach a Python data source: ``columns`` is the projection.
    Partitioned, column mapping name mode, deletion vectors, change data files (UPDATE, MERGE)."""
    session, path = mirror.spark, mirror.path
    _create(session, path, CDF, DV, CM_NAME, partitioned=True)  # CTAS + CDF + column mapping is refused
    _insert(session, path, 0, 12, partitioned=True)
    _insert(session, path, 12, 24, partitioned=True)
    _sql(session, path, "UPDATE {t} SET amount = amount + 1 WHERE id % 5 = 0")
    _sql(session, path, "DELETE FROM {t} WHERE id IN (3, 13)")
    last = _merge(session, path, partitioned=True)
    mirror.publish(last)
    cdf = list(CDF_META_COLUMNS)

    select = ["amount", "part"]
    ours = _run(mirror.ours(startingVersion=0, columns=",".join(select)), mirror.root / "c")
    theirs = _run(mirror.theirs(startingVersion=0).select(*select, *cdf), mirror.root / "c-theirs")
    assert ours and list(ours[0]) == [*select, *cdf]
    assert {r["_change_type"] for r in theirs} == {"insert", "delete", "update_preimage", "update_postimage"}
    assert normalize_cdf_rows(ours) == normalize_cdf_rows(theirs)

    # no starting version: the first micro-batch is the table as inserts, projected alike
    select = ["part", "id"]
    ours = _run(mirror.ours(columns="part,id"), mirror.root / "s")
    theirs = _run(mirror.theirs().select(*select, *cdf), mirror.root / "s-theirs")
    assert ours and list(ours[0]) == [*select, *cdf]
    assert normalize_cdf_rows(ours) == normalize_cdf_rows(theirs)

    # a column the table does not have: load() fails naming it, before any micro-batch
    with pytest.raises(Exception, match="no column 'nope'"):
        mirror.ours(startingVersion=0, columns="id,nope")


def _error(stream: Any, checkpoint: Path) -> str:
    with pytest.raises(Exception) as err:
        _run(stream(), checkpoint)
    return str(err.value)


def test_bad_options_are_refused_by_name_and_bad_starts_as_in_delta_spark(mirror: Mirror) -> None:
    _create(mirror.spark, mirror.path, CDF, rows=(0, 2))
    mirror.publish(0)
    with pytest.raises(Exception, match="startingVersion"):
        _run(mirror.ours(startingVersion="soon"), mirror.root / "bad")
    with pytest.raises(Exception, match=r"kafka\.bootstrap\.servers"):
        mirror.spark.readStream.format("deltamirror").load(mirror.path)
    with pytest.raises(Exception, match="unknown option 'startingversoin'"):
        mirror.ours(startingVersoin=0)
    # the same error class as delta-spark's stream for each bad start (latest + 1 included)
    bad_starts: list[tuple[dict[str, Any], str]] = [
        ({"startingVersion": 1}, "DELTA_VERSION_NOT_FOUND"),
        ({"startingVersion": 7}, "DELTA_VERSION_NOT_FOUND"),
        ({"startingTimestamp": "2099-01-01"}, "DELTA_TIMESTAMP_GREATER_THAN_COMMIT"),
        (
            {"startingVersion": 0, "startingTimestamp": "2020-01-01"},
            "DELTA_STARTING_VERSION_AND_TIMESTAMP_BOTH_SET",
        ),
    ]
    for i, (options, error_class) in enumerate(bad_starts):
        assert error_class in _error(lambda: mirror.ours(**options), mirror.root / f"o{i}")  # noqa: B023
        assert error_class in _error(lambda: mirror.theirs(**options), mirror.root / f"t{i}")  # noqa: B023


def test_widened_columns_stream_widened_while_the_batch_feed_refuses_them(mirror: Mirror) -> None:
    """INT->BIGINT, SMALLINT->INT, DECIMAL(6,2)->(12,4), FLOAT->DOUBLE after rows were written: delta-spark's
    stream reads the old rows widened, its batch change feed refuses the range; both, here too."""
    from deltamirror.core.errors import IncompatibleSchemaChangeError
    from deltamirror.core.table import open_table

    session, t = mirror.spark, f"delta.`{mirror.path}`"
    session.sql(
        f"CREATE TABLE {t} (id INT, s SMALLINT, d DECIMAL(6,2), f FLOAT) USING delta "
        f"TBLPROPERTIES ({CDF}, 'delta.enableTypeWidening' = 'true')"
    )
    session.sql(f"INSERT INTO {t} VALUES (1, 2, 1234.56, 1.5), (2, -3, -0.01, -0.25)")
    for column, wider in (("id", "BIGINT"), ("s", "INT"), ("d", "DECIMAL(12,4)"), ("f", "DOUBLE")):
        session.sql(f"ALTER TABLE {t} ALTER COLUMN {column} TYPE {wider}")
    last = _sql(session, mirror.path, "INSERT INTO {t} VALUES (5000000000, 70000, 12345678.1234, 1e300)")
    mirror.publish(last)
    ours, theirs = mirror.both("w", startingVersion=0)
    assert ours == theirs
    assert [(r["id"], r["d"]) for r in ours] == [
        (1, "1234.5600"),
        (2, "-0.0100"),
        (5000000000, "12345678.1234"),
    ]
    assert (
        spark_cdf_error(session, mirror.path, start=0) == "DELTA_CHANGE_DATA_FEED_INCOMPATIBLE_SCHEMA_CHANGE"
    )
    with pytest.raises(IncompatibleSchemaChangeError):
        open_table(mirror.path).changes(starting_version=0)


def test_a_vacuumed_data_file_fails_the_stream_or_is_skipped_with_fail_on_data_loss(mirror: Mirror) -> None:
    _create(mirror.spark, mirror.path, CDF, rows=(0, 10))
    _insert(mirror.spark, mirror.path, 10, 20)
    last = _sql(mirror.spark, mirror.path, "UPDATE {t} SET name = 'u' WHERE id < 5")
    mirror.publish(last)
    # the file version 0 added, removed by the UPDATE, is gone as VACUUM would delete it
    (gone,) = [a["add"]["path"] for a in commit_actions(mirror.path, 0) if "add" in a]
    os.remove(Path(mirror.path) / gone)
    message = _error(lambda: mirror.ours(startingVersion=0), mirror.root / "f")
    assert "missing" in message and gone in message and "failOnDataLoss" in message
    ours = normalize_cdf_rows(_run(mirror.ours(startingVersion=0, failOnDataLoss="false"), mirror.root / "s"))
    theirs = normalize_cdf_rows(_run(mirror.theirs(startingVersion=1), mirror.root / "s-theirs"))
    assert ours == theirs and {r["_commit_version"] for r in ours} == {1, last}


def _shallow_clone(source: Path, clone: Path) -> None:
    """``clone``: a table whose log is ``source``'s, its file actions naming ``source``'s files by
    absolute URI, as a shallow clone's log names its source's files."""
    (clone / "_delta_log").mkdir(parents=True)
    for commit in sorted((source / "_delta_log").glob("*.json")):
        lines = []
        for line in commit.read_text().splitlines():
            action = json.loads(line)
            for kind in ("add", "remove", "cdc"):
                if kind in action:
                    action[kind]["path"] = f"file://{source}/{action[kind]['path']}"
            lines.append(json.dumps(action))
        (clone / "_delta_log" / commit.name).write_text("\n".join(lines) + "\n")


def test_a_shallow_clone_reads_through_the_source_with_allow_path_prefixes(
    spark: Any,  # noqa: F811
    kafka_bootstrap: str,
    tmp_path: Path,
) -> None:
    from deltamirror.consumer.spark.source import register
    from deltamirror.core.table import open_table
    from support.tables import copy_table

    source = copy_table("krs__cdf-table-partitioned", tmp_path / "src")
    clone = tmp_path / "clone"
    _shallow_clone(source, clone)
    latest = open_table(str(source)).latest_version()
    actions = f"clone-{uuid.uuid4().hex[:10]}.actions"
    watch_until(
        kafka_bootstrap,
        clone,
        actions,
        latest,
        f"dm-{actions}",
        snapshot_mode="from-version",
        from_version=0,
        allowed_path_prefixes=[str(source)],
    )
    register(spark)

    def stream(**options: str) -> Any:
        reader = (
            spark.readStream.format("deltamirror")
            .option("kafka.bootstrap.servers", kafka_bootstrap)
            .option("actionsTopic", actions)
            .option("commitsTopic", actions.replace(".actions", ".commits"))
            .option("startingVersion", "0")
        )
        for key, value in options.items():
            reader = reader.option(key, value)
        return reader.load(str(clone))

    def rows(found: list[dict[str, Any]]) -> list[str]:
        return sorted(
            json.dumps({k: v for k, v in r.items() if k != "_commit_timestamp"}, default=str) for r in found
        )

    expected = open_table(str(source)).changes(starting_version=0).to_arrow().to_pylist()
    got = _run(stream(allowPathPrefixes=str(source)), tmp_path / "with")
    assert expected and rows(got) == rows(expected)
    with pytest.raises(Exception, match="outside the table root"):  # the query's error, as Spark raises it
        _run(stream(), tmp_path / "without")


def test_the_row_ids_option_streams_delta_spark_row_ids(
    spark: Any,  # noqa: F811
    kafka_bootstrap: str,
    tmp_path: Path,
) -> None:
    """rowIds through Spark: the rows of a delta-spark row-tracking table (tests/data/corpus, whose
    row ids the fast tests hold against delta-spark's _metadata.row_id) with their row ids, projected
    by ``columns``, the same as read_changes gives them."""
    import shutil

    from deltamirror.consumer.spark.source import register
    from deltamirror.core.table import open_table
    from support.corpus import CORPUS

    table = tmp_path / "t"
    shutil.copytree(CORPUS / "tables" / "spark__row_ids_dv", table)
    latest = open_table(str(table)).latest_version()
    actions = f"rowids-{uuid.uuid4().hex[:10]}.actions"
    watch_until(
        kafka_bootstrap, table, actions, latest, f"dm-{actions}", snapshot_mode="from-version", from_version=0
    )
    register(spark)
    stream = (
        spark.readStream.format("deltamirror")
        .option("kafka.bootstrap.servers", kafka_bootstrap)
        .option("actionsTopic", actions)
        .option("commitsTopic", actions.replace(".actions", ".commits"))
        .option("startingVersion", "0")
        .option("columns", "name")
        .option("rowIds", "true")
        .load(str(table))
    )
    got = _run(stream, tmp_path / "cp")
    assert got and list(got[0]) == ["name", *CDF_META_COLUMNS, "_row_id", "_row_commit_version"]
    expected = open_table(str(table)).changes(starting_version=0, columns=["name"], row_ids=True).to_arrow()
    assert normalize_cdf_rows(got) == normalize_cdf_rows(expected.to_pylist())


def _net_by_replay(rows: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    """The net changes of delta-spark's change rows, by replaying them per key: the state before
    (a key's first change removes it) and after (its last change adds it)."""
    removes = {"delete", "update_preimage"}
    ordered = sorted(rows, key=lambda r: (r["_commit_version"], r["_change_type"] not in removes))
    before: dict[Any, dict[str, Any] | None] = {}
    after: dict[Any, dict[str, Any] | None] = {}
    last: dict[Any, dict[str, Any]] = {}
    for row in ordered:
        k = row[key]
        image = {c: v for c, v in row.items() if c not in CDF_META_COLUMNS}
        if k not in before:
            before[k] = image if row["_change_type"] in removes else None
        after[k] = None if row["_change_type"] in removes else image
        last[k] = row
    out: list[dict[str, Any]] = []
    for k in before:
        meta = {c: last[k][c] for c in ("_commit_version", "_commit_timestamp")}
        old, new = before[k], after[k]
        if old is None and new is not None:
            out.append({**new, "_change_type": "insert", **meta})
        elif old is not None and new is None:
            out.append({**old, "_change_type": "delete", **meta})
        elif old is not None and new is not None and old != new:
            out.append({**old, "_change_type": "update_preimage", **meta})
            out.append({**new, "_change_type": "update_postimage", **meta})
    return out


def _net_batches(mirror: Mirror, **options: Any) -> list[tuple[range, list[dict[str, Any]]]]:
    """``netChanges`` micro-batches (trigger availableNow): each one's versions and rows."""
    rows: dict[int, list[dict[str, Any]]] = {}

    def collect(df: Any, batch_id: int) -> None:
        rows[batch_id] = [r.asDict(recursive=True) for r in df.collect()]

    stream = mirror.ours(netChanges="true", **options)
    checkpoint = str(mirror.root / "net")
    query = stream.writeStream.foreachBatch(collect).option("checkpointLocation", checkpoint)
    query = query.trigger(availableNow=True).start()
    query.awaitTermination()
    assert query.exception() is None, query.exception()
    out = []
    start = int(options["startingVersion"])  # the first batch's start offset is not reported
    for progress in query.recentProgress:
        if progress.batchId in rows and progress.sources[0].endOffset:
            end = json.loads(progress.sources[0].endOffset)["version"]
            out.append((range(start, end), rows[progress.batchId]))
            start = end
    return out


def _runs(stream: Any, checkpoint: Path, times: int) -> list[tuple[str | None, list[dict[str, Any]]]]:
    """``times`` runs (trigger availableNow) of ``stream()`` from one checkpoint, each a new query
    as a restart is: the delta-spark error class it failed with (None: it ended) and its rows."""
    import re

    runs: list[tuple[str | None, list[dict[str, Any]]]] = []
    for _ in range(times):
        rows: list[dict[str, Any]] = []

        def collect(df: Any, _batch_id: int, rows: list[dict[str, Any]] = rows) -> None:
            rows.extend(r.asDict(recursive=True) for r in df.collect())

        failure: str | None = None
        try:
            query = stream().writeStream.foreachBatch(collect)
            query = query.option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start()
            query.awaitTermination()
            failure = None if query.exception() is None else str(query.exception())
        except Exception as exc:  # load() or the query failed
            failure = str(exc)
        found = re.findall(r"\[(DELTA_[A-Z_]+)\]", failure) if failure is not None else [None]
        assert found, failure
        runs.append((found[0], normalize_cdf_rows(rows)))
    return runs


def test_a_rename_and_a_drop_under_column_mapping_with_a_schema_tracking_location_as_delta_spark(
    mirror: Mirror,
) -> None:
    """One column-mapping table: rows, RENAME COLUMN, rows, DROP COLUMN, rows (versions 0-5).
    Without schemaTrackingLocation both streams refuse to cross the changes; with one, both fail
    once per schema change after recording it, need allowSourceColumnRename/Drop to go on past a
    rename/drop, and read every row with the schema in force when it was written."""
    session, path = mirror.spark, mirror.path
    _create(session, path, CDF, CM_NAME)  # version 0: id, name, amount
    _insert(session, path, 0, 3)
    _sql(session, path, "ALTER TABLE {t} RENAME COLUMN name TO label")
    _insert(session, path, 3, 5)
    _sql(session, path, "ALTER TABLE {t} DROP COLUMN amount")
    last = _sql(session, path, "INSERT INTO {t} VALUES (5, 'x')")
    assert last == 5
    mirror.publish(last)
    root = mirror.root

    refused = "DELTA_STREAMING_INCOMPATIBLE_SCHEMA_CHANGE_USE_SCHEMA_LOG"
    assert refused in _error(lambda: mirror.ours(startingVersion=0), root / "u")
    assert refused in _error(lambda: mirror.theirs(startingVersion=0), root / "u-theirs")

    def tracked(side: str, **options: str) -> Any:
        location = root / f"k-{side}" / "schema"  # under the checkpoint, as delta-spark requires
        stream = mirror.ours if side == "ours" else mirror.theirs
        return lambda: stream(startingVersion=0, schemaTrackingLocation=str(location), **options)

    ours = _runs(tracked("ours"), root / "k-ours", 3)
    theirs = _runs(tracked("theirs"), root / "k-theirs", 3)
    evolution, blocked = (
        "DELTA_STREAMING_METADATA_EVOLUTION",
        "DELTA_STREAMING_CANNOT_CONTINUE_PROCESSING_POST_SCHEMA_EVOLUTION",
    )
    # the log starts with version 0's schema; version 1's rows; the rename is recorded; blocked
    assert [failure for failure, _ in theirs] == [evolution, evolution, blocked]
    assert [[r["_commit_version"] for r in rows] for _, rows in theirs] == [[], [1, 1, 1], []]
    assert ours == theirs
    unblock = {"allowSourceColumnRename": "2", "allowSourceColumnDrop": "always"}
    ours = _runs(tracked("ours", **unblock), root / "k-ours", 2)
    theirs = _runs(tracked("theirs", **unblock), root / "k-theirs", 2)
    assert [failure for failure, _ in theirs] == [evolution, None]
    assert [sorted(rows[0]) for _, rows in theirs] == [
        sorted(["id", "label", "amount", *CDF_META_COLUMNS]),
        sorted(["id", "label", *CDF_META_COLUMNS]),
    ]
    assert ours == theirs
    # past both changes, a restart without the options is blocked again, in both
    assert _runs(tracked("ours"), root / "k-ours", 1) == _runs(tracked("theirs"), root / "k-theirs", 1)
    assert _runs(tracked("ours"), root / "k-ours", 1) == [(blocked, [])]
    # the tracked folder is ours alone: a folder per table id, one entry per schema
    (folder,) = (root / "k-ours" / "schema").iterdir()
    assert folder.name.startswith("_schema_log_") and sorted(p.name for p in folder.iterdir()) == [
        "0",
        "1",
        "2",
    ]
