"""The commits topic's records, finished: each kind's value, key and headers, written once.

Five kinds share the topic (docs/events.md): ``commit`` (a version's summary), ``heartbeat`` (an
idle table is alive), ``tableReplaced``, ``tableDropped`` and ``schemaChanged``. Each record is keyed by the table's
``tableId`` and carries a ``kind`` header, and a ``version`` header when it names a version (a
summary's version, a heartbeat's latest version), so that a subscriber can route or skip it without
parsing the value. A summary longer than the topic takes is split into fragments (or refused), as
an action is. The one decoder of the topic is :func:`.events.decode_commits_record`.
"""

from __future__ import annotations

from .events import CommitsTopicRecord, CommitSummary, Heartbeat, SchemaChanged, TableDropped, TableReplaced
from .fragments import Oversize
from .headers import HEADER_KIND, HEADER_VERSION, Headers
from .record import KeyedRecords, Record

#: the ``kind`` headers, made once
_KIND_HEADERS = {
    kind: (HEADER_KIND, kind.encode())
    for kind in ("commit", "heartbeat", "tableReplaced", "tableDropped", "schemaChanged")
}


def _headers(record: CommitsTopicRecord, extra_headers: Headers | None) -> Headers:
    headers: Headers = [_KIND_HEADERS[record.kind]]
    if isinstance(record, CommitSummary | SchemaChanged):
        headers.append((HEADER_VERSION, str(record.version).encode()))
    elif isinstance(record, Heartbeat):
        headers.append((HEADER_VERSION, str(record.latest_version).encode()))
    if extra_headers:
        headers.extend(extra_headers)
    return headers


def encode_commits_record(record: CommitsTopicRecord, extra_headers: Headers | None = None) -> Record:
    """``record`` (any kind) as the commits topic carries it; ``extra_headers`` follow the record's own."""
    return Record(record.to_json_bytes(), record.table_id.encode(), _headers(record, extra_headers))


def _versioned(
    record: CommitSummary | SchemaChanged, extra_headers: Headers | None, oversize: Oversize | None
) -> KeyedRecords:
    """A record of one version: one record, or its fragments when longer than ``oversize`` allows."""
    values = [record.to_json_bytes()]
    headers: list[Headers] = [_headers(record, extra_headers)]
    if oversize is None:
        return KeyedRecords(record.table_id.encode(), values, headers)
    split_values, split_headers = oversize.split(values, headers, record.version, -1)
    return KeyedRecords(record.table_id.encode(), split_values, split_headers)


def encode_commit_summary(
    summary: CommitSummary, *, extra_headers: Headers | None = None, oversize: Oversize | None = None
) -> KeyedRecords:
    """A version's summary: one record, or its fragments when longer than ``oversize`` allows."""
    return _versioned(summary, extra_headers, oversize)


def encode_schema_changed(
    record: SchemaChanged, *, extra_headers: Headers | None = None, oversize: Oversize | None = None
) -> KeyedRecords:
    """What a version changed in the table's schema (``kind`` and ``version`` headers), split as a
    summary is when longer than ``oversize`` allows (a wide table's two schemas)."""
    return _versioned(record, extra_headers, oversize)


def encode_heartbeat(heartbeat: Heartbeat) -> Record:
    """An idle table's heartbeat: ``kind`` and its latest version in the headers."""
    return encode_commits_record(heartbeat)


def encode_table_replaced(replaced: TableReplaced) -> Record:
    """The announcement that the location holds another table (keyed by the new ``tableId``)."""
    return encode_commits_record(replaced)


def encode_table_dropped(dropped: TableDropped) -> Record:
    """The last record of a table that was deleted."""
    return encode_commits_record(dropped)


__all__ = [
    "encode_commit_summary",
    "encode_commits_record",
    "encode_heartbeat",
    "encode_schema_changed",
    "encode_table_dropped",
    "encode_table_replaced",
]
