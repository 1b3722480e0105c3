"""The change data feed against every expected/cdf file, plus each error delta-spark raises.

Timestamp rules, because the upstream expectations use three different ones:
* kernel-rs files (``krs__*`` without ``__delta-rs``) project ``_commit_timestamp`` out: not checked.
* delta-rs files (``*__delta-rs.json``, ``gen__*``) use ``commitInfo.timestamp`` where delta-spark uses
  the commit file's modification time. Those tests run on a copy whose commit files have their
  modification time set to ``commitInfo.timestamp``, so deltamirror's file-time rule must give
  exactly the expected values (and the test first checks that the expectation is indeed
  commitInfo.timestamp, so the rule it relies on is stated, not assumed).
* ``drs__cdc_ict_table`` has In-Commit Timestamps: the expected values are ``inCommitTimestamp``,
  the rule deltamirror (and delta-spark) use for ICT tables; checked on the table as stored.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from deltamirror.core.changes import read_changes
from deltamirror.core.changes import rows as changes_rows
from deltamirror.core.errors import (
    ChangeDataNotEnabledError,
    ChangeTimestampAfterLatestError,
    ChangeTimestampBeforeEarliestError,
    CorruptLogError,
    DeltaMirrorError,
    IncompatibleDataSchemaError,
    IncompatibleSchemaChangeError,
    InvalidArgumentError,
    InvalidChangeRangeError,
    MultipleBoundaryError,
    NoStartingBoundError,
    StartVersionAfterLatestError,
    VersionNotFoundError,
)
from deltamirror.core.table import open_table
from support.tables import EXPECTED, TABLES, copy_table

CDF_EXPECTED = EXPECTED / "cdf"
EXPECTED_FILES = sorted(CDF_EXPECTED.glob("*.json"))


# --- helpers ----------------------------------------------------------------------------------


def commit_path(table: Path, version: int) -> Path:
    return table / "_delta_log" / f"{version:020d}.json"


def commit_infos(table: Path) -> dict[int, dict[str, Any]]:
    out = {}
    for f in sorted((table / "_delta_log").glob("*.json")):
        for line in f.read_text().splitlines():
            if line.strip() and "commitInfo" in json.loads(line):
                out[int(f.name[:20])] = json.loads(line)["commitInfo"]
                break
    return out


def set_commit_mtimes(table: Path, times_ms: dict[int, int]) -> None:
    for version, ms in times_ms.items():
        os.utime(commit_path(table, version), ns=(ms * 1_000_000, ms * 1_000_000))


def writable_copy(table_id: str, tmp_path: Path) -> Path:
    path = copy_table(table_id, tmp_path)
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            os.chmod(os.path.join(root, name), 0o755)
    os.chmod(path, 0o755)
    return path


def append_commit(table: Path, actions: list[dict[str, Any]]) -> int:
    versions = [int(p.name[:20]) for p in (table / "_delta_log").glob("*.json") if p.name[:20].isdigit()]
    version = max(versions) + 1
    commit_path(table, version).write_text("".join(json.dumps(a) + "\n" for a in actions))
    return version


def latest_metadata(table: Path) -> dict[str, Any]:
    found: dict[str, Any] | None = None
    for f in sorted((table / "_delta_log").glob("*.json")):
        for line in f.read_text().splitlines():
            if line.strip() and "metaData" in json.loads(line):
                found = json.loads(line)["metaData"]
    assert found is not None
    return found


def render_string(value: Any, typ: pa.DataType) -> str:
    """A cell as the upstream tests printed it (Arrow's pretty printer; NULL as empty string)."""
    if value is None:
        return ""
    if pa.types.is_boolean(typ):
        return "true" if value else "false"
    if pa.types.is_timestamp(typ):
        return value.replace(tzinfo=None).isoformat(timespec="milliseconds")
    if pa.types.is_date(typ):
        return value.isoformat()
    if pa.types.is_struct(typ):
        inner = ", ".join(f"{f.name}: {render_string(value[f.name], f.type)}" for f in typ)
        return "{" + inner + "}"
    return str(value)


def render_native(value: Any, typ: pa.DataType) -> Any:
    """A cell as the generated (gen__) files store it: JSON values, timestamps as naive ISO text."""
    if value is not None and pa.types.is_timestamp(typ):
        return value.replace(tzinfo=None).isoformat(timespec="microseconds")
    return value


def rows_as(table: pa.Table, columns: list[str], render: Any) -> Counter[tuple[Any, ...]]:
    types = {f.name: f.type for f in table.schema}
    return Counter(
        tuple(render(row[c], types[c]) for c in columns) for row in table.select(columns).to_pylist()
    )


def bounds(expected: dict[str, Any]) -> dict[str, Any]:
    kw: dict[str, Any] = {}
    if expected.get("starting_timestamp_utc"):
        kw["starting_timestamp"] = expected["starting_timestamp_utc"]
    else:
        kw["starting_version"] = expected["start_version"] or 0
    if expected.get("ending_timestamp_utc"):
        kw["ending_timestamp"] = expected["ending_timestamp_utc"]
    elif expected["end_version"] is not None:
        kw["ending_version"] = expected["end_version"]
    return kw


# --- every expected/cdf file --------------------------------------------------------------------


def test_every_expected_file_is_collected() -> None:
    assert len(EXPECTED_FILES) >= 25


@pytest.mark.parametrize("expected_file", EXPECTED_FILES, ids=lambda p: p.stem)
def test_expected_cdf(expected_file: Path, tmp_path: Path) -> None:
    expected = json.loads(expected_file.read_text())
    columns: list[str] = expected["columns"]
    table_id: str = expected["table"]
    delta_rs_rule = expected_file.name.endswith("__delta-rs.json") or table_id.startswith("gen__")
    path = TABLES / table_id
    if delta_rs_rule and "_commit_timestamp" in columns:
        # rule: expected _commit_timestamp = commitInfo.timestamp (delta-rs). Make the file times equal
        # to it on a copy, so deltamirror's file-time rule is checked against the expected values.
        path = writable_copy(table_id, tmp_path)
        infos = commit_infos(path)
        set_commit_mtimes(path, {v: ci["timestamp"] for v, ci in infos.items()})
        by_version = {v: ci["timestamp"] for v, ci in infos.items()}
        ts_col, v_col = columns.index("_commit_timestamp"), columns.index("_commit_version")
        for row in expected["rows"]:
            stated = dt.datetime.fromisoformat(row[ts_col]).replace(tzinfo=dt.UTC)
            assert int(stated.timestamp() * 1000) == by_version[int(row[v_col])], "expectation's rule"

    kw = bounds(expected)
    if expected.get("test") == "cdf_partition_predicate_keeps_matching_rows":
        # upstream: SELECT ... FROM cdf WHERE birthday = DATE '2023-12-25' (birthday is the partition column)
        kw["partition_filter"] = {"birthday": dt.date(2023, 12, 25)}
    feed = read_changes(open_table(str(path)), **kw)
    got = feed.to_arrow()

    if table_id.startswith("gen__"):
        want = Counter(tuple(r) for r in expected["rows"])
        assert rows_as(got, columns, render_native) == want
    else:
        want = Counter(tuple(r) for r in expected["rows"])
        assert rows_as(got, columns, render_string) == want


def test_ict_table_uses_in_commit_timestamps() -> None:
    """drs__cdc_ict_table: _commit_timestamp is commitInfo.inCommitTimestamp, not the file time."""
    path = TABLES / "drs__cdc_ict_table"
    infos = commit_infos(path)
    got = read_changes(open_table(str(path)), starting_version=2).to_arrow().to_pylist()
    assert got
    for row in got:
        ms = int(row["_commit_timestamp"].timestamp() * 1000)
        assert ms == infos[row["_commit_version"]]["inCommitTimestamp"]


# --- the output contract --------------------------------------------------------------------------


def test_schema_batches_and_version_order() -> None:
    table = open_table(str(TABLES / "gen__long-log-cdf"))
    feed = read_changes(table, starting_version=0, batch_size=4)
    assert feed.schema.names == [
        "id",
        "part",
        "val",
        "n",
        "_change_type",
        "_commit_version",
        "_commit_timestamp",
    ]
    assert feed.schema.field("_commit_timestamp").type == pa.timestamp("us", tz="UTC")
    assert feed.schema.field("_commit_version").type == pa.int64()
    assert (feed.start_version, feed.end_version) == (0, 130)
    last = -1
    total = 0
    for batch in feed:
        assert batch.schema == feed.schema
        assert 0 < batch.num_rows <= 4
        versions = set(batch.column("_commit_version").to_pylist())
        assert len(versions) == 1  # a batch never spans versions
        (v,) = versions
        assert v >= last
        last = v
        total += batch.num_rows
    assert total == 1197


@pytest.mark.parametrize("columns", [["val", "ID"], ["id", "val"], ["val"]])
def test_columns_are_projected_in_the_requested_order(columns: list[str]) -> None:
    """Both ways a batch is built (CDF columns appended while reading, for columns in table order,
    or added to a reordered batch) give the rows of the full read."""
    table = open_table(str(TABLES / "gen__long-log-cdf"))
    full = read_changes(table, starting_version=40, ending_version=60).to_arrow()
    some = read_changes(table, starting_version=40, ending_version=60, columns=columns).to_arrow()
    wanted = [c.lower() for c in columns]
    assert some.schema.names == [*wanted, "_change_type", "_commit_version", "_commit_timestamp"]
    names = some.schema.names
    assert Counter(tuple(r[c] for c in names) for r in some.to_pylist()) == Counter(
        tuple(r[c] for c in names) for r in full.to_pylist()
    )


def test_table_method_delegates() -> None:
    table = open_table(str(TABLES / "krs__cdf-table-simple"))
    assert table.changes(starting_version=0).to_arrow().num_rows == 25


def test_partition_filter_prunes_before_opening(monkeypatch: pytest.MonkeyPatch) -> None:
    table = open_table(str(TABLES / "gen__long-log-cdf"))
    full = read_changes(table, starting_version=0).to_arrow()
    opened: list[str] = []
    real = changes_rows.read_data_file

    def spy(storage: Any, path: str, **kw: Any) -> Any:
        opened.append(path)
        return real(storage, path, **kw)

    monkeypatch.setattr(changes_rows, "read_data_file", spy)
    for spec in ({"part": "a"}, {"part": ["a", "b"]}, lambda values: values["part"] == "c"):
        opened.clear()
        got = read_changes(table, starting_version=0, partition_filter=spec).to_arrow()
        keep = (
            {"a"}
            if isinstance(spec, dict) and spec["part"] == "a"
            else {"a", "b"}
            if isinstance(spec, dict)
            else {"c"}
        )
        assert got.num_rows == sum(1 for p in full.column("part").to_pylist() if p in keep)
        assert set(got.column("part").to_pylist()) == keep
        assert opened and all(any(f"part={p}/" in path for p in keep) for path in opened)


def test_partition_filter_must_name_partition_columns() -> None:
    table = open_table(str(TABLES / "gen__long-log-cdf"))
    with pytest.raises(InvalidArgumentError, match="not a partition column"):
        read_changes(table, starting_version=0, partition_filter={"id": 1})
    with pytest.raises(InvalidArgumentError, match="unknown column"):
        read_changes(table, starting_version=0, partition_filter={"nope": 1})
    with pytest.raises(InvalidArgumentError, match="no column"):
        read_changes(table, starting_version=0, columns=["nope"])


# --- versions: DV pairs, no-op MERGE, dataChange=false --------------------------------------------


def _merge_commit(table: Path, metrics: dict[str, Any], operation: str = "MERGE") -> int:
    """A MERGE that rewrites one file unchanged (remove + add of a copy, dataChange=true)."""
    add = None
    for line in commit_path(table, 0).read_text().splitlines():
        if line.strip() and "add" in json.loads(line):
            add = json.loads(line)["add"]
            break
    assert add is not None
    copy = "rewritten-0.snappy.parquet"
    shutil.copy(table / unquote(add["path"]), table / copy)
    return append_commit(
        table,
        [
            {"commitInfo": {"timestamp": 1, "operation": operation, "operationMetrics": metrics}},
            {
                "remove": {
                    "path": add["path"],
                    "dataChange": True,
                    "partitionValues": add["partitionValues"],
                    "size": add["size"],
                }
            },
            {"add": {**add, "path": copy, "dataChange": True}},
        ],
    )


@pytest.mark.parametrize(
    ("metrics", "operation", "skipped"),
    [
        (
            {"numTargetRowsInserted": "0", "numTargetRowsUpdated": "0", "numTargetRowsDeleted": "0"},
            "MERGE",
            True,
        ),
        (
            {"numTargetRowsInserted": "0", "numTargetRowsUpdated": "2", "numTargetRowsDeleted": "0"},
            "MERGE",
            False,
        ),
        ({"numTargetRowsInserted": "0", "numTargetRowsUpdated": "0"}, "MERGE", False),  # a metric missing
        (
            {"num_target_rows_inserted": 0, "num_target_rows_updated": 0, "num_target_rows_deleted": 0},
            "MERGE",
            False,
        ),
        (
            {"numTargetRowsInserted": "0", "numTargetRowsUpdated": "0", "numTargetRowsDeleted": "0"},
            "UPDATE",
            False,
        ),
    ],
)
def test_noop_merge_gives_no_rows(
    tmp_path: Path, metrics: dict[str, Any], operation: str, skipped: bool
) -> None:
    path = writable_copy("krs__cdf-table-simple", tmp_path)
    version = _merge_commit(path, metrics, operation)
    rows = read_changes(open_table(str(path)), starting_version=version).to_arrow()
    if skipped:
        assert rows.num_rows == 0
    else:
        types = Counter(rows.column("_change_type").to_pylist())
        assert types["delete"] == types["insert"] > 0


def test_add_and_remove_of_one_file_without_dv_is_refused(tmp_path: Path) -> None:
    path = writable_copy("krs__cdf-table-simple", tmp_path)
    lines = commit_path(path, 0).read_text().splitlines()
    add = next(json.loads(line)["add"] for line in lines if '"add"' in line)
    version = append_commit(
        path,
        [
            {"commitInfo": {"timestamp": 1, "operation": "WRITE"}},
            {"remove": {"path": add["path"], "dataChange": True, "partitionValues": {}}},
            {"add": {**add, "dataChange": True}},
        ],
    )
    with pytest.raises(CorruptLogError, match="neither with a deletion vector"):
        read_changes(open_table(str(path)), starting_version=version).to_arrow()


# --- file-time monotonization window --------------------------------------------------------------


def test_file_times_are_monotonized_from_start_minus_100(tmp_path: Path) -> None:
    """delta-spark monotonizes file times over the commits from start - 100 only (see the Spark test)."""
    path = writable_copy("gen__long-log-cdf", tmp_path)
    base = 1_800_000_000_000
    raw = {v: base + v * 1000 for v in range(131)}
    raw[0] = raw[60] = base + 10_000_000  # two commits whose file time jumps ahead
    set_commit_mtimes(path, raw)

    def rule(start: int, end: int) -> dict[int, int]:
        out, prev = {}, None
        for v in range(max(start - 100, 0), end + 1):
            ts = raw[v] if prev is None or raw[v] > prev else prev + 1
            out[v], prev = ts, ts
        return {v: out[v] for v in range(start, end + 1)}

    table = open_table(str(path))
    for start, end in [(0, 5), (50, 52), (99, 101), (120, 122)]:
        got = read_changes(table, starting_version=start, ending_version=end).to_arrow()
        seen = {
            r["_commit_version"]: int(r["_commit_timestamp"].timestamp() * 1_000_000) // 1000
            for r in got.to_pylist()
        }
        assert seen == {v: t for v, t in rule(start, end).items() if v in seen}
        assert seen


# --- range errors ---------------------------------------------------------------------------------


def _simple() -> Any:
    return open_table(str(TABLES / "krs__cdf-table-simple"))  # versions 0-2


@pytest.mark.parametrize(
    ("kw", "error", "error_class"),
    [
        (
            dict(starting_version=0, starting_timestamp="2020-01-01"),
            MultipleBoundaryError,
            "DELTA_MULTIPLE_CDC_BOUNDARY",
        ),
        (
            dict(starting_version=0, ending_version=1, ending_timestamp="2020-01-01"),
            MultipleBoundaryError,
            "DELTA_MULTIPLE_CDC_BOUNDARY",
        ),
        ({}, NoStartingBoundError, "DELTA_NO_START_FOR_CDC_READ"),
        (dict(ending_version=1), NoStartingBoundError, "DELTA_NO_START_FOR_CDC_READ"),
        (dict(starting_version=3), StartVersionAfterLatestError, "DELTA_CDC_START_VERSION_AFTER_LATEST"),
        (dict(starting_version=2, ending_version=1), InvalidChangeRangeError, "DELTA_INVALID_CDC_RANGE"),
        (
            dict(starting_timestamp="2999-01-01T00:00:00Z"),
            ChangeTimestampAfterLatestError,
            "DELTA_TIMESTAMP_GREATER_THAN_COMMIT",
        ),
        (
            dict(starting_version=0, ending_timestamp="2999-01-01"),
            ChangeTimestampAfterLatestError,
            "DELTA_TIMESTAMP_GREATER_THAN_COMMIT",
        ),
        (
            dict(starting_version=0, ending_timestamp="2000-01-01"),
            ChangeTimestampBeforeEarliestError,
            "DELTA_TIMESTAMP_EARLIER_THAN_COMMIT_RETENTION",
        ),
    ],
)
def test_range_errors(kw: dict[str, Any], error: type[DeltaMirrorError], error_class: str) -> None:
    with pytest.raises(error) as info:
        read_changes(_simple(), **kw)
    assert str(info.value).startswith(f"[{error_class}]")


def test_bad_arguments() -> None:
    with pytest.raises(InvalidArgumentError):
        read_changes(_simple(), starting_version=-1)
    with pytest.raises(InvalidArgumentError):
        read_changes(_simple(), starting_version=0, batch_size=0)
    with pytest.raises(InvalidArgumentError):
        read_changes(_simple(), starting_timestamp="yesterday")


def test_end_after_latest_reads_to_latest() -> None:
    feed = read_changes(_simple(), starting_version=1, ending_version=99)
    assert (feed.start_version, feed.end_version) == (1, 2)
    assert feed.to_arrow().num_rows == 15


def test_timestamp_bounds(tmp_path: Path) -> None:
    path = writable_copy("krs__cdf-table-simple", tmp_path)
    base = 1_700_000_000_000
    set_commit_mtimes(path, {0: base, 1: base + 1000, 2: base + 2000})
    table = open_table(str(path))

    def versions(**kw: Any) -> tuple[int, int]:
        feed = read_changes(table, **kw)
        return feed.start_version, feed.end_version

    assert versions(starting_timestamp=base + 1000) == (1, 2)  # exactly a commit: that commit
    assert versions(starting_timestamp=base + 999) == (1, 2)  # else the first commit after
    assert versions(starting_timestamp=base + 1001) == (2, 2)
    assert versions(starting_timestamp="1999-01-01") == (0, 2)  # before every commit: the first
    assert versions(starting_version=0, ending_timestamp=base + 1000) == (0, 1)
    assert versions(starting_version=0, ending_timestamp=base + 1999) == (0, 1)  # last commit at or before
    assert versions(
        starting_version=0, ending_timestamp=dt.datetime.fromtimestamp(2 + base / 1000, dt.UTC)
    ) == (0, 2)
    # both timestamps between the same two commits: an empty feed, not an error
    empty = read_changes(table, starting_timestamp=base + 1200, ending_timestamp=base + 1500)
    assert empty.to_arrow().num_rows == 0
    with pytest.raises(InvalidChangeRangeError):
        read_changes(table, starting_timestamp=base + 1500, ending_timestamp=base + 1200)


def test_versions_no_longer_in_the_log(tmp_path: Path) -> None:
    path = writable_copy("gen__long-log-cdf", tmp_path)  # checkpoints at 49 and 99
    for v in range(0, 20):
        commit_path(path, v).unlink()
    table = open_table(str(path))
    with pytest.raises(VersionNotFoundError) as info:
        read_changes(table, starting_version=5, ending_version=30)
    assert info.value.version == 5
    assert str(info.value).startswith("[DELTA_LOG_FILE_NOT_FOUND]")
    assert read_changes(table, starting_version=60, ending_version=61).to_arrow().num_rows > 0


# --- CDF enablement -------------------------------------------------------------------------------


def test_cdf_not_enabled_at_start() -> None:
    table = open_table(str(TABLES / "krs__cdf-column-mapping-name-mode"))  # enabled at version 1
    with pytest.raises(ChangeDataNotEnabledError) as info:
        read_changes(table, starting_version=0)
    assert info.value.version == 0
    assert str(info.value).startswith("[DELTA_MISSING_CHANGE_DATA]")


def test_cdf_disabled_inside_the_range(tmp_path: Path) -> None:
    path = writable_copy("krs__cdf-table-simple", tmp_path)
    meta = latest_metadata(path)
    off = append_commit(
        path, [{"metaData": {**meta, "configuration": {"delta.enableChangeDataFeed": "false"}}}]
    )
    on = append_commit(
        path, [{"metaData": {**meta, "configuration": {"delta.enableChangeDataFeed": "true"}}}]
    )
    table = open_table(str(path))
    with pytest.raises(ChangeDataNotEnabledError) as info:
        read_changes(table, starting_version=0)
    assert info.value.version == off
    assert read_changes(table, starting_version=0, ending_version=off - 1).to_arrow().num_rows == 25
    assert read_changes(table, starting_version=on).to_arrow().num_rows == 0


def test_table_without_cdf() -> None:
    with pytest.raises(ChangeDataNotEnabledError):
        read_changes(open_table(str(TABLES / "drs__table_with_partitioning_mapping")), starting_version=0)


# --- schema ---------------------------------------------------------------------------------------


def _renamed(meta: dict[str, Any], old: str, new: str) -> dict[str, Any]:
    schema = json.loads(meta["schemaString"])
    for f in schema["fields"]:
        if f["name"] == old:
            f["name"] = new
    return {**meta, "schemaString": json.dumps(schema)}


def _with_column(meta: dict[str, Any], name: str, drop: str | None = None) -> dict[str, Any]:
    schema = json.loads(meta["schemaString"])
    schema["fields"] = [f for f in schema["fields"] if f["name"] != drop]
    schema["fields"].append({"name": name, "type": "string", "nullable": True, "metadata": {}})
    return {**meta, "schemaString": json.dumps(schema)}


def test_column_mapping_rename_inside_the_range(tmp_path: Path) -> None:
    path = writable_copy("krs__cdf-column-mapping-name-mode", tmp_path)  # versions 0-4, name mode
    meta = latest_metadata(path)
    props = append_commit(path, [{"metaData": {**meta, "description": "x"}}])  # 5: same schema
    rename = append_commit(path, [{"metaData": _renamed(meta, "name", "full_name")}])  # 6
    table = open_table(str(path))
    with pytest.raises(IncompatibleSchemaChangeError) as info:
        read_changes(table, starting_version=1)
    assert info.value.version == props
    assert str(info.value).startswith("[DELTA_CHANGE_DATA_FEED_INCOMPATIBLE_SCHEMA_CHANGE]")
    # the start version's data under the renamed schema: a data-schema mismatch, named at the start
    with pytest.raises(IncompatibleDataSchemaError) as data_info:
        read_changes(table, starting_version=props, ending_version=rename)
    assert data_info.value.version == props
    assert str(data_info.value).startswith("[DELTA_CHANGE_DATA_FEED_INCOMPATIBLE_DATA_SCHEMA]")
    # a range that ends before the rename reads with the end version's schema (column mapping)
    before = read_changes(table, starting_version=1, ending_version=4)
    assert before.schema.names[:3] == ["id", "name", "value"]
    assert before.to_arrow().num_rows == 4
    # a range that starts at the rename reads the renamed column by its physical name
    after = read_changes(table, starting_version=rename)
    assert after.schema.names[:3] == ["id", "full_name", "value"]


def test_added_column_after_the_end_without_column_mapping(tmp_path: Path) -> None:
    """delta-spark reads tables without column mapping with the latest schema: added columns are null."""
    path = writable_copy("krs__cdf-table-simple", tmp_path)
    append_commit(path, [{"metaData": _with_column(latest_metadata(path), "extra")}])
    got = read_changes(open_table(str(path)), starting_version=0, ending_version=2).to_arrow()
    assert got.schema.names[:2] == ["id", "extra"]
    assert got.num_rows == 25
    assert got.column("extra").null_count == 25


def test_dropped_column_after_the_end_without_column_mapping(tmp_path: Path) -> None:
    path = writable_copy("krs__cdf-table-simple", tmp_path)
    append_commit(path, [{"metaData": _with_column(latest_metadata(path), "other", drop="id")}])
    with pytest.raises(IncompatibleDataSchemaError):
        read_changes(open_table(str(path)), starting_version=0, ending_version=2)


# --- column mapping id mode: the physical _change_type column of a change data file -----------------


def test_change_data_file_in_id_mode(tmp_path: Path) -> None:
    """In id mode data columns are found by parquet field id; _change_type has none and is read by name."""
    path = tmp_path / "id-mode"
    (path / "_delta_log").mkdir(parents=True)
    (path / "_change_data").mkdir()
    schema = {
        "type": "struct",
        "fields": [
            {
                "name": "key",
                "type": "long",
                "nullable": True,
                "metadata": {"delta.columnMapping.id": 1, "delta.columnMapping.physicalName": "col-a"},
            },
            {
                "name": "label",
                "type": "string",
                "nullable": True,
                "metadata": {"delta.columnMapping.id": 2, "delta.columnMapping.physicalName": "col-b"},
            },
        ],
    }
    meta = {
        "id": "t",
        "format": {"provider": "parquet", "options": {}},
        "schemaString": json.dumps(schema),
        "partitionColumns": [],
        "configuration": {
            "delta.columnMapping.mode": "id",
            "delta.columnMapping.maxColumnId": "2",
            "delta.enableChangeDataFeed": "true",
        },
    }

    def field(name: str, typ: pa.DataType, fid: int | None) -> pa.Field:
        return pa.field(name, typ, metadata={b"PARQUET:field_id": str(fid).encode()} if fid else None)

    # physical names differ from the table's on purpose: id mode must match by field id
    data = pa.table(
        [pa.array([1, 2, 3]), pa.array(["a", "b", "c"])],
        schema=pa.schema([field("x1", pa.int64(), 1), field("x2", pa.string(), 2)]),
    )
    pq.write_table(data, path / "part-0.parquet")
    cdc = pa.table(
        [
            pa.array([2, 2, 3]),
            pa.array(["b", "B", "c"]),
            pa.array(["update_preimage", "update_postimage", "delete"]),
        ],
        schema=pa.schema(
            [
                field("y1", pa.int64(), 1),
                field("y2", pa.string(), 2),
                field("_change_type", pa.string(), None),
            ]
        ),
    )
    pq.write_table(cdc, path / "_change_data" / "cdc-0.parquet", row_group_size=2)
    commit_path(path, 0).write_text(
        "\n".join(
            json.dumps(a)
            for a in [
                {"protocol": {"minReaderVersion": 2, "minWriterVersion": 5}},
                {"metaData": meta},
                {
                    "add": {
                        "path": "part-0.parquet",
                        "partitionValues": {},
                        "size": 1,
                        "modificationTime": 1,
                        "dataChange": True,
                    }
                },
            ]
        )
        + "\n"
    )
    commit_path(path, 1).write_text(
        json.dumps(
            {
                "cdc": {
                    "path": "_change_data/cdc-0.parquet",
                    "partitionValues": {},
                    "size": 1,
                    "dataChange": False,
                }
            }
        )
        + "\n"
    )
    got = read_changes(open_table(str(path)), starting_version=0, batch_size=1).to_arrow()
    assert [(r["key"], r["label"], r["_change_type"], r["_commit_version"]) for r in got.to_pylist()] == [
        (1, "a", "insert", 0),
        (2, "b", "insert", 0),
        (3, "c", "insert", 0),
        (2, "b", "update_preimage", 1),
        (2, "B", "update_postimage", 1),
        (3, "c", "delete", 1),
    ]
