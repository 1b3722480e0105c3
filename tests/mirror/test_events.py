"""The wire format: encoder output == the pydantic contract == the committed JSON Schema."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from deltamirror.cli.main import main
from deltamirror.mirror.records import events

ROOT = Path(__file__).resolve().parents[2]
SCHEMA_FILE = ROOT / "schemas" / "event.schema.json"

VALIDATOR = jsonschema.Draft202012Validator(events.json_schema())


def test_committed_schema_is_the_generated_one() -> None:
    assert SCHEMA_FILE.read_text() == events.json_schema_text(), (
        "schemas/event.schema.json is stale: run `deltamirror schema > schemas/event.schema.json`"
    )


def test_schema_command_prints_the_committed_schema(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schema"]) == 0
    assert capsys.readouterr().out == SCHEMA_FILE.read_text()


def test_the_schema_is_valid_draft_2020_12() -> None:
    jsonschema.Draft202012Validator.check_schema(events.json_schema())


def _encoder(**over: Any) -> events.EnvelopeEncoder:
    """An encoder for version 7 of table t-1 (3 actions), with ``over`` changed."""
    fields: dict[str, Any] = {
        "table_id": "t-1",
        "table_uri": "file:///x",
        "version": 7,
        "commit_timestamp": 1_700_000_000_123,
        "commit_timestamp_source": "adjusted-file-time",
        "count": 3,
    }
    return events.EnvelopeEncoder(**{**fields, **over})


def _envelope(**over: Any) -> dict[str, Any]:
    enc = _encoder(snapshot=over.pop("snapshot", False))
    value = enc.encode(
        over.pop("index", 1), over.pop("type", "add"), over.pop("body", {"path": "a", "size": 1})
    )
    return json.loads(value)


def test_encoder_output_round_trips_through_the_model() -> None:
    enc = _encoder(commit_timestamp_source="ict", count=2)
    raw_body = b'{"path":"p%20q.parquet","partitionValues":{"d":null},"size":10,"modificationTime":1,"dataChange":true}'
    values = enc.encode_many(0, [("add", raw_body), ("commitInfo", {"operation": "WRITE", "n": 1.5})])
    first = events.ActionEvent.model_validate_json(values[0])
    assert first.schema_version == events.SCHEMA_VERSION
    assert (first.table_id, first.version, first.index, first.count, first.type) == ("t-1", 7, 0, 2, "add")
    assert first.commit_timestamp == 1_700_000_000_123 and first.commit_timestamp_source == "ict"
    assert first.snapshot is False and first.snapshot_end is None
    assert first.action == json.loads(raw_body)
    # the action bytes are the log's own text, untouched
    assert raw_body in values[0]
    # model -> JSON -> model is the identity, and equals what the encoder wrote
    for value in values:
        model = events.ActionEvent.model_validate_json(value)
        assert events.ActionEvent.model_validate_json(model.to_json_bytes()) == model
        assert json.loads(model.to_json_bytes()) == json.loads(value)
        VALIDATOR.validate(json.loads(value))


@pytest.mark.parametrize("start", [0, 4094, 10_000])
def test_encoding_in_bulk_gives_the_bytes_of_one_by_one(start: int) -> None:
    enc = _encoder(
        table_id="t", version=3, commit_timestamp=5, commit_timestamp_source="ict", count=start + 3
    )
    actions: list[tuple[str, bytes | dict[str, object]]] = [
        ("add", b'{"path":"a"}'),
        ("newActionType", {"x": [1, None]}),
        ("remove", b"{}"),
    ]
    assert enc.encode_many(start, actions) == [
        enc.encode(start + i, t, b) for i, (t, b) in enumerate(actions)
    ]


def test_snapshot_events_mark_the_last_one() -> None:
    enc = _encoder(
        table_id="t", version=3, commit_timestamp=5, commit_timestamp_source="file-time", snapshot=True
    )
    decoded = [json.loads(v) for v in enc.encode_many(0, [("protocol", {}), ("metaData", {}), ("add", {})])]
    assert [d["snapshotEnd"] for d in decoded] == [False, False, True]
    assert all(d["snapshot"] is True for d in decoded)


def test_the_schema_rejects_what_the_contract_forbids() -> None:
    good = _envelope(body={"path": "a", "size": 1, "modificationTime": 2, "dataChange": True})
    VALIDATOR.validate(good)
    for broken in (
        {**good, "version": -1},
        {**good, "commitTimestampSource": "guess"},
        {k: v for k, v in good.items() if k != "tableId"},
        {**good, "action": {"size": 1}},  # an add without a path
    ):
        with pytest.raises(jsonschema.ValidationError):
            VALIDATOR.validate(broken)
    # consumers must ignore unknown fields: a newer producer may add some
    VALIDATOR.validate({**good, "someNewField": 1})
    assert events.ActionEvent.model_validate({**good, "someNewField": 1}).version == 7


def test_commit_summary_and_progress_models_validate_against_the_schema() -> None:
    defs = events.json_schema()["$defs"]
    summary = events.CommitSummary(
        schema_version=1,
        table_id="t",
        table_uri="file:///x",
        version=2,
        commit_timestamp=1,
        commit_timestamp_source="ict",
        snapshot=False,
        action_count=3,
        operation="WRITE",
        adds=1,
        removes=1,
        cdc_files=0,
        bytes_added=10,
        bytes_removed=5,
        partitions_touched=[{"d": "2026-01-01"}],
    )
    doc = {"$defs": defs, "$ref": "#/$defs/CommitsTopicRecord"}
    jsonschema.Draft202012Validator(doc).validate(json.loads(summary.to_json_bytes()))
    assert events.parse_commits_record(summary.to_json_bytes()) == summary
    progress = events.ProgressRecord(
        schema_version=1,
        table_uri="file:///x",
        table_id="t",
        version=4,
        index=1,
        count=3,
        snapshot=False,
        commit_timestamp=9,
        commit_timestamp_source="file-time",
    )
    assert not progress.complete
    jsonschema.Draft202012Validator({"$defs": defs, "$ref": "#/$defs/ProgressRecord"}).validate(
        json.loads(progress.to_json_bytes())
    )
