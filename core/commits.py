"""Following a log commit by commit: finding new versions cheaply, reading each one checked, timing it.

A watcher asks "what came after version N?" many times a second across many tables; the answer
must not cost a listing of the whole log. Probing for ``N+1.json`` costs one request per new
version plus one, whatever the length of the log.

Once found, a version is read by one call, :func:`read_version`: every line through the log
boundary, the commit checked as a whole, its protocol and metaData checked against the features
this reader supports, and its commit timestamp resolved. What comes back is a version the caller
may publish as it is; nothing about the protocol is left for it to check.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import repeat
from typing import Any, TypeVar

from . import features
from .actions import ActionRun, Where, read_actions
from .errors import VersionNotFoundError
from .log import check_commit, commit_name, stream_commit
from .models import Metadata, Protocol, model_of
from .storage import FileInfo, TableStorage
from .timestamps import CommitTime, CommitTimestamp, IctConfig, resolve_timestamps

_M = TypeVar("_M", Metadata, Protocol)

#: commit files up to this size are read once and their actions kept for the second pass
SMALL_COMMIT_BYTES = 16 * 1024 * 1024


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


@dataclass(slots=True)
class CheckedVersion:
    """One version as :func:`read_version` returns it: validated line by line, checked as a whole.

    ``protocol`` and ``metadata`` are the version's own (None when it has none), both checked
    readable by this reader; ``in_force`` is the metaData in force at the version (its own, or
    the one before it). ``actions`` holds every (type, the log's own bytes) of a small commit,
    read once; a large one is streamed again by :func:`version_actions`.
    """

    version: int
    file: FileInfo
    path: str
    count: int
    commit_info: dict[str, Any] | None
    protocol: Protocol | None
    metadata: Metadata | None
    in_force: Metadata | None
    #: resolved when :func:`read_version` was given the tracker of the versions before
    timestamp: CommitTimestamp | None
    actions: list[tuple[str, bytes]] | None


def read_version(
    storage: TableStorage,
    version: int,
    info: FileInfo,
    *,
    data: bytes | None = None,
    in_force: Metadata | None = None,
    timestamps: TimestampTracker | None = None,
    observe: Callable[[ActionRun], None] | None = None,
) -> CheckedVersion:
    """Read version ``version`` (its commit file, ``info`` as listed) through the log boundary.

    Every line is validated (:mod:`.actions`); the commit must hold an action and, where
    In-Commit Timestamps apply, a timestamp (:func:`.log.check_commit`); its own protocol must
    be readable and its own metaData's schema supported (:mod:`.features`). ``in_force`` is the
    metaData in force before the version. With ``timestamps``, the tracker of the versions
    before, the commit timestamp is resolved (and the tracker moves on). ``observe`` sees every
    run of actions as it is read (a caller summarizing the commit reads it once); file actions
    come as Structs (:func:`.actions.read_actions` with ``structs``): the caller publishes their
    bytes and reads a few fields.

    A small commit is read whole (unless ``data``, its bytes read already, is given) and its
    actions kept; a large one is streamed, keeping nothing but what ``observe`` keeps.
    """
    path = storage.log_file(commit_name(version))
    count = 0
    commit_info: dict[str, Any] | None = None
    commit_info_line: int | None = None
    own_metadata: dict[str, Any] | None = None
    metadata_line = 0
    own_protocol: dict[str, Any] | None = None
    kept: list[tuple[str, bytes]] | None = None
    if info.size <= SMALL_COMMIT_BYTES:
        try:
            if data is None:
                data = storage.read_bytes(path)
        except FileNotFoundError:
            raise VersionNotFoundError(
                f"commit {version} disappeared while it was read",
                table=storage.uri,
                version=version,
                file=path,
            ) from None
        kept = []
        runs: Iterator[ActionRun] = read_actions(
            data, table=storage.uri, file=path, version=version, structs=True
        )
    else:  # listed: gone now means the log was cleaned under us
        runs = stream_commit(storage, version, structs=True)
    for run in runs:
        count += len(run)
        name = run.name
        if name == "commitInfo" and commit_info is None:
            commit_info, commit_info_line = run.values[0], run.line
        elif name == "metaData":
            own_metadata, metadata_line = run.values[-1], run.line + len(run) - 1
        elif name == "protocol":
            own_protocol = run.values[-1]
        if observe is not None:
            observe(run)
        if kept is not None:
            kept += zip(repeat(name), run.bodies)
    where = Where(storage.uri, path, version)
    metadata = _model(Metadata, "metaData", own_metadata)
    protocol = _model(Protocol, "protocol", own_protocol)
    # as core's readers check a commit as a whole: an empty file (one still being written by a
    # writer without atomic put, or a broken one) stops the table until the file has actions, and
    # the metaData in force (its own, or the one before it) decides ICT
    check_commit(
        where,
        actions=count,
        metadata=metadata or in_force,
        commit_info=commit_info,
        commit_info_line=commit_info_line,
    )
    if protocol is not None:
        features.check_readable(protocol, table=storage.uri, version=version)
    if metadata is not None:
        features.check_schema(metadata.located(where, metadata_line))
    timestamp = None
    if timestamps is not None:
        if metadata is not None:
            timestamps.observe_metadata(metadata)
        ict = (commit_info or {}).get("inCommitTimestamp")
        timestamp = timestamps.resolve(version, info.modification_time, ict if isinstance(ict, int) else None)
    return CheckedVersion(
        version, info, path, count, commit_info, protocol, metadata, metadata or in_force, timestamp, kept
    )


def version_actions(storage: TableStorage, checked: CheckedVersion) -> Iterator[tuple[str, bytes]]:
    """(type, the log's own bytes) per action of a version :func:`read_version` read, in file order.

    A large commit is read (and validated) again, streaming: the same bytes come out.
    """
    if checked.actions is not None:
        yield from checked.actions
        return
    for run in stream_commit(storage, checked.version, structs=True):
        yield from zip(repeat(run.name), run.bodies)


def _model(kind: type[_M], name: str, value: dict[str, Any] | None) -> _M | None:
    if value is None:
        return None
    parsed = model_of(name, value)
    assert isinstance(parsed, kind)
    return parsed
