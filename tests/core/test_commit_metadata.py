"""``DeltaTable.commit_metadata``: the metaData a version commits, checked at the log boundary."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from deltamirror.core import open_table
from deltamirror.core.errors import CorruptLogError
from support.cdf_tables import cdf_table


def test_the_metadata_of_the_version_that_commits_one_and_none_for_the_others(tmp_path: Path) -> None:
    latest = cdf_table(tmp_path / "t")
    table = open_table(str(tmp_path / "t"))
    first = table.commit_metadata(0)
    assert first is not None and first == table.snapshot(version=0).metadata
    assert [table.commit_metadata(v) for v in range(1, latest + 1)] == [None] * latest


def test_a_metadata_line_the_boundary_refuses_names_its_file_and_line(tmp_path: Path) -> None:
    cdf_table(tmp_path / "t")
    log = tmp_path / "t" / "_delta_log" / f"{0:020d}.json"
    lines = log.read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if '"metaData"' in line)
    action = json.loads(lines[at])
    action["metaData"]["partitionColumns"] = "id"  # a string where the protocol has an array
    lines[at] = json.dumps(action)
    log.write_text("\n".join(lines) + "\n")
    with pytest.raises(CorruptLogError) as refused:
        open_table(str(tmp_path / "t")).commit_metadata(0)
    assert f"{0:020d}.json" in str(refused.value) and f"line={at + 1}" in str(refused.value)
