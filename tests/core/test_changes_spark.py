"""deltamirror's change data feed against delta-spark's, on tables delta-spark itself wrote.

Rows are compared exactly (``_commit_timestamp`` included, as epoch microseconds) and without
regard to order; a range delta-spark refuses must fail here with the same error class. Besides the
shared scenarios (tests/support/spark_scenarios.py, whose delta-spark reads the oracle self-checks in
test_changes_oracle.py share) this module builds a few tables of its own for what SQL alone cannot
produce: file times that go backwards (monotonization window), hand-written MERGE commits (the
no-op MERGE rule), cleaned-up commits, change data feed switched off and on, and timestamp bounds.

Run on their own with ``pytest -m spark``; one SparkSession serves the whole test session.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from deltamirror.core.changes import read_changes
from deltamirror.core.errors import ChangeDataFeedError
from deltamirror.core.table import open_table
from support import spark_scenarios as scenarios
from support.spark_scenarios import (
    ALL_SCENARIOS,
    ScenarioCache,
    error_class,
    normalize_cdf_rows,
    spark_scenarios,  # noqa: F401  (session fixture)
)
from support.tables import copy_table

pytestmark = [pytest.mark.spark, pytest.mark.timeout(180)]

_OPTION_NAMES = {
    "startingVersion": "starting_version",
    "startingTimestamp": "starting_timestamp",
    "endingVersion": "ending_version",
    "endingTimestamp": "ending_timestamp",
}


def _spark_read(
    spark: Any, path: str, options: dict[str, Any], *, as_table: bool = False, select: list[str] | None = None
) -> tuple[Any, str | None]:
    """(normalized rows, None) or (None, error class) of delta-spark's batch CDF read."""
    from py4j.protocol import Py4JJavaError  # type: ignore[import-untyped]
    from pyspark.errors import PySparkException
    from pyspark.sql import functions as F
    from pyspark.sql.types import TimestampType

    reader = spark.read.format("delta").option("readChangeFeed", "true")
    for key, value in options.items():
        reader = reader.option(key, str(value))
    try:
        df = reader.table(f"delta.`{path}`") if as_table else reader.load(path)
        if select is not None:
            df = df.select(*(F.col(f"`{c}`") for c in select))
        projected = [
            F.unix_micros(F.col(f"`{f.name}`")).alias(f.name)
            if isinstance(f.dataType, TimestampType)
            else F.col(f"`{f.name}`")
            for f in df.schema.fields
        ]
        rows = df.select(*projected).collect()
    except (PySparkException, Py4JJavaError) as exc:
        return None, error_class(exc)
    return normalize_cdf_rows(r.asDict(recursive=True) for r in rows), None


def _mirror_read(path: str, options: dict[str, Any]) -> tuple[Any, str | None]:
    kw: dict[str, Any] = {
        _OPTION_NAMES[k]: int(v) if k.endswith("Version") else v for k, v in options.items()
    }
    try:
        table = read_changes(open_table(path), **kw).to_arrow()
    except ChangeDataFeedError as exc:
        return None, exc.error_class
    return normalize_cdf_rows(table.to_pylist()), None


def _same_rows(ours: list[dict[str, Any]], theirs: list[dict[str, Any]]) -> bool:
    def key(row: dict[str, Any]) -> str:
        return json.dumps(row, sort_keys=True, default=str)

    return sorted(ours, key=key) == sorted(theirs, key=key)


def _compare(
    spark: Any, path: str, options: dict[str, Any], *, as_table: bool = False
) -> tuple[Any, str | None]:
    theirs, their_error = _spark_read(spark, path, options, as_table=as_table)
    _check_mirror(path, options, theirs, their_error)
    return theirs, their_error


def _check_mirror(path: str, options: dict[str, Any], theirs: Any, their_error: str | None) -> None:
    """deltamirror's read of `options` gives delta-spark's rows, or fails with its error class."""
    ours, our_error = _mirror_read(path, options)
    assert our_error == their_error, f"delta-spark: {their_error}, deltamirror: {our_error}"
    if theirs is not None:
        assert _same_rows(ours, theirs), _diff(ours, theirs)
        if theirs:  # the same columns in the same order (rows keep their reader's column order)
            assert list(ours[0]) == list(theirs[0])


def _diff(ours: list[dict[str, Any]], theirs: list[dict[str, Any]]) -> str:
    a = {json.dumps(r, sort_keys=True, default=str) for r in ours}
    b = {json.dumps(r, sort_keys=True, default=str) for r in theirs}
    return (
        "only deltamirror:\n  "
        + "\n  ".join(sorted(a - b))
        + "\nonly delta-spark:\n  "
        + "\n  ".join(sorted(b - a))
    )


def _range(start: int | None, end: int | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if start is not None:
        out["startingVersion"] = start
    if end is not None:
        out["endingVersion"] = end
    return out


# --- the shared scenarios -------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(ALL_SCENARIOS))
def test_scenario_matches_delta_spark(spark_scenarios: ScenarioCache, name: str) -> None:  # noqa: F811
    sc = spark_scenarios.get(name)
    rows, error = spark_scenarios.result(name)  # delta-spark's read, shared with the oracle self-checks
    _check_mirror(sc.path, _range(sc.start_version, sc.end_version), rows, error)
    if sc.expected_error is not None:
        assert error == sc.expected_error
    else:
        assert error is None and rows, "the scenario should produce change rows"


def test_restore_versions_one_at_a_time(spark: Any, spark_scenarios: ScenarioCache) -> None:  # noqa: F811
    """Ranges starting at each DV delete / RESTORE version (DVs in the start snapshot)."""
    sc = spark_scenarios.get("restore")
    assert sc.end_version is not None
    for v in range(sc.start_version, sc.end_version + 1):
        _compare(spark, sc.path, _range(v, v))


#: more ranges over the scenario tables: (scenario, start mark, end mark; None: to the latest version)
MORE_RANGES = [
    ("column_mapping_rename", "rename", "update"),  # starts at the rename: read under the new name
    ("column_mapping_rename", "add_column", "update"),  # the rename inside: refused
    ("column_mapping_add_column", "add_column", "update"),
    ("drop_column_in_range", "drop", None),
    ("cdf_enabled_later", "enable_cdf", None),
    ("noop_merge", "noop_merge", "noop_merge"),
    ("optimize", "optimize", "optimize"),
    ("add_column_after_end", "update", None),  # through the ADD COLUMN
    ("add_column_after_end_cm", "update", None),
    ("ict_enabled_mid_history", "enable_ict", "enable_ict"),
]


@pytest.mark.parametrize(("name", "start", "end"), MORE_RANGES, ids=lambda v: str(v))
def test_more_ranges_match_delta_spark(
    spark: Any,
    spark_scenarios: ScenarioCache,  # noqa: F811
    name: str,
    start: str,
    end: str | None,
) -> None:
    sc = spark_scenarios.get(name)
    _compare(spark, sc.path, _range(sc.marks[start], None if end is None else sc.marks[end]))


def test_ict_starting_timestamp_matches(spark: Any, spark_scenarios: ScenarioCache) -> None:  # noqa: F811
    """startingTimestamp on a table whose ICT starts mid-history resolves like delta-spark's."""
    sc = spark_scenarios.get("ict_enabled_mid_history")
    assert sc.end_version is not None
    for version in range(sc.start_version, sc.end_version + 1):
        ict = scenarios.commit_info(sc.path, version).get("inCommitTimestamp")
        if ict is None:
            continue
        for delta in (-1, 0, 1):
            _compare(spark, sc.path, {"startingTimestamp": _fmt(ict + delta)})


# --- column projection: delta-spark's readChangeFeed followed by the same select ---------------------

#: (writers' corpus table, columns): partitioned, column mapping id mode (a column added later),
#: deletion vectors with row tracking, every partition type, a widened type
PROJECTIONS = [
    ("spark__dml", ["amount", "id"]),
    ("spark__dml", ["part"]),
    ("spark__column_mapping_id", ["score", "part"]),
    ("spark__dv_row_tracking", ["part", "name"]),
    ("spark__partition_types", ["dec", "ts", "tsn", "id"]),
    ("spark__type_widening", ["small", "part"]),
    ("spark__null_partitions", ["p", "v"]),  # NULL and empty partition values on add, remove, cdc
]


@pytest.mark.parametrize(("table_id", "columns"), PROJECTIONS, ids=lambda v: str(v))
def test_projection_matches_delta_sparks_select(spark: Any, table_id: str, columns: list[str]) -> None:
    from support.corpus import corpus_tables, table_location

    table = next(t for t in corpus_tables() if t.id == table_id)
    location, prefixes = table_location(table)
    start = table.entry["cdf_from"]
    cdf = ["_change_type", "_commit_version", "_commit_timestamp"]
    theirs, error = _spark_read(spark, location, {"startingVersion": start}, select=[*columns, *cdf])
    assert error is None and theirs
    feed = read_changes(
        open_table(location, allowed_path_prefixes=prefixes), starting_version=start, columns=columns
    )
    ours = normalize_cdf_rows(feed.to_arrow().to_pylist())
    assert _same_rows(ours, theirs), _diff(ours, theirs)
    assert list(ours[0]) == list(theirs[0]) == [*columns, *cdf]


# --- tables built here ----------------------------------------------------------------------------


def _fmt(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def _commit_file(path: Path, version: int) -> Path:
    return path / "_delta_log" / f"{version:020d}.json"


@pytest.fixture(scope="module")
def mono(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A 131-version log written by delta-rs whose file times jump ahead at versions 0 and 60."""
    path = copy_table("gen__long-log-cdf", tmp_path_factory.mktemp("cdf-mono"))
    for dirpath, dirs, files in os.walk(path):
        for name in dirs + files:
            os.chmod(os.path.join(dirpath, name), 0o755)
    base = 1_800_000_000_000
    for version in range(131):
        ms = base + 10_000_000 if version in (0, 60) else base + version * 1000
        os.utime(_commit_file(path, version), ns=(ms * 1_000_000,) * 2)
    return str(path)


MERGE_METRICS: dict[str, dict[str, Any]] = {
    "zero": {"numTargetRowsInserted": "0", "numTargetRowsUpdated": "0", "numTargetRowsDeleted": "0"},
    "nonzero": {"numTargetRowsInserted": "0", "numTargetRowsUpdated": "1", "numTargetRowsDeleted": "0"},
    "missing": {"numTargetRowsInserted": "0", "numTargetRowsUpdated": "0"},
    "numeric": {"numTargetRowsInserted": 0, "numTargetRowsUpdated": 0, "numTargetRowsDeleted": 0},
}


@pytest.fixture(scope="module")
def merge_commits(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, int]]:
    """Hand-written MERGE commits that rewrite one file unchanged, with various metrics.

    delta-spark writes the table once; each variant is a copy of it plus one hand-written commit.
    """
    root = tmp_path_factory.mktemp("cdf-merge")
    base = root / "base"
    scenarios._create(spark, str(base), scenarios.CDF, scenarios.NO_DV)
    v1 = scenarios._insert(spark, str(base), 0, 5)
    add = next(a["add"] for a in scenarios.commit_actions(str(base), v1) if "add" in a)
    out = {}
    for variant, metrics in MERGE_METRICS.items():
        path = root / f"merge_{variant}"
        shutil.copytree(base, path)
        shutil.copy(path / add["path"], path / ("copy-" + add["path"]))
        now = int(time.time() * 1000)
        actions = [
            {
                "commitInfo": {
                    "timestamp": now,
                    "operation": "MERGE",
                    "operationMetrics": metrics,
                    "readVersion": v1,
                }
            },
            {
                "remove": {
                    "path": add["path"],
                    "deletionTimestamp": now,
                    "dataChange": True,
                    "extendedFileMetadata": True,
                    "partitionValues": {},
                    "size": add["size"],
                }
            },
            {"add": {**add, "path": "copy-" + add["path"], "modificationTime": now, "dataChange": True}},
        ]
        _commit_file(path, v1 + 1).write_text("".join(json.dumps(a) + "\n" for a in actions))
        out[variant] = (str(path), v1)
    return out


@pytest.fixture(scope="module")
def cdf_off(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, int, int, int, int]:
    """Change data feed switched off and on again: (path, insert, off, insert, on) versions."""
    path = str(tmp_path_factory.mktemp("cdf-off") / "t")
    scenarios._create(spark, path, scenarios.CDF)
    a = scenarios._insert(spark, path, 0, 3)
    off = scenarios._sql(
        spark, path, "ALTER TABLE {t} SET TBLPROPERTIES ('delta.enableChangeDataFeed' = 'false')"
    )
    b = scenarios._insert(spark, path, 3, 6)
    on = scenarios._sql(
        spark, path, "ALTER TABLE {t} SET TBLPROPERTIES ('delta.enableChangeDataFeed' = 'true')"
    )
    return path, a, off, b, on


@pytest.fixture(scope="module")
def bounds(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[int, int]]:
    """Four appends a little apart, for timestamp bounds: (path, {version: file time in ms})."""
    path = tmp_path_factory.mktemp("cdf-bounds") / "t"
    scenarios._create(spark, str(path), scenarios.CDF)
    for i in range(4):
        scenarios._insert(spark, str(path), i * 3, i * 3 + 3)
        time.sleep(0.05)
    times = {v: _commit_file(path, v).stat().st_mtime_ns // 1_000_000 for v in range(5)}
    return str(path), times


@pytest.fixture(scope="module")
def cleaned(spark_scenarios: ScenarioCache, tmp_path_factory: pytest.TempPathFactory) -> str:  # noqa: F811
    """A copy of the start_after_checkpoint table with commits 0 and 1 cleaned up (checkpoint at 2)."""
    path = spark_scenarios.copy("start_after_checkpoint", tmp_path_factory.mktemp("cdf-cleaned"))
    for v in (0, 1):
        _commit_file(path, v).unlink()
    return str(path)


@pytest.mark.parametrize(("start", "end"), [(0, 5), (50, 52), (99, 101), (120, 122), (129, 130)])
def test_file_time_monotonization_window(spark: Any, mono: str, start: int, end: int) -> None:
    """delta-spark makes file times monotonic from start - 100 on (not from version 0)."""
    rows, _ = _compare(spark, mono, _range(start, end))
    assert rows


@pytest.mark.parametrize("variant", sorted(MERGE_METRICS))
def test_handwritten_merge_commits(
    spark: Any, merge_commits: dict[str, tuple[str, int]], variant: str
) -> None:
    path, v1 = merge_commits[variant]
    rows, _ = _compare(spark, path, _range(v1, v1 + 1))
    merge_rows = [r for r in rows if r["_commit_version"] == v1 + 1]
    assert (not merge_rows) == (variant in ("zero", "numeric"))


def test_cdf_switched_off_and_on(spark: Any, cdf_off: tuple[str, int, int, int, int]) -> None:
    path, a, off, b, on = cdf_off
    errors = {}
    for start, end in [(0, None), (0, a), (off, None), (b, None), (on, None), (a, off - 1)]:
        errors[start, end] = _compare(spark, path, _range(start, end))[1]
    assert errors[0, None] == "DELTA_MISSING_CHANGE_DATA"
    assert errors[on, None] is None


BoundCase = Callable[[dict[int, int]], dict[str, Any]]
BOUND_CASES: dict[str, BoundCase] = {
    "start_exact": lambda t: {"startingTimestamp": _fmt(t[2])},
    "start_before": lambda t: {"startingTimestamp": _fmt(t[2] - 1)},
    "start_after": lambda t: {"startingTimestamp": _fmt(t[2] + 1)},
    "start_before_all": lambda t: {"startingTimestamp": "2000-01-01 00:00:00"},
    "start_after_all": lambda t: {"startingTimestamp": _fmt(t[4] + 1)},
    "end_exact": lambda t: {"startingVersion": 0, "endingTimestamp": _fmt(t[2])},
    "end_after": lambda t: {"startingVersion": 0, "endingTimestamp": _fmt(t[2] + 1)},
    "end_before_all": lambda t: {"startingVersion": 0, "endingTimestamp": "2000-01-01 00:00:00"},
    "end_after_all": lambda t: {"startingVersion": 0, "endingTimestamp": _fmt(t[4] + 1)},
    "both_between_commits": lambda t: {
        "startingTimestamp": _fmt(t[2] + 1),
        "endingTimestamp": _fmt(t[2] + 2),
    },
    "both_reversed": lambda t: {"startingTimestamp": _fmt(t[3]), "endingTimestamp": _fmt(t[2])},
    "start_after_latest": lambda t: {"startingVersion": 9},
    "end_before_start": lambda t: {"startingVersion": 3, "endingVersion": 2},
    "end_after_latest": lambda t: {"startingVersion": 2, "endingVersion": 50},
    "no_start": lambda t: {},
}


#: delta-spark's answer to each bound case (None: rows), so that every error class stays exercised
BOUND_ERRORS: dict[str, str | None] = {
    "start_after_all": "DELTA_TIMESTAMP_GREATER_THAN_COMMIT",
    "end_before_all": "DELTA_TIMESTAMP_EARLIER_THAN_COMMIT_RETENTION",
    "end_after_all": "DELTA_TIMESTAMP_GREATER_THAN_COMMIT",
    "both_reversed": "DELTA_INVALID_CDC_RANGE",
    "start_after_latest": "DELTA_CDC_START_VERSION_AFTER_LATEST",
    "end_before_start": "DELTA_INVALID_CDC_RANGE",
    "no_start": "DELTA_NO_START_FOR_CDC_READ",
}


@pytest.mark.parametrize("case", sorted(BOUND_CASES))
def test_bounds(spark: Any, bounds: tuple[str, dict[int, int]], case: str) -> None:
    path, times = bounds
    if case == "both_between_commits":
        assert times[3] - times[2] > 2
    _, error = _compare(spark, path, BOUND_CASES[case](times))
    assert error == BOUND_ERRORS.get(case)


@pytest.mark.parametrize(
    "options",
    [
        {"startingVersion": 1, "startingTimestamp": "2000-01-01 00:00:00"},
        {"startingVersion": 1, "endingVersion": 2, "endingTimestamp": "2000-01-01 00:00:00"},
    ],
)
def test_both_a_version_and_a_timestamp(
    spark: Any, bounds: tuple[str, dict[int, int]], options: dict[str, Any]
) -> None:
    """delta-spark refuses this for a table read (DeltaTableV2); deltamirror always refuses it.

    (A path read, ``load(path)``, silently prefers the version: deltamirror does not copy that.)
    """
    path, _ = bounds
    _, error = _compare(spark, path, options, as_table=True)
    assert error == "DELTA_MULTIPLE_CDC_BOUNDARY"


@pytest.mark.parametrize("start", [1, 2, 3])
def test_cleaned_up_commits(spark: Any, cleaned: str, start: int) -> None:
    _, error = _compare(spark, cleaned, _range(start, None))
    assert (error is None) == (start >= 2), error
