"""The actions topic's encoder: finished records (value, key, headers, fragments) a reader decodes back.

The golden records pin the bytes of whole runs; these pin what one batch of one version becomes,
including what no golden run shows: a record split into fragments, records skipped because the
topic holds them already, the ``fail`` policy, and an extra header on every record.
"""

from __future__ import annotations

import pytest

from deltamirror.mirror.errors import RecordTooLargeError
from deltamirror.mirror.records.actions import ActionRecords
from deltamirror.mirror.records.events import EnvelopeEncoder, decode_action_event
from deltamirror.mirror.records.fragments import FragmentAssembler, Oversize
from deltamirror.mirror.records.headers import header_value

URI = "file:///data/t"
ACTIONS: list[tuple[str, bytes]] = [
    ("commitInfo", b'{"operation":"WRITE","timestamp":1}'),
    ("add", b'{"path":"a.parquet","partitionValues":{},"size":10,"modificationTime":1,"dataChange":true}'),
    ("remove", b'{"path":"b.parquet","deletionTimestamp":1,"dataChange":true}'),
]


def _records(*, snapshot: bool = False, **kw: object) -> ActionRecords:
    encoder = EnvelopeEncoder(
        table_id="t-1",
        table_uri=URI,
        version=4,
        commit_timestamp=1_700_000_000_000,
        commit_timestamp_source="file-time",
        count=len(ACTIONS),
        snapshot=snapshot,
    )
    return ActionRecords(encoder, **kw)  # type: ignore[arg-type]


def test_each_action_is_a_record_keyed_by_table_id_with_version_index_and_type() -> None:
    batch = _records().encode(0, ACTIONS)
    assert batch.key == b"t-1" and len(batch) == 3
    assert [list(h) for h in batch.headers] == [
        [("version", b"4"), ("index", str(i).encode()), ("type", t.encode())]
        for i, (t, _) in enumerate(ACTIONS)
    ]
    for i, value in enumerate(batch.values):
        event = decode_action_event(value)
        assert (event.table_id, event.version, event.index, event.count) == ("t-1", 4, i, 3)
        assert (event.type, event.snapshot) == (ACTIONS[i][0], False)
    assert batch.values[1].endswith(b',"type":"add","action":' + ACTIONS[1][1] + b"}")


def test_extra_headers_follow_every_record_and_skipped_records_are_not_encoded_again() -> None:
    batch = _records(extra_headers=[("clampedFrom", b"-5")]).encode(1, ACTIONS[1:], skip=1)
    headers = [list(h) for h in batch.headers]
    assert headers == [[("version", b"4"), ("index", b"2"), ("type", b"remove"), ("clampedFrom", b"-5")]]
    assert decode_action_event(batch.values[0]).index == 2


def test_a_value_longer_than_the_topic_takes_is_split_and_joins_back() -> None:
    big = (
        "metaData",
        b'{"id":"x","description":"' + b"d" * 2900 + b'","format":{"provider":"parquet"},'
        b'"schemaString":"{\\"type\\":\\"struct\\",\\"fields\\":[]}","partitionColumns":[],"configuration":{}}',
    )
    oversize = Oversize(1024, "split", "actions", URI)
    batch = _records(oversize=oversize).encode(0, [ACTIONS[0], big])
    values, headers = batch.values, [list(h) for h in batch.headers]
    assert all(len(v) <= 1024 for v in values) and len(values) > 2
    assert header_value(headers[0], "fragment") is None
    assert [header_value(h, "fragment") for h in headers[1:]] == [
        f"{i}/{len(values) - 1}" for i in range(len(values) - 1)
    ]
    assembler = FragmentAssembler()
    joined = [w for v, h in zip(values, headers, strict=True) if (w := assembler.feed(v, h)) is not None]
    assert [decode_action_event(w).type for w in joined] == ["commitInfo", "metaData"]
    assert decode_action_event(joined[1]).action["description"] == "d" * 2900


def test_the_fail_policy_refuses_a_long_value_naming_its_index() -> None:
    with pytest.raises(RecordTooLargeError, match="topic actions") as refused:
        _records(oversize=Oversize(100, "fail", "actions", URI)).encode(1, ACTIONS[1:])
    assert refused.value.context["index"] == 1 and refused.value.version == 4


def test_snapshot_records_end_with_snapshot_end() -> None:
    batch = _records(snapshot=True).encode(0, ACTIONS)
    events = [decode_action_event(v) for v in batch.values]
    assert [e.snapshot_end for e in events] == [False, False, True] and all(e.snapshot for e in events)
