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
    The broker, and any other librdkafka consumer setting (``kafka.security.protocol``, ...).
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

import re
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.pandas.types import from_arrow_schema

from deltamirror.core import features
from deltamirror.core.change_ranges import ReadSchema, is_cdf_enabled
from deltamirror.core.changes import (
    CHANGE_TYPE,
    COMMIT_TIMESTAMP,
    COMMIT_VERSION,
    TIMESTAMP_TYPE,
    VersionActions,
    changes_from_actions,
    check_change_metadata,
)
from deltamirror.core.errors import (
    ChangeDataNotEnabledError,
    EnvironmentMissingError,
    EventStreamError,
    InvalidArgumentError,
    SchemaChangedError,
    StartVersionAfterLatestError,
    VersionNotFoundError,
)
from deltamirror.core.kafka_connection import check_bootstrap_servers
from deltamirror.core.models import Metadata, Protocol
from deltamirror.core.table import DeltaTable, open_table
from deltamirror.core.topic_names import default_topics

from .mirror_changes import MirrorIndex, MirrorSettings, read_mirror_versions

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType as SparkStructType

FORMAT = "deltamirror"
DEFAULT_VERSIONS_PER_PARTITION = 64


def register(spark: SparkSession) -> None:
    """Make ``spark.readStream.format("deltamirror")`` available in ``spark``.

    First checks that Spark's Python workers can import this module (see :func:`check_workers`):
    otherwise every micro-batch would fail later, deep inside a task, with a worker traceback.
    """
    check_workers(spark)
    spark.dataSource.register(DeltaMirrorSource)


#: the modules a task imports to read the mirror, in the order that makes the first failure say most
WORKER_MODULES = ("deltamirror.core", "pyarrow", "confluent_kafka", "deltamirror.consumer.spark_source")
_JOB_GROUP = "deltamirror-worker-check"
_workers_ok: set[str] = set()


def check_workers(spark: SparkSession) -> None:
    """Fail with one line unless Spark's Python workers can import what the source's tasks import.

    The check runs a one-task job, so it sees the interpreter Spark really starts for tasks (in local
    mode, ``PYSPARK_PYTHON`` as it was when the SparkContext started, else the ``python3`` on PATH),
    not the driver's. It runs once per SparkContext: a context keeps its worker interpreter.
    """
    key = _context_key(spark)
    if key in _workers_ok:
        return
    try:
        interpreter, module, error = _probe_a_worker(spark)
    except Exception as exc:  # the worker did not start at all: a wrong path, another Python version
        reason = _one_line_reason(exc)
        raise EnvironmentMissingError(
            f"Spark's Python workers could not run ({reason or type(exc).__name__}); {_advice()}"
        ) from (None if reason else exc)
    if error is not None:
        raise EnvironmentMissingError(
            f"Spark's Python workers run {interpreter}, which cannot import {module} ({error}); {_advice()}"
        )
    _workers_ok.add(key)


def _advice() -> str:
    exe = sys.executable
    return (
        f"set PYSPARK_PYTHON={exe} in the environment before the SparkSession starts "
        f"(os.environ, or spark.pyspark.python={exe} with spark-submit)"
    )


def _context_key(spark: SparkSession) -> str:
    try:
        sc = spark.sparkContext
    except Exception:  # Spark Connect: no SparkContext on the client; the server's is per session id
        return f"session:{getattr(spark, 'session_id', id(spark))}"
    return f"context:{sc.applicationId}:{sc.startTime}"


def _worker_probe() -> Callable[[Any], tuple[str, str | None, str | None]]:
    """A local function: cloudpickle sends it by value, so a worker runs it without deltamirror."""

    def probe(_: Any, modules: tuple[str, ...] = WORKER_MODULES) -> tuple[str, str | None, str | None]:
        import importlib
        import sys

        for name in modules:
            try:
                importlib.import_module(name)
            except Exception as exc:
                return sys.executable, name, " ".join(f"{type(exc).__name__}: {exc}".split())
        return sys.executable, None, None

    return probe


def _probe_a_worker(spark: SparkSession) -> tuple[str, str | None, str | None]:
    probe = _worker_probe()
    try:
        sc = spark.sparkContext
    except Exception:  # Spark Connect: only the DataFrame API reaches the workers
        return _probe_with_udf(spark, probe)
    properties = ("spark.jobGroup.id", "spark.job.description", "spark.job.interruptOnCancel")
    previous = {k: sc.getLocalProperty(k) for k in properties}
    sc.setJobGroup(_JOB_GROUP, "deltamirror: can Spark's Python workers import deltamirror?")
    try:
        result: tuple[str, str | None, str | None] = sc.parallelize([0], 1).map(probe).collect()[0]
    finally:
        for k, v in previous.items():
            sc.setLocalProperty(k, v)  # type: ignore[arg-type]  # None removes the property
    return result


def _probe_with_udf(
    spark: SparkSession, probe: Callable[[Any], tuple[str, str | None, str | None]]
) -> tuple[str, str | None, str | None]:
    import json

    from pyspark.sql.functions import lit, udf

    as_json = udf(lambda x: json.dumps(probe(x)), "string", useArrow=False)
    row = spark.range(1, numPartitions=1).select(as_json(lit(0)).alias("probe")).first()
    assert row is not None
    interpreter, module, error = json.loads(row["probe"])
    return interpreter, module, error


def _one_line_reason(exc: BaseException) -> str | None:
    """The line of a job failure that says why the worker did not start, if it is a known one."""
    text = str(exc)
    for pattern in (
        r'Cannot run program "[^"]*"[^\n]*',  # no such interpreter
        r"\[PYTHON_[A-Z_]+\][^\n]*",  # e.g. [PYTHON_VERSION_MISMATCH]
        r"most recent failure: Lost task [^\n]*?\): ([^\n]*)",  # the task's own error, any other
    ):
        found = re.search(pattern, text)
        if found:
            return found.group(found.lastindex or 0).strip()[:300]
    return None


@dataclass(frozen=True)
class _Options:
    settings: MirrorSettings
    storage_options: Mapping[str, str]
    starting_version: int | str | None
    versions_per_partition: int

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> _Options:
        uri = options.get("path")
        if not uri:
            raise InvalidArgumentError("give the table location: .load(path)")
        bootstrap = options.get("kafka.bootstrap.servers")
        if not bootstrap:
            raise InvalidArgumentError("option kafka.bootstrap.servers is required", table=uri)
        bootstrap = check_bootstrap_servers(bootstrap, "option kafka.bootstrap.servers")
        defaults = default_topics(uri)
        kafka = {
            k[len("kafka.") :]: v
            for k, v in options.items()
            if k.startswith("kafka.") and k != "kafka.bootstrap.servers"
        }
        storage = {k[len("storage.") :]: v for k, v in options.items() if k.startswith("storage.")}
        starting: int | str | None = options.get("startingVersion")
        if starting is not None and str(starting).strip().lower() == "latest":
            starting = "latest"
        elif starting is not None:
            starting = _non_negative_int("startingVersion", starting, uri)
        per_partition = _non_negative_int(
            "versionsPerPartition", options.get("versionsPerPartition", DEFAULT_VERSIONS_PER_PARTITION), uri
        )
        if per_partition == 0:
            raise InvalidArgumentError("option versionsPerPartition must be at least 1", table=uri)
        settings = MirrorSettings(
            bootstrap_servers=bootstrap,
            actions_topic=options.get("actionsTopic") or defaults.actions,
            commits_topic=options.get("commitsTopic") or defaults.commits,
            table_uri=uri,
            kafka_config=kafka,
        )
        return cls(settings, storage, starting, per_partition)

    def table(self) -> DeltaTable:
        return open_table(self.settings.table_uri, dict(self.storage_options))


def _non_negative_int(name: str, value: Any, table: str) -> int:
    try:
        number = int(str(value).strip())
    except ValueError:
        raise InvalidArgumentError(
            f"option {name} must be a version number, got {value!r}", table=table
        ) from None
    if number < 0:
        raise InvalidArgumentError(f"option {name} must be >= 0, got {number}", table=table)
    return number


class DeltaMirrorSource(DataSource):
    """``format("deltamirror")``: the change data feed of a table, from its Kafka mirror (streaming only)."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self._parsed = _Options.parse(options)
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

    def __init__(self, options: _Options, read: ReadSchema) -> None:
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
