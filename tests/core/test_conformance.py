"""Every real table in tests/data: loads, fails as it must, and gives the expected rows.

Oracles, all independent of deltamirror: the golden parquet that delta-spark wrote for the latest
snapshot, the `.crc` version checksums writers left, and delta-rs (`deltalake`) opening the same
table.
"""

from __future__ import annotations

import json
import re
import urllib.parse
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from deltamirror.core import errors
from deltamirror.core.features import SUPPORTED_READER_FEATURES, reader_features
from deltamirror.core.log import build_segment
from deltamirror.core.replay import replay_config
from deltamirror.core.table import open_table
from support.tables import EXPECTED, TableCase, table_cases

CASES = table_cases()

#: why each MUST FAIL table must fail, as the error class deltamirror raises
MUST_FAIL = {
    "drs__err_table_c": errors.LogGapError,
    "drs__err_table_d": errors.UnsupportedFeatureError,
    "golden__deltalog-invalid-protocol-version": errors.UnsupportedFeatureError,
    "golden__deltalog-state-reconstruction-from-checkpoint-missing-metadata": errors.IncompleteTableStateError,
    # its checkpoint also has a metaData without schemaString: either defect is a corrupt log
    "golden__deltalog-state-reconstruction-from-checkpoint-missing-protocol": errors.CorruptLogError,
    "golden__deltalog-state-reconstruction-without-metadata": errors.IncompleteTableStateError,
    "golden__deltalog-state-reconstruction-without-protocol": errors.IncompleteTableStateError,
    "golden__no-delta-log-folder": errors.TableNotFoundError,
}
#: hand-built logs (delta-spark's test API) whose latest metaData has no schemaString: the log is
#: readable, a table state (snapshot, read) is not
NO_SCHEMA = {
    "golden__corrupted-last-checkpoint",
    "golden__deltalog-commit-info",
    "golden__update-deleted-directory",
}
#: tables that are not MUST FAIL in the index but cannot be a table at all
NOT_A_TABLE = {
    "krs__crc-malformed": errors.TableNotFoundError,  # only a malformed 0.crc, no commit
    # a hand-built log with a protocol but no metaData: no engine can rebuild its state
    "golden__data-reader-absolute-paths-escaped-chars": errors.IncompleteTableStateError,
}


def _ids(cases: list[TableCase]) -> list[str]:
    return [c.id for c in cases]


def test_every_must_fail_table_is_classified() -> None:
    assert {c.id for c in CASES if c.must_fail} == set(MUST_FAIL)


@pytest.mark.parametrize("case", [c for c in CASES if c.must_fail], ids=lambda c: c.id)
def test_must_fail(case: TableCase) -> None:
    with pytest.raises(MUST_FAIL[case.id]) as info:
        open_table(str(case.path)).snapshot()
    assert str(case.path.name) in str(info.value) or case.id in str(info.value)


def _protocol_from_files(case: TableCase) -> dict[str, Any] | None:
    """The newest protocol in the table's JSON commits, else in its newest checkpoint (no deltamirror code)."""
    log = case.path / "_delta_log"
    protocol = None
    for f in sorted(log.glob("*.json")):
        if not re.fullmatch(r"\d{20}\.json", f.name):
            continue
        for line in f.read_text().splitlines():
            if line.strip() and "protocol" in (obj := json.loads(line)):
                protocol = obj["protocol"]
    if protocol is None:
        for cp in sorted(log.glob("*.checkpoint*.parquet"), reverse=True):
            col = pq.read_table(cp, columns=["protocol"]).column("protocol").drop_null().to_pylist()
            if col:
                return {k: v for k, v in col[0].items() if v is not None}
    return protocol


def _refused_feature(case: TableCase) -> str | None:
    """The reader feature a table needs that deltamirror lacks, by the features table alone."""
    protocol = _protocol_from_files(case)
    if protocol is None:
        return None
    from deltamirror.core.models import Protocol

    missing = sorted(reader_features(Protocol.model_validate(protocol)) - SUPPORTED_READER_FEATURES)
    return missing[0] if missing else None


LOADABLE = [c for c in CASES if not c.must_fail and c.id not in NOT_A_TABLE]


@pytest.mark.parametrize("case", LOADABLE, ids=lambda c: c.id)
def test_table_loads(case: TableCase) -> None:
    table = open_table(str(case.path))
    feature = _refused_feature(case)
    if feature is not None:
        with pytest.raises(errors.UnsupportedFeatureError) as info:
            table.snapshot()
        assert feature in str(info.value)
        if isinstance(info.value, errors.CatalogManagedTableError):
            return  # storage alone cannot give its state: refusing is the whole answer
        snap = table.snapshot(check_features=False)  # log-level reads still work
    elif case.id in NO_SCHEMA:  # a state needs a schema: refused, read at the log level only
        with pytest.raises(errors.SchemaError) as schema_info:
            table.snapshot()
        assert "has no schemaString" in str(schema_info.value)
        snap = table.snapshot(check_features=False)
    else:
        snap = table.snapshot()
    assert snap.version >= 0
    assert snap.metadata.id
    paths = snap.files["path"].to_pylist()
    dvs = snap.files["deletionVector"].to_pylist()
    keys = [(p, json.dumps(d, sort_keys=True)) for p, d in zip(paths, dvs, strict=True)]
    assert len(keys) == len(set(keys)), "an active file appears twice"


@pytest.mark.parametrize("case", LOADABLE, ids=lambda c: c.id)
def test_config_replay_matches_full_replay(case: TableCase) -> None:
    """The metaData/protocol-only replay (change feed plans) agrees with the full one at every
    version whose state can be rebuilt."""
    table = open_table(str(case.path))
    try:
        snap = table.snapshot(check_features=False)
    except errors.DeltaMirrorError as exc:  # catalog-managed tables: no state from storage alone
        assert _refused_feature(case) is not None, exc
        pytest.skip("no state from storage alone")
    versions = sorted({snap.version, *snap.segment.listing.commits})
    for version in versions[-5:]:
        try:
            full = table.snapshot(version, check_features=False)
        except errors.DeltaMirrorError:
            continue
        segment = build_segment(table.storage, version)
        assert replay_config(table.storage, segment) == (full.metadata, full.protocol), version


@pytest.mark.parametrize("case", [c for c in CASES if c.id in NOT_A_TABLE], ids=lambda c: c.id)
def test_not_a_table(case: TableCase) -> None:
    with pytest.raises(NOT_A_TABLE[case.id]):
        open_table(str(case.path)).snapshot()


def _crc(case: TableCase, version: int) -> dict[str, Any] | None:
    f = case.path / "_delta_log" / f"{version:020d}.crc"
    if not f.exists():
        return None
    try:
        return json.loads(f.read_text())  # type: ignore[no-any-return]
    except ValueError:
        return None


#: a fixture whose .crc describes 10 files its JSON commit no longer holds (trimmed upstream)
CRC_INCONSISTENT = {"krs__crc-full"}
CRC_CASES = [
    c
    for c in LOADABLE
    if c.id not in CRC_INCONSISTENT
    and any(re.fullmatch(r"\d{20}\.crc", f.name) for f in (c.path / "_delta_log").iterdir())
]


@pytest.mark.parametrize("case", CRC_CASES, ids=lambda c: c.id)
def test_matches_version_checksum(case: TableCase) -> None:
    """The `.crc` a writer left for a version counts that version's files and bytes."""
    table = open_table(str(case.path))
    checked = 0
    for crc_file in sorted((case.path / "_delta_log").glob("*.crc")):
        if crc_file.name.startswith("."):
            continue
        version = int(crc_file.name.split(".")[0])
        crc = _crc(case, version)
        if crc is None or "numFiles" not in crc:
            continue
        snap = table.snapshot(version=version, check_features=False)
        assert snap.files.num_rows == crc["numFiles"], f"v{version}"
        assert sum(snap.files["size"].to_pylist()) == crc["tableSizeBytes"], f"v{version}"
        if "metadata" in crc:
            assert snap.metadata.id == crc["metadata"]["id"]
        if "protocol" in crc:
            assert snap.protocol.min_reader_version == crc["protocol"]["minReaderVersion"]
        checked += 1
    assert checked > 0


def _delta_rs_files(path: Path) -> tuple[int, set[str]] | None:
    deltalake = pytest.importorskip("deltalake")
    try:
        dt = deltalake.DeltaTable(str(path))
        actions = dt.get_add_actions(flatten=True)
        paths = actions.column("path").to_pylist()
        return dt.version(), {urllib.parse.unquote(p) for p in paths}
    except Exception:  # delta-rs refuses tables it cannot read; then it is no oracle
        return None


#: delta-rs does not canonicalize ``file:/x`` to ``/x``; delta-spark does (test below)
NOT_DELTA_RS = {c.id for c in CASES if c.id.startswith("golden__canonicalized-paths")}


@pytest.mark.parametrize(
    "case",
    [c for c in LOADABLE if _refused_feature(c) is None and c.id not in NOT_DELTA_RS],
    ids=lambda c: c.id,
)
def test_active_files_match_delta_rs(case: TableCase) -> None:
    oracle = _delta_rs_files(case.path)
    if oracle is None:
        pytest.skip("delta-rs cannot open this table")
    version, expected = oracle
    snap = open_table(str(case.path)).snapshot()
    assert snap.version == version
    ours = {urllib.parse.unquote(p) for p in snap.files["path"].to_pylist()}
    assert ours == expected


# --- rows ---------------------------------------------------------------------------------------


def _normalize(value: Any) -> Any:
    if isinstance(value, float) and value != value:
        return "NaN"
    if isinstance(value, Decimal):
        return str(value.normalize()) if value == value.to_integral() else str(value)
    if isinstance(value, dict):
        return tuple(sorted((k, _normalize(v)) for k, v in value.items()))
    if isinstance(value, list):
        if value and isinstance(value[0], tuple) and len(value[0]) == 2:  # a map as list of pairs
            return tuple(sorted((_normalize(k), _normalize(v)) for k, v in value))
        return tuple(_normalize(v) for v in value)
    if hasattr(value, "tzinfo") and getattr(value, "tzinfo", None) is not None:
        return value.astimezone(__import__("datetime").UTC).replace(tzinfo=None)
    return value


def _rows(table: pa.Table, columns: list[str]) -> list[tuple[Any, ...]]:
    data = table.select(columns).to_pylist()
    return sorted((tuple(_normalize(r[c]) for c in columns) for r in data), key=repr)


#: Partition timestamps carry no zone in the log; Spark wrote (and read) this table in the zone below,
#: deltamirror reads them as UTC like delta-rs and kernel do. Compare in the writer's wall clock.
WRITER_TIME_ZONE = {"golden__data-reader-partition-values": "America/Los_Angeles"}


def _as_wall_clock(table: pa.Table, zone: str) -> pa.Table:
    import pyarrow.compute as pc

    for i, field in enumerate(table.schema):
        if pa.types.is_timestamp(field.type) and field.type.tz is not None:
            local = pc.local_timestamp(table.column(i).cast(pa.timestamp(field.type.unit, zone)))
            table = table.set_column(i, field.name, pc.assume_timezone(local, "UTC"))
    return table


GOLDEN = [c for c in LOADABLE if c.golden_dir is not None and c.golden_dir.exists()]


@pytest.mark.parametrize("case", GOLDEN, ids=lambda c: c.id)
def test_rows_equal_golden_snapshot(case: TableCase) -> None:
    assert case.golden_dir is not None
    expected = pq.read_table(str(case.golden_dir))
    snap = open_table(str(case.path)).snapshot()
    if not case.has_data and case.data != "2/11 files present":
        pytest.skip(f"data files absent ({case.data}); checked at the log level only")
    actual = snap.to_arrow()
    columns = expected.column_names
    if case.id in WRITER_TIME_ZONE:
        expected = _as_wall_clock(expected, WRITER_TIME_ZONE[case.id])
    assert sorted(actual.column_names) == sorted(columns)
    assert actual.num_rows == expected.num_rows
    assert _rows(actual, columns) == _rows(expected, columns)


def test_generated_long_log_snapshot_rows() -> None:
    spec = json.loads((EXPECTED / "snapshot" / "gen__long-log-cdf__snapshot-latest.json").read_text())
    actual = (
        open_table(str(Path(__file__).parents[1] / "data" / "tables" / "gen__long-log-cdf"))
        .snapshot()
        .to_arrow()
    )
    cols = spec["columns"]
    got = sorted(tuple(r[c] for c in cols) for r in actual.select(cols).to_pylist())
    assert got == sorted(tuple(r) for r in spec["rows"])


@pytest.mark.parametrize("table_id", sorted(NOT_DELTA_RS))
def test_canonicalized_paths_cancel(table_id: str) -> None:
    """An add of ``/x`` and a later remove of ``file:/x`` (or the reverse) are the same file."""
    snap = open_table(str(Path(__file__).parents[1] / "data" / "tables" / table_id)).snapshot()
    assert snap.files.num_rows == 0
    assert snap.tombstones.num_rows == 1
