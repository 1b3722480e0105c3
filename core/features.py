"""Protocol versions and table features: what a table needs, and whether deltamirror can read it.

The check runs on the protocol of the version being read, before any data file is opened, so an
unsupported table fails with the feature's name instead of with wrong rows.
"""

from __future__ import annotations

from .errors import CatalogManagedTableError, UnsupportedFeatureError
from .models import Metadata, Protocol
from .schema import schema_problem

# Features implied by (reader|writer) versions before table features (reader 3 / writer 7).
LEGACY_READER_FEATURES: dict[int, frozenset[str]] = {
    1: frozenset(),
    2: frozenset({"columnMapping"}),
}
LEGACY_WRITER_FEATURES: dict[int, frozenset[str]] = {
    1: frozenset(),
    2: frozenset({"appendOnly", "invariants"}),
    3: frozenset({"appendOnly", "invariants", "checkConstraints"}),
    4: frozenset({"appendOnly", "invariants", "checkConstraints", "changeDataFeed", "generatedColumns"}),
    5: frozenset(
        {
            "appendOnly",
            "invariants",
            "checkConstraints",
            "changeDataFeed",
            "generatedColumns",
            "columnMapping",
        }
    ),
    6: frozenset(
        {
            "appendOnly",
            "invariants",
            "checkConstraints",
            "changeDataFeed",
            "generatedColumns",
            "columnMapping",
            "identityColumns",
        }
    ),
}

#: Reader features whose reader requirements deltamirror implements.
SUPPORTED_READER_FEATURES: frozenset[str] = frozenset(
    {
        "columnMapping",
        "deletionVectors",
        "timestampNtz",
        "v2Checkpoint",
        "vacuumProtocolCheck",
        "variantType",
        "variantType-preview",
        "typeWidening",
        "typeWidening-preview",
    }
)

#: Features that move commits out of storage into a catalog: reading storage alone is wrong.
CATALOG_FEATURES: frozenset[str] = frozenset({"catalogManaged", "catalogOwned", "catalogOwned-preview"})

MAX_READER_VERSION = 3


def reader_features(protocol: Protocol) -> frozenset[str]:
    """Reader features in force, explicit (reader 3) or implied by the legacy version."""
    if protocol.min_reader_version >= 3:
        return frozenset(protocol.reader_features or ())
    return LEGACY_READER_FEATURES.get(protocol.min_reader_version, frozenset())


def writer_features(protocol: Protocol) -> frozenset[str]:
    if protocol.min_writer_version >= 7:
        return frozenset(protocol.writer_features or ())
    return LEGACY_WRITER_FEATURES.get(protocol.min_writer_version, frozenset())


def table_features(protocol: Protocol) -> frozenset[str]:
    return reader_features(protocol) | writer_features(protocol)


def check_readable(protocol: Protocol, *, table: str | None = None, version: int | None = None) -> None:
    """Refuse, by name, a table whose reader requirements deltamirror does not meet."""
    features = table_features(protocol)
    catalog = sorted(features & CATALOG_FEATURES)
    if catalog:
        raise CatalogManagedTableError(
            f"table feature {catalog[0]!r}: commits of a catalog-managed table live in its catalog "
            "(_staged_commits); reading storage alone would miss or misorder them",
            feature=catalog[0],
            table=table,
            version=version,
        )
    if protocol.min_reader_version > MAX_READER_VERSION or protocol.min_reader_version < 1:
        raise UnsupportedFeatureError(
            f"unsupported minReaderVersion {protocol.min_reader_version} (deltamirror reads up to "
            f"{MAX_READER_VERSION})",
            feature=f"readerVersion{protocol.min_reader_version}",
            table=table,
            version=version,
        )
    if protocol.min_reader_version == 3 and protocol.reader_features is None:
        raise UnsupportedFeatureError(
            "minReaderVersion 3 without readerFeatures is not a valid protocol",
            feature="readerFeatures",
            table=table,
            version=version,
        )
    missing = sorted(reader_features(protocol) - SUPPORTED_READER_FEATURES)
    if missing:
        raise UnsupportedFeatureError(
            f"unsupported reader feature {missing[0]!r}"
            + (f" (also: {', '.join(missing[1:])})" if len(missing) > 1 else ""),
            feature=missing[0],
            table=table,
            version=version,
        )


def check_table(
    protocol: Protocol, metadata: Metadata, *, table: str | None = None, version: int | None = None
) -> None:
    """Refuse a table no reader of this deltamirror can read: its protocol first (a table that
    needs an unsupported reader feature is refused by that feature's name), then its metaData."""
    check_readable(protocol, table=table, version=version)
    check_schema(metadata)


def check_schema(metadata: Metadata) -> None:
    """Once the protocol is known readable, a type of the schema that no supported feature brings
    makes the metaData corrupt, refused naming the file and line that hold it. A metaData without
    ``schemaString`` passes: the log stays readable, readers of rows refuse it when they need it."""
    if metadata.schema_string is None:
        return
    problem = schema_problem(metadata.schema_string)
    if problem is not None:
        raise metadata.refuse(f"metaData.schemaString: {problem}")
