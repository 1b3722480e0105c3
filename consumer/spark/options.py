"""The options of ``format("deltamirror")``, checked on the driver before anything is planned.

No pyspark here: the options are plain strings, and a bad one must fail with one line naming the
option, as a bad flag does on the command line. The options delta-spark's ``readChangeFeed``
stream knows keep its names and meanings (``startingVersion``, ``startingTimestamp``,
``maxFilesPerTrigger``, ``maxBytesPerTrigger``, ``failOnDataLoss``, ...); those of its options this
source cannot honour, and any option nobody knows, are refused by name rather than dropped
(:data:`REFUSED`). Spark hands the options over with lower-cased names, so names match in any case.

The ``kafka.*`` options go through the watcher's own :class:`~deltamirror.mirror.settings.KafkaSettings`
(the same broker-list rule, the same SASL/SSL consistency checks) under their librdkafka names:
``kafka.security.protocol`` is the ``security_protocol`` setting, anything without a typed setting
is passed to the consumer as is.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from deltamirror.core.errors import InvalidArgumentError, StartingVersionAndTimestampError
from deltamirror.core.paths import PathRules
from deltamirror.core.storage import normalize_table_uri
from deltamirror.core.table import DeltaTable, open_table
from deltamirror.core.timestamps import parse_timestamp
from deltamirror.mirror.records.boundary import OnBadRecord
from deltamirror.mirror.settings import OWN_KAFKA_KEYS, RESERVED_KAFKA_KEYS, KafkaSettings
from deltamirror.mirror.topic_names import default_topics

from ..mirror_changes import MirrorSettings

log = logging.getLogger(__name__)

DEFAULT_VERSIONS_PER_PARTITION = 64
#: delta-spark's maxFilesPerTrigger when neither limit is given
DEFAULT_MAX_FILES_PER_TRIGGER = 1000
KAFKA_PREFIX = "kafka."
STORAGE_PREFIX = "storage."

#: the options this source reads, by their lower-cased name (how Spark hands them over)
KNOWN = {
    name.lower(): name
    for name in (
        "path",
        "actionsTopic",
        "commitsTopic",
        "versionsPerPartition",
        "startingVersion",
        "startingTimestamp",
        "maxFilesPerTrigger",
        "maxBytesPerTrigger",
        "failOnDataLoss",
        "allowPathPrefixes",
        "onBadRecord",
        "columns",
        "rowIds",
        "netChanges",
        "keyColumns",
        "readChangeFeed",
        "readChangeData",
        "skipChangeCommits",
        "ignoreChanges",
        "ignoreDeletes",
        "ignoreFileDeletion",
        "schemaTrackingLocation",
        "schemaLocation",
        "streamingSourceTrackingId",
        "allowSourceColumnRename",
        "allowSourceColumnDrop",
    )
}
#: delta-spark's options that change nothing in its change-feed stream (its CDF path never looks
#: at them): accepted, with the same (lack of) effect
NO_EFFECT_ON_A_CHANGE_FEED = ("skipChangeCommits", "ignoreChanges", "ignoreDeletes", "ignoreFileDeletion")

#: delta-spark's read options this source refuses, and why
REFUSED = {
    "endingVersion": "a stream has no end; a bounded range is a batch read (`deltamirror changes`, read_changes)",
    "endingTimestamp": "a stream has no end; a bounded range is a batch read (`deltamirror changes`, read_changes)",
    "versionAsOf": "time travel is for batch reads; use startingVersion",
    "timestampAsOf": "time travel is for batch reads; use startingTimestamp",
    "excludeRegex": "filtering data files by a (Java) regular expression on their paths is not implemented",
    "withEventTimeOrder": "ordering the initial snapshot by event time is not implemented",
    "allowSourceColumnRenameAndDrop": (
        "delta-spark reads it only as a SQL configuration, not as a reader option; give "
        "allowSourceColumnRename and allowSourceColumnDrop"
    ),
    "allowSourceColumnTypeChange": "a tracked stream does not stop for type changes here (widened types read widened)",
}
_REFUSED_BY_KEY = {name.lower(): name for name in REFUSED}

#: the librdkafka name of each typed Kafka setting: ``security_protocol`` is ``security.protocol``
_KAFKA_FIELDS = {
    **{name.replace("_", "."): name for name in KafkaSettings.model_fields if name != "extra"},
    # librdkafka's other spellings of the same properties
    "metadata.broker.list": "bootstrap_servers",
    "sasl.mechanisms": "sasl_mechanism",
}
#: Spark's (JavaUtils.byteStringAs) size suffixes, powers of 1024 (no suffix: bytes)
_BYTE_UNITS = {
    "": 0,
    "b": 0,
    "k": 1,
    "kb": 1,
    "m": 2,
    "mb": 2,
    "g": 3,
    "gb": 3,
    "t": 4,
    "tb": 4,
    "p": 5,
    "pb": 5,
}


@dataclass(frozen=True)
class SourceOptions:
    """What ``.option(...)`` and ``.load(path)`` said, checked: picklable, shipped to the tasks."""

    settings: MirrorSettings
    #: fsspec options: credentials, so never in repr() (Spark logs what it plans)
    storage_options: Mapping[str, str] = field(repr=False)
    starting_version: int | str | None
    versions_per_partition: int
    #: startingTimestamp in epoch milliseconds
    starting_timestamp_ms: int | None = None
    max_files_per_trigger: int | None = None
    max_bytes_per_trigger: int | None = None
    fail_on_data_loss: bool = True
    #: locations outside the table root whose files its log (and the mirror) may name
    allowed_path_prefixes: tuple[str, ...] = ()
    #: ``columns``: the table columns to read, as given (None: all); checked against the read
    #: schema by the source, which knows it
    columns: tuple[str, ...] | None = None
    #: ``rowIds``: also ``_row_id`` and ``_row_commit_version`` (tables with row tracking only)
    row_ids: bool = False
    #: ``netChanges``: each micro-batch gives the net changes of its versions (``changes --net``)
    net_changes: bool = False
    #: ``keyColumns``: the columns that tell rows apart for the net changes (None: all their values)
    key_columns: tuple[str, ...] | None = None
    #: ``schemaTrackingLocation`` (or ``schemaLocation``): the folder of the schema tracking log
    schema_tracking_location: str | None = None
    #: ``streamingSourceTrackingId``: tells apart the logs of several streams of one table there
    tracking_id: str | None = None
    #: ``allowSourceColumnRename`` / ``allowSourceColumnDrop`` as given ("always" or a version)
    unblock: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, given: Mapping[str, str]) -> SourceOptions:
        options = {_key(str(k)): str(v) for k, v in given.items()}
        uri = options.get("path")
        if not uri:
            raise InvalidArgumentError("give the table location: .load(path)")
        check_names(options, uri)
        if not options.get("kafka.bootstrap.servers"):
            raise InvalidArgumentError("option kafka.bootstrap.servers is required", table=uri)
        kafka = kafka_settings(options, uri)
        defaults = default_topics(normalize_table_uri(uri))  # where the location enters
        storage = {k[len(STORAGE_PREFIX) :]: v for k, v in options.items() if k.startswith(STORAGE_PREFIX)}
        starting = starting_version(options.get("startingversion"), uri)
        timestamp = options.get("startingtimestamp")
        if starting is not None and timestamp is not None:
            raise StartingVersionAndTimestampError(
                "give startingVersion or startingTimestamp, not both", table=uri
            )
        per_partition = positive_int("versionsPerPartition", options, DEFAULT_VERSIONS_PER_PARTITION, uri)
        assert per_partition is not None
        client = kafka.librdkafka_config()  # plain strings, secrets revealed: for the tasks' consumers
        del client["bootstrap.servers"]
        prefixes = path_prefixes(options.get("allowpathprefixes"), uri)
        settings = MirrorSettings(
            bootstrap_servers=kafka.bootstrap_servers,
            actions_topic=options.get("actionstopic") or defaults.actions,
            commits_topic=options.get("commitstopic") or defaults.commits,
            table_uri=uri,
            kafka_config=client,
            allowed_path_prefixes=prefixes,
            on_bad_record=bad_record_choice(options.get("onbadrecord"), uri),
        )
        return cls(
            settings,
            storage,
            starting,
            per_partition,
            starting_timestamp_ms=None if timestamp is None else starting_timestamp(timestamp, uri),
            max_files_per_trigger=positive_int("maxFilesPerTrigger", options, None, uri),
            max_bytes_per_trigger=byte_size("maxBytesPerTrigger", options.get("maxbytespertrigger"), uri),
            fail_on_data_loss=boolean("failOnDataLoss", options.get("failondataloss"), True, uri),
            allowed_path_prefixes=prefixes,
            columns=column_names(options.get("columns"), uri),
            **net_options(options, uri, row_ids=boolean("rowIds", options.get("rowids"), False, uri)),
            **tracking_options(options, uri),
        )

    def table(self) -> DeltaTable:
        return open_table(
            self.settings.table_uri,
            dict(self.storage_options),
            allowed_path_prefixes=self.allowed_path_prefixes,
        )

    def read_limit(self) -> tuple[int | None, int | None]:
        """(maxFiles, maxBytes) of a micro-batch by default: delta-spark's 1000 files if neither is set."""
        files, size = self.max_files_per_trigger, self.max_bytes_per_trigger
        if files is None and size is None:
            files = DEFAULT_MAX_FILES_PER_TRIGGER
        return files, size


def _key(name: str) -> str:
    """An option's name to match: lower case, but a kafka.* or storage.* setting's own name as given."""
    lower = name.lower()
    for prefix in (KAFKA_PREFIX, STORAGE_PREFIX):
        if lower.startswith(prefix):
            return prefix + name[len(prefix) :]
    return lower


def check_names(options: Mapping[str, str], table: str) -> None:
    """Refuse, by name, an option this source does not read: none is silently dropped."""
    for key, value in options.items():
        if key.startswith((KAFKA_PREFIX, STORAGE_PREFIX)):
            continue
        if key in _REFUSED_BY_KEY:
            refused = _REFUSED_BY_KEY[key]
            raise InvalidArgumentError(
                f'option {refused} is not supported by format("deltamirror"): {REFUSED[refused]}', table=table
            )
        name = KNOWN.get(key)
        if name is None:
            raise InvalidArgumentError(
                f'unknown option {key!r} for format("deltamirror") (options: {", ".join(sorted(KNOWN.values()))}, '
                "kafka.<librdkafka setting>, storage.<fsspec option>)",
                table=table,
            )
        if name in ("readChangeFeed", "readChangeData") and not boolean(name, value, True, table):
            raise InvalidArgumentError(
                f"option {name} is false, but this source reads only a change data feed: leave it out",
                table=table,
            )
        if name in NO_EFFECT_ON_A_CHANGE_FEED and boolean(name, value, False, table):
            log.info("option %s has no effect on a change data feed stream (nor in delta-spark)", name)


def starting_version(value: str | None, table: str) -> int | str | None:
    if value is None:
        return None
    if value.strip().lower() == "latest":
        return "latest"
    return non_negative_int("startingVersion", value, table)


def starting_timestamp(value: str, table: str) -> int:
    """Epoch ms of an ISO-8601 timestamp or date (no offset: UTC), as delta-spark parses it."""
    try:
        return parse_timestamp(value)
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(f"option startingTimestamp: {exc.message}", table=table) from None


#: the consumer properties the source's readers set themselves, and why
_SOURCE_SETS = {
    "group.id": "the source assigns the partitions itself and keeps its offsets in the query's checkpoint",
    "auto.offset.reset": "the source reads the ranges its offsets in the query's checkpoint name",
    "enable.auto.commit": "the source keeps its offsets in the query's checkpoint, never in a group",
    "enable.auto.offset.store": "the source keeps its offsets in the query's checkpoint, never in a group",
    "enable.partition.eof": "the source's readers need the end of each partition",
    "isolation.level": "the source reads committed records only (read_committed)",
}


def kafka_settings(options: Mapping[str, str], table: str) -> KafkaSettings:
    """The ``kafka.*`` options as KafkaSettings.

    A problem names the option (``option kafka.sasl.username: ...``). The properties the source's
    consumers set themselves (``group.id``, ``auto.offset.reset``, ``isolation.level``, ...) and
    the producers' own (``transactional.id``, ``acks``, ...) are refused by name: a consumer would
    set the first over them and ignore the second, so either would silently not take effect.
    """
    values: dict[str, Any] = {}
    names = {name: f"option {KAFKA_PREFIX}{name.replace('_', '.')}" for name in _KAFKA_FIELDS.values()}
    extra: dict[str, str] = {}
    for option, value in options.items():
        if not option.startswith(KAFKA_PREFIX):
            continue
        key = option[len(KAFKA_PREFIX) :]
        name = _KAFKA_FIELDS.get(key)
        if name is None:
            if key == "isolation.level" and value.strip().lower() == "read_committed":
                continue  # what the source's readers do (Spark's kafka recipes give it)
            if key in RESERVED_KAFKA_KEYS or key in OWN_KAFKA_KEYS:
                raise InvalidArgumentError(
                    f'option {option} is not supported by format("deltamirror"): '
                    + _SOURCE_SETS.get(key, "a producer's property (the source only reads)"),
                    table=table,
                )
            extra[key] = value
            continue
        if name in values:
            raise InvalidArgumentError(
                f"{names[name]} and option {option} set the same property: give one", table=table
            )
        values[name] = value
        names[name] = f"option {option}"
    return KafkaSettings.from_flags({**values, "extra": extra}, names)


def non_negative_int(name: str, value: Any, table: str) -> int:
    try:
        number = int(str(value).strip())
    except ValueError:
        raise InvalidArgumentError(
            f"option {name} must be a version number, got {value!r}", table=table
        ) from None
    if number < 0:
        raise InvalidArgumentError(f"option {name} must be >= 0, got {number}", table=table)
    return number


def positive_int(name: str, options: Mapping[str, str], default: int | None, table: str) -> int | None:
    value = options.get(name.lower())
    if value is None:
        return default
    try:
        number = int(value.strip())
    except ValueError:
        number = 0
    if number <= 0:
        raise InvalidArgumentError(f"option {name} must be a positive integer, got {value!r}", table=table)
    return number


def byte_size(name: str, value: str | None, table: str) -> int | None:
    """A size as Spark writes one (``10g``, ``512m``, ``1048576``; powers of 1024), > 0."""
    if value is None:
        return None
    found = re.fullmatch(r"\s*(\d+)\s*([a-z]*)\s*", value.lower())
    if found is None or found.group(2) not in _BYTE_UNITS or int(found.group(1)) == 0:
        raise InvalidArgumentError(
            f"option {name} must be a size such as '10g' or '1048576', got {value!r}", table=table
        )
    return int(found.group(1)) << (10 * _BYTE_UNITS[found.group(2)])


def path_prefixes(value: str | None, table: str) -> tuple[str, ...]:
    """``allowPathPrefixes``: locations, comma-separated (a comma inside one is written ``%2C``),
    each checked as core checks ``allowed_path_prefixes`` (on the table's storage)."""
    if value is None:
        return ()
    prefixes = tuple(p.strip() for p in value.split(","))
    if not all(prefixes):
        raise InvalidArgumentError(
            f"option allowPathPrefixes must be locations separated by commas, got {value!r}", table=table
        )
    try:
        PathRules(normalize_table_uri(table), prefixes)
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(f"option allowPathPrefixes: {exc.message}", table=table) from None
    return prefixes


def column_names(value: str | None, table: str, name: str = "columns") -> tuple[str, ...] | None:
    """``columns`` (or ``name``): table column names, comma-separated (None: every column)."""
    if value is None:
        return None
    names = tuple(c.strip() for c in value.split(","))
    if not all(names):
        raise InvalidArgumentError(
            f"option {name} must be column names separated by commas, got {value!r}", table=table
        )
    return names


def net_options(options: Mapping[str, str], table: str, *, row_ids: bool) -> dict[str, Any]:
    """``rowIds``, ``netChanges`` and ``keyColumns`` (the key only with net changes: nothing else
    reads it; with ``rowIds`` and no ``keyColumns``, rows are told apart by ``_row_id``, as
    ``deltamirror changes --row-ids --net`` does)."""
    net = boolean("netChanges", options.get("netchanges"), False, table)
    keys = column_names(options.get("keycolumns"), table, "keyColumns")
    if keys is not None and not net:
        raise InvalidArgumentError(
            "option keyColumns names the columns netChanges tells rows apart by: set netChanges to true too",
            table=table,
        )
    if net and row_ids and keys is None:
        keys = ("_row_id",)
    return {"row_ids": row_ids, "net_changes": net, "key_columns": keys}


def tracking_options(options: Mapping[str, str], table: str) -> dict[str, Any]:
    """``schemaTrackingLocation`` (``schemaLocation``, delta-spark's other name for it),
    ``streamingSourceTrackingId``, and the options that let a tracked stream go on past a rename
    or drop: each of the others only with a location, which nothing else reads."""
    locations = {options[k].strip() for k in ("schematrackinglocation", "schemalocation") if k in options}
    if len(locations) > 1:
        raise InvalidArgumentError(
            "options schemaTrackingLocation and schemaLocation name different folders: give one", table=table
        )
    location = locations.pop() if locations else None
    if location == "":
        raise InvalidArgumentError("option schemaTrackingLocation must name a folder", table=table)
    tracking_id = options.get("streamingsourcetrackingid")
    unblock = {
        name: options[name.lower()]
        for name in ("allowSourceColumnRename", "allowSourceColumnDrop")
        if name.lower() in options
    }
    needing = ([] if tracking_id is None else ["streamingSourceTrackingId"]) + list(unblock)
    if location is None and needing:
        raise InvalidArgumentError(
            f"option {needing[0]} is read only with schemaTrackingLocation: give that too", table=table
        )
    if tracking_id is not None and not re.fullmatch(r"[A-Za-z0-9_-]+", tracking_id):
        raise InvalidArgumentError(
            f"option streamingSourceTrackingId must be letters, digits, '_' or '-', got {tracking_id!r}",
            table=table,
        )
    for name, value in unblock.items():
        if not re.fullmatch(r"\s*(always|\d+)\s*", value.lower()):
            raise InvalidArgumentError(
                f"option {name} must be 'always' or the version of the schema change, got {value!r}",
                table=table,
            )
    return {"schema_tracking_location": location, "tracking_id": tracking_id, "unblock": unblock}


#: what the stream does with a record of the mirror the boundary refuses (no dead-letter topic here)
SPARK_BAD_RECORD_CHOICES = ("stop", "skip")


def bad_record_choice(value: str | None, table: str) -> OnBadRecord:
    """``onBadRecord``: ``stop`` (the default: the query fails, naming the record) or ``skip``."""
    if value is None:
        return "stop"
    text = value.strip().lower()
    if text == "stop":
        return "stop"
    if text == "skip":
        return "skip"
    raise InvalidArgumentError(f"option onBadRecord must be 'stop' or 'skip', got {value!r}", table=table)


def boolean(name: str, value: str | None, default: bool, table: str) -> bool:
    if value is None:
        return default
    text = value.strip().lower()
    if text not in ("true", "false"):
        raise InvalidArgumentError(f"option {name} must be 'true' or 'false', got {value!r}", table=table)
    return text == "true"


__all__ = [
    "DEFAULT_MAX_FILES_PER_TRIGGER",
    "DEFAULT_VERSIONS_PER_PARTITION",
    "KNOWN",
    "NO_EFFECT_ON_A_CHANGE_FEED",
    "REFUSED",
    "SourceOptions",
    "column_names",
    "kafka_settings",
    "net_options",
    "non_negative_int",
    "tracking_options",
]
