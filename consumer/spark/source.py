"""A Spark Structured Streaming source: a table's change data feed, read from its Kafka mirror.

The only module that imports pyspark. It is a Python data source (``pyspark.sql.datasource``) over
:mod:`deltamirror.consumer.mirror_changes`: the planner reads the commits topic to learn which
versions are wholly mirrored (:mod:`.planning` decides where the stream starts and how far
each micro-batch reads); each task reads a range of versions from the actions topic and turns them
into change rows from the table's data files (:mod:`.rows`). The rows are those delta-spark's
``readChangeFeed`` stream gives, with ``_change_type``, ``_commit_version`` and ``_commit_timestamp``.

>>> from deltamirror.consumer.spark.source import register
>>> register(spark)  # checks, on a worker, that Spark's Python workers can import deltamirror
>>> stream = (spark.readStream.format("deltamirror")
...           .option("kafka.bootstrap.servers", "127.0.0.1:9092")
...           .option("startingVersion", 0)
...           .load("s3://bucket/events"))

Options (``load(path)`` gives the table location; :mod:`.options` checks them, and refuses
by name any it does not read; docs/spark.md has the table of delta-spark's options):

``kafka.bootstrap.servers`` (required), ``kafka.<librdkafka setting>``
    The broker, and any other librdkafka consumer setting (``kafka.security.protocol``, ...),
    checked as the watcher's ``kafka:`` settings are.
``actionsTopic``, ``commitsTopic``
    The table's topics; default: the watcher's default names for the location.
``startingVersion``, ``startingTimestamp``
    Where the stream starts, as in delta-spark: a version (``latest``: only what is committed after
    the query starts), or the first commit at or after a timestamp. Without either, as in
    delta-spark, the first micro-batch is the table at the latest mirrored version, as inserts.
``maxFilesPerTrigger``, ``maxBytesPerTrigger``
    How much a micro-batch reads (default 1000 files, as delta-spark), in whole versions, at least
    one. Trigger.AvailableNow reads what was mirrored when the query started, in such batches.
``failOnDataLoss``
    ``false`` skips, with a warning, data files that are gone and versions gone from the mirror.
``versionsPerPartition``
    Versions read by one task (default 64).
``storage.<option>``
    fsspec storage options for reading the data files (credentials, endpoints).
``allowPathPrefixes``
    Locations outside the table root whose files the log names (a shallow clone's source),
    comma-separated, as ``--allow-path-prefix`` gives them to the CLI.
``onBadRecord``
    A record of the mirror the consumers' boundary refuses: ``stop`` (default: the query fails
    naming topic, partition and offset) or ``skip`` (a warning, and on).
``columns``
    The table columns to read, comma-separated (then the three change-feed columns): only they are
    decoded from the data files. Spark's column pruning does not reach a Python data source (its
    scan builder pushes filters only), so a ``select`` alone still reads every column. A name the
    table does not have fails the query at ``load`` with one line naming it.
``rowIds``
    ``true``: also ``_row_id`` and ``_row_commit_version`` after the change-feed columns, the values
    delta-spark's ``_metadata.row_id`` / ``_metadata.row_commit_version`` give (tables with row
    tracking only; refused at ``load`` otherwise). They come from the data files, never from change
    data files: a version with change data files is read from its data files, matched by row id.
``netChanges``, ``keyColumns``
    ``netChanges`` ``true``: each micro-batch gives the net changes of its versions (as
    ``deltamirror changes --net``): per row, told apart by ``keyColumns`` (comma-separated, unique
    per row at every version), with ``rowIds`` and no ``keyColumns`` by ``_row_id``, or else by all
    its values, what the batch's versions did to it. The
    micro-batch is read by one task, and its change rows are held in memory while netted.

``schemaTrackingLocation`` (or ``schemaLocation``), ``streamingSourceTrackingId``,
``allowSourceColumnRename``, ``allowSourceColumnDrop``
    A local folder for the stream's schema tracking log (:mod:`.schema_log`), under the query's
    checkpoint, as delta-spark's: the stream reads with the schema tracked there, fails once
    (DELTA_STREAMING_METADATA_EVOLUTION) at each version that changes it after recording the new
    one, and goes on past a tracked rename or drop once the option for it is ``always`` or the
    change's version (else DELTA_STREAMING_CANNOT_CONTINUE_PROCESSING_POST_SCHEMA_EVOLUTION).

A schema change after the stream started fails the query (DELTA_SCHEMA_CHANGED_WITH_VERSION), as
delta-spark's does: restart it to read with the new schema. Without a tracking log, a column renamed
or dropped under column mapping across the versions read fails it
(DELTA_STREAMING_INCOMPATIBLE_SCHEMA_CHANGE_USE_SCHEMA_LOG), as in delta-spark.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxFiles,
    SupportsTriggerAvailableNow,
)

from deltamirror.core.changes import CDF_COLUMNS, ReadSchema, net_changes
from deltamirror.core.errors import InvalidArgumentError
from deltamirror.core.models import Metadata
from deltamirror.mirror.kafka.login_check import refuse_wrong_credentials

from ..mirror_changes import MirrorIndex, read_mirror_versions
from . import planning, workers
from .options import SourceOptions
from .rows import change_rows, feed_schema, snapshot_rows
from .schema_log import SchemaLog, check_unblocked, evolved, same_shape, tracking_folder

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType as SparkStructType

FORMAT = "deltamirror"


def register(spark: SparkSession) -> None:
    """Make ``spark.readStream.format("deltamirror")`` available in ``spark``.

    First checks that Spark's Python workers can import this module (see :func:`check_workers`):
    otherwise every micro-batch would fail later, deep inside a task, with a worker traceback.
    """
    check_workers(spark)
    spark.dataSource.register(DeltaMirrorSource)


def check_workers(spark: SparkSession) -> None:
    """Fail with one line unless Spark's Python workers can import what the source's tasks import.

    Runs a one-task job once per SparkContext (see :mod:`deltamirror.consumer.spark.workers`).
    """
    workers.check_workers(spark, _probe_with_udf)


def _probe_with_udf(spark: SparkSession, probe: workers.Probe) -> workers.ProbeResult:
    """The probe in a one-row query: with Spark Connect, only the DataFrame API reaches the workers."""
    import json

    from pyspark.sql.functions import lit, udf

    as_json = udf(lambda x: json.dumps(probe(x)), "string", useArrow=False)
    row = spark.range(1, numPartitions=1).select(as_json(lit(0)).alias("probe")).first()
    assert row is not None
    interpreter, module, error = json.loads(row["probe"])
    return interpreter, module, error


class DeltaMirrorSource(DataSource):
    """``format("deltamirror")``: the change data feed of a table, from its Kafka mirror (streaming only)."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self._parsed = SourceOptions.parse(options)
        # the read schema is the table's latest when the query starts, as delta-spark's
        table = self._parsed.table()
        snapshot = table.snapshot()
        snapshot.check_readable()
        self._read = ReadSchema(snapshot.metadata, snapshot.version)
        self._log: SchemaLog | None = None
        location = self._parsed.schema_tracking_location
        if location is not None:
            # with a schema tracking log, the stream reads with the schema it holds last
            uri = self._parsed.settings.table_uri
            folder = tracking_folder(location, uri)
            self._log = SchemaLog.at(folder, snapshot.metadata.id, self._parsed.tracking_id, uri)
            entries = self._log.entries()
            if entries:
                check_unblocked(entries, dict(self._parsed.unblock), uri)
                self._read = ReadSchema(entries[-1].metadata, entries[-1].version)
        # the columns option as the read schema names them: an unknown one fails here, at load()
        self._schema = feed_schema(table, self._read, self._parsed.columns, self._parsed.row_ids)
        feed_columns = 5 if self._parsed.row_ids else 3  # the CDF columns (and the row ids) follow
        self._columns = None if self._parsed.columns is None else tuple(self._schema.names[:-feed_columns])
        if self._parsed.net_changes:
            _check_net(self._schema, self._parsed.key_columns, self._parsed.settings.table_uri)

    def schema(self) -> SparkStructType:
        return from_arrow_schema(self._schema)

    def streamReader(self, schema: SparkStructType) -> DataSourceStreamReader:
        return MirrorChangeStreamReader(self._parsed, self._read, self._columns, self._log)


def _check_net(schema: pa.Schema, keys: Sequence[str] | None, table: str) -> None:
    """Refuse at ``load()`` what netting the rows would refuse in a task: a key column not read,
    or, without keys, a column of a nested type (a row is then told apart by all its values)."""
    if keys is not None:
        missing = [k for k in keys if k not in schema.names or k in CDF_COLUMNS]
        if missing:
            raise InvalidArgumentError(
                f"option keyColumns names {', '.join(map(repr, missing))}, not a column read "
                f"(columns: {', '.join(n for n in schema.names if n not in CDF_COLUMNS)})",
                table=table,
            )
        net_changes(schema.empty_table(), keys, table=table)  # a nested key column: refused by name
        return
    nested = [f.name for f in schema if f.name not in CDF_COLUMNS and pa.types.is_nested(f.type)]
    if nested:
        raise InvalidArgumentError(
            f"option netChanges without keyColumns tells rows apart by all their values, and column "
            f"{nested[0]!r} is nested: give keyColumns (or columns without it)",
            table=table,
        )


@dataclass(frozen=True)
class _SnapshotPartition(InputPartition):
    version: int
    timestamp_ms: int


@dataclass(frozen=True)
class _VersionsPartition(InputPartition):
    start: int
    end: int
    start_timestamp_ms: int
    table_id: str
    kafka_partition: int


@dataclass(frozen=True)
class _NetPartition(InputPartition):
    """A whole micro-batch, read by one task and netted (``netChanges``)."""

    parts: tuple[_SnapshotPartition | _VersionsPartition, ...]


class MirrorChangeStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans micro-batches from the commits topic (driver) and reads them (tasks).

    Only the options and the read schema travel to the tasks; the commits-topic index stays in the
    planner process, where Spark keeps this object between micro-batches.
    """

    def __init__(
        self,
        options: SourceOptions,
        read: ReadSchema,
        columns: Sequence[str] | None = None,
        log: SchemaLog | None = None,
    ) -> None:
        self._options = options
        #: the schema tracking log (``schemaTrackingLocation``), None without one
        self._log = log
        #: the table columns read (None: all), as the read schema names them
        self._columns = None if columns is None else tuple(columns)
        self._read_metadata = read.metadata.model_dump_json(by_alias=True, exclude_none=True)
        self._read_version = read.version
        self._index: MirrorIndex | None = None
        #: with Trigger.AvailableNow: the last version the query reads, fixed when it starts
        self._target: int | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_index"] = None
        return state

    @property
    def _uri(self) -> str:
        return self._options.settings.table_uri

    def _mirror(self) -> MirrorIndex:
        if self._index is None:
            settings = self._options.settings
            # a wrong password: the query fails now with one line, not after a 30 s metadata timeout
            refuse_wrong_credentials(
                {**settings.kafka_config, "bootstrap.servers": settings.bootstrap_servers}
            )
            self._index = MirrorIndex(settings)
        self._index.refresh()
        return self._index

    def _read_schema(self) -> ReadSchema:
        return ReadSchema(Metadata.model_validate_json(self._read_metadata), self._read_version)

    # --- planning (driver) ---

    def initialOffset(self) -> dict[str, Any]:
        index, read = self._mirror(), self._read_schema()
        if self._log is None or self._log.latest() is not None:
            return planning.initial_offset(self._options, index, read)
        # a new tracking log starts with the schema of the version the stream starts at; if that is
        # not the one the query was loaded with, the query fails once, as delta-spark's does
        offset = planning.initial_offset(self._options, index, None)
        table = self._options.table()
        version = min(int(offset["version"]), max(table.latest_version(), index.latest or 0))
        metadata = planning.metadata_at(table, version)
        self._log.append(version, metadata)
        if not same_shape(metadata, read.metadata):
            raise evolved(read.version, metadata, version, self._uri)
        return offset

    def getDefaultReadLimit(self) -> ReadLimit:
        """delta-spark's: maxFilesPerTrigger (1000 unless only maxBytesPerTrigger is set), else the bytes.

        Spark's Python API takes one limit; with both options, latestOffset applies the other too.
        """
        files, size = self._options.read_limit()
        if files is not None:
            return ReadMaxFiles(files)
        assert size is not None
        return ReadMaxBytes(size)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._mirror().latest

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit | None = None) -> dict[str, Any]:
        """The end of the next micro-batch: whole versions up to the limit (delta-spark's admission
        control); ReadAllAvailable (Trigger.Once) reads everything there is."""
        bounds: planning.Limit | None
        if limit is None or isinstance(limit, ReadAllAvailable):
            bounds = None
        elif isinstance(limit, ReadMaxFiles):
            bounds = (limit.max_files, self._options.max_bytes_per_trigger)
        elif isinstance(limit, ReadMaxBytes):
            bounds = (self._options.max_files_per_trigger, limit.max_bytes)
        else:
            raise InvalidArgumentError(
                f"[DELTA_UNKNOWN_READ_LIMIT] read limit {limit!r} is not supported", table=self._uri
            )
        end = planning.next_offset(self._mirror(), start, target=self._target, limit=bounds)
        return end if self._log is None else self._tracked_end(start, end)

    def _tracked_end(self, start: dict[str, Any], end: dict[str, Any]) -> dict[str, Any]:
        """With a schema tracking log, a micro-batch ends before a version whose schema is not the
        read schema; a batch that would start at one records it in the log and fails the query."""
        assert self._log is not None and self._index is not None
        first = int(start["version"])
        read = self._read_schema()
        change = planning.next_schema_change(
            self._index,
            self._options.table,
            read,
            first + 1 if start.get("snapshot") else first,
            int(end["version"]),
        )
        if change is None:
            return end
        version, metadata = change
        if version > first or start.get("snapshot"):
            return {"version": version}
        self._log.append(version, metadata)
        raise evolved(read.version, metadata, version, self._uri)

    def reportLatestOffset(self) -> dict[str, Any] | None:
        latest = self._index.latest if self._index is not None else None
        return None if latest is None else {"version": latest + 1}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        index = self._mirror()
        parts: list[InputPartition] = []
        first = int(start["version"])
        if start.get("snapshot"):
            parts.append(_SnapshotPartition(first, index.timestamp(first)))
            first += 1
        last = int(end["version"]) - 1
        if first > last:
            return self._netted(parts)
        runs = planning.readable_runs(index, first, last, fail_on_data_loss=self._options.fail_on_data_loss)
        if not runs:
            return self._netted(parts)
        assert index.table_id is not None
        kafka_partition = index.actions_partition()
        step = self._options.versions_per_partition
        for run_first, run_last in runs:
            for lo in range(run_first, run_last + 1, step):
                hi = min(lo + step - 1, run_last)
                parts.append(_VersionsPartition(lo, hi, index.timestamp(lo), index.table_id, kafka_partition))
        return self._netted(parts)

    def _netted(self, parts: list[InputPartition]) -> list[InputPartition]:
        """With ``netChanges``, the micro-batch as one partition: a row's changes may span them all."""
        if not self._options.net_changes or not parts:
            return parts
        return [
            _NetPartition(tuple(p for p in parts if isinstance(p, _SnapshotPartition | _VersionsPartition)))
        ]

    def commit(self, end: dict[str, Any]) -> None:
        if self._index is not None:
            self._index.forget_before(int(end["version"]))

    def stop(self) -> None:
        if self._index is not None:
            self._index.close()
            self._index = None

    # --- reading (tasks) ---

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, _NetPartition):
            rows = [batch for part in partition.parts for batch in self._read(part)]
            if rows:
                net = net_changes(rows, self._options.key_columns, table=self._uri)
                yield from net.to_batches()
            return
        yield from self._read(partition)

    def _read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        table = self._options.table()
        read = self._read_schema()
        if isinstance(partition, _SnapshotPartition):
            yield from snapshot_rows(
                table, read, partition.version, partition.timestamp_ms, self._columns, self._options.row_ids
            )
            return
        assert isinstance(partition, _VersionsPartition)
        versions = read_mirror_versions(
            self._options.settings,
            table_id=partition.table_id,
            partition=partition.kafka_partition,
            start=partition.start,
            end=partition.end,
            start_timestamp_ms=partition.start_timestamp_ms,
            skip_lost=not self._options.fail_on_data_loss,
        )
        yield from change_rows(
            table,
            read,
            versions,
            fail_on_data_loss=self._options.fail_on_data_loss,
            columns=self._columns,
            row_ids=self._options.row_ids,
        )


__all__ = ["FORMAT", "DeltaMirrorSource", "MirrorChangeStreamReader", "check_workers", "register"]
