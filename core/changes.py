"""The change data feed (CDF): row-level changes between two versions, as delta-spark reads them.

Per version, from that version's own commit file (never a compacted log file):

* with ``cdc`` actions, the rows are those of its change data files, typed by their ``_change_type``;
* otherwise every ``add``/``remove`` with dataChange=true gives inserts/deletes of the rows its own
  deletion vector leaves alive, except that an ``add`` and a ``remove`` of one path are a DV update
  whose rows are those whose deletion bit flipped; a MERGE that reports no changed row gives none.

``read_changes`` resolves and checks the whole range first (so that a bad range fails before any row
is produced, as in delta-spark), then the :class:`ChangeFeed` streams one data file at a time.

>>> feed = read_changes(open_table("/data/events"), starting_version=10, ending_version=20)
>>> for batch in feed: ...          # pa.RecordBatch, each from one version, in version order
"""

from __future__ import annotations

import os
import struct
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from . import deletion_vectors, features
from .actions import (
    ActionRun,
    PartitionKeySets,
    Where,
    check_actions,
    iter_values,
    missing_partition_column,
    read_actions,
)
from .change_ranges import (
    ChangeRange,
    ReadSchema,
    TimestampLike,
    check_schema_readable,
    is_cdf_enabled,
    resolve_range,
    uses_column_mapping,
)
from .errors import (
    ChangeDataNotEnabledError,
    ChangeVersionNotFoundError,
    CorruptLogError,
    InvalidArgumentError,
    SchemaError,
    VersionNotFoundError,
)
from .log import LogListing, LogSegment, build_segment, check_commit, commit_name
from .models import Metadata, Protocol, model_of
from .partitions import parse_partition_value, partition_value_of
from .read import BATCH_SIZE as READ_BATCH_ROWS
from .read import AppendColumns, open_parquet, read_data_file, read_error
from .replay import replay_config
from .schema import (
    ColumnMappingMode,
    PrimitiveType,
    StructField,
    StructType,
    column_mapping_mode,
    to_arrow_field,
)
from .timestamps import CommitTime, IctConfig, resolve_timestamps

if TYPE_CHECKING:
    from .table import DeltaTable

CHANGE_TYPE = "_change_type"
COMMIT_VERSION = "_commit_version"
COMMIT_TIMESTAMP = "_commit_timestamp"
CDF_COLUMNS = (CHANGE_TYPE, COMMIT_VERSION, COMMIT_TIMESTAMP)
TIMESTAMP_TYPE = pa.timestamp("us", tz="UTC")
#: delta-spark monotonizes file times from this many versions before the start (POTENTIALLY_UNMONOTONIZED_TIMESTAMPS)
MONOTONIZATION_LOOKBACK = 100
#: commits (by file size) whose validated actions the checking pass keeps for the reading pass, so
#: that each is fetched and decoded once; decoded actions take a few times their file's size
COMMIT_CACHE_BYTES = 16 * 1024 * 1024
#: small data files are read ahead on threads (decoding releases the GIL), in groups of at most
#: this many files and bytes, at most this many groups ahead, on one thread per core (at least
#: two, at most eight). Measured on 2 cores: 4 threads of 4-file groups spent a fifth of the
#: time switching threads for the GIL; 2 threads of 32-file groups read the bench table 25% faster
#: for the same peak memory (bench/bench_changes.py).
PREFETCH_GROUP_FILES = 32
PREFETCH_FIRST_GROUP_FILES = 8
PREFETCH_MAX_BYTES = 16 * 1024 * 1024
PREFETCH_GROUPS = 2
PREFETCH_THREADS = max(2, min(8, os.cpu_count() or 2))
#: commit files are fetched this many at a time, on this many threads
FETCH_CHUNK = 64
FETCH_THREADS = 8
_MERGE_METRICS = ("numTargetRowsInserted", "numTargetRowsUpdated", "numTargetRowsDeleted")
_STRING = PrimitiveType(name="string")

PartitionFilter = Mapping[str, Any] | Callable[[dict[str, Any]], bool]


@dataclass
class _Version:
    version: int
    timestamp_ms: int


@dataclass
class _Plan:
    range: ChangeRange
    read: ReadSchema
    versions: list[_Version]
    #: the validated actions of the first versions, kept from the checking pass for the reading pass
    decoded: dict[int, list[tuple[str, Any]]] = field(default_factory=dict)


def read_changes(
    table: DeltaTable,
    *,
    starting_version: int | None = None,
    starting_timestamp: TimestampLike | None = None,
    ending_version: int | None = None,
    ending_timestamp: TimestampLike | None = None,
    columns: Sequence[str] | None = None,
    partition_filter: PartitionFilter | None = None,
    batch_size: int = 65_536,
    progress: Callable[[int, int], None] | None = None,
) -> ChangeFeed:
    """The change data feed of ``table`` between two bounds (both inclusive).

    A bound is a version or a timestamp (ISO-8601 text, epoch milliseconds or a datetime): the start
    resolves to the first commit at or after it, the end to the last commit at or before it; no end
    means the latest version. ``columns`` selects table columns (the three CDF columns always
    follow). ``partition_filter`` keeps files by partition value before any is opened: a mapping
    ``{column: value or list of values}`` or a callable given ``{column: value}`` for each file.
    Range, feature and schema errors are raised here, before any row is read. ``progress(done,
    total)`` is told, while the feed is iterated, how many of its versions are read.
    """
    if batch_size <= 0:
        raise InvalidArgumentError(f"batch_size must be > 0, got {batch_size}", table=table.uri)
    plan = _plan(table, starting_version, starting_timestamp, ending_version, ending_timestamp)
    feed = ChangeFeed(table, plan, columns, partition_filter, batch_size)
    feed.progress = progress
    return feed


@dataclass(frozen=True)
class VersionActions:
    """One version's actions from wherever they were read (e.g. a Kafka mirror of the log).

    ``actions`` are ``(type, body)`` pairs in commit order with Delta's field names, e.g.
    ``("add", {"path": ..., "dataChange": true, ...})``; ``timestamp_ms`` is the resolved commit
    timestamp, which becomes ``_commit_timestamp``.
    """

    version: int
    timestamp_ms: int
    actions: Iterable[tuple[str, Mapping[str, Any]]]


def changes_from_actions(
    table: DeltaTable,
    metadata: Metadata,
    metadata_version: int,
    versions: Iterable[VersionActions],
    *,
    columns: Sequence[str] | None = None,
    partition_filter: PartitionFilter | None = None,
    batch_size: int = 65_536,
) -> ChangeFeed:
    """The change rows of versions whose actions the caller already has, read with ``metadata``'s schema.

    The same per-version rules as :func:`read_changes`, without reading the log: the caller vouches
    for the range (change data feed enabled, schema changes readable, reader features supported;
    :func:`check_change_metadata` checks one metaData). ``versions`` is consumed once, lazily, so
    the returned feed can be iterated once only. Data files are read from ``table``'s storage.
    """
    if batch_size <= 0:
        raise InvalidArgumentError(f"batch_size must be > 0, got {batch_size}", table=table.uri)
    rng = ChangeRange(
        start=metadata_version, end=metadata_version, latest=metadata_version, requested_end=None
    )
    plan = _Plan(rng, ReadSchema(metadata, metadata_version), [])
    return _GivenActionsFeed(table, plan, columns, partition_filter, batch_size, versions)


def check_change_metadata(
    read: ReadSchema, metadata: Metadata, version: int, *, table: str, start: int
) -> None:
    """Raise unless rows of ``version``, written under ``metadata``, belong in a feed read with ``read``.

    The checks :func:`read_changes` makes on each metaData of its range: the change data feed must be
    on (DELTA_MISSING_CHANGE_DATA) and the schema read-compatible with the read schema
    (DELTA_CHANGE_DATA_FEED_INCOMPATIBLE_SCHEMA_CHANGE).
    """
    if not is_cdf_enabled(metadata):
        raise ChangeDataNotEnabledError(
            f"change data was not recorded for version {version} (delta.enableChangeDataFeed is not "
            "true), so no change rows can be read from there on",
            table=table,
            version=version,
        )
    check_schema_readable(read, metadata, version, schema_change=True, table=table, start=start, end=version)


# --- planning: range, features, schema, timestamps ---------------------------------------------


def _plan(
    table: DeltaTable,
    starting_version: int | None,
    starting_timestamp: TimestampLike | None,
    ending_version: int | None,
    ending_timestamp: TimestampLike | None,
) -> _Plan:
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
        return _Plan(rng, read, [])

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
    features.check_readable(start_config.protocol, table=table.uri, version=rng.start)
    features.check_readable(latest_config.protocol, table=table.uri, version=latest)

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
            features.check_readable(action, table=table.uri, version=v)
        elif not is_cdf_enabled(action):
            raise _not_enabled(table, v, rng)
    # every protocol readable: a type of a schema that no supported feature brings is a corrupt
    # metaData (refused naming its file and line), before any schema is compared
    for metadata in (latest_config.metadata, start_metadata, *(m for _, m in scan.metadata)):
        features.check_schema(metadata)
    for v, metadata in scan.metadata:
        if v > rng.start:  # a metaData at the start version is what the start version reads with
            check_schema_readable(
                read, metadata, v, schema_change=True, table=table.uri, start=rng.start, end=rng.end
            )
    check_schema_readable(
        read, start_metadata, rng.start, schema_change=False, table=table.uri, start=rng.start, end=rng.end
    )

    versions = _timestamps(table, rng, lookback, listing.commits, ict, scan.in_commit_timestamps)
    return _Plan(rng, read, versions, scan.decoded)


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
    for v, data in _fetch_commits(table, range(rng.start, rng.end + 1)):
        runs = _decode_commit(table, v, data)
        keys = PartitionKeySets()
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
            else:
                keys.add(run)
        check_commit(
            Where(table.uri, table.storage.log_file(commit_name(v)), v),
            actions=sum(map(len, runs)),
            keys=keys,
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


def _fetch_commits(table: DeltaTable, versions: range) -> Iterator[tuple[int, bytes]]:
    """(version, commit bytes) in order, fetched a chunk at a time on threads (object stores are slow).

    A local disk answers faster than a thread hand-off costs, so local commits are read in turn.
    """
    if table.uri.startswith("file://"):
        for v in versions:
            yield v, _read_commit_bytes(table, v)
        return
    with ThreadPoolExecutor(max_workers=FETCH_THREADS, thread_name_prefix="deltamirror-log") as pool:
        for lo in range(versions.start, versions.stop, FETCH_CHUNK):
            chunk = range(lo, min(lo + FETCH_CHUNK, versions.stop))
            yield from zip(chunk, pool.map(partial(_read_commit_bytes, table), chunk), strict=True)


def _timestamps(
    table: DeltaTable,
    rng: ChangeRange,
    lookback: int,
    commits: Mapping[int, Any],
    ict: IctConfig,
    in_commit_timestamps: Mapping[int, int | None],
) -> list[_Version]:
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
            out.append(_Version(v, value))
        else:
            out.append(_Version(v, resolved[v]))
    return out


# --- reading ----------------------------------------------------------------------------------


class ChangeFeed:
    """The rows of a change-feed read: an iterable of record batches in version order.

    Each batch holds rows of one version only. Iterating reads one data file at a time; the feed
    can be iterated more than once (each pass reads the files again).
    """

    #: told (versions read, versions in the feed) as batches go out; see ``read_changes``
    progress: Callable[[int, int], None] | None = None

    def __init__(
        self,
        table: DeltaTable,
        plan: _Plan,
        columns: Sequence[str] | None,
        partition_filter: PartitionFilter | None,
        batch_size: int,
    ) -> None:
        self.table = table
        self._plan = plan
        self._batch_size = batch_size
        metadata = plan.read.metadata
        self._table_schema: StructType = metadata.table_schema
        self._mode: ColumnMappingMode = column_mapping_mode(metadata.configuration)
        self._partition_columns = list(metadata.partition_columns)
        self._partition_keys = metadata.partition_keys
        self._data_columns = self._select(columns)
        # read batches come in table order: asked for in that order, they need no reordering
        chosen = set(self._data_columns)
        self._in_table_order = self._data_columns == [c for c in self._table_schema.names if c in chosen]
        self._data_positions: dict[tuple[str, ...], list[int]] = {}
        # columns=None reads every column without building a projected schema per file
        every = self._data_columns == list(self._table_schema.names)
        self._columns_arg: list[str] | None = None if every else self._data_columns
        self._cdc_schema = StructType(
            fields=(*self._table_schema.fields, StructField(name=CHANGE_TYPE, type=_STRING))
        )
        self._cdc_columns_arg = None if every else [*self._data_columns, CHANGE_TYPE]
        self._filter = _FileFilter(
            partition_filter, self._table_schema, self._partition_columns, self._mode, table.uri
        )
        data_fields = [to_arrow_field(self._table_schema.field(c)) for c in self._data_columns]
        self.schema = pa.schema(
            [
                *data_fields,
                pa.field(CHANGE_TYPE, pa.string()),
                pa.field(COMMIT_VERSION, pa.int64()),
                pa.field(COMMIT_TIMESTAMP, TIMESTAMP_TYPE),
            ]
        )

    def __repr__(self) -> str:
        return f"ChangeFeed({self.table.uri!r}, versions {self.start_version}-{self.end_version})"

    @property
    def start_version(self) -> int:
        return self._plan.range.start

    @property
    def end_version(self) -> int:
        """The last version read (the latest one when the requested end is beyond it)."""
        return self._plan.range.end

    @property
    def read_schema_version(self) -> int:
        """The version whose schema the rows are read with."""
        return self._plan.read.version

    def _select(self, columns: Sequence[str] | None) -> list[str]:
        if columns is None:
            return list(self._table_schema.names)
        out: list[str] = []
        for name in columns:
            if name in CDF_COLUMNS:
                continue
            try:
                canonical = self._table_schema.field(name).name
            except SchemaError:
                raise InvalidArgumentError(
                    f"no column {name!r} in the table (columns: {', '.join(self._table_schema.names)})",
                    table=self.table.uri,
                ) from None
            if canonical not in out:
                out.append(canonical)
        return out

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        reads = (read for entry in self._plan.versions for read in self._version_reads(entry))
        batches = self._coalesce(_prefetched(reads))
        return batches if self.progress is None else _reporting(batches, self._plan.versions, self.progress)

    def to_arrow(self) -> pa.Table:
        """The whole feed in memory (small ranges and tests; iterate for anything large)."""
        return pa.Table.from_batches(list(self), schema=self.schema)

    def _coalesce(self, parts: Iterator[tuple[int, Iterable[pa.RecordBatch]]]) -> Iterator[pa.RecordBatch]:
        """Batches of up to ``batch_size`` rows, each from one version."""
        pending: list[pa.RecordBatch] = []
        rows = 0
        current: int | None = None
        for version, batches in parts:
            if version != current and rows:
                yield _concat(pending)
                pending, rows = [], 0
            current = version
            for batch in batches:
                while batch.num_rows:
                    take = min(batch.num_rows, self._batch_size - rows)
                    pending.append(batch.slice(0, take))
                    rows += take
                    batch = batch.slice(take)
                    if rows == self._batch_size:
                        yield _concat(pending)
                        pending, rows = [], 0
        if rows:
            yield _concat(pending)

    # --- one version ---

    def _version_reads(self, entry: _Version) -> Iterator[_Read]:
        """The file reads of one version, from its own commit file."""
        actions = self._plan.decoded.pop(entry.version, None)
        if actions is None:
            data = _read_commit_bytes(self.table, entry.version)
            actions = _pairs(_decode_commit(self.table, entry.version, data))
        return self._reads_of(entry.version, entry.timestamp_ms, actions)

    def _reads_of(
        self, version: int, timestamp_ms: int, actions: Iterable[tuple[str, Mapping[str, Any]]]
    ) -> Iterator[_Read]:
        """The file reads that make up one version's rows, in commit order."""
        cdc: list[Mapping[str, Any]] = []
        adds: dict[str, Mapping[str, Any]] = {}
        removes: dict[str, Mapping[str, Any]] = {}
        commit_info: Mapping[str, Any] | None = None
        for name, body in actions:
            if name == "cdc":
                cdc.append(body)
            elif name == "add" and body.get("dataChange", True):
                adds[body["path"]] = body
            elif name == "remove" and body.get("dataChange", True):
                removes[body["path"]] = body
            elif name == "commitInfo" and commit_info is None:
                commit_info = body
        meta = _Meta(version, timestamp_ms * 1000)
        if cdc:
            for action in cdc:
                if self._filter.keeps(action, version):
                    yield _Read(version, action.get("size"), partial(self._read_cdc_file, action, meta))
            return
        if commit_info is not None and _is_noop_merge(commit_info):
            return
        for path, add in adds.items():
            remove = removes.get(path)
            if remove is None:
                if self._filter.keeps(add, version):
                    dv = add.get("deletionVector")
                    yield _Read(
                        version, add.get("size"), partial(self._read_file, add, "insert", meta, dv=dv)
                    )
            else:
                self._check_dv_pair(add, remove, meta)
                if self._filter.keeps(add, version):
                    yield _Read(version, add.get("size"), partial(self._read_dv_update, add, remove, meta))
        for path, remove in removes.items():
            if path not in adds and self._filter.keeps(remove, version):
                dv = remove.get("deletionVector")
                yield _Read(
                    version, remove.get("size"), partial(self._read_file, remove, "delete", meta, dv=dv)
                )

    def _check_dv_pair(self, add: Mapping[str, Any], remove: Mapping[str, Any], meta: _Meta) -> None:
        if remove.get("deletionVector") is None and add.get("deletionVector") is None:
            raise CorruptLogError(
                f"file {add['path']!r} is both removed and added in one version, neither with a "
                "deletion vector; delta-spark refuses such a change feed too",
                table=self.table.uri,
                version=meta.version,
            )

    def _read_dv_update(
        self, add: Mapping[str, Any], remove: Mapping[str, Any], meta: _Meta
    ) -> Iterator[pa.RecordBatch]:
        """Rows whose deletion bit flipped between the removed and the added DV of one file."""
        path = add["path"]
        remove_dv, add_dv = remove.get("deletionVector"), add.get("deletionVector")
        before = self._deleted_rows(remove_dv, path)
        after = self._deleted_rows(add_dv, path)
        newly_deleted = _difference(after, before)
        undeleted = _difference(before, after)
        if len(newly_deleted):
            yield from self._read_file(remove, "delete", meta, only_rows=newly_deleted, partition_from=add)
        if len(undeleted):
            yield from self._read_file(add, "insert", meta, only_rows=undeleted)

    def _deleted_rows(self, descriptor: Mapping[str, Any] | None, path: str) -> pa.UInt64Array:
        if descriptor is None:
            return pa.array([], pa.uint64())
        return deletion_vectors.read_deleted_rows(
            self.table.storage, descriptor, table=self.table.uri, data_file=path
        )

    def _read_file(
        self,
        action: Mapping[str, Any],
        change_type: str,
        meta: _Meta,
        *,
        dv: Mapping[str, Any] | None = None,
        only_rows: pa.UInt64Array | None = None,
        partition_from: Mapping[str, Any] | None = None,
    ) -> Iterator[pa.RecordBatch]:
        partition_values = self._partition_values(partition_from or action, meta.version)
        append = None
        if self._in_table_order:  # the CDF columns are added in the same batch

            def cdf_columns(n: int) -> tuple[pa.Array, ...]:
                return _repeated_string(change_type, n), *meta.columns(n)

            append = AppendColumns(self.schema, cdf_columns)
        batches = read_data_file(
            self.table.storage,
            action["path"],
            schema=self._table_schema,
            partition_columns=self._partition_columns,
            column_mapping=self._mode,
            partition_values=partition_values,
            deletion_vector=dv,
            columns=self._columns_arg,
            only_rows=only_rows,
            table=self.table.uri,
            use_threads=not _prefetchable(action),
            append=append,
        )
        if append is not None:
            yield from batches
            return
        for batch in batches:
            yield self._finish(batch, _repeated_string(change_type, batch.num_rows), meta)

    def _read_cdc_file(self, action: Mapping[str, Any], meta: _Meta) -> Iterator[pa.RecordBatch]:
        """A change data file: the data columns plus its physical ``_change_type`` column."""
        partition_values = self._partition_values(action, meta.version)
        path = action["path"]
        append = None
        if self._mode == "id":  # _change_type has no field id: read it beside the data columns
            cursor = types = _ColumnCursor(self.table, path, CHANGE_TYPE)
            schema, columns = self._table_schema, self._columns_arg
            if self._in_table_order:

                def cdf_columns(n: int) -> tuple[pa.Array, ...]:
                    return cursor.take(n), *meta.columns(n)

                append = AppendColumns(self.schema, cdf_columns)
        else:
            types = None
            schema, columns = self._cdc_schema, self._cdc_columns_arg
            if self._in_table_order:  # _change_type is the last column read

                def cdf_columns(n: int) -> tuple[pa.Array, ...]:
                    return meta.columns(n)

                append = AppendColumns(self.schema, cdf_columns)
        change_type_at = len(self._data_columns)
        try:
            for batch in read_data_file(
                self.table.storage,
                path,
                schema=schema,
                partition_columns=self._partition_columns,
                column_mapping=self._mode,
                partition_values=partition_values,
                columns=columns,
                table=self.table.uri,
                use_threads=not _prefetchable(action),
                append=append,
                kind="change data file",
            ):
                if append is not None:
                    change_types = batch.column(change_type_at)
                elif types is None:  # _finish keeps the data columns only
                    change_types = batch.column(batch.num_columns - 1)
                else:
                    change_types = types.take(batch.num_rows)
                if change_types.null_count:
                    raise CorruptLogError(
                        "change data file has rows without a _change_type (missing column?)",
                        table=self.table.uri,
                        version=meta.version,
                        file=path,
                    )
                yield batch if append is not None else self._finish(batch, change_types, meta)
        finally:
            if types is not None:
                types.close()

    def _finish(self, batch: pa.RecordBatch, change_types: pa.Array, meta: _Meta) -> pa.RecordBatch:
        n = batch.num_rows
        names = tuple(batch.schema.names)
        positions = self._data_positions.get(names)
        if positions is None:  # per batch layout (data files, change data files): worked out once
            positions = self._data_positions[names] = [names.index(c) for c in self._data_columns]
        columns = batch.columns
        data = [columns[i] for i in positions]
        return pa.RecordBatch.from_arrays(
            [
                *data,
                change_types,
                _repeated_int64(meta.version, n, pa.int64()),
                _repeated_int64(meta.timestamp_us, n, TIMESTAMP_TYPE),
            ],
            schema=self.schema,
        )

    def _partition_values(self, action: Mapping[str, Any], version: int) -> Mapping[str, str | None]:
        """The file's partition values, naming every partition column (a missing one is not null)."""
        values = action.get("partitionValues")
        if values is None:
            if self._partition_columns:
                raise CorruptLogError(
                    f"file action for {action.get('path')!r} has no partitionValues in a partitioned table",
                    table=self.table.uri,
                    version=version,
                )
            return {}
        missing = missing_partition_column(values, self._partition_keys)
        if missing is not None:
            raise CorruptLogError(
                f"file action for {action.get('path')!r}: partitionValues lacks partition column {missing!r}",
                table=self.table.uri,
                version=version,
                file=self.table.storage.log_file(commit_name(version)),
            )
        return dict(values)


class _GivenActionsFeed(ChangeFeed):
    def __init__(
        self,
        table: DeltaTable,
        plan: _Plan,
        columns: Sequence[str] | None,
        partition_filter: PartitionFilter | None,
        batch_size: int,
        versions: Iterable[VersionActions],
    ) -> None:
        super().__init__(table, plan, columns, partition_filter, batch_size)
        self._versions = iter(versions)

    def __repr__(self) -> str:
        return f"changes_from_actions({self.table.uri!r}, read with the schema of version {self.read_schema_version})"

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        reads = (
            read
            for v in self._versions
            for read in self._reads_of(
                v.version, v.timestamp_ms, check_actions(v.actions, Where(self.table.uri, None, v.version))
            )
        )
        return self._coalesce(_prefetched(reads))


def _reporting(
    batches: Iterator[pa.RecordBatch], versions: Sequence[_Version], progress: Callable[[int, int], None]
) -> Iterator[pa.RecordBatch]:
    """``batches`` as they are, telling ``progress`` how many versions are done.

    Every batch holds one version's rows, in version order: a batch of version v means the
    versions before it are read.
    """
    position = {entry.version: i for i, entry in enumerate(versions)}
    progress(0, len(versions))
    for batch in batches:
        progress(position[batch.column(COMMIT_VERSION)[0].as_py()], len(versions))
        yield batch
    progress(len(versions), len(versions))


@dataclass(frozen=True)
class _Read:
    """One data file's contribution to a version: its size (bytes, if the log says) and the read."""

    version: int
    size: int | None
    read: Callable[[], Iterator[pa.RecordBatch]]


def _prefetched(reads: Iterator[_Read]) -> Iterator[tuple[int, Iterable[pa.RecordBatch]]]:
    """(version, batches) per read, in order; small files are read ahead on worker threads.

    Decoding parquet releases the GIL, so reading the next small files while the caller consumes
    the current one uses the other cores. Small files go to the workers in groups (a hand-off per
    file costs about what reading a small file does) of at most PREFETCH_GROUP_FILES files and
    PREFETCH_MAX_BYTES, at most PREFETCH_GROUPS groups ahead, so memory stays bounded; a larger
    file, or one of unknown size, is streamed in place once the reads before it are handed out.
    """
    window: deque[Future[_Drained]] = deque()
    group: list[_Read] = []
    group_bytes = 0
    # the first groups are small, so the caller gets rows while later groups are decoded
    group_files = PREFETCH_FIRST_GROUP_FILES
    pool = ThreadPoolExecutor(max_workers=PREFETCH_THREADS, thread_name_prefix="deltamirror-cdf")
    try:
        for item in reads:
            if item.size is None or item.size > PREFETCH_MAX_BYTES:
                if group:
                    window.append(pool.submit(_drain, group))
                    group, group_bytes = [], 0
                while window:
                    yield from _handed(window.popleft().result())
                yield item.version, item.read()
                continue
            if group and group_bytes + item.size > PREFETCH_MAX_BYTES:
                window.append(pool.submit(_drain, group))
                group, group_bytes = [], 0
            group.append(item)
            group_bytes += item.size
            if len(group) >= group_files:
                window.append(pool.submit(_drain, group))
                group, group_bytes = [], 0
                group_files = min(group_files * 2, PREFETCH_GROUP_FILES)
            while len(window) > PREFETCH_GROUPS:
                yield from _handed(window.popleft().result())
        if group:
            window.append(pool.submit(_drain, group))
        while window:
            yield from _handed(window.popleft().result())
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


_Drained = tuple[list[tuple[int, list[pa.RecordBatch]]], Exception | None]


def _drain(group: list[_Read]) -> _Drained:
    """The group's reads, up to the first that fails (whose error comes after the reads before it)."""
    done = []
    try:
        for item in group:
            try:
                done.append((item.version, list(item.read())))
            except Exception as exc:  # raised on the caller's thread by _handed, in order
                return done, exc
        return done, None
    finally:
        _release_unused_memory()


#: a prefetch thread hands its freed memory back to the OS after this many groups
RELEASE_EVERY_GROUPS = 4
_groups_drained = threading.local()


def _release_unused_memory() -> None:
    """pyarrow's default allocator (mimalloc) keeps a heap per thread and holds on to its freed
    pages, so each prefetch thread would keep the memory of its largest groups; releasing it now
    and then keeps the threads' memory small (every group would cost page faults instead)."""
    drained = getattr(_groups_drained, "count", 0) + 1
    _groups_drained.count = drained
    if drained % RELEASE_EVERY_GROUPS == 0:
        pa.default_memory_pool().release_unused()


def _handed(drained: _Drained) -> Iterator[tuple[int, list[pa.RecordBatch]]]:
    done, error = drained
    yield from done
    if error is not None:
        raise error


def _prefetchable(action: Mapping[str, Any]) -> bool:
    """Small enough to be read ahead whole on a worker thread (which then decodes it alone)."""
    size = action.get("size")
    return size is not None and size <= PREFETCH_MAX_BYTES


@dataclass(frozen=True)
class _Meta:
    version: int
    timestamp_us: int

    def columns(self, n: int) -> tuple[pa.Array, pa.Array]:
        """``_commit_version`` and ``_commit_timestamp`` for ``n`` rows."""
        return _repeated_int64(self.version, n, pa.int64()), _repeated_int64(
            self.timestamp_us, n, TIMESTAMP_TYPE
        )


def _concat(batches: list[pa.RecordBatch]) -> pa.RecordBatch:
    return batches[0] if len(batches) == 1 else pa.concat_batches(batches)


def _difference(left: pa.UInt64Array, right: pa.UInt64Array) -> pa.UInt64Array:
    """Rows in ``left`` but not in ``right`` (both sorted and unique, so the result is too)."""
    if len(right) == 0 or len(left) == 0:
        return left
    return left.filter(pc.invert(pc.is_in(left, value_set=right)))


_INT64 = struct.Struct("=q")  # Arrow buffers hold native-endian values
#: "insert"/"delete" columns long enough for any batch read_data_file yields, sliced per batch
_STRING_RUNS: dict[str, pa.Array] = {}


def _repeated_int64(value: int, n: int, arrow_type: pa.DataType) -> pa.Array:
    """``n`` copies of a 64-bit value (int64, timestamp): straight from bytes, several times faster
    than ``pa.repeat`` for the per-batch ``_commit_version``/``_commit_timestamp`` columns."""
    return pa.Array.from_buffers(arrow_type, n, [None, pa.py_buffer(_INT64.pack(value) * n)])


def _repeated_string(value: str, n: int) -> pa.Array:
    run = _STRING_RUNS.get(value)
    if run is None:
        run = _STRING_RUNS[value] = pa.repeat(pa.scalar(value, pa.string()), READ_BATCH_ROWS)
    return run.slice(0, n) if n <= len(run) else pa.repeat(pa.scalar(value, pa.string()), n)


def _is_noop_merge(commit_info: Mapping[str, Any]) -> bool:
    """delta-spark's ``shouldSkipFileActionsInCommit``: a MERGE reporting 0 rows changed."""
    if commit_info.get("operation") != "MERGE":
        return False
    metrics = commit_info.get("operationMetrics") or {}
    return all(str(metrics.get(name)) == "0" for name in _MERGE_METRICS)


class _ColumnCursor:
    """Consecutive slices of one physical column of a parquet file, read lazily batch by batch."""

    def __init__(self, table: DeltaTable, path: str, column: str) -> None:
        self._file = open_parquet(table.storage, path, table=table.uri, kind="change data file")
        if column not in self._file.schema_arrow.names:
            self._file.close()
            raise CorruptLogError(f"change data file has no {column} column", table=table.uri, file=path)
        self._batches = self._file.iter_batches(columns=[column])
        self._current: pa.Array = pa.array([], pa.string())
        self._table = table.uri
        self._path = path

    def take(self, n: int) -> pa.Array:
        parts = []
        while n:
            if len(self._current) == 0:
                try:
                    self._current = next(self._batches).column(0).cast(pa.string())
                except StopIteration:
                    raise CorruptLogError(
                        "change data file ended early", table=self._table, file=self._path
                    ) from None
                except (OSError, MemoryError, pa.ArrowException) as exc:
                    raise read_error(exc, "change data file", self._table, self._path) from exc
            piece = self._current.slice(0, n)
            parts.append(piece)
            self._current = self._current.slice(len(piece))
            n -= len(piece)
        return pa.concat_arrays(parts) if len(parts) != 1 else parts[0]

    def close(self) -> None:
        self._file.close()


class _FileFilter:
    """Keeps files by their partition values (never opening a file it drops)."""

    def __init__(
        self,
        spec: PartitionFilter | None,
        schema: StructType,
        partition_columns: Sequence[str],
        mode: ColumnMappingMode,
        table: str,
    ) -> None:
        self._spec = spec
        self._mode = mode
        self._table = table
        part_fields = {schema.field(c).name: schema.field(c) for c in partition_columns}
        if spec is None or callable(spec):
            self._fields = list(part_fields.values())
            self._wanted: dict[str, Any] = {}
            return
        self._fields = []
        self._wanted = {}
        for name, value in spec.items():
            try:
                f = schema.field(name)
            except SchemaError:
                raise InvalidArgumentError(
                    f"partition filter names an unknown column {name!r}", table=table
                ) from None
            if f.name not in part_fields:
                raise InvalidArgumentError(
                    f"partition filter column {name!r} is not a partition column "
                    f"(partition columns: {', '.join(part_fields) or 'none'})",
                    table=table,
                )
            self._fields.append(f)
            self._wanted[f.name] = value

    def keeps(self, action: Mapping[str, Any], version: int) -> bool:
        if self._spec is None:
            return True
        raw_values = action.get("partitionValues")
        if raw_values is None:
            raise CorruptLogError(
                f"file action for {action.get('path')!r} has no partitionValues to filter on",
                table=self._table,
                version=version,
            )
        values = {
            f.name: parse_partition_value(
                partition_value_of(raw_values, f, self._mode), f.type, column=f.name, table=self._table
            ).as_py()
            for f in self._fields
        }
        if callable(self._spec):
            return bool(self._spec(values))
        for name, wanted in self._wanted.items():
            if isinstance(wanted, list | tuple | set | frozenset):
                if values[name] not in wanted:
                    return False
            elif values[name] != wanted:
                return False
        return True
