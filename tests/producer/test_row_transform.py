"""Row filters, column projection and masks of row events, without a broker: the records of every
unit, unpaired back into rows, are core's change feed (which equals delta-spark's) with the same
filter, projection and masks applied here by plain Python; an update that crosses a filter is a
delete or a create; a setting that cannot apply to the table stops it naming the setting."""

from __future__ import annotations

import hashlib
import hmac
import json
from datetime import date
from typing import Any

import pytest
from pydantic import ValidationError

from deltamirror.core.errors import ConfigError
from deltamirror.producer.settings import RowChangesConfig
from support.row_events import expected_rows as _expected
from support.row_events import records as _records
from support.row_events import unpaired as _unpaired
from support.spark_scenarios import normalize_cdf_rows
from support.tables import TABLES

KEY = "a key of sixteen chars or more"
_OPS = {
    "=": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
}


def _holds(row: dict[str, Any], predicate: dict[str, Any]) -> bool:
    value, op, literal = row[predicate["column"]], predicate["op"], predicate.get("value")
    if op == "is null":
        return value is None
    if op == "is not null":
        return value is not None
    if value is None:
        return False
    if op in ("in", "not in"):
        return (value in literal) == (op == "in")
    if isinstance(literal, str) and isinstance(value, int) and predicate["column"] == "birthday":
        literal = date.fromisoformat(literal).toordinal() - 719163  # the rows carry days since the epoch
    return bool(_OPS[op](value, literal))


def _digest(value: Any) -> str | None:
    if value is None:
        return None
    text = value if isinstance(value, str) else str(value)
    return hmac.new(KEY.encode(), text.encode(), hashlib.sha256).hexdigest()


def _oracle(table_id: str, config: dict[str, Any]) -> list[dict[str, Any]]:
    """Core's change feed, filtered per image, unpaired where one image of an update left, then
    projected and masked: what the events must carry."""
    rows = _expected(table_id, 0, paired=bool(config.get("key_columns")))
    kept = [r for r in rows if all(_holds(r, p) for p in config.get("where", []))]
    key = config.get("key_columns", [])
    images: dict[tuple[Any, ...], set[str]] = {}
    for r in kept:
        if r["_change_type"].startswith("update"):
            images.setdefault((r["_commit_version"], *(r[k] for k in key)), set()).add(r["_change_type"])
    for r in kept:
        if (
            r["_change_type"].startswith("update")
            and len(images[(r["_commit_version"], *(r[k] for k in key))]) == 1
        ):
            r["_change_type"] = "delete" if r["_change_type"] == "update_preimage" else "insert"
    columns = config.get("columns")
    mask = config.get("mask", {})
    out = []
    for r in kept:
        row = {}
        for name, value in r.items():
            if name.startswith("_"):
                row[name] = value
            elif (columns is None or name in columns) and mask.get(name) != "drop":
                row[name] = _digest(_text(name, value)) if mask.get(name) == "hmac" else value
        out.append(row)
    return normalize_cdf_rows(out)


def _text(name: str, value: Any) -> Any:
    """A value as Arrow's cast to text writes it (dates as ISO-8601, not the days the rows carry)."""
    if name == "birthday" and isinstance(value, int):
        return date.fromordinal(value + 719163).isoformat()
    return value


CASES = [
    (
        "krs__cdf-table",
        {"key_columns": ["id"], "where": [{"column": "birthday", "op": ">=", "value": "2023-12-23"}]},
    ),
    (
        "krs__cdf-table",
        {"key_columns": ["id"], "where": [{"column": "birthday", "op": "<", "value": "2023-12-23"}]},
    ),
    (
        "krs__cdf-table",
        {"where": [{"column": "name", "op": "in", "value": ["Bob", "Dave"]}], "columns": ["id", "name"]},
    ),
    (
        "gen__long-log-cdf",
        {
            "key_columns": ["id", "part"],
            "where": [{"column": "part", "op": "!=", "value": "a"}, {"column": "n", "op": ">", "value": 2}],
            "mask": {"val": "hmac"},
            "mask_key": KEY,
        },
    ),
    (
        "gen__long-log-cdf",
        {
            "key_columns": ["id"],
            "columns": ["id", "part", "val"],
            "mask": {"part": "drop", "val": "hmac"},
            "mask_key": KEY,
        },
    ),
    (
        "krs__cdf-table",
        {
            "key_columns": ["id"],
            "mask": {"birthday": "hmac"},
            "mask_key": KEY,
            "where": [
                {"column": "name", "op": "is not null"},
                {"column": "id", "op": "not in", "value": [1, 2]},
            ],
        },
    ),
]


@pytest.mark.parametrize(("table_id", "config"), CASES, ids=[f"{t}-{i}" for i, (t, _) in enumerate(CASES)])
def test_events_carry_the_filtered_projected_masked_change_feed(
    table_id: str, config: dict[str, Any]
) -> None:
    records = _records(table_id, 0, RowChangesConfig(**config))
    got = normalize_cdf_rows(_unpaired(records))
    expected = _oracle(table_id, config)
    assert expected and got == expected
    unfiltered = _expected(table_id, 0, paired=True)
    if config.get("where"):
        assert len(expected) < len(unfiltered)  # the filter took rows out: the case tests something


def test_an_update_that_leaves_the_filter_is_a_delete_and_one_that_enters_it_a_create() -> None:
    def ops(op: str) -> dict[int, str]:
        where = [{"column": "birthday", "op": op, "value": "2023-12-23"}]
        records = _records("krs__cdf-table", 0, RowChangesConfig(key_columns=["id"], where=where))
        events = [json.loads(r.value) for r in records if r.value and r.topic.endswith(".changes")]
        return {
            e["before"]["id"] if e["before"] else e["after"]["id"]: e["op"]
            for e in events
            if e["source"]["delta_version"] == 1
        }

    # version 1 moves the birthdays of ids 2, 3 and 4 from 2023-12-23 to 2023-12-22
    assert ops(">=") == {2: "d", 3: "d", 4: "d"}
    assert ops("<") == {2: "c", 3: "c", 4: "c"}


def test_an_hmac_is_keyed_equal_values_stay_equal_and_nulls_stay_null() -> None:
    def names(key: str) -> list[str | None]:
        config = RowChangesConfig(key_columns=["id"], mask={"name": "hmac"}, mask_key=key)
        records = _records("krs__cdf-table", 0, config)
        return [
            (e["after"] or e["before"])["name"]
            for e in (json.loads(r.value) for r in records if r.value and r.topic.endswith(".changes"))
        ]

    one, other = names(KEY), names(KEY + "!")
    assert len(one) == len(other) and all(a != b for a, b in zip(one, other, strict=True))
    assert "Bob" not in one and hashlib.sha256(b"Bob").hexdigest() not in one  # no plain hash either
    assert len(set(one)) < len(one)  # the same name twice, the same digest twice


@pytest.mark.parametrize(
    ("config", "said"),
    [
        ({"columns": ["id", "nope"]}, "row_changes.columns names 'nope'"),
        ({"mask": {"nope": "drop"}}, "row_changes.mask names 'nope'"),
        ({"where": [{"column": "nope", "op": "=", "value": 1}]}, "row_changes.where names 'nope'"),
        (
            {"where": [{"column": "id", "op": "=", "value": "not a number"}]},
            "row_changes.where: 'not a number'",
        ),
        (
            {"where": [{"column": "birthday", "op": ">", "value": "yesterday"}]},
            "row_changes.where: 'yesterday'",
        ),
    ],
)
def test_a_setting_the_table_cannot_take_stops_it_naming_the_setting(
    config: dict[str, Any], said: str
) -> None:
    with pytest.raises(ConfigError, match=said.replace(".", r"\.")):
        _records("krs__cdf-table", 0, RowChangesConfig(**config))


@pytest.mark.parametrize(
    ("config", "said"),
    [
        ({"mask": {"name": "hmac"}}, "mask_key is required"),
        ({"mask": {"name": "drop"}, "mask_key": KEY}, "no column has an hmac mask"),
        ({"mask": {"name": "hmac"}, "mask_key": "short"}, "at least 16 characters"),
        ({"key_columns": ["id"], "columns": ["name"]}, "key column 'id' is not among columns"),
        ({"key_columns": ["id"], "mask": {"id": "drop"}}, "key column 'id' has the mask drop"),
        ({"where": [{"column": "id", "op": "in", "value": 3}]}, "takes a non-empty list"),
        ({"where": [{"column": "id", "op": "is null", "value": 3}]}, "takes no value"),
        ({"where": [{"column": "id", "op": "=", "value": None}]}, "use 'is null'"),
        ({"where": [{"column": "id", "op": "~", "value": 1}]}, "op"),
        ({"mask": {"name": "blur"}}, "mask"),
    ],
)
def test_settings_that_contradict_themselves_are_refused_when_read(config: dict[str, Any], said: str) -> None:
    with pytest.raises(ValidationError, match=said):
        RowChangesConfig(**config)


def test_the_mask_key_is_a_secret_never_shown() -> None:
    from deltamirror.producer.config_file import redacted
    from deltamirror.producer.settings import WatchConfig, merge_overrides

    row_changes = {"mask": {"name": "hmac"}, "mask_key": KEY}
    cfg = WatchConfig.model_validate(
        {
            "kafka": {"bootstrap_servers": "127.0.0.1:9"},
            "tables": [{"uri": "/tmp/t", "row_changes": row_changes}],
        }
    )
    merged = merge_overrides(cfg, {"row_changes": True})  # flags over a file keep the secret
    assert merged.tables[0].row_changes is not None and merged.tables[0].row_changes.mask_key is not None
    assert merged.tables[0].row_changes.mask_key.get_secret_value() == KEY
    for shown in (repr(merged), str(merged.model_dump()), str(redacted(merged))):
        assert KEY not in shown


def test_a_version_whose_actions_are_all_data_change_false_publishes_no_row_event() -> None:
    """OPTIMIZE rewrites files without changing a row (dataChange false on every add and remove):
    the change feed has no rows for it, so no event and no BEGIN/END goes out for that version."""
    log = TABLES / "krs__cdf-table-data-change" / "_delta_log" / "00000000000000000001.json"
    actions = [json.loads(line) for line in log.read_text().splitlines()]
    files = [a.get("add") or a.get("remove") for a in actions if "add" in a or "remove" in a]
    assert files and not any(f["dataChange"] for f in files)  # the premise: an OPTIMIZE
    records = _records("krs__cdf-table-data-change", 0, RowChangesConfig(key_columns=["id"]))
    versions = {
        json.loads(r.value)["source"]["delta_version"]
        for r in records
        if r.value and r.topic.endswith(".changes")
    }
    assert 0 in versions and 1 not in versions
    assert all(
        json.loads(r.value)["id"].split(":")[1] != "1" for r in records if r.topic.endswith(".transaction")
    )
