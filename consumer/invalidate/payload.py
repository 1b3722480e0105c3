"""The document of one version (or of a re-created table), as receivers get it.

Lists are capped (``max_items``, :data:`DEFAULT_MAX_ITEMS` by default): a longer list is cut, its
``...Truncated`` flag set and its ``...Count`` the full length, so that a receiver knows to drop
the whole table rather than trust a partial list, and a body never grows without bound. A
snapshot's ``added`` names every active file: usually truncated.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from deltamirror.mirror.records.events import SchemaChanged

from ..snapshot import Invalidation, TableReplacement

#: the longest list a document carries (paths added, paths removed, partitions)
DEFAULT_MAX_ITEMS = 1000

Payload = dict[str, Any]


def _capped(items: Sequence[Any], limit: int) -> tuple[list[Any], bool]:
    return list(items[:limit]), len(items) > limit


def version_payload(
    invalidation: Invalidation,
    *,
    table_uri: str | None,
    commit_timestamp: int | None,
    operation: str | None,
    max_items: int = DEFAULT_MAX_ITEMS,
) -> Payload:
    """The document of one applied version (``kind`` ``version``); lists cut at ``max_items``.

    ``operation`` is the version's ``commitInfo.operation`` (``SNAPSHOT`` for a snapshot, None when
    the writer recorded none); ``commitTimestamp`` is epoch ms, as the watcher resolved it.
    """
    added, added_cut = _capped(invalidation.added, max_items)
    removed, removed_cut = _capped(invalidation.removed, max_items)
    partitions, partitions_cut = _capped(invalidation.partitions, max_items)
    return {
        "kind": "version",
        "tableId": invalidation.table_id,
        "tableUri": table_uri,
        "version": invalidation.version,
        "snapshot": invalidation.snapshot,
        "commitTimestamp": commit_timestamp,
        "operation": "SNAPSHOT" if invalidation.snapshot else operation,
        "files": invalidation.files,
        "partitions": [dict(p) for p in partitions],
        "partitionsCount": len(invalidation.partitions),
        "partitionsTruncated": partitions_cut,
        "added": added,
        "addedCount": len(invalidation.added),
        "addedTruncated": added_cut,
        "removed": removed,
        "removedCount": len(invalidation.removed),
        "removedTruncated": removed_cut,
        "truncated": added_cut or removed_cut or partitions_cut,
    }


def replacement_payload(notice: TableReplacement) -> Payload:
    """The document of a re-created table (``kind`` ``tableReplaced``): drop all of ``previousTableId``;
    of a dropped one (``kind`` ``tableDropped``): drop all of ``tableId``."""
    if notice.dropped:
        return {
            "kind": "tableDropped",
            "tableId": notice.table_id,
            "tableUri": notice.table_uri,
            "lastVersion": notice.previous_version,
            "reason": notice.reason,
            "droppedVersion": notice.dropped_version,
            "droppedFiles": notice.dropped_files,
        }
    return {
        "kind": "tableReplaced",
        "tableId": notice.table_id,
        "tableUri": notice.table_uri,
        "previousTableId": notice.previous_table_id,
        "previousVersion": notice.previous_version,
        "reason": notice.reason,
        "droppedVersion": notice.dropped_version,
        "droppedFiles": notice.dropped_files,
    }


def schema_payload(record: SchemaChanged, *, max_items: int = DEFAULT_MAX_ITEMS) -> Payload:
    """The document of a schema change (``kind`` ``schemaChanged``): the version, its class and its
    changes (cut at ``max_items``); the schemas themselves are left to the table (or the commits
    topic's record), since a wide table's would make every body large."""
    changes, cut = _capped(record.changes, max_items)
    return {
        "kind": "schemaChanged",
        "tableId": record.table_id,
        "tableUri": record.table_uri,
        "version": record.version,
        "commitTimestamp": record.commit_timestamp,
        "changeClass": record.change_class,
        "changes": [c.model_dump(by_alias=True, exclude_none=True) for c in changes],
        "changesCount": len(record.changes),
        "changesTruncated": cut,
        "previousPartitionColumns": list(record.previous_partition_columns),
        "partitionColumns": list(record.partition_columns),
    }


def delivery_id(payload: Mapping[str, Any]) -> str:
    """The same text for every delivery of the same document (receivers deduplicate with it)."""
    if payload.get("kind") == "schemaChanged":
        return f"{payload['tableId']}:{payload['version']}:schema"
    if payload.get("kind") == "tableReplaced":
        return f"{payload['previousTableId']}:replaced:{payload['tableId']}"
    if payload.get("kind") == "tableDropped":
        return f"{payload['tableId']}:dropped"
    suffix = ":snapshot" if payload.get("snapshot") else ""
    return f"{payload['tableId']}:{payload['version']}{suffix}"


def describe(payload: Mapping[str, Any]) -> str:
    """The document in words, for logs and errors."""
    if payload.get("kind") == "tableReplaced":
        return f"the replacement of table {payload['previousTableId']} by {payload['tableId']}"
    if payload.get("kind") == "tableDropped":
        return f"the drop of table {payload['tableId']}"
    if payload.get("kind") == "schemaChanged":
        return f"the schema change of table {payload['tableId']} at version {payload['version']}"
    what = "snapshot" if payload.get("snapshot") else "version"
    return f"{what} {payload['version']} of table {payload['tableId']}"


__all__ = [
    "DEFAULT_MAX_ITEMS",
    "Payload",
    "delivery_id",
    "describe",
    "replacement_payload",
    "schema_payload",
    "version_payload",
]
