"""The Spark DDL strings: complete for the records they describe, quoted, and typed as the wire values.

Whether Spark parses them is checked with Spark in tests/consumer/spark/test_spark_kafka_recipe.py.
"""

from __future__ import annotations

import json

import pytest

from deltamirror.mirror.records import events
from deltamirror.mirror.records.spark_ddl import (
    ACTIONS_DDL,
    COMMITS_DDL,
    TRANSACTION_DDL,
    quote,
    row_changes_ddl,
    row_changes_key_ddl,
)


def top_level_names(ddl: str) -> set[str]:
    """Field names at depth 0 of a DDL (nested STRUCT<...> / MAP<...> skipped)."""
    names, depth, field = set(), 0, ""
    for ch in ddl + ",":
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        if ch == "," and depth == 0:
            names.add(field.strip().split(" ", 1)[0].strip("`"))
            field = ""
        else:
            field += ch
    return names


def wire_names(model: type[events._Record]) -> set[str]:
    return {f.alias or name for name, f in model.model_fields.items()}


def test_actions_ddl_names_every_field_of_an_action_event() -> None:
    assert top_level_names(ACTIONS_DDL) == wire_names(events.ActionEvent)


def test_commits_ddl_names_every_field_of_every_kind() -> None:
    kinds = (events.CommitSummary, events.Heartbeat, events.TableReplaced, events.TableDropped)
    assert top_level_names(COMMITS_DDL) == set().union(*map(wire_names, kinds))


def test_transaction_ddl() -> None:
    assert top_level_names(TRANSACTION_DDL) == {"status", "id", "event_count", "data_collections", "ts_ms"}


def _schema(*fields: tuple[str, object]) -> str:
    return json.dumps(
        {
            "type": "struct",
            "fields": [{"name": n, "type": t, "nullable": True, "metadata": {}} for n, t in fields],
        }
    )


SCHEMA = _schema(
    ("id", "long"),
    ("a`b", "decimal(10,2)"),
    ("d", "date"),
    ("ts", "timestamp"),
    ("st", {"type": "struct", "fields": [{"name": "x", "type": "short", "nullable": True, "metadata": {}}]}),
    ("mi", {"type": "map", "keyType": "integer", "valueType": "string", "valueContainsNull": True}),
    ("ms", {"type": "map", "keyType": "string", "valueType": "binary", "valueContainsNull": True}),
    ("l", {"type": "array", "elementType": "float", "containsNull": True}),
)
IMAGE = (
    "STRUCT<`id`: BIGINT, `a``b`: DECIMAL(10,2), `d`: INT, `ts`: BIGINT, `st`: STRUCT<`x`: SMALLINT>, "
    "`mi`: ARRAY<ARRAY<STRING>>, `ms`: MAP<STRING, BINARY>, `l`: ARRAY<FLOAT>>"
)
SOURCE = (
    "STRUCT<version: STRING, connector: STRING, name: STRING, ts_ms: BIGINT, snapshot: STRING, db: STRING, "
    "`table`: STRING, table_id: STRING, delta_version: BIGINT, `index`: BIGINT>"
)
TXN = "STRUCT<id: STRING, total_order: BIGINT, data_collection_order: BIGINT>"


def test_row_changes_ddl_plain_json() -> None:
    assert row_changes_ddl(SCHEMA) == (
        f"before {IMAGE}, after {IMAGE}, op STRING, ts_ms BIGINT, source {SOURCE}, transaction {TXN}"
    )


def test_row_changes_ddl_with_inline_schema_reads_the_payload() -> None:
    image = IMAGE.replace("DECIMAL(10,2)", "BINARY")
    assert row_changes_ddl(SCHEMA, fmt="json-schema") == (
        f"payload STRUCT<before: {image}, after: {image}, op: STRING, ts_ms: BIGINT, source: {SOURCE}, "
        f"transaction: {TXN}>"
    )


def test_row_changes_key_ddl() -> None:
    assert row_changes_key_ddl(SCHEMA, ["id", "d"]) == "`id` BIGINT, `d` INT"
    # a table with row tracking: keyed by the row id, unless key columns are configured
    assert row_changes_key_ddl(SCHEMA, row_tracking=True) == "`_row_id` BIGINT"
    assert row_changes_key_ddl(SCHEMA, ["id"], row_tracking=True) == "`id` BIGINT"
    assert row_changes_key_ddl(SCHEMA, ["id"], fmt="json-schema") == "payload STRUCT<`id`: BIGINT>"
    assert row_changes_key_ddl(SCHEMA) == (  # no key columns: the whole row
        "`id` BIGINT, `a``b` DECIMAL(10,2), `d` INT, `ts` BIGINT, `st` STRUCT<`x`: SMALLINT>, "
        "`mi` ARRAY<ARRAY<STRING>>, `ms` MAP<STRING, BINARY>, `l` ARRAY<FLOAT>"
    )


def test_quote() -> None:
    assert quote("a`b c") == "`a``b c`"


def test_a_type_without_a_spark_form_is_refused() -> None:
    with pytest.raises(ValueError, match="variant"):
        row_changes_ddl(_schema(("v", "variant")))
