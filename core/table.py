"""The library entry point: open a table, take a snapshot, read its history.

>>> from deltamirror.core import open_table
>>> table = open_table("s3://bucket/events", storage_options={"anon": False})
>>> snap = table.snapshot()                  # latest; or version=N / timestamp="2026-01-01T00:00:00Z"
>>> snap.files.num_rows                      # active files, an Arrow table
>>> for batch in snap.iter_batches(columns=["id"]): ...
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import pyarrow as pa

from . import features
from .errors import InvalidArgumentError, VersionNotFoundError
from .log import LogListing, LogSegment, build_segment, commit_name, iter_commit_stream, list_log, read_commit
from .models import CommitInfo, DomainMetadata, Metadata, Protocol, Txn, parse_action
from .replay import TableState, replay
from .schema import StructType, column_mapping_mode
from .storage import TableStorage
from .timestamps import (
    CommitTime,
    CommitTimestamp,
    IctConfig,
    parse_timestamp,
    resolve_timestamps,
    version_at_or_before,
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
    def files(self) -> pa.Table:
        """Active files: one row per (path, deletion vector), columns as a checkpoint's ``add``."""
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
        features.check_readable(self.protocol, table=self.table.uri, version=self.version)

    def iter_batches(self, columns: list[str] | None = None) -> Iterator[pa.RecordBatch]:
        """The table's rows at this version, in its logical schema, one data file at a time."""
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

    def to_arrow(self, columns: list[str] | None = None) -> pa.Table:
        from .schema import to_arrow_schema

        schema = to_arrow_schema(self.schema)
        if columns is not None:
            schema = pa.schema([schema.field(c) for c in columns])
        return pa.Table.from_batches(list(self.iter_batches(columns)), schema=schema)


class DeltaTable:
    """A Delta table at a location; cheap to create, every call reads the log afresh."""

    def __init__(self, uri: str, storage_options: Mapping[str, Any] | None = None) -> None:
        self.storage = TableStorage(uri, dict(storage_options or {}))

    def __repr__(self) -> str:
        return f"DeltaTable({self.uri!r})"

    @property
    def uri(self) -> str:
        return self.storage.uri

    # --- versions -----------------------------------------------------------------------------

    def listing(self, start_version: int = 0) -> LogListing:
        return list_log(self.storage, start_version)

    def latest_version(self) -> int:
        return build_segment(self.storage).version

    def segment(self, version: int | None = None) -> LogSegment:
        return build_segment(self.storage, version)

    # --- snapshots ----------------------------------------------------------------------------

    def snapshot(
        self, version: int | None = None, timestamp: str | int | None = None, *, check_features: bool = True
    ) -> Snapshot:
        """The table at ``version``, at the latest commit at or before ``timestamp``, or the latest.

        A table whose reader features deltamirror lacks is refused here, before any data is read,
        unless ``check_features`` is False (log-level tools such as ``history`` and ``events``).
        """
        if version is not None and timestamp is not None:
            raise InvalidArgumentError("give a version or a timestamp, not both", table=self.uri)
        if timestamp is not None:
            version = self.version_at(timestamp)
        segment = build_segment(self.storage, version)
        state = replay(self.storage, segment)
        if check_features:
            features.check_readable(state.protocol, table=self.uri, version=state.version)
        ts = self._segment_timestamp(segment, state)
        return Snapshot(self, segment, state, ts)

    def _segment_timestamp(self, segment: LogSegment, state: TableState) -> CommitTimestamp:
        ict = IctConfig.from_configuration(state.metadata.configuration)
        commits = []
        for v, info in segment.commits:
            ci = state.commit_infos.get(v)
            commits.append(CommitTime(v, info.modification_time, ci.in_commit_timestamp if ci else None))
        if not commits:
            # the version is a checkpoint whose commit file may be gone; use what remains
            commit_file = segment.listing.commits.get(segment.version)
            ict_value = None
            if commit_file is not None and ict.applies_to(segment.version):
                ict_value = self.commit_info(segment.version).in_commit_timestamp
            if commit_file is not None:
                file_time = commit_file.modification_time
            else:
                assert segment.checkpoint is not None
                file_time = segment.checkpoint.files[0].modification_time
            commits = [CommitTime(segment.version, file_time, ict_value)]
        return resolve_timestamps(commits, ict)[-1]

    # --- commits ------------------------------------------------------------------------------

    def read_commit(self, version: int) -> list[dict[str, Any]]:
        """The raw actions of one commit, in file order."""
        return read_commit(self.storage, version)

    def commit_info(self, version: int) -> CommitInfo:
        """The commitInfo of a version (an empty one if the writer wrote none)."""
        file = self.storage.log_file(commit_name(version))
        for lineno, wrapped in iter_commit_stream(self.storage, version):
            if "commitInfo" in wrapped:
                action = parse_action(wrapped, file=file, line=lineno, table=self.uri)
                assert isinstance(action, CommitInfo)
                return action
        return CommitInfo()

    def commit_timestamps(
        self, start: int = 0, end: int | None = None, *, ict: IctConfig | None = None
    ) -> list[CommitTimestamp]:
        """Resolved timestamps of the commits in [start, end] that are in the log.

        File times are made monotonic from the first listed commit on; ICT versions read only
        their commitInfo line.
        """
        listing = self.listing(0)
        if ict is None:
            ict = self._latest_ict()
        versions = sorted(v for v in listing.commits if v >= start and (end is None or v <= end))
        commits = []
        for v in versions:
            ict_value = self.commit_info(v).in_commit_timestamp if ict.applies_to(v) else None
            commits.append(CommitTime(v, listing.commits[v].modification_time, ict_value))
        return resolve_timestamps(commits, ict)

    @cached_property
    def _ict_cache(self) -> dict[int, IctConfig]:
        return {}

    def _latest_ict(self) -> IctConfig:
        latest = build_segment(self.storage)
        cached = self._ict_cache.get(latest.version)
        if cached is None:
            state = replay(self.storage, latest)
            cached = IctConfig.from_configuration(state.metadata.configuration)
            self._ict_cache[latest.version] = cached
        return cached

    def version_at(self, timestamp: str | int) -> int:
        """The latest version committed at or before ``timestamp`` (time travel)."""
        ts = parse_timestamp(timestamp) if isinstance(timestamp, str) else int(timestamp)
        ict = self._latest_ict()
        return version_at_or_before(self.commit_timestamps(ict=ict), ts, ict, table=self.uri)

    def history(self, start: int = 0, end: int | None = None) -> Iterator[HistoryEntry]:
        """Per version still in the log: resolved timestamp, commitInfo and action counts."""
        ict = self._latest_ict()
        for ts in self.commit_timestamps(start, end, ict=ict):
            counts: dict[str, int] = {}
            info: CommitInfo | None = None
            file = self.storage.log_file(commit_name(ts.version))
            for lineno, wrapped in iter_commit_stream(self.storage, ts.version):
                name = next(iter(wrapped))
                counts[name] = counts.get(name, 0) + 1
                if name == "commitInfo":
                    parsed = parse_action(wrapped, file=file, line=lineno, table=self.uri)
                    assert isinstance(parsed, CommitInfo)
                    info = parsed
            yield HistoryEntry(ts.version, ts, info, counts)

    def require_version(self, version: int) -> None:
        if version not in self.listing(version).commits:
            raise VersionNotFoundError(
                f"version {version} is not in the log", table=self.uri, version=version
            )

    def changes(self, **options: Any) -> Any:
        """The change data feed; see :func:`deltamirror.core.changes.read_changes` for the options."""
        from .changes import read_changes

        return read_changes(self, **options)


def open_table(uri: str, storage_options: Mapping[str, Any] | None = None) -> DeltaTable:
    """Open the Delta table at ``uri`` (a path or any fsspec URL: s3://, gs://, abfs://, memory://)."""
    return DeltaTable(uri, storage_options)
