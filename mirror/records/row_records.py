r"""The options of row changes and Debezium's transaction metadata (BEGIN/END), apart from the
row encoder (:mod:`deltamirror.mirror.records.row_changes`) so that both stay small; the bytes of
each format are :mod:`deltamirror.mirror.records.row_formats`'. Their records are
:class:`~.record.Record`\ s naming their topic (the changes or the transaction topic)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from deltamirror.core.schema import StructType

from .record import Record
from .row_formats import RegistrySettings, RowChangeSerializer, RowChangesFormat, row_change_serializer


@dataclass(frozen=True)
class RowChangesOptions:
    """What the encoder needs to know of a table; ``key_columns`` (any sequence, kept as a tuple)
    empty: the whole row is the key. ``row_ids``: the rows carry ``_row_id`` and
    ``_row_commit_version`` (row tracking), which are not part of a row's image; the key is then
    ``_row_id`` unless key columns are configured."""

    changes_topic: str
    transaction_topic: str
    table_name: str
    table_id: str
    key_columns: Sequence[str] = ()
    format: RowChangesFormat = "json"
    tombstones: bool = False
    row_ids: bool = False
    #: the Delta schema in force (the binary formats take their types from it; None: from Arrow)
    table_schema: StructType | None = field(default=None, compare=False)
    #: the Schema Registry of a registry-backed format (``avro``)
    registry: RegistrySettings | None = None
    #: the format's serializer, chosen once from ``format``
    serializer: type[RowChangeSerializer] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "key_columns", tuple(self.key_columns))
        object.__setattr__(self, "serializer", row_change_serializer(self.format))


def transaction_id(table_id: str, version: int) -> str:
    return f"{table_id}:{version}"


# --- transaction metadata ---------------------------------------------------------------------


def transaction_record(
    options: RowChangesOptions, version: int, ts_ms: int, event_count: int | None
) -> Record:
    """Debezium's transaction metadata: BEGIN (``event_count`` None) or END with the per-topic counts."""
    tid = transaction_id(options.table_id, version)
    payload: dict[str, Any] = {
        "status": "BEGIN" if event_count is None else "END",
        "id": tid,
        "event_count": event_count,
        "data_collections": None
        if event_count is None
        else [{"data_collection": options.changes_topic, "event_count": event_count}],
        "ts_ms": ts_ms,
    }
    key, value = options.serializer.transaction({"id": tid}, payload)
    return Record(value, key, None, options.transaction_topic)


__all__ = ["RowChangesOptions", "transaction_id", "transaction_record"]
