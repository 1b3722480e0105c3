"""deltamirror's change data feed against delta-spark's, on tables delta-spark itself wrote.

Rows are compared exactly (``_commit_timestamp`` included, as epoch microseconds) and without
regard to order; a range delta-spark refuses must fail here with the same error class. Besides the
shared scenarios (tests/support/spark_scenarios.py) this module builds a few tables of its own for
what SQL alone cannot produce: file times that go backwards (monotonization window), hand-written
MERGE commits (the no-op MERGE rule), cleaned-up commits, and timestamp bounds.

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

pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]

_OPTION_NAMES = {
    "startingVersion": "starting_version",
    "startingTimestamp": "starting_timestamp",
    "endingVersion": "ending_version",
    "endingTimestamp": "ending_timestamp",
}


def _spark_read(
    spark: Any, path: str, options: dict[str, Any], *, as_table: bool = False
) -> tuple[Any, str | None]:
    """(normalized rows, None) or (None, error class) of delta-spark's batch CDF read."""
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException
    from pyspark.sql import functions as F
    from pyspark.sql.types import TimestampType

    reader = spark.read.format("delta").option("readChangeFeed", "true")
    for key, value in options.items():
        reader = reader.option(key, str(value))
    try:
        df = reader.table(f"delta.`{path}`") if as_table else reader.load(path)
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
    ours, our_error = _mirror_read(path, options)
    assert our_error == their_error, f"delta-spark: {their_error}, deltamirror: {our_error}"
    if theirs is not None:
        assert _same_rows(ours, theirs), _diff(ours, theirs)
    return theirs, their_error


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
def test_scenario_matches_delta_spark(spark: Any, spark_scenarios: ScenarioCache, name: str) -> None:  # noqa: F811
    sc = spark_scenarios.get(name)
    rows, error = _compare(spark, sc.path, _range(sc.start_version, sc.end_version))
    if sc.expected_error is not None:
        assert error == sc.expected_error
    else:
        assert error is None and rows, "the scenario should produce change rows"


def test_ict_starting_timestamp_matches(spark: Any, spark_scenarios: ScenarioCache) -> None:  # noqa: F811
    """startingTimestamp on a table whose ICT starts mid-history resolves like delta-spark's."""
    sc = spark_scenarios.get("ict_enabled_mid_history")
    for version in range(sc.start_version, sc.end_version + 1):
        ict = scenarios.commit_info(sc.path, version).get("inCommitTimestamp")
        if ict is None:
            continue
        for delta in (-1, 0, 1):
            _compare(spark, sc.path, {"startingTimestamp": _fmt(ict + delta)})


# --- tables built here ----------------------------------------------------------------------------


def _fmt(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def _commit_file(path: Path, version: int) -> Path:
    return path / "_delta_log" / f"{version:020d}.json"


@pytest.fixture(scope="module")
def built(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("cdf-oracle")
    out: dict[str, Any] = {}

    # file times that jump ahead at versions 0 and 60 of a 131-version log written by delta-rs
    mono = copy_table("gen__long-log-cdf", root)
    for dirpath, dirs, files in os.walk(mono):
        for name in dirs + files:
            os.chmod(os.path.join(dirpath, name), 0o755)
    base = 1_800_000_000_000
    for version in range(131):
        ms = base + 10_000_000 if version in (0, 60) else base + version * 1000
        os.utime(_commit_file(mono, version), ns=(ms * 1_000_000,) * 2)
    out["mono"] = str(mono)

    # hand-written MERGE commits that rewrite one file unchanged, with various metrics
    for variant, metrics in {
        "zero": {"numTargetRowsInserted": "0", "numTargetRowsUpdated": "0", "numTargetRowsDeleted": "0"},
        "nonzero": {"numTargetRowsInserted": "0", "numTargetRowsUpdated": "1", "numTargetRowsDeleted": "0"},
        "missing": {"numTargetRowsInserted": "0", "numTargetRowsUpdated": "0"},
        "numeric": {"numTargetRowsInserted": 0, "numTargetRowsUpdated": 0, "numTargetRowsDeleted": 0},
    }.items():
        path = root / f"merge_{variant}"
        scenarios._create(spark, str(path), scenarios.CDF, scenarios.NO_DV)
        v1 = scenarios._insert(spark, str(path), 0, 5)
        add = next(a["add"] for a in scenarios.commit_actions(str(path), v1) if "add" in a)
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
        out[f"merge_{variant}"] = (str(path), v1)

    # two DV deletes on one file (remove+dv / add+dv pairs), then RESTOREs that un-delete rows
    path = root / "dv_twice"
    scenarios._create(spark, str(path), scenarios.CDF, scenarios.DV)
    ins = scenarios._insert(spark, str(path), 0, 20)
    d1 = scenarios._sql(spark, str(path), "DELETE FROM {t} WHERE id IN (1, 2, 3)")
    scenarios._sql(spark, str(path), "DELETE FROM {t} WHERE id IN (5, 6)")
    scenarios._sql(spark, str(path), f"RESTORE TABLE {{t}} TO VERSION AS OF {d1}")
    last = scenarios._sql(spark, str(path), f"RESTORE TABLE {{t}} TO VERSION AS OF {ins}")
    out["dv_twice"] = (str(path), ins, last)

    # change data feed switched off and on again
    path = root / "cdf_off"
    scenarios._create(spark, str(path), scenarios.CDF)
    a = scenarios._insert(spark, str(path), 0, 3)
    off = scenarios._sql(
        spark, str(path), "ALTER TABLE {t} SET TBLPROPERTIES ('delta.enableChangeDataFeed' = 'false')"
    )
    b = scenarios._insert(spark, str(path), 3, 6)
    on = scenarios._sql(
        spark, str(path), "ALTER TABLE {t} SET TBLPROPERTIES ('delta.enableChangeDataFeed' = 'true')"
    )
    out["cdf_off"] = (str(path), a, off, b, on)

    # four appends a little apart, for timestamp bounds
    path = root / "bounds"
    scenarios._create(spark, str(path), scenarios.CDF)
    for i in range(4):
        scenarios._insert(spark, str(path), i * 3, i * 3 + 3)
        time.sleep(0.05)
    times = {v: _commit_file(path, v).stat().st_mtime_ns // 1_000_000 for v in range(5)}
    out["bounds"] = (str(path), times)

    # commits 0 and 1 cleaned up; a checkpoint at 2 remains
    path = root / "cleaned"
    scenarios.scenario_start_after_checkpoint(spark, str(path))
    for v in (0, 1):
        _commit_file(path, v).unlink()
    out["cleaned"] = str(path)
    return out


@pytest.mark.parametrize(("start", "end"), [(0, 5), (50, 52), (99, 101), (120, 122), (129, 130)])
def test_file_time_monotonization_window(spark: Any, built: dict[str, Any], start: int, end: int) -> None:
    """delta-spark makes file times monotonic from start - 100 on (not from version 0)."""
    rows, _ = _compare(spark, built["mono"], _range(start, end))
    assert rows


@pytest.mark.parametrize("variant", ["zero", "nonzero", "missing", "numeric"])
def test_handwritten_merge_commits(spark: Any, built: dict[str, Any], variant: str) -> None:
    path, v1 = built[f"merge_{variant}"]
    rows, _ = _compare(spark, path, _range(v1, v1 + 1))
    merge_rows = [r for r in rows if r["_commit_version"] == v1 + 1]
    assert (not merge_rows) == (variant in ("zero", "numeric"))


def test_two_dv_deletes_and_restores(spark: Any, built: dict[str, Any]) -> None:
    path, start, end = built["dv_twice"]
    for v in range(start, end + 1):
        _compare(spark, path, _range(v, v))
    _compare(spark, path, _range(start, end))


def test_cdf_switched_off_and_on(spark: Any, built: dict[str, Any]) -> None:
    path, a, off, b, on = built["cdf_off"]
    for start, end in [(0, None), (0, a), (off, None), (b, None), (on, None), (a, off - 1)]:
        _compare(spark, path, _range(start, end))


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


@pytest.mark.parametrize("case", sorted(BOUND_CASES))
def test_bounds(spark: Any, built: dict[str, Any], case: str) -> None:
    path, times = built["bounds"]
    if case == "both_between_commits":
        assert times[3] - times[2] > 2
    _compare(spark, path, BOUND_CASES[case](times))


@pytest.mark.parametrize(
    "options",
    [
        {"startingVersion": 1, "startingTimestamp": "2000-01-01 00:00:00"},
        {"startingVersion": 1, "endingVersion": 2, "endingTimestamp": "2000-01-01 00:00:00"},
    ],
)
def test_both_a_version_and_a_timestamp(spark: Any, built: dict[str, Any], options: dict[str, Any]) -> None:
    """delta-spark refuses this for a table read (DeltaTableV2); deltamirror always refuses it.

    (A path read, ``load(path)``, silently prefers the version: deltamirror does not copy that.)
    """
    path, _ = built["bounds"]
    _, error = _compare(spark, path, options, as_table=True)
    assert error == "DELTA_MULTIPLE_CDC_BOUNDARY"


@pytest.mark.parametrize("start", [1, 2, 3])
def test_cleaned_up_commits(spark: Any, built: dict[str, Any], start: int) -> None:
    _compare(spark, built["cleaned"], _range(start, None))
