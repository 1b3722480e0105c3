"""The Spark source's schema tracking log (``schemaTrackingLocation``), as delta-spark keeps one.

A stream over a table whose columns are renamed or dropped under column mapping cannot read all of
its versions with one schema. With a tracking location, the stream reads with the schema the log
holds last, and at a version that changes the schema it records the new one and fails once
(DELTA_STREAMING_METADATA_EVOLUTION); restarted, it reads on with it. A rename or drop in the log
then needs the sink's owner to say so (``allowSourceColumnRename`` / ``allowSourceColumnDrop``:
``always`` or the version of the change) before the stream goes on, as in delta-spark.

The log is a folder ``<location>/_schema_log_<table id>[_<streamingSourceTrackingId>]`` of entries
``0``, ``1``, ... each the text ``v1`` and one JSON line: the table id, the version the schema is in
force from, and that version's ``metaData``. An entry is written to a temporary name and renamed,
so a reader sees whole entries only. Local paths (or ``file:`` URIs) only.

No pyspark here.
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import dataclass
from pathlib import Path

from deltamirror.core.errors import (
    InvalidArgumentError,
    StreamingMetadataEvolutionError,
    StreamingNonAdditiveSchemaChangeError,
    StreamingSchemaChangeBlockedError,
)
from deltamirror.core.models import Metadata
from deltamirror.core.schema_changes import ColumnChange, schema_change

#: the first line of an entry: the format of what follows
ENTRY_FORMAT = "v1"
#: the options that let a stream go on with a tracked rename or drop, per kind of change
UNBLOCK_OPTIONS = {"rename": "allowSourceColumnRename", "drop": "allowSourceColumnDrop"}


def tracking_folder(location: str, table: str) -> Path:
    """``schemaTrackingLocation`` as a local folder; refused with one line otherwise."""
    text = location.strip()
    if text.startswith("file://"):
        text = text[len("file://") :]
    elif text.startswith("file:"):
        text = text[len("file:") :]
    if not text or "://" in text:
        raise InvalidArgumentError(
            f"option schemaTrackingLocation must be a local folder (a path or a file: URI), got {location!r}",
            table=table,
        )
    return Path(text).expanduser().absolute()


@dataclass(frozen=True)
class TrackedSchema:
    """One entry: the schema (``metadata``) in force from ``version`` on."""

    seq: int
    version: int
    metadata: Metadata


@dataclass(frozen=True)
class SchemaLog:
    """The tracking log of one stream over one table (picklable: it travels to the planner)."""

    folder: Path
    table_id: str
    table: str

    @classmethod
    def at(cls, location: Path, table_id: str, tracking_id: str | None, table: str) -> SchemaLog:
        name = f"_schema_log_{table_id}" + (f"_{tracking_id}" if tracking_id else "")
        return cls(location / name, table_id, table)

    def entries(self) -> list[TrackedSchema]:
        if not self.folder.is_dir():
            return []
        seqs = sorted(int(p.name) for p in self.folder.iterdir() if p.name.isdigit())
        return [self._read(seq) for seq in seqs]

    def latest(self) -> TrackedSchema | None:
        entries = self.entries()
        return entries[-1] if entries else None

    def _read(self, seq: int) -> TrackedSchema:
        path = self.folder / str(seq)
        head, _, body = path.read_text().partition("\n")
        try:
            if head != ENTRY_FORMAT:
                raise ValueError(f"unknown format {head!r}")
            entry = json.loads(body)
            if entry["tableId"] != self.table_id:
                raise ValueError(f"it is table {entry['tableId']}'s")
            return TrackedSchema(seq, int(entry["version"]), Metadata.model_validate(entry["metaData"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise InvalidArgumentError(
                f"the schema tracking log entry {path} cannot be read ({exc}): give the query a new "
                "checkpoint and schemaTrackingLocation",
                table=self.table,
            ) from None

    def append(self, version: int, metadata: Metadata) -> TrackedSchema:
        """Record ``metadata`` as the schema from ``version`` on (nothing if the last entry is it)."""
        last = self.latest()
        if last is not None and last.version == version and same_shape(last.metadata, metadata):
            return last
        seq = 0 if last is None else last.seq + 1
        self.folder.mkdir(parents=True, exist_ok=True)
        entry = {
            "tableId": self.table_id,
            "version": version,
            "metaData": json.loads(metadata.model_dump_json(by_alias=True, exclude_none=True)),
        }
        temporary = self.folder / f".{seq}.{uuid.uuid4().hex}.tmp"
        temporary.write_text(f"{ENTRY_FORMAT}\n{json.dumps(entry)}\n")
        os.replace(temporary, self.folder / str(seq))
        return TrackedSchema(seq, version, metadata)


def same_shape(a: Metadata, b: Metadata) -> bool:
    """The same schema and partition columns: a stream reads both alike."""
    return a.table_schema == b.table_schema and list(a.partition_columns) == list(b.partition_columns)


def evolved(read_version: int, new: Metadata, version: int, table: str) -> StreamingMetadataEvolutionError:
    """The error a stream fails with once the log holds ``new`` (from ``version``)."""
    columns = ", ".join(f.name for f in new.table_schema.fields)
    return StreamingMetadataEvolutionError(
        f"the table's schema at version {version} is not the one the stream read with (version "
        f"{read_version}); the schema tracking log now holds it ({columns}): restart the query to "
        "read on with it",
        table=table,
        version=version,
    )


def non_additive(older: Metadata, newer: Metadata) -> list[ColumnChange]:
    """The renames and drops of columns from ``older`` to ``newer`` under column mapping."""
    if "none" in (_mapping(older), _mapping(newer)):
        return []
    change = schema_change(older, newer)
    if change is None:
        return []
    return [c for c in change.changes if c.change in UNBLOCK_OPTIONS]


def _mapping(metadata: Metadata) -> str:
    return metadata.configuration.get("delta.columnMapping.mode", "none")


def refuse_untracked(read: Metadata, read_version: int, metadata: Metadata, version: int, table: str) -> None:
    """delta-spark's refusal of a stream without a tracking log that would read version ``version``
    (written under ``metadata``) with a schema that renamed or dropped its columns, or the reverse."""
    older, newer = (metadata, read) if version <= read_version else (read, metadata)
    changes = non_additive(older, newer)
    if changes:
        raise StreamingNonAdditiveSchemaChangeError(
            f"{_describe(changes)} between version {min(version, read_version)} and "
            f"{max(version, read_version)}: a stream cannot read across a column renamed or dropped "
            "under column mapping with one schema; give .option('schemaTrackingLocation', <a folder "
            "under the query's checkpointLocation>) to read on with the tracked schema",
            table=table,
            version=version,
        )


def check_unblocked(entries: list[TrackedSchema], unblock: dict[str, str], table: str) -> None:
    """Refuse to read with the last tracked schema if it renamed or dropped columns of the one
    before and the option for that kind of change is neither ``always`` nor that schema's version."""
    if len(entries) < 2:
        return
    before, last = entries[-2], entries[-1]
    changes = non_additive(before.metadata, last.metadata)
    blocked = sorted(
        {
            UNBLOCK_OPTIONS[c.change]
            for c in changes
            if unblock.get(UNBLOCK_OPTIONS[c.change], "").strip().lower() not in ("always", str(last.version))
        }
    )
    if blocked:
        how = " and ".join(f".option({name!r}, 'always' or '{last.version}')" for name in blocked)
        raise StreamingSchemaChangeBlockedError(
            f"{_describe(changes)} between version {before.version} and {last.version}: check that the "
            f"sink can take the schema of version {last.version}, then restart with {how}",
            table=table,
            version=last.version,
        )


def _describe(changes: list[ColumnChange]) -> str:
    parts = []
    for c in changes:
        column = ".".join(c.column)
        if c.change == "rename":
            parts.append(f"column {c.before!r} renamed to {c.after!r}")
        else:
            parts.append(f"column {column!r} dropped")
    return "; ".join(parts)


__all__ = [
    "UNBLOCK_OPTIONS",
    "SchemaLog",
    "TrackedSchema",
    "check_unblocked",
    "evolved",
    "non_additive",
    "refuse_untracked",
    "same_shape",
    "tracking_folder",
]
