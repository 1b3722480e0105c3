"""Every entry of the library's face, given a bad argument, raises a DeltaMirrorError naming the
table and the argument: never a TypeError, KeyError or pyarrow error, and never a silent answer.

The entries are found by inspection (``open_table``, ``read_changes``, ``changes_from_actions`` and
every public method of ``DeltaTable`` and ``Snapshot``), and so are their parameters: a parameter
added to the face without bad values listed in ``BAD`` fails this test until it has some.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from deltamirror.core import DeltaMirrorError, DeltaTable, Snapshot, open_table
from deltamirror.core.changes import VersionActions, changes_from_actions, read_changes

TABLES = Path(__file__).resolve().parents[1] / "data" / "tables"
TABLE = TABLES / "krs__cdf-table-partitioned"  # 3 versions, change data feed on, columns id, text, part


class Odd:
    """A value of no type any argument takes."""


#: per parameter name, values no entry may take quietly
BAD: dict[str, list[Any]] = {
    "uri": [None, 123, Odd(), b"/tmp/table"],
    "storage_options": ["anon=true", 5, ["anon", "true"], {1: "x"}],
    "allowed_path_prefixes": ["s3://bucket/source", 5, [5], [None]],
    "version": [-1, "1", 1.5, True, Odd()],
    "start_version": [-1, "0", 0.5, False],
    "start": [-1, "0", 1.5, True],
    "end": [-1, "2", 2.5, True],
    "timestamp": ["not a time", [], 1.5, True, Odd()],
    "check_features": ["no", 0, None],
    "progress": [5, "print"],
    "columns": ["id", ["nope"], [1], [None], 5, ["id", 5]],
    "ict": ["enabled", 5],
    "starting_version": [-1, "0", 1.5, True],
    "ending_version": [-1, "2", 2.5, True],
    "starting_timestamp": ["not a time", [], 1.5, True],
    "ending_timestamp": ["not a time", [], 1.5, True],
    "partition_filter": [5, "part=1", [("part", "1")], {1: "1"}],
    "batch_size": [0, -5, "10", 2.5, True],
    "row_ids": ["yes", 1, None],
    "table": [str(TABLE), None, 5],
    "metadata": [{"schemaString": "{}"}, None, "metaData"],
    "metadata_version": [-1, "0", 1.5, True],
    "versions": [5, None],
}

#: arguments a call needs to reach the one under test (the rest keep their defaults)
NEEDED: dict[str, dict[str, Any]] = {
    "open_table": {"uri": str(TABLE)},
    "DeltaTable": {"uri": str(TABLE)},
    "changes": {"starting_version": 0},
    "read_changes": {"starting_version": 0},
    "version_at": {"timestamp": lambda: open_table(str(TABLE)).commit_timestamp(1).timestamp},
    "read_commit": {"version": 0},
    "commit_info": {"version": 0},
    "commit_metadata": {"version": 0},
    "commit_timestamp": {"version": 0},
    "last_commit_timestamp": {"version": 0},
}


def _entries() -> Iterator[tuple[str, Callable[..., Any], inspect.Signature]]:
    """(name, the bound callable, its signature) of every entry of the face."""
    table = open_table(str(TABLE))
    snapshot = table.snapshot()
    yield "open_table", open_table, inspect.signature(open_table)
    yield "DeltaTable", DeltaTable, inspect.signature(DeltaTable)
    for cls, obj in ((DeltaTable, table), (Snapshot, snapshot)):
        for name, _ in inspect.getmembers(cls, inspect.isfunction):
            if not name.startswith("_"):
                yield name, getattr(obj, name), inspect.signature(getattr(obj, name))
    yield "read_changes", _bind_table(read_changes, table), inspect.signature(read_changes)
    metadata = snapshot.metadata

    def from_actions(**kwargs: Any) -> Any:
        kwargs.setdefault("table", table)
        kwargs.setdefault("metadata", metadata)
        kwargs.setdefault("metadata_version", 0)
        kwargs.setdefault("versions", [VersionActions(1, 0, [])])
        table_arg = kwargs.pop("table")
        return changes_from_actions(
            table_arg,
            kwargs.pop("metadata"),
            kwargs.pop("metadata_version"),
            kwargs.pop("versions"),
            **kwargs,
        )

    yield "changes_from_actions", from_actions, inspect.signature(changes_from_actions)


def _bind_table(fn: Callable[..., Any], table: DeltaTable) -> Callable[..., Any]:
    def call(**kwargs: Any) -> Any:
        return fn(kwargs.pop("table", table), **kwargs)

    return call


def _cases() -> list[tuple[str, str, Any]]:
    cases = []
    for name, _, signature in _entries():
        for param in signature.parameters.values():
            if param.name == "self" or param.kind in (param.VAR_KEYWORD, param.VAR_POSITIONAL):
                continue
            cases.extend((name, param.name, bad) for bad in BAD.get(param.name, [_MISSING]))
    return cases


_MISSING = object()


def _call(name: str, kwargs: dict[str, Any]) -> Any:
    entry = {n: fn for n, fn, _ in _entries()}[name]
    result = entry(**kwargs)
    if hasattr(result, "__iter__") and not isinstance(result, str | bytes | dict):
        result = list(result)  # what is lazy must fail when it is read at the latest
    return result


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(word.title() for word in rest)


@pytest.mark.parametrize(("entry", "argument", "bad"), _cases(), ids=lambda v: repr(v)[:30])
def test_a_bad_argument_is_refused_with_an_error_naming_table_and_argument(
    entry: str, argument: str, bad: Any
) -> None:
    assert bad is not _MISSING, (
        f"{entry}({argument}=...) is a new argument of the face: list bad values in BAD"
    )
    needed = {k: v() if callable(v) else v for k, v in NEEDED.get(entry, {}).items()}
    kwargs = {**needed, argument: bad}
    with pytest.raises(DeltaMirrorError) as caught:
        _call(entry, kwargs)
    error = caught.value
    text = str(error)
    named = getattr(error, "context", {}).get("argument") == argument
    said = re.search(rf"\b({argument}|{_camel(argument)})\b", text) is not None
    shown = isinstance(bad, str) and bad in text  # e.g. the column that is not there
    assert named or said or shown, f"{entry}({argument}={bad!r}): {text}"
    if argument not in ("uri", "table"):
        assert error.table is not None and "krs__cdf-table-partitioned" in error.table, text


def test_to_arrow_of_a_column_that_is_not_there_names_table_and_column() -> None:
    """The case first reported: pyarrow's KeyError came out of to_arrow."""
    from deltamirror.core.errors import InvalidArgumentError

    snapshot = open_table(str(TABLE)).snapshot()
    with pytest.raises(
        InvalidArgumentError, match=r"no column 'nope' in the table \(columns: id, text, part\)"
    ):
        snapshot.to_arrow(columns=["nope"])
    with pytest.raises(InvalidArgumentError) as caught:
        snapshot.to_arrow(columns=["nope"])
    assert caught.value.table == snapshot.table.uri and caught.value.context["argument"] == "columns"


def test_good_arguments_still_read_what_they_name() -> None:
    """The checks refuse only what is wrong: names match as the readers match them."""
    table = open_table(TABLE)  # a path-like is a location too
    snapshot = table.snapshot(version=2)
    assert snapshot.to_arrow(columns=["ID", "part"]).column_names == ["id", "part"]
    assert snapshot.to_arrow(columns=["part", "ID"]).column_names == ["part", "id"]  # as asked
    assert snapshot.to_arrow(columns=("id", "id")).column_names == ["id"]
    assert [e.version for e in table.history(1, 2)] == [1, 2]
    assert table.version_at(datetime.fromtimestamp(table.commit_timestamp(2).timestamp / 1000, UTC)) == 2
    assert table.snapshot(timestamp=table.commit_timestamp(1).timestamp).version == 1
    every = table.changes(starting_version=0).to_arrow()
    rows = table.changes(starting_version=0, columns=["id"], partition_filter={"part": 1})
    assert 0 < rows.to_arrow().num_rows < every.num_rows


def test_a_partition_filter_value_of_another_type_is_refused_not_matched_against_nothing() -> None:
    """``"1"`` for an integer partition column matched no file: an empty feed, said by nothing."""
    from deltamirror.core.errors import InvalidArgumentError

    table = open_table(str(TABLE))
    for wrong in ("1", ["0", "1"], True, 1.5):
        with pytest.raises(InvalidArgumentError, match=r"is not a value of partition column 'part' \(long\)"):
            table.changes(starting_version=0, partition_filter={"part": wrong})


def test_history_from_after_the_latest_version_says_so() -> None:
    from deltamirror.core.errors import VersionNotFoundError

    with pytest.raises(VersionNotFoundError, match="latest version is 2"):
        list(open_table(str(TABLE)).history(start=3))
