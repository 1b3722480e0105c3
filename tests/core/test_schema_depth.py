"""A schemaString is read as deep as delta-spark reads it: Jackson's default nesting limit (1,000
levels of JSON), no further, and a deeper one is refused in one line, never with a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from deltamirror.core.errors import SchemaError
from deltamirror.core.schema import to_arrow_schema
from deltamirror.core.schema_types import MAX_SCHEMA_JSON_DEPTH, json_depth, parse_schema
from support.tables import copy_table


def nested_schema(levels: int) -> str:
    """A schema with ``levels`` structs nested in one column (each adds three JSON levels)."""
    inner = '"integer"'
    for i in range(levels):
        name = "s" if i else "x"
        inner = f'{{"type":"struct","fields":[{{"name":"{name}","type":{inner},"nullable":true,"metadata":{{}}}}]}}'
    return (
        '{"type":"struct","fields":[{"name":"id","type":"integer","nullable":true,"metadata":{}},'
        f'{{"name":"s","type":{inner},"nullable":true,"metadata":{{}}}}]}}'
    )


def test_the_bound_is_jacksons_default() -> None:
    assert MAX_SCHEMA_JSON_DEPTH == 1000  # StreamReadConstraints.DEFAULT_MAX_DEPTH


@pytest.mark.parametrize("levels", [66, 70, 200, 332])
def test_nested_structs_up_to_a_thousand_json_levels_are_read(levels: int) -> None:
    text = nested_schema(levels)
    assert json_depth(text) <= MAX_SCHEMA_JSON_DEPTH
    schema = parse_schema(text)
    assert to_arrow_schema(schema).names == ["id", "s"]
    assert json.loads(schema.to_json_string()) == json.loads(text)


def test_exactly_a_thousand_levels_are_read_and_one_more_struct_is_refused() -> None:
    assert json_depth(nested_schema(332)) == 1000
    parse_schema(nested_schema(332))
    with pytest.raises(SchemaError) as info:
        parse_schema(nested_schema(333))
    assert "1003 levels of JSON, more than 1000" in str(info.value) and "\n" not in str(info.value)


def test_json_depth_counts_no_bracket_inside_a_string() -> None:
    assert json_depth('{"a":"[[{{\\"{"}') == 1
    assert json_depth("[[], [[1]]]") == 3
    assert json_depth("1") == 0


def _with_schema(tmp_path: Path, schema: str) -> Path:
    root = copy_table("krs__cdf-table-non-partitioned", tmp_path)
    commit = root / "_delta_log" / f"{0:020d}.json"
    lines = [json.loads(x) for x in commit.read_text().splitlines() if x.strip()]
    for action in lines:
        if "metaData" in action:
            action["metaData"]["schemaString"] = schema
    commit.write_text("".join(json.dumps(a) + "\n" for a in lines))
    return root


def test_a_schema_deeper_than_the_bound_is_refused_by_the_cli_in_one_line(tmp_path: Path) -> None:
    root = _with_schema(tmp_path, nested_schema(2000))  # 6,000 levels: no recursion reaches it
    for command in ("snapshot", "history"):
        done = subprocess.run(
            [sys.executable, "-m", "deltamirror.cli.main", command, str(root)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        lines = [x for x in done.stderr.splitlines() if x.strip()]
        assert done.returncode == 2 and len(lines) == 1, done.stderr[-2000:]
        assert "Traceback" not in done.stderr and "more than 1000" in lines[0], lines[0]


@pytest.mark.parametrize(
    ("spoil", "what"),
    [('"name":"x","type":"integer","nullable":true,"metadata":{}', "NaN"), ('"name":"x"', "lone surrogate")],
)
def test_a_deep_schema_is_read_as_strictly_as_a_shallow_one(spoil: str, what: str) -> None:
    """Past jiter's 200 levels Python's parser reads the schema: no NaN, no lone surrogate either."""
    text = nested_schema(100)
    bad = '"name":"x","type":"integer","nullable":true,"metadata":{"m":NaN}'
    if what != "NaN":
        bad = '"name":"\\ud800"'
    assert spoil in text
    with pytest.raises(SchemaError, match="not JSON"):
        parse_schema(text.replace(spoil, bad, 1))
