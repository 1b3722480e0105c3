"""The commits-topic summary of a snapshot: its distinct partitions, found in Arrow, match a plain loop."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from deltamirror.core.partitions import distinct_partitions
from deltamirror.core.table import open_table
from deltamirror.producer.tailing import snapshot_events
from deltamirror.producer.tailing.snapshot_events import SnapshotWork

STRING_MAP = pa.map_(pa.string(), pa.string())


def reference(maps: list[dict[str, Any] | None], limit: int) -> tuple[list[dict[str, Any]], bool]:
    """Distinct non-empty maps, first met first, whatever the order of their entries."""
    seen: dict[frozenset[tuple[str, Any]], dict[str, Any]] = {}
    for values in maps:
        if not values:
            continue
        key = frozenset(values.items())
        if key not in seen:
            if len(seen) >= limit:
                return list(seen.values()), True
            seen[key] = values
    return list(seen.values()), False


def random_map(rng: random.Random) -> dict[str, Any] | None:
    pick = rng.random()
    if pick < 0.05:
        return None
    if pick < 0.1:
        return {}
    keys = rng.sample(["d", "region", "é", "a,b"], rng.randrange(1, 4))  # any order, as writers may
    return {k: rng.choice([None, "", "1", "2", "1,2", "x:y", "日"]) for k in keys}


def as_listed(result: tuple[list[dict[str, Any]], bool]) -> tuple[list[list[tuple[str, Any]]], bool]:
    """The result with each map's entry order visible (dict equality ignores it)."""
    return [list(m.items()) for m in result[0]], result[1]


@pytest.mark.parametrize("seed", range(40))
def test_distinct_partitions_match_a_python_loop(seed: int) -> None:
    rng = random.Random(seed)
    maps = [random_map(rng) for _ in range(rng.randrange(0, 80))]
    limit = rng.randrange(1, 40)
    array = pa.array([None if m is None else list(m.items()) for m in maps], STRING_MAP)
    cut = rng.randrange(0, len(maps) + 1)
    expected = as_listed(reference(maps, limit))
    assert as_listed(distinct_partitions(array, limit)) == expected
    chunked = pa.chunked_array([array.slice(0, cut), array.slice(cut)], STRING_MAP)
    assert as_listed(distinct_partitions(chunked, limit)) == expected
    assert as_listed(distinct_partitions(array.slice(cut), limit)) == as_listed(reference(maps[cut:], limit))


def test_no_partition_values_give_an_empty_list() -> None:
    assert distinct_partitions(pa.array([None, [], []], STRING_MAP), 5) == ([], False)


def write_partitioned_table(path: Path, adds: list[dict[str, Any]]) -> None:
    schema = {
        "type": "struct",
        "fields": [
            {"name": "id", "type": "long", "nullable": True, "metadata": {}},
            {"name": "d", "type": "string", "nullable": True, "metadata": {}},
            {"name": "region", "type": "string", "nullable": True, "metadata": {}},
        ],
    }
    lines = [
        {"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}},
        {
            "metaData": {
                "id": "c0ffee00-0000-0000-0000-000000000001",
                "format": {"provider": "parquet", "options": {}},
                "schemaString": json.dumps(schema),
                "partitionColumns": ["d", "region"],
                "configuration": {},
                "createdTime": 1_700_000_000_000,
            }
        },
        *({"add": add} for add in adds),
    ]
    (path / "_delta_log").mkdir(parents=True)
    (path / "_delta_log" / f"{0:020d}.json").write_text("".join(json.dumps(line) + "\n" for line in lines))


@pytest.mark.parametrize("files", [300, 2600], ids=["listed-whole", "truncated"])
def test_snapshot_summary_lists_the_partitions_of_its_files_in_path_order(tmp_path: Path, files: int) -> None:
    rng = random.Random(files)
    adds: list[dict[str, Any]] = []
    for i in range(files):
        values: dict[str, str | None] = {
            "d": None if i % 17 == 0 else f"2024-{rng.randrange(1, 13):02d}-{rng.randrange(1, 29):02d}",
            "region": None if i % 23 == 0 else rng.choice(["eu", "us", "ap", "af", "sa", "me", "oc", "an"]),
        }
        if rng.random() < 0.3:
            values = dict(reversed(values.items()))  # the same partition written with another key order
        adds.append(
            {
                "path": f"f-{rng.randrange(10**9):09d}-{i}.parquet",
                "partitionValues": values,
                "size": 100 + i,
                "modificationTime": 1,
                "dataChange": True,
            }
        )
    write_partitioned_table(tmp_path, adds)
    snap = open_table(str(tmp_path)).snapshot()
    summary = SnapshotWork(snap, str(tmp_path), snap.timestamp).summary()

    by_path = sorted(adds, key=lambda a: a["path"])
    limit = snapshot_events.MAX_PARTITIONS_LISTED
    expected, truncated = reference([a["partitionValues"] for a in by_path], limit)
    assert (files > 2000) == truncated  # the generated sizes do exercise both sides of the limit
    assert summary.partitions_touched_truncated is truncated
    assert len(summary.partitions_touched) == (limit if truncated else len(expected))
    assert [list(p.items()) for p in summary.partitions_touched] == [list(p.items()) for p in expected]
    assert summary.adds == files and summary.bytes_added == sum(a["size"] for a in adds)
