"""The one exception hierarchy of deltamirror.

Every error a user can cause derives from :class:`DeltaMirrorError` and names what it is about
(table, version, file, line) so that a one-line message on stderr is enough to act on.
``exit_code`` tells the CLI how to exit: 2 for bad input (the table, a URL, an argument),
1 for a failure of the environment (a broker, a fenced producer).
"""

from __future__ import annotations

from typing import Any

from .redact import redact


class DeltaMirrorError(Exception):
    """Root of every error deltamirror raises on purpose."""

    exit_code: int = 2

    def __init__(
        self,
        message: str,
        *,
        table: str | None = None,
        version: int | None = None,
        file: str | None = None,
        line: int | None = None,
        **context: Any,
    ) -> None:
        self.message = message
        self.table = table
        self.version = version
        self.file = file
        self.line = line
        self.context = context
        super().__init__(message)

    def __str__(self) -> str:
        where = []
        if self.table is not None:
            where.append(f"table={self.table}")
        if self.version is not None:
            where.append(f"version={self.version}")
        if self.file is not None:
            where.append(f"file={self.file}")
        if self.line is not None:
            where.append(f"line={self.line}")
        where.extend(f"{k}={v}" for k, v in self.context.items() if v is not None)
        # a table URI or a library's message may hold credentials: never print them (core/redact.py)
        return redact(f"{self.message} ({', '.join(where)})" if where else self.message)


# --- locating a table -------------------------------------------------------------------------


class InvalidTableUriError(DeltaMirrorError):
    """The table location cannot be understood (unknown protocol, malformed URL)."""


class InvalidArgumentError(DeltaMirrorError):
    """A malformed argument: a timestamp that does not parse, a negative version, a bad option."""


class NetChangesError(InvalidArgumentError):
    """Net changes cannot be made of these rows: a key column missing, not unique, or not groupable."""

    @property
    def column(self) -> str | None:
        column = self.context.get("column")
        return None if column is None else str(column)


class UnknownColumnError(InvalidArgumentError):
    """A column asked for (``columns=``, ``--columns``, the Spark source's ``columns`` option) that
    the table's schema does not have; ``column`` is the name as given. Raised before any row is read."""

    def __init__(self, message: str, *, column: str, **kw: Any) -> None:
        self.column = column
        super().__init__(message, column=column, **kw)


class TableNotFoundError(DeltaMirrorError):
    """No ``_delta_log`` (or an empty one) at the location."""


class StorageError(DeltaMirrorError):
    """The storage failed in a way that may pass (timeouts, throttling). Safe to retry."""

    exit_code = 1


class StorageAccessError(DeltaMirrorError):
    """The storage refused a request in a way no retry changes: no permission, a file where the
    table has a folder (``_delta_log`` that is a file), a folder where it has a file."""


# --- the log ----------------------------------------------------------------------------------


class VersionNotFoundError(DeltaMirrorError):
    """A requested version does not exist, or was cleaned up from the log."""


class LogGapError(VersionNotFoundError):
    """A commit is missing after the checkpoint in use; the table state cannot be built."""


class TimestampOutOfRangeError(DeltaMirrorError):
    """A timestamp before the earliest recoverable commit or after the latest one."""

    error_class = "DELTA_TIMESTAMP_GREATER_THAN_COMMIT"


class CorruptLogError(DeltaMirrorError):
    """A log file that cannot be parsed (bad JSON line, bad checkpoint)."""


class IncompleteTableStateError(CorruptLogError):
    """The log does not define both a protocol and a metaData action."""


class PathOutsideTableError(CorruptLogError):
    """A file path in the log leads outside the table root (and outside every allowed prefix).

    Refused before any byte of it is read: a hostile or broken log must not make a mirror read,
    and publish, files that are not the table's. Shallow clones allow their source explicitly.
    """


# --- features ---------------------------------------------------------------------------------


class UnsupportedFeatureError(DeltaMirrorError):
    """The table needs a reader feature (or protocol version) deltamirror does not implement."""

    def __init__(self, message: str, *, feature: str | None = None, **kw: Any) -> None:
        self.feature = feature
        super().__init__(message, feature=feature, **kw)


class CatalogManagedTableError(UnsupportedFeatureError):
    """Catalog-managed tables keep commits outside the log; storage alone gives a wrong answer."""


# --- data -------------------------------------------------------------------------------------


class DataFileNotFoundError(DeltaMirrorError):
    """A data file the log references is gone (typically vacuumed)."""


class DeletionVectorError(DeltaMirrorError):
    """A deletion vector that cannot be read or does not match its descriptor."""


class CorruptDataFileError(DeltaMirrorError):
    """A data file (or change data file) that is not a readable Parquet file: truncated, corrupt."""


class SchemaError(DeltaMirrorError):
    """A schemaString that does not parse, or a type deltamirror cannot map to Arrow."""


# --- change data feed -------------------------------------------------------------------------


class ChangeDataFeedError(DeltaMirrorError):
    """A change-feed request delta-spark would refuse; ``error_class`` is delta-spark's name."""

    error_class = "DELTA_CHANGE_DATA_FEED_ERROR"

    def __str__(self) -> str:
        return f"[{self.error_class}] {super().__str__()}"


class ChangeDataNotEnabledError(ChangeDataFeedError):
    error_class = "DELTA_MISSING_CHANGE_DATA"


class StartVersionAfterLatestError(ChangeDataFeedError):
    error_class = "DELTA_CDC_START_VERSION_AFTER_LATEST"


class InvalidChangeRangeError(ChangeDataFeedError):
    error_class = "DELTA_INVALID_CDC_RANGE"


class MultipleBoundaryError(ChangeDataFeedError):
    error_class = "DELTA_MULTIPLE_CDC_BOUNDARY"


class IncompatibleSchemaChangeError(ChangeDataFeedError):
    error_class = "DELTA_CHANGE_DATA_FEED_INCOMPATIBLE_SCHEMA_CHANGE"


class SchemaChangedError(ChangeDataFeedError):
    """The schema changed after a stream started reading; restart the query to read with the new one."""

    error_class = "DELTA_SCHEMA_CHANGED_WITH_VERSION"


class StreamingNonAdditiveSchemaChangeError(ChangeDataFeedError):
    """A stream without a schema tracking log would cross a column renamed or dropped under column
    mapping (delta-spark's refusal: give ``schemaTrackingLocation``)."""

    error_class = "DELTA_STREAMING_INCOMPATIBLE_SCHEMA_CHANGE_USE_SCHEMA_LOG"


class StreamingMetadataEvolutionError(ChangeDataFeedError):
    """The schema tracking log now holds a new schema for the stream: restart the query to read on
    with it (delta-spark's stream fails the same way, once per schema change)."""

    error_class = "DELTA_STREAMING_METADATA_EVOLUTION"


class StreamingSchemaChangeBlockedError(ChangeDataFeedError):
    """The tracked schema renamed or dropped columns, and no option says the sink is ready for it."""

    error_class = "DELTA_STREAMING_CANNOT_CONTINUE_PROCESSING_POST_SCHEMA_EVOLUTION"


class IncompatibleDataSchemaError(IncompatibleSchemaChangeError):
    """The read schema cannot read the start version's data (no schema change inside the range)."""

    error_class = "DELTA_CHANGE_DATA_FEED_INCOMPATIBLE_DATA_SCHEMA"


class NoStartingBoundError(ChangeDataFeedError):
    error_class = "DELTA_NO_START_FOR_CDC_READ"


class ChangeTimestampAfterLatestError(ChangeDataFeedError, TimestampOutOfRangeError):
    error_class = "DELTA_TIMESTAMP_GREATER_THAN_COMMIT"


class ChangeTimestampBeforeEarliestError(ChangeDataFeedError, TimestampOutOfRangeError):
    error_class = "DELTA_TIMESTAMP_EARLIER_THAN_COMMIT_RETENTION"


class ChangeVersionNotFoundError(ChangeDataFeedError, VersionNotFoundError):
    """A version of the range is no longer in the log (its commit file was cleaned up)."""

    error_class = "DELTA_LOG_FILE_NOT_FOUND"


class StreamStartNotFoundError(ChangeDataFeedError, VersionNotFoundError):
    """A stream's startingVersion after the table's latest version (delta-spark's streaming source)."""

    error_class = "DELTA_VERSION_NOT_FOUND"


class StartingVersionAndTimestampError(ChangeDataFeedError):
    """A stream given both startingVersion and startingTimestamp (delta-spark's DeltaOptions)."""

    error_class = "DELTA_STARTING_VERSION_AND_TIMESTAMP_BOTH_SET"


# --- configuration and services ---------------------------------------------------------------


class ConfigError(DeltaMirrorError):
    """A configuration file or option that is wrong."""


class EnvironmentMissingError(DeltaMirrorError):
    """A required program (java) or optional extra (pyspark) is not installed."""
