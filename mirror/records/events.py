"""The wire format of deltamirror: what subscribers of the Kafka topics code against.

Four kinds of records, each defined here once as a frozen pydantic model (the contract, and the
source of the committed JSON Schema ``schemas/event.schema.json``):

- :class:`ActionEvent`, on the actions topic: one record per Delta action, keyed by table id;
- :class:`CommitSummary`, :class:`Heartbeat`, :class:`TableReplaced`, :class:`TableDropped` and
  :class:`SchemaChanged`, on the commits topic (``kind`` tells them apart): one summary per version,
  optional heartbeats of an idle table, the announcement that the table at a location was deleted
  and created anew, the last record of a table that was deleted (a discovered one), and what a
  version changed in the table's schema;
- :class:`ProgressRecord`, on the compacted progress topic: where the watcher stands, per table.

The models validate at the edges (tests, consumers, one summary per version). The hot path never
builds a model per record: :class:`EnvelopeEncoder` encodes the fields shared by every action of a
version once, with ``pydantic_core.to_json``, and appends each action's own part (index, type and
the action as it is in the log, raw bytes when the log line is at hand). Round-trip and JSON Schema
tests keep the two in agreement.

Compatibility policy (``schemaVersion``, now :data:`SCHEMA_VERSION`):

- Changes that keep ``schemaVersion``: adding an optional field to any record, adding a value to
  ``commitTimestampSource`` or ``kind`` that older consumers may skip, new action types in ``type``
  (Delta adds them; ``action`` carries them whole), new headers. Consumers must ignore fields,
  headers and record kinds they do not know.
- Changes that bump it: removing or renaming a field, changing a field's type or meaning, making
  an optional field required, changing the key, the partitioner, the ordering guarantee or the
  record timestamp. A bump is announced in the changelog; the watcher never mixes versions within
  one table's topic without such a release.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from itertools import repeat
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError, from_json, to_json

from deltamirror.core import models
from deltamirror.core.action_rules import I32_MAX, I64_MAX, I64_MIN

from ..errors import EventStreamError
from .boundary import DEFAULT_RULES, BadRecordError, RecordRules, shown
from .headers import INDEX_TEXT

SCHEMA_VERSION = 1
SCHEMA_ID = "https://github.com/deltamirror/deltamirror/schemas/event.schema.json"

TimestampSourceName = Literal["ict", "file-time", "adjusted-file-time"]

# --- bounds of every field: a reader never holds more than these say, whoever wrote the record ---
#: a table id (``metaData.id``: writers write a UUID)
MAX_ID_CHARS = 1024
#: a table location
MAX_URI_CHARS = 8192
#: free text (an operation, a reason)
MAX_TEXT_CHARS = 65_536
#: an action type's name
MAX_TYPE_CHARS = 256
#: the partitions a commit summary lists (the watcher lists at most 1000)
MAX_PARTITIONS_LISTED = 1000

TableId = Annotated[str, Field(min_length=1, max_length=MAX_ID_CHARS)]
TableUri = Annotated[str, Field(min_length=1, max_length=MAX_URI_CHARS)]
Text = Annotated[str, Field(max_length=MAX_TEXT_CHARS)]
#: a Delta version (a 64-bit integer, as the protocol has it)
Version = Annotated[int, Field(ge=0, le=I64_MAX)]
#: epoch milliseconds, a size in bytes, a count: 64-bit integers
Long = Annotated[int, Field(ge=I64_MIN, le=I64_MAX)]
Size = Annotated[int, Field(ge=0, le=I64_MAX)]
#: a commit summary's byte sums stop here: a long, as every Delta reader sums sizes (each size is one;
#: only a forged log makes their sum larger)
MAX_SUMMED_BYTES = I64_MAX
#: the actions of one version (or snapshot), and an action's place among them (32-bit, as Spark's
#: arrays and the protocol's Int)
ActionCount = Annotated[int, Field(ge=1, le=I32_MAX)]
ActionIndex = Annotated[int, Field(ge=0, le=I32_MAX - 1)]


class _Record(BaseModel):
    """Frozen, camelCase on the wire, unknown fields kept (a newer producer may add some)."""

    # validators built on first use, not at import (see deltamirror.core.models.DeltaModel)
    model_config = ConfigDict(
        frozen=True, alias_generator=to_camel, populate_by_name=True, extra="allow", defer_build=True
    )

    @field_validator("schema_version", mode="after", check_fields=False)
    @classmethod
    def _known_schema_version(cls, value: int) -> int:
        """Records of another contract are refused by name: their fields may mean other things."""
        if value != SCHEMA_VERSION:
            raise PydanticCustomError(
                "schema_version",
                "schemaVersion {found} is not one this deltamirror reads (it reads {known}): "
                "records of another contract are never read as this one",
                {"found": value, "known": SCHEMA_VERSION},
            )
        return value

    def to_json_bytes(self) -> bytes:
        return self.model_dump_json(by_alias=True, exclude_none=True).encode()


class ActionEvent(_Record):
    """One Delta action of one version (value of an actions-topic record; key = ``tableId``)."""

    schema_version: int = Field(description="Version of this contract; see the compatibility policy.")
    table_id: TableId = Field(description="metaData.id of the table: a re-created table gets a new one.")
    table_uri: TableUri = Field(description="Normalized table location (absolute file:// for local paths).")
    version: Version = Field(description="The Delta version the action belongs to.")
    commit_timestamp: Long = Field(description="Resolved commit timestamp of the version, epoch ms.")
    commit_timestamp_source: TimestampSourceName = Field(
        description="ict (inCommitTimestamp), file-time, or adjusted-file-time (made monotonic)."
    )
    index: ActionIndex = Field(description="Position of the action within its version (0-based), < count.")
    count: ActionCount = Field(description="Number of actions of the version (of the snapshot).")
    type: str = Field(
        min_length=1,
        max_length=MAX_TYPE_CHARS,
        description="The action type: add, remove, metaData, protocol, commitInfo, ...",
    )
    snapshot: bool = Field(description="True for the events of a snapshot (the table's state at version).")
    snapshot_end: bool | None = Field(
        default=None, description="On snapshot events only: true on the last one (the snapshot is complete)."
    )
    action: Any = Field(
        description="The action itself, with Delta's field names, exactly as in the log (an object for "
        "every action type Delta defines; an unknown type's value is kept whatever it is)."
    )

    @model_validator(mode="after")
    def _index_within_count(self) -> ActionEvent:
        if self.index >= self.count:
            raise PydanticCustomError(
                "index_count",
                "index {index} is not below count {count}",
                {"index": self.index, "count": self.count},
            )
        return self


class CommitSummary(_Record):
    """One per published version (or snapshot), on the commits topic, in the version's last transaction."""

    kind: Literal["commit"] = "commit"
    schema_version: int
    table_id: TableId
    table_uri: TableUri
    version: Version
    commit_timestamp: Long
    commit_timestamp_source: TimestampSourceName
    snapshot: bool = Field(description="True when this summarizes a snapshot rather than a commit.")
    action_count: int = Field(
        ge=0,
        le=I32_MAX,
        description="Actions of the version, one actions-topic record each (a record split by the "
        "oversize policy counts once).",
    )
    operation: Text | None = Field(default=None, description="commitInfo.operation (SNAPSHOT for snapshots).")
    read_version: Long | None = None
    is_blind_append: bool | None = None
    adds: Size = Field(description="add actions (active files for a snapshot).")
    removes: Size
    cdc_files: Size = Field(description="cdc actions.")
    bytes_added: Size
    bytes_removed: Size = Field(description="Sum of remove.size where the writer recorded it.")
    partitions_touched: list[dict[str, str | None]] = Field(
        default_factory=list,
        max_length=MAX_PARTITIONS_LISTED,
        description="Distinct partitionValues of the files added, removed or cdc.",
    )
    partitions_touched_truncated: bool = Field(
        default=False, description="True when more partitions were touched than listed (limit 1000)."
    )
    metadata_changed: bool = False
    protocol_changed: bool = False


class Heartbeat(_Record):
    """Sent on the commits topic while a table is idle: the watcher is alive and where it stands."""

    kind: Literal["heartbeat"] = "heartbeat"
    schema_version: int
    table_id: TableId
    table_uri: TableUri
    latest_version: Version = Field(
        description="The latest version the watcher has handled: published, or the version it started "
        "after (snapshot mode latest) while nothing newer has been committed.",
    )
    commit_timestamp: Long = Field(description="Commit timestamp of latest_version, epoch ms.")
    commit_timestamp_source: TimestampSourceName
    heartbeat_timestamp: Long = Field(description="Wall-clock time of the heartbeat, epoch ms.")


class TableReplaced(_Record):
    """The location now holds another table: what follows (a new ``tableId``) is a new table."""

    kind: Literal["tableReplaced"] = "tableReplaced"
    schema_version: int
    table_uri: TableUri
    table_id: TableId = Field(description="metaData.id of the new table.")
    previous_table_id: TableId
    previous_version: Version = Field(description="Last version published for the previous table.")
    reason: Text
    detected_at: Long = Field(description="Wall-clock time of the detection, epoch ms.")


class TableDropped(_Record):
    """The table is gone (no commit or checkpoint left in its log) and is no longer mirrored.

    The last record of the table on its topics: published in one transaction with a tombstone of
    its progress record, so a table later created at the location starts afresh.
    """

    kind: Literal["tableDropped"] = "tableDropped"
    schema_version: int
    table_uri: TableUri
    table_id: TableId = Field(description="metaData.id of the dropped table.")
    last_version: Version = Field(description="Last version published for it.")
    reason: Text
    detected_at: Long = Field(description="Wall-clock time of the detection, epoch ms.")


#: the columns one schema change lists (a reader takes no more, whoever wrote the record)
MAX_SCHEMA_CHANGES = 100_000
#: a schema, as the record carries it (the Delta schema's JSON text)
MAX_SCHEMA_CHARS = 16 * 1024 * 1024


class ColumnChangeEntry(_Record):
    """One change of a :class:`SchemaChanged` record."""

    change: Literal[
        "add", "drop", "rename", "widen", "retype", "nullable", "notNull", "partitioning", "columnMapping"
    ] = Field(
        description="add, drop, rename, widen (a wider type), retype (any other type change), nullable, "
        "notNull, partitioning (the partition columns), columnMapping (its mode)."
    )
    change_class: Literal["additive", "widening", "rename", "drop", "incompatible"]
    column: list[Annotated[str, Field(max_length=MAX_TEXT_CHARS)]] = Field(
        default_factory=list,
        max_length=1000,
        description="Path of the column (its new name; element, key, value inside arrays and maps); "
        "empty for partitioning and columnMapping.",
    )
    before: Text | None = Field(default=None, description="The old name, type, partition columns or mode.")
    after: Text | None = Field(default=None, description="The new name, type, partition columns or mode.")


class PropertyChange(_Record):
    """A table property (``metaData.configuration``) a schema change changed too."""

    before: Text | None = None
    after: Text | None = None


class SchemaChanged(_Record):
    """A version's metaData changed the table's schema, partition columns or column mapping.

    On the commits topic after the version's summary, in the same transaction; row changes of the
    version onward have the new schema. ``changeClass`` is the hardest of ``changes``: additive,
    widening, rename, drop, incompatible.
    """

    kind: Literal["schemaChanged"] = "schemaChanged"
    schema_version: int
    table_id: TableId
    table_uri: TableUri
    version: Version = Field(description="The version whose metaData changed the schema.")
    commit_timestamp: Long
    commit_timestamp_source: TimestampSourceName
    change_class: Literal["additive", "widening", "rename", "drop", "incompatible"]
    changes: list[ColumnChangeEntry] = Field(min_length=1, max_length=MAX_SCHEMA_CHANGES)
    previous_schema: str = Field(max_length=MAX_SCHEMA_CHARS, description="schemaString before the version.")
    table_schema: str = Field(
        alias="schema", max_length=MAX_SCHEMA_CHARS, description="schemaString of the version."
    )
    previous_partition_columns: list[Text] = Field(default_factory=list, max_length=MAX_SCHEMA_CHANGES)
    partition_columns: list[Text] = Field(default_factory=list, max_length=MAX_SCHEMA_CHANGES)
    properties: dict[Annotated[str, Field(max_length=MAX_TEXT_CHARS)], PropertyChange] = Field(
        default_factory=dict,
        max_length=MAX_SCHEMA_CHANGES,
        description="Table properties the version changed too: key -> before, after (absent: unset).",
    )


class ProgressRecord(_Record):
    """Where a table's publishing stands; value of the compacted progress topic, key = ``tableUri``.

    ``index`` is the last published action of ``version`` (of its snapshot when ``snapshot``);
    the version is complete when ``index + 1 == count``. The timestamp fields are those of
    ``version``, so a restart resolves the next timestamps exactly as an uninterrupted run would.
    """

    schema_version: int
    table_uri: str
    table_id: str
    version: int = Field(ge=0)
    index: int = Field(ge=-1)
    count: int = Field(ge=0)
    snapshot: bool
    commit_timestamp: int
    commit_timestamp_source: TimestampSourceName
    transactional_id: str | None = None
    updated_at: int | None = None
    #: set while a version's row changes are partly published: how many of their records are
    #: (its actions all are); absent otherwise, as in records written before row changes existed
    row_offset: int | None = Field(
        default=None,
        ge=0,
        description="Row-change records of the version already published (its actions all are); "
        "absent once the version is complete.",
    )

    @property
    def complete(self) -> bool:
        return self.index + 1 >= self.count and self.row_offset is None


CommitsTopicRecord = CommitSummary | Heartbeat | TableReplaced | TableDropped | SchemaChanged


def parse_commits_record(value: bytes | str) -> CommitsTopicRecord:
    """A commits-topic value as its model (``kind`` decides which); an unknown kind is a ValueError."""
    data = json.loads(value)
    kind = data.get("kind")
    if kind == "commit":
        return CommitSummary.model_validate(data)
    if kind == "heartbeat":
        return Heartbeat.model_validate(data)
    if kind == "tableReplaced":
        return TableReplaced.model_validate(data)
    if kind == "tableDropped":
        return TableDropped.model_validate(data)
    if kind == "schemaChanged":
        return SchemaChanged.model_validate(data)
    raise ValueError(f"unknown commits-topic record kind {kind!r}")


# --- the one decoder of what readers take from the topics -------------------------------------------


_OWN_MESSAGE = frozenset({"schema_version", "index_count"})


def _first_error(exc: ValidationError) -> str:
    first = exc.errors(include_url=False, include_input=False)[0]
    if first["type"] in _OWN_MESSAGE:
        return str(first["msg"])
    where = ".".join(str(p) for p in first["loc"])
    return f"{where}: {first['msg']}" if where else str(first["msg"])


def _refuse(message: str, where: Mapping[str, Any], **about: Any) -> BadRecordError:
    return BadRecordError(message, **{**about, **where})


def _too_large(value: bytes | str, rules: RecordRules, where: Mapping[str, Any]) -> None:
    limit = rules.limits.max_record_bytes
    if len(value) > limit:
        raise _refuse(f"a record of {len(value)} bytes is larger than a reader takes ({limit})", where)


def decode_action_event(value: bytes | str, *, rules: RecordRules | None = None, **where: Any) -> ActionEvent:
    """An actions-topic value as its model, held to the consumers' boundary (:mod:`.boundary`:
    the contract, core's rules for its action, its paths inside the table, its location); a value
    that is not one is a :class:`~.boundary.BadRecordError`.

    ``where`` (topic, partition, offset...) goes into the error so that the record can be found.
    """
    rules = DEFAULT_RULES if rules is None else rules
    _too_large(value, rules, where)
    try:
        event = ActionEvent.model_validate_json(value, strict=True)
    except ValidationError as exc:
        raise _refuse(f"not an action event: {_first_error(exc)}", where) from None
    problem = (
        rules.location_problem(event.table_uri)
        or rules.count_problem(event.count)
        or rules.action_problem(event.table_uri, event.type, event.action)
    )
    if problem is not None:
        raise _refuse(f"action {event.index} ({shown(event.type)}): {problem}", where, version=event.version)
    return event


_COMMITS_MODELS: dict[str, type[CommitsTopicRecord]] = {
    "commit": CommitSummary,
    "heartbeat": Heartbeat,
    "tableReplaced": TableReplaced,
    "tableDropped": TableDropped,
    "schemaChanged": SchemaChanged,
}
#: the record kinds this version knows on the commits topic (a newer watcher may add others)
COMMITS_KINDS = frozenset(_COMMITS_MODELS)


def decode_commits_record(
    value: bytes | str,
    kind: str | None = None,
    *,
    wanted: Iterable[str] | None = None,
    rules: RecordRules | None = None,
    **where: Any,
) -> CommitsTopicRecord | None:
    """A commits-topic value as its model, or None for a kind the reader does not want.

    ``kind`` is the record's ``kind`` header when the reader has it (the value is then parsed only
    for the kinds in ``wanted``, all known kinds by default); kinds a newer watcher may add are
    None, as the contract says to ignore them (:data:`COMMITS_KINDS` tells them from the kinds a
    reader did not want). A value of a wanted kind is held to the consumers' boundary (the
    contract, its location): one that fails is a :class:`~.boundary.BadRecordError`.
    """
    rules = DEFAULT_RULES if rules is None else rules
    wanted = _COMMITS_MODELS.keys() if wanted is None else frozenset(wanted)
    if kind is not None and kind not in wanted:
        return None
    _too_large(value, rules, where)
    record: CommitsTopicRecord
    if kind is None:
        try:
            data = from_json(value)
        except ValueError as exc:  # not JSON, or nested beyond jiter's limit
            raise _refuse(f"a commits-topic record is not JSON: {exc}", where) from None
        if not isinstance(data, dict) or not isinstance(data.get("kind", ""), str):
            raise _refuse("a commits-topic record is not an object with a text kind", where)
        kind = data.get("kind")
        if kind not in wanted or kind not in _COMMITS_MODELS:
            return None
        try:
            record = _COMMITS_MODELS[kind].model_validate(data)
        except ValidationError as exc:
            raise _refuse(f"not a {kind} record: {_first_error(exc)}", where) from None
    else:
        model = _COMMITS_MODELS.get(kind)
        if model is None:
            return None
        try:
            record = model.model_validate_json(value)
        except ValidationError as exc:
            raise _refuse(f"not a {shown(kind)} record: {_first_error(exc)}", where) from None
    problem = rules.location_problem(record.table_uri)
    if problem is not None:
        raise _refuse(f"a {kind} record: {problem}", where)
    return record


def decode_progress(value: bytes | str, **where: Any) -> ProgressRecord:
    """A progress-topic value as its model; anything else is an :class:`EventStreamError`."""
    try:
        return ProgressRecord.model_validate_json(value)
    except ValidationError as exc:
        raise EventStreamError(f"not a progress record: {_first_error(exc)}", **where) from None


# --- the hot path ---------------------------------------------------------------------------------


_TYPE_PART: dict[str, bytes] = {}


def _type_part(action_type: str) -> bytes:
    part = _TYPE_PART.get(action_type)
    if part is None:
        part = b',"type":' + to_json(action_type) + b',"action":'
        if len(_TYPE_PART) < 1024:
            _TYPE_PART[action_type] = part
    return part


class EnvelopeEncoder:
    """Encodes the action events of one version (or snapshot) in bulk.

    The fields every event of the version shares are serialized once; per action only the index,
    the type and the action body are added. An action body may be given as raw JSON bytes (the
    log line's own text, so the event carries the action exactly as the log has it) or as plain
    data (serialized with ``to_json``).
    """

    __slots__ = ("_prefix", "count", "snapshot", "table_id", "version")

    def __init__(
        self,
        *,
        table_id: str,
        table_uri: str,
        version: int,
        commit_timestamp: int,
        commit_timestamp_source: str,
        count: int,
        snapshot: bool = False,
    ) -> None:
        shared = {
            "schemaVersion": SCHEMA_VERSION,
            "tableId": table_id,
            "tableUri": table_uri,
            "version": version,
            "commitTimestamp": commit_timestamp,
            "commitTimestampSource": commit_timestamp_source,
            "count": count,
            "snapshot": snapshot,
        }
        self._prefix = to_json(shared)[:-1] + b',"index":'
        self.table_id = table_id
        self.version = version
        self.count = count
        self.snapshot = snapshot

    @property
    def prefix(self) -> bytes:
        """The bytes every event of the version starts with (up to ``"index":``): what the batch
        decoder (:mod:`.event_batches`) recognizes to read an envelope once per version."""
        return self._prefix

    def encode(self, index: int, action_type: str, body: bytes | Mapping[str, Any]) -> bytes:
        raw = body if isinstance(body, bytes) else to_json(body)
        if self.snapshot:
            end = b',"snapshotEnd":true' if index + 1 == self.count else b',"snapshotEnd":false'
            return b"".join((self._prefix, str(index).encode(), end, _type_part(action_type), raw, b"}"))
        return b"".join((self._prefix, str(index).encode(), _type_part(action_type), raw, b"}"))

    def encode_many(
        self, start: int, actions: Iterable[tuple[str, bytes | Mapping[str, Any]]]
    ) -> list[bytes]:
        """Events for consecutive actions, the first at index ``start``.

        The same bytes as :meth:`encode` per action, without its call per action (the watcher's
        hot path: a method call and an int-to-text conversion cost a fifth of the encoding).
        """
        if self.snapshot:
            return [self.encode(i, t, body) for i, (t, body) in enumerate(actions, start)]
        actions = actions if isinstance(actions, list) else list(actions)
        if not actions:
            return []
        stop = start + len(actions)
        indexes = (
            INDEX_TEXT[start:stop]
            if stop <= len(INDEX_TEXT)
            else [str(i).encode() for i in range(start, stop)]
        )
        types, bodies = zip(*actions, strict=True)
        try:  # C-level maps: no Python step per action
            return list(
                map(
                    b"".join,
                    zip(
                        repeat(self._prefix),
                        indexes,
                        map(_TYPE_PART.__getitem__, types),
                        bodies,
                        repeat(b"}"),
                        strict=False,  # repeat() is endless
                    ),
                )
            )
        except (KeyError, TypeError):  # a type met for the first time, a body to encode
            prefix, join = self._prefix, b"".join
            return [
                join((prefix, i, _type_part(t), body if isinstance(body, bytes) else to_json(body), b"}"))
                for i, t, body in zip(indexes, types, bodies, strict=True)
            ]


# --- JSON Schema ----------------------------------------------------------------------------------


def _action_schemas(defs: dict[str, Any]) -> list[dict[str, Any]]:
    """``if type == X then action matches X's model`` for every action type deltamirror knows."""
    rules = []
    for name, model in models.ACTION_MODELS.items():
        schema = model.model_json_schema(by_alias=True, mode="validation", ref_template="#/$defs/{model}")
        for key, sub in schema.pop("$defs", {}).items():
            defs.setdefault(key, sub)
        title = model.__name__
        defs[title] = schema
        rules.append(
            {
                "if": {"properties": {"type": {"const": name}}, "required": ["type"]},
                "then": {"properties": {"action": {"$ref": f"#/$defs/{title}"}}},
            }
        )
    return rules


def json_schema() -> dict[str, Any]:
    """The JSON Schema document: an action event at the root, every record kind under ``$defs``."""
    defs: dict[str, Any] = {}
    root = ActionEvent.model_json_schema(by_alias=True, mode="validation", ref_template="#/$defs/{model}")
    root.pop("$defs", None)
    root["allOf"] = _action_schemas(defs)
    for model in (CommitSummary, Heartbeat, TableReplaced, TableDropped, SchemaChanged, ProgressRecord):
        schema = model.model_json_schema(by_alias=True, mode="validation", ref_template="#/$defs/{model}")
        for key, sub in schema.pop("$defs", {}).items():
            defs.setdefault(key, sub)
        defs[model.__name__] = schema
    defs["CommitsTopicRecord"] = {
        "oneOf": [
            {"$ref": f"#/$defs/{m.__name__}"}
            for m in (CommitSummary, Heartbeat, TableReplaced, TableDropped, SchemaChanged)
        ]
    }
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "x-schemaVersion": SCHEMA_VERSION,
        **root,
        "$defs": dict(sorted(defs.items())),
    }


def json_schema_text() -> str:
    """The schema as committed in ``schemas/event.schema.json`` (stable formatting)."""
    return json.dumps(json_schema(), indent=2, ensure_ascii=False) + "\n"


__all__: Sequence[str] = [
    "COMMITS_KINDS",
    "MAX_SUMMED_BYTES",
    "SCHEMA_VERSION",
    "ActionEvent",
    "ColumnChangeEntry",
    "CommitSummary",
    "CommitsTopicRecord",
    "EnvelopeEncoder",
    "Heartbeat",
    "ProgressRecord",
    "PropertyChange",
    "SchemaChanged",
    "TableDropped",
    "TableReplaced",
    "decode_action_event",
    "decode_commits_record",
    "decode_progress",
    "json_schema",
    "json_schema_text",
    "parse_commits_record",
]
