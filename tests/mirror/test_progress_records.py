"""The progress topic's encoder: a table's position keyed by its location, and the tombstone of a dropped table."""

from __future__ import annotations

from deltamirror.mirror.records.events import SCHEMA_VERSION, ProgressRecord, decode_progress
from deltamirror.mirror.records.progress import encode_progress, encode_progress_tombstone


def test_a_progress_record_is_keyed_by_table_uri_without_headers_and_decodes_back() -> None:
    progress = ProgressRecord(
        schema_version=SCHEMA_VERSION,
        table_uri="file:///data/t",
        table_id="t-1",
        version=3,
        index=4,
        count=9,
        snapshot=False,
        commit_timestamp=1_700_000_000_000,
        commit_timestamp_source="ict",
        transactional_id="deltamirror-0",
        updated_at=7,
        row_offset=12,
    )
    record = encode_progress(progress)
    assert (record.key, record.headers) == (b"file:///data/t", None)
    assert record.value == (
        b'{"schemaVersion":1,"tableUri":"file:///data/t","tableId":"t-1","version":3,"index":4,"count":9,'
        b'"snapshot":false,"commitTimestamp":1700000000000,"commitTimestampSource":"ict",'
        b'"transactionalId":"deltamirror-0","updatedAt":7,"rowOffset":12}'
    )
    assert record.value is not None and decode_progress(record.value) == progress


def test_a_dropped_table_s_progress_is_a_tombstone_of_its_key() -> None:
    record = encode_progress_tombstone("file:///data/t")
    assert (record.value, record.key, record.headers) == (None, b"file:///data/t", None)
