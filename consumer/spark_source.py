"""A Spark Structured Streaming source: a table's change data feed, read from its Kafka mirror.

The only module that imports pyspark. It is a Python data source (``pyspark.sql.datasource``) over
:mod:`deltamirror.consumer.mirror_changes`: the planner reads the commits topic to learn which
versions are wholly mirrored; each task reads a range of versions from the actions topic and turns
them into change rows from the table's data files, with the rules of
:func:`deltamirror.core.changes.changes_from_actions`. The rows are those delta-spark's
``readChangeFeed`` gives, with ``_change_type``, ``_commit_version`` and ``_commit_timestamp``.

>>> from deltamirror.consumer.spark_source import register
>>> register(spark)  # checks, on a worker, that Spark's Python workers can import deltamirror
>>> stream = (spark.readStream.format("deltamirror")
...           .option("kafka.bootstrap.servers", "127.0.0.1:9092")
...           .option("startingVersion", 0)
...           .load("s3://bucket/events"))

Options (``load(path)`` gives the table location):

``kafka.bootstrap.servers`` (required), ``kafka.<librdkafka setting>``
    The broker, and any other librdkafka consumer setting (``kafka.security.protocol``, ...),
    checked as the watcher's ``kafka:`` settings are (:mod:`deltamirror.consumer.spark_options`).
``actionsTopic``, ``commitsTopic``
    The table's topics; default: the watcher's default names for the location.
``startingVersion``
    A version, or ``latest`` (only changes committed after the stream starts). Without it, as in
    delta-spark, the first micro-batch is the table at the latest mirrored version, as inserts.
``versionsPerPartition``
    Versions read by one task (default 64).
``storage.<option>``
    fsspec storage options for reading the data files (credentials, endpoints).

Offsets are ``{"version": next version to read}``, plus ``"snapshot": true`` before the initial
snapshot. A schema change after the stream started fails the query (DELTA_SCHEMA_CHANGED_WITH_VERSION),
as delta-spark's does: restart it to read with the new schema.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.pandas.types import from_arrow_schema

from deltamirror.core import features
from deltamirror.core.changes import (
    CHANGE_TYPE,
    COMMIT_TIMESTAMP,
    COMMIT_VERSION,
    TIMESTAMP_TYPE,
    ReadSchema,
    VersionActions,
    changes_from_actions,
    check_change_metadata,
    is_cdf_enabled,
)
from deltamirror.core.errors import (
    ChangeDataNotEnabledError,
    SchemaChangedError,
    StartVersionAfterLatestError,
    VersionNotFoundError,
)
from deltamirror.core.models import Metadata, Protocol
from deltamirror.core.table import DeltaTable
from deltamirror.mirror.errors import EventStreamError

from . import spark_workers
from .mirror_changes import MirrorIndex, read_mirror_versions
from .spark_options import SourceOptions

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType as SparkStructType

FORMAT = "deltamirror"
#: the name tests/producer/test_secrets.py imports (the options now live in spark_options.py)
_Options = SourceOptions


def register(spark: SparkSession) -> None:
    """Make ``spark.readStream.format("deltamirror")`` available in ``spark``.

    First checks that Spark's Python workers can import this module (see :func:`check_workers`):
    otherwise every micro-batch would fail later, deep inside a task, with a worker traceback.
    """
    check_workers(spark)
    spark.dataSource.register(DeltaMirrorSource)


def check_workers(spark: SparkSession) -> None:
    """Fail with one line unless Spark's Python workers can import what the source's tasks import.

    Runs a one-task job once per SparkContext (see :mod:`deltamirror.consumer.spark_workers`).
    """
    spark_workers.check_workers(spark, _probe_with_udf)


def _probe_with_udf(spark: SparkSession, probe: spark_workers.Probe) -> spark_workers.ProbeResult:
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
        snapshot = self._parsed.table().snapshot()
        snapshot.check_readable()
        self._read = ReadSchema(snapshot.metadata, snapshot.version)

    def schema(self) -> SparkStructType:
        return from_arrow_schema(_feed_schema(self._parsed.table(), self._read))

    def streamReader(self, schema: SparkStructType) -> DataSourceStreamReader:
        return MirrorChangeStreamReader(self._parsed, self._read)


def _feed_schema(table: DeltaTable, read: ReadSchema) -> pa.Schema:
    return changes_from_actions(table, read.metadata, read.version, ()).schema


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


class MirrorChangeStreamReader(DataSourceStreamReader):
    """Plans micro-batches from the commits topic (driver) and reads them (tasks).

    Only the options and the read schema travel to the tasks; the commits-topic index stays in the
    planner process, where Spark keeps this object between micro-batches.
    """

    def __init__(self, options: SourceOptions, read: ReadSchema) -> None:
        self._options = options
        self._read_metadata = read.metadata.model_dump_json(by_alias=True, exclude_none=True)
        self._read_version = read.version
        self._index: MirrorIndex | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_index"] = None
        return state

    @property
    def _uri(self) -> str:
        return self._options.settings.table_uri

    def _mirror(self) -> MirrorIndex:
        if self._index is None:
            self._index = MirrorIndex(self._options.settings)
        self._index.refresh()
        return self._index

    def _read_schema(self) -> ReadSchema:
        return ReadSchema(Metadata.model_validate_json(self._read_metadata), self._read_version)

    # --- planning (driver) ---

    def initialOffset(self) -> dict[str, Any]:
        index = self._mirror()
        latest = index.latest
        start = self._options.starting_version
        if latest is None:
            raise EventStreamError(
                f"nothing of the table is on {self._options.settings.commits_topic} yet: start the watcher first",
                table=self._uri,
            )
        if start == "latest":
            return {"version": latest + 1}
        if start is None:
            self._check_enabled_at(latest)
            return {"version": latest, "snapshot": True}
        assert isinstance(start, int)
        if start > latest + 1:
            raise StartVersionAfterLatestError(
                f"startingVersion {start} is after the latest mirrored version {latest}",
                table=self._uri,
                version=start,
            )
        self._check_enabled_at(start)
        return {"version": start}

    def _check_enabled_at(self, version: int) -> None:
        """The change feed must be on where the stream starts (later metaData are checked as read)."""
        table = self._options.table()
        try:
            metadata = table.snapshot(version=version).metadata
        except VersionNotFoundError:  # cleaned from the log: the mirror's own metaData decide then
            return
        if not is_cdf_enabled(metadata):
            raise ChangeDataNotEnabledError(
                f"change data was not recorded for version {version} (delta.enableChangeDataFeed is not "
                "true), so the stream cannot start there",
                table=self._uri,
                version=version,
            )
        read = self._read_schema()
        if version < read.version:
            check_change_metadata(read, metadata, version, table=self._uri, start=version)

    def latestOffset(self, start: dict[str, Any], limit: Any = None) -> dict[str, Any]:
        latest = self._mirror().latest
        if latest is None or (latest + 1 <= int(start["version"]) and not start.get("snapshot")):
            return start
        return {"version": latest + 1}

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
            return parts
        index.check_available(first, last)
        assert index.table_id is not None
        kafka_partition = index.actions_partition()
        step = self._options.versions_per_partition
        for lo in range(first, last + 1, step):
            hi = min(lo + step - 1, last)
            parts.append(_VersionsPartition(lo, hi, index.timestamp(lo), index.table_id, kafka_partition))
        return parts

    def commit(self, end: dict[str, Any]) -> None:
        if self._index is not None:
            self._index.forget_before(int(end["version"]))

    def stop(self) -> None:
        if self._index is not None:
            self._index.close()
            self._index = None

    # --- reading (tasks) ---

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        table = self._options.table()
        read = self._read_schema()
        if isinstance(partition, _SnapshotPartition):
            yield from _snapshot_rows(table, read, partition)
            return
        assert isinstance(partition, _VersionsPartition)
        versions = read_mirror_versions(
            self._options.settings,
            table_id=partition.table_id,
            partition=partition.kafka_partition,
            start=partition.start,
            end=partition.end,
            start_timestamp_ms=partition.start_timestamp_ms,
        )
        checked = _checked(versions, read, self._uri)
        yield from changes_from_actions(table, read.metadata, read.version, checked)


def _checked(versions: Iterator[VersionActions], read: ReadSchema, table: str) -> Iterator[VersionActions]:
    """Each version, once its protocol and metaData (if any) are known to be readable with ``read``."""
    for entry in versions:
        actions = list(entry.actions)
        for name, body in actions:
            if name == "protocol":
                features.check_readable(Protocol.model_validate(body), table=table, version=entry.version)
            elif name == "metaData":
                metadata = Metadata.model_validate(body)
                if entry.version <= read.version or not is_cdf_enabled(metadata):
                    check_change_metadata(read, metadata, entry.version, table=table, start=entry.version)
                elif metadata.table_schema != read.metadata.table_schema or (
                    metadata.partition_columns != read.metadata.partition_columns
                ):
                    raise SchemaChangedError(
                        f"the schema changed at version {entry.version}, after the stream started reading "
                        f"with that of version {read.version}; restart the query to read with the new schema",
                        table=table,
                        version=entry.version,
                    )
        yield VersionActions(entry.version, entry.timestamp_ms, actions)


def _snapshot_rows(table: DeltaTable, read: ReadSchema, part: _SnapshotPartition) -> Iterator[pa.RecordBatch]:
    """The table at the starting version as inserts, as delta-spark begins a stream with no startingVersion."""
    schema = _feed_schema(table, read)
    snapshot = table.snapshot(version=part.version)
    names = [f.name for f in schema if f.name not in (CHANGE_TYPE, COMMIT_VERSION, COMMIT_TIMESTAMP)]
    for batch in snapshot.iter_batches(columns=names):
        n = batch.num_rows
        if n == 0:
            continue
        yield pa.RecordBatch.from_arrays(
            [
                *(batch.column(name) for name in names),
                pa.array(["insert"] * n, pa.string()),
                pa.array([part.version] * n, pa.int64()),
                pa.array([part.timestamp_ms * 1000] * n, TIMESTAMP_TYPE),
            ],
            schema=schema,
        )


__all__ = ["FORMAT", "DeltaMirrorSource", "MirrorChangeStreamReader", "check_workers", "register"]
