"""Typed actions: every action line of every real table round-trips exactly, unknowns are kept."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from deltamirror.core import errors
from deltamirror.core.models import (
    AddFile,
    CommitInfo,
    Metadata,
    UnknownAction,
    parse_action,
    wrap,
)
from support.tables import TABLES

COMMIT = re.compile(r"\d{20}\.json")


def _log_lines() -> list[tuple[str, int, str]]:
    out = []
    for f in sorted(TABLES.glob("*/_delta_log/*.json")):
        if not COMMIT.fullmatch(f.name):
            continue
        for i, line in enumerate(f.read_text().splitlines(), start=1):
            if line.strip():
                out.append((f"{f.parent.parent.name}/{f.name}", i, line))
    return out


LINES = _log_lines()


def test_there_are_many_real_lines() -> None:
    assert len(LINES) > 1000


def test_every_real_action_round_trips_exactly() -> None:
    failures = []
    for where, lineno, line in LINES:
        obj = json.loads(line)
        for key, value in obj.items():  # a few newer lines hold two actions
            wrapped = {key: value}
            action = parse_action(wrapped)
            if wrap(action) != wrapped:
                failures.append(f"{where}:{lineno} {key}")
    assert not failures, failures[:10]


def test_unknown_fields_and_actions_are_kept() -> None:
    add = parse_action(
        {
            "add": {
                "path": "a",
                "partitionValues": {},
                "size": 1,
                "modificationTime": 2,
                "dataChange": True,
                "newField": {"x": 1},
            }
        }
    )
    assert isinstance(add, AddFile)
    assert add.to_dict()["newField"] == {"x": 1}
    unknown = parse_action({"someFutureAction": {"a": 1}})
    assert isinstance(unknown, UnknownAction)
    assert unknown.action_name == "someFutureAction"
    assert wrap(unknown) == {"someFutureAction": {"a": 1}}


def test_models_are_frozen_and_snake_case() -> None:
    info = parse_action({"commitInfo": {"timestamp": 5, "inCommitTimestamp": 7, "operation": "WRITE"}})
    assert isinstance(info, CommitInfo)
    assert info.in_commit_timestamp == 7
    with pytest.raises(ValidationError):
        info.operation = "DELETE"  # type: ignore[misc]


def test_metadata_schema_is_typed() -> None:
    line = next(line for _, _, line in LINES if '"metaData"' in line and "schemaString" in line)
    meta = parse_action(json.loads(line))
    assert isinstance(meta, Metadata)
    assert meta.table_schema.fields


def test_invalid_action_names_the_field() -> None:
    with pytest.raises(errors.CorruptLogError) as info:
        parse_action({"add": {"path": "a", "partitionValues": {}}}, file="00.json", line=3, table="t")
    assert info.value.message == "add.size: required field missing" and info.value.line == 3
    with pytest.raises(errors.CorruptLogError) as info:  # the same checks as a log line gets
        parse_action({"protocol": {"minReaderVersion": True, "minWriterVersion": 2}})
    assert info.value.message == "protocol.minReaderVersion: expected a positive 32-bit integer"
    with pytest.raises(errors.CorruptLogError):
        parse_action({"add": {}, "remove": {}})


def test_partition_keys_follow_column_mapping() -> None:
    schema = {
        "type": "struct",
        "fields": [
            {
                "name": "p",
                "type": "string",
                "nullable": True,
                "metadata": {"delta.columnMapping.physicalName": "col-1"},
            },
            {"name": "v", "type": "long", "nullable": True, "metadata": {}},
        ],
    }
    meta = parse_action(
        {
            "metaData": {
                "id": "x",
                "schemaString": json.dumps(schema),
                "format": {"provider": "parquet"},
                "partitionColumns": ["p"],
                "configuration": {"delta.columnMapping.mode": "name"},
            }
        }
    )
    assert isinstance(meta, Metadata) and meta.partition_keys == (("col-1", "p"),)
    plain = parse_action(
        {
            "metaData": {
                "id": "x",
                "format": {"provider": "parquet"},
                "schemaString": json.dumps(schema),
                "partitionColumns": ["p"],
                "configuration": {},
            }
        }
    )
    assert isinstance(plain, Metadata) and plain.partition_keys == (("p", "p"),)


def test_deletion_vector_unique_id() -> None:
    add = parse_action(
        {
            "add": {
                "path": "a",
                "partitionValues": {},
                "size": 1,
                "modificationTime": 2,
                "dataChange": True,
                "deletionVector": {
                    "storageType": "u",
                    "pathOrInlineDv": "ab",
                    "offset": 4,
                    "sizeInBytes": 9,
                    "cardinality": 2,
                },
            }
        }
    )
    assert isinstance(add, AddFile) and add.deletion_vector is not None
    assert add.deletion_vector.unique_id == "uab@4"


def test_tables_dir_exists() -> None:
    assert Path(TABLES).is_dir()


def test_unknown_action_in_a_commit_is_reported(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from deltamirror.core.table import open_table
    from support.tables import copy_table

    path = copy_table("spark__transaction_log_schema_evolvability", tmp_path)
    snap = open_table(str(path)).snapshot()
    # versions 4 and 5 (after the checkpoint at 2) carry action types no Delta version defines
    assert snap.unknown_actions == {"some_new_action": 1, "some_new_action_alongside_add_action": 3}
    assert any("unknown action type" in r.getMessage() for r in caplog.records)
