"""Whether one schema can read every version of a change-feed read, as delta-spark decides it.

delta-spark's batch CDF reader (``CDCReader.changesToDF``) reads a range with the latest schema
(the end version's for column-mapped tables) and checks every schema change inside the range for
read compatibility; a version written without the change data feed on has no change rows to read.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ChangeDataNotEnabledError, IncompatibleDataSchemaError, IncompatibleSchemaChangeError
from ..models import Metadata
from ..schema import (
    ArrayType,
    DeltaType,
    MapType,
    StructField,
    StructType,
    column_mapping_mode,
    physical_name,
)


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


def check_change_metadata(
    read: ReadSchema, metadata: Metadata, version: int, *, table: str, start: int
) -> None:
    """Raise unless rows of ``version``, written under ``metadata``, belong in a feed read with ``read``.

    The checks :func:`~deltamirror.core.changes.read_changes` makes on each metaData of its range:
    the change data feed must be on (DELTA_MISSING_CHANGE_DATA) and the schema read-compatible with
    the read schema (DELTA_CHANGE_DATA_FEED_INCOMPATIBLE_SCHEMA_CHANGE).
    """
    if not is_cdf_enabled(metadata):
        raise ChangeDataNotEnabledError(
            f"change data was not recorded for version {version} (delta.enableChangeDataFeed is not "
            "true), so no change rows can be read from there on",
            table=table,
            version=version,
        )
    check_schema_readable(read, metadata, version, schema_change=True, table=table, start=start, end=version)


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
        return bool(e.to_json_value() == n.to_json_value())

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
