"""What each action of the log must hold, as pydantic-core validators, and how a refusal reads.

Written from PROTOCOL.md's action tables: required fields present, types exact (strict: ``1.0``
is not a long, ``1`` is not a boolean, ``"5"`` is not a size), ranges as the protocol gives them
(Long and Int, sizes and counts non-negative, protocol versions positive). Fields this version
does not know are kept; like ``commitInfo`` and unknown actions, which the protocol leaves free,
they need only finite numbers (an integer of any size is JSON, and printed as it is). A
``metaData``'s ``schemaString`` must be a Delta schema naming its partition columns, a
``protocol`` at reader version 3 or writer version 7 must list its features. :mod:`.actions`
applies these to the log's raw bytes.
"""

from __future__ import annotations

import json
import math
from typing import Annotated, Any, Literal

import msgspec
from pydantic_core import PydanticCustomError, SchemaValidator, ValidationError
from pydantic_core import core_schema as cs

from .errors import SchemaError
from .schema import parse_schema

I64_MIN, I64_MAX, I32_MAX = -(2**63), 2**63 - 1, 2**31 - 1
_FINITE = "expected finite numbers (no NaN, Infinity or 1e999)"
FILE_ACTIONS = frozenset({"add", "remove", "cdc"})


# --- what each action must hold ------------------------------------------------------------------


def finite(value: Any) -> Any:
    """Free-form JSON (commitInfo, unknown actions and fields) needs finite numbers only: a NaN
    or an Infinity (or a number too large for a double, which parsers read as one) is not JSON
    any reader of a mirror can take."""
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is float:
            if not math.isfinite(item):
                raise PydanticCustomError("json_value", _FINITE)
        elif kind is dict:
            stack.extend(item.values())
        elif kind is list:
            stack.extend(item)
    return value


#: strings, booleans, integers and null are checked in Rust; a float, an object or an array costs a
#: Python call
_FREE = cs.union_schema(
    [
        cs.str_schema(strict=True),
        cs.bool_schema(strict=True),
        cs.int_schema(strict=True),
        cs.none_schema(),
        cs.no_info_plain_validator_function(finite),
    ],
    mode="left_to_right",
    custom_error_type="json_value",
    custom_error_message=_FINITE,
)
_STRICT = cs.CoreConfig(strict=True, allow_inf_nan=False)

#: (schema, what it expects, the same type for msgspec or None) of the field types the protocol
#: uses: each rule is written once, here, and compiled for both (:data:`STRUCTS`)
_Type = tuple[cs.CoreSchema, str, Any]
_STR: _Type = (cs.str_schema(), "a string", str)
_PATH: _Type = (cs.str_schema(min_length=1), "a non-empty string", Annotated[str, msgspec.Meta(min_length=1)])
_BOOL: _Type = (cs.bool_schema(), "true or false", bool)
_LONG: _Type = (
    cs.int_schema(ge=I64_MIN, le=I64_MAX),
    "a 64-bit integer",
    Annotated[int, msgspec.Meta(ge=I64_MIN, le=I64_MAX)],
)
_SIZE: _Type = (
    cs.int_schema(ge=0, le=I64_MAX),
    "a non-negative 64-bit integer",
    Annotated[int, msgspec.Meta(ge=0, le=I64_MAX)],
)
_INT32: _Type = (
    cs.int_schema(ge=0, le=I32_MAX),
    "a non-negative 32-bit integer",
    Annotated[int, msgspec.Meta(ge=0, le=I32_MAX)],
)
_VERSION: _Type = (cs.int_schema(ge=1, le=I32_MAX), "a positive 32-bit integer", None)

#: expected text by field pattern: ("add", "partitionValues", "*") is any entry of that map
_EXPECT: dict[tuple[str, ...], str] = {}
#: a field's type and whether it must be there: True (required, not null), False (optional, may be
#: null), or OMITTABLE (optional, but not null: the models give it a default)
OMITTABLE = "omittable"
_Field = tuple[_Type, bool | str]


def _string_map(where: tuple[str, ...], *, nulls: bool = True) -> _Type:
    value = cs.nullable_schema(cs.str_schema()) if nulls else cs.str_schema()
    _EXPECT[(*where, "*")] = "a string or null" if nulls else "a string"
    text = "an object of strings" + (" or nulls" if nulls else "")
    return cs.dict_schema(cs.str_schema(), value), text, dict[str, str | None] if nulls else dict[str, str]


def _free_map(where: tuple[str, ...]) -> _Type:
    _EXPECT[(*where, "*")] = _FINITE.removeprefix("expected ")
    return cs.dict_schema(cs.str_schema(), _FREE), "an object", None


def _string_list(where: tuple[str, ...]) -> _Type:
    _EXPECT[(*where, "#")] = "a string"
    return cs.list_schema(cs.str_schema()), "an array of strings", None


def _object(where: tuple[str, ...], fields: dict[str, _Field]) -> _Type:
    """A JSON object with these fields (optional ones may be null); other fields are kept.

    Where every field's type has a msgspec form, the object is also compiled to a
    :class:`msgspec.Struct` of the same fields (:func:`_struct`)."""
    typed = {}
    for name, ((schema, text, _), presence) in fields.items():
        _EXPECT[(*where, name)] = text
        if presence is False:
            schema = cs.nullable_schema(schema)
        typed[name] = cs.typed_dict_field(schema, required=presence is True)
    _EXPECT[where] = "a JSON object"
    schema = cs.typed_dict_schema(typed, extra_behavior="allow", extras_schema=_FREE, config=_STRICT)
    return schema, "a JSON object", _struct(where, fields)


def _struct(where: tuple[str, ...], fields: dict[str, _Field]) -> type[msgspec.Struct] | None:
    """The msgspec form of an object: the same fields, types and presence, and no other field (a
    line with one is left to the pydantic-core validator, which keeps it and checks it)."""
    if any(kind is None or presence is OMITTABLE for (_, _, kind), presence in fields.values()):
        return None
    required = [(name, kind) for name, ((_, _, kind), presence) in fields.items() if presence is True]
    optional = [
        (name, kind | None, None) for name, ((_, _, kind), presence) in fields.items() if presence is False
    ]
    struct = msgspec.defstruct(
        "_".join(where),
        [*required, *optional],
        kw_only=True,
        forbid_unknown_fields=True,
        # decoded from JSON, a value holds no reference cycle: the collector need not track it
        gc=False,
        module=__name__,
    )
    _NESTED[struct] = {
        name: kind
        for name, ((_, _, kind), _) in fields.items()
        if isinstance(kind, type) and issubclass(kind, msgspec.Struct)
    }
    return struct


#: per Struct, its fields that are Structs themselves (a deletion vector)
_NESTED: dict[type[msgspec.Struct], dict[str, type[msgspec.Struct]]] = {}


def _known(kind: type[msgspec.Struct], value: dict[str, Any]) -> dict[str, Any]:
    nested = _NESTED[kind]
    return {
        name: _known(nested[name], value[name]) if name in nested and value[name] is not None else value[name]
        for name in kind.__struct_fields__
        if name in value
    }


def to_struct(name: str, value: dict[str, Any]) -> msgspec.Struct:
    """The Struct of a file action :data:`VALIDATORS` accepted (fields unknown to this version,
    checked there, are left out: the action's own bytes still hold them)."""
    kind = STRUCTS[name]
    return msgspec.convert(_known(kind, value), kind)


def _dv(where: tuple[str, ...]) -> _Type:
    storage_type: _Type = (
        cs.literal_schema(["u", "i", "p"]),
        "one of 'u', 'i', 'p'",
        Literal["u", "i", "p"],
    )
    return _object(
        where,
        {
            "storageType": (storage_type, True),
            "pathOrInlineDv": (_PATH, True),
            "offset": (_INT32, False),
            "sizeInBytes": (_INT32, True),
            "cardinality": (_SIZE, True),
            "maxRowIndex": (_SIZE, False),
        },
    )


def _action_schemas() -> dict[str, cs.CoreSchema]:
    return {name: schema for name, (schema, _, _) in _action_types().items()}


def _action_types() -> dict[str, _Type]:
    a, r, c = ("add",), ("remove",), ("cdc",)
    md, fmt = ("metaData",), ("metaData", "format")
    return {
        "add": _object(
            a,
            {
                "path": (_PATH, True),
                "partitionValues": (_string_map((*a, "partitionValues")), True),
                "size": (_SIZE, True),
                "modificationTime": (_LONG, True),
                "dataChange": (_BOOL, True),
                "stats": (_STR, False),
                "tags": (_string_map((*a, "tags")), False),
                "deletionVector": (_dv((*a, "deletionVector")), False),
                "baseRowId": (_SIZE, False),
                "defaultRowCommitVersion": (_SIZE, False),
                "clusteringProvider": (_STR, False),
            },
        ),
        "remove": _object(
            r,
            {
                "path": (_PATH, True),
                "deletionTimestamp": (_LONG, False),
                "dataChange": (_BOOL, True),
                "extendedFileMetadata": (_BOOL, False),
                "partitionValues": (_string_map((*r, "partitionValues")), False),
                "size": (_SIZE, False),
                "stats": (_STR, False),
                "tags": (_string_map((*r, "tags")), False),
                "deletionVector": (_dv((*r, "deletionVector")), False),
                "baseRowId": (_SIZE, False),
                "defaultRowCommitVersion": (_SIZE, False),
            },
        ),
        "cdc": _object(
            c,
            {
                "path": (_PATH, True),
                "partitionValues": (_string_map((*c, "partitionValues")), True),
                "size": (_SIZE, True),
                "dataChange": (_BOOL, True),
                "tags": (_string_map((*c, "tags")), False),
            },
        ),
        "metaData": _object(
            md,
            {
                "id": (_PATH, True),
                "name": (_STR, False),
                "description": (_STR, False),
                "format": (
                    _object(
                        fmt,
                        {
                            "provider": (_STR, True),
                            "options": (_string_map((*fmt, "options"), nulls=False), OMITTABLE),
                        },
                    ),
                    True,
                ),
                # required too, but left out by some writers (a Delta Live Tables setup commit)
                "schemaString": (_STR, False),
                "partitionColumns": (_string_list((*md, "partitionColumns")), True),
                "configuration": (_string_map((*md, "configuration"), nulls=False), True),
                "createdTime": (_LONG, False),
            },
        ),
        "protocol": _object(
            ("protocol",),
            {
                "minReaderVersion": (_VERSION, True),
                "minWriterVersion": (_VERSION, True),
                "readerFeatures": (_string_list(("protocol", "readerFeatures")), False),
                "writerFeatures": (_string_list(("protocol", "writerFeatures")), False),
            },
        ),
        "txn": _object(
            ("txn",), {"appId": (_STR, True), "version": (_LONG, True), "lastUpdated": (_LONG, False)}
        ),
        "domainMetadata": _object(
            ("domainMetadata",),
            {"domain": (_STR, True), "configuration": (_STR, True), "removed": (_BOOL, True)},
        ),
        "commitInfo": _object(
            ("commitInfo",),
            {
                "timestamp": (_LONG, False),
                "inCommitTimestamp": (_LONG, False),
                "operation": (_STR, False),
                "operationParameters": (_free_map(("commitInfo", "operationParameters")), False),
                "operationMetrics": (_free_map(("commitInfo", "operationMetrics")), False),
                "readVersion": (_LONG, False),
                "isolationLevel": (_STR, False),
                "isBlindAppend": (_BOOL, False),
                "engineInfo": (_STR, False),
                "txnId": (_STR, False),
            },
        ),
        "checkpointMetadata": _object(
            ("checkpointMetadata",),
            {
                "version": (_SIZE, True),
                "tags": (_string_map(("checkpointMetadata", "tags"), nulls=False), False),
            },
        ),
        "sidecar": _object(
            ("sidecar",),
            {
                "path": (_PATH, True),
                "sizeInBytes": (_SIZE, True),
                "modificationTime": (_LONG, True),
                "tags": (_string_map(("sidecar", "tags"), nulls=False), False),
            },
        ),
    }


def _field_error(field: str, problem: str) -> PydanticCustomError:
    return PydanticCustomError("action_field", "{problem}", {"field": field, "problem": problem})


def _protocol_features(value: dict[str, Any]) -> dict[str, Any]:
    """Reader version 3 lists its reader features, writer version 7 its writer features."""
    for version, features, at in (
        ("minReaderVersion", "readerFeatures", 3),
        ("minWriterVersion", "writerFeatures", 7),
    ):
        if value[version] == at and value.get(features) is None:
            raise _field_error(features, f"required field missing ({version} is {at})")
    return value


def _metadata_schema(value: dict[str, Any]) -> dict[str, Any]:
    """``schemaString`` is a Delta schema (strict JSON, a struct of typed fields) that names every
    partition column; a metaData that cannot describe a table is refused with its line."""
    text = value.get("schemaString")
    if text is None:
        return value
    try:
        schema = parse_schema(text)
    except SchemaError as exc:
        raise _field_error("schemaString", f"expected a Delta schema ({exc.message})") from None
    names = {f.name.lower() for f in schema.fields}
    for column in value["partitionColumns"]:
        if column.lower() not in names:
            raise _field_error("partitionColumns", f"{json.dumps(column)} is not a column of the schema")
    return value


def _checked(name: str, schema: cs.CoreSchema) -> cs.CoreSchema:
    after = {"protocol": _protocol_features, "metaData": _metadata_schema}.get(name)
    return schema if after is None else cs.no_info_after_validator_function(after, schema)


_TYPES = _action_types()
VALIDATORS: dict[str, SchemaValidator] = {
    name: SchemaValidator(_checked(name, schema)) for name, (schema, _, _) in _TYPES.items()
}
KNOWN_ACTIONS = frozenset(VALIDATORS)
#: the file actions compiled to msgspec Structs, from the same fields: what :data:`VALIDATORS`
#: accepts of a line without fields unknown to this version, decoded in C without a dict per object.
#: A line one refuses is left to :data:`VALIDATORS`, whose verdict stands (and names the field);
#: tests/core/test_boundary_agreement.py holds the two to the same answers.
STRUCTS: dict[str, type[msgspec.Struct]] = {name: _TYPES[name][2] for name in sorted(FILE_ACTIONS)}
STRUCT_DECODERS: dict[str, msgspec.json.Decoder[Any]] = {
    name: msgspec.json.Decoder(kind) for name, kind in STRUCTS.items()
}

#: fields of the file actions that a reader publishing the log's own bytes (the watcher) does not
#: read (``stats``), or reads once per distinct text (``partitionValues``): :data:`FORWARD_DECODERS`
#: keeps them as raw JSON. (``tags`` are built: a check of their raw text afterwards, one decode
#: per distinct text, measured dearer than the dict msgspec builds on the way.)
FORWARDED_FIELDS = ("partitionValues", "stats")
#: an optional forwarded field that is absent reads as JSON null
RAW_NULL = msgspec.Raw(b"null")


def _forwarding(kind: type[msgspec.Struct]) -> type[msgspec.Struct]:
    """``kind`` with its :data:`FORWARDED_FIELDS` as :class:`msgspec.Raw`: msgspec still parses
    their text (strict JSON syntax, escapes, surrogates; not UTF-8) but builds no object of it."""
    required, optional = [], []
    info = msgspec.inspect.type_info(kind)
    assert isinstance(info, msgspec.inspect.StructType)
    for f in info.fields:
        forwarded = f.name in FORWARDED_FIELDS
        typ = msgspec.Raw if forwarded else kind.__annotations__[f.name]
        if f.required:
            required.append((f.name, typ))
        else:
            optional.append((f.name, typ, RAW_NULL if forwarded else None))
    return msgspec.defstruct(
        "forward_" + kind.__name__,
        [*required, *optional],
        kw_only=True,
        forbid_unknown_fields=True,
        gc=False,
        module=__name__,
    )


#: the file actions with :data:`FORWARDED_FIELDS` left as raw JSON; what one of them must hold is
#: checked afterwards by :data:`FORWARD_CHECKS` (core.actions does both, on UTF-8 text only)
FORWARD_DECODERS: dict[str, msgspec.json.Decoder[Any]] = {
    name: msgspec.json.Decoder(_forwarding(kind)) for name, kind in STRUCTS.items()
}
#: per file action, per forwarded field it has: None for "a string or null" (the raw text, valid
#: JSON, then only needs to start with a quote or be null), else the decoder of the field's own
#: type in the Struct (run once per distinct text)
FORWARD_CHECKS: dict[str, dict[str, msgspec.json.Decoder[Any] | None]] = {
    name: {
        field: None
        if kind.__annotations__[field] == (str | None)
        else msgspec.json.Decoder(kind.__annotations__[field])
        for field in FORWARDED_FIELDS
        if field in kind.__struct_fields__
    }
    for name, kind in STRUCTS.items()
}
#: an action type this version does not know: any JSON value with finite numbers
_UNKNOWN = SchemaValidator(_FREE, config=_STRICT)


def validator_for(name: str) -> SchemaValidator:
    return VALIDATORS.get(name, _UNKNOWN)


def _shown(part: str | int) -> str:
    if isinstance(part, int):
        return f"[{part}]"
    return f".{part}" if part.isidentifier() else "." + json.dumps(part)  # one line, whatever the key


def field_problem(name: str, exc: ValidationError) -> str:
    """``add.size: expected a non-negative 64-bit integer`` for the first error of ``exc``."""
    error = exc.errors(include_url=False, include_input=False)[0]
    loc = tuple(p for p in error["loc"] if isinstance(p, int | str))
    if error["type"] == "json_invalid":
        return "invalid JSON: " + no_line(str(error.get("ctx", {}).get("error", error["msg"])))
    pattern: tuple[str, ...] = (name,)
    for part in loc:  # field names where known, "*" for a map entry, "#" for a list item
        step = (
            part
            if isinstance(part, str) and (*pattern, part) in _EXPECT
            else "#"
            if isinstance(part, int)
            else "*"
        )
        pattern = (*pattern, step)
    where = name + "".join(_shown(p) for p in loc)
    if error["type"] == "missing":
        return f"{where}: required field missing"
    if error["type"] == "action_field":
        return f"{where}.{error['ctx']['field']}: {error['ctx']['problem']}"
    expected = _EXPECT.get(pattern) if error["type"] != "json_value" else None
    if expected is None:
        expected = (
            _FINITE.removeprefix("expected ") if error["type"] == "json_value" else str(error["msg"]).lower()
        )
    return f"{where}: expected {expected}"


def no_line(message: str) -> str:
    """jiter says "at line 1 column N" of what it parsed, which is one log line."""
    return message.replace(" at line 1 column ", " at column ")
