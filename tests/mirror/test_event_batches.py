"""The batch decoder against the per-record one: the same values accepted, the same refused.

The expectation is built from the per-record decoder (:func:`decode_action_event`) and pyarrow's
own conversion of each body (``Table.from_pylist`` with the checkpoint's columns, as the state's
accumulator converts them), never from the batch decoder. Inputs are the watcher's own events of
real tables (which must take the columnar path) and those events mutated in the ways a producer
other than the watcher, or a broken one, could write them.
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deltamirror.core.accumulator import FILE_ROWS, ORDER
from deltamirror.core.table import open_table
from deltamirror.mirror.errors import EventStreamError
from deltamirror.mirror.records.boundary import DEFAULT_RULES, RecordRules
from deltamirror.mirror.records.event_batches import ActionEventBatch, decode_action_events
from deltamirror.mirror.records.events import decode_action_event
from deltamirror.producer.publishing.offline_events import iter_event_values
from deltamirror.producer.tailing.snapshot_events import SnapshotWork
from deltamirror.producer.tailing.summaries import envelope_encoder
from support.tables import TABLES

TABLES_WITH_FILES = [
    "krs__cdf-table-partitioned",  # partitions, removes
    "krs__table-with-dv-small",  # deletion vectors
    "golden__canonicalized-paths-normal-a",  # file: paths
    "golden__basic-with-inserts-deletes-checkpoint",
]
#: what a reader of each table allows outside its root (golden__canonicalized-paths-normal-a's log
#: names /some/unqualified/absolute/path, which a reader takes only under an allowed prefix)
RULES = {"golden__canonicalized-paths-normal-a": RecordRules(allowed_path_prefixes=["/some"])}


def _row(name: str, action: Any, index: int) -> tuple[str, Any]:
    """A file action as the accumulator's columns hold it, or why it does not fit them."""
    if type(action) is not dict:
        return ("not an object", repr(action))
    try:
        table = pa.Table.from_pylist([{**action, ORDER: index}], schema=FILE_ROWS[name])
    except (pa.ArrowException, TypeError, ValueError, OverflowError) as exc:
        return ("does not fit", type(exc).__name__)
    return ("row", table.to_pylist()[0])


def _expected(values: list[bytes], rules: RecordRules = DEFAULT_RULES) -> list[tuple[Any, ...]]:
    """Per value: its envelope, index and action, file actions as their Arrow row (per-record decoder)."""
    out = []
    for value in values:
        e = decode_action_event(value, rules=rules)
        envelope = (e.table_id, e.table_uri, e.version, e.commit_timestamp, e.commit_timestamp_source)
        envelope += (e.count, e.snapshot, e.schema_version)
        action = _row(e.type, e.action, e.index) if e.type in ("add", "remove") else e.action
        out.append((envelope, e.index, e.type, action))
    return out


def _got(batch: ActionEventBatch) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = []
    for seg in batch.segments:
        env = seg.envelope
        envelope = (env.table_id, env.table_uri, env.version, env.commit_timestamp)
        envelope += (env.commit_timestamp_source, env.count, env.snapshot, env.schema_version)
        rows: dict[int, tuple[str, Any]] = {}
        for name, table in (("add", seg.adds), ("remove", seg.removes)):
            for row in table.to_pylist() if table is not None else []:
                rows[row[ORDER]] = (name, ("row", row))
        for index, kind, action in seg.others:
            rows[index] = (kind, _row(kind, action, index) if kind in ("add", "remove") else action)
        indexes = range(seg.first_index, seg.last_index + 1)
        assert sorted(rows) == list(indexes), "a segment covers consecutive indexes, each once"
        out.extend((envelope, i, *rows[i]) for i in indexes)
    assert sum(s.stop - s.start for s in batch.segments) == batch.size
    return out


def _values(table_id: str) -> list[bytes]:
    """A table's events as the watcher publishes them: every version, then a snapshot of the last."""
    uri = str(TABLES / table_id)
    values = list(iter_event_values(uri))
    table = open_table(uri)
    snap = table.snapshot(check_features=False)
    work = SnapshotWork(snap, table.uri, snap.timestamp)
    encoder = envelope_encoder(work)
    snapshot: list[bytes] = []
    for batch in work.batches(1000):
        snapshot.extend(encoder.encode_many(len(snapshot), batch))
    return values + snapshot


def _assert_same(values: list[bytes], rules: RecordRules = DEFAULT_RULES) -> ActionEventBatch | None:
    """Both decoders accept ``values`` with the same content, or both refuse the same value alike."""
    try:
        expected = _expected(values, rules)
    except EventStreamError as exc:
        with pytest.raises(EventStreamError) as refused:
            decode_action_events(values, lambda i: {"offset": i}, rules=rules)
        first = next(i for i, v in enumerate(values) if _refused(v, rules))
        assert str(refused.value) == str(EventStreamError(exc.message, version=exc.version, offset=first))
        partial = decode_action_events(values, lambda i: {"offset": i}, rules=rules, partial=True)
        assert partial.refused is not None and partial.refused[0] == first
        assert str(partial.refused[1]) == str(refused.value)
        assert _got(partial) == _expected(values[:first], rules)  # the values before it, decoded
        return None
    batch = decode_action_events(values, lambda i: {"offset": i}, rules=rules)
    assert _got(batch) == expected
    return batch


def _refused(value: bytes, rules: RecordRules = DEFAULT_RULES) -> bool:
    try:
        decode_action_event(value, rules=rules)
    except EventStreamError:
        return True
    return False


@pytest.mark.parametrize("table_id", TABLES_WITH_FILES)
def test_the_watchers_events_take_the_columnar_path_and_decode_as_one_by_one(table_id: str) -> None:
    values = _values(table_id)
    batch = _assert_same(values, RULES.get(table_id, DEFAULT_RULES))
    assert batch is not None and batch.columnar
    assert any(s.adds is not None for s in batch.segments)


def test_versions_split_into_segments_that_end_with_their_version() -> None:
    values = _values("krs__cdf-table-partitioned")
    batch = decode_action_events(values)
    by_version: dict[int, int] = {}
    for value in values:
        v = json.loads(value)
        by_version[v["version"]] = by_version.get(v["version"], 0) + 1
    for seg in batch.segments:
        assert seg.last_index < seg.envelope.count
    # every version (and the snapshot) ends a segment
    ends = [s for s in batch.segments if s.last_index + 1 == s.envelope.count]
    assert len(ends) == len(by_version) + 1


def _event(index: int = 0, count: int = 1, action_type: str = "add", **body: Any) -> dict[str, Any]:
    return {
        "schemaVersion": 1,
        "tableId": "t",
        "tableUri": "file:///t",
        "version": 3,
        "commitTimestamp": 5,
        "commitTimestampSource": "ict",
        "count": count,
        "snapshot": False,
        "index": index,
        "type": action_type,
        "action": body
        or {"path": "a", "partitionValues": {"p": "1"}, "size": 1, "modificationTime": 0, "dataChange": True},
    }


def _encoded(event: dict[str, Any]) -> bytes:
    return json.dumps(event, separators=(",", ":")).encode()


def _base() -> list[bytes]:
    return [
        _encoded(
            _event(
                i,
                4,
                "add",
                path=f"p{i}",
                partitionValues={"p": str(i)},
                size=i,
                modificationTime=0,
                dataChange=True,
            )
        )
        for i in range(4)
    ]


# values another producer (or a broken one) may write: each replaces the third of _base()
VARIANTS: list[tuple[str, bytes]] = [
    ("a key given twice in the envelope", _base()[2].replace(b'"index":2', b'"tableId":"u","index":2')),
    ("a null envelope key given twice", _base()[2].replace(b'"index":2', b'"version":null,"index":2')),
    ("a field's Python name", _base()[2].replace(b'"index":2', b'"snapshot_end":true,"index":2')),
    ("a Python name beside its alias", _base()[2].replace(b'"index":2', b'"table_id":"u","index":2')),
    ("the index given twice", _base()[2].replace(b'"type"', b'"index":1,"type"')),
    ("the action given twice", _base()[2].replace(b'"type"', b'"action":5,"type"')),
    ("spaces in the envelope", _base()[2].replace(b'"index":2', b'"index": 2')),
    ("a space before the action", _base()[2].replace(b'"action":{', b'"action": {')),
    ("keys in another order", _encoded(dict(reversed(list(_event(2, 4).items()))))),
    ("trailing whitespace", _base()[2] + b" "),
    ("a line break", _base()[2].replace(b',"type"', b',\n"type"')),
    ("an unknown envelope field", _base()[2].replace(b'"index":2', b'"x":{"y":[1]},"index":2')),
    ("an unknown body field", _base()[2].replace(b'"size":2', b'"size":2,"x":[[[1]]]')),
    (
        "a deep unknown body field",
        _base()[2].replace(b'"size":2', b'"size":2,"x":' + b"[" * 300 + b"]" * 300),
    ),
    ("NaN in a body", _base()[2].replace(b'"size":2', b'"size":2,"x":NaN')),
    ("a float size", _base()[2].replace(b'"size":2', b'"size":2.0')),
    ("a huge size", _base()[2].replace(b'"size":2', b'"size":123456789012345678901234567890')),
    ("a bool size", _base()[2].replace(b'"size":2', b'"size":true')),
    ("a string size", _base()[2].replace(b'"size":2', b'"size":"2"')),
    ("a missing path", _base()[2].replace(b'"path":"p2",', b"")),
    ("a null path", _base()[2].replace(b'"path":"p2"', b'"path":null')),
    ("a path given twice", _base()[2].replace(b'"path":"p2"', b'"path":"x","path":"p2"')),
    ("a number partition value", _base()[2].replace(b'{"p":"2"}', b'{"p":2}')),
    ("a null partition value", _base()[2].replace(b'{"p":"2"}', b'{"p":null}')),
    ("no partition values", _base()[2].replace(b'{"p":"2"}', b"{}")),
    ("a brace in a partition value", _base()[2].replace(b'{"p":"2"}', b'{"p":"}{"}')),
    ("a nested partition value", _base()[2].replace(b'{"p":"2"}', b'{"p":{"q":"2"}}')),
    ("partition values as a list", _base()[2].replace(b'{"p":"2"}', b'[["p","2"]]')),
    ("a partition key given twice", _base()[2].replace(b'{"p":"2"}', b'{"p":"1","p":"2"}')),
    (
        "partitionValues named in a tag",
        _base()[2].replace(b'"size":2', b'"size":2,"tags":{"partitionValues":"x"}'),
    ),
    ("tags", _base()[2].replace(b'"size":2', b'"size":2,"tags":{"a":"b","c":null}')),
    (
        "a deletion vector",
        _base()[2].replace(
            b'"size":2',
            b'"size":2,"deletionVector":{"storageType":"i","pathOrInlineDv":"x","offset":1,"sizeInBytes":3,"cardinality":2}',
        ),
    ),
    (
        "a deletion vector offset past int32",
        _base()[2].replace(b'"size":2', b'"size":2,"deletionVector":{"offset":2147483648}'),
    ),
    (
        "an action that is not an object",
        _base()[2].replace(b'"action":{', b'"action":[{').replace(b"}}", b"}]}"),
    ),
    ("a null action", _encoded({**_event(2, 4), "action": None})),
    ("a commitInfo", _encoded(_event(2, 4, "commitInfo", timestamp=1, operation="WRITE"))),
    ("an unknown action type", _encoded({**_event(2, 4, "newThing"), "action": "anything"})),
    ("a remove", _encoded(_event(2, 4, "remove", path="p0", deletionTimestamp=9, dataChange=True))),
    ("not UTF-8 in an unknown field", _base()[2].replace(b'"size":2', b'"size":2,"x":"\xff"')),
    ("a lone surrogate", _base()[2].replace(b'"path":"p2"', b'"path":"\\ud800"')),
    ("a control character", _base()[2].replace(b'"path":"p2"', b'"path":"p\t2"')),
    ("an index with a leading zero", _base()[2].replace(b'"index":2', b'"index":02')),
    ("a negative index", _base()[2].replace(b'"index":2', b'"index":-2')),
    ("a float index", _base()[2].replace(b'"index":2', b'"index":2.0')),
    ("an index out of order", _base()[2].replace(b'"index":2', b'"index":0')),
    ("a text snapshotEnd", _base()[2].replace(b'"index":2', b'"index":2,"snapshotEnd":"no"')),
    ("a null snapshotEnd", _base()[2].replace(b'"index":2', b'"index":2,"snapshotEnd":null')),
    ("another schema version", _base()[2].replace(b'"schemaVersion":1', b'"schemaVersion":2')),
    ("a byte order mark", b"\xef\xbb\xbf" + _base()[2]),
    ("not JSON", b"{"),
    ("empty", b""),
    ("a list", b"[1]"),
]


@pytest.mark.parametrize("value", [v for _, v in VARIANTS], ids=[n for n, _ in VARIANTS])
def test_values_other_producers_may_write_are_accepted_or_refused_alike(value: bytes) -> None:
    values = _base()
    values[2] = value
    _assert_same(values)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    at=st.integers(min_value=0, max_value=400),
    cut=st.integers(min_value=0, max_value=3),
    insert=st.sampled_from(
        [b"", b" ", b'"', b"}", b"{", b",", b":", b"0", b"null", b"\\", b"\n", b"\xc3", b'"p":"1",']
    ),
)
def test_mutated_values_are_accepted_or_refused_alike(at: int, cut: int, insert: bytes) -> None:
    values = _base()
    value = values[1]
    at = min(at, len(value))
    values[1] = value[:at] + insert + value[at + cut :]
    _assert_same(values)


def test_a_refused_value_is_named_by_where() -> None:
    values = _base()
    values[3] = b"{"
    with pytest.raises(EventStreamError) as refused:
        decode_action_events(values, lambda i: {"topic": "t.actions", "offset": 100 + i})
    assert "offset=103" in str(refused.value) or "103" in str(refused.value)


def test_text_values_and_no_values() -> None:
    assert decode_action_events([]).segments == []
    batch = decode_action_events([v.decode() for v in _base()])
    assert not batch.columnar and _got(batch) == _expected(_base())


COLUMNAR = {
    "a null partition value",
    "no partition values",
    "tags",
    "a deletion vector",
    "a commitInfo",
    "an unknown action type",
    "a remove",
    "a null snapshotEnd",
}


@pytest.mark.parametrize("name", sorted(COLUMNAR))
def test_what_the_watcher_may_write_stays_on_the_columnar_path(name: str) -> None:
    values = _base()
    values[2] = dict(VARIANTS)[name]
    batch = _assert_same(values)
    assert batch is not None and batch.columnar
