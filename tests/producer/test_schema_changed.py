"""``schemaChanged`` records on the commits topic, for tables delta-spark changes: ADD COLUMN,
RENAME COLUMN and DROP COLUMN under column mapping, a type widened, and nothing for a property set;
each record after its version's summary, held to the consumers' boundary and the JSON Schema."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from deltamirror.core.table import open_table
from deltamirror.mirror.records import events
from deltamirror.mirror.records.events import SchemaChanged, decode_commits_record
from support.spark import spark  # noqa: F401
from support.spark_scenarios import CM_NAME, _create, _insert, _sql
from support.tables import TABLES
from support.watching import watch_until

pytestmark = [pytest.mark.kafka]


def _commits(kit: Any, bootstrap: str, actions: str) -> list[tuple[str, Any]]:
    """(kind header, decoded record) of every record on the commits topic, in order."""
    topic = actions.replace(".actions", ".commits")
    out = []
    for r in kit.consume(bootstrap, [topic], idle_s=0.5):
        kind = dict(r.headers or [])["kind"].decode()
        out.append(
            (kind, decode_commits_record(r.value, kind, topic=topic, partition=r.partition, offset=r.offset))
        )
    return out


def _schema_records(commits: list[tuple[str, Any]]) -> dict[int, SchemaChanged]:
    found = {rec.version: rec for kind, rec in commits if kind == "schemaChanged"}
    for i, (kind, rec) in enumerate(commits):  # right after the summary of its version
        if kind == "schemaChanged":
            assert commits[i - 1][0] == "commit" and commits[i - 1][1].version == rec.version
            assert commits[i - 1][1].metadata_changed
    return found


@pytest.mark.spark
@pytest.mark.timeout(300)
def test_delta_sparks_schema_changes_are_announced_and_classed(
    kafka_bootstrap: str,
    kit: Any,
    tmp_path: Path,
    spark: Any,  # noqa: F811
) -> None:
    path = str(tmp_path / "evolving")
    _create(spark, path, CM_NAME, "'delta.enableTypeWidening' = 'true'")
    _insert(spark, path, 0, 4)
    add = _sql(spark, path, "ALTER TABLE {t} ADD COLUMN extra STRING")
    rename = _sql(spark, path, "ALTER TABLE {t} RENAME COLUMN name TO full_name")
    drop = _sql(spark, path, "ALTER TABLE {t} DROP COLUMN extra")
    widen = _sql(spark, path, "ALTER TABLE {t} ALTER COLUMN amount TYPE DECIMAL(12,2)")
    prop = _sql(spark, path, "ALTER TABLE {t} SET TBLPROPERTIES ('team' = 'sales')")
    end = open_table(path).latest_version()
    prefix = kit.unique("schema")
    actions = f"{prefix}.actions"
    watch_until(kafka_bootstrap, path, actions, end, prefix, snapshot_mode="from-version")
    found = _schema_records(_commits(kit, kafka_bootstrap, actions))
    said = {
        v: (r.change_class, [(c.change, ".".join(c.column), c.before, c.after) for c in r.changes])
        for v, r in found.items()
    }
    assert said == {
        add: ("additive", [("add", "extra", None, "string")]),
        rename: ("rename", [("rename", "full_name", "name", "full_name")]),
        drop: ("drop", [("drop", "extra", None, None)]),
        widen: ("widening", [("widen", "amount", "decimal(10,2)", "decimal(12,2)")]),
    }
    assert prop not in found  # a property alone changes no schema
    record = found[rename]
    assert json.loads(record.table_schema) == json.loads(
        open_table(path).snapshot(rename).metadata.schema_string
    )
    assert json.loads(record.previous_schema) == json.loads(
        open_table(path).snapshot(add).metadata.schema_string
    )
    the_record = {"$ref": "#/$defs/SchemaChanged", "$defs": events.json_schema()["$defs"]}
    jsonschema.Draft202012Validator(the_record).validate(json.loads(record.to_json_bytes()))


@pytest.mark.timeout(180)
def test_a_real_writers_type_widening_is_announced_and_handed_on_by_consume_snapshot_and_invalidate(
    kafka_bootstrap: str, kit: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from deltamirror.cli.main import main

    path = TABLES / "krs__type-widening"
    prefix = kit.unique("handon")
    actions = f"{prefix}.actions"
    watch_until(kafka_bootstrap, path, actions, 2, prefix, snapshot_mode="from-version")
    found = _schema_records(_commits(kit, kafka_bootstrap, actions))
    assert set(found) == {2}
    assert found[2].change_class == "widening" and len(found[2].changes) == 13
    assert {c.change for c in found[2].changes} == {"widen"}
    commits = actions.replace(".actions", ".commits")
    lines = {}
    for fmt in ("counts", "jsonl"):
        argv = ["consume-snapshot", "--bootstrap-servers", kafka_bootstrap, "--topic", actions]
        argv += ["--commits-topic", commits, "--once", "--format", fmt, "--group-id", kit.unique(fmt)]
        capsys.readouterr()
        assert main(argv) == 0
        printed = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.strip()]
        lines[fmt] = [p for p in printed if p.get("kind") == "schemaChanged"]
    assert [(d["version"], d["changeClass"], d["changes"]) for d in lines["counts"]] == [(2, "widening", 13)]
    (document,) = lines["jsonl"]
    assert (document["version"], document["changeClass"], document["changesCount"]) == (2, "widening", 13)
    assert {
        "change": "widen",
        "changeClass": "widening",
        "column": ["int_long"],
        "before": "integer",
        "after": "long",
    } in document["changes"]
    assert not document["changesTruncated"] and document["tableUri"].endswith("krs__type-widening")


def test_the_schema_documents_delivery_id_and_description_name_table_and_version() -> None:
    from deltamirror.consumer.invalidate import delivery_id, describe

    payload = {"kind": "schemaChanged", "tableId": "t1", "version": 7}
    assert delivery_id(payload) == "t1:7:schema"  # never the version document's "t1:7"
    assert describe(payload) == "the schema change of table t1 at version 7"
