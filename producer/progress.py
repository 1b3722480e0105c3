"""A table's committed progress: the record on the progress topic and the position it stands for.

Each transaction of a table ends with one progress record keyed by the table's URI (compacted
topic), written in the same transaction as the records it covers. Reading the topic
``read_committed`` to its end therefore gives the last position whose records are all committed:
where a (re)started watcher goes on, so that nothing is skipped or published twice.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from deltamirror.core.timestamps import CommitTimestamp, TimestampSource
from deltamirror.mirror.errors import KafkaError, TopicNotFoundError
from deltamirror.mirror.events import SCHEMA_VERSION, ProgressRecord, decode_progress
from deltamirror.mirror.kafka_consumer import MirrorConsumer

from .work import Position


def position_from_record(record: ProgressRecord) -> Position:
    ts = CommitTimestamp(
        record.version, record.commit_timestamp, TimestampSource(record.commit_timestamp_source)
    )
    return Position(
        record.table_id, record.version, record.index, record.count, ts, record.snapshot, record.row_offset
    )


def progress_record(position: Position, uri: str, txn_id: str | None) -> ProgressRecord:
    return ProgressRecord(
        schema_version=SCHEMA_VERSION,
        table_uri=uri,
        table_id=position.table_id,
        version=position.version,
        index=position.index,
        count=position.count,
        snapshot=position.snapshot,
        commit_timestamp=position.timestamp.timestamp,
        commit_timestamp_source=str(position.timestamp.source),  # type: ignore[arg-type]
        transactional_id=txn_id,
        updated_at=int(time.time() * 1000),
        row_offset=position.row_offset,
    )


def read_progress(
    kafka: dict[str, Any],
    topic: str,
    uri: str,
    timeout_s: float = 60.0,
    *,
    stop: threading.Event | None = None,
) -> Position | None:
    """The last committed progress of ``uri``: the progress topic read with read_committed to its end.

    With ``stop``, raises StopRequested once it is set (the metadata is asked for in short slices).
    """
    key = uri.encode()
    last: bytes | None = None
    deadline = time.monotonic() + timeout_s
    with MirrorConsumer(kafka, purpose="progress") as consumer:
        try:
            partitions = consumer.partitions(topic, timeout_s=timeout_s, stop=stop)
        except TopicNotFoundError as exc:  # created before it is read: the broker lost it, retry
            raise KafkaError(str(exc), topic=topic) from None
        assert partitions is not None  # only a wait for the topic returns None
        consumer.assign((topic, p, None) for p in partitions)
        # consume(n, timeout) returns only once n records came or the timeout passed: a short
        # timeout, or every (re)start waits ~1 s on a small progress topic
        for batch in consumer.batches(
            until_end=True, stop=stop, timeout_s=max(0.0, deadline - time.monotonic()), poll_s=0.05
        ):
            for record in batch:
                if record.key == key:
                    last = record.value
    if not last:  # never published, or a tombstone: start as the snapshot mode says
        return None
    return position_from_record(decode_progress(last, topic=topic))


__all__ = ["position_from_record", "progress_record", "read_progress"]
