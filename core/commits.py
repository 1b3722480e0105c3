"""Following a log commit by commit: finding new versions cheaply and timing each one.

A watcher asks "what came after version N?" many times a second across many tables; the answer
must not cost a listing of the whole log. Probing for ``N+1.json`` costs one request per new
version plus one, whatever the length of the log.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .log import commit_name, iter_commit_stream
from .models import Metadata
from .storage import FileInfo, TableStorage
from .timestamps import CommitTime, CommitTimestamp, IctConfig, resolve_timestamps


def probe_next_versions(storage: TableStorage, after: int, limit: int = 1000) -> list[tuple[int, FileInfo]]:
    """Commit files of versions after+1, after+2, ... that exist, stopping at the first missing one.

    Returns at most ``limit`` versions so a catching-up caller can work in bounded steps.
    """
    found: list[tuple[int, FileInfo]] = []
    version = after + 1
    while len(found) < limit:
        try:
            info = storage.info(storage.log_file(commit_name(version)))
        except FileNotFoundError:
            break
        found.append((version, info))
        version += 1
    return found


class TimestampTracker:
    """Resolves the timestamps of consecutive versions as they are read, one at a time.

    Keeps the previous resolved timestamp (for the monotonic adjustment of file times) and the
    ICT configuration of the latest metaData seen (a commit that enables ICT carries it).
    Seed it with the last published timestamp after a restart to get identical results.
    """

    def __init__(self, ict: IctConfig, previous: CommitTimestamp | None = None) -> None:
        self.ict = ict
        self.previous = previous

    def observe_metadata(self, metadata: Metadata) -> None:
        self.ict = IctConfig.from_configuration(metadata.configuration)

    def resolve(self, version: int, file_time: int, in_commit_timestamp: int | None) -> CommitTimestamp:
        ts = resolve_timestamps(
            [CommitTime(version, file_time, in_commit_timestamp)], self.ict, self.previous
        )[0]
        self.previous = ts
        return ts


@dataclass(frozen=True, slots=True)
class CommitHeader:
    """What must be known about a version before its actions are published."""

    version: int
    file: FileInfo
    commit_info: dict[str, Any] | None
    metadata: dict[str, Any] | None
    action_count: int


def scan_commit(storage: TableStorage, version: int, file: FileInfo) -> CommitHeader:
    """One streaming pass over a commit: its commitInfo, metaData and number of actions.

    Publishing needs the count (``index``/``count`` in every event) and the timestamp before the
    first action goes out; a second pass streams the actions, so memory stays bounded.
    """
    commit_info = None
    metadata = None
    count = 0
    for _, wrapped in iter_commit_stream(storage, version):
        count += 1
        if "commitInfo" in wrapped and commit_info is None:
            commit_info = wrapped["commitInfo"]
        elif "metaData" in wrapped:
            metadata = wrapped["metaData"]
    return CommitHeader(version, file, commit_info, metadata, count)


def iter_actions(storage: TableStorage, version: int) -> Iterator[dict[str, Any]]:
    """The actions of one commit in file order, streamed."""
    for _, wrapped in iter_commit_stream(storage, version):
        yield wrapped
