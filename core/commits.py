"""Following a log commit by commit: finding new versions cheaply and timing each one.

A watcher asks "what came after version N?" many times a second across many tables; the answer
must not cost a listing of the whole log. Probing for ``N+1.json`` costs one request per new
version plus one, whatever the length of the log.
"""

from __future__ import annotations

from .log import commit_name
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
