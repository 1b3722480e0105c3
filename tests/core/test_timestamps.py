"""One timestamp per version, whoever asks: snapshot, history, time travel, the watcher and `events`.

The expected values come from delta-spark's rule written out here from its source
(``DeltaHistoryManager.monotonizeCommitTimestamps`` over the commit files listed from the earliest
one, ``getEarliestDeltaFile``), applied to file times the tests set themselves with ``os.utime``,
or from the ``inCommitTimestamp`` the test reads from the commit file. Every case is checked with
the table's checkpoints present and deleted: a checkpoint must not change any answer.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

import pytest

from deltamirror.cli.main import main
from deltamirror.core import errors
from deltamirror.core.head import timestamp_of
from deltamirror.core.table import open_table
from deltamirror.core.timestamps import IctConfig, format_iso
from deltamirror.producer.publishing.offline_events import iter_event_values
from support.tables import TABLES, copy_table

BASE_S = 1_700_000_000  # whole seconds: no float rounding between os.utime and the listing

#: real tables with checkpoints (classic, multi-part, V2 JSON, classic without _last_checkpoint, DVs)
CHECKPOINTED = [
    "golden__basic-with-inserts-deletes-checkpoint",
    "golden__multi-part-checkpoint",
    "golden__v2-checkpoint-json",
    "krs__with_checkpoint_no_last_checkpoint",
    "kj__basic-dv-with-checkpoint",
]


def _log(path: Path) -> Path:
    return path / "_delta_log"


def _commit_versions(path: Path) -> list[int]:
    return sorted(int(f.name[:20]) for f in _log(path).iterdir() if re.fullmatch(r"\d{20}\.json", f.name))


def _checkpoint_versions(path: Path) -> list[int]:
    return sorted(
        {int(f.name[:20]) for f in _log(path).iterdir() if re.match(r"\d{20}\.checkpoint\.", f.name)}
    )


def _set_file_times(path: Path, seconds: dict[int, int]) -> dict[int, int]:
    """Set commit files' modification times; returns them in epoch ms."""
    for v, s in seconds.items():
        os.utime(_log(path) / f"{v:020d}.json", (s, s))
    return {v: s * 1000 for v, s in seconds.items()}


def _disordered_times(path: Path, base: int = BASE_S) -> dict[int, int]:
    """File times that need the monotonic adjustment: the commit before the first checkpoint is far
    ahead of every later one, and the first two commits share a time."""
    versions = _commit_versions(path)
    seconds = {v: base + 100 * i for i, v in enumerate(versions)}
    seconds[versions[1]] = seconds[versions[0]]
    cp = _checkpoint_versions(path)
    ahead = max((v for v in versions if cp and v < cp[0]), default=versions[0])
    seconds[ahead] = base + 100 * len(versions) + 5000
    return _set_file_times(path, seconds)


def delta_spark_rule(file_times_ms: dict[int, int]) -> dict[int, int]:
    """monotonizeCommitTimestamps over the listed commits, from the earliest listed one."""
    out: dict[int, int] = {}
    prev: int | None = None
    for v in sorted(file_times_ms):
        t = file_times_ms[v]
        if prev is not None and t <= prev:
            t = prev + 1
        out[v] = t
        prev = t
    return out


def _delete_checkpoints(path: Path) -> None:
    for f in list(_log(path).iterdir()):
        if ".checkpoint." in f.name or f.name == "_last_checkpoint":
            f.unlink()
    sidecars = _log(path) / "_sidecars"
    if sidecars.is_dir():
        for f in sidecars.iterdir():
            f.unlink()


def _events_timestamps(path: Path, start: int | None = None) -> dict[int, int]:
    out: dict[int, int] = {}
    for value in iter_event_values(str(path), starting_version=start):
        env = json.loads(value)
        assert out.setdefault(env["version"], env["commitTimestamp"]) == env["commitTimestamp"]
    return out


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _assert_every_reader_says(
    path: Path, expected: dict[int, int], capsys: pytest.CaptureFixture[str], *, events_from: int
) -> None:
    """Every reader gives ``expected[v]`` for every version v."""
    table = open_table(str(path))
    assert {e.version: e.timestamp.timestamp for e in table.history()} == expected
    assert {t.version: t.timestamp for t in table.commit_timestamps()} == expected
    for v, ts in expected.items():
        assert table.snapshot(v).timestamp.timestamp == ts, f"snapshot v{v}"
        assert table.commit_timestamp(v).timestamp == ts, f"commit_timestamp v{v}"
        assert timestamp_of(table, v, IctConfig()).timestamp == ts, f"watcher v{v}"
        assert table.version_at(ts) == v, f"version_at v{v}"
    later = {v: ts for v, ts in expected.items() if v >= events_from}
    assert _events_timestamps(path) == expected
    assert _events_timestamps(path, events_from) == later
    code, out, _ = _cli(capsys, "history", str(path), "--format", "jsonl")
    assert code == 0
    assert {h["version"]: h["timestamp"] for h in map(json.loads, out.splitlines())} == {
        v: format_iso(ts) for v, ts in expected.items()
    }
    last = max(expected)
    code, out, _ = _cli(capsys, "snapshot", str(path), "--timestamp", format_iso(expected[last]))
    header = json.loads(out.splitlines()[0])
    assert code == 0 and header["version"] == last and header["timestamp"] == format_iso(expected[last])


@pytest.mark.parametrize("table_id", CHECKPOINTED)
def test_every_reader_agrees_with_and_without_the_checkpoint(
    table_id: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = copy_table(table_id, tmp_path)
    assert _checkpoint_versions(path)
    expected = delta_spark_rule(_disordered_times(path))
    assert len(set(expected.values())) == len(expected)  # the adjustment was needed somewhere
    assert sorted(expected.values()) == [expected[v] for v in sorted(expected)]
    middle = _checkpoint_versions(path)[0] + 1
    _assert_every_reader_says(path, expected, capsys, events_from=min(middle, max(expected)))
    _delete_checkpoints(path)
    _assert_every_reader_says(path, expected, capsys, events_from=min(middle, max(expected)))


def test_a_hand_computed_chain(tmp_path: Path) -> None:
    """The rule on explicit numbers: equal and earlier times become previous + 1 ms."""
    path = copy_table("krs__with_checkpoint_no_last_checkpoint", tmp_path)  # v0-v3, checkpoint at 2
    _set_file_times(path, {0: BASE_S + 10, 1: BASE_S + 50, 2: BASE_S + 20, 3: BASE_S + 50})
    start = (BASE_S + 10) * 1000
    want = [start, start + 40_000, start + 40_001, start + 40_002]
    table = open_table(str(path))
    assert [e.timestamp.timestamp for e in table.history()] == want
    assert [str(e.timestamp.source) for e in table.history()] == [
        "file-time",
        "file-time",
        "adjusted-file-time",
        "adjusted-file-time",
    ]
    assert table.snapshot().timestamp.timestamp == want[3]  # replayed from the checkpoint at 2
    assert table.version_at(want[1] + 1) == 2  # v2 stands at +40.001 s, not at its file's +20 s
    assert table.version_at(want[2] - 1) == 1


def test_history_from_a_later_start_keeps_the_chain(tmp_path: Path) -> None:
    path = copy_table("golden__basic-with-inserts-deletes-checkpoint", tmp_path)
    expected = delta_spark_rule(_disordered_times(path))
    table = open_table(str(path))
    assert {e.version: e.timestamp.timestamp for e in table.history(start=11)} == {
        v: ts for v, ts in expected.items() if v >= 11
    }
    assert [t.timestamp for t in table.commit_timestamps(11, 12)] == [expected[11], expected[12]]


# --- In-Commit Timestamps ------------------------------------------------------------------------


def _ict_of(path: Path, version: int) -> int:
    for line in (_log(path) / f"{version:020d}.json").read_text().splitlines():
        obj = json.loads(line) if line.strip() else {}
        if "commitInfo" in obj:
            return int(obj["commitInfo"]["inCommitTimestamp"])
    raise AssertionError(f"no commitInfo in {version}")


def test_ict_table_uses_in_commit_timestamps_whatever_the_file_times(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = copy_table("drs__cdc_ict_table", tmp_path)  # ICT since creation, v1's ICT before v0's
    versions = _commit_versions(path)
    _set_file_times(path, {v: BASE_S - 10 * v for v in versions})
    expected = {v: _ict_of(path, v) for v in versions}
    table = open_table(str(path))
    assert {e.version: (e.timestamp.timestamp, str(e.timestamp.source)) for e in table.history()} == {
        v: (ts, "ict") for v, ts in expected.items()
    }
    for v, ts in expected.items():
        assert table.snapshot(v).timestamp.timestamp == ts
        assert timestamp_of(table, v, IctConfig()).timestamp == ts
    assert _events_timestamps(path) == expected
    code, out, _ = _cli(capsys, "snapshot", str(path), "--version", "2")
    assert code == 0 and json.loads(out.splitlines()[0])["timestamp"] == format_iso(expected[2])


def _enable_ict(path: Path, ict: int, enablement_version: str | None = None) -> tuple[int, int]:
    """Append a commit enabling ICT at the next version (ICT ``ict``) and one more (``ict + 7``)."""
    metadata = None
    for line in (_log(path) / f"{0:020d}.json").read_text().splitlines():
        if line.strip() and "metaData" in (obj := json.loads(line)):
            metadata = obj["metaData"]
    assert metadata is not None
    first = max(_commit_versions(path)) + 1
    metadata["configuration"] = {
        **metadata.get("configuration", {}),
        "delta.enableInCommitTimestamps": "true",
        "delta.inCommitTimestampEnablementVersion": enablement_version or str(first),
        "delta.inCommitTimestampEnablementTimestamp": str(ict),
    }
    info = {"timestamp": ict, "inCommitTimestamp": ict, "operation": "SET TBLPROPERTIES"}
    (_log(path) / f"{first:020d}.json").write_text(
        json.dumps({"commitInfo": info}) + "\n" + json.dumps({"metaData": metadata}) + "\n"
    )
    info = {"timestamp": ict + 7, "inCommitTimestamp": ict + 7, "operation": "OPTIMIZE"}
    (_log(path) / f"{first + 1:020d}.json").write_text(json.dumps({"commitInfo": info}) + "\n")
    return first, first + 1


def test_ict_enabled_mid_history(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = copy_table("golden__basic-with-inserts-deletes-checkpoint", tmp_path)
    ict = (BASE_S + 100_000) * 1000
    enabled, after = _enable_ict(path, ict)
    file_times = _disordered_times(path)
    _set_file_times(path, {enabled: BASE_S, after: BASE_S})  # older than every earlier commit
    expected = delta_spark_rule({v: t for v, t in file_times.items() if v < enabled})
    expected |= {enabled: ict, after: ict + 7}
    for delete in (False, True):
        if delete:
            _delete_checkpoints(path)
        table = open_table(str(path))
        assert {e.version: e.timestamp.timestamp for e in table.history()} == expected
        for v, ts in expected.items():
            assert table.snapshot(v).timestamp.timestamp == ts
            assert timestamp_of(table, v, IctConfig()).timestamp == ts
        assert _events_timestamps(path) == expected
        assert table.version_at(ict + 3) == enabled
        assert table.version_at(ict - 1) == enabled - 1  # before enablement: the file-time versions
        assert table.snapshot(enabled).timestamp.source == "ict"


# --- versions whose commit file is gone ------------------------------------------------------------


def test_checkpoint_only_latest_version_has_the_last_commit_s_timestamp(tmp_path: Path) -> None:
    """delta-spark's Snapshot.timestamp for a version without its commit file is the last commit
    file's time (LogSegment.lastCommitFileModificationTimestamp); history lists the commit files."""
    path = copy_table("golden__basic-with-inserts-deletes-checkpoint", tmp_path)  # checkpoint at 10
    for v in (13, 12, 11, 10):
        (_log(path) / f"{v:020d}.json").unlink()
    (_log(path) / "_last_checkpoint").unlink()
    expected = delta_spark_rule(_disordered_times(path))
    table = open_table(str(path))
    snap = table.snapshot()
    assert snap.version == 10 and snap.segment.commits == ()
    assert snap.timestamp.timestamp == expected[9]
    assert table.commit_timestamp(10).timestamp == expected[9]
    assert [e.version for e in table.history()] == list(range(10))


def test_table_with_only_a_checkpoint_uses_the_checkpoint_file_time(tmp_path: Path) -> None:
    path = copy_table("drs__table-with-domain-metadata", tmp_path)
    (cp,) = [f for f in _log(path).iterdir() if ".checkpoint." in f.name]
    os.utime(cp, (BASE_S, BASE_S))
    table = open_table(str(path))
    snap = table.snapshot(check_features=False)
    assert (snap.timestamp.timestamp, str(snap.timestamp.source)) == (BASE_S * 1000, "file-time")
    assert list(table.history()) == []


# --- history: gaps and empty commits that a checkpoint covers --------------------------------------


def test_history_refuses_a_deleted_commit_a_checkpoint_covers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = copy_table("golden__basic-with-inserts-deletes-checkpoint", tmp_path)  # checkpoint at 10
    (_log(path) / f"{5:020d}.json").unlink()
    table = open_table(str(path))
    assert table.snapshot().version == 13  # the latest state never needs commit 5
    with pytest.raises(errors.LogGapError) as info:
        list(table.history())
    assert info.value.version == 5
    code, out, err = _cli(capsys, "history", str(path))
    assert code == 2 and out == "" and err.count("\n") == 1 and f"{5:020d}.json" in err


def test_history_refuses_the_real_gap_table(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _cli(capsys, "history", str(TABLES / "drs__err_table_b"))  # v7 gone, checkpoint at 10
    assert code == 2 and "commit 7 is missing" in err and err.count("\n") == 1


@pytest.mark.parametrize("content", [b"", b"\n\n", b"  \n"], ids=["0-bytes", "blank-lines", "spaces"])
def test_history_refuses_an_emptied_commit_a_checkpoint_covers(
    content: bytes, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = copy_table("golden__basic-with-inserts-deletes-checkpoint", tmp_path)
    (_log(path) / f"{5:020d}.json").write_bytes(content)
    assert open_table(str(path)).snapshot().version == 13
    with pytest.raises(errors.CorruptLogError) as info:
        list(open_table(str(path)).history())
    assert info.value.version == 5
    code, _, err = _cli(capsys, "history", str(path))
    assert code == 2 and err.count("\n") == 1 and f"{5:020d}.json" in err and "Traceback" not in err


# --- protocol checks at every entry ---------------------------------------------------------------

UNREADABLE_PROTOCOLS: dict[str, tuple[dict[str, Any], str]] = {
    "reader-version-5": (
        {"minReaderVersion": 5, "minWriterVersion": 7, "writerFeatures": []},
        "minReaderVersion 5",
    ),
    "unknown-reader-feature": (
        {
            "minReaderVersion": 3,
            "minWriterVersion": 7,
            "readerFeatures": ["fancyReaderFeature"],
            "writerFeatures": ["fancyReaderFeature"],
        },
        "fancyReaderFeature",
    ),
    "catalog-managed": (
        {
            "minReaderVersion": 3,
            "minWriterVersion": 7,
            "readerFeatures": ["catalogManaged"],
            "writerFeatures": ["catalogManaged", "inCommitTimestamp"],
        },
        "catalogManaged",
    ),
}


def _append_protocol(path: Path, protocol: dict[str, Any]) -> int:
    version = max(_commit_versions(path)) + 1
    info = {"timestamp": BASE_S * 1000, "operation": "UPGRADE PROTOCOL"}
    (_log(path) / f"{version:020d}.json").write_text(
        json.dumps({"commitInfo": info}) + "\n" + json.dumps({"protocol": protocol}) + "\n"
    )
    return version


@pytest.mark.parametrize("command", ["snapshot", "history", "read"])
@pytest.mark.parametrize("case", sorted(UNREADABLE_PROTOCOLS))
def test_commands_refuse_a_protocol_read_refuses(
    case: str, command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    protocol, needle = UNREADABLE_PROTOCOLS[case]
    path = copy_table("golden__basic-with-inserts-deletes-checkpoint", tmp_path)
    upgraded = _append_protocol(path, protocol)
    code, out, err = _cli(capsys, command, str(path))
    assert code == 2, err
    assert out == "" and err.count("\n") == 1 and needle in err and "Traceback" not in err
    if command == "snapshot":  # a version before the upgrade is still readable
        code, out, _ = _cli(capsys, "snapshot", str(path), "--version", str(upgraded - 1))
        assert code == 0 and json.loads(out.splitlines()[0])["version"] == upgraded - 1


@pytest.mark.parametrize(
    ("table_id", "needle"),
    [
        ("kj__bench-basic_catalog_managed", "catalogManaged"),
        ("drs__err_table_d", "catalogOwned"),
        ("golden__deltalog-invalid-protocol-version", "minReaderVersion"),
    ],
)
@pytest.mark.parametrize("command", ["snapshot", "history"])
def test_real_unreadable_tables_exit_2(
    table_id: str, needle: str, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _cli(capsys, command, str(TABLES / table_id))
    assert code == 2 and out == "" and err.count("\n") == 1 and needle in err


# --- the oracle: delta-spark's DESCRIBE HISTORY on disordered file times ---------------------------


@pytest.mark.spark
@pytest.mark.timeout(300)
def test_describe_history_agrees(tmp_path: Path, spark: Any) -> None:
    """DESCRIBE HISTORY and TIMESTAMP AS OF, on a table with checkpoints whose file times go back."""
    path = tmp_path / "t"
    spark.sql(
        f"CREATE TABLE delta.`{path}` (id BIGINT) USING delta TBLPROPERTIES ('delta.checkpointInterval' = '2')"
    )
    for i in range(4):
        spark.range(i * 10, i * 10 + 5).write.format("delta").mode("append").save(str(path))
    assert _checkpoint_versions(path)
    _disordered_times(path, base=int(time.time()) - 86_400)  # time travel refuses beyond 7 days
    rows = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").selectExpr("version", "unix_millis(timestamp) AS ms")
    spark_says = {r["version"]: r["ms"] for r in rows.collect()}
    table = open_table(str(path))
    assert {e.version: e.timestamp.timestamp for e in table.history()} == spark_says
    assert {v: table.snapshot(v).timestamp.timestamp for v in spark_says} == spark_says
    # TIMESTAMP AS OF at each adjusted time lands on that version (each append adds 5 rows)
    for v, ms in spark_says.items():
        iso = format_iso(ms).replace("T", " ").removesuffix("Z")
        rows = spark.read.format("delta").option("timestampAsOf", iso).load(str(path)).count()
        assert rows == 5 * v and table.version_at(ms) == v


@pytest.mark.parametrize("command", ["snapshot", "history"])
def test_a_malformed_ict_property_is_a_corrupt_log(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = copy_table("golden__basic-with-inserts-deletes-checkpoint", tmp_path)
    _enable_ict(path, (BASE_S + 100_000) * 1000, enablement_version="v14")
    code, _, err = _cli(capsys, command, str(path))
    assert code == 2 and err.count("\n") == 1 and "inCommitTimestampEnablementVersion" in err
    assert "v14" not in err  # the property is named, its value is not echoed
