"""A table's state at one version as events: what ``initial`` and ``when-needed`` publish first.

The state comes from the checkpoint plus the commits after it (``Snapshot``), whose active files
are an Arrow table; they are turned into ``add`` actions one Arrow slice at a time, never one
model per file. Order is deterministic (protocol, metaData, domainMetadata by domain, txn by
appId, then files by path) so that a snapshot interrupted at event ``i`` resumes at ``i + 1`` with
the same events, even if a checkpoint was written in between. Every event says ``snapshot: true``;
the last one carries ``snapshotEnd: true``, so a consumer knows the state is complete.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from typing import IO, Any

from deltamirror.core import action_schema
from deltamirror.core.compute import pc
from deltamirror.core.partitions import distinct_partitions
from deltamirror.core.table import Snapshot
from deltamirror.core.timestamps import CommitTimestamp
from deltamirror.mirror.records.events import CommitSummary

from .summaries import commit_summary

#: distinct partitions listed in a summary (a snapshot's or a commit's)
MAX_PARTITIONS_LISTED = 1000

Body = bytes | dict[str, Any]
ActionBatch = list[tuple[str, Body]]


class SnapshotWork:
    """The events of a snapshot, from event ``start`` on."""

    snapshot = True

    def __init__(
        self, snap: Snapshot, table_uri: str, timestamp: CommitTimestamp, start: int = 0, row_offset: int = 0
    ) -> None:
        self.snap = snap
        #: row-change records (op "r") published already
        self.row_offset = row_offset
        self.table_id = snap.metadata.id
        self.table_uri = table_uri
        self.version = snap.version
        self.timestamp = timestamp
        self.start = start
        head: ActionBatch = [("protocol", snap.protocol.to_dict()), ("metaData", snap.metadata.to_dict())]
        head += [("domainMetadata", d.to_dict()) for _, d in sorted(snap.domains.items())]
        head += [("txn", t.to_dict()) for _, t in sorted(snap.txns.items())]
        self._head = head
        files = snap.files
        if files.num_rows:
            files = files.take(pc.sort_indices(files["path"]))
        self._files = files
        self.count = len(head) + files.num_rows

    def __repr__(self) -> str:
        return f"SnapshotWork(version={self.version}, count={self.count}, start={self.start})"

    def batches(self, size: int) -> Iterator[ActionBatch]:
        """Consecutive events as (type, body), ``size`` at a time (files converted a slice at a time)."""
        pending: ActionBatch = list(self._head[self.start :])
        offset = max(0, self.start - len(self._head))
        total = self._files.num_rows
        while offset < total or pending:
            room = size - len(pending)
            if room > 0 and offset < total:
                chunk = self._files.slice(offset, room)
                offset += chunk.num_rows
                pending.extend(("add", row) for row in action_schema.file_rows(chunk))
            if len(pending) >= size or offset >= total:
                yield pending[:size]
                pending = pending[size:]

    def summary(self) -> CommitSummary:
        files = self._files
        partitions: list[dict[str, Any]] = []
        truncated = False
        if files.num_rows and "partitionValues" in files.column_names:
            partitions, truncated = distinct_partitions(files["partitionValues"], MAX_PARTITIONS_LISTED)
        size_sum = pc.sum(files["size"]).as_py() if files.num_rows else 0
        return commit_summary(
            self,
            operation="SNAPSHOT",
            adds=files.num_rows,
            removes=0,
            cdc_files=0,
            bytes_added=int(size_sum or 0),
            bytes_removed=0,
            partitions_touched=partitions,
            partitions_touched_truncated=truncated,
            metadata_changed=True,
            protocol_changed=True,
        )


class ProgressBar:
    """``snapshot v12 of s3://b/t: 410000/1000000 actions published (41%)`` on a terminal.

    Logs stay JSON lines: the bar is drawn only when the stream is a TTY and ``shown`` (which
    ``watch --no-progress`` clears), at most 5 times a second, and erased once the snapshot is
    published, so that the next log line starts on a clean line.
    """

    #: False: no bar at all (``deltamirror watch --no-progress``)
    shown = True

    def __init__(self, label: str, total: int, stream: IO[str] | None = None) -> None:
        self._stream = stream if stream is not None else sys.stderr
        self._enabled = (
            ProgressBar.shown and bool(getattr(self._stream, "isatty", lambda: False)()) and total > 0
        )
        self._label = label
        self._total = total
        self._done = 0
        self._last = 0.0
        self._width = 0

    def advance(self, n: int) -> None:
        self._done += n
        now = time.monotonic()
        if self._enabled and (now - self._last >= 0.2 or self._done >= self._total):
            self._last = now
            pct = 100 * self._done // self._total
            text = f"{self._label}: {self._done}/{self._total} actions published ({pct}%)"
            self._stream.write("\r" + text + " " * max(0, self._width - len(text)))
            self._stream.flush()
            self._width = len(text)

    def close(self) -> None:
        if self._enabled and self._width:
            self._stream.write("\r" + " " * self._width + "\r")
            self._stream.flush()
        self._enabled = False


__all__ = ["ProgressBar", "SnapshotWork"]
