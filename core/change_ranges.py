"""Which versions a change-feed read covers, and whether one schema can read all of them.

Both follow delta-spark's batch CDF reader (``CDCReader.getCDCRelation`` / ``changesToDF``), since
its users compare results with Spark: a starting timestamp resolves to the first commit at or after
it, an ending timestamp to the last commit at or before it, and the read schema is the latest one
(the end version's for column-mapped tables) with every schema change inside the range checked for
read compatibility. Error classes are delta-spark's, so an error can be looked up in its docs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from .errors import (
    ChangeTimestampAfterLatestError,
    ChangeTimestampBeforeEarliestError,
    IncompatibleDataSchemaError,
    IncompatibleSchemaChangeError,
    InvalidArgumentError,
    InvalidChangeRangeError,
    MultipleBoundaryError,
    NoStartingBoundError,
    StartVersionAfterLatestError,
    TimestampOutOfRangeError,
)
from .models import Metadata
from .schema import (
    ArrayType,
    DeltaType,
    MapType,
    StructField,
    StructType,
    column_mapping_mode,
    physical_name,
)
from .timestamps import (
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


# --- read schema ------------------------------------------------------------------------------


def is_cdf_enabled(metadata: Metadata) -> bool:
    return metadata.configuration.get("delta.enableChangeDataFeed", "false").strip().lower() == "true"


def uses_column_mapping(metadata: Metadata) -> bool:
    return column_mapping_mode(metadata.configuration) != "none"


@dataclass(frozen=True)
class ReadSchema:
    """The metadata whose schema serves the whole read, and the version it is from."""

    metadata: Metadata
    version: int


def check_schema_readable(
    read: ReadSchema,
    metadata: Metadata,
    version: int,
    *,
    schema_change: bool,
    table: str,
    start: int,
    end: int,
) -> None:
    """Raise unless data written under ``metadata`` (at ``version``) reads with ``read``'s schema.

    A schema change inside the range names its version (DELTA_CHANGE_DATA_FEED_INCOMPATIBLE_SCHEMA_CHANGE);
    the final check of the start version against the read schema is a data-schema mismatch.
    """
    if version <= read.version:
        compatible = _no_column_mapping_changes(new=read.metadata, old=metadata) and is_read_compatible(
            metadata.table_schema, read.metadata.table_schema, forbid_tighten_nullability=True
        )
    else:
        compatible = _no_column_mapping_changes(new=metadata, old=read.metadata) and is_read_compatible(
            read.metadata.table_schema, metadata.table_schema, forbid_tighten_nullability=False
        )
    if compatible:
        return
    error = IncompatibleSchemaChangeError if schema_change else IncompatibleDataSchemaError
    what = "a schema change" if schema_change else "the data schema"
    raise error(
        f"change data feed of versions {start}-{end} cannot be read with the schema of version "
        f"{read.version}: {what} at version {version} is not read-compatible with it",
        table=table,
        version=version,
    )


def is_read_compatible(existing: StructType, read: StructType, *, forbid_tighten_nullability: bool) -> bool:
    """delta-spark's ``SchemaUtils.isReadCompatible``: only added columns, same types, safe nullability."""

    def nullability_ok(existing_nullable: bool, read_nullable: bool) -> bool:
        if forbid_tighten_nullability:
            return read_nullable or not existing_nullable
        return existing_nullable or not read_nullable

    def types_ok(e: DeltaType, n: DeltaType) -> bool:
        if isinstance(e, StructType) and isinstance(n, StructType):
            return structs_ok(e, n)
        if isinstance(e, ArrayType) and isinstance(n, ArrayType):
            return nullability_ok(e.contains_null, n.contains_null) and types_ok(
                e.element_type, n.element_type
            )
        if isinstance(e, MapType) and isinstance(n, MapType):
            return (
                nullability_ok(e.value_contains_null, n.value_contains_null)
                and types_ok(e.key_type, n.key_type)
                and types_ok(e.value_type, n.value_type)
            )
        return e.to_json_value() == n.to_json_value()

    def structs_ok(e: StructType, n: StructType) -> bool:
        by_name = {f.name.lower(): f for f in e.fields}
        new_names = {f.name.lower() for f in n.fields}
        if not set(by_name) <= new_names:  # a column was dropped
            return False
        for field in n.fields:
            old = by_name.get(field.name.lower())
            if old is None:
                continue  # an added column
            if not (
                old.name == field.name
                and nullability_ok(old.nullable, field.nullable)
                and types_ok(old.type, field.type)
            ):
                return False
        return True

    return structs_ok(existing, read)


def _no_column_mapping_changes(*, new: Metadata, old: Metadata) -> bool:
    """delta-spark's ``hasNoColumnMappingSchemaChanges``: no rename, drop or repartition in between.

    ``new`` must be the later metadata, so that an added column is not mistaken for a dropped one.
    """
    old_mapped, new_mapped = uses_column_mapping(old), uses_column_mapping(new)
    if old_mapped and new_mapped:
        return not _renamed_dropped_or_repartitioned(new, old, upgraded_old=False)
    if new_mapped:  # mapping enabled in between: the upgrade kept logical names as physical names
        return not _renamed_dropped_or_repartitioned(new, old, upgraded_old=True)
    return not old_mapped  # reading across a downgrade is refused


def _renamed_dropped_or_repartitioned(new: Metadata, old: Metadata, *, upgraded_old: bool) -> bool:
    new_map = _physical_paths(new.table_schema, mapped=True)
    old_map = _physical_paths(old.table_schema, mapped=not upgraded_old)
    renamed = any(path in new_map and new_map[path].name != f.name for path, f in old_map.items())
    dropped = any(path not in new_map for path in old_map)
    return renamed or dropped or list(new.partition_columns) != list(old.partition_columns)


def _physical_paths(schema: StructType, *, mapped: bool) -> dict[tuple[str, ...], StructField]:
    """Every (nested) field by its path of physical names."""
    out: dict[tuple[str, ...], StructField] = {}

    def visit(data_type: DeltaType, prefix: tuple[str, ...]) -> None:
        if isinstance(data_type, StructType):
            for f in data_type.fields:
                path = (*prefix, physical_name(f, "name") if mapped else f.name)
                out[path] = f
                visit(f.type, path)
        elif isinstance(data_type, ArrayType):
            visit(data_type.element_type, (*prefix, "element"))
        elif isinstance(data_type, MapType):
            visit(data_type.key_type, (*prefix, "key"))
            visit(data_type.value_type, (*prefix, "value"))

    visit(schema, ())
    return out
