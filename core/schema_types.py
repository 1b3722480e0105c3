"""Delta table schemas (``metaData.schemaString``) as typed values: parsed, compared, written back.

Parsing keeps everything a writer put in the JSON (unknown keys, column metadata, the object form
``{"type": "variant"}``, a key left out) so that :meth:`StructType.to_json_string` gives back the
same JSON: a mirror republishes schemas and must not alter them. Equality ignores those spelling
details, so a parsed schema equals the same schema built in code. What a schema means for data
files and Arrow (column mapping, Arrow types) is :mod:`.schema`'s.
"""

from __future__ import annotations

import functools
import itertools
import json
import re
import sys
from collections.abc import Iterable, Mapping
from typing import Annotated, Any, ClassVar

import pydantic_core
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    model_serializer,
    model_validator,
)
from pydantic.alias_generators import to_camel

from .errors import SchemaError

__all__ = [
    "PRIMITIVE_TYPE_NAMES",
    "ArrayType",
    "DataType",
    "DecimalType",
    "DeltaType",
    "MapType",
    "PrimitiveType",
    "StructField",
    "StructType",
    "parse_schema",
]

PRIMITIVE_TYPE_NAMES = frozenset(
    {
        "string",
        "long",
        "integer",
        "short",
        "byte",
        "float",
        "double",
        "boolean",
        "binary",
        "date",
        "timestamp",
        "timestamp_ntz",
        "variant",
        "void",
    }
)

_DECIMAL = re.compile(r"^decimal\(\s*(-?\d+)\s*,\s*(-?\d+)\s*\)$")
# set as validation context by parse_schema: only JSON input records how it was spelled
_FROM_JSON = "deltamirror.schema.from_json"


def _is_json_input(info: ValidationInfo) -> bool:
    return isinstance(info.context, Mapping) and bool(info.context.get(_FROM_JSON))


class _SchemaNode(BaseModel):
    """A node of a schema: frozen, camelCase on the wire, unknown keys kept as extras."""

    # validators built on first use, not at import (see deltamirror.core.models.DeltaModel); the
    # forward references (DataType, below the classes) are resolved then from this module
    model_config = ConfigDict(
        frozen=True, populate_by_name=True, alias_generator=to_camel, extra="allow", defer_build=True
    )

    # the "type" key of this node's JSON object, consumed by validation (None: not an object)
    _wire_type: ClassVar[str | None] = None
    # wire keys the source JSON left out (defaults apply, but are not written back)
    _absent: frozenset[str] = PrivateAttr(default_factory=frozenset)

    @model_validator(mode="before")
    @classmethod
    def _drop_type_key(cls, data: Any) -> Any:
        if cls._wire_type is not None and isinstance(data, Mapping) and "type" in data:
            if data["type"] != cls._wire_type:
                raise ValueError(f"expected type {cls._wire_type!r}, not {data['type']!r}")
            return {k: v for k, v in data.items() if k != "type"}
        return data

    def to_json_value(self) -> Any:
        """The node as Delta writes it in ``schemaString`` (a str for primitives, else a dict)."""
        return self._json(exact=True)

    def _json(self, *, exact: bool) -> Any:
        raise NotImplementedError

    def _finish(self, out: dict[str, Any], *, exact: bool) -> dict[str, Any]:
        if exact:
            for key in self._absent:
                out.pop(key, None)
        for key, value in (self.__pydantic_extra__ or {}).items():
            out.setdefault(key, value)
        return out

    @model_serializer(mode="plain")
    def _serialize(self) -> Any:
        return self.to_json_value()

    @model_validator(mode="after")
    def _record_absent(self, info: ValidationInfo) -> _SchemaNode:
        if _is_json_input(info):
            optional = {
                (f.alias or name)
                for name, f in type(self).model_fields.items()
                if not f.is_required() and name not in self.model_fields_set
            }
            self._absent = frozenset(optional)
        return self

    def __eq__(self, other: object) -> bool:
        if type(self) is not type(other):
            return NotImplemented
        assert isinstance(other, _SchemaNode)
        return self.__dict__ == other.__dict__ and (self.__pydantic_extra__ or {}) == (
            other.__pydantic_extra__ or {}
        )

    def __hash__(self) -> int:
        return hash(json.dumps(self._json(exact=False), sort_keys=True, default=str))


class PrimitiveType(_SchemaNode):
    """A type named by a bare string: ``long``, ``timestamp_ntz``, ``variant``, or one unknown here."""

    name: str
    # `{"type": "variant"}` is as legal as `"variant"`; keep the spelling the writer chose
    _as_object: bool = PrivateAttr(default=False)

    def _json(self, *, exact: bool) -> Any:
        if exact and (self._as_object or self.__pydantic_extra__):
            return self._finish({"type": self.name}, exact=exact)
        return self.name


class DecimalType(_SchemaNode):
    """``decimal(precision,scale)``."""

    precision: int
    scale: int
    _spelling: str | None = PrivateAttr(default=None)
    _as_object: bool = PrivateAttr(default=False)

    def _json(self, *, exact: bool) -> Any:
        name = (self._spelling if exact else None) or f"decimal({self.precision},{self.scale})"
        if exact and (self._as_object or self.__pydantic_extra__):
            return self._finish({"type": name}, exact=exact)
        return name


def _to_data_type(value: Any, info: ValidationInfo) -> Any:
    """JSON form of a type -> node: a type is a bare string or an object with a "type" key."""
    if isinstance(value, _SchemaNode):
        return value
    context = info.context
    if isinstance(value, str):
        return _primitive_or_decimal(value, {}, as_object=False, context=context)
    if isinstance(value, Mapping):
        kind = value.get("type")
        if kind == "struct":
            return StructType.model_validate(value, context=context)
        if kind == "array":
            return ArrayType.model_validate(value, context=context)
        if kind == "map":
            return MapType.model_validate(value, context=context)
        if isinstance(kind, str):
            rest = {k: v for k, v in value.items() if k != "type"}
            return _primitive_or_decimal(kind, rest, as_object=True, context=context)
    raise ValueError(f"not a Delta data type: {value!r}")


def _primitive_or_decimal(
    name: str, extra: dict[str, Any], *, as_object: bool, context: Any
) -> PrimitiveType | DecimalType:
    node: PrimitiveType | DecimalType
    match = _DECIMAL.match(name)
    if match:
        node = DecimalType.model_validate(
            {"precision": int(match[1]), "scale": int(match[2]), **extra}, context=context
        )
        if name != f"decimal({node.precision},{node.scale})":
            node._spelling = name
    elif name == "decimal":  # Spark's spelling of its default decimal(10,0)
        node = DecimalType.model_validate({"precision": 10, "scale": 0, **extra}, context=context)
        node._spelling = name
    else:
        node = PrimitiveType.model_validate({"name": name, **extra}, context=context)
    node._as_object = as_object
    return node


class ArrayType(_SchemaNode):
    _wire_type: ClassVar[str | None] = "array"

    element_type: DataType
    contains_null: bool = True

    def _json(self, *, exact: bool) -> Any:
        out = {
            "type": "array",
            "elementType": self.element_type._json(exact=exact),
            "containsNull": self.contains_null,
        }
        return self._finish(out, exact=exact)


class MapType(_SchemaNode):
    _wire_type: ClassVar[str | None] = "map"

    key_type: DataType
    value_type: DataType
    value_contains_null: bool = True

    def _json(self, *, exact: bool) -> Any:
        out = {
            "type": "map",
            "keyType": self.key_type._json(exact=exact),
            "valueType": self.value_type._json(exact=exact),
            "valueContainsNull": self.value_contains_null,
        }
        return self._finish(out, exact=exact)


class StructField(_SchemaNode):
    name: str
    type: DataType
    nullable: bool = True
    metadata: dict[str, Any] = Field(default_factory=dict)

    def _json(self, *, exact: bool) -> Any:
        out = {
            "name": self.name,
            "type": self.type._json(exact=exact),
            "nullable": self.nullable,
            "metadata": dict(self.metadata),
        }
        return self._finish(out, exact=exact)


class StructType(_SchemaNode):
    _wire_type: ClassVar[str | None] = "struct"

    fields: tuple[StructField, ...]

    def _json(self, *, exact: bool) -> Any:
        out = {"type": "struct", "fields": [f._json(exact=exact) for f in self.fields]}
        return self._finish(out, exact=exact)

    def to_json_string(self) -> str:
        """The schema as a ``schemaString``: the JSON it was parsed from, up to key order."""
        return json.dumps(self.to_json_value(), separators=(",", ":"), ensure_ascii=False)

    @model_validator(mode="after")
    def _names_distinct(self) -> StructType:
        """Two fields whose names differ only in case name one column for delta-spark (it refuses
        such a schema): a reader could only pick one and drop the other's values without a word."""
        folded = [f.name.lower() for f in self.fields]
        if len(set(folded)) < len(folded):
            names = [f.name for f in self.fields]
            twice = next(n for i, n in enumerate(names) if n.lower() in folded[:i])
            first = names[folded.index(twice.lower())]
            raise ValueError(f"column names {json.dumps(first)} and {json.dumps(twice)} name one column")
        return self

    @property
    def names(self) -> list[str]:
        return [f.name for f in self.fields]

    def field(self, name: str) -> StructField:
        """The field called ``name``; exact match first, then case-insensitive like delta-spark."""
        for f in self.fields:
            if f.name == name:
                return f
        folded = [f for f in self.fields if f.name.lower() == name.lower()]
        if len(folded) == 1:
            return folded[0]
        raise SchemaError(f"no column {name!r} in the schema", column=name)

    def select(self, names: Iterable[str]) -> StructType:
        """The named fields, in the schema's own order."""
        wanted = {self.field(n).name for n in names}
        return StructType(fields=tuple(f for f in self.fields if f.name in wanted))


DeltaType = PrimitiveType | DecimalType | ArrayType | MapType | StructType
# the annotation of a type-valued attribute: accepts the JSON forms (a string or an object)
DataType = Annotated[DeltaType, BeforeValidator(_to_data_type)]


# --- parsing ----------------------------------------------------------------------------------


#: the deepest nesting of a ``schemaString``'s JSON that is read: Jackson's default limit
#: (``StreamReadConstraints.DEFAULT_MAX_DEPTH``), with which delta-spark reads the schemas it wrote;
#: about 330 levels of nested structs (each takes three: the struct, its fields, a field)
MAX_SCHEMA_JSON_DEPTH = 1000
#: parsing and walking a schema recurses about once per JSON level: the interpreter's limit is
#: raised (never lowered) so that a schema as deep as :data:`MAX_SCHEMA_JSON_DEPTH` is read, with
#: room for the callers' own frames
_FRAMES = 4 * MAX_SCHEMA_JSON_DEPTH
if sys.getrecursionlimit() < _FRAMES:
    sys.setrecursionlimit(_FRAMES)

_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')
_OPENS_CLOSES = bytes.maketrans(b"{[]}", b"\x01\x01\xff\xff")
_NOT_BRACKETS = bytes(set(range(256)) - set(b"{[]}"))
_STEP = (0, 1, *([0] * 253), -1)


def json_depth(text: str | bytes) -> int:
    """How deep the objects and arrays of a JSON text nest (brackets inside strings not counted)."""
    raw = text.encode() if isinstance(text, str) else text
    steps = _JSON_STRING.sub(b"", raw).translate(_OPENS_CLOSES, _NOT_BRACKETS)
    return max(itertools.accumulate(map(_STEP.__getitem__, steps)), default=0)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _strict_json(text: str) -> Any:
    """A schemaString's JSON, strictly: no NaN or Infinity, valid UTF-8, no lone surrogate. jiter
    reads it, unless it nests deeper than jiter's 200 levels; then Python's parser does, with the
    same strictness."""
    try:
        return pydantic_core.from_json(text, allow_inf_nan=False)
    except ValueError as exc:
        if "recursion limit" not in str(exc):
            raise SchemaError(f"schemaString is not JSON: {exc}") from None
    try:
        value = json.loads(text, parse_constant=_no_constant)
        json.dumps(value, ensure_ascii=False).encode()  # a lone surrogate cannot be encoded
    except (ValueError, UnicodeEncodeError) as exc:
        raise SchemaError(f"schemaString is not JSON: {exc}") from None
    return value


@functools.lru_cache(maxsize=32)
def parse_schema(schema_string: str) -> StructType:
    """Parse a ``schemaString``; :class:`SchemaError` when it is not JSON or not a Delta struct.

    At most :data:`MAX_SCHEMA_JSON_DEPTH` levels of JSON nesting are read, as delta-spark reads;
    a deeper schema is refused in one line. Cached (a schema is immutable): the log boundary checks
    each metaData's schema, then the table's readers use it, and a table has few schemas."""
    depth = json_depth(schema_string)
    if depth > MAX_SCHEMA_JSON_DEPTH:
        raise SchemaError(
            f"schemaString nests {depth} levels of JSON, more than {MAX_SCHEMA_JSON_DEPTH} "
            "(the limit of Jackson, with which delta-spark reads schemas)"
        )
    value = _strict_json(schema_string)
    if not isinstance(value, dict) or value.get("type") != "struct":
        raise SchemaError("schemaString must be a JSON object of type 'struct'")
    try:
        return StructType.model_validate(value, context={_FROM_JSON: True})
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"])
        msg = str(first["msg"]).removeprefix("Value error, ")
        raise SchemaError(
            f"schemaString is not a valid Delta schema: {where + ': ' if where else ''}{msg}"
        ) from None
    except RecursionError:  # a caller deep in its own stack already
        raise SchemaError("schemaString nests types too deeply to be read here") from None
