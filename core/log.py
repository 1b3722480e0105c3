"""The files of ``_delta_log``: naming, listing, and the log segment that builds one version.

A log segment is the smallest set of files that defines a version: the best complete checkpoint at
or below it and the JSON commits after it. ``_last_checkpoint`` only says where to start listing;
whatever it says (missing, stale, empty, corrupt), the listing decides.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import IO, Any, Literal

import pydantic_core

from .errors import (
    CorruptLogError,
    LogGapError,
    TableNotFoundError,
    VersionNotFoundError,
)
from .storage import FileInfo, TableStorage

COMMIT_RE = re.compile(r"^(\d{20})\.json$")
CLASSIC_CP_RE = re.compile(r"^(\d{20})\.checkpoint\.parquet$")
MULTIPART_CP_RE = re.compile(r"^(\d{20})\.checkpoint\.(\d{10})\.(\d{10})\.parquet$")
UUID_CP_RE = re.compile(r"^(\d{20})\.checkpoint\.([0-9a-fA-F-]{36})\.(json|parquet)$")
COMPACTION_RE = re.compile(r"^(\d{20})\.(\d{20})\.compacted\.json$")
CRC_RE = re.compile(r"^(\d{20})\.crc$")

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


@dataclass(frozen=True, slots=True)
class LastCheckpointHint:
    version: int
    size: int | None = None
    parts: int | None = None


def read_last_checkpoint(storage: TableStorage) -> LastCheckpointHint | None:
    """``_last_checkpoint``, or None when it is missing, empty or unreadable (it is only a hint)."""
    try:
        raw = storage.read_bytes(storage.log_file("_last_checkpoint"))
        data = json.loads(raw)
        return LastCheckpointHint(int(data["version"]), data.get("size"), data.get("parts"))
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return None


@dataclass(frozen=True, slots=True)
class LogSegment:
    """The files that define ``version``: a checkpoint (or none) and the commits after it."""

    table: str
    version: int
    checkpoint: Checkpoint | None
    commits: tuple[tuple[int, FileInfo], ...]
    listing: LogListing

    @property
    def commit_versions(self) -> list[int]:
        return [v for v, _ in self.commits]


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
        start = hint.version if hint is not None and (version is None or hint.version <= version) else 0
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
    return LogSegment(storage.uri, target, cp, tuple(commits), listing)


def _best_checkpoint(listing: LogListing, version: int | None) -> Checkpoint | None:
    eligible = [v for v in listing.checkpoints if version is None or v <= version]
    return listing.checkpoints[max(eligible)] if eligible else None


# --- reading commits --------------------------------------------------------------------------


def iter_json_actions(
    data: bytes | Iterable[bytes], *, table: str, file: str, only: Sequence[bytes] = ()
) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, action) for each non-blank line of a JSON-lines log file.

    A line that is not a JSON object with one action raises CorruptLogError naming file and line;
    nothing after a corrupt line is trusted. With ``only`` (quoted action names such as
    ``b'"metaData"'``), lines naming none of them are not decoded at all: a reader that needs a
    few actions of a commit of thousands skips the cost of the others.
    """
    lines = data.splitlines() if isinstance(data, bytes) else data
    for lineno, raw in enumerate(lines, start=1):
        if only and not any(key in raw for key in only):
            continue
        if not raw.strip():
            continue
        obj = _parse_json_line(raw, table=table, file=file, line=lineno)
        if not isinstance(obj, dict) or not obj:
            raise CorruptLogError(
                "a log line must be a JSON object holding an action", table=table, file=file, line=lineno
            )
        if len(obj) == 1:
            yield lineno, obj
        else:  # a newer writer may put another (unknown) action beside a known one: keep both
            for key, value in obj.items():
                yield lineno, {key: value}


def _parse_json_line(raw: bytes, *, table: str, file: str, line: int) -> Any:
    """One log line: pydantic-core's parser (three times the standard library's speed on log lines),
    and the standard library's where it refuses a line (a lone surrogate escape, which Java
    writers can produce and readers accept), so both accept the same lines."""
    try:
        return pydantic_core.from_json(raw)
    except ValueError:
        pass
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise CorruptLogError(f"invalid JSON: {exc}", table=table, file=file, line=line) from exc


def read_commit(storage: TableStorage, version: int) -> list[dict[str, Any]]:
    """The actions of one commit file, in file order."""
    path = storage.log_file(commit_name(version))
    try:
        data = storage.read_bytes(path)
    except FileNotFoundError:
        raise VersionNotFoundError(
            f"commit {version} does not exist", table=storage.uri, version=version, file=path
        ) from None
    return [a for _, a in iter_json_actions(data, table=storage.uri, file=path)]


def open_commit(storage: TableStorage, version: int) -> IO[bytes]:
    """The commit file of ``version``, opened for streaming; VersionNotFoundError if it is not there."""
    path = storage.log_file(commit_name(version))
    try:
        return storage.open(path)
    except FileNotFoundError:
        raise VersionNotFoundError(
            f"commit {version} does not exist", table=storage.uri, version=version, file=path
        ) from None


def iter_commit_stream(storage: TableStorage, version: int) -> Iterator[tuple[int, dict[str, Any]]]:
    """The actions of one commit, read line by line (a commit may hold millions of actions)."""
    with open_commit(storage, version) as fh:
        yield from iter_json_actions(fh, table=storage.uri, file=storage.log_file(commit_name(version)))
