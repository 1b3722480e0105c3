"""Typed Delta log actions: the contract of what a commit may contain.

Every model is frozen, uses Delta's camelCase names on the wire and snake_case in Python, keeps
fields it does not know (a newer writer's) and dumps back exactly what it read, so that a mirror
never loses information. They validate at the edges (one commit, one metaData); hot paths over
many files use Arrow (see :mod:`action_schema`) and never build a model per file.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any, ClassVar, Literal

import pydantic_core
from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from .actions import PartitionKeys, Where, field_problem, validator_for
from .errors import CorruptLogError, DeltaMirrorError, SchemaError
from .schema import StructType, column_mapping_mode, parse_schema, physical_name


class DeltaModel(BaseModel):
    """Frozen, camelCase on the wire, unknown fields kept."""

    model_config = ConfigDict(
        frozen=True,
        alias_generator=to_camel,
        populate_by_name=True,
        extra="allow",
        ignored_types=(cached_property,),
        # validators are built when first used, not at import: a command that never validates
        # an action (consume-snapshot restarting over its saved state) does not pay for them
        defer_build=True,
    )

    def to_dict(self) -> dict[str, Any]:
        """The action as it appears in the log: Delta's names, only what was set."""
        return self.model_dump(by_alias=True, exclude_unset=True, mode="json")


# --- actions ----------------------------------------------------------------------------------

#: the instance key under which a metaData remembers where it was read (not a field)
_ORIGIN = "_deltamirror_origin"


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
        """The table schema, parsed from ``schemaString`` once.

        A metaData without one is readable at the log level (a Delta Live Tables setup commit has
        one), but no reader of rows can go on: the refusal names where the log holds it."""
        if self.schema_string is None:
            raise self.refuse(f"metaData {self.id} has no schemaString", SchemaError)
        return parse_schema(self.schema_string)

    def located(self, where: Where, line: int | None = None) -> Metadata:
        """This metaData, remembering where the log holds it (a commit's file and line, or a
        checkpoint file): a refusal of it found later, by a reader of rows, names that place.

        Kept beside the fields, never one of them: equality and dumps ignore it, and remembering
        costs one store per metaData read (a table has few)."""
        self.__dict__[_ORIGIN] = (where, line)
        return self

    @property
    def origin(self) -> tuple[Where, int | None] | None:
        """(file, line) where the log holds this metaData, when the reader that read it said so."""
        origin: tuple[Where, int | None] | None = self.__dict__.get(_ORIGIN)
        return origin

    def refuse(self, message: str, error: type[DeltaMirrorError] = CorruptLogError) -> DeltaMirrorError:
        """``error`` about this metaData, naming where the log holds it when that is known."""
        where, line = self.origin or (Where(None, None), None)
        return error(message, table=where.table, version=where.version, file=where.file, line=line)

    @cached_property
    def partition_keys(self) -> PartitionKeys:
        """(physical, logical) name of each partition column: the keys ``partitionValues`` may use.

        Under column mapping the physical name keys them; a table upgraded to ``name`` mode keeps
        the logical one, so either counts. A column missing from the schema keys by its name.
        """
        if not self.partition_columns:
            return ()
        mode = column_mapping_mode(self.configuration)
        if mode == "none":
            return tuple((name, name) for name in self.partition_columns)
        keys = []
        for name in self.partition_columns:
            try:
                keys.append((physical_name(self.table_schema.field(name), mode), name))
            except SchemaError:  # not in the schema: reading the table says so; here it keys by name
                keys.append((name, name))
        return tuple(keys)


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

    # built when first used, as DeltaModel's: built at import it was the one validator a
    # consume-snapshot restart built before its settings (and its pydantic plugin scan)
    model_config = ConfigDict(frozen=True, defer_build=True)
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


def parse_action(
    wrapped: dict[str, Any],
    *,
    file: str | None = None,
    line: int | None = None,
    table: str | None = None,
    version: int | None = None,
) -> Action:
    """One action already decoded from JSON (``{"add": {...}}``), checked as the log boundary
    (:mod:`.actions`) checks a line, to its typed model."""
    where = Where(table, file, version)
    if not isinstance(wrapped, dict) or len(wrapped) != 1:
        raise where.refuse("an action is an object with exactly one action type", line)
    name, body = next(iter(wrapped.items()))
    try:
        value = validator_for(name).validate_python(body)
    except pydantic_core.ValidationError as exc:
        raise where.refuse(field_problem(name, exc), line) from None
    return model_of(name, value)


def model_of(name: str, value: Any) -> Action:
    """The model of an action the boundary validated (its value as :mod:`.actions` returns it)."""
    model = ACTION_MODELS.get(name)
    if model is None:
        return UnknownAction(action_name=name, raw={name: value})
    return model.model_validate(value)  # type: ignore[return-value]


def wrap(action: Action) -> dict[str, Any]:
    """The log-line form of an action (``{"add": {...}}``)."""
    if isinstance(action, UnknownAction):
        return action.raw
    return {action.action_name: action.to_dict()}
