"""Commit timestamps as the In-Commit Timestamps protocol says, and timestamp -> version search.

For versions where In-Commit Timestamps (ICT) are in force the timestamp is
``commitInfo.inCommitTimestamp``; before that it is the commit file's modification time, made
monotonic as delta-spark does (a commit's timestamp is at least the previous one + 1 ms). Every
resolved timestamp says which of the three it is, because consumers may trust them differently.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum

from .errors import CorruptLogError, InvalidArgumentError, TimestampOutOfRangeError


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
    def from_configuration(cls, configuration: Mapping[str, str]) -> IctConfig:
        enabled = configuration.get("delta.enableInCommitTimestamps", "false").lower() == "true"
        version = configuration.get("delta.inCommitTimestampEnablementVersion")
        ts = configuration.get("delta.inCommitTimestampEnablementTimestamp")
        return cls(
            enabled, int(version) if version is not None else None, int(ts) if ts is not None else None
        )

    def applies_to(self, version: int) -> bool:
        return self.enabled and (self.enablement_version is None or version >= self.enablement_version)


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
