"""The delta-spark oracle checks itself: each scenario table exists and its CDF has the expected shape.

Expectations come from the SQL each scenario runs (which ids a DELETE hits, what a MERGE source holds),
never from reading the oracle's output back. deltamirror is not involved here; comparison tests reuse
the same session-cached tables through the `spark_scenarios` fixture.
"""

from __future__ import annotations

import datetime as dt
import os
from collections import Counter
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from support.spark_scenarios import (
    ALL_SCENARIOS,
    Scenario,
    ScenarioCache,
    commit_actions,
    commit_info,
    commit_summary,
    latest_version,
    normalize_cdf_rows,
    spark_cdf,
    spark_cdf_error,
    spark_scenarios,  # noqa: F401  (session fixture)
)

spark_test = pytest.mark.spark
# per test, with the JVM start and one scenario build in the worst case (a hang must not eat the run)
pytestmark = pytest.mark.timeout(180)


def _types_by_version(rows: list[dict[str, Any]]) -> dict[int, Counter[str]]:
    out: dict[int, Counter[str]] = {}
    for row in rows:
        out.setdefault(row["_commit_version"], Counter())[row["_change_type"]] += 1
    return out


def _ids(rows: list[dict[str, Any]], version: int, change_type: str) -> set[int]:
    return {r["id"] for r in rows if r["_commit_version"] == version and r["_change_type"] == change_type}


def _read(cache: ScenarioCache, name: str) -> tuple[Scenario, list[dict[str, Any]]]:
    sc = cache.get(name)
    assert sc.expected_error is None
    return sc, cache.rows(name)


# ------------------------------------------------------------------------------- pure normalization


def test_normalize_matches_arrow_style_values() -> None:
    """An Arrow-side row (Decimal, aware datetime) normalizes to what spark_cdf returns (str, int)."""
    ts = dt.datetime(2024, 5, 1, 12, 0, 0, 123456, tzinfo=dt.UTC)
    micros = 1714564800123456
    arrow_rows: list[dict[str, Any]] = [
        {
            "id": 10,
            "amount": Decimal("1.50"),
            "_change_type": "insert",
            "_commit_version": 2,
            "_commit_timestamp": ts,
        },
        {
            "id": 9,
            "amount": Decimal("12.00"),
            "_change_type": "delete",
            "_commit_version": 2,
            "_commit_timestamp": ts,
        },
        {"id": 2, "amount": None, "_change_type": "insert", "_commit_version": 1, "_commit_timestamp": ts},
    ]
    spark_rows: list[dict[str, Any]] = [
        {
            "id": 2,
            "amount": None,
            "_change_type": "insert",
            "_commit_version": 1,
            "_commit_timestamp": micros,
        },
        {
            "id": 10,
            "amount": "1.50",
            "_change_type": "insert",
            "_commit_version": 2,
            "_commit_timestamp": micros,
        },
        {
            "id": 9,
            "amount": "12.00",
            "_change_type": "delete",
            "_commit_version": 2,
            "_commit_timestamp": micros,
        },
    ]
    normalized = normalize_cdf_rows(arrow_rows)
    assert normalized == normalize_cdf_rows(spark_rows)
    assert [r["id"] for r in normalized] == [2, 9, 10]  # version, then delete before insert
    assert normalized[1]["amount"] == "12.00"


def test_normalize_sorts_numbers_numerically() -> None:
    rows = [{"id": i, "_change_type": "insert", "_commit_version": 1} for i in (10, 2, 1)]
    assert [r["id"] for r in normalize_cdf_rows(rows)] == [1, 2, 10]


def test_all_required_scenarios_registered() -> None:
    required = {
        "inserts", "update", "delete", "merge", "update_dv", "delete_dv", "merge_dv",
        "dv_then_whole_file_delete", "noop_merge", "restore", "optimize", "merge_partitioned",
        "delete_dv_partitioned", "column_mapping_add_column", "column_mapping_rename",
        "drop_column_in_range", "ict_from_create", "ict_enabled_mid_history", "start_after_checkpoint",
        "add_column_after_end", "add_column_after_end_cm", "cdf_enabled_later",
    }  # fmt: skip
    assert required <= set(ALL_SCENARIOS)


# ----------------------------------------------------------------------------- every scenario, generic


@spark_test
@pytest.mark.parametrize("name", list(ALL_SCENARIOS))
def test_scenario_reads_as_declared(name: str, spark: Any, spark_scenarios: ScenarioCache) -> None:  # noqa: F811
    sc = spark_scenarios.get(name)
    assert sc.name == name
    assert (
        0 <= sc.start_version <= (sc.end_version if sc.end_version is not None else latest_version(sc.path))
    )
    if sc.expected_error is not None:
        assert spark_scenarios.error(name) == sc.expected_error
        return
    rows = spark_scenarios.rows(name)
    assert rows, "every readable scenario has at least one change row"
    end = sc.end_version if sc.end_version is not None else latest_version(sc.path)
    for row in rows:
        assert sc.start_version <= row["_commit_version"] <= end
        assert row["_change_type"] in {"insert", "delete", "update_preimage", "update_postimage"}
        assert isinstance(row["_commit_timestamp"], int)
        assert row["amount"] is None or isinstance(row["amount"], str)
    assert rows == normalize_cdf_rows(rows), "spark_cdf output is already canonical"


# --------------------------------------------------------------------------- scenario-specific shape


@spark_test
def test_inserts(spark: Any, spark_scenarios: ScenarioCache) -> None:  # noqa: F811
    sc, rows = _read(spark_scenarios, "inserts")
    assert _types_by_version(rows) == {
        sc.marks["first_insert"]: Counter(insert=10),
        sc.marks["second_insert"]: Counter(insert=15),
    }
    assert {r["id"] for r in rows} == set(range(25))
    row = next(r for r in rows if r["id"] == 3)
    assert row["amount"] == "3.75" and row["name"] == "n-3"


@spark_test
@pytest.mark.parametrize("name", ["update", "update_dv"])
def test_update(name: str, spark: Any, spark_scenarios: ScenarioCache) -> None:  # noqa: F811
    sc, rows = _read(spark_scenarios, name)
    v = sc.marks["update"]
    updated = {0, 4, 8, 12, 16}
    assert _ids(rows, v, "update_preimage") == updated
    assert _ids(rows, v, "update_postimage") == updated
    assert set(_types_by_version(rows)[v]) == {"update_preimage", "update_postimage"}
    post = {r["id"]: r for r in rows if r["_commit_version"] == v and r["_change_type"] == "update_postimage"}
    assert post[4]["name"] == "n-4-u" and Decimal(post[4]["amount"]) == Decimal("6.00")
    summary = commit_summary(sc.path, v)
    assert summary.get("cdc", 0) >= 1, "UPDATE writes a cdc file with or without DVs"
    assert ("add+dv" in summary) == name.endswith("_dv")


@spark_test
@pytest.mark.parametrize("name", ["delete", "delete_dv"])
def test_delete(name: str, spark: Any, spark_scenarios: ScenarioCache) -> None:  # noqa: F811
    sc, rows = _read(spark_scenarios, name)
    v = sc.marks["delete"]
    assert _types_by_version(rows)[v] == Counter(delete=3)
    assert _ids(rows, v, "delete") == {3, 4, 11}
    summary = commit_summary(sc.path, v)
    if name == "delete_dv":
        assert "cdc" not in summary and summary.get("add+dv") == 1, summary
    else:
        assert summary.get("cdc") == 1, summary


@spark_test
@pytest.mark.parametrize("name", ["merge", "merge_dv", "merge_partitioned"])
def test_merge(name: str, spark: Any, spark_scenarios: ScenarioCache) -> None:  # noqa: F811
    sc, rows = _read(spark_scenarios, name)
    v = sc.marks["merge"]
    assert _ids(rows, v, "delete") == {0, 1, 2}
    assert _ids(rows, v, "update_preimage") == {6, 7, 8}
    assert _ids(rows, v, "update_postimage") == {6, 7, 8}
    assert _ids(rows, v, "insert") == {20, 21, 22, 23}
    post = {r["id"]: r for r in rows if r["_commit_version"] == v and r["_change_type"] == "update_postimage"}
    assert post[7]["name"] == "m-7" and post[7]["amount"] == "14.00"
    if name == "merge_partitioned":
        assert {r["part"] for r in rows if r["_commit_version"] == v} == {"even", "odd"}
        assert all(r["part"] == ("even" if r["id"] % 2 == 0 else "odd") for r in rows)
    assert ("add+dv" in commit_summary(sc.path, v)) == (name == "merge_dv")


@spark_test
def test_dv_then_whole_file_delete(spark: Any, spark_scenarios: ScenarioCache) -> None:  # noqa: F811
    sc, rows = _read(spark_scenarios, "dv_then_whole_file_delete")
    assert _ids(rows, sc.marks["dv_delete"], "delete") == {1, 2}
    # Rows 1 and 2 were already gone: the whole-file delete must not report them again.
    assert _ids(rows, sc.marks["whole_file_delete"], "delete") == {0, 3, 4, 5, 6, 7, 8, 9}
    assert len(rows) == 10
    assert commit_summary(sc.path, sc.marks["whole_file_delete"]) == {"remove+dv": 1}


@spark_test
def test_noop_merge_has_no_rows(spark: Any, spark_scenarios: ScenarioCache) -> None:  # noqa: F811
    sc = spark_scenarios.get("noop_merge")
    noop = sc.marks["noop_merge"]
    assert noop == sc.marks["insert"] + 1, "the no-op MERGE committed a version"
    assert commit_info(sc.path, noop)["operation"] == "MERGE"
    summary = commit_summary(sc.path, noop)
    assert summary.get("remove") and summary.get("add") and "cdc" not in summary, summary
    rows = spark_scenarios.rows(sc.name)
    assert noop not in _types_by_version(rows)
    assert _types_by_version(rows) == {
        sc.marks["insert"]: Counter(insert=10),
        sc.marks["insert_after"]: Counter(insert=2),
    }
    assert spark_cdf(spark, sc.path, noop, noop) == []


@spark_test
def test_restore_undeletes_dv_rows(spark: Any, spark_scenarios: ScenarioCache) -> None:  # noqa: F811
    sc, rows = _read(spark_scenarios, "restore")
    assert _types_by_version(rows) == {
        sc.marks["dv_delete"]: Counter(delete=3),
        sc.marks["dv_delete2"]: Counter(delete=2),
        sc.marks["restore_dv"]: Counter(insert=2),
        sc.marks["restore"]: Counter(insert=3),
    }
    assert _ids(rows, sc.marks["restore_dv"], "insert") == {5, 6}
    assert _ids(rows, sc.marks["restore"], "insert") == {1, 2, 12}
    for v in (sc.marks["restore_dv"], sc.marks["restore"]):
        assert commit_info(sc.path, v)["operation"] == "RESTORE"
        assert "cdc" not in commit_summary(sc.path, v)
    # The first RESTORE swaps one DV for a smaller one; the second drops the DVs.
    assert commit_summary(sc.path, sc.marks["restore_dv"]) == {"remove+dv": 1, "add+dv": 1}
    assert commit_summary(sc.path, sc.marks["restore"]) == {"remove+dv": 2, "add": 2}


@spark_test
def test_optimize_has_no_rows(spark: Any, spark_scenarios: ScenarioCache) -> None:  # noqa: F811
    sc, rows = _read(spark_scenarios, "optimize")
    opt = sc.marks["optimize"]
    assert commit_info(sc.path, opt)["operation"] == "OPTIMIZE"
    assert all("dataChange=false" in k for k in commit_summary(sc.path, opt)), commit_summary(sc.path, opt)
    assert opt not in _types_by_version(rows)
    assert _ids(rows, sc.marks["dv_delete"], "delete") == {2, 9}
    assert spark_cdf(spark, sc.path, opt, opt) == []


@spark_test
def test_delete_dv_partitioned(spark: Any, spark_scenarios: ScenarioCache) -> None:  # noqa: F811
    sc, rows = _read(spark_scenarios, "delete_dv_partitioned")
    assert _ids(rows, sc.marks["dv_delete"], "delete") == {4, 5, 6}
    evens_left = {i for i in range(0, 20, 2)} - {4, 6}
    assert _ids(rows, sc.marks["partition_delete"], "delete") == evens_left
    assert {r["part"] for r in rows if r["_commit_version"] == sc.marks["partition_delete"]} == {"even"}
    assert "add+dv" in commit_summary(sc.path, sc.marks["dv_delete"])


@spark_test
def test_column_mapping_add_column(spark: Any, spark_scenarios: ScenarioCache) -> None:  # noqa: F811
    sc = spark_scenarios.get("column_mapping_add_column")
    meta = next(a["metaData"] for a in commit_actions(sc.path, 0) if "metaData" in a)
    assert meta["configuration"]["delta.columnMapping.mode"] == "name"
    rows = spark_scenarios.rows(sc.name)
    assert all("extra" in r for r in rows)
    assert {r["extra"] for r in rows if r["_commit_version"] == sc.marks["insert"]} == {None}
    assert {r["extra"] for r in rows if r["_commit_version"] == sc.marks["insert2"]} == {
        f"x-{i}" for i in range(6, 10)
    }
    v = sc.marks["update"]
    assert _ids(rows, v, "update_postimage") == {1, 7}
    assert {
        r["extra"] for r in rows if r["_commit_version"] == v and r["_change_type"] == "update_postimage"
    } == {"upd"}


@spark_test
def test_incompatible_schema_changes_are_refused(spark: Any, spark_scenarios: ScenarioCache) -> None:  # noqa: F811
    rename = spark_scenarios.get("column_mapping_rename")
    assert spark_scenarios.error(rename.name) == "DELTA_CHANGE_DATA_FEED_INCOMPATIBLE_SCHEMA_CHANGE"
    # A range that starts at the rename is readable, under the new name.
    rows = spark_cdf(spark, rename.path, rename.marks["rename"], rename.marks["update"])
    assert _ids(rows, rename.marks["update"], "update_postimage") == {2}
    assert {r["full_name"] for r in rows if r["_change_type"] == "update_postimage"} == {"upd"}
    drop = spark_scenarios.get("drop_column_in_range")
    assert spark_scenarios.error(drop.name) == "DELTA_CHANGE_DATA_FEED_INCOMPATIBLE_DATA_SCHEMA"


@spark_test
def test_ict_from_create(spark: Any, spark_scenarios: ScenarioCache) -> None:  # noqa: F811
    sc, rows = _read(spark_scenarios, "ict_from_create")
    assert set(_types_by_version(rows)) == {sc.marks["insert"], sc.marks["update"]}
    for row in rows:
        ict_ms = commit_info(sc.path, row["_commit_version"])["inCommitTimestamp"]
        assert row["_commit_timestamp"] == ict_ms * 1000


@spark_test
def test_ict_enabled_mid_history(spark: Any, spark_scenarios: ScenarioCache) -> None:  # noqa: F811
    sc, rows = _read(spark_scenarios, "ict_enabled_mid_history")
    enabled = sc.marks["enable_ict"]
    assert "inCommitTimestamp" not in commit_info(sc.path, sc.marks["insert"])
    seen = set()
    for row in rows:
        v = row["_commit_version"]
        seen.add(v)
        if v < enabled:
            mtime_ns = os.stat(Path(sc.path) / "_delta_log" / f"{v:020d}.json").st_mtime_ns
            assert row["_commit_timestamp"] == mtime_ns // 1_000_000 * 1000
        else:
            assert row["_commit_timestamp"] == commit_info(sc.path, v)["inCommitTimestamp"] * 1000
    assert seen == {sc.marks["insert"], sc.marks["insert2"], sc.marks["update"]}


@spark_test
def test_start_after_checkpoint(spark: Any, spark_scenarios: ScenarioCache) -> None:  # noqa: F811
    sc = spark_scenarios.get("start_after_checkpoint")
    log = Path(sc.path) / "_delta_log"
    assert (log / f"{sc.marks['checkpoint']:020d}.checkpoint.parquet").exists()
    assert (log / f"{sc.marks['last_checkpoint']:020d}.checkpoint.parquet").exists()
    assert sc.start_version == sc.marks["checkpoint"] + 1
    rows = spark_scenarios.rows(sc.name)
    assert _types_by_version(rows) == {
        sc.marks["update"]: Counter(update_preimage=7, update_postimage=7),
        sc.marks["last_checkpoint"]: Counter(insert=2),
    }


@spark_test
@pytest.mark.parametrize(
    ("name", "has_extra"), [("add_column_after_end", True), ("add_column_after_end_cm", False)]
)
def test_add_column_after_end(name: str, has_extra: bool, spark: Any, spark_scenarios: ScenarioCache) -> None:  # noqa: F811
    sc = spark_scenarios.get(name)
    assert sc.marks["add_column"] > sc.end_version  # type: ignore[operator]
    rows = spark_scenarios.rows(sc.name)
    assert _types_by_version(rows) == {
        sc.marks["insert"]: Counter(insert=6),
        sc.marks["update"]: Counter(update_preimage=1, update_postimage=1),
    }
    # delta-spark's read schema: the latest one without column mapping, the end version's with it.
    assert all(("extra" in r) == has_extra for r in rows)
    if has_extra:
        assert {r["extra"] for r in rows} == {None}


@spark_test
def test_cdf_enabled_later(spark: Any, spark_scenarios: ScenarioCache) -> None:  # noqa: F811
    sc = spark_scenarios.get("cdf_enabled_later")
    assert spark_scenarios.error(sc.name) == "DELTA_MISSING_CHANGE_DATA"
    rows = spark_cdf(spark, sc.path, sc.marks["enable_cdf"], sc.end_version)
    assert _types_by_version(rows) == {sc.marks["insert2"]: Counter(insert=3)}


@spark_test
def test_error_classes_of_bad_ranges(spark: Any, spark_scenarios: ScenarioCache) -> None:  # noqa: F811
    sc = spark_scenarios.get("inserts")
    last = latest_version(sc.path)
    assert spark_cdf_error(spark, sc.path, start=0, end=last) is None
    assert spark_cdf_error(spark, sc.path, start=last + 1) == "DELTA_CDC_START_VERSION_AFTER_LATEST"
    assert spark_cdf_error(spark, sc.path, start=2, end=1) == "DELTA_INVALID_CDC_RANGE"
