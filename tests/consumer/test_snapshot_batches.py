"""A state applied from decoded batches against the same state applied one event at a time."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pytest

from deltamirror.consumer.snapshot import IncrementalSnapshot, Invalidation
from deltamirror.mirror.errors import EventStreamError
from deltamirror.mirror.event_batches import decode_action_events
from deltamirror.mirror.events import decode_action_event
from deltamirror.producer.offline_events import iter_event_values
from support.tables import TABLES, record_rules

TABLES_FROM_ZERO = [
    "golden__basic-with-inserts-updates",
    "golden__log-replay-dv-key-cases",
    "golden__delete-re-add-same-file-different-transactions",
    "golden__canonicalized-paths-normal-a",
    "krs__table-with-dv-small",
    "krs__cdf-table-partitioned",
]


def _one_by_one(
    table_id: str, values: list[bytes], rules: Any = None
) -> tuple[IncrementalSnapshot, list[Invalidation]]:
    state = IncrementalSnapshot(table_id)
    out = []
    for value in values:
        applied = state.apply(decode_action_event(value, rules=rules))
        if applied is not None:
            out.append(applied)
    return state, out


def _same(a: Invalidation, b: Invalidation) -> None:
    assert (a.table_id, a.version, a.snapshot, a.files) == (b.table_id, b.version, b.snapshot, b.files)
    assert list(a.added) == list(b.added) and list(a.removed) == list(b.removed)
    assert list(a.partitions) == list(b.partitions)


@pytest.mark.parametrize("table_id", TABLES_FROM_ZERO)
@pytest.mark.parametrize("size", [1, 7, 10_000])
def test_batches_of_any_size_apply_as_events_one_by_one(table_id: str, size: int) -> None:
    values = list(iter_event_values(str(TABLES / table_id)))
    table = json.loads(values[0])["tableId"]
    rules: Any = record_rules(table_id)
    expected, expected_invalidations = _one_by_one(table, values, rules)
    state = IncrementalSnapshot(table)
    got = []
    for start in range(0, len(values), size):
        batch = decode_action_events(values[start : start + size], rules=rules)
        assert batch.columnar
        for segment in batch.segments:
            applied = state.apply_segment(segment)
            if applied is not None:
                got.append(applied)
    assert len(got) == len(expected_invalidations)
    for a, b in zip(got, expected_invalidations, strict=True):
        _same(a, b)
    assert state.files.equals(expected.files)  # the same rows in the same order
    assert state.document() == expected.document()


def test_a_refused_value_leaves_the_events_before_it_applied() -> None:
    values = list(iter_event_values(str(TABLES / "krs__cdf-table-partitioned")))
    table = json.loads(values[0])["tableId"]
    first = [v for v in values if json.loads(v)["version"] == 0]
    state = IncrementalSnapshot(table)
    with pytest.raises(EventStreamError):
        state.apply_values([*first, b"{"])
    assert state.version == 0  # version 0 was applied before the refusal, as one by one


def test_order_errors_are_the_same_as_one_by_one() -> None:
    values = list(iter_event_values(str(TABLES / "krs__cdf-table-partitioned")))
    table = json.loads(values[0])["tableId"]
    v1 = [v for v in values if json.loads(v)["version"] == 1]
    for broken in (v1[1:], [v1[0], *v1[2:]], [*values[:3], *v1]):
        one = IncrementalSnapshot(table)
        with pytest.raises(EventStreamError) as by_event:
            for value in broken:
                one.apply(decode_action_event(value))
        batched = IncrementalSnapshot(table)
        with pytest.raises(EventStreamError) as by_batch:
            for segment in decode_action_events(broken).segments:
                batched.apply_segment(segment)
        assert str(by_batch.value) == str(by_event.value)


def test_paths_of_an_invalidation_stay_in_arrow_until_read() -> None:
    values = list(iter_event_values(str(TABLES / "krs__cdf-table-partitioned")))
    state = IncrementalSnapshot(json.loads(values[0])["tableId"])
    (first, *_) = state.apply_values(values)
    assert isinstance(first.added.to_arrow(), pa.Array)  # type: ignore[attr-defined]
    assert tuple(first.added) == first.added and list(first.added) == first.added
    assert first.added[0] == next(iter(first.added)) and first.added[-1:] == tuple(first.added)[-1:]
