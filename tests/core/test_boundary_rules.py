"""Every rule of the log boundary, with the PROTOCOL.md sentence it enforces and the writers' logs
it must accept.

The rules are read from the boundary's own definitions (core/action_rules.py): each field an action
requires is listed here with the line of PROTOCOL.md's action table that requires it. A rule added
there without a justification here fails :func:`test_every_required_field_is_justified`; a field
the protocol makes optional is accepted absent (:func:`test_a_field_the_protocol_makes_optional_may_be_absent`),
and every corpus table (delta-spark, delta-rs) passes every rule (tests/core/test_writers_corpus.py
reads them all; here, each rule names a table whose log holds that action).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from deltamirror.core import action_rules
from deltamirror.core.actions import read_actions
from support.corpus import CORPUS, corpus_tables

#: (action, field) -> (the PROTOCOL.md row that requires it, a corpus table whose log has the action)
REQUIRED: dict[tuple[str, str], tuple[str, str]] = {
    ("add", "path"): ("path| String | A relative path to a data file ... | required", "spark__dml"),
    ("add", "partitionValues"): (
        "partitionValues| Map[String, String] | A map from partition column to value for this logical file. | required"
        " (a map; a key per column is not required: a missing one reads as null, as delta-spark reads it)",
        "spark__null_partitions",
    ),
    ("add", "size"): ("size| Long | The size of this data file in bytes | required", "spark__dml"),
    ("add", "modificationTime"): (
        "modificationTime | Long | The time this logical file was created, as milliseconds since the epoch | required",
        "delta-rs__dml",
    ),
    ("add", "dataChange"): (
        "dataChange | Boolean | When `false` the logical file must already be present ... | required",
        "spark__dml",
    ),
    ("remove", "path"): (
        "path| String | A relative path to a file from the root of the table ... | required",
        "spark__null_partitions",
    ),
    ("remove", "dataChange"): (
        "dataChange | Boolean | When `false` the records in the removed file must be contained in one or more `add` file actions | required",
        "delta-rs__null_partitions",
    ),
    ("cdc", "path"): (
        "Add CDC File: path| String | A relative path to a change data file",
        "spark__null_partitions",
    ),
    ("cdc", "partitionValues"): (
        "Add CDC File: partitionValues| Map[String, String] | A map from partition column to value for this file.",
        "spark__partition_types",
    ),
    ("cdc", "size"): ("Add CDC File: size| Long | The size of this file in bytes", "spark__dml"),
    ("cdc", "dataChange"): (
        "Add CDC File: dataChange | Boolean | Should always be set to `false` for `cdc` actions",
        "delta-rs__dml",
    ),
    ("metaData", "id"): ("id|`GUID`|Unique identifier for this table | required", "spark__replace"),
    ("metaData", "format"): (
        "format|[Format Struct]| Specification of the encoding for the files stored in the table | required",
        "spark__replace",
    ),
    ("metaData", "partitionColumns"): (
        "partitionColumns|`Array[String]`| An array containing the names of columns by which the data should be partitioned | required",
        "spark__replace",
    ),
    ("metaData", "configuration"): (
        "configuration|`Map[String, String]`| A map containing configuration options for the metadata action | required",
        "delta-rs__column_mapping",
    ),
    ("protocol", "minReaderVersion"): (
        "minReaderVersion | Int | The minimum version of the Delta read protocol ... | required",
        "spark__dv_row_tracking",
    ),
    ("protocol", "minWriterVersion"): (
        "minWriterVersion | Int | The minimum version of the Delta write protocol ... | required",
        "spark__dv_row_tracking",
    ),
    ("txn", "appId"): (
        "appId | String | A unique identifier for the application performing the transaction | required",
        "",
    ),
    ("txn", "version"): (
        "version | Long | An application-specific numeric identifier for this transaction | required",
        "",
    ),
    ("domainMetadata", "domain"): (
        "domain | String | Identifier for this domain (system- or user-provided)",
        "spark__dv_row_tracking",
    ),
    ("domainMetadata", "configuration"): (
        "configuration | String | String containing configuration for the metadata domain",
        "spark__dv_row_tracking",
    ),
    ("domainMetadata", "removed"): (
        "removed | Boolean | When `true`, the action serves as a tombstone",
        "spark__dv_row_tracking",
    ),
    ("checkpointMetadata", "version"): (
        "checkpointMetadata: version | Long | The checkpoint version. | required",
        "spark__v2_sidecars",
    ),
    ("sidecar", "path"): (
        "sidecar: path | String | URI-encoded path to the sidecar file. | required",
        "spark__v2_sidecars",
    ),
    ("sidecar", "sizeInBytes"): (
        "sizeInBytes | Long | Size of the sidecar file. | required",
        "spark__v2_sidecars",
    ),
    ("sidecar", "modificationTime"): (
        "modificationTime | Long | The time this logical file was created, as milliseconds since the epoch. | required",
        "spark__v2_sidecars",
    ),
}

#: fields the protocol makes optional for one action and required for another: absent is accepted
OPTIONAL_HERE = {
    (
        "remove",
        "partitionValues",
    ): "partitionValues| Map[String, String] | A map from partition column to value for this file. | optional",
    ("remove", "size"): "size| Long | The size of this data file in bytes | optional",
    (
        "remove",
        "deletionTimestamp",
    ): "deletionTimestamp | Option[Long] | The time the deletion occurred | optional",
    (
        "metaData",
        "schemaString",
    ): "schemaString ... | required (left out by a real Delta Live Tables setup commit: log-level readers accept it, readers of state refuse it)",
    ("txn", "lastUpdated"): "lastUpdated | Option[Long] | ... | optional",
}


def _required_fields() -> set[tuple[str, str]]:
    out = set()
    for name, schema in action_rules._action_schemas().items():
        fields = (schema if schema["type"] == "typed-dict" else schema["schema"])["fields"]  # type: ignore[typeddict-item]
        out |= {(name, f) for f, spec in fields.items() if spec["required"]}
    return out


def test_every_required_field_is_justified() -> None:
    assert _required_fields() == set(REQUIRED)


def _corpus_actions(table: str) -> dict[str, list[dict[str, Any]]]:
    found: dict[str, list[dict[str, Any]]] = {}
    log = CORPUS / "tables" / table / "_delta_log"
    for path in sorted(log.glob("*.json")):
        for run in read_actions(path.read_bytes(), table=table, file=path.name):
            found.setdefault(run.name, []).extend(run.values)
    return found


@pytest.mark.parametrize("rule", sorted(k for k, v in REQUIRED.items() if v[1]), ids=lambda r: ".".join(r))
def test_a_writers_log_holds_each_required_field(rule: tuple[str, str]) -> None:
    action, name = rule
    table = REQUIRED[rule][1]
    values = _corpus_actions(table).get(action)
    if action in ("checkpointMetadata", "sidecar"):  # in its V2 checkpoint, not its commits
        assert any((CORPUS / "tables" / table / "_delta_log" / "_sidecars").iterdir())
        return
    assert values, f"{table} has no {action}"
    assert all(name in v for v in values)


@pytest.mark.parametrize("rule", sorted(OPTIONAL_HERE), ids=lambda r: ".".join(r))
def test_a_field_the_protocol_makes_optional_may_be_absent(rule: tuple[str, str]) -> None:
    action, name = rule
    body = {
        "remove": {
            "path": "a.parquet",
            "dataChange": True,
            "partitionValues": {},
            "size": 1,
            "deletionTimestamp": 1,
        },
        "metaData": {
            "id": "x",
            "format": {"provider": "parquet"},
            "partitionColumns": [],
            "configuration": {},
        },
        "txn": {"appId": "a", "version": 1, "lastUpdated": 1},
    }[action]
    body = {k: v for k, v in body.items() if k != name}
    action_rules.validator_for(action).validate_json(json.dumps(body))


def test_every_corpus_log_passes_every_rule() -> None:
    for table in corpus_tables():
        assert _corpus_actions(table.id)  # read_actions refuses any line a rule refuses
