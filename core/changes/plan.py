"""Planning a change-feed read: everything that can fail is checked before any row is read.

As delta-spark plans a range: the bounds resolve (:mod:`.ranges`), the start and latest states
give the protocols and metaData to check, and every commit of the range is read and validated
whole (its metaData and protocol checked, its In-Commit Timestamp kept) before the first data
file is opened. The plan holds the read schema, each version's ``_commit_timestamp`` and the
decoded actions of the first commits, so that the reading pass decodes nothing twice.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..actions import ActionRun, Where, iter_values, read_actions
from ..errors import (
    ChangeDataNotEnabledError,
    ChangeVersionNotFoundError,
    CorruptLogError,
    VersionNotFoundError,
)
from ..features import check_readable, check_schema
from ..log import LogListing, LogSegment, build_segment, check_commit, commit_name
from ..models import Metadata, Protocol, model_of
from ..readahead import CommitReadAhead
from ..replay import replay_config
from ..timestamps import CommitTime, IctConfig, resolve_timestamps
from .ranges import ChangeRange, TimestampLike, resolve_range
from .read_schema import (
    ReadSchema,
    check_change_protocol,
    check_schema_readable,
    is_cdf_enabled,
    uses_column_mapping,
)

if TYPE_CHECKING:
    from ..table import DeltaTable

#: delta-spark monotonizes file times from this many versions before the start (POTENTIALLY_UNMONOTONIZED_TIMESTAMPS)
MONOTONIZATION_LOOKBACK = 100
#: commits (by file size) whose validated actions the checking pass keeps for the reading pass, so
#: that each is fetched and decoded once; decoded actions take a few times their file's size
COMMIT_CACHE_BYTES = 16 * 1024 * 1024
#: commit files of the range are read ahead on this many threads (object stores are slow)
FETCH_THREADS = 8


@dataclass(frozen=True)
class PlannedVersion:
    """A version of the range and its resolved ``_commit_timestamp`` (epoch milliseconds)."""

    version: int
    timestamp_ms: int


@dataclass
class Plan:
    """A checked range: what to read, with which schema, and what the checking pass decoded."""

    range: ChangeRange
    read: ReadSchema
    versions: list[PlannedVersion]
    #: the validated actions of the first versions, kept from the checking pass for the reading pass
    decoded: dict[int, list[tuple[str, Any]]] = field(default_factory=dict)

    def take_actions(self, table: DeltaTable, version: int) -> list[tuple[str, Any]]:
        """``version``'s validated actions: those the checking pass kept (once), else read again."""
        actions = self.decoded.pop(version, None)
        if actions is None:
            data = _read_commit_bytes(table, version)
            actions = _pairs(_decode_commit(table, version, data))
        return actions


def plan_changes(
    table: DeltaTable,
    starting_version: int | None,
    starting_timestamp: TimestampLike | None,
    ending_version: int | None,
    ending_timestamp: TimestampLike | None,
) -> Plan:
    """The checked plan of a read between two bounds; raises every range, feature and schema error."""
    # where every listing reads the whole folder anyway, the plan lists it once
    whole_log = table.listing(0) if table.storage.lists_whole_folder else None
    latest_config = _config_at(table, None, whole_log)
    latest = latest_config.version
    ict = IctConfig.from_configuration(latest_config.metadata.configuration)
    rng = resolve_range(
        table=table.uri,
        latest=latest,
        timestamps=lambda: table.commit_timestamps(ict=ict),
        ict=ict,
        starting_version=starting_version,
        starting_timestamp=starting_timestamp,
        ending_version=ending_version,
        ending_timestamp=ending_timestamp,
    )
    if rng.empty:
        read = ReadSchema(latest_config.metadata, latest)
        return Plan(rng, read, [])

    lookback = max(rng.start - MONOTONIZATION_LOOKBACK, 0)
    # the start state is built first so that its listing can serve below; an error building it
    # is raised only after the range check, as if it had been built after
    start_config: _Config | None = latest_config
    start_error: Exception | None = None
    if rng.start != latest:
        try:
            start_config = _config_at(table, rng.start, whole_log)
        except Exception as exc:
            start_config, start_error = None, exc
    listing = whole_log or _listing_from(table, (latest_config, start_config), lookback)
    for v in range(rng.start, rng.end + 1):
        if v not in listing.commits:
            raise ChangeVersionNotFoundError(
                f"commit {v} is not in the log (cleaned up?); the change feed of "
                f"versions {rng.start}-{rng.end} cannot be read",
                table=table.uri,
                version=v,
            )
    if isinstance(start_error, VersionNotFoundError):
        raise ChangeVersionNotFoundError(
            f"the table state at the starting version cannot be rebuilt: {start_error.message}",
            table=table.uri,
            version=rng.start,
        ) from start_error
    if start_error is not None:
        raise start_error
    assert start_config is not None
    start_metadata = start_config.metadata
    if not is_cdf_enabled(start_metadata):
        raise _not_enabled(table, rng.start, rng)
    check_readable(start_config.protocol, table=table.uri, version=rng.start)
    check_readable(latest_config.protocol, table=table.uri, version=latest)

    scan = _scan_commits(table, rng, start_metadata)
    end_metadata = scan.metadata[-1][1] if scan.metadata else start_metadata
    mapped = (
        uses_column_mapping(latest_config.metadata)
        or uses_column_mapping(start_metadata)
        or (
            rng.requested_end is not None
            and rng.requested_end <= latest
            and uses_column_mapping(end_metadata)
        )
    )
    # delta-spark's default: the latest schema, but the end version's for column-mapped tables
    read = ReadSchema(end_metadata, rng.end) if mapped else ReadSchema(latest_config.metadata, latest)

    changes: list[tuple[int, Metadata | Protocol]] = sorted(
        [*scan.metadata, *scan.protocols], key=lambda pair: pair[0]
    )
    for v, action in changes:
        if isinstance(action, Protocol):
            check_change_protocol(action, v, table=table.uri)
        elif not is_cdf_enabled(action):
            raise _not_enabled(table, v, rng)
    # every protocol readable: a type of a schema that no supported feature brings is a corrupt
    # metaData (refused naming its file and line), before any schema is compared
    for metadata in (latest_config.metadata, start_metadata, *(m for _, m in scan.metadata)):
        check_schema(metadata)
    for v, metadata in scan.metadata:
        if v > rng.start:  # a metaData at the start version is what the start version reads with
            check_schema_readable(
                read, metadata, v, schema_change=True, table=table.uri, start=rng.start, end=rng.end
            )
    check_schema_readable(
        read, start_metadata, rng.start, schema_change=False, table=table.uri, start=rng.start, end=rng.end
    )

    versions = _timestamps(table, rng, lookback, listing.commits, ict, scan.in_commit_timestamps)
    return Plan(rng, read, versions, scan.decoded)


@dataclass(frozen=True)
class _Config:
    """The metaData and protocol at one version, and the log segment they were read from."""

    segment: LogSegment
    metadata: Metadata
    protocol: Protocol

    @property
    def version(self) -> int:
        return self.segment.version


def _config_at(table: DeltaTable, version: int | None, whole_log: LogListing | None) -> _Config:
    segment = build_segment(table.storage, version, whole_log=whole_log)
    metadata, protocol = replay_config(table.storage, segment)
    return _Config(segment, metadata, protocol)


def _listing_from(table: DeltaTable, configs: Iterable[_Config | None], version: int) -> LogListing:
    """The log files of ``version`` on: the listing a state was built from when it reaches back
    that far (it lists from its checkpoint, or from version 0 without one), else a new listing.

    Every listing costs a round trip per thousand files, and the states were just listed.
    """
    for config in configs:
        if config is None:
            continue
        segment = config.segment
        if segment.checkpoint is None or segment.checkpoint.version <= version:
            return segment.listing
    return table.listing(version)


def _not_enabled(table: DeltaTable, version: int, rng: ChangeRange) -> ChangeDataNotEnabledError:
    return ChangeDataNotEnabledError(
        f"change data was not recorded for version {version} (delta.enableChangeDataFeed is not true), "
        f"so the change feed of versions {rng.start}-{rng.end} cannot be read",
        table=table.uri,
        version=version,
    )


@dataclass
class _Scan:
    metadata: list[tuple[int, Metadata]] = field(default_factory=list)
    protocols: list[tuple[int, Protocol]] = field(default_factory=list)
    in_commit_timestamps: dict[int, int | None] = field(default_factory=dict)
    decoded: dict[int, list[tuple[str, Any]]] = field(default_factory=dict)


def _read_commit_bytes(table: DeltaTable, version: int) -> bytes:
    path = table.storage.log_file(commit_name(version))
    try:
        return table.storage.read_bytes(path)
    except FileNotFoundError:
        raise ChangeVersionNotFoundError(
            f"commit {version} does not exist", table=table.uri, version=version, file=path
        ) from None


def _decode_commit(table: DeltaTable, version: int, data: bytes) -> list[ActionRun]:
    """Every action of one commit, validated by the log boundary."""
    file = table.storage.log_file(commit_name(version))
    return list(read_actions(data, table=table.uri, file=file, version=version))


def _pairs(runs: Iterable[ActionRun]) -> list[tuple[str, Any]]:
    return [(name, value) for _, name, value in iter_values(runs)]


def _scan_commits(table: DeltaTable, rng: ChangeRange, start_metadata: Metadata) -> _Scan:
    """Every version of the range, validated whole before any row is read (as delta-spark reads
    every action of a range while planning it): its metaData, protocol and In-Commit Timestamp,
    each commit checked as a whole against the metaData in force there (:func:`check_commit`).

    The actions of the first versions (up to :data:`COMMIT_CACHE_BYTES` of commit files) are
    kept for the reading pass, which then decodes nothing twice.
    """
    scan = _Scan()
    cached = 0
    in_force = start_metadata
    commits = CommitReadAhead(table.storage, threads=FETCH_THREADS).ordered(
        range(rng.start, rng.end + 1), missing=ChangeVersionNotFoundError
    )
    for v, data in commits:
        runs = _decode_commit(table, v, data)
        info: dict[str, Any] | None = None
        info_line: int | None = None
        for run in runs:
            if run.name in ("metaData", "protocol"):
                for line, value in enumerate(run.values, start=run.line):
                    action = model_of(run.name, value)
                    if isinstance(action, Metadata):
                        action.located(Where(table.uri, table.storage.log_file(commit_name(v)), v), line)
                        scan.metadata.append((v, action))
                        in_force = action
                    elif isinstance(action, Protocol):
                        scan.protocols.append((v, action))
            elif run.name == "commitInfo" and info is None:
                info, info_line = run.values[0], run.line
        check_commit(
            Where(table.uri, table.storage.log_file(commit_name(v)), v),
            actions=sum(map(len, runs)),
            metadata=in_force,
            commit_info=info,
            commit_info_line=info_line,
        )
        in_commit_timestamp = info.get("inCommitTimestamp") if info is not None else None
        scan.in_commit_timestamps[v] = in_commit_timestamp
        if cached + len(data) <= COMMIT_CACHE_BYTES:
            scan.decoded[v] = _pairs(runs)
            cached += len(data)
    return scan


def _timestamps(
    table: DeltaTable,
    rng: ChangeRange,
    lookback: int,
    commits: Mapping[int, Any],
    ict: IctConfig,
    in_commit_timestamps: Mapping[int, int | None],
) -> list[PlannedVersion]:
    """``_commit_timestamp`` per version: ICT where in force, else file times made monotonic.

    Like delta-spark, file times are made monotonic over the listed commits from
    ``start - 100`` on, not over the whole log.
    """
    file_times = [
        CommitTime(v, commits[v].modification_time)
        for v in sorted(commits)
        if lookback <= v <= rng.end and not ict.applies_to(v)
    ]
    resolved = {t.version: t.timestamp for t in resolve_timestamps(file_times, IctConfig())}
    out = []
    for v in range(rng.start, rng.end + 1):
        if ict.applies_to(v):
            value = in_commit_timestamps.get(v)
            if value is None:
                raise CorruptLogError(
                    "In-Commit Timestamps are enabled for this version but its commitInfo has no "
                    "inCommitTimestamp",
                    table=table.uri,
                    version=v,
                )
            out.append(PlannedVersion(v, value))
        else:
            out.append(PlannedVersion(v, resolved[v]))
    return out
