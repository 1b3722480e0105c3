"""The library entry point: open a table, take a snapshot, read its history.

>>> from deltamirror.core import open_table
>>> table = open_table("s3://bucket/events", storage_options={"anon": False})
>>> snap = table.snapshot()                  # latest; or version=N / timestamp="2026-01-01T00:00:00Z"
>>> snap.files.num_rows                      # active files, Arrow (stats read on first use)
>>> for batch in snap.iter_batches(columns=["id"]): ...
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import pyarrow as pa

from . import arguments, features
from .changes import DEFAULT_BATCH_SIZE, ChangeFeed, PartitionFilter, TimestampLike, read_changes
from .changes.ranges import to_epoch_ms
from .errors import (
    CorruptLogError,
    InvalidArgumentError,
    LogGapError,
    TimestampOutOfRangeError,
    VersionNotFoundError,
)
from .file_table import FileTable
from .log import (
    LogListing,
    LogSegment,
    build_segment,
    commit_name,
    count_commit,
    iter_commit_stream,
    list_log,
    read_commit,
)
from .models import CommitInfo, DomainMetadata, Metadata, Protocol, Txn, parse_action
from .replay import TableState, replay, replay_config
from .schema import StructType, column_mapping_mode
from .storage import TableStorage
from .timestamps import (
    CommitTimestamp,
    IctConfig,
    ict_timestamp,
    last_commit_timestamp,
    log_timestamps,
    monotonic_file_times,
    version_at_or_before,
    version_timestamp,
)


@dataclass(frozen=True)
class HistoryEntry:
    """One version as ``deltamirror history`` shows it."""

    version: int
    timestamp: CommitTimestamp
    commit_info: CommitInfo | None
    action_counts: dict[str, int]

    @property
    def operation(self) -> str | None:
        return self.commit_info.operation if self.commit_info else None


class Snapshot:
    """The state of a table at one version. Files are Arrow; reading rows is lazy."""

    def __init__(self, table: DeltaTable, segment: LogSegment, state: TableState, timestamp: CommitTimestamp):
        self.table = table
        self.segment = segment
        self._state = state
        self.timestamp = timestamp

    def __repr__(self) -> str:
        return f"Snapshot({self.table.uri!r}, version={self.version}, files={self.files.num_rows})"

    @property
    def version(self) -> int:
        return self._state.version

    @property
    def metadata(self) -> Metadata:
        return self._state.metadata

    @property
    def protocol(self) -> Protocol:
        return self._state.protocol

    @property
    def files(self) -> FileTable:
        """Active files: one row per (path, deletion vector), columns as a checkpoint's ``add``.

        A :class:`~.file_table.FileTable`: it answers as a ``pyarrow.Table`` does, and reads the
        checkpoint's ``stats`` column the first time it is used (``files.to_table()`` is the
        ``pyarrow.Table`` itself, for what demands one).
        """
        return self._state.files

    @property
    def tombstones(self) -> pa.Table:
        return self._state.tombstones

    @property
    def txns(self) -> dict[str, Txn]:
        """The latest ``txn`` version per appId (streaming writers' idempotency marks)."""
        return self._state.txns

    @property
    def domains(self) -> dict[str, DomainMetadata]:
        return self._state.domains

    @property
    def unknown_actions(self) -> dict[str, int]:
        """Action types in the replayed commits that deltamirror does not know (kept, not applied)."""
        return self._state.unknown_actions

    @property
    def schema(self) -> StructType:
        return self.metadata.table_schema

    @property
    def partition_columns(self) -> list[str]:
        return self.metadata.partition_columns

    @property
    def column_mapping(self) -> str:
        return column_mapping_mode(self.metadata.configuration)

    def check_readable(self) -> None:
        features.check_table(self.protocol, self.metadata, table=self.table.uri, version=self.version)

    def iter_batches(self, columns: Sequence[str] | None = None) -> Iterator[pa.RecordBatch]:
        """The table's rows at this version, in its logical schema, one data file at a time.

        ``columns`` names table columns (exactly, else case-insensitively); each is read once, the
        batches holding them in the table's order. A name the table lacks is an InvalidArgumentError,
        before any file is read.
        """
        arguments.select_columns(self.schema, columns, self.table.uri)
        return self._batches(columns)

    def _batches(self, columns: Sequence[str] | None) -> Iterator[pa.RecordBatch]:
        from .read import read_snapshot

        self.check_readable()
        yield from read_snapshot(
            self.table.storage,
            self.files,
            schema=self.schema,
            partition_columns=self.partition_columns,
            configuration=self.metadata.configuration,
            columns=columns,
            table=self.table.uri,
        )

    def to_arrow(self, columns: Sequence[str] | None = None) -> pa.Table:
        """The table's rows at this version as one ``pyarrow.Table``: ``columns`` matched as
        :meth:`iter_batches` matches them, in the order asked."""
        from .schema import to_arrow_schema

        selected = arguments.select_columns(self.schema, columns, self.table.uri)
        if selected is None:
            return pa.Table.from_batches(list(self._batches(None)), schema=to_arrow_schema(self.schema))
        schema = to_arrow_schema(self.schema.select(selected))  # the batches' order: the table's
        return pa.Table.from_batches(list(self._batches(selected)), schema=schema).select(selected)


class DeltaTable:
    """A Delta table at a location; cheap to create, every call reads the log afresh."""

    def __init__(
        self,
        uri: str,
        storage_options: Mapping[str, Any] | None = None,
        *,
        allowed_path_prefixes: Iterable[str] = (),
    ) -> None:
        uri = arguments.location("uri", uri)
        options = arguments.options("storage_options", storage_options, uri)
        prefixes = arguments.names("allowed_path_prefixes", allowed_path_prefixes, uri) or []
        self.storage = TableStorage(uri, options, allowed_path_prefixes=prefixes)

    def __repr__(self) -> str:
        return f"DeltaTable({self.uri!r})"

    @property
    def uri(self) -> str:
        return self.storage.uri

    # --- versions -----------------------------------------------------------------------------

    def listing(self, start_version: int = 0) -> LogListing:
        arguments.version("start_version", start_version, self.uri, optional=False)
        return list_log(self.storage, start_version)

    def latest_version(self) -> int:
        return build_segment(self.storage).version

    def segment(self, version: int | None = None) -> LogSegment:
        return build_segment(self.storage, arguments.version("version", version, self.uri))

    # --- snapshots ----------------------------------------------------------------------------

    def snapshot(
        self,
        version: int | None = None,
        timestamp: str | int | None = None,
        *,
        check_features: bool = True,
        progress: Callable[[int, int], None] | None = None,
    ) -> Snapshot:
        """The table at ``version``, at the latest commit at or before ``timestamp``, or the latest.

        A table whose reader features deltamirror lacks is refused here, before any data is read,
        as is one whose schema holds a type no supported feature brings or whose metaData has no
        ``schemaString`` (a corrupt metaData: delta-spark refuses both), unless ``check_features``
        is False (log-level tools and tests that inspect such a log).
        ``progress(done, total)`` counts the log files the replay reads (see ``replay``).
        """
        arguments.version("version", version, self.uri)
        arguments.timestamp("timestamp", timestamp, self.uri)
        arguments.flag("check_features", check_features, self.uri)
        arguments.function("progress", progress, self.uri)
        if version is not None and timestamp is not None:
            raise InvalidArgumentError(
                "give a version or a timestamp, not both", table=self.uri, argument="timestamp"
            )
        if timestamp is not None:
            version = self.version_at(timestamp)
        whole = self.listing(0) if self.storage.lists_whole_folder else None
        segment = build_segment(self.storage, version, whole_log=whole)
        state = replay(self.storage, segment, progress)
        if check_features:
            features.check_table(state.protocol, state.metadata, table=self.uri, version=state.version)
            state.metadata.table_schema  # noqa: B018 (a state needs a schema: refused naming its metaData)
        ts = self._snapshot_timestamp(segment, state, whole)
        return Snapshot(self, segment, state, ts)

    def _snapshot_timestamp(
        self, segment: LogSegment, state: TableState, whole: LogListing | None
    ) -> CommitTimestamp:
        """The one rule (:mod:`.timestamps`) for the snapshot's version, reusing what replay read."""
        v = segment.version
        if segment.listing.versions[-1] == v:
            ict = IctConfig.from_configuration(state.metadata.configuration, table=self.uri)
        else:
            ict = self._latest_ict(segment.listing)

        def read_ict(version: int) -> int | None:
            info = state.commit_infos.get(version)
            return (info if info is not None else self.commit_info(version)).in_commit_timestamp

        if v in state.commit_infos and ict.applies_to(v):
            return ict_timestamp(v, state.commit_infos[v].in_commit_timestamp, table=self.uri)
        # file times chain from the earliest listed commit: a listing from a checkpoint is not enough
        listing = whole or (segment.listing if segment.checkpoint is None else self.listing(0))
        cp = (
            segment.checkpoint if segment.checkpoint is not None and segment.checkpoint.version == v else None
        )
        cp_time = cp.files[0].modification_time if cp is not None else None
        return version_timestamp(
            v, _file_times(listing), ict, read_ict, checkpoint_file_time=cp_time, table=self.uri
        )

    # --- commits ------------------------------------------------------------------------------

    def read_commit(self, version: int) -> list[dict[str, Any]]:
        """The raw actions of one commit, in file order."""
        arguments.version("version", version, self.uri, optional=False)
        return read_commit(self.storage, version)

    def commit_info(self, version: int) -> CommitInfo:
        """The commitInfo of a version (an empty one if the writer wrote none)."""
        arguments.version("version", version, self.uri, optional=False)
        file = self.storage.log_file(commit_name(version))
        for lineno, wrapped in iter_commit_stream(self.storage, version):
            if "commitInfo" in wrapped:
                action = parse_action(wrapped, file=file, line=lineno, table=self.uri)
                assert isinstance(action, CommitInfo)
                return action
        return CommitInfo()

    def commit_metadata(self, version: int) -> Metadata | None:
        """The metaData a version commits, checked once as the log boundary checks its line; None
        when the version changes no metadata."""
        arguments.version("version", version, self.uri, optional=False)
        file = self.storage.log_file(commit_name(version))
        for lineno, wrapped in iter_commit_stream(self.storage, version):
            if "metaData" in wrapped:
                action = parse_action(wrapped, file=file, line=lineno, table=self.uri)
                assert isinstance(action, Metadata)
                return action
        return None

    def _read_ict(self, version: int) -> int | None:
        return self.commit_info(version).in_commit_timestamp

    def commit_timestamps(
        self, start: int = 0, end: int | None = None, *, ict: IctConfig | None = None
    ) -> list[CommitTimestamp]:
        """Resolved timestamps of the commits in [start, end] that are in the log.

        The one rule of :mod:`.timestamps`: file times chained from the earliest listed commit
        whatever ``start`` is; ICT versions read only their commitInfo line. ``ict`` (the latest
        metaData's, which the caller may have at hand) saves reading it again.
        """
        arguments.version_range("start", start, "end", end, self.uri)
        arguments.ict_config("ict", ict, self.uri)
        listing = self.listing(0)
        if ict is None:
            ict = self._latest_ict(listing)
        return log_timestamps(_file_times(listing), ict, self._read_ict, start=start, end=end, table=self.uri)

    def commit_timestamp(self, version: int) -> CommitTimestamp:
        """The resolved timestamp of ``version``: what ``snapshot(version).timestamp`` and
        ``history()`` say, without replaying the table."""
        arguments.version("version", version, self.uri, optional=False)
        return self._commit_timestamp(version, self.listing(0))

    def _commit_timestamp(self, version: int, listing: LogListing) -> CommitTimestamp:
        """:meth:`commit_timestamp` from ``listing``, a listing of the whole log the caller made."""
        cp = listing.checkpoints.get(version)
        if version not in listing.commits and cp is None:
            raise VersionNotFoundError(
                f"version {version} is not in the log", table=self.uri, version=version
            )
        return version_timestamp(
            version,
            _file_times(listing),
            self._latest_ict(listing),
            self._read_ict,
            checkpoint_file_time=cp.files[0].modification_time if cp is not None else None,
            table=self.uri,
        )

    def last_commit_timestamp(self, version: int) -> CommitTimestamp | None:
        """The resolved timestamp of the last commit file at or before ``version`` (None if there is
        none): the one the timestamps of the versions after it are chained from."""
        arguments.version("version", version, self.uri, optional=False)
        listing = self.listing(0)
        return last_commit_timestamp(
            version, _file_times(listing), self._latest_ict(listing), self._read_ict, table=self.uri
        )

    @cached_property
    def _ict_cache(self) -> dict[int, IctConfig]:
        return {}

    def _remember_config(self, version: int, metadata: Metadata) -> None:
        """The metaData in force at ``version``, read by the caller (core.head.read_head): the
        timestamps asked while ``version`` is the latest need not read the log again for its ICT
        settings (a table started at its latest version read its last commit twice). A metaData
        whose ICT settings do not read is not remembered: the timestamps say so themselves."""
        if version in self._ict_cache:
            return
        try:
            self._ict_cache[version] = IctConfig.from_configuration(metadata.configuration, table=self.uri)
        except CorruptLogError:
            return

    def _latest_ict(self, listing: LogListing | None = None) -> IctConfig:
        """ICT as the latest metaData configures it (delta-spark's history and timestamp search
        read the latest snapshot's), from its metaData alone, cached per latest version."""
        latest = build_segment(self.storage, whole_log=listing)
        cached = self._ict_cache.get(latest.version)
        if cached is None:
            metadata, _ = replay_config(self.storage, latest)
            cached = IctConfig.from_configuration(metadata.configuration, table=self.uri)
            self._ict_cache[latest.version] = cached
        return cached

    def version_at(self, timestamp: TimestampLike) -> int:
        """The latest version committed at or before ``timestamp`` (ISO-8601 text, epoch ms or a
        datetime; time travel)."""
        ts = to_epoch_ms(arguments.timestamp("timestamp", timestamp, self.uri, optional=False))
        listing = self.listing(0)
        ict = self._latest_ict(listing)
        stamps = log_timestamps(_file_times(listing), ict, self._read_ict, table=self.uri)
        if not stamps:
            raise TimestampOutOfRangeError(
                "the log holds no commit file to search by timestamp", table=self.uri
            )
        return version_at_or_before(stamps, ts, ict, table=self.uri)

    def history(self, start: int = 0, end: int | None = None) -> Iterator[HistoryEntry]:
        """Per commit file in the log, oldest first: resolved timestamp, commitInfo, action counts.

        The versions listed are those whose commit file remains, from the earliest listed (or
        ``start``) to the latest (or ``end``). As delta-spark's DESCRIBE HISTORY, which builds the
        latest snapshot first, a table whose latest protocol deltamirror cannot read is refused (and,
        that protocol readable, one whose latest metaData's schema holds an unknown type).
        Unlike it, a commit missing between the first and the last listed (a gap) or one without
        actions (an empty file) is an error, not skipped: the history would silently lie. The
        protocol and gaps are checked before the first entry; an empty commit when it is reached.
        ``start`` after the latest version is a VersionNotFoundError, an ``end`` before ``start``
        an InvalidArgumentError (an empty history would not say why it is empty).
        """
        arguments.version_range("start", start, "end", end, self.uri)
        listing = self.listing(0)
        latest = build_segment(self.storage, whole_log=listing)
        metadata, protocol = replay_config(self.storage, latest)
        features.check_table(protocol, metadata, table=self.uri, version=latest.version)
        ict = IctConfig.from_configuration(metadata.configuration, table=self.uri)
        self._ict_cache[latest.version] = ict
        if not listing.commits:
            return iter(())
        first, last = min(listing.commits), max(listing.commits)
        if start > last:
            raise VersionNotFoundError(
                f"history from version {start}: the latest version is {last}", table=self.uri, version=start
            )
        lo, hi = max(start, first), last if end is None else min(end, last)
        for v in range(lo, hi + 1):
            if v not in listing.commits:
                raise LogGapError(
                    f"commit {v} is missing from the log (the history runs from version {first} to {last})",
                    table=self.uri,
                    version=v,
                    file=self.storage.log_file(commit_name(v)),
                )
        return self._history_entries(
            range(lo, hi + 1),
            monotonic_file_times(_file_times(listing), ict, end=hi),
            ict,
            self._metadata_before(lo, listing, metadata),
        )

    def _metadata_before(self, version: int, listing: LogListing, latest: Metadata) -> Metadata | None:
        """The metaData in force before ``version`` (whose partition columns its file actions name);
        the latest one when that state cannot be rebuilt any more."""
        if version == 0:
            return None
        try:
            return replay_config(self.storage, build_segment(self.storage, version - 1, whole_log=listing))[0]
        except VersionNotFoundError:
            return latest

    def _history_entries(
        self,
        versions: range,
        chained: Mapping[int, CommitTimestamp],
        ict: IctConfig,
        metadata: Metadata | None,
    ) -> Iterator[HistoryEntry]:
        for v in versions:
            counts, info, metadata = self._count_actions(v, metadata)
            if ict.applies_to(v):
                ts = ict_timestamp(v, info.in_commit_timestamp if info else None, table=self.uri)
            else:
                ts = chained[v]
            yield HistoryEntry(v, ts, info, counts)

    def _count_actions(
        self, version: int, in_force: Metadata | None
    ) -> tuple[dict[str, int], CommitInfo | None, Metadata | None]:
        file = self.storage.log_file(commit_name(version))
        counts, info_value, metadata = count_commit(self.storage, version, in_force)
        info = CommitInfo.model_validate(info_value) if info_value is not None else None
        if not counts:
            raise CorruptLogError(
                f"commit {version} has no actions (an empty commit file)",
                table=self.uri,
                version=version,
                file=file,
            )
        return counts, info, metadata

    def changes(
        self,
        *,
        starting_version: int | None = None,
        starting_timestamp: TimestampLike | None = None,
        ending_version: int | None = None,
        ending_timestamp: TimestampLike | None = None,
        columns: Sequence[str] | None = None,
        partition_filter: PartitionFilter | None = None,
        batch_size: int = DEFAULT_BATCH_SIZE,
        progress: Callable[[int, int], None] | None = None,
        row_ids: bool = False,
    ) -> ChangeFeed:
        """The change data feed between two bounds: :func:`deltamirror.core.changes.read_changes`."""
        return read_changes(
            self,
            starting_version=starting_version,
            starting_timestamp=starting_timestamp,
            ending_version=ending_version,
            ending_timestamp=ending_timestamp,
            columns=columns,
            partition_filter=partition_filter,
            batch_size=batch_size,
            progress=progress,
            row_ids=row_ids,
        )


def _file_times(listing: LogListing) -> dict[int, int]:
    return {v: f.modification_time for v, f in listing.commits.items()}


def open_table(
    uri: str,
    storage_options: Mapping[str, Any] | None = None,
    *,
    allowed_path_prefixes: Iterable[str] = (),
) -> DeltaTable:
    """Open the Delta table at ``uri`` (a path or any fsspec URL: s3://, gs://, abfs://, memory://).

    Only files under the table root are read; ``allowed_path_prefixes`` names other locations on the
    same store that the log may point to (a shallow clone's source table).
    """
    return DeltaTable(uri, storage_options, allowed_path_prefixes=allowed_path_prefixes)
