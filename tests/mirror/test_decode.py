"""The one decoder of what readers take from the topics, fed the records docs/events.md shows.

The documented examples are the inputs, and the expected fields are read from their JSON: what a
subscriber of the contract sees, not what the decoder happens to return.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic.alias_generators import to_camel

from deltamirror.mirror.errors import EventStreamError
from deltamirror.mirror.records.events import (
    ActionEvent,
    CommitSummary,
    Heartbeat,
    ProgressRecord,
    TableReplaced,
    decode_action_event,
    decode_commits_record,
    decode_progress,
)

DOCS = Path(__file__).resolve().parents[2] / "docs" / "events.md"


def _documented() -> list[str]:
    return [line for line in DOCS.read_text().splitlines() if line.startswith('{"')]


def _example(kind: str) -> bytes:
    """The documented record of ``kind`` (``action``, ``progress`` or a commits-topic kind)."""
    for line in _documented():
        data = json.loads(line)
        found = data.get("kind") or ("progress" if "transactionalId" in data else "action")
        if found == kind:
            return line.encode()
    raise AssertionError(f"docs/events.md shows no {kind} record")


def _as_json(model: Any) -> dict[str, Any]:
    """The model's fields under their wire names (unknown fields kept as they came)."""
    return {to_camel(k): v for k, v in model.model_dump(exclude_none=True).items()}


# --- action events --------------------------------------------------------------------------------


def test_a_documented_action_event_decodes_to_its_fields() -> None:
    values = [line.encode() for line in _documented() if '"action":' in line]
    assert len(values) >= 2
    for value in values:
        event = decode_action_event(value, topic="t.actions", offset=4)
        assert isinstance(event, ActionEvent)
        assert _as_json(event) == json.loads(value)


def test_an_action_event_keeps_fields_it_does_not_know() -> None:
    data = {**json.loads(_example("action")), "addedLater": {"x": 1}}
    event = decode_action_event(json.dumps(data))
    assert _as_json(event) == data


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"version": -1}, "version"),
        ({"index": -1}, "index"),
        ({"commitTimestampSource": "guess"}, "commitTimestampSource"),
        ({"tableId": None}, "tableId"),
    ],
)
def test_an_action_event_that_breaks_the_contract_names_the_field_and_the_record(
    change: dict[str, Any], field: str
) -> None:
    data = {**json.loads(_example("action")), **change}
    with pytest.raises(EventStreamError) as err:
        decode_action_event(json.dumps(data), topic="t.actions", partition=0, offset=17)
    text = str(err.value)
    assert field in text and "topic=t.actions" in text and "offset=17" in text
    assert err.value.exit_code == 2


@pytest.mark.parametrize("value", [b"", b"{", b"not json", b"[1, 2]", b"null", b"\xff\xfe", b'"add"'])
def test_a_value_that_is_no_action_event_is_an_event_stream_error(value: bytes) -> None:
    with pytest.raises(EventStreamError, match=r"offset=9"):
        decode_action_event(value, topic="t.actions", offset=9)


def test_a_missing_required_field_is_named() -> None:
    data = json.loads(_example("action"))
    del data["count"]
    with pytest.raises(EventStreamError, match="count"):
        decode_action_event(json.dumps(data).encode())


# --- commits-topic records ------------------------------------------------------------------------

COMMITS_KINDS = {"commit": CommitSummary, "heartbeat": Heartbeat, "tableReplaced": TableReplaced}


@pytest.mark.parametrize("kind", sorted(COMMITS_KINDS))
@pytest.mark.parametrize("with_header", [True, False], ids=["kind-header", "no-header"])
def test_each_documented_commits_record_decodes_with_or_without_its_kind_header(
    kind: str, with_header: bool
) -> None:
    value = _example(kind)
    record = decode_commits_record(value, kind if with_header else None, topic="t.commits")
    assert isinstance(record, COMMITS_KINDS[kind])
    assert _as_json(record) == json.loads(value)


@pytest.mark.parametrize("with_header", [True, False], ids=["kind-header", "no-header"])
def test_kinds_the_reader_does_not_want_are_none(with_header: bool) -> None:
    for kind in COMMITS_KINDS:
        others = set(COMMITS_KINDS) - {kind}
        assert decode_commits_record(_example(kind), kind if with_header else None, wanted=others) is None
        assert decode_commits_record(_example(kind), kind if with_header else None, wanted=[]) is None
        wanted_alone = decode_commits_record(_example(kind), kind if with_header else None, wanted=[kind])
        assert isinstance(wanted_alone, COMMITS_KINDS[kind])


def test_an_unwanted_kind_named_by_its_header_is_not_parsed() -> None:
    """The header lets a reader skip a record without reading its value: even a broken one."""
    assert decode_commits_record(b"not json", "heartbeat", wanted={"commit"}) is None


@pytest.mark.parametrize("with_header", [True, False], ids=["kind-header", "no-header"])
def test_a_kind_a_newer_watcher_may_add_is_ignored(with_header: bool) -> None:
    value = json.dumps({"kind": "compaction", "schemaVersion": 1, "tableId": "t"}).encode()
    kind = "compaction" if with_header else None
    assert decode_commits_record(value, kind) is None
    # even when the reader names it: the decoder has no model for it
    assert decode_commits_record(value, kind, wanted={"compaction", "commit"}) is None


@pytest.mark.parametrize("with_header", [True, False], ids=["kind-header", "no-header"])
def test_a_bad_record_of_a_wanted_kind_is_an_error_naming_where(with_header: bool) -> None:
    data = json.loads(_example("commit"))
    del data["actionCount"]
    with pytest.raises(EventStreamError) as err:
        decode_commits_record(
            json.dumps(data), "commit" if with_header else None, topic="t.commits", partition=0, offset=41
        )
    text = str(err.value)
    assert "actionCount" in text and "commit" in text
    assert "topic=t.commits" in text and "offset=41" in text


def test_a_kind_header_that_contradicts_the_value_is_an_error() -> None:
    with pytest.raises(EventStreamError, match="offset=3"):
        decode_commits_record(_example("heartbeat"), "commit", offset=3)


@pytest.mark.parametrize("with_header", [True, False], ids=["kind-header", "no-header"])
@pytest.mark.parametrize("value", [b"", b"{", b"\xff", b"not json"])
def test_a_commits_value_that_is_not_json_is_an_error(value: bytes, with_header: bool) -> None:
    with pytest.raises(EventStreamError, match="offset=8"):
        decode_commits_record(value, "commit" if with_header else None, topic="t.commits", offset=8)


@pytest.mark.parametrize(
    "value",
    [
        b'{"kind": ["commit"], "schemaVersion": 1}',  # a kind that is not text
        b'{"kind": {"a": 1}}',
        b"[" * 100_000 + b"]" * 100_000,  # JSON nested deeper than any parser recurses
    ],
    ids=["kind-list", "kind-object", "deeply-nested"],
)
def test_a_malformed_commits_value_without_kind_header_is_an_event_stream_error(value: bytes) -> None:
    """Records are untrusted input: a broken one is refused with where it is, never a traceback."""
    with pytest.raises(EventStreamError, match="offset=5"):
        decode_commits_record(value, topic="t.commits", offset=5)


@pytest.mark.parametrize("value", [b"[1, 2]", b'"commit"', b"42", b"null"])
def test_a_commits_value_that_is_not_an_object_is_an_error_not_a_skipped_kind(value: bytes) -> None:
    """Only records of an unknown ``kind`` may be ignored; a value that is no record at all is broken."""
    with pytest.raises(EventStreamError, match="offset=6"):
        decode_commits_record(value, topic="t.commits", offset=6)


# --- progress records -----------------------------------------------------------------------------


def test_the_documented_progress_record_decodes_to_its_fields() -> None:
    value = _example("progress")
    record = decode_progress(value, topic="deltamirror.progress")
    assert isinstance(record, ProgressRecord)
    assert _as_json(record) == json.loads(value)
    data = json.loads(value)
    # "The version is complete when index + 1 == count."
    assert record.complete == (data["index"] + 1 == data["count"])


def test_a_progress_record_with_nothing_published_of_its_version() -> None:
    data = {**json.loads(_example("progress")), "index": -1, "count": 3}
    record = decode_progress(json.dumps(data))
    assert record.index == -1 and not record.complete


@pytest.mark.parametrize(
    ("change", "field"),
    [({"index": -2}, "index"), ({"version": -1}, "version"), ({"snapshot": "maybe"}, "snapshot")],
)
def test_a_bad_progress_record_is_an_error_naming_the_field_and_where(
    change: dict[str, Any], field: str
) -> None:
    data = {**json.loads(_example("progress")), **change}
    with pytest.raises(EventStreamError) as err:
        decode_progress(json.dumps(data), topic="deltamirror.progress", offset=12)
    text = str(err.value)
    assert field in text and "topic=deltamirror.progress" in text and "offset=12" in text


@pytest.mark.parametrize("value", [b"", b"{}", b"[]", b"\xff", b"[" * 100_000 + b"]" * 100_000])
def test_a_value_that_is_no_progress_record_is_an_event_stream_error(value: bytes) -> None:
    with pytest.raises(EventStreamError, match="topic=p"):
        decode_progress(value, topic="p")
