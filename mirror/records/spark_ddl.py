"""Spark DDL for the topics' JSON values, for Spark's own Kafka source: ``from_json(value, DDL)``.

Strings only (no pyspark here): a Spark job that reads the topics with ``format("kafka")`` imports
them, or copies them into a job that does not install deltamirror. Each DDL names every field of
its record; ``from_json`` leaves a field the record lacks null and ignores fields the DDL does not
name, so a newer watcher adding optional fields does not break a job (the compatibility policy of
:mod:`.events`).

- :data:`ACTIONS_DDL`: an actions-topic value (:class:`~.events.ActionEvent`). ``action`` is kept
  as its JSON text (a STRING field takes an object's text in ``from_json``); parse it with
  :data:`ADD_ACTION_DDL` / :data:`REMOVE_ACTION_DDL` for ``type = 'add'`` / ``'remove'``.
- :data:`COMMITS_DDL`: a commits-topic value, every kind (``kind`` tells them apart).
- :func:`row_changes_ddl`: a changes-topic value for a table's schema; its key with
  :func:`row_changes_key_ddl`; :data:`TRANSACTION_DDL` for the transaction topic (Debezium's
  BEGIN/END records).

The changes envelope depends on the table's columns, so it is built from the table's Delta schema
(``metaData.schemaString`` or :class:`~deltamirror.core.schema.StructType`), by the class of the
table's format (:mod:`.row_formats`: one class per format, each with its DDL; the lookup is the
one registry of formats). Its column types are the types of the values on the wire (see
:mod:`.row_changes` and :mod:`.spark_types`), which Spark parses without loss: dates are INT days
since the epoch (``date_from_unix_date``), timestamps BIGINT microseconds (``timestamp_micros``),
binary BINARY (the base64 text is decoded by ``from_json``), decimals DECIMAL(p,s) from their exact
text, maps with string keys MAP<STRING, …> and other maps their ``[[key, value], …]`` pairs as
ARRAY<ARRAY<STRING>> (each element's JSON text).
"""

from __future__ import annotations

from collections.abc import Sequence

from deltamirror.core.row_tracking import ROW_ID
from deltamirror.core.schema import PrimitiveType, StructField, StructType
from deltamirror.core.schema_types import parse_schema

from .row_formats import RowChangesFormat, row_change_serializer
from .spark_types import quote

ACTIONS_DDL = (
    "schemaVersion INT, tableId STRING, tableUri STRING, version BIGINT, commitTimestamp BIGINT, "
    "commitTimestampSource STRING, count BIGINT, snapshot BOOLEAN, `index` BIGINT, snapshotEnd BOOLEAN, "
    "type STRING, action STRING"
)

_DV_DDL = (
    "STRUCT<storageType: STRING, pathOrInlineDv: STRING, `offset`: INT, sizeInBytes: INT, cardinality: BIGINT, "
    "maxRowIndex: BIGINT>"
)

#: the ``action`` of an ``add`` event (Delta's field names; ``stats`` stays JSON text)
ADD_ACTION_DDL = (
    "path STRING, partitionValues MAP<STRING, STRING>, size BIGINT, modificationTime BIGINT, "
    f"dataChange BOOLEAN, stats STRING, tags MAP<STRING, STRING>, deletionVector {_DV_DDL}, "
    "baseRowId BIGINT, defaultRowCommitVersion BIGINT, clusteringProvider STRING"
)

#: the ``action`` of a ``remove`` event
REMOVE_ACTION_DDL = (
    "path STRING, deletionTimestamp BIGINT, dataChange BOOLEAN, extendedFileMetadata BOOLEAN, "
    f"partitionValues MAP<STRING, STRING>, size BIGINT, stats STRING, tags MAP<STRING, STRING>, "
    f"deletionVector {_DV_DDL}, baseRowId BIGINT, defaultRowCommitVersion BIGINT"
)

#: commit summaries, heartbeats, table-replaced and table-dropped records in one shape (``kind`` says which)
COMMITS_DDL = (
    "kind STRING, schemaVersion INT, tableId STRING, tableUri STRING, version BIGINT, commitTimestamp BIGINT, "
    "commitTimestampSource STRING, snapshot BOOLEAN, actionCount BIGINT, operation STRING, readVersion BIGINT, "
    "isBlindAppend BOOLEAN, adds BIGINT, removes BIGINT, cdcFiles BIGINT, bytesAdded BIGINT, bytesRemoved BIGINT, "
    "partitionsTouched ARRAY<MAP<STRING, STRING>>, partitionsTouchedTruncated BOOLEAN, metadataChanged BOOLEAN, "
    "protocolChanged BOOLEAN, latestVersion BIGINT, heartbeatTimestamp BIGINT, previousTableId STRING, "
    "previousVersion BIGINT, lastVersion BIGINT, reason STRING, detectedAt BIGINT"
)

#: Debezium's transaction metadata (BEGIN / END of a Delta version) on the transaction topic
TRANSACTION_DDL = (
    "status STRING, id STRING, event_count BIGINT, "
    "data_collections ARRAY<STRUCT<data_collection: STRING, event_count: BIGINT>>, ts_ms BIGINT"
)
TRANSACTION_KEY_DDL = "id STRING"


def _schema(schema: StructType | str) -> StructType:
    return parse_schema(schema) if isinstance(schema, str) else schema


def row_changes_ddl(schema: StructType | str, *, fmt: RowChangesFormat = "json") -> str:
    """The DDL of a changes-topic value for a table whose Delta schema is ``schema``.

    ``schema``: the ``metaData.schemaString`` (JSON text) or a parsed ``StructType``. ``fmt``: the
    table's ``row_changes.format``, whose class says the DDL (:mod:`.row_formats`). With
    ``"json-schema"`` (records with an inline Connect schema) the envelope is under ``payload`` and
    decimals are BINARY (two's-complement unscaled bytes: JsonConverter's format); the plain ``json``
    format is the one to read from Spark. Another format is a ValueError.
    """
    return row_change_serializer(fmt).value_ddl(_schema(schema))


def row_changes_key_ddl(
    schema: StructType | str,
    key_columns: Sequence[str] = (),
    *,
    fmt: RowChangesFormat = "json",
    row_tracking: bool = False,
) -> str:
    """The DDL of a changes-topic key: the key columns; when none are configured, ``_row_id`` on a
    table with row tracking (``row_tracking``: ``delta.enableRowTracking`` is on), else the whole row."""
    parsed = _schema(schema)
    if key_columns:
        fields = parsed.select(key_columns)
    elif row_tracking:
        fields = StructType(fields=(StructField(name=ROW_ID, type=PrimitiveType(name="long")),))
    else:
        fields = parsed
    return row_change_serializer(fmt).key_ddl(fields)


__all__ = [
    "ACTIONS_DDL",
    "ADD_ACTION_DDL",
    "COMMITS_DDL",
    "REMOVE_ACTION_DDL",
    "TRANSACTION_DDL",
    "TRANSACTION_KEY_DDL",
    "quote",
    "row_changes_ddl",
    "row_changes_key_ddl",
]
