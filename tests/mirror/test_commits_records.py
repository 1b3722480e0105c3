"""The commits topic's encoder: each kind's value, key and headers, as subscribers route them.

Heartbeats, ``tableReplaced`` and ``tableDropped`` are not in the golden records (they depend on
timing or on a table changing while watched), so their bytes are pinned here.
"""

from __future__ import annotations

from typing import Any, TypeVar

import pytest

from deltamirror.mirror.errors import RecordTooLargeError
from deltamirror.mirror.records.commits import (
    encode_commit_summary,
    encode_commits_record,
    encode_heartbeat,
    encode_table_dropped,
    encode_table_replaced,
)
from deltamirror.mirror.records.events import (
    SCHEMA_VERSION,
    CommitSummary,
    Heartbeat,
    TableDropped,
    TableReplaced,
    decode_commits_record,
)
from deltamirror.mirror.records.fragments import FragmentAssembler, Oversize

URI = "file:///data/t"


#: each kind's fields, but for the schema version and the table's location every kind has
_FIELDS: dict[type, dict[str, Any]] = {
    Heartbeat: {
        "table_id": "t-1",
        "latest_version": 7,
        "commit_timestamp": 1_700_000_000_000,
        "commit_timestamp_source": "ict",
        "heartbeat_timestamp": 1_700_000_060_000,
    },
    TableReplaced: {
        "table_id": "t-2",
        "previous_table_id": "t-1",
        "previous_version": 9,
        "reason": "metaData.id changed",
        "detected_at": 5,
    },
    TableDropped: {"table_id": "t-2", "last_version": 3, "reason": "gone", "detected_at": 6},
    CommitSummary: {
        "table_id": "t-1",
        "version": 12,
        "commit_timestamp": 1,
        "commit_timestamp_source": "file-time",
        "snapshot": False,
        "action_count": 2,
        "adds": 1,
        "removes": 0,
        "cdc_files": 0,
        "bytes_added": 10,
        "bytes_removed": 0,
    },
}

R = TypeVar("R", Heartbeat, TableReplaced, TableDropped, CommitSummary)


def _record(kind: type[R], **over: Any) -> R:
    """A commits-topic record of ``kind`` with the fields above, ``over`` replacing some."""
    return kind(schema_version=SCHEMA_VERSION, table_uri=URI, **{**_FIELDS[kind], **over})


def test_a_heartbeat_is_keyed_by_table_id_with_kind_and_latest_version() -> None:
    beat = _record(Heartbeat)
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
    replaced, dropped = _record(TableReplaced), _record(TableDropped)
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
    summary = _record(CommitSummary)
    record = encode_commits_record(summary, [("clampedFrom", b"1")])
    assert record.key == b"t-1"
    assert record.headers == [("kind", b"commit"), ("version", b"12"), ("clampedFrom", b"1")]
    assert record.value == summary.to_json_bytes()
    assert decode_commits_record(record.value) == summary


def test_a_summary_longer_than_the_topic_takes_is_split_and_joins_back() -> None:
    summary = _record(CommitSummary, operation="WRITE " + "x" * 2600)
    whole = encode_commit_summary(summary, extra_headers=[("clampedFrom", b"1")])
    assert list(whole.headers) == [[("kind", b"commit"), ("version", b"12"), ("clampedFrom", b"1")]]
    assert whole.values == [summary.to_json_bytes()]
    split = encode_commit_summary(summary, oversize=Oversize(1024, "split", "commits", URI))
    headers = [list(h) for h in split.headers]
    assert split.key == b"t-1" and len(split.values) == -(-len(summary.to_json_bytes()) // 1024)
    assert [h[:2] for h in headers] == [[("kind", b"commit"), ("version", b"12")]] * len(split.values)
    assembler = FragmentAssembler()
    joined = [
        w for v, h in zip(split.values, headers, strict=True) if (w := assembler.feed(v, h)) is not None
    ]
    assert len(joined) == 1 and decode_commits_record(joined[0], "commit") == summary
    with pytest.raises(RecordTooLargeError, match="topic commits"):
        encode_commit_summary(summary, oversize=Oversize(200, "fail", "commits", URI))


def test_each_kind_has_its_own_encoder() -> None:
    beat = _record(Heartbeat, commit_timestamp=1, heartbeat_timestamp=2)
    replaced, dropped = _record(TableReplaced, reason="r"), _record(TableDropped, reason="r")
    assert encode_heartbeat(beat) == encode_commits_record(beat)
    assert encode_table_replaced(replaced) == encode_commits_record(replaced)
    assert encode_table_dropped(dropped) == encode_commits_record(dropped)
    for record, kind in (
        (encode_heartbeat(beat), "heartbeat"),
        (encode_table_dropped(dropped), "tableDropped"),
    ):
        assert record.value is not None
        assert decode_commits_record(record.value, kind) == decode_commits_record(record.value)
