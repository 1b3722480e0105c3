"""The log boundary: every line a reader takes from a commit is strict JSON holding one valid action.

Hypothesis drives the line-level validator (valid lines round-trip, every single-field corruption
is refused naming that field, arbitrary bytes never raise anything but CorruptLogError); the
regression tests replay the findings of issue 11 through every reader (snapshot, history, the
change feed, the watcher's scan).
"""

from __future__ import annotations

import contextlib
import io
import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deltamirror.core import actions
from deltamirror.core.actions import iter_values, line_buffers, read_actions
from deltamirror.core.errors import CorruptLogError, DeltaMirrorError, SchemaError
from deltamirror.core.schema import parse_schema
from deltamirror.core.table import open_table
from support.tables import copy_table

I64 = 2**63 - 1
I32 = 2**31 - 1

# --- valid actions, as the protocol describes them (not taken from the code under test) -----------

_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=10)
_NAME = _TEXT.filter(bool)
_LONG = st.integers(-(2**63), I64)
_SIZE = st.integers(0, I64)
_INT32 = st.integers(0, I32)
_STR_MAP = st.dictionaries(_TEXT, st.one_of(st.none(), _TEXT), max_size=3)
_FREE = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(10**30), 10**30),
        st.floats(allow_nan=False, allow_infinity=False),
        _TEXT,
    ),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(_TEXT, inner, max_size=3)),
    max_leaves=8,
)


def _optional(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.none(), strategy)


_DV = st.fixed_dictionaries(
    {
        "storageType": st.sampled_from(["u", "i", "p"]),
        "pathOrInlineDv": _NAME,
        "sizeInBytes": _INT32,
        "cardinality": _SIZE,
    },
    optional={"offset": _INT32, "maxRowIndex": _SIZE},
)

#: per action type: (required fields, optional fields)
_ACTIONS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "add": (
        {
            "path": _NAME,
            "partitionValues": _STR_MAP,
            "size": _SIZE,
            "modificationTime": _LONG,
            "dataChange": st.booleans(),
        },
        {
            "stats": _optional(_TEXT),
            "tags": _optional(_STR_MAP),
            "deletionVector": _optional(_DV),
            "baseRowId": _optional(_SIZE),
            "defaultRowCommitVersion": _optional(_SIZE),
            "clusteringProvider": _optional(_TEXT),
            "someNewField": _FREE,
        },
    ),
    "remove": (
        {"path": _NAME, "dataChange": st.booleans()},
        {
            "deletionTimestamp": _optional(_LONG),
            "extendedFileMetadata": _optional(st.booleans()),
            "partitionValues": _optional(_STR_MAP),
            "size": _optional(_SIZE),
            "tags": _optional(_STR_MAP),
            "deletionVector": _optional(_DV),
        },
    ),
    "cdc": ({"path": _NAME, "partitionValues": _STR_MAP, "size": _SIZE, "dataChange": st.booleans()}, {}),
    "metaData": (
        {
            "id": _NAME,
            "format": st.fixed_dictionaries(
                {"provider": _TEXT}, optional={"options": st.dictionaries(_TEXT, _TEXT, max_size=2)}
            ),
            "partitionColumns": st.just([]),
            "configuration": st.dictionaries(_TEXT, _TEXT, max_size=3),
        },
        {"name": _optional(_TEXT), "createdTime": _optional(_LONG)},
    ),
    "protocol": (
        {"minReaderVersion": st.integers(1, I32), "minWriterVersion": st.integers(1, I32)},
        {"readerFeatures": st.lists(_TEXT, max_size=3), "writerFeatures": st.lists(_TEXT, max_size=3)},
    ),
    "txn": ({"appId": _TEXT, "version": _LONG}, {"lastUpdated": _optional(_LONG)}),
    "domainMetadata": ({"domain": _TEXT, "configuration": _TEXT, "removed": st.booleans()}, {}),
    "commitInfo": (
        {},
        {
            "timestamp": _LONG,
            "inCommitTimestamp": _LONG,
            "operation": _TEXT,
            "operationParameters": st.dictionaries(_TEXT, _FREE, max_size=3),
            "operationMetrics": st.dictionaries(_TEXT, _FREE, max_size=3),
            "isBlindAppend": st.booleans(),
            "notebook": _FREE,
        },
    ),
    "sidecar": (
        {"path": _NAME, "sizeInBytes": _SIZE, "modificationTime": _LONG},
        {"tags": _optional(st.dictionaries(_TEXT, _TEXT, max_size=2))},
    ),
}


_COLUMN_NAMES = st.lists(
    st.text(st.characters(codec="ascii", categories=("L", "N")), min_size=1, max_size=6),
    max_size=4,
    unique_by=str.lower,
)


@st.composite
def _action(draw: st.DrawFn, names: list[str] | None = None) -> tuple[str, dict[str, Any]]:
    name = draw(st.sampled_from(names or sorted(_ACTIONS)))
    required, optional = _ACTIONS[name]
    body = draw(st.fixed_dictionaries(required, optional=optional))
    if name == "metaData" and draw(st.booleans()):  # a schema, and partition columns among its fields
        columns = draw(_COLUMN_NAMES)
        fields = [
            {
                "name": c,
                "type": draw(st.sampled_from(["string", "long", "date"])),
                "nullable": True,
                "metadata": {},
            }
            for c in columns
        ]
        body["schemaString"] = json.dumps({"type": "struct", "fields": fields})
        body["partitionColumns"] = draw(st.lists(st.sampled_from(columns), unique=True)) if columns else []
    if name == "protocol":  # reader version 3 / writer version 7 list their features
        for version, features, at in (
            ("minReaderVersion", "readerFeatures", 3),
            ("minWriterVersion", "writerFeatures", 7),
        ):
            if body[version] == at and body.get(features) is None:
                body[features] = []
    return name, body


def _line(name: str, body: Any, *, spaced: bool = False) -> bytes:
    separators = (", ", ": ") if spaced else (",", ":")
    return json.dumps({name: body}, separators=separators, ensure_ascii=False).encode()


def _decode(data: bytes) -> list[tuple[int, str, Any]]:
    return list(iter_values(read_actions(data, table="t", file="f", version=1)))


def _strict_loads(text: bytes) -> Any:
    def refuse(constant: str) -> Any:
        raise ValueError(constant)

    return json.loads(text, parse_constant=refuse)


# --- the validator -------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(lines=st.lists(st.tuples(_action(), st.booleans()), min_size=1, max_size=12))
def test_valid_lines_round_trip(lines: list[tuple[tuple[str, dict[str, Any]], bool]]) -> None:
    data = b"\n".join(_line(name, body, spaced=spaced) for (name, body), spaced in lines) + b"\n"
    got = _decode(data)
    assert [(line, name) for line, name, _ in got] == [(i, name) for i, ((name, _), _) in enumerate(lines, 1)]
    for (_, _, value), ((_, body), _) in zip(got, lines, strict=True):
        assert value == body
    bodies = [b for run in read_actions(data, table="t", file="f") for b in run.bodies]
    assert [_strict_loads(b) for b in bodies] == [body for (_, body), _ in lines]


#: wrong values by kind of field; each is refused wherever a field of that kind is
_WRONG: dict[str, list[Any]] = {
    "path": [None, 5, "", [], {}, True],
    "string": [5, [], {}, True, 1.5],
    "size": [None, "5", 1.5, True, -1, 2**63, 10**30, []],
    "long": [None, "5", 1.5, True, 2**63, -(2**63) - 1, 10**30],
    "int32": [None, "5", 1.5, True, -1, 2**31],
    "version": [None, "1", 1.5, True, 0, -1, 2**31],
    "bool": [None, 1, 0, "true", [], {}],
    "map": [None, [], "x", 5, {"k": 5}, {"k": ["v"]}, {"k": {}}, {"k": True}],
    "strict map": [[], "x", {"k": None}, {"k": 5}],
    "list": [None, "x", {}, [5], [None]],
    "object": [None, [], "x", 5, True],
    "storageType": [None, "x", "U", "", 1],
}
#: (action, field) -> kind, for the fields the protocol types
_KINDS: dict[tuple[str, str], str] = {
    ("add", "path"): "path",
    ("add", "partitionValues"): "map",
    ("add", "size"): "size",
    ("add", "modificationTime"): "long",
    ("add", "dataChange"): "bool",
    ("add", "stats"): "string",
    ("add", "tags"): "map",
    ("add", "baseRowId"): "size",
    ("remove", "path"): "path",
    ("remove", "dataChange"): "bool",
    ("remove", "deletionTimestamp"): "long",
    ("remove", "size"): "size",
    ("cdc", "path"): "path",
    ("cdc", "partitionValues"): "map",
    ("cdc", "size"): "size",
    ("metaData", "id"): "path",
    ("metaData", "schemaString"): "string",
    ("metaData", "partitionColumns"): "list",
    ("metaData", "configuration"): "strict map",
    ("metaData", "format"): "object",
    ("protocol", "minReaderVersion"): "version",
    ("protocol", "minWriterVersion"): "version",
    ("protocol", "readerFeatures"): "list",
    ("txn", "appId"): "string",
    ("txn", "version"): "long",
    ("domainMetadata", "domain"): "string",
    ("domainMetadata", "configuration"): "string",
    ("commitInfo", "inCommitTimestamp"): "long",
    ("sidecar", "path"): "path",
    ("sidecar", "sizeInBytes"): "size",
}
_OPTIONAL_NULL_OK = {
    ("add", "stats"),
    ("add", "tags"),
    ("add", "baseRowId"),
    ("remove", "deletionTimestamp"),
    ("remove", "size"),
    ("metaData", "schemaString"),
    ("protocol", "readerFeatures"),
    ("commitInfo", "inCommitTimestamp"),
}


@settings(max_examples=400, deadline=None)
@given(data=st.data())
def test_every_single_field_corruption_is_refused_naming_the_field(data: st.DataObject) -> None:
    action, field = data.draw(st.sampled_from(sorted(_KINDS)))
    name, body = data.draw(_action([action]))
    wrong = data.draw(st.sampled_from(_WRONG[_KINDS[action, field]]))
    if wrong is None and (action, field) in _OPTIONAL_NULL_OK:
        wrong = True if _KINDS[action, field] != "bool" else 1
    body[field] = wrong
    spaced = data.draw(st.booleans())
    line = _line(name, body, spaced=spaced)
    with pytest.raises(CorruptLogError) as info:
        _decode(b'{"commitInfo":{}}\n' + line + b"\n")
    assert info.value.line == 2
    assert info.value.message.startswith(f"{name}.{field}"), info.value.message
    assert "\n" not in str(info.value)


_MINIMAL: dict[str, dict[str, Any]] = {
    "add": {"path": "a", "partitionValues": {}, "size": 1, "modificationTime": 1, "dataChange": True},
    "remove": {"path": "a", "dataChange": True},
    "cdc": {"path": "a", "partitionValues": {}, "size": 1, "dataChange": False},
    "metaData": {"id": "a", "format": {"provider": "parquet"}, "partitionColumns": [], "configuration": {}},
    "protocol": {"minReaderVersion": 1, "minWriterVersion": 2},
    "txn": {"appId": "a", "version": 1},
    "domainMetadata": {"domain": "a", "configuration": "", "removed": False},
    "sidecar": {"path": "a", "sizeInBytes": 1, "modificationTime": 1},
}


@pytest.mark.parametrize(
    ("action", "field"),
    [(a, f) for a, (required, _) in sorted(_ACTIONS.items()) for f in sorted(required)],
)
def test_a_missing_required_field_is_refused_by_name(action: str, field: str) -> None:
    body = dict(_MINIMAL[action])
    assert _decode(_line(action, body))
    del body[field]
    with pytest.raises(CorruptLogError) as info:
        _decode(_line(action, body) + b"\n")
    assert info.value.message == f"{action}.{field}: required field missing"


def test_metadata_must_describe_a_table_and_protocols_list_their_features() -> None:
    meta = dict(_MINIMAL["metaData"])
    schema = {"type": "struct", "fields": [{"name": "p", "type": "string", "nullable": True, "metadata": {}}]}
    assert _decode(_line("metaData", {**meta, "schemaString": json.dumps(schema), "partitionColumns": ["P"]}))
    for body, problem in [
        ({**meta, "schemaString": json.dumps(schema)[:-3]}, "metaData.schemaString: expected a Delta schema"),
        ({**meta, "schemaString": '"integer"'}, "metaData.schemaString: expected a Delta schema"),
        (
            {**meta, "schemaString": '{"type":"struct","fields":7}'},
            "metaData.schemaString: expected a Delta schema",
        ),
        ({**meta, "schemaString": "[" * 5000}, "metaData.schemaString: expected a Delta schema"),
        (
            {**meta, "schemaString": json.dumps(schema), "partitionColumns": ["q"]},
            'metaData.partitionColumns: "q" is not',
        ),
        ({k: v for k, v in meta.items() if k != "format"}, "metaData.format: required field missing"),
        ({**meta, "configuration": None}, "metaData.configuration: expected"),
    ]:
        with pytest.raises(CorruptLogError) as info:
            _decode(_line("metaData", body))
        assert info.value.message.startswith(problem), info.value.message
    with pytest.raises(CorruptLogError) as info:
        _decode(_line("protocol", {"minReaderVersion": 3, "minWriterVersion": 7, "writerFeatures": []}))
    assert info.value.message == "protocol.readerFeatures: required field missing (minReaderVersion is 3)"
    assert _decode(_line("protocol", {"minReaderVersion": 2, "minWriterVersion": 5}))


def test_deletion_vector_fields_are_checked() -> None:
    base = {"path": "a", "partitionValues": {}, "size": 1, "modificationTime": 1, "dataChange": True}
    good = {"storageType": "u", "pathOrInlineDv": "ab", "offset": 1, "sizeInBytes": 3, "cardinality": 2}
    assert _decode(_line("add", {**base, "deletionVector": good}))
    for field, wrong in [
        ("storageType", "x"),
        ("pathOrInlineDv", ""),
        ("offset", -1),
        ("offset", 2**31),
        ("sizeInBytes", 10**12),
        ("sizeInBytes", -5),
        ("cardinality", -1),
        ("cardinality", "2"),
    ]:
        with pytest.raises(CorruptLogError) as info:
            _decode(_line("add", {**base, "deletionVector": {**good, field: wrong}}))
        assert info.value.message.startswith(f"add.deletionVector.{field}:"), (field, info.value.message)


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        (b'{"add":null}', "add: expected a JSON object"),
        (b'{"remove":[]}', "remove: expected a JSON object"),
        (b'{"commitInfo":{"x":NaN}}', "commitInfo.x: expected finite numbers"),
        (b'{"commitInfo":{"x":NaN},"y":{}}', "invalid JSON"),  # decoded whole: the parser refuses it
        (b'{"commitInfo":{"x":-Infinity}}', "commitInfo.x: expected finite numbers"),
        (b'{"commitInfo":{"x":1e999}}', "commitInfo.x: expected finite numbers"),
        (b'{"future":{"x":[1e400]}}', "future: expected finite numbers"),
        (
            b'{"add":{"x":NaN,"path":"a","partitionValues":{},"size":1,"modificationTime":1,"dataChange":true}}',
            "add.x: expected finite numbers",
        ),
        (b'{"commitInfo":{"x":"\\ud800"}}', "invalid JSON"),
        (b'{"commitInfo":{"x":"\\udc00\\ud800"}}', "invalid JSON"),
        (b'{"commitInfo":{"x":"\xff"}}', "invalid JSON"),
        (b'{"commitInfo":{"x":"\xc3\x28"}}', "invalid JSON"),
        (b'{"commitInfo":{"x":"a\x01b"}}', "invalid JSON"),
        (b'{"commitInfo":' + b"[" * 300 + b"]" * 300 + b"}", "invalid JSON: recursion limit exceeded"),
        (b'{"commitInfo":{"a":' * 150 + b"1" + b"}" * 151, "invalid JSON: recursion limit exceeded"),
        (b"[1, 2]", "a log line must be a JSON object holding an action"),
        (b"{}", "a log line must be a JSON object holding an action"),
        (b'"add"', "a log line must be a JSON object holding an action"),
        (b'{"add":{"path":"a"}', "invalid JSON"),
        (b'{"add":{"path":"a"}}x', "invalid JSON"),
        (
            b'{"add":{"path":"a","partitionValues":{},"size":1,"modificationTime":1,"dataChange":true},"remove":{"path":"a","dataChange":true}}',
            "a line holds one action, this one holds add, remove",
        ),
        (
            b'{"txn":{"appId":"a","version":1},"txn":{"appId":"b","version":2}}',
            "a line names an action twice",
        ),
    ],
)
def test_strict_json_and_shape(line: bytes, problem: str) -> None:
    with pytest.raises(CorruptLogError) as info:
        _decode(b"\n" + line + b"\n")
    assert info.value.message.startswith(problem), info.value.message
    assert info.value.line == 2 and info.value.file == "f" and info.value.version == 1
    assert "\n" not in str(info.value)


def test_an_unknown_action_beside_a_known_one_is_kept_and_blank_lines_are_skipped() -> None:
    data = b'\n  \n{"txn":{"appId":"a","version":1},"newThing":{"k":[1,2.5]}}\r\n{"newThing":5}\r{"x":{}}'
    got = _decode(data)
    assert got == [
        (3, "txn", {"appId": "a", "version": 1}),
        (3, "newThing", {"k": [1, 2.5]}),
        (4, "newThing", 5),
        (5, "x", {}),
    ]


def test_a_huge_integer_in_free_form_json_is_kept_as_written() -> None:
    """Valid JSON (a metric beyond 64 bits): read as the integer it is, and published as written."""
    line = b'{"commitInfo":{"operation":"WRITE","metric":1000000000000000000000000000000}}'
    assert _decode(line) == [(1, "commitInfo", {"operation": "WRITE", "metric": 10**30})]
    assert [b for r in read_actions(line, table="t", file="f") for b in r.bodies] == [line[14:-1]]


def test_duplicate_names_inside_an_action_read_the_last_as_every_json_parser_does() -> None:
    line = b'{"txn":{"appId":"a","version":1,"version":2}}'
    assert _decode(line) == [(1, "txn", json.loads(line)["txn"])]


def test_escaped_action_names_are_read_as_json_reads_them() -> None:
    line = b'{"t\\u0078n":{"appId":"a","version":"1"}}'
    with pytest.raises(CorruptLogError) as info:
        _decode(line)
    assert info.value.message.startswith("txn.version")
    with pytest.raises(CorruptLogError):  # a filter by name decodes it too
        list(read_actions(line, table="t", file="f", only=(b'"txn"',)))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.binary(max_size=300)
    | st.lists(
        st.sampled_from(
            [
                b"{",
                b"}",
                b'"add"',
                b":",
                b",",
                b"[",
                b"]",
                b"\n",
                b"\r",
                b"null",
                b"1e999",
                b"NaN",
                b'"\\ud800"',
                b"\xff",
                b" ",
            ]
        ),
        max_size=40,
    ).map(b"".join)
)
def test_arbitrary_bytes_raise_nothing_but_corrupt_log_error(data: bytes) -> None:
    try:
        got = _decode(data)
    except CorruptLogError as exc:
        assert "\n" not in str(exc)
        return
    for _, _, value in got:  # what is accepted is finite JSON
        _strict_loads(json.dumps(value, allow_nan=False).encode())


@settings(max_examples=200, deadline=None)
@given(
    lines=st.lists(st.tuples(_action(), st.booleans()), min_size=1, max_size=8),
    cut=st.integers(0, 10_000),
    byte=st.integers(0, 255),
    mode=st.sampled_from(["flip", "truncate", "insert"]),
)
def test_mutated_commits_are_refused_or_read_never_crash(
    lines: list[tuple[tuple[str, dict[str, Any]], bool]], cut: int, byte: int, mode: str
) -> None:
    data = bytearray(b"\n".join(_line(n, b, spaced=s) for (n, b), s in lines) + b"\n")
    at = cut % len(data)
    if mode == "flip":
        data[at] = byte
    elif mode == "truncate":
        del data[at:]
    else:
        data.insert(at, byte)
    with contextlib.suppress(CorruptLogError):  # refused is fine; any other exception is not
        _decode(bytes(data))


@settings(max_examples=150, deadline=None)
@given(lines=st.lists(st.tuples(_action(), st.booleans()), min_size=1, max_size=10), chunk=st.integers(1, 64))
def test_streamed_in_buffers_reads_the_same(
    lines: list[tuple[tuple[str, dict[str, Any]], bool]], chunk: int
) -> None:
    data = b"\n".join(_line(n, b, spaced=s) for (n, b), s in lines) + b"\n"

    def flat(source: Any) -> list[tuple[int, str, bytes, Any]]:
        runs = read_actions(source, table="t", file="f")
        return [
            (r.line + i, r.name, b, v)
            for r in runs
            for i, (b, v) in enumerate(zip(r.bodies, r.values, strict=True))
        ]

    assert flat(line_buffers(io.BytesIO(data), chunk)) == flat(data)


def test_schema_strings_are_strict_and_depth_limited() -> None:
    for bad in ("[" * 100_000, '{"type":"struct","fields":[],"x":NaN}'):
        with pytest.raises(SchemaError):
            parse_schema(bad)
    deep: Any = "integer"
    for _ in range(150):
        deep = {"type": "array", "elementType": deep, "containsNull": True}
    text = json.dumps(
        {"type": "struct", "fields": [{"name": "a", "type": deep, "nullable": True, "metadata": {}}]}
    )
    with contextlib.suppress(SchemaError):  # refused cleanly is fine; a RecursionError is not
        parse_schema(text)


# --- the findings of issue 11, through every reader ---------------------------------------------

_ADD = {"path": "x.parquet", "partitionValues": {}, "size": 1, "modificationTime": 1, "dataChange": True}


def _append_commit(table: Path, lines: list[bytes]) -> int:
    log = table / "_delta_log"
    version = max(int(p.name[:20]) for p in log.glob("*.json") if p.name[:20].isdigit()) + 1
    (log / f"{version:020d}.json").write_bytes(b"".join(line + b"\n" for line in lines))
    return version


#: (line, what the refusal names); each is one finding of issue 11
FINDINGS = [
    (b'{"remove":{"deletionTimestamp":1,"dataChange":true}}', "remove.path: required field missing"),
    (_line("add", {k: v for k, v in _ADD.items() if k != "path"}), "add.path: required field missing"),
    (b'{"add":null}', "add: expected a JSON object"),
    (_line("add", {**_ADD, "size": 10**30}), "add.size: expected a non-negative 64-bit integer"),
    (
        b'{"add":{"path":"x.parquet","partitionValues":{},"size":NaN,"modificationTime":1,"dataChange":true}}',
        "add.size",
    ),
    (b'{"commitInfo":{"operation":"WRITE","x":Infinity}}', "commitInfo.x: expected finite numbers"),
    (b'{"commitInfo":{"a":' + b"[" * 5000 + b"]" * 5000 + b"}}", "invalid JSON: recursion limit exceeded"),
    (b'{"commitInfo":{"note":"\\ud800"}}', "invalid JSON"),
    (b'{"commitInfo":{"note":"caf\xe9"}}', "invalid JSON"),
    (
        _line(
            "add",
            {
                **_ADD,
                "deletionVector": {
                    "storageType": "u",
                    "pathOrInlineDv": "ab",
                    "sizeInBytes": 10**12,
                    "cardinality": 1,
                },
            },
        ),
        "add.deletionVector.sizeInBytes",
    ),
]


def _refused(exc_info: pytest.ExceptionInfo[BaseException], version: int, problem: str) -> None:
    exc = exc_info.value
    assert isinstance(exc, CorruptLogError), repr(exc)
    assert exc.exit_code == 2 and exc.version == version and exc.line == 1
    assert exc.message.startswith(problem), exc.message
    assert exc.file is not None and exc.file.endswith(f"{version:020d}.json")


@pytest.mark.parametrize(("line", "problem"), FINDINGS, ids=range(len(FINDINGS)))
def test_findings_are_refused_by_snapshot_history_and_changes(
    tmp_path: Path, line: bytes, problem: str
) -> None:
    path = copy_table("krs__cdf-table", tmp_path)
    version = _append_commit(path, [line])
    table = open_table(str(path))
    with pytest.raises(DeltaMirrorError) as info:
        table.snapshot()
    _refused(info, version, problem)
    with pytest.raises(DeltaMirrorError) as info:
        list(open_table(str(path)).history())
    _refused(info, version, problem)
    with pytest.raises(DeltaMirrorError) as info:
        list(open_table(str(path)).changes(starting_version=version - 1))
    _refused(info, version, problem)


@pytest.mark.parametrize(("line", "problem"), FINDINGS, ids=range(len(FINDINGS)))
def test_findings_are_refused_by_the_watchers_scan(tmp_path: Path, line: bytes, problem: str) -> None:
    from deltamirror.producer.publishing.offline_events import iter_event_values

    path = copy_table("krs__cdf-table", tmp_path)
    version = _append_commit(path, [line])
    with pytest.raises(DeltaMirrorError) as info:
        list(iter_event_values(str(path), starting_version=version - 1))
    _refused(info, version, problem)


def test_a_partition_column_a_file_action_leaves_out_reads_as_null(tmp_path: Path) -> None:
    """PROTOCOL.md's partitionValues is "a map from partition column to value", optional on a
    remove, and requires no key per column: delta-spark writes ``{}`` on the remove of a file whose
    partition value is null (``DELETE ... WHERE p IS NULL``) and reads a key a map lacks as null.
    Every reader takes such a commit, and the values read are null."""
    from deltamirror.producer.publishing.offline_events import iter_event_values

    path = copy_table("krs__cdf-table-partitioned", tmp_path)
    table = open_table(str(path))
    assert table.snapshot().metadata.partition_columns
    first = table.snapshot().files.slice(0, 1).to_pylist()[0]
    remove = {"path": first["path"], "deletionTimestamp": 1, "dataChange": True, "partitionValues": {}}
    remove.update(extendedFileMetadata=True, size=first["size"])
    add = {**_ADD, "path": "no-key.parquet", "partitionValues": {"other": "1"}}
    version = _append_commit(path, [b'{"commitInfo":{}}', _line("remove", remove), _line("add", add)])
    snap = open_table(str(path)).snapshot()
    assert snap.version == version
    files = snap.files.to_pylist()
    assert first["path"] not in [f["path"] for f in files]
    assert [f["partitionValues"] for f in files if f["path"] == "no-key.parquet"] == [[("other", "1")]]
    history = list(open_table(str(path)).history())
    assert max(h.version for h in history) == version
    assert list(iter_event_values(str(path), starting_version=version))
    # (the change feed and read of such files: tests/core/test_writers_corpus.py, on real logs)


def test_a_null_partition_value_is_not_a_missing_one(tmp_path: Path) -> None:
    path = copy_table("krs__cdf-table-partitioned", tmp_path)
    table = open_table(str(path))
    (column,) = table.snapshot().metadata.partition_columns
    before = table.snapshot().files.num_rows
    add = {**_ADD, "path": "null-part.parquet", "partitionValues": {column: None}}
    _append_commit(path, [_line("add", add)])
    assert open_table(str(path)).snapshot().files.num_rows == before + 1


def test_a_remove_without_path_cannot_bring_a_deleted_file_back(tmp_path: Path) -> None:
    path = copy_table("krs__cdf-table", tmp_path)
    files = open_table(str(path)).snapshot().files["path"].to_pylist()
    version = _append_commit(
        path, [b'{"remove":{"dataChange":true,"deletionTimestamp":5,"name":"' + files[0].encode() + b'"}}']
    )
    with pytest.raises(CorruptLogError) as info:
        open_table(str(path)).snapshot()
    assert info.value.version == version and info.value.message == "remove.path: required field missing"


def test_checkpoint_rows_are_checked_in_arrow(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    path = copy_table("krs__app-txn-checkpoint", tmp_path)
    (cp,) = (path / "_delta_log").glob("*.checkpoint.parquet")
    original = pq.read_table(cp)
    assert open_table(str(path)).snapshot().files.num_rows > 0

    def with_add_field(name: str, values: Any) -> pa.Table:
        add = original.column("add").combine_chunks()
        fields = [add.field(i) for i in range(add.type.num_fields)]
        i = add.type.get_field_index(name)
        fields[i] = values(fields[i], pc.is_valid(add))
        struct = pa.StructArray.from_arrays(fields, fields=list(add.type), mask=pc.invert(pc.is_valid(add)))
        return original.set_column(original.column_names.index("add"), "add", struct)

    cases = {
        "add.size: expected a non-negative 64-bit integer": with_add_field(
            "size", lambda col, valid: pc.if_else(valid, pa.scalar(-1, col.type), col)
        ),
        "add.path: expected a non-empty string": with_add_field(
            "path", lambda col, valid: pc.if_else(valid, pa.scalar("", col.type), col)
        ),
    }
    for problem, table in cases.items():
        pq.write_table(table, cp)
        with pytest.raises(CorruptLogError) as info:
            open_table(str(path)).snapshot()
        assert info.value.message.startswith(problem), info.value.message
    cp.write_bytes(b"not a parquet file at all")
    with pytest.raises(CorruptLogError) as info:
        open_table(str(path)).snapshot()
    assert info.value.exit_code == 2 and "\n" not in str(info.value)
    pq.write_table(
        original.set_column(original.column_names.index("add"), "add", pa.array(["x"] * original.num_rows)),
        cp,
    )
    with pytest.raises(CorruptLogError):
        open_table(str(path)).snapshot()


def test_strict_json_helper_refuses_nan_and_depth() -> None:
    assert actions.parse_json(b'{"a":[1,2.5]}', what="x") == {"a": [1, 2.5]}
    for bad in (b'{"a":NaN}', b"[" * 1000, b'{"a":1e999}'):
        with pytest.raises(CorruptLogError) as info:
            actions.parse_json(bad, what="_last_checkpoint")
        assert info.value.message.startswith("_last_checkpoint is not valid JSON")
    assert math.isfinite(actions.parse_json(b"1.5", what="x"))
