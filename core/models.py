"""Typed Delta log actions: the contract of what a commit may contain.

Every model is frozen, uses Delta's camelCase names on the wire and snake_case in Python, keeps
fields it does not know (a newer writer's) and dumps back exactly what it read, so that a mirror
never loses information. They validate at the edges (one commit, one metaData); hot paths over
many files use Arrow (see :mod:`action_schema`) and never build a model per file.
"""

from __future__ import annotations

import json
from functools import cached_property
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

from .errors import CorruptLogError, SchemaError
from .schema import StructType, parse_schema


class DeltaModel(BaseModel):
    """Frozen, camelCase on the wire, unknown fields kept."""

    model_config = ConfigDict(
        frozen=True,
        alias_generator=to_camel,
        populate_by_name=True,
        extra="allow",
        ignored_types=(cached_property,),
    )

    def to_dict(self) -> dict[str, Any]:
        """The action as it appears in the log: Delta's names, only what was set."""
        return self.model_dump(by_alias=True, exclude_unset=True, mode="json")


# --- actions ----------------------------------------------------------------------------------


class DeletionVectorDescriptor(DeltaModel):
    storage_type: Literal["u", "i", "p"] | str
    path_or_inline_dv: str
    offset: int | None = None
    size_in_bytes: int
    cardinality: int
    max_row_index: int | None = None

    @property
    def unique_id(self) -> str:
        base = f"{self.storage_type}{self.path_or_inline_dv}"
        return f"{base}@{self.offset}" if self.offset is not None else base


class Format(DeltaModel):
    provider: str = "parquet"
    options: dict[str, str] = Field(default_factory=dict)


class Protocol(DeltaModel):
    action_name: ClassVar[str] = "protocol"
    min_reader_version: int
    min_writer_version: int
    reader_features: list[str] | None = None
    writer_features: list[str] | None = None


class Metadata(DeltaModel):
    action_name: ClassVar[str] = "metaData"
    id: str
    name: str | None = None
    description: str | None = None
    format: Format = Field(default_factory=Format)
    schema_string: str | None = None  # required by the protocol, absent in some old test logs
    partition_columns: list[str] = Field(default_factory=list)
    configuration: dict[str, str] = Field(default_factory=dict)
    created_time: int | None = None

    @cached_property
    def table_schema(self) -> StructType:
        """The table schema, parsed from ``schemaString`` once."""
        if self.schema_string is None:
            raise SchemaError(f"metaData {self.id} has no schemaString")
        return parse_schema(self.schema_string)


class AddFile(DeltaModel):
    action_name: ClassVar[str] = "add"
    path: str
    partition_values: dict[str, str | None] = Field(default_factory=dict)
    size: int
    modification_time: int
    data_change: bool
    stats: str | None = None
    tags: dict[str, str | None] | None = None
    deletion_vector: DeletionVectorDescriptor | None = None
    base_row_id: int | None = None
    default_row_commit_version: int | None = None
    clustering_provider: str | None = None


class RemoveFile(DeltaModel):
    action_name: ClassVar[str] = "remove"
    path: str
    deletion_timestamp: int | None = None
    data_change: bool
    extended_file_metadata: bool | None = None
    partition_values: dict[str, str | None] | None = None
    size: int | None = None
    stats: str | None = None
    tags: dict[str, str | None] | None = None
    deletion_vector: DeletionVectorDescriptor | None = None
    base_row_id: int | None = None
    default_row_commit_version: int | None = None


class AddCDCFile(DeltaModel):
    action_name: ClassVar[str] = "cdc"
    path: str
    partition_values: dict[str, str | None] = Field(default_factory=dict)
    size: int
    data_change: bool = False
    tags: dict[str, str | None] | None = None


class Txn(DeltaModel):
    action_name: ClassVar[str] = "txn"
    app_id: str
    version: int
    last_updated: int | None = None


class DomainMetadata(DeltaModel):
    action_name: ClassVar[str] = "domainMetadata"
    domain: str
    configuration: str
    removed: bool = False


class CommitInfo(DeltaModel):
    """Provenance; free-form in the protocol, so every field is optional and extras are kept."""

    action_name: ClassVar[str] = "commitInfo"
    timestamp: int | None = None
    in_commit_timestamp: int | None = None
    operation: str | None = None
    operation_parameters: dict[str, Any] | None = None
    operation_metrics: dict[str, Any] | None = None
    read_version: int | None = None
    isolation_level: str | None = None
    is_blind_append: bool | None = None
    engine_info: str | None = None
    txn_id: str | None = None


class CheckpointMetadata(DeltaModel):
    action_name: ClassVar[str] = "checkpointMetadata"
    version: int
    tags: dict[str, str] | None = None


class Sidecar(DeltaModel):
    action_name: ClassVar[str] = "sidecar"
    path: str
    size_in_bytes: int
    modification_time: int
    tags: dict[str, str] | None = None


class UnknownAction(BaseModel):
    """An action type this version does not know; kept whole and reported, never dropped."""

    model_config = ConfigDict(frozen=True)
    action_name: str
    raw: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return self.raw


Action = (
    AddFile
    | RemoveFile
    | AddCDCFile
    | Metadata
    | Protocol
    | Txn
    | DomainMetadata
    | CommitInfo
    | CheckpointMetadata
    | Sidecar
    | UnknownAction
)

ACTION_MODELS: dict[str, type[DeltaModel]] = {
    m.action_name: m
    for m in (
        AddFile,
        RemoveFile,
        AddCDCFile,
        Metadata,
        Protocol,
        Txn,
        DomainMetadata,
        CommitInfo,
        CheckpointMetadata,
        Sidecar,
    )
}

ACTION_TYPES: tuple[str, ...] = tuple(ACTION_MODELS)


def action_type(wrapped: dict[str, Any]) -> str:
    """The action type of one log line (``{"add": {...}}`` -> ``"add"``)."""
    if len(wrapped) != 1:
        raise ValueError(f"a log line holds exactly one action, found keys {sorted(wrapped)}")
    return next(iter(wrapped))


def parse_action(
    wrapped: dict[str, Any], *, file: str | None = None, line: int | None = None, table: str | None = None
) -> Action:
    """One log line (already JSON-decoded) to its typed action."""
    try:
        name = action_type(wrapped)
    except ValueError as exc:
        raise CorruptLogError(str(exc), table=table, file=file, line=line) from exc
    body = wrapped[name]
    model = ACTION_MODELS.get(name)
    if model is None:
        return UnknownAction(action_name=name, raw=wrapped)
    try:
        return model.model_validate(body)  # type: ignore[return-value]
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise CorruptLogError(
            f"invalid {name} action: {where}: {first['msg']}", table=table, file=file, line=line
        ) from exc


def wrap(action: Action) -> dict[str, Any]:
    """The log-line form of an action (``{"add": {...}}``)."""
    if isinstance(action, UnknownAction):
        return action.raw
    return {action.action_name: action.to_dict()}


def dumps_action(action: Action) -> str:
    return json.dumps(wrap(action), separators=(",", ":"))
