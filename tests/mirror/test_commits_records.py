"""The commits topic's encoder: each kind's value, key and headers, as subscribers route them.

Heartbeats, ``tableReplaced`` and ``tableDropped`` are not in the golden records (they depend on
timing or on a table changing while watched), so their bytes are pinned here.
"""

from __future__ import annotations

from deltamirror.mirror.records.commits import encode_commits_record
from deltamirror.mirror.records.events import (
    SCHEMA_VERSION,
    CommitSummary,
    Heartbeat,
    TableDropped,
    TableReplaced,
    decode_commits_record,
)

URI = "file:///data/t"


def test_a_heartbeat_is_keyed_by_table_id_with_kind_and_latest_version() -> None:
    beat = Heartbeat(
        schema_version=SCHEMA_VERSION,
        table_id="t-1",
        table_uri=URI,
        latest_version=7,
        commit_timestamp=1_700_000_000_000,
        commit_timestamp_source="ict",
        heartbeat_timestamp=1_700_000_060_000,
    )
    record = encode_commits_record(beat)
    assert record.key == b"t-1"
    assert record.headers == [("kind", b"heartbeat"), ("version", b"7")]
    assert record.value == (
        b'{"kind":"heartbeat","schemaVersion":1,"tableId":"t-1","tableUri":"file:///data/t",'
        b'"latestVersion":7,"commitTimestamp":1700000000000,"commitTimestampSource":"ict",'
        b'"heartbeatTimestamp":1700000060000}'
    )
    assert decode_commits_record(record.value) == beat


def test_table_replaced_and_dropped_carry_only_their_kind() -> None:
    replaced = TableReplaced(
        schema_version=SCHEMA_VERSION,
        table_uri=URI,
        table_id="t-2",
        previous_table_id="t-1",
        previous_version=9,
        reason="metaData.id changed",
        detected_at=5,
    )
    dropped = TableDropped(
        schema_version=SCHEMA_VERSION,
        table_uri=URI,
        table_id="t-2",
        last_version=3,
        reason="gone",
        detected_at=6,
    )
    r, d = encode_commits_record(replaced), encode_commits_record(dropped)
    assert (r.key, r.headers) == (b"t-2", [("kind", b"tableReplaced")])
    assert (d.key, d.headers) == (b"t-2", [("kind", b"tableDropped")])
    assert r.value == (
        b'{"kind":"tableReplaced","schemaVersion":1,"tableUri":"file:///data/t","tableId":"t-2",'
        b'"previousTableId":"t-1","previousVersion":9,"reason":"metaData.id changed","detectedAt":5}'
    )
    assert d.value == (
        b'{"kind":"tableDropped","schemaVersion":1,"tableUri":"file:///data/t","tableId":"t-2",'
        b'"lastVersion":3,"reason":"gone","detectedAt":6}'
    )
    assert decode_commits_record(r.value) == replaced and decode_commits_record(d.value) == dropped


def test_a_summary_names_its_version_and_extra_headers_follow() -> None:
    summary = CommitSummary(
        schema_version=SCHEMA_VERSION,
        table_id="t-1",
        table_uri=URI,
        version=12,
        commit_timestamp=1,
        commit_timestamp_source="file-time",
        snapshot=False,
        action_count=2,
        adds=1,
        removes=0,
        cdc_files=0,
        bytes_added=10,
        bytes_removed=0,
    )
    record = encode_commits_record(summary, [("clampedFrom", b"1")])
    assert record.key == b"t-1"
    assert record.headers == [("kind", b"commit"), ("version", b"12"), ("clampedFrom", b"1")]
    assert record.value == summary.to_json_bytes()
    assert decode_commits_record(record.value) == summary
