"""Net changes over a range: one event per row for what the range did to it.

The rule (core/changes/net.py): with key columns, a row's first and last change say whether it
existed before and after the range; without them the feed is a difference of two multisets of
rows. Either way the result must equal the difference between the table's state before the range
and after it, which is what the delta-spark test below checks on tables delta-spark wrote.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from deltamirror.core.changes import NetChangesError, net_changes
from support.spark_scenarios import spark_scenarios  # noqa: F401  (session fixture)

SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("name", pa.string()),
        ("_change_type", pa.string()),
        ("_commit_version", pa.int64()),
        ("_commit_timestamp", pa.timestamp("us", tz="UTC")),
    ]
)


def _feed(*rows: tuple[int, str | None, str, int]) -> pa.Table:
    return pa.table(
        {
            "id": [r[0] for r in rows],
            "name": [r[1] for r in rows],
            "_change_type": [r[2] for r in rows],
            "_commit_version": [r[3] for r in rows],
            "_commit_timestamp": [r[3] * 1000 for r in rows],
        },
        schema=SCHEMA,
    )


def _rows(table: pa.Table) -> list[tuple[Any, ...]]:
    return [(r["id"], r["name"], r["_change_type"], r["_commit_version"]) for r in table.to_pylist()]


def test_each_key_gives_its_net_effect() -> None:
    feed = _feed(
        (1, "a", "insert", 1),  # inserted, then changed: one insert of the last state
        (2, "b", "delete", 1),  # existed before, deleted: one delete of the state before
        (3, "c", "update_preimage", 1),  # updated twice: the first before, the last after
        (3, "c2", "update_postimage", 1),
        (4, "d", "insert", 2),  # inserted and deleted inside the range: nothing
        (1, "a", "update_preimage", 2),
        (1, "a2", "update_postimage", 2),
        (3, "c2", "update_preimage", 3),
        (3, "c3", "update_postimage", 3),
        (4, "d", "delete", 3),
        (5, "e", "update_preimage", 3),  # changed and changed back: nothing
        (5, "x", "update_postimage", 3),
        (5, "x", "update_preimage", 4),
        (5, "e", "update_postimage", 4),
    )
    assert _rows(net_changes(feed, ["id"])) == [
        (2, "b", "delete", 1),
        (1, "a2", "insert", 2),
        (3, "c", "update_preimage", 3),
        (3, "c3", "update_postimage", 3),
    ]


def test_a_deleted_then_reinserted_row_is_an_update_or_nothing() -> None:
    feed = _feed((1, "a", "delete", 1), (1, "b", "insert", 2), (2, "z", "delete", 1), (2, "z", "insert", 2))
    assert _rows(net_changes(feed, ["id"])) == [
        (1, "a", "update_preimage", 2),
        (1, "b", "update_postimage", 2),
    ]


def test_without_keys_a_row_is_its_values_and_counts() -> None:
    feed = _feed(
        (1, "a", "insert", 1),
        (1, "a", "insert", 1),  # two equal rows inserted, one deleted: one insert
        (1, "a", "delete", 2),
        (2, "b", "update_preimage", 2),  # an update is a delete and an insert, never paired
        (2, "b2", "update_postimage", 2),
        (3, "c", "insert", 2),
        (3, "c", "delete", 3),
    )
    assert sorted(_rows(net_changes(feed))) == sorted(
        [(1, "a", "insert", 2), (2, "b", "delete", 2), (2, "b2", "insert", 2)]
    )


def test_null_values_count_as_equal_to_nulls() -> None:
    feed = _feed((1, None, "update_preimage", 1), (1, None, "update_postimage", 1))
    assert _rows(net_changes(feed, ["id"])) == []


def test_keys_that_are_not_unique_are_refused() -> None:
    feed = _feed((1, "a", "insert", 1), (1, "b", "insert", 1))
    with pytest.raises(NetChangesError, match="not unique"):
        net_changes(feed, ["id"], table="t")


def test_an_unknown_key_column_and_a_nested_one_are_refused_by_name() -> None:
    with pytest.raises(NetChangesError, match="'nope'") as info:
        net_changes(_feed((1, "a", "insert", 1)), ["nope"], table="t")
    assert info.value.column == "nope" and info.value.table == "t"
    nested = pa.table(
        {
            "s": pa.array([{"x": 1}], pa.struct([("x", pa.int64())])),
            "_change_type": ["insert"],
            "_commit_version": pa.array([1], pa.int64()),
            "_commit_timestamp": pa.array([1], pa.timestamp("us", tz="UTC")),
        }
    )
    with pytest.raises(NetChangesError, match="'s'"):
        net_changes(nested)


def test_an_empty_range_gives_an_empty_table_of_the_same_columns() -> None:
    out = net_changes(iter(()), ["id"], schema=SCHEMA)
    assert out.num_rows == 0 and out.schema.names == SCHEMA.names


# --- against delta-spark: the net changes equal the difference of its two snapshots ------------------

NET_SCENARIOS = ("update", "delete", "merge", "update_dv", "delete_dv", "merge_dv", "noop_merge", "inserts")


def _spark_state(spark: Any, path: str, version: int) -> list[dict[str, Any]]:
    if version < 0:
        return []
    frame = spark.read.format("delta").option("versionAsOf", version).load(path)
    return [row.asDict() for row in frame.collect()]


def _expected_keyed(
    before: list[dict[str, Any]], after: list[dict[str, Any]]
) -> list[tuple[str, tuple[Any, ...]]]:
    old = {r["id"]: r for r in before}
    new = {r["id"]: r for r in after}
    out: list[tuple[str, tuple[Any, ...]]] = []
    for key in new.keys() - old.keys():
        out.append(("insert", tuple(sorted(new[key].items()))))
    for key in old.keys() - new.keys():
        out.append(("delete", tuple(sorted(old[key].items()))))
    for key in old.keys() & new.keys():
        if old[key] != new[key]:
            out.append(("update_preimage", tuple(sorted(old[key].items()))))
            out.append(("update_postimage", tuple(sorted(new[key].items()))))
    return sorted(out)


def _expected_unkeyed(
    before: list[dict[str, Any]], after: list[dict[str, Any]]
) -> list[tuple[str, tuple[Any, ...]]]:
    from collections import Counter

    old = Counter(tuple(sorted(r.items())) for r in before)
    new = Counter(tuple(sorted(r.items())) for r in after)
    out = [("insert", row) for row, n in (new - old).items() for _ in range(n)]
    out += [("delete", row) for row, n in (old - new).items() for _ in range(n)]
    return sorted(out)


def _ours(table: pa.Table) -> list[tuple[str, tuple[Any, ...]]]:
    data = [c for c in table.column_names if not c.startswith("_")]
    return sorted((r["_change_type"], tuple(sorted((c, r[c]) for c in data))) for r in table.to_pylist())


@pytest.mark.spark
@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", NET_SCENARIOS)
def test_net_changes_equal_the_difference_of_delta_spark_snapshots(
    spark: Any,
    spark_scenarios: Any,  # noqa: F811
    name: str,
) -> None:
    from deltamirror.core.changes import read_changes
    from deltamirror.core.table import open_table

    sc = spark_scenarios.get(name)
    end = sc.end_version
    assert end is not None
    before = _spark_state(spark, sc.path, sc.start_version - 1)
    after = _spark_state(spark, sc.path, end)
    feed = read_changes(open_table(sc.path), starting_version=sc.start_version, ending_version=end)
    keyed = net_changes(feed, ["id"], schema=feed.schema, table=sc.path)
    assert _ours(keyed) == _expected_keyed(before, after)
    assert _ours(net_changes(feed, schema=feed.schema)) == _expected_unkeyed(before, after)
    assert set(keyed.column("_commit_version").to_pylist()) <= set(range(sc.start_version, end + 1))


def test_a_versions_post_images_before_its_pre_images_still_pair_as_delta_rs_writes_them() -> None:
    feed = _feed(
        (1, "a", "insert", 0),
        (2, "b", "insert", 0),
        (1, "a2", "update_postimage", 1),  # delta-rs: a version's post-images, then its pre-images
        (2, "b2", "update_postimage", 1),
        (1, "a", "update_preimage", 1),
        (2, "b", "update_preimage", 1),
    )
    assert _rows(net_changes(feed, ["id"])) == [(1, "a2", "insert", 1), (2, "b2", "insert", 1)]
    assert _rows(net_changes(feed.slice(2), ["id"])) == [
        (1, "a", "update_preimage", 1),
        (1, "a2", "update_postimage", 1),
        (2, "b", "update_preimage", 1),
        (2, "b2", "update_postimage", 1),
    ]


def test_net_changes_of_a_table_delta_rs_updated_equal_its_state(tmp_path: Any) -> None:
    from deltalake import DeltaTable, write_deltalake

    from deltamirror.core.changes import read_changes
    from deltamirror.core.table import open_table

    data = pa.table({"id": pa.array(range(4), pa.int64()), "name": pa.array(list("abcd"))})
    write_deltalake(str(tmp_path), data, configuration={"delta.enableChangeDataFeed": "true"})
    DeltaTable(str(tmp_path)).update(updates={"name": "'z'"})  # post-images first, then pre-images
    net = net_changes(read_changes(open_table(str(tmp_path)), starting_version=0), ["id"])
    assert sorted(_rows(net)) == [
        (0, "z", "insert", 1),
        (1, "z", "insert", 1),
        (2, "z", "insert", 1),
        (3, "z", "insert", 1),
    ]


def test_a_row_rewritten_with_its_own_values_is_unchanged_whatever_its_row_commit_version() -> None:
    """With row ids read, a row an UPDATE rewrote with the values it had gets a new
    ``_row_commit_version``; that is where it was written, not a value: no net change."""
    feed = _feed(
        (1, "a", "update_preimage", 2),
        (1, "a", "update_postimage", 2),
        (2, "b", "update_preimage", 2),
        (2, "b2", "update_postimage", 2),
    )
    feed = feed.append_column("_row_id", pa.array([10, 10, 11, 11], pa.int64()))
    feed = feed.append_column("_row_commit_version", pa.array([1, 2, 1, 2], pa.int64()))
    net = net_changes(feed, ["_row_id"])
    assert [(r["_row_id"], r["name"], r["_change_type"]) for r in net.to_pylist()] == [
        (11, "b", "update_preimage"),
        (11, "b2", "update_postimage"),
    ]
