"""The consumers' boundary on its own (no broker): what a record must hold to be taken."""

from __future__ import annotations

import json
from typing import Any

import pytest

from deltamirror.mirror.boundary import BadRecordError, RecordLimits, RecordRules, TablePins
from deltamirror.mirror.event_batches import decode_action_events
from deltamirror.mirror.events import decode_action_event, decode_commits_record


def _event(**overrides: Any) -> bytes:
    event = {
        "schemaVersion": 1,
        "tableId": "t",
        "tableUri": "file:///data/t",
        "version": 3,
        "commitTimestamp": 5,
        "commitTimestampSource": "ict",
        "count": 1,
        "snapshot": False,
        "index": 0,
        "type": "add",
        "action": {"path": "a", "partitionValues": {}, "size": 1, "modificationTime": 0, "dataChange": True},
    }
    event.update(overrides)
    return json.dumps(event).encode()


def _add(**fields: Any) -> dict[str, Any]:
    return {
        "path": "a",
        "partitionValues": {},
        "size": 1,
        "modificationTime": 0,
        "dataChange": True,
        **fields,
    }


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (_event(schemaVersion=999), "schemaVersion 999 is not one this deltamirror reads"),
        (_event(tableId="x" * 1025), "at most 1024"),
        (_event(index=1, count=1), "index 1 is not below count 1"),
        (_event(version=2**63), "less than or equal to 9223372036854775807"),
        (_event(action=_add(path="/etc/passwd")), "outside the table root"),
        (_event(action=_add(path="%2E%2E/%2E%2E/etc/passwd")), "outside the table root"),
        (
            _event(
                action=_add(
                    deletionVector={
                        "storageType": "p",
                        "pathOrInlineDv": "file:///etc/x",
                        "sizeInBytes": 1,
                        "cardinality": 1,
                    }
                )
            ),
            "deletion vector",
        ),
        (_event(action=_add(size=-1)), "add.size: expected a non-negative 64-bit integer"),
        (_event(tableUri="file:///data/../etc"), "not a table location as the watcher writes one"),
        (
            _event(type="sidecar", action={"path": "../../../x", "sizeInBytes": 1, "modificationTime": 0}),
            "sidecar",
        ),
    ],
)
def test_a_record_breaking_a_rule_is_refused_alike_by_both_decoders(value: bytes, message: str) -> None:
    with pytest.raises(BadRecordError, match=message):
        decode_action_event(value, topic="t.actions", offset=7)
    batch = decode_action_events([_event(), value], lambda i: {"offset": i}, partial=True)
    assert batch.refused is not None and batch.refused[0] == 1 and message.split()[0] in str(batch.refused[1])
    assert [s.envelope.version for s in batch.segments] == [3]  # the record before it, decoded


def test_allowed_prefixes_and_locations_are_the_readers_to_give() -> None:
    shallow = _event(action=_add(path="file:///data/source/part-0.parquet"))
    with pytest.raises(BadRecordError):
        decode_action_event(shallow)
    decode_action_event(shallow, rules=RecordRules(allowed_path_prefixes=["/data/source"]))
    lake = RecordRules(table_locations=["/data"])
    decode_action_event(_event(), rules=lake)
    for elsewhere in ("file:///etc", "file:///data2/t", "s3://bucket/t"):
        with pytest.raises(BadRecordError, match="--allow-table-location"):
            decode_action_event(_event(tableUri=elsewhere), rules=lake)
    assert lake.location_problem("file:///data") is None  # the location itself


def test_a_location_is_judged_as_the_watcher_writes_it() -> None:
    rules = RecordRules()
    for good in ("file:///data/a table #1 %20 é", "s3://bucket/t", "file:///"):
        assert rules.location_problem(good) is None, good
    for bad in ("file:///a/", "file:///a/../b", "file://host/a", "a/b", "s3://k:secret@b/t", "nope://x/y"):
        assert rules.location_problem(bad) is not None, bad
        assert "secret" not in str(rules.location_problem(bad))


def test_a_version_larger_than_a_reader_holds_is_refused_at_its_first_record() -> None:
    rules = RecordRules(limits=RecordLimits(max_actions_per_version=10))
    with pytest.raises(BadRecordError, match="a version of 11 actions"):
        decode_action_event(_event(count=11), rules=rules)


def test_pins_keep_each_table_where_it_was_first_seen_and_bound_their_number() -> None:
    pins = TablePins(RecordLimits(max_tables=2))
    assert pins.problem("a", "file:///a") is None
    pins.pin("a", "file:///a")
    assert "records never move a table" in str(pins.problem("a", "file:///etc"))
    pins.pin("b", "file:///b")
    assert "at most 2" in str(pins.problem("c", "file:///c"))
    pins.forget("b")
    assert pins.problem("c", "file:///c") is None


def test_unknown_kinds_are_none_and_known_ones_are_checked() -> None:
    assert decode_commits_record(b'{"kind":"aNewKind","schemaVersion":1}') is None
    assert decode_commits_record(b"{}", "aNewKind") is None
    with pytest.raises(BadRecordError, match="schemaVersion 7"):
        decode_commits_record(b'{"kind":"heartbeat","schemaVersion":7}', "heartbeat", offset=3)
    with pytest.raises(BadRecordError, match="larger than a reader takes"):
        decode_commits_record(b" " * 100, rules=RecordRules(limits=RecordLimits(max_record_bytes=10)))


def test_a_refusal_is_one_short_line_whatever_the_record_held() -> None:
    key = "k\n" * 100_000
    value = _event(action=_add(partitionValues={key: 1}))
    with pytest.raises(BadRecordError) as refused:
        decode_action_event(value, topic="t.actions", partition=0, offset=9)
    line = str(refused.value)
    assert "\n" not in line and len(line) < 1300 and line.endswith("topic=t.actions, partition=0, offset=9)")
