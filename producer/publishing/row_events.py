"""The row changes of what the watcher publishes: a version's change rows, or a snapshot's rows.

Rows come from core's readers only: a version's through :func:`~deltamirror.core.changes.changes_from_actions`
(the same per-version rules as ``read_changes``, with the actions the watcher validated and the
commit timestamp it resolved), a snapshot's through :meth:`Snapshot.iter_batches`; both open data
files through the table's storage, with its path containment. A version that changes files while
its metaData does not record the change data feed stops the table (its row changes cannot be told
apart from file rewrites: never guessed, never skipped).

The rows of a unit are read in Arrow batches; the records of a version are a deterministic stream
(:class:`~deltamirror.mirror.records.row_changes.VersionRows`), so a transaction can end in its middle and
a restart skip the records the committed progress counts (``Position.row_offset``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import pyarrow as pa

from deltamirror.core.changes import (
    CDF_COLUMNS,
    ReadSchema,
    VersionActions,
    changes_from_actions,
    check_change_metadata,
    net_changes,
    read_changes,
)
from deltamirror.core.errors import ConfigError
from deltamirror.core.models import Metadata
from deltamirror.core.row_tracking import ROW_ID, row_tracking_enabled, snapshot_batches_with_row_ids
from deltamirror.mirror.records.row_changes import RowChangesOptions, VersionRows
from deltamirror.mirror.records.row_formats import RegistrySettings, row_change_serializer
from deltamirror.mirror.topic_names import TableTopics, table_name

from ..settings import PerTableSettings, RowChangesConfig, TableConfig
from ..tailing.snapshot_events import SnapshotWork
from ..tailing.work import CommitWork, PublishUnit, iter_raw_actions
from .row_transform import RowTransform

if TYPE_CHECKING:
    from deltamirror.core.table import DeltaTable

#: change rows read (and encoded) at a time: what a version's row changes hold in memory
ROWS_PER_BATCH = 8192
#: about how many bytes of spilled update images a byte of change data files makes (Parquet is
#: compressed, the images are JSON text): only the first guess of the bucket count
IMAGE_BYTES_PER_CDC_BYTE = 4


def _registry_settings(config: RowChangesConfig) -> RegistrySettings | None:
    r = config.registry
    if r is None:
        return None
    return RegistrySettings(
        url=r.url,
        username=r.username,
        password=r.password,
        subject_name_strategy=r.subject_name_strategy,
        auto_register=r.auto_register,
    )


def check_registries(tables: Sequence[PerTableSettings]) -> None:
    """Refuse (ConfigError, exit 2) at start a Schema Registry that refuses the configured
    credentials (``row_changes.registry.username`` / ``password``) of a table or discover prefix,
    or calls without any: one read per registry. One that cannot be reached is left to the first
    record, which retries."""
    checked: set[RegistrySettings] = set()
    for table in tables:
        config = table.row_changes
        if config is None or not config.enabled or config.registry is None:
            continue
        settings = _registry_settings(config)
        if settings is None or settings in checked:
            continue
        checked.add(settings)
        row_change_serializer(config.format)  # its libraries installed (else a ConfigError naming them)
        from deltamirror.mirror.records.registry_clients import check_registry_access

        check_registry_access(settings)


#: actions that decide a version's change rows (the others are not decoded)
_ROW_ACTIONS = frozenset({"add", "remove", "cdc", "commitInfo", "metaData", "protocol"})


class RowChangesSource:
    """One table's row changes: which rows each unit of work has, and the options they are encoded with."""

    def __init__(
        self,
        table: DeltaTable,
        config: RowChangesConfig,
        topics: TableTopics,
        table_name: str,
        *,
        batch_size: int = ROWS_PER_BATCH,
    ) -> None:
        self.table = table
        self.config = config
        self.topics = topics
        self.table_name = table_name
        self.batch_size = batch_size
        #: where pairing spills update images (None: the system's temporary directory)
        self.spill_dir: str | None = None
        #: the rows and columns the events carry (None: all of them, as they are)
        self.transform = RowTransform.of(config, table=table.uri)
        #: the Schema Registry of a registry-backed format (None: a JSON format)
        self.registry = _registry_settings(config)

    @classmethod
    def of_table(cls, config: TableConfig, table: DeltaTable, topics: TableTopics) -> RowChangesSource | None:
        """The row changes a table's configuration asks for (None: off)."""
        if config.row_changes is None or not config.row_changes.enabled:
            return None
        return cls(table, config.row_changes, topics, table_name(config.normalized_uri, config.topic_name))

    def options(self, table_id: str, metadata: Metadata | None = None) -> RowChangesOptions:
        """The options of a unit's records; ``metadata`` (in force at the unit) decides the key: the
        configured key columns, else the row id on a table with row tracking, else the whole row."""
        row_ids = self.keyed_by_row_id(metadata)
        return RowChangesOptions(
            changes_topic=self.topics.changes,
            transaction_topic=self.topics.transaction,
            table_name=self.table_name,
            table_id=table_id,
            key_columns=(ROW_ID,) if row_ids else self.config.key_columns,
            format=self.config.format,
            tombstones=self.config.tombstones,
            row_ids=row_ids,
            table_schema=metadata.table_schema if metadata is not None else None,
            registry=self.registry,
        )

    def keyed_by_row_id(self, metadata: Metadata | None) -> bool:
        """No key columns configured, and the table has row tracking enabled."""
        return not self.config.key_columns and metadata is not None and row_tracking_enabled(metadata)

    def rows_of(self, unit: PublishUnit) -> VersionRows:
        """The records of ``unit``'s row changes (a version's change feed, or a snapshot as ``"r"``)."""
        if isinstance(unit, SnapshotWork):
            snap = unit.snap
            options = self.options(unit.table_id, snap.metadata)
            row_ids = options.row_ids
            self._check_key(options, list(snap.schema.names), unit.version)
            transform, version = self.transform, unit.version

            def snapshot_batches() -> Iterator[pa.RecordBatch]:
                rows = snapshot_batches_with_row_ids(snap) if row_ids else snap.iter_batches()
                for batch in rows:
                    if batch.num_rows:
                        batch = batch.append_column("_change_type", pa.repeat("insert", batch.num_rows))
                        yield (
                            transform.apply(batch, version, row_ids=row_ids)
                            if transform is not None
                            else batch
                        )

            return VersionRows(
                options,
                snapshot_batches,
                version=unit.version,
                ts_ms=unit.timestamp.timestamp,
                op_override="r",
                snapshot=lambda last: "last" if last else "true",
                may_have_updates=False,
            )
        metadata = unit.metadata
        if metadata is None:  # the watcher always knows it; a unit built elsewhere must say it
            raise ConfigError("row changes need the metaData in force at each version", table=self.table.uri)
        options = self.options(unit.table_id, metadata)
        row_ids = options.row_ids
        summary = unit.scan.summary
        self._check_key(options, metadata.table_schema.names, unit.version)
        has_rows = summary.adds + summary.removes + summary.cdc > 0
        if has_rows:  # a version that changes no file (a property set, the feed turned on) has no rows
            read = ReadSchema(metadata, unit.version)
            check_change_metadata(read, metadata, unit.version, table=self.table.uri, start=unit.version)

        decoded: list[VersionActions] = []

        def version_batches() -> Iterator[pa.RecordBatch]:
            if not has_rows:
                return iter(())
            if not decoded:  # once: a keyed version's rows are read twice (to pair its updates)
                actions = _decoded_actions(self.table, unit)
                decoded.append(VersionActions(unit.version, unit.timestamp.timestamp, actions))
            feed = changes_from_actions(
                self.table, metadata, unit.version, decoded, batch_size=self.batch_size, row_ids=row_ids
            )
            transform = self.transform
            if transform is None:
                return iter(feed)
            return (transform.apply(batch, unit.version, row_ids=row_ids) for batch in feed)

        return VersionRows(
            options,
            version_batches,
            version=unit.version,
            ts_ms=unit.timestamp.timestamp,
            may_have_updates=summary.cdc > 0,  # update images only come from change data files
            pairing_memory_bytes=self.config.pairing_memory_mb * 1024 * 1024,
            expected_image_bytes=summary.bytes_cdc * IMAGE_BYTES_PER_CDC_BYTE,
            spill_dir=self.spill_dir,
        )

    def net_rows_of(self, unit: CommitWork, first: int) -> VersionRows:
        """The records of the net row changes of versions ``first`` to ``unit``'s (a net catch-up).

        Core's change feed over the range, netted by the key columns (by the row id on a table with
        row tracking and no key columns, by whole rows otherwise,
        :func:`~deltamirror.core.changes.net_changes`), then filtered and masked like any row
        events. The events carry ``unit``'s version and commit time (the state they lead to), in one
        BEGIN/END block of that version. The range's rows are held in Arrow while netting.
        """
        metadata = unit.metadata
        assert metadata is not None  # the watcher always knows it
        return self.net_rows_between(unit.table_id, metadata, first, unit.version, unit.timestamp.timestamp)

    def net_rows_between(
        self,
        table_id: str,
        metadata: Metadata,
        first: int,
        version: int,
        ts_ms: int,
        *,
        backfill: bool = False,
    ) -> VersionRows:
        """The net row changes of versions ``first`` to ``version`` (see :meth:`net_rows_of`).

        ``backfill`` (a ``net-changes`` signal): the events are marked as a snapshot's are
        (``snapshot`` ``true``, ``last`` on the block's last one), their ``op`` kept. Range,
        feature and schema errors (no change data feed over the range) are raised here, before
        anything is published.
        """
        options = self.options(table_id, metadata)
        row_ids = options.row_ids
        # keyed as the per-version events are: configured keys, else the row id (row tracking)
        keys = [ROW_ID] if row_ids else (self.config.key_columns or None)
        feed = read_changes(
            self.table,
            starting_version=first,
            ending_version=version,
            batch_size=self.batch_size,
            row_ids=row_ids,
        )
        self._check_key(options, [n for n in feed.schema.names if n not in CDF_COLUMNS], version)
        net = net_changes(feed, keys, schema=feed.schema, table=self.table.uri)
        transform = self.transform
        batches = [
            transform.apply(b, version, row_ids=row_ids) if transform is not None else b
            for b in net.to_batches(max_chunksize=self.batch_size)
            if b.num_rows
        ]
        return VersionRows(
            options,
            lambda: iter(batches),
            version=version,
            ts_ms=ts_ms,
            snapshot=(lambda last: "last" if last else "true") if backfill else None,
            may_have_updates=keys is not None,  # netted updates are paired by key only
            pairing_memory_bytes=self.config.pairing_memory_mb * 1024 * 1024,
            spill_dir=self.spill_dir,
        )

    def _check_key(self, options: RowChangesOptions, columns: list[str], version: int) -> None:
        if self.transform is not None:
            self.transform.check_names(columns, version)
        missing = [c for c in options.key_columns if c not in columns and not options.row_ids]
        if missing:
            raise ConfigError(
                f"row_changes.key_columns names {', '.join(map(repr, missing))}, not a column of the table "
                f"(columns: {', '.join(columns)})",
                table=self.table.uri,
                version=version,
            )


def _decoded_actions(table: DeltaTable, unit: CommitWork) -> list[tuple[str, dict[str, object]]]:
    """The version's actions that decide its rows, decoded (their lines were validated by the scan)."""
    out: list[tuple[str, dict[str, object]]] = []
    for name, body in iter_raw_actions(table.storage, unit.version, unit.scan):
        if name in _ROW_ACTIONS:
            out.append((name, json.loads(body) if isinstance(body, bytes | bytearray) else body))
    return out


__all__ = ["ROWS_PER_BATCH", "RowChangesSource"]
