"""Mutation classes of single log lines: syntax, encoding, numbers, required fields and their types.

Each is structural: the line breaks the protocol, so every command that reads the commit refuses it,
naming the file and the line (and the field where there is one); commands that do not read the
commit (``snapshot``/``read`` when a checkpoint covers it) are unchanged.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mutation import logs as ml
from mutation.core import (
    SENTINEL,
    Env,
    Mutation,
    dump_with_raw,
    everywhere,
    line_level,
    mutation,
    nested,
    replace_with,
)
from mutation.logs import Facts, Line

# --- syntax -----------------------------------------------------------------------


@mutation("line-truncated", structural=True, instances=2)
def _line_truncated(f: Facts, rng: random.Random) -> Mutation:
    """A line cut short (a torn write): not JSON."""
    ln = rng.choice(f.lines())
    cut = rng.randrange(1, len(ln.raw) - 1)
    return line_level(f, ln, replace_with(ln, ln.raw[:cut]), f"cut@{cut}", syntax=True)


@mutation("line-trailing-garbage", structural=True)
def _line_trailing(f: Facts, rng: random.Random) -> Mutation:
    """Bytes after the action object: not one JSON value."""
    ln = rng.choice(f.lines())
    junk = rng.choice([b"x", b"}", b",{}", b' {"a":1}', b"]", b"\x00"])
    return line_level(f, ln, replace_with(ln, ln.raw + junk), f"junk={junk!r}", syntax=True)


@mutation("line-not-object", structural=True)
def _line_not_object(f: Facts, rng: random.Random) -> Mutation:
    """A line that is JSON but not an object holding an action."""
    ln = rng.choice(f.lines())
    new = rng.choice([b"[]", b"[" + ln.raw + b"]", b'"add"', b"42", b"null", b"true", b"{}"])
    return line_level(f, ln, replace_with(ln, new), f"line={new[:12]!r}", syntax=True)


@mutation("line-empty-object-inserted", structural=True)
def _line_empty_inserted(f: Facts, rng: random.Random) -> Mutation:
    """A ``{}`` line added among the actions."""
    ln = rng.choice(f.lines())
    return line_level(f, ln, replace_with(ln, [b"{}", ln.raw]), "{}", syntax=True)


@mutation("action-null", structural=True, instances=2)
def _action_null(f: Facts, rng: random.Random) -> Mutation:
    """``{"add":null}``: an action with no body."""
    ln = rng.choice(f.lines())
    return line_level(f, ln, replace_with(ln, ml.dumps({ln.kind: None})), ln.kind, field_name=ln.kind)


@mutation("action-not-object", structural=True)
def _action_not_object(f: Facts, rng: random.Random) -> Mutation:
    """An action whose body is a string, number, list or boolean."""
    ln = rng.choice(f.lines())
    body = rng.choice(["add", 5, [], True, [ln.body]])
    return line_level(f, ln, replace_with(ln, ml.dumps({ln.kind: body})), f"{ln.kind}={body!r:.12}")


@mutation("two-actions-one-line", structural=True)
def _two_actions(f: Facts, rng: random.Random) -> Mutation | None:
    """Two actions in one JSON object (one action per line is the protocol's)."""
    pairs = [
        (a, b)
        for v in f.commits
        for a, b in zip(f.commits[v], f.commits[v][1:], strict=False)
        if b.lineno == a.lineno + 1
    ]
    if not pairs:
        return None
    a, b = rng.choice(pairs)
    merged = a.raw.rstrip()[:-1] + b"," + b.raw.lstrip()[1:]
    return line_level(f, a, _merge(a, merged), f"{a.kind}+{b.kind}", syntax=True)


def _merge(a: Line, merged: bytes) -> Callable[[Path, Env], None]:
    def apply(root: Path, env: Env) -> None:
        path = ml.commit_path(root, a.version)
        lines = path.read_bytes().split(b"\n")
        lines[a.lineno - 1 : a.lineno + 1] = [merged]
        ml.write_keeping_mtime(path, b"\n".join(lines))

    return apply


@mutation("duplicate-key", structural=True)
def _duplicate_key(f: Facts, rng: random.Random) -> Mutation | None:
    """A key twice with different values, the log's own value last.

    The action key twice on a line is two actions of one type on one line: refused. A field twice
    inside an action reads as JSON parsers read it, the last one winning (delta-spark's Jackson,
    Python, Go, JavaScript): since the log's own value comes last, every reader answers as for the
    unmutated table, and ``events`` publishes the line's own bytes, the duplicate included.
    """
    ln = rng.choice([x for x in f.lines() if isinstance(x.body, dict) and x.body])
    if rng.random() < 0.3:
        other = dict(ln.body)
        first = next(iter(other))
        other[first] = _different(other[first])
        raw = b'{"' + ln.kind.encode() + b'":' + ml.dumps(other) + b"," + ln.raw.strip()[1:]
        return line_level(f, ln, replace_with(ln, raw), f"top-level {ln.kind}")
    key = rng.choice(list(ln.body))
    dup = ml.dumps({key: _different(ln.body[key])})[1:-1]
    body = ml.dumps(ln.body)
    raw = b'{"' + ln.kind.encode() + b'":{' + dup + b"," + body[1:] + b"}"
    expect = everywhere(f, "unchanged")
    expect["events"] = "faithful"
    return Mutation(
        expect, replace_with(ln, raw), f"v{ln.version}:l{ln.lineno}:{ln.kind}.{key}", marker=dup.decode()
    )


def _different(value: Any) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, str):
        return value + "-dup"
    return "dup"


# --- line level: encoding and numbers ---------------------------------------------------------


_STRING_VALUE = re.compile(rb'"\s*:\s*"')


def _string_value_positions(raw: bytes) -> list[int]:
    """Offsets just inside the opening quote of string values (after ``":"``)."""
    return [m.end() for m in _STRING_VALUE.finditer(raw)]


@mutation("utf8-invalid", structural=True)
def _utf8_invalid(f: Facts, rng: random.Random) -> Mutation | None:
    """Bytes that are not UTF-8 inside a string value (JSON text must be UTF-8)."""
    candidates = [ln for ln in f.lines() if _string_value_positions(ln.raw)]
    ln = rng.choice(candidates)
    at = rng.choice(_string_value_positions(ln.raw))
    bad = rng.choice([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xc0\xaf", b"\xf8\x88\x80\x80\x80", b"\x80"])
    return line_level(
        f, ln, replace_with(ln, ln.raw[:at] + bad + ln.raw[at:]), f"bytes={bad.hex()}", syntax=True
    )


@mutation("lone-surrogate", structural=True)
def _lone_surrogate(f: Facts, rng: random.Random) -> Mutation | None:
    """A ``\\ud800``-style escape with no partner: not a Unicode string."""
    candidates = [ln for ln in f.lines() if _string_value_positions(ln.raw)]
    ln = rng.choice(candidates)
    at = rng.choice(_string_value_positions(ln.raw))
    esc = rng.choice([rb"\ud800", rb"\udfff", rb"\udc00", rb"\ud83d", rb"\ud83dx"])
    return line_level(f, ln, replace_with(ln, ln.raw[:at] + esc + ln.raw[at:]), f"esc={esc.decode()}")


NUMERIC_FIELDS = {
    "add": ("size", "modificationTime"),
    "remove": ("size", "deletionTimestamp"),
    "cdc": ("size",),
    "metaData": ("createdTime",),
    "protocol": ("minReaderVersion", "minWriterVersion"),
    "txn": ("version", "lastUpdated"),
    "commitInfo": ("timestamp", "readVersion", "inCommitTimestamp"),
}


def _numeric_targets(f: Facts) -> list[tuple[Line, str]]:
    return [
        (ln, k)
        for ln in f.lines(*NUMERIC_FIELDS)
        for k in NUMERIC_FIELDS[ln.kind]
        if isinstance(ln.body.get(k), int)
    ]


@mutation("number-nonfinite", structural=True)
def _nonfinite(f: Facts, rng: random.Random) -> Mutation | None:
    """NaN, Infinity or -Infinity as a number (not JSON), in a typed field or a free-form one."""
    ln, key = rng.choice(_numeric_targets(f))
    token = rng.choice([b"NaN", b"Infinity", b"-Infinity"])
    body = dict(ln.body)
    if ln.kind == "commitInfo" and rng.random() < 0.5:
        key = "x-metric"
    body[key] = SENTINEL
    raw = dump_with_raw({ln.kind: body}, token)
    return line_level(f, ln, replace_with(ln, raw), f"{ln.kind}.{key}={token.decode()}")


@mutation("number-out-of-range", structural=True)
def _out_of_range(f: Facts, rng: random.Random) -> Mutation | None:
    """A long beyond int64 (10**30, 2**63) or an int beyond int32 in a typed field."""
    targets = [(ln, k) for ln, k in _numeric_targets(f) if ln.kind != "commitInfo"]
    ln, key = rng.choice(targets)
    value = rng.choice([10**30, 2**63, -(2**63) - 1]) if key != "minReaderVersion" else 2**31
    body = {**ln.body, key: value}
    return line_level(
        f, ln, replace_with(ln, ml.dumps({ln.kind: body})), f"{ln.kind}.{key}={value}", field_name=key
    )


@mutation("size-negative", structural=True)
def _size_negative(f: Facts, rng: random.Random) -> Mutation | None:
    """A negative file size (or protocol version 0 / -1)."""
    targets = [(ln, "size") for ln in f.lines("add", "cdc") if "size" in ln.body]
    targets += [(ln, k) for ln in f.lines("protocol") for k in ("minReaderVersion", "minWriterVersion")]
    ln, key = rng.choice(targets)
    value = rng.choice([-1, -(10**6)]) if key == "size" else rng.choice([0, -1])
    body = {**ln.body, key: value}
    return line_level(
        f, ln, replace_with(ln, ml.dumps({ln.kind: body})), f"{ln.kind}.{key}={value}", field_name=key
    )


@mutation("deep-nesting", structural=True)
def _deep_nesting(f: Facts, rng: random.Random) -> Mutation:
    """10,000+ levels of arrays or objects inside an action: a nesting limit, never a RecursionError."""
    ln = rng.choice([x for x in f.lines() if isinstance(x.body, dict)])
    depth = rng.choice([10_000, 20_000, 100_000])
    key = rng.choice(["x-nested", "tags"]) if ln.kind in ("add", "remove", "cdc") else "x-nested"
    raw = dump_with_raw({ln.kind: {**ln.body, key: SENTINEL}}, nested(depth, rng))
    return line_level(f, ln, replace_with(ln, raw), f"{ln.kind}.{key}:depth={depth}")


# --- line level: required fields and types ------------------------------------------------------

REQUIRED = {
    "add": ("path", "partitionValues", "size", "modificationTime", "dataChange"),
    "remove": ("path", "dataChange"),
    "cdc": ("path", "partitionValues", "size", "dataChange"),
    "metaData": ("id", "format", "schemaString", "partitionColumns", "configuration"),
    "protocol": ("minReaderVersion", "minWriterVersion"),
    "txn": ("appId", "version"),
    "domainMetadata": ("domain", "configuration", "removed"),
}
DV_REQUIRED = ("storageType", "pathOrInlineDv", "sizeInBytes", "cardinality")
FIELD_TYPES = {
    "path": "string",
    "partitionValues": "map",
    "size": "long",
    "modificationTime": "long",
    "dataChange": "bool",
    "stats": "string",
    "tags": "map",
    "deletionTimestamp": "long",
    "id": "string",
    "format": "struct",
    "schemaString": "string",
    "partitionColumns": "array",
    "configuration": "map",
    "createdTime": "long",
    "minReaderVersion": "int",
    "minWriterVersion": "int",
    "readerFeatures": "array",
    "writerFeatures": "array",
    "appId": "string",
    "version": "long",
    "lastUpdated": "long",
    "domain": "string",
    "removed": "bool",
    "storageType": "string",
    "pathOrInlineDv": "string",
    "sizeInBytes": "int",
    "cardinality": "long",
    "offset": "int",
    "inCommitTimestamp": "long",
}
WRONG_VALUES: dict[str, list[Any]] = {
    "string": [123, True, [], {}, 1.5],
    "long": ["12", 12.5, True, [], {}, "x"],
    "int": ["3", 3.5, False, [3], {}],
    "bool": ["true", 1, 0, [], {}, "false"],
    "map": [[], "k=v", 1, {"k": 1}, {"k": []}, {"k": True}],
    "array": ["x", {}, 1, [1], [None], [[]]],
    "struct": ["parquet", [], 1, True],
}


def _required_of(ln: Line) -> list[str]:
    req = list(REQUIRED.get(ln.kind, ()))
    if ln.kind == "protocol":
        if ln.body.get("minReaderVersion") == 3:
            req.append("readerFeatures")
        if ln.body.get("minWriterVersion") == 7:
            req.append("writerFeatures")
    return [k for k in req if k in ln.body]


def _field_targets(f: Facts, fields: Callable[[Line], list[str]]) -> list[tuple[Line, str]]:
    """(line, field) pairs; ``deletionVector.X`` names a field of the line's DV descriptor."""
    out = [(ln, k) for ln in f.lines(*REQUIRED) for k in fields(ln)]
    for ln in f.lines("add", "remove"):
        if ln.body.get("deletionVector"):
            out += [(ln, f"deletionVector.{k}") for k in DV_REQUIRED]
    return out


def _set_field(body: dict[str, Any], dotted: str, value: Any, delete: bool = False) -> dict[str, Any]:
    body = json.loads(json.dumps(body))
    *parents, leaf = dotted.split(".")
    target = body
    for p in parents:
        target = target[p]
    if delete:
        del target[leaf]
    else:
        target[leaf] = value
    return body


def _pick_field(f: Facts, rng: random.Random, fields: Callable[[Line], list[str]]) -> tuple[Line, str]:
    targets = _field_targets(f, fields)
    kinds = sorted({ln.kind for ln, _ in targets})
    kind = rng.choice(kinds)  # every action type gets its turn, not only the numerous adds
    return rng.choice([t for t in targets if t[0].kind == kind])


@mutation("field-missing", structural=True, instances=3)
def _field_missing(f: Facts, rng: random.Random) -> Mutation:
    """A required field left out (add/remove/cdc path, size, partitionValues, ...; metaData and protocol
    fields; a DV descriptor's fields): a remove without path must not be ignored, an add without path
    must not be dropped."""
    ln, key = _pick_field(f, rng, _required_of)
    body = _set_field(ln.body, key, None, delete=True)
    leaf = key.rsplit(".", 1)[-1]
    m = line_level(f, ln, replace_with(ln, ml.dumps({ln.kind: body})), f"{ln.kind}.{key}", field_name=leaf)
    return _schema_needed_only_for_rows(f, m, ln, key)


def _schema_needed_only_for_rows(f: Facts, m: Mutation, ln: Line, key: str) -> Mutation:
    """A metaData without ``schemaString`` describes no rows nor table state: ``snapshot``,
    ``read`` and ``changes`` refuse it naming its file and line while it is in force (delta-spark
    refuses such a table); the log-level readers answer, as delta-rs does for a real Delta Live
    Tables setup commit that has none (drs__delta-live-table). A later metaData replaces it:
    ``snapshot`` and ``read`` read the latest state with that one's schema, as delta-spark does, so
    their output is the unmutated table's. A partitioned table's files are not refused for it:
    a partition column a file's ``partitionValues`` cannot be matched with reads as null."""
    if ln.kind == "metaData" and key == "schemaString":
        # history shows no metaData; events prints this one, which names its table id
        for command, answer in (("history", "unchanged"), ("events", "faithful")):
            if m.expect.get(command) == "refused":
                m.expect[command] = answer
        if ln.version < f.last_metadata_version:
            for command in ("snapshot", "read"):
                if m.expect.get(command) == "refused":
                    m.expect[command] = "unchanged"
        m.marker = '"id":' + json.dumps(ln.body["id"])
    return m


@mutation("field-null", structural=True, instances=2)
def _field_null(f: Facts, rng: random.Random) -> Mutation:
    """A required field set to null."""
    ln, key = _pick_field(f, rng, _required_of)
    body = _set_field(ln.body, key, None)
    leaf = key.rsplit(".", 1)[-1]
    m = line_level(
        f, ln, replace_with(ln, ml.dumps({ln.kind: body})), f"{ln.kind}.{key}=null", field_name=leaf
    )
    return _schema_needed_only_for_rows(f, m, ln, key)


@mutation("field-wrong-type", structural=True, instances=3)
def _field_wrong_type(f: Facts, rng: random.Random) -> Mutation:
    """A field (required or optional but typed) holding a value of another JSON type."""
    ln, key = _pick_field(f, rng, lambda x: [k for k in x.body if k in FIELD_TYPES])
    leaf = key.rsplit(".", 1)[-1]
    choices = list(WRONG_VALUES[FIELD_TYPES[leaf]])
    if leaf == "partitionValues" and f.partition_columns:
        col = next(iter(ln.body["partitionValues"]), f.partition_columns[0])
        choices = [{col: 1}, {col: []}, {col: {}}, {col: True}, [], "x"]
    value = rng.choice(choices)
    body = _set_field(ln.body, key, value)
    return line_level(
        f, ln, replace_with(ln, ml.dumps({ln.kind: body})), f"{ln.kind}.{key}={value!r:.16}", field_name=leaf
    )


@mutation("path-empty", structural=True)
def _path_empty(f: Facts, rng: random.Random) -> Mutation:
    """An add/remove/cdc whose path is the empty string."""
    ln = rng.choice(f.lines("add", "remove", "cdc"))
    body = {**ln.body, "path": ""}
    return line_level(f, ln, replace_with(ln, ml.dumps({ln.kind: body})), ln.kind, field_name="path")
