"""The files of ``_delta_log``: naming, listing, and the log segment that builds one version.

A log segment is the smallest set of files that defines a version: the best complete checkpoint at
or below it and the JSON commits after it. ``_last_checkpoint`` only says where to start listing;
whatever it says (missing, stale, empty, corrupt), the listing decides.

Log compaction files (``<x>.<y>.compacted.json``, the reconciled actions of commits x..y) may stand
in for the commits they cover when a state is rebuilt; the segment still names every commit, since
a version's timestamp, the change feed and the watcher need each commit's own actions. A compaction
file is an optional copy of what the commits say: one that cannot be read is passed over for them.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import IO, Any, Literal

from .actions import ActionRun, Where, iter_values, line_buffers, parse_json, read_actions
from .errors import (
    CorruptLogError,
    LogGapError,
    StorageAccessError,
    StorageError,
    TableNotFoundError,
    VersionNotFoundError,
)
from .models import Metadata, model_of
from .storage import FileInfo, TableStorage
from .timestamps import IctConfig

COMMIT_RE = re.compile(r"^(\d{20})\.json$")
CLASSIC_CP_RE = re.compile(r"^(\d{20})\.checkpoint\.parquet$")
MULTIPART_CP_RE = re.compile(r"^(\d{20})\.checkpoint\.(\d{10})\.(\d{10})\.parquet$")
UUID_CP_RE = re.compile(r"^(\d{20})\.checkpoint\.([0-9a-fA-F-]{36})\.(json|parquet)$")
COMPACTION_RE = re.compile(r"^(\d{20})\.(\d{20})\.compacted\.json$")
CRC_RE = re.compile(r"^(\d{20})\.crc$")

log = logging.getLogger(__name__)

CheckpointKind = Literal["v2", "multipart", "classic"]
_KIND_RANK = {"v2": 3, "multipart": 2, "classic": 1}


def commit_name(version: int) -> str:
    return f"{version:020d}.json"


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """One complete checkpoint: one file (classic, V2) or all parts of a multi-part set."""

    version: int
    kind: CheckpointKind
    files: tuple[FileInfo, ...]

    @property
    def format(self) -> Literal["json", "parquet"]:
        return "json" if self.files[0].name.endswith(".json") else "parquet"


@dataclass(frozen=True, slots=True)
class LogListing:
    """What a listing of ``_delta_log`` found, by kind and version."""

    commits: dict[int, FileInfo] = field(default_factory=dict)
    checkpoints: dict[int, Checkpoint] = field(default_factory=dict)
    compactions: dict[tuple[int, int], FileInfo] = field(default_factory=dict)
    checksums: dict[int, FileInfo] = field(default_factory=dict)

    @property
    def versions(self) -> list[int]:
        return sorted(set(self.commits) | set(self.checkpoints))

    @classmethod
    def from_files(cls, files: Iterable[FileInfo]) -> LogListing:
        commits: dict[int, FileInfo] = {}
        classic: dict[int, FileInfo] = {}
        uuid_cps: dict[int, list[FileInfo]] = {}
        parts: dict[tuple[int, int], dict[int, FileInfo]] = {}
        compactions: dict[tuple[int, int], FileInfo] = {}
        checksums: dict[int, FileInfo] = {}
        for f in files:
            if m := COMMIT_RE.match(f.name):
                commits[int(m[1])] = f
            elif m := CLASSIC_CP_RE.match(f.name):
                classic[int(m[1])] = f
            elif m := MULTIPART_CP_RE.match(f.name):
                parts.setdefault((int(m[1]), int(m[3])), {})[int(m[2])] = f
            elif m := UUID_CP_RE.match(f.name):
                uuid_cps.setdefault(int(m[1]), []).append(f)
            elif m := COMPACTION_RE.match(f.name):
                compactions[(int(m[1]), int(m[2]))] = f
            elif m := CRC_RE.match(f.name):
                checksums[int(m[1])] = f
        checkpoints: dict[int, Checkpoint] = {}

        def offer(cp: Checkpoint) -> None:
            current = checkpoints.get(cp.version)
            if current is None or _KIND_RANK[cp.kind] > _KIND_RANK[current.kind]:
                checkpoints[cp.version] = cp

        for v, f in classic.items():
            offer(Checkpoint(v, "classic", (f,)))
        for (v, n), found in parts.items():
            if sorted(found) == list(range(1, n + 1)):  # an incomplete part set is ignored
                offer(Checkpoint(v, "multipart", tuple(found[i] for i in range(1, n + 1))))
        for v, fs in uuid_cps.items():
            offer(Checkpoint(v, "v2", (sorted(fs, key=lambda f: f.name)[0],)))
        return cls(commits, checkpoints, compactions, checksums)


def read_last_checkpoint(storage: TableStorage) -> int | None:
    """The version ``_last_checkpoint`` names, or None when it is missing, empty or unreadable
    (it is only a hint of where to start listing; its other fields are not needed for that)."""
    try:
        raw = storage.read_bytes(storage.log_file("_last_checkpoint"))
        version = parse_json(raw, what="_last_checkpoint")["version"]
    except (FileNotFoundError, CorruptLogError, StorageError, KeyError, TypeError):
        return None  # a hint only: whatever is wrong with it (or with reading it), the listing decides
    if type(version) is not int or version < 0:
        return None
    return version


@dataclass(frozen=True, slots=True)
class Compaction:
    """A log compaction file: the reconciled actions of commits ``start`` to ``end`` (both in)."""

    start: int
    end: int
    file: FileInfo

    @property
    def versions(self) -> range:
        return range(self.start, self.end + 1)


@dataclass(frozen=True, slots=True)
class LogSegment:
    """The files that define ``version``: a checkpoint (or none) and the commits after it, and the
    compaction files that replay reads in place of some of those commits (:func:`compaction_cover`)."""

    table: str
    version: int
    checkpoint: Checkpoint | None
    commits: tuple[tuple[int, FileInfo], ...]
    listing: LogListing
    compactions: tuple[Compaction, ...] = ()

    @property
    def commit_versions(self) -> list[int]:
        return [v for v, _ in self.commits]

    def replay_files(self) -> list[int | Compaction]:
        """What a replay reads after the checkpoint, in log order: each compaction in place of the
        commits it covers, the version of every other commit."""
        out: list[int | Compaction] = []
        by_start = {c.start: c for c in self.compactions}
        version = self.commits[0][0] if self.commits else self.version + 1
        while version <= self.version:
            compaction = by_start.get(version)
            if compaction is not None:
                out.append(compaction)
                version = compaction.end + 1
            else:
                out.append(version)
                version += 1
        return out


def compaction_cover(listing: LogListing, after: int, version: int) -> tuple[Compaction, ...]:
    """The compaction files a replay of ``version`` reads, in order: those wholly within
    (``after``, ``version``], none overlapping another, chosen greedily from the oldest start, the
    widest where several start at one version (as delta-kernel-rs chooses). ``after`` is the
    checkpoint's version (-1 without one): a file that reaches back to it or before would apply
    actions the checkpoint already holds.

    Passed over: a file whose end is not after its start (the protocol requires it to be) and an
    empty one (being written, or cut short: its commits are read instead)."""
    usable: dict[int, Compaction] = {}
    for (start, end), info in listing.compactions.items():
        if not after < start < end <= version:
            continue
        if info.size == 0:  # passed over at every listing while it stays: not worth a warning each time
            log.debug("log compaction file %s is empty: reading the commits it covers", info.name)
            continue
        current = usable.get(start)
        if current is None or end > current.end:
            usable[start] = Compaction(start, end, info)
    chosen: list[Compaction] = []
    reached = after  # the last version covered so far
    for start in sorted(usable):
        if start > reached:
            chosen.append(usable[start])
            reached = usable[start].end
    return tuple(chosen)


def list_log(storage: TableStorage, start_version: int = 0) -> LogListing:
    """Every log file of versions >= ``start_version``."""
    return LogListing.from_files(storage.iter_log_from(start_version))


def _require_log(storage: TableStorage, listing: LogListing) -> None:
    if not listing.versions:
        if not storage.exists(storage.log_path):
            raise TableNotFoundError("not a Delta table: no _delta_log folder", table=storage.uri)
        raise TableNotFoundError("not a Delta table: _delta_log holds no commit", table=storage.uri)


def build_segment(
    storage: TableStorage, version: int | None = None, *, whole_log: LogListing | None = None
) -> LogSegment:
    """The log segment for ``version`` (the latest when None).

    ``whole_log``: a listing of the whole log just made (several segments of one read need not list
    a folder that is listed whole each time, as a local one is).
    """
    if version is not None and version < 0:
        raise VersionNotFoundError(f"invalid version {version}", table=storage.uri, version=version)
    if whole_log is not None:
        listing = whole_log
    else:
        hint = read_last_checkpoint(storage)
        start = hint if hint is not None and (version is None or hint <= version) else 0
        listing = list_log(storage, start)
        if start > 0 and (not listing.versions or _best_checkpoint(listing, version) is None):
            # stale or wrong hint: fall back to the whole log
            listing = list_log(storage, 0)
    _require_log(storage, listing)
    latest = listing.versions[-1]
    target = latest if version is None else version
    if target > latest:
        raise VersionNotFoundError(
            f"version {target} does not exist; the latest version is {latest}",
            table=storage.uri,
            version=target,
        )
    cp = _best_checkpoint(listing, target)
    first_needed = cp.version + 1 if cp is not None else 0
    if cp is None and 0 not in listing.commits:
        earliest = min(listing.versions)
        raise VersionNotFoundError(
            f"version {target} cannot be rebuilt: the log starts at version {earliest} "
            "and no checkpoint at or before it remains (cleaned up)",
            table=storage.uri,
            version=target,
        )
    commits = []
    for v in range(first_needed, target + 1):
        f = listing.commits.get(v)
        if f is None:
            raise LogGapError(
                f"commit {v} is missing from the log (needed to rebuild version {target})",
                table=storage.uri,
                version=v,
                file=storage.log_file(commit_name(v)),
            )
        commits.append((v, f))
    after = cp.version if cp is not None else -1
    cover = compaction_cover(listing, after, target) if listing.compactions else ()
    return LogSegment(storage.uri, target, cp, tuple(commits), listing, cover)


def _best_checkpoint(listing: LogListing, version: int | None) -> Checkpoint | None:
    eligible = [v for v in listing.checkpoints if version is None or v <= version]
    return listing.checkpoints[max(eligible)] if eligible else None


# --- reading commits --------------------------------------------------------------------------


def commit_runs(storage: TableStorage, version: int) -> Iterator[ActionRun]:
    """The validated actions of one commit read whole, as the boundary's runs."""
    path = storage.log_file(commit_name(version))
    try:
        data = storage.read_bytes(path)
    except FileNotFoundError:
        raise VersionNotFoundError(
            f"commit {version} does not exist", table=storage.uri, version=version, file=path
        ) from None
    return read_actions(data, table=storage.uri, file=path, version=version)


def compaction_runs(storage: TableStorage, compaction: Compaction) -> Iterator[ActionRun] | None:
    """The validated actions of a compaction file, as the boundary's runs; None when it cannot be
    read (gone since the listing, refused by the storage, empty): the caller reads the commits it
    covers instead, which say the same. A file that is read but does not hold valid actions is
    refused as a corrupt commit is: the log holding it is broken."""
    path = storage.log_file(compaction.file.name)
    try:
        data = storage.read_bytes(path)
    except (FileNotFoundError, StorageError, StorageAccessError) as exc:
        log.warning(
            "log compaction file %s cannot be read (%s): reading commits %d-%d instead",
            path,
            exc if not isinstance(exc, FileNotFoundError) else "not found",
            compaction.start,
            compaction.end,
        )
        return None
    if not _NOT_BLANK.search(data):
        log.warning("log compaction file %s is empty: reading the commits it covers", path)
        return None
    return read_actions(data, table=storage.uri, file=path)


def read_commit(storage: TableStorage, version: int) -> list[dict[str, Any]]:
    """The validated actions of one commit, in file order, each as its log line has it
    (``{"add": {...}}``)."""
    return [{name: value} for _, name, value in iter_values(commit_runs(storage, version))]


def open_commit(storage: TableStorage, version: int) -> IO[bytes]:
    """The commit file of ``version``, opened for streaming; VersionNotFoundError if it is not there."""
    path = storage.log_file(commit_name(version))
    try:
        return storage.open(path)
    except FileNotFoundError:
        raise VersionNotFoundError(
            f"commit {version} does not exist", table=storage.uri, version=version, file=path
        ) from None


def stream_commit(
    storage: TableStorage, version: int, *, only: Sequence[bytes] = (), structs: bool = False
) -> Iterator[ActionRun]:
    """The validated actions of one commit, streamed (a commit may hold millions of actions);
    ``only`` and ``structs`` as :func:`.actions.read_actions` has them.

    A file without any action (emptied, or only whitespace) is refused once it is read through, by
    every reader, as :func:`check_commit` refuses it: even one that looks for a few actions only
    must not take a broken commit for one that holds none of them."""
    file = storage.log_file(commit_name(version))
    content = [False]  # whether a byte other than whitespace was met
    with open_commit(storage, version) as fh:
        yield from read_actions(
            _noting_content(line_buffers(fh), content),
            table=storage.uri,
            file=file,
            version=version,
            only=only,
            structs=structs,
        )
    if not content[0]:
        raise Where(storage.uri, file, version).refuse(
            f"commit {version} has no actions (an empty commit file)"
        )


_NOT_BLANK = re.compile(rb"[^ \t\r\n]")


def _noting_content(buffers: Iterable[bytes], content: list[bool]) -> Iterator[bytes]:
    """``buffers`` as they are; ``content[0]`` set once one holds a byte other than whitespace (a
    search that stops at the first such byte: the first of the first buffer, in any real commit)."""
    for buffer in buffers:
        if not content[0] and _NOT_BLANK.search(buffer):
            content[0] = True
        yield buffer


def iter_commit_stream(storage: TableStorage, version: int) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line, ``{type: validated body}``) per action of one commit, streamed."""
    for line, name, value in iter_values(stream_commit(storage, version)):
        yield line, {name: value}


def check_commit(
    where: Where,
    *,
    actions: int,
    metadata: Metadata | None,
    commit_info: dict[str, Any] | None,
    commit_info_line: int | None = None,
    timestamps: bool = True,
) -> None:
    """A commit as a whole, once its lines are validated: it holds at least one action (an empty
    file is one being written, or a broken one); and (unless ``timestamps`` is False) where
    ``metadata``, the metaData in force at it (its own, if it has one), enables In-Commit
    Timestamps, its commitInfo holds one (:func:`timestamp_problem`)."""
    if actions == 0:
        raise where.refuse(f"commit {where.version} has no actions (an empty commit file)")
    if metadata is None:
        return
    problem = timestamp_problem(where, metadata, commit_info, commit_info_line) if timestamps else None
    if problem is not None:
        raise problem


def timestamp_problem(
    where: Where, metadata: Metadata, commit_info: dict[str, Any] | None, line: int | None
) -> CorruptLogError | None:
    """The refusal of a commit that In-Commit Timestamps (enabled by ``metadata``) require a
    commitInfo with an ``inCommitTimestamp`` from, and that lacks one; None if it is fine."""
    assert where.version is not None
    if not IctConfig.from_configuration(metadata.configuration, table=where.table).applies_to(where.version):
        return None
    if commit_info is None:
        return where.refuse("commitInfo: required with In-Commit Timestamps enabled, the commit has none")
    if commit_info.get("inCommitTimestamp") is None:
        return where.refuse(
            "commitInfo.inCommitTimestamp: required field missing (In-Commit Timestamps are enabled)", line
        )
    return None


def count_commit(
    storage: TableStorage, version: int, in_force: Metadata | None
) -> tuple[dict[str, int], dict[str, Any] | None, Metadata | None]:
    """A commit as history shows it: its actions validated and counted by type, its first
    commitInfo, and the metaData in force after it (its own, else ``in_force``); checked as a
    whole by :func:`check_commit` (history refuses what the other readers refuse)."""
    counts: dict[str, int] = {}
    info: dict[str, Any] | None = None
    info_line: int | None = None
    own: dict[str, Any] | None = None
    for run in stream_commit(storage, version):
        counts[run.name] = counts.get(run.name, 0) + len(run)
        if run.name == "commitInfo" and info is None:
            info, info_line = run.values[0], run.line
        elif run.name == "metaData":
            own = run.values[-1]
    metadata = in_force if own is None else _metadata(own)
    where = Where(storage.uri, storage.log_file(commit_name(version)), version)
    check_commit(
        where,
        actions=sum(counts.values()),
        metadata=metadata,
        commit_info=info,
        commit_info_line=info_line,
    )
    return counts, info, metadata


def _metadata(value: dict[str, Any]) -> Metadata:
    parsed = model_of("metaData", value)
    assert isinstance(parsed, Metadata)
    return parsed
