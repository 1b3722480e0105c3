"""Which versions a change-feed read covers, from the bounds its caller gave.

As delta-spark's batch CDF reader (``CDCReader.getCDCRelation``), since its users compare results
with Spark: a starting timestamp resolves to the first commit at or after it, an ending timestamp
to the last commit at or before it, and the checks come in its order. Error classes are
delta-spark's, so an error can be looked up in its docs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from ..errors import (
    ChangeTimestampAfterLatestError,
    ChangeTimestampBeforeEarliestError,
    InvalidArgumentError,
    InvalidChangeRangeError,
    MultipleBoundaryError,
    NoStartingBoundError,
    StartVersionAfterLatestError,
    TimestampOutOfRangeError,
)
from ..timestamps import (
    CommitTimestamp,
    IctConfig,
    format_iso,
    parse_timestamp,
    version_at_or_after,
    version_at_or_before,
)

TimestampLike = str | int | datetime


@dataclass(frozen=True)
class ChangeRange:
    """The resolved bounds. ``empty``: two timestamps fell between the same two commits."""

    start: int
    end: int
    latest: int
    #: the ending bound the caller gave (by version or timestamp), before clamping to ``latest``
    requested_end: int | None
    empty: bool = False


def to_epoch_ms(value: TimestampLike) -> int:
    if isinstance(value, datetime):
        dt = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
        return int(dt.timestamp() * 1_000_000) // 1000
    if isinstance(value, int):
        return value
    return parse_timestamp(value)


def resolve_range(
    *,
    table: str,
    latest: int,
    timestamps: Callable[[], list[CommitTimestamp]],
    ict: IctConfig,
    starting_version: int | None,
    starting_timestamp: TimestampLike | None,
    ending_version: int | None,
    ending_timestamp: TimestampLike | None,
) -> ChangeRange:
    """Bounds in delta-spark's order of checks.

    ``timestamps`` gives every commit's resolved timestamp; it is only called when a bound is a
    timestamp, since listing and reading ICT commit infos costs a pass over the log.
    """
    if starting_version is not None and starting_timestamp is not None:
        raise MultipleBoundaryError(
            "give startingVersion or startingTimestamp, not both", table=table, option="starting"
        )
    if ending_version is not None and ending_timestamp is not None:
        raise MultipleBoundaryError(
            "give endingVersion or endingTimestamp, not both", table=table, option="ending"
        )
    if starting_version is None and starting_timestamp is None:
        raise NoStartingBoundError(
            "a change-feed read needs startingVersion or startingTimestamp", table=table
        )
    for name, v in (("startingVersion", starting_version), ("endingVersion", ending_version)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            raise InvalidArgumentError(f"{name} must be a version number >= 0, got {v!r}", table=table)

    cache: list[CommitTimestamp] | None = None

    def all_timestamps() -> list[CommitTimestamp]:
        nonlocal cache
        if cache is None:
            cache = timestamps()
        return cache

    start_ts = end_ts = None
    if starting_version is not None:
        start = starting_version
    else:
        assert starting_timestamp is not None
        start_ts = to_epoch_ms(starting_timestamp)
        start = _first_at_or_after(all_timestamps(), start_ts, ict, table)
    end: int | None = ending_version
    if ending_timestamp is not None:
        end_ts = to_epoch_ms(ending_timestamp)
        end = _last_at_or_before(all_timestamps(), end_ts, ict, table)

    if start > latest:
        raise StartVersionAfterLatestError(
            f"startingVersion {start} is after the latest version {latest}", table=table, version=start
        )
    if start_ts is not None and end_ts is not None and end is not None:
        if start_ts > end_ts:
            raise InvalidChangeRangeError(
                f"startingTimestamp {format_iso(start_ts)} is after endingTimestamp {format_iso(end_ts)}",
                table=table,
            )
        if end == start - 1:  # both timestamps between the same two commits: nothing changed
            return ChangeRange(start, end, latest, end, empty=True)
    if end is not None and end < start:
        raise InvalidChangeRangeError(
            f"endingVersion {end} is before startingVersion {start}", table=table, version=end
        )
    return ChangeRange(start, latest if end is None else min(end, latest), latest, end)


def _first_at_or_after(timestamps: Sequence[CommitTimestamp], ts: int, ict: IctConfig, table: str) -> int:
    version = version_at_or_after(timestamps, ts, ict, table=table)
    if version is None:
        last = timestamps[-1]
        raise ChangeTimestampAfterLatestError(
            f"startingTimestamp {format_iso(ts)} is after the latest commit "
            f"(version {last.version} at {last.iso})",
            table=table,
            version=last.version,
        )
    return version


def _last_at_or_before(timestamps: Sequence[CommitTimestamp], ts: int, ict: IctConfig, table: str) -> int:
    last = timestamps[-1]
    if ts > last.timestamp:
        raise ChangeTimestampAfterLatestError(
            f"endingTimestamp {format_iso(ts)} is after the latest commit (version {last.version} at {last.iso})",
            table=table,
            version=last.version,
        )
    try:
        return version_at_or_before(timestamps, ts, ict, table=table)
    except TimestampOutOfRangeError as exc:
        raise ChangeTimestampBeforeEarliestError(
            f"endingTimestamp: {exc.message}", table=table, version=exc.version
        ) from None
