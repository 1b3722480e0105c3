"""The commits topic's records, finished: each kind's value, key and headers, written once.

Four kinds share the topic (docs/events.md): ``commit`` (a version's summary), ``heartbeat`` (an
idle table is alive), ``tableReplaced`` and ``tableDropped``. Each record is keyed by the table's
``tableId`` and carries a ``kind`` header, and a ``version`` header when it names a version (a
summary's version, a heartbeat's latest version), so that a subscriber can route or skip it without
parsing the value. The one decoder of the topic is :func:`.events.decode_commits_record`.
"""

from __future__ import annotations

from dataclasses import dataclass

from .events import CommitsTopicRecord, CommitSummary, Heartbeat
from .headers import HEADER_KIND, HEADER_VERSION, Headers


@dataclass(frozen=True, slots=True)
class FinishedRecord:
    """A record ready to produce: its value, key and headers."""

    value: bytes
    key: bytes
    headers: Headers


def encode_commits_record(record: CommitsTopicRecord, extra_headers: Headers | None = None) -> FinishedRecord:
    """``record`` as the commits topic carries it; ``extra_headers`` follow the record's own."""
    headers: Headers = [(HEADER_KIND, record.kind.encode())]
    if isinstance(record, CommitSummary):
        headers.append((HEADER_VERSION, str(record.version).encode()))
    elif isinstance(record, Heartbeat):
        headers.append((HEADER_VERSION, str(record.latest_version).encode()))
    if extra_headers:
        headers.extend(extra_headers)
    return FinishedRecord(record.to_json_bytes(), record.table_id.encode(), headers)


__all__ = ["FinishedRecord", "encode_commits_record"]
