"""Refusals that name where the log is broken: a metaData no reader of rows can use, a checkpoint
that is none, a line cut short that a reader looking for a few actions passes over, an emptied
commit in a change-feed range. Each on a copy of a real table; the CLI exits 2 with one line
naming the file (and the line, where there is one)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from deltamirror.cli.main import main
from deltamirror.core import errors
from deltamirror.core.log import build_segment
from deltamirror.core.replay import replay_config
from deltamirror.core.table import open_table
from support.tables import copy_table

LOG_COMMANDS = ("snapshot", "history", "events")


def _commit(root: Path, version: int) -> Path:
    return root / "_delta_log" / f"{version:020d}.json"


def _lines(root: Path, version: int) -> list[dict[str, Any]]:
    return [json.loads(x) for x in _commit(root, version).read_text().splitlines() if x.strip()]


def _write(root: Path, version: int, actions: list[dict[str, Any]]) -> None:
    _commit(root, version).write_text("".join(json.dumps(a) + "\n" for a in actions))


def _argv(command: str, root: Path, *extra: str) -> list[str]:
    return [command, str(root), *(["--format", "jsonl"] if command == "history" else []), *extra]


def _run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str]:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse
        code = int(exc.code or 0)
    _, err = capsys.readouterr()
    return code, err


def _refused(capsys: pytest.CaptureFixture[str], argv: list[str], file: str, line: int | None = None) -> str:
    """``argv`` exits 2 with one line naming ``file`` (and ``line``); that line."""
    code, err = _run(capsys, argv)
    lines = [x for x in err.splitlines() if x.strip()]
    assert code == 2 and len(lines) == 1, (argv, code, err)
    assert f"{file}," in lines[0] or f"{file})" in lines[0], lines[0]
    if line is not None:
        assert f"line={line})" in lines[0] or f"line={line}," in lines[0], lines[0]
    assert "Traceback" not in err
    return lines[0]


def _succeeds(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    code, err = _run(capsys, argv)
    assert code == 0, (argv, err)


# --- item 1: the metaData in force, remembered with its place ---------------------------------------


def test_metadata_without_schema_string_is_log_level_readable_but_refused_by_readers_of_state(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a real Delta Live Tables log: its setup commit (version 0) has a metaData without schemaString;
    # a table state needs a schema (delta-spark refuses one without): snapshot refuses it as read does
    root = copy_table("drs__delta-live-table", tmp_path)
    message = _refused(capsys, ["snapshot", str(root), "--version", "0"], "00000000000000000000.json", 3)
    assert "schemaString" in message
    _succeeds(capsys, ["snapshot", str(root)])  # version 1 has a schema
    _succeeds(capsys, _argv("history", root))
    _succeeds(capsys, _argv("events", root))
    message = _refused(capsys, ["read", str(root), "--version", "0"], "00000000000000000000.json", 3)
    assert "schemaString" in message
    _succeeds(capsys, ["read", str(root)])  # version 1 has a schema
    snap = open_table(str(root)).snapshot(0, check_features=False)
    with pytest.raises(errors.SchemaError) as info:
        _ = snap.schema
    assert info.value.file is not None and info.value.file.endswith("00000000000000000000.json")
    assert (info.value.line, info.value.version) == (3, 0)


def test_missing_schema_string_named_by_read_and_changes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = copy_table("krs__cdf-table-non-partitioned", tmp_path)
    actions = _lines(root, 0)
    assert "metaData" in actions[1]
    del actions[1]["metaData"]["schemaString"]
    _write(root, 0, actions)
    for argv in (
        ["snapshot", str(root)],
        ["read", str(root)],
        ["changes", str(root), "--starting-version", "0"],
    ):
        _refused(capsys, argv, "00000000000000000000.json", 2)
    for command in ("history", "events"):
        _succeeds(capsys, _argv(command, root))


def _set_checkpoint_schema_string(path: Path, value: str | None) -> None:
    table = pq.read_table(path)
    md = table.column("metaData").combine_chunks()
    names = [f.name for f in md.type]
    children = [md.field(i) for i in range(len(names))]
    children[names.index("schemaString")] = pa.array(
        [value if valid else None for valid in md.is_valid().to_pylist()], pa.string()
    )
    new = pa.StructArray.from_arrays(children, names=names, mask=md.is_null())
    pq.write_table(table.set_column(table.schema.get_field_index("metaData"), "metaData", new), path)


def test_metadata_from_a_checkpoint_is_named_by_the_checkpoint_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = copy_table("golden__checkpoint", tmp_path)  # no metaData after the checkpoint at 10
    checkpoint = root / "_delta_log" / "00000000000000000010.checkpoint.parquet"
    _set_checkpoint_schema_string(checkpoint, None)
    _refused(capsys, ["read", str(root)], checkpoint.name)
    _refused(capsys, _argv("snapshot", root), checkpoint.name)

    schema = json.loads(_lines(root, 0)[2]["metaData"]["schemaString"])
    schema["fields"][0]["type"] = "mutationType"
    _set_checkpoint_schema_string(checkpoint, json.dumps(schema))
    for command in ("snapshot", "history", "read"):
        assert "mutationType" in _refused(capsys, _argv(command, root), checkpoint.name)


def _with_unknown_type(root: Path) -> int:
    """A new commit whose metaData has a column of a type no Delta reader knows; its version."""
    latest = max(int(p.name[:20]) for p in (root / "_delta_log").glob("0*.json"))
    metadata = next(a["metaData"] for v in range(latest + 1) for a in _lines(root, v) if "metaData" in a)
    schema = json.loads(metadata["schemaString"])
    schema["fields"][-1]["type"] = "mutationType"
    metadata = {**metadata, "schemaString": json.dumps(schema)}
    _write(
        root,
        latest + 1,
        [{"commitInfo": {"timestamp": 1, "operation": "SET TBLPROPERTIES"}}, {"metaData": metadata}],
    )
    return latest + 1


def test_an_unknown_type_is_a_corrupt_metadata_for_every_reader(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = copy_table("krs__cdf-table-non-partitioned", tmp_path)
    version = _with_unknown_type(root)
    name = f"{version:020d}.json"
    for argv in (
        *(_argv(c, root) for c in (*LOG_COMMANDS, "read")),
        ["changes", str(root), "--starting-version", "0"],
    ):
        message = _refused(capsys, argv, name, 2)
        assert "mutationType" in message, message
    with pytest.raises(errors.CorruptLogError) as info:
        open_table(str(root)).snapshot()
    assert (info.value.version, info.value.line) == (version, 2)
    open_table(str(root)).snapshot(check_features=False)  # log-level tools still see the log


def test_an_unsupported_reader_feature_is_named_before_the_types_it_brings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = copy_table("krs__table-with-geo", tmp_path)  # geometry/geography come with 'geospatial'
    for command in (*LOG_COMMANDS, "read"):
        code, err = _run(capsys, _argv(command, root))
        assert code == 2 and "geospatial" in err and "geometry" not in err, (command, err)


# --- item 2: a checkpoint holds the protocol and metaData of its version -----------------------------


def _cleaned(root: Path, checkpoint_version: int) -> None:
    """The log as a cleanup at the checkpoint leaves it: the commits before it deleted."""
    for v in range(checkpoint_version):
        _commit(root, v).unlink()
    (root / "_delta_log" / "_last_checkpoint").unlink(missing_ok=True)


@pytest.mark.parametrize("content", [b"", b'{"txn":{"appId":"a","version":1}}\n'], ids=["empty", "no-config"])
def test_a_v2_checkpoint_that_is_none_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes
) -> None:
    root = copy_table("golden__v2-checkpoint-json", tmp_path)
    _cleaned(root, 2)
    (checkpoint,) = (root / "_delta_log").glob("*.checkpoint.*.json")
    checkpoint.write_bytes(content)
    for command in (*LOG_COMMANDS, "read"):
        _refused(capsys, _argv(command, root), checkpoint.name)


def test_a_broken_checkpoint_metadata_line_is_refused_by_every_reader(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = copy_table("golden__v2-checkpoint-json", tmp_path)
    _cleaned(root, 2)
    (checkpoint,) = (root / "_delta_log").glob("*.checkpoint.*.json")
    lines = checkpoint.read_bytes().split(b"\n")
    assert lines[0].startswith(b'{"checkpointMetadata"')
    lines[0] = b'{"checkpointMetadata":{}}'  # its version missing
    checkpoint.write_bytes(b"\n".join(lines))
    for command in (*LOG_COMMANDS, "read"):
        assert "checkpointMetadata.version" in _refused(capsys, _argv(command, root), checkpoint.name, 1)


@pytest.mark.parametrize("dropped", ["protocol", "metaData"])
def test_a_parquet_checkpoint_without_protocol_or_metadata_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], dropped: str
) -> None:
    root = copy_table("golden__checkpoint", tmp_path)
    _cleaned(root, 10)
    checkpoint = root / "_delta_log" / "00000000000000000010.checkpoint.parquet"
    pq.write_table(pq.read_table(checkpoint).drop_columns([dropped]), checkpoint)
    for command in LOG_COMMANDS:
        assert dropped in _refused(capsys, _argv(command, root), checkpoint.name)
    with pytest.raises(errors.IncompleteTableStateError):
        open_table(str(root)).snapshot()


def test_an_empty_parquet_checkpoint_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = copy_table("golden__checkpoint", tmp_path)
    _cleaned(root, 10)
    checkpoint = root / "_delta_log" / "00000000000000000010.checkpoint.parquet"
    checkpoint.write_bytes(b"")
    for command in (*LOG_COMMANDS, "read"):
        _refused(capsys, _argv(command, root), checkpoint.name)


# --- item 3: every line a reader passes over is one action line ---------------------------------------


@pytest.mark.parametrize("cut", [b'{"protoc', b'{"commitInfo":{"timestamp":1', b"[1]", b'{"add":{}}}x'])
def test_a_broken_line_is_refused_by_readers_looking_for_a_few_actions(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], cut: bytes
) -> None:
    root = copy_table("golden__data-reader-partition-values", tmp_path)
    path = _commit(root, 0)
    lines = path.read_bytes().split(b"\n")
    assert lines[1].startswith(b'{"protocol"') and lines[0].startswith(b'{"commitInfo"')
    target = 1 if cut.startswith(b'{"protoc') else 0  # the protocol itself, or a line next to it
    lines[target] = cut
    path.write_bytes(b"\n".join(lines))
    for command in LOG_COMMANDS:
        _refused(capsys, _argv(command, root), path.name, target + 1)
    with pytest.raises(errors.CorruptLogError) as info:
        table = open_table(str(root))
        replay_config(table.storage, build_segment(table.storage))
    assert info.value.line == target + 1


# --- item 4: an emptied commit in a change-feed range ----------------------------------------------


@pytest.mark.parametrize("content", [b"", b"  \n\t\n", b"\r\n"])
def test_an_emptied_commit_in_a_change_feed_range_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes
) -> None:
    root = copy_table("krs__cdf-column-mapping-name-mode-3-7", tmp_path)
    _commit(root, 1).write_bytes(content)  # the commit that turns the change data feed on
    for start in ("1", "2"):
        message = _refused(
            capsys, ["changes", str(root), "--starting-version", start], "00000000000000000001.json"
        )
        assert "empty commit" in message
    with pytest.raises(errors.CorruptLogError) as info:
        open_table(str(root)).changes(starting_version=1).to_arrow()
    assert info.value.version == 1


# --- item 5: duplicate names inside an action ----------------------------------------------------------


def test_duplicate_names_inside_an_action_read_last_wins(tmp_path: Path) -> None:
    """The lead's decision (docs/changes.md, "What the log must hold"): as Jackson, Python, Go and
    JS parsers read them, the last of two equal names wins; the value checked is the value read."""
    root = copy_table("golden__data-reader-partition-values", tmp_path)
    path = _commit(root, 0)
    lines = path.read_bytes().split(b"\n")
    add = next(i for i, x in enumerate(lines) if x.startswith(b'{"add"'))
    assert lines[add].endswith(b"}}")
    lines[add] = lines[add][:-2] + b',"size":424242}}'
    path.write_bytes(b"\n".join(lines))
    files = open_table(str(root)).snapshot().files
    assert 424242 in files.column("size").to_pylist()
    lines[add] = lines[add][:-2] + b',"size":-1}}'  # the last value is the one checked
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(errors.CorruptLogError, match="size"):
        open_table(str(root)).snapshot()
