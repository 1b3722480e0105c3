"""Commit timestamps: the one rule every reader uses, and timestamp -> version search.

The rule (``snapshot``, ``history``, ``events``, time travel and change-feed bounds all call it):

* In-Commit Timestamps (ICT), configured by the latest metaData (as delta-spark's DESCRIBE HISTORY
  and timestamp search do): a version at or after ``delta.inCommitTimestampEnablementVersion``
  (every version when ICT is enabled without one) has ``commitInfo.inCommitTimestamp``.
* Every other version has its commit file's modification time made monotonic the way
  delta-spark's ``DeltaHistoryManager.monotonizeCommitTimestamps`` does (a time not after the
  previous one becomes previous + 1 ms), chained over the commit files listed in ``_delta_log``
  from the earliest one listed (``getEarliestDeltaFile``, where DESCRIBE HISTORY and the change
  feed's timestamp search start). Checkpoints play no part, so deleting one changes nothing; only
  log cleanup, by removing the first commits of the chain, can change a later version's answer.
* A version whose commit file is gone but which a checkpoint describes has the timestamp of the
  last commit file before it (delta-spark's ``LogSegment.lastCommitFileModificationTimestamp``);
  with no commit file at or before it, the checkpoint file's modification time.

The change feed's ``_commit_timestamp`` keeps delta-spark's own rule (file times chained from
``start - 100``, see :mod:`.changes`). Every resolved timestamp says where it came from, because
consumers may trust the three sources differently.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum

from .errors import CorruptLogError, InvalidArgumentError, TimestampOutOfRangeError, VersionNotFoundError


class TimestampSource(StrEnum):
    ICT = "ict"
    FILE_TIME = "file-time"
    ADJUSTED_FILE_TIME = "adjusted-file-time"


@dataclass(frozen=True, slots=True)
class CommitTimestamp:
    """The resolved timestamp of one version, in epoch milliseconds."""

    version: int
    timestamp: int
    source: TimestampSource

    @property
    def iso(self) -> str:
        return format_iso(self.timestamp)


def format_iso(epoch_ms: int) -> str:
    """ISO-8601 UTC with milliseconds, the one timestamp format deltamirror prints."""
    dt = datetime.fromtimestamp(epoch_ms / 1000, tz=UTC)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{epoch_ms % 1000:03d}Z"


def parse_timestamp(text: str) -> int:
    """An ISO-8601 timestamp (``2026-01-01T00:00:05.500Z``, a date, or epoch ms) to epoch ms.

    A timestamp without an offset is taken as UTC, as delta-spark does with a UTC session.
    """
    text = text.strip()
    if text.lstrip("-").isdigit():
        return int(text)
    try:
        dt = datetime.fromisoformat(text.replace("Z", "+00:00").replace(" ", "T", 1))
    except ValueError:
        raise InvalidArgumentError(
            f"invalid timestamp {text!r}: expected ISO-8601 such as 2026-01-01T00:00:05.500Z"
        ) from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return (
        int(dt.timestamp() * 1000) if dt.microsecond % 1000 == 0 else int(dt.timestamp() * 1_000_000) // 1000
    )


@dataclass(frozen=True, slots=True)
class IctConfig:
    """Where In-Commit Timestamps start, from the table properties of the latest metadata."""

    enabled: bool = False
    enablement_version: int | None = None
    enablement_timestamp: int | None = None

    @classmethod
    def from_configuration(cls, configuration: Mapping[str, str], *, table: str | None = None) -> IctConfig:
        enabled = str(configuration.get("delta.enableInCommitTimestamps", "false")).lower() == "true"
        version = _int_property(configuration, "delta.inCommitTimestampEnablementVersion", table)
        ts = _int_property(configuration, "delta.inCommitTimestampEnablementTimestamp", table)
        return cls(enabled, version, ts)

    def applies_to(self, version: int) -> bool:
        return self.enabled and (self.enablement_version is None or version >= self.enablement_version)


def _int_property(configuration: Mapping[str, str], key: str, table: str | None) -> int | None:
    """A table property holding an integer; any other text is a corrupt metaData, not a crash."""
    value = configuration.get(key)
    if value is None:
        return None
    text = str(value).strip()
    if not text.lstrip("-").isdigit() or len(text) > 20:
        raise CorruptLogError(f"table property {key} is not an integer", table=table)
    return int(text)


@dataclass(frozen=True, slots=True)
class CommitTime:
    """The raw inputs for one version: file modification time and inCommitTimestamp if any."""

    version: int
    file_time: int
    in_commit_timestamp: int | None = None


def resolve_timestamps(
    commits: Sequence[CommitTime], ict: IctConfig, previous: CommitTimestamp | None = None
) -> list[CommitTimestamp]:
    """Resolve consecutive versions, in order.

    ``previous`` is the resolved timestamp of the version just before ``commits[0]`` (for example
    from a producer's progress record), so that the monotonic adjustment is the same whether a
    range is resolved in one go or piece by piece.
    """
    out: list[CommitTimestamp] = []
    prev = previous
    for c in commits:
        if ict.applies_to(c.version) and c.in_commit_timestamp is not None:
            ts = CommitTimestamp(c.version, c.in_commit_timestamp, TimestampSource.ICT)
        elif ict.applies_to(c.version):
            raise CorruptLogError(
                "In-Commit Timestamps are enabled for this version but its commitInfo has no inCommitTimestamp",
                version=c.version,
            )
        elif prev is not None and c.file_time <= prev.timestamp:
            ts = CommitTimestamp(c.version, prev.timestamp + 1, TimestampSource.ADJUSTED_FILE_TIME)
        else:
            ts = CommitTimestamp(c.version, c.file_time, TimestampSource.FILE_TIME)
        out.append(ts)
        prev = ts
    return out


#: reads a version's ``commitInfo.inCommitTimestamp`` (None when the commit has none)
IctReader = Callable[[int], int | None]


def ict_timestamp(version: int, value: int | None, *, table: str | None = None) -> CommitTimestamp:
    """The timestamp of a version ICT applies to; a commit without its inCommitTimestamp is corrupt."""
    if value is None:
        raise CorruptLogError(
            "In-Commit Timestamps are enabled for this version but its commitInfo has no inCommitTimestamp",
            table=table,
            version=version,
        )
    return CommitTimestamp(version, value, TimestampSource.ICT)


def monotonic_file_times(
    file_times: Mapping[int, int], ict: IctConfig, *, end: int | None = None
) -> dict[int, CommitTimestamp]:
    """The file-time part of the rule: every listed commit ICT does not apply to, up to ``end``,
    its modification time chained from the earliest listed commit (ICT versions, which only ever
    follow these, take no part)."""
    versions = sorted(v for v in file_times if (end is None or v <= end) and not ict.applies_to(v))
    resolved = resolve_timestamps([CommitTime(v, file_times[v]) for v in versions], IctConfig())
    return {t.version: t for t in resolved}


def log_timestamps(
    file_times: Mapping[int, int],
    ict: IctConfig,
    in_commit_timestamp: IctReader,
    *,
    start: int = 0,
    end: int | None = None,
    table: str | None = None,
) -> list[CommitTimestamp]:
    """The resolved timestamps of the listed commits in [start, end], in version order.

    ``file_times`` must hold every commit file listed in ``_delta_log`` (from the earliest, not
    from ``start``): that is what makes the answer independent of the range asked for.
    ``in_commit_timestamp`` is called only for versions ICT applies to.
    """
    chained = monotonic_file_times(file_times, ict, end=end)
    out = []
    for v in sorted(v for v in file_times if v >= start and (end is None or v <= end)):
        if ict.applies_to(v):
            out.append(ict_timestamp(v, in_commit_timestamp(v), table=table))
        else:
            out.append(chained[v])
    return out


def last_commit_timestamp(
    version: int,
    file_times: Mapping[int, int],
    ict: IctConfig,
    in_commit_timestamp: IctReader,
    *,
    table: str | None = None,
) -> CommitTimestamp | None:
    """The resolved timestamp of the last listed commit at or before ``version`` (None if none is).

    It is the timestamp of ``version`` itself when its commit file is listed, and what the
    versions after it are chained from.
    """
    anchor = max((v for v in file_times if v <= version), default=None)
    if anchor is None:
        return None
    return log_timestamps(file_times, ict, in_commit_timestamp, start=anchor, end=anchor, table=table)[0]


def version_timestamp(
    version: int,
    file_times: Mapping[int, int],
    ict: IctConfig,
    in_commit_timestamp: IctReader,
    *,
    checkpoint_file_time: int | None = None,
    table: str | None = None,
) -> CommitTimestamp:
    """The resolved timestamp of ``version``, including one whose commit file is gone but which a
    checkpoint (whose file time is ``checkpoint_file_time``) describes."""
    found = last_commit_timestamp(version, file_times, ict, in_commit_timestamp, table=table)
    if found is not None:
        return found if found.version == version else CommitTimestamp(version, found.timestamp, found.source)
    if checkpoint_file_time is None:
        raise VersionNotFoundError(
            f"version {version} has neither a commit file nor a checkpoint", table=table, version=version
        )
    return CommitTimestamp(version, checkpoint_file_time, TimestampSource.FILE_TIME)


def version_at_or_before(
    timestamps: Sequence[CommitTimestamp], ts: int, ict: IctConfig, *, table: str | None = None
) -> int:
    """The latest version whose timestamp is <= ``ts`` (time travel ``AS OF TIMESTAMP``).

    ``timestamps`` are every available version's, in order. Per the ICT protocol, a timestamp at or
    after the enablement timestamp searches only ICT versions, an earlier one only the versions
    before enablement.
    """
    candidates = _search_space(timestamps, ts, ict)
    if not candidates:
        raise TimestampOutOfRangeError(f"no commit at or before {format_iso(ts)}", table=table)
    latest = timestamps[-1]
    if ts > latest.timestamp:
        raise TimestampOutOfRangeError(
            f"timestamp {format_iso(ts)} is after the latest commit "
            f"(version {latest.version} at {latest.iso})",
            table=table,
            version=latest.version,
        )
    keys = [t.timestamp for t in candidates]
    i = bisect.bisect_right(keys, ts)
    if i == 0:
        first = candidates[0]
        raise TimestampOutOfRangeError(
            f"timestamp {format_iso(ts)} is before the earliest available commit "
            f"(version {first.version} at {first.iso})",
            table=table,
            version=first.version,
        )
    return candidates[i - 1].version


def version_at_or_after(
    timestamps: Sequence[CommitTimestamp], ts: int, ict: IctConfig, *, table: str | None = None
) -> int | None:
    """The first version whose timestamp is >= ``ts`` (a change-feed start), or None if none is."""
    candidates = _search_space(timestamps, ts, ict)
    keys = [t.timestamp for t in candidates]
    i = bisect.bisect_left(keys, ts)
    if i < len(candidates):
        return candidates[i].version
    # before ICT enablement but after every pre-ICT commit: the first ICT version follows
    later = [t for t in timestamps if t.timestamp >= ts]
    return later[0].version if later else None


def _search_space(
    timestamps: Sequence[CommitTimestamp], ts: int, ict: IctConfig
) -> Sequence[CommitTimestamp]:
    if not ict.enabled or ict.enablement_version is None or ict.enablement_timestamp is None:
        return timestamps
    if ts >= ict.enablement_timestamp:
        return [t for t in timestamps if t.version >= ict.enablement_version]
    return [t for t in timestamps if t.version < ict.enablement_version]
