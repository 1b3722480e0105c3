"""Replay and timestamp resolution against small reference models, with generated histories.

The reference models are written the obvious way (a dict per file, a loop per version); the
implementation is columnar. Hypothesis looks for histories where they disagree.
"""

from __future__ import annotations

import itertools
import json
import uuid
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deltamirror.core import action_schema, errors
from deltamirror.core.table import open_table
from deltamirror.core.timestamps import (
    CommitTime,
    IctConfig,
    TimestampSource,
    resolve_timestamps,
    version_at_or_after,
    version_at_or_before,
)

PATHS = [f"part-{i}.parquet" for i in range(6)]
DVS = [None, "dv-a", "dv-b"]
SCHEMA = json.dumps(
    {"type": "struct", "fields": [{"name": "id", "type": "long", "nullable": True, "metadata": {}}]}
)

STRINGS = pa.list_(pa.string())
CHECKPOINT_SCHEMA = pa.schema(
    [
        ("add", pa.struct(list(action_schema.ADD))),
        (
            "protocol",
            pa.struct(
                [
                    ("minReaderVersion", pa.int32()),
                    ("minWriterVersion", pa.int32()),
                    ("readerFeatures", STRINGS),
                    ("writerFeatures", STRINGS),
                ]
            ),
        ),
        (
            "metaData",
            pa.struct(
                [
                    ("id", pa.string()),
                    ("format", pa.struct([("provider", pa.string()), ("options", action_schema.STRING_MAP)])),
                    ("schemaString", pa.string()),
                    ("partitionColumns", STRINGS),
                    ("configuration", action_schema.STRING_MAP),
                ]
            ),
        ),
    ]
)

file_action = st.tuples(st.sampled_from(["add", "remove"]), st.sampled_from(PATHS), st.sampled_from(DVS))
histories = st.lists(st.lists(file_action, min_size=0, max_size=6), min_size=1, max_size=12)


def _dv(name: str | None) -> dict[str, Any] | None:
    if name is None:
        return None
    return {"storageType": "u", "pathOrInlineDv": name.ljust(20, "x"), "sizeInBytes": 10, "cardinality": 1}


def _body(kind: str, path: str, dv: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {"path": path, "dataChange": True}
    if kind == "add":
        body.update(partitionValues={}, size=len(path), modificationTime=1)
    else:
        body.update(deletionTimestamp=1)
    if dv is not None:
        body["deletionVector"] = _dv(dv)
    return body


def _write_table(history: list[list[tuple[str, str, str | None]]], checkpoint_at: int | None) -> str:
    """A table in memory://: version 0 creates it, version i+1 applies history[i]."""
    root = f"memory://replay-{uuid.uuid4().hex}"
    fs = fsspec.filesystem("memory")
    log = f"{root}/_delta_log"
    v0 = [
        {
            "protocol": {
                "minReaderVersion": 3,
                "minWriterVersion": 7,
                "readerFeatures": ["deletionVectors"],
                "writerFeatures": ["deletionVectors"],
            }
        },
        {
            "metaData": {
                "id": "t",
                "format": {"provider": "parquet", "options": {}},
                "schemaString": SCHEMA,
                "partitionColumns": [],
                "configuration": {},
            }
        },
    ]
    # every commit carries a commitInfo, as writers write them: an empty commit file is corrupt
    commits = [v0] + [
        [{"commitInfo": {"operation": "WRITE"}}] + [{kind: _body(kind, p, dv)} for kind, p, dv in actions]
        for actions in history
    ]
    for v, actions in enumerate(commits):
        fs.pipe(f"{log}/{v:020d}.json", "\n".join(json.dumps(a) for a in actions).encode())
    if checkpoint_at is not None:
        state = _reference(history[:checkpoint_at])
        rows: list[dict[str, Any]] = [v0[0], v0[1]]
        rows += [{"add": _body("add", p, dv)} for p, dv in state]
        table = pa.Table.from_pylist(
            [
                {"add": r.get("add"), "protocol": r.get("protocol"), "metaData": r.get("metaData")}
                for r in rows
            ],
            schema=CHECKPOINT_SCHEMA,
        )
        with fs.open(f"{log}/{checkpoint_at:020d}.checkpoint.parquet", "wb") as fh:
            pq.write_table(table, fh)
    return root


def _reference(history: list[list[tuple[str, str, str | None]]]) -> set[tuple[str, str | None]]:
    """Active (path, dv) after applying every action in order: the protocol's words, literally."""
    active: set[tuple[str, str | None]] = set()
    for actions in history:
        for kind, path, dv in actions:
            if kind == "add":
                active.add((path, dv))
            else:
                active.discard((path, dv))
    return active


def _ours(root: str, version: int) -> set[tuple[str, str | None]]:
    files = open_table(root).snapshot(version=version).files
    dvs = files["deletionVector"].to_pylist()
    return {
        (p, dv["pathOrInlineDv"].rstrip("x") if dv else None)
        for p, dv in zip(files["path"].to_pylist(), dvs, strict=True)
    }


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(history=histories, data=st.data())
def test_replay_matches_reference_model(
    history: list[list[tuple[str, str, str | None]]], data: st.DataObject
) -> None:
    checkpoint_at = data.draw(st.none() | st.integers(min_value=1, max_value=len(history)))
    root = _write_table(history, checkpoint_at)
    latest = len(history)
    version = data.draw(st.integers(min_value=checkpoint_at or 0, max_value=latest))
    # actions within one commit are applied in order too (the last one on a key wins)
    assert _ours(root, version) == _reference(history[:version])


# --- timestamps -----------------------------------------------------------------------------------

file_times = st.lists(st.integers(min_value=1_000, max_value=1_050), min_size=1, max_size=15)


def _reference_timestamps(
    times: list[int], icts: list[int | None], enablement: int | None
) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    for v, t in enumerate(times):
        if enablement is not None and v >= enablement:
            ict = icts[v]
            assert ict is not None
            out.append((ict, "ict"))
        elif out and t <= out[-1][0]:
            out.append((out[-1][0] + 1, "adjusted-file-time"))
        else:
            out.append((t, "file-time"))
    return out


@given(times=file_times, data=st.data())
def test_timestamp_resolution_matches_reference(times: list[int], data: st.DataObject) -> None:
    enablement = data.draw(st.none() | st.integers(min_value=0, max_value=len(times) - 1))
    icts: list[int | None] = [None] * len(times)
    if enablement is not None:
        start = data.draw(st.integers(min_value=2_000, max_value=3_000))
        gaps = data.draw(st.lists(st.integers(1, 20), min_size=len(times), max_size=len(times)))
        for v in range(enablement, len(times)):
            icts[v] = start + sum(gaps[enablement : v + 1])
    ict = IctConfig(
        enablement is not None,
        enablement if enablement else None,
        icts[enablement] if enablement else None,
    )
    resolved = resolve_timestamps([CommitTime(v, t, icts[v]) for v, t in enumerate(times)], ict)
    expected = _reference_timestamps(times, icts, enablement)
    assert [(r.timestamp, str(r.source)) for r in resolved] == expected
    # strictly increasing: what a time-travel search needs
    assert all(a.timestamp < b.timestamp for a, b in itertools.pairwise(resolved))

    probe = data.draw(st.integers(min_value=990, max_value=3_500))
    space = resolved
    if ict.enablement_version is not None and ict.enablement_timestamp is not None:
        space = [
            r
            for r in resolved
            if (r.version >= ict.enablement_version) == (probe >= ict.enablement_timestamp)
        ]
    at_or_before = [r.version for r in space if r.timestamp <= probe]
    if probe > resolved[-1].timestamp or not at_or_before:
        try:
            version_at_or_before(resolved, probe, ict)
        except errors.TimestampOutOfRangeError:
            pass
        else:
            raise AssertionError("expected TimestampOutOfRangeError")
    else:
        assert version_at_or_before(resolved, probe, ict) == max(at_or_before)
    at_or_after = [r.version for r in space if r.timestamp >= probe] or [
        r.version for r in resolved if r.timestamp >= probe
    ]
    assert version_at_or_after(resolved, probe, ict) == (min(at_or_after) if at_or_after else None)


def test_adjusted_source_is_reported() -> None:
    resolved = resolve_timestamps([CommitTime(0, 100), CommitTime(1, 100), CommitTime(2, 50)], IctConfig())
    assert [(r.timestamp, r.source) for r in resolved] == [
        (100, TimestampSource.FILE_TIME),
        (101, TimestampSource.ADJUSTED_FILE_TIME),
        (102, TimestampSource.ADJUSTED_FILE_TIME),
    ]
