"""The producer's events of real tables: each one the log's action, in the wire contract's schema."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from deltamirror.core.errors import LogGapError
from deltamirror.core.log import read_commit
from deltamirror.core.table import open_table
from deltamirror.mirror.records import events
from deltamirror.producer.publishing.offline_events import iter_event_values
from support.tables import TABLES, table_cases

VALIDATOR = jsonschema.Draft202012Validator(events.json_schema())

# tables whose whole log is readable and whose features deltamirror supports
READABLE = [
    c.id
    for c in table_cases()
    if not c.must_fail
    and c.id
    not in {
        "drs__err_table_b",
        "drs__err_table_c",
        "drs__err_table_g",
        "golden__data-reader-absolute-paths-escaped-chars",
        "kj__spark-shredded-variant-preview-delta",
        "krs__table-with-geo",
        "spark__variant-stats-nested-no-checkpoint",
        "krs__crc-malformed",
        "drs__err_table_d",
        "kj__bench-basic_catalog_managed",
        "kj__catalog-owned-preview",
        "krs__catalog_managed_0",
    }
]


@pytest.mark.parametrize("table_id", READABLE)
def test_events_of_every_real_table_follow_the_contract(table_id: str) -> None:
    """Every action of every version: schema-valid, in log order, with core's resolved timestamps."""
    path = TABLES / table_id
    values = list(iter_event_values(str(path)))
    table = open_table(str(path))
    expected_ts = {t.version: t for t in table.commit_timestamps()}
    by_version: dict[int, list[dict[str, Any]]] = {}
    for value in values:
        event = json.loads(value)
        VALIDATOR.validate(event)
        by_version.setdefault(event["version"], []).append(event)
    assert sorted(by_version) == sorted(
        v for v in table.listing(0).commits if v >= min(by_version, default=0)
    )
    for version, evs in by_version.items():
        log_actions = read_commit(table.storage, version)
        assert [e["index"] for e in evs] == list(range(len(log_actions)))
        assert all(e["count"] == len(log_actions) for e in evs)
        assert [{e["type"]: e["action"]} for e in evs] == log_actions
        ts = expected_ts[version]
        assert {(e["commitTimestamp"], e["commitTimestampSource"]) for e in evs} == {
            (ts.timestamp, str(ts.source))
        }
        assert {e["tableUri"] for e in evs} == {table.uri}


def test_events_refuse_a_gap_in_the_log_instead_of_skipping_it() -> None:
    with pytest.raises(LogGapError) as info:
        list(iter_event_values(str(TABLES / "drs__err_table_b")))
    assert info.value.version == 7


@pytest.mark.parametrize(
    "sub_ms",
    [(0, 999_999, 0, 999_999, 0, 999_999), (999_999, 0, 0, 999_999, 999_999, 0)],
)
def test_a_version_has_one_timestamp_when_its_file_times_fall_in_one_ms(
    tmp_path: Path, sub_ms: tuple[int, ...]
) -> None:
    """Files checked out together share a ms, some of them a ns short of the next: the listing
    (seconds as a float) rounded those up and the stat truncated them, so the events and the
    table's timestamps told one version apart as ``file-time`` and ``adjusted-file-time`` (CI,
    2026-11-30: golden__snapshot-vacuumed)."""
    import os
    import shutil

    table = tmp_path / "t"
    shutil.copytree(TABLES / "golden__snapshot-vacuumed", table)
    base_ns = 1_796_013_591_896 * 1_000_000
    for version, sub in enumerate(sub_ms):
        path = table / "_delta_log" / f"{version:020d}.json"
        os.utime(path, ns=(base_ns + sub, base_ns + sub))
    expected = {t.version: (t.timestamp, str(t.source)) for t in open_table(str(table)).commit_timestamps()}
    for value in iter_event_values(str(table)):
        event = json.loads(value)
        assert (event["commitTimestamp"], event["commitTimestampSource"]) == expected[event["version"]]
