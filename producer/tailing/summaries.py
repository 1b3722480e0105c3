"""What every unit of work (a commit, a snapshot) says of itself in the same words: the envelope of
its records (the action values' encoder) and of its commit summary; each kind computes only its
own counts."""

from __future__ import annotations

from typing import Any, Protocol

from deltamirror.core.models import Metadata
from deltamirror.core.schema_changes import SchemaChange
from deltamirror.core.timestamps import CommitTimestamp
from deltamirror.mirror.records.events import (
    MAX_SUMMED_BYTES,
    SCHEMA_VERSION,
    ColumnChangeEntry,
    CommitSummary,
    EnvelopeEncoder,
    PropertyChange,
    SchemaChanged,
)


class Unit(Protocol):
    """A version (or a snapshot) to publish, as its records name it."""

    table_id: str
    table_uri: str
    version: int
    timestamp: CommitTimestamp
    count: int
    snapshot: bool


def envelope_encoder(unit: Unit) -> EnvelopeEncoder:
    """The action values' encoder of ``unit``: the envelope fields they all share."""
    return EnvelopeEncoder(
        table_id=unit.table_id,
        table_uri=unit.table_uri,
        version=unit.version,
        commit_timestamp=unit.timestamp.timestamp,
        commit_timestamp_source=str(unit.timestamp.source),
        count=unit.count,
        snapshot=unit.snapshot,
    )


def _about(unit: Unit) -> dict[str, Any]:
    """The fields every commits-topic record of a version starts with: whose, which, when."""
    return {
        "schema_version": SCHEMA_VERSION,
        "table_id": unit.table_id,
        "table_uri": unit.table_uri,
        "version": unit.version,
        "commit_timestamp": unit.timestamp.timestamp,
        "commit_timestamp_source": str(unit.timestamp.source),
    }


def commit_summary(unit: Unit, *, bytes_added: int, bytes_removed: int, **counts: Any) -> CommitSummary:
    """The commit summary of ``unit`` with its own ``counts`` (the fields of :class:`CommitSummary`
    past the envelope); byte sums are clamped to a long, as every Delta reader sums sizes."""
    return CommitSummary(
        **_about(unit),
        snapshot=unit.snapshot,
        action_count=unit.count,
        bytes_added=min(bytes_added, MAX_SUMMED_BYTES),
        bytes_removed=min(bytes_removed, MAX_SUMMED_BYTES),
        **counts,
    )


def schema_changed(unit: Unit, change: SchemaChange, previous: Metadata, current: Metadata) -> SchemaChanged:
    """The ``schemaChanged`` record of ``unit``'s version: ``change``, from ``previous`` to ``current``."""
    return SchemaChanged(
        **_about(unit),
        change_class=change.change_class,
        changes=[
            ColumnChangeEntry(
                change=c.change,
                change_class=c.change_class,
                column=list(c.column),
                before=c.before,
                after=c.after,
            )
            for c in change.changes
        ],
        previous_schema=previous.schema_string or "",
        schema=current.schema_string or "",
        previous_partition_columns=list(previous.partition_columns),
        partition_columns=list(current.partition_columns),
        properties={k: PropertyChange(before=b, after=a) for k, (b, a) in change.properties.items()},
    )


__all__ = ["Unit", "commit_summary", "envelope_encoder", "schema_changed"]
