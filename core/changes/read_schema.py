"""Whether one schema can read every version of a change-feed read, as delta-spark decides it.

delta-spark's batch CDF reader (``CDCReader.changesToDF``) reads a range with the latest schema
(the end version's for column-mapped tables) and checks every schema change inside the range for
read compatibility; a version written without the change data feed on has no change rows to read.

Types must be equal, except in one mode: delta-spark's *streaming* source, reading versions written
before the schema it reads with (backfilling), lets a column's type have been widened since (type
widening: INT to BIGINT, FLOAT to DOUBLE, a wider decimal, ...) and reads the old rows widened,
where its batch reader refuses the same range. ``allow_widening`` is that mode, for the stream only.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ChangeDataNotEnabledError, IncompatibleDataSchemaError, IncompatibleSchemaChangeError
from ..features import check_readable
from ..models import Metadata, Protocol
from ..schema import (
    ArrayType,
    DecimalType,
    DeltaType,
    MapType,
    PrimitiveType,
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
    allow_widening: bool = False,
) -> None:
    """Raise unless data written under ``metadata`` (at ``version``) reads with ``read``'s schema.

    A schema change inside the range names its version (DELTA_CHANGE_DATA_FEED_INCOMPATIBLE_SCHEMA_CHANGE);
    the final check of the start version against the read schema is a data-schema mismatch.
    ``allow_widening`` (the streaming source only) lets data written before the read schema's
    version have a type the read schema widened.
    """
    if version <= read.version:
        compatible = _no_column_mapping_changes(new=read.metadata, old=metadata) and is_read_compatible(
            metadata.table_schema,
            read.metadata.table_schema,
            forbid_tighten_nullability=True,
            allow_widening=allow_widening,
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


def check_change_protocol(protocol: Protocol, version: int, *, table: str | None = None) -> None:
    """A protocol a version of the range sets: readable by this deltamirror (core's one rule,
    :func:`~deltamirror.core.features.check_readable`), or refused by the feature's name."""
    check_readable(protocol, table=table, version=version)


def check_change_metadata(
    read: ReadSchema,
    metadata: Metadata,
    version: int,
    *,
    table: str,
    start: int,
    allow_widening: bool = False,
) -> None:
    """Raise unless rows of ``version``, written under ``metadata``, belong in a feed read with ``read``.

    The checks :func:`~deltamirror.core.changes.read_changes` makes on each metaData of its range:
    the change data feed must be on (DELTA_MISSING_CHANGE_DATA) and the schema read-compatible with
    the read schema (DELTA_CHANGE_DATA_FEED_INCOMPATIBLE_SCHEMA_CHANGE); ``allow_widening`` as in
    :func:`check_schema_readable`.
    """
    if not is_cdf_enabled(metadata):
        raise ChangeDataNotEnabledError(
            f"change data was not recorded for version {version} (delta.enableChangeDataFeed is not "
            "true), so no change rows can be read from there on",
            table=table,
            version=version,
        )
    check_schema_readable(
        read,
        metadata,
        version,
        schema_change=True,
        table=table,
        start=start,
        end=version,
        allow_widening=allow_widening,
    )


def is_read_compatible(
    existing: StructType,
    read: StructType,
    *,
    forbid_tighten_nullability: bool,
    allow_widening: bool = False,
) -> bool:
    """delta-spark's ``SchemaUtils.isReadCompatible``: only added columns, same types, safe nullability.

    With ``allow_widening`` (its ``TypeWideningMode.AllTypeWidening``) a type of ``existing`` may
    be one that ``read`` widened (:func:`is_widening`).
    """

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
        if e.to_json_value() == n.to_json_value():
            return True
        return allow_widening and is_widening(e, n)

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


#: bytes per value of the integral types (Spark's ``defaultSize``)
_INTEGRAL_SIZE = {"byte": 1, "short": 2, "integer": 4, "long": 8}
#: integer digits a decimal needs to hold every value of an integral type (Spark's
#: ``DecimalType.forType``): INT32-stored types need decimal(10,0), long decimal(20,0)
_INTEGRAL_DIGITS = {"byte": 10, "short": 10, "integer": 10, "long": 20}


def is_widening(old: DeltaType, new: DeltaType) -> bool:
    """Whether a column of type ``old`` may have been widened to ``new`` (Delta's type widening).

    delta-spark's ``TypeWidening.isTypeChangeSupported``: a wider integral type, float to double,
    byte/short/int to double, date to timestamp_ntz, a decimal with no fewer integer digits and
    no smaller scale, an integral type to a decimal with room for all its values.
    """
    if isinstance(old, DecimalType):
        return isinstance(new, DecimalType) and _decimal_wider(new, old.precision - old.scale, old.scale)
    if not isinstance(old, PrimitiveType):
        return False
    name = old.name
    if isinstance(new, DecimalType):
        return name in _INTEGRAL_DIGITS and _decimal_wider(new, _INTEGRAL_DIGITS[name], 0)
    if not isinstance(new, PrimitiveType):
        return False
    if name in _INTEGRAL_SIZE and new.name in _INTEGRAL_SIZE:
        return _INTEGRAL_SIZE[name] <= _INTEGRAL_SIZE[new.name]
    return (name, new.name) in {("float", "double"), ("date", "timestamp_ntz")} or (
        name in ("byte", "short", "integer") and new.name == "double"
    )


def _decimal_wider(new: DecimalType, integer_digits: int, scale: int) -> bool:
    return new.precision - new.scale >= integer_digits and new.scale >= scale


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
