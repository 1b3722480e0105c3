"""The wire format: encoder output == the pydantic contract == the committed JSON Schema."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from deltamirror.cli.main import main
from deltamirror.core import events
from deltamirror.core.errors import LogGapError
from deltamirror.core.log import read_commit
from deltamirror.core.table import open_table
from deltamirror.producer.service import iter_event_values
from support.tables import TABLES, table_cases

ROOT = Path(__file__).resolve().parents[2]
SCHEMA_FILE = ROOT / "schemas" / "event.schema.json"

VALIDATOR = jsonschema.Draft202012Validator(events.json_schema())

# tables whose whole log is readable and whose features deltamirror supports
READABLE = [
    c.id
    for c in table_cases()
    if not c.must_fail
    and c.id
    not in {
        "drs__err_table_b",
        "drs__err_table_c",
        "drs__err_table_g",
        "golden__data-reader-absolute-paths-escaped-chars",
        "kj__spark-shredded-variant-preview-delta",
        "krs__table-with-geo",
        "spark__variant-stats-nested-no-checkpoint",
        "krs__crc-malformed",
        "drs__err_table_d",
        "kj__bench-basic_catalog_managed",
        "kj__catalog-owned-preview",
        "krs__catalog_managed_0",
    }
]


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


@pytest.mark.parametrize("table_id", READABLE)
def test_events_of_every_real_table_follow_the_contract(table_id: str) -> None:
    """Every action of every version: schema-valid, in log order, with core's resolved timestamps."""
    path = TABLES / table_id
    values = list(iter_event_values(str(path)))
    table = open_table(str(path))
    expected_ts = {t.version: t for t in table.commit_timestamps()}
    by_version: dict[int, list[dict[str, Any]]] = {}
    for value in values:
        event = json.loads(value)
        VALIDATOR.validate(event)
        by_version.setdefault(event["version"], []).append(event)
    assert sorted(by_version) == sorted(
        v for v in table.listing(0).commits if v >= min(by_version, default=0)
    )
    for version, evs in by_version.items():
        log_actions = read_commit(table.storage, version)
        assert [e["index"] for e in evs] == list(range(len(log_actions)))
        assert all(e["count"] == len(log_actions) for e in evs)
        assert [{e["type"]: e["action"]} for e in evs] == log_actions
        ts = expected_ts[version]
        assert {(e["commitTimestamp"], e["commitTimestampSource"]) for e in evs} == {
            (ts.timestamp, str(ts.source))
        }
        assert {e["tableUri"] for e in evs} == {table.uri}


def test_events_refuse_a_gap_in_the_log_instead_of_skipping_it() -> None:
    with pytest.raises(LogGapError) as info:
        list(iter_event_values(str(TABLES / "drs__err_table_b")))
    assert info.value.version == 7


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
