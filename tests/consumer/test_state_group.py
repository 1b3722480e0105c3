"""A state directory belongs to one consumer group: recorded when new, refused for another.

No broker: the store alone, and a consumer built over it (building one reads the state, not Kafka).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from deltamirror.consumer.snapshot import SnapshotConsumer, StateStore
from deltamirror.core.errors import ConfigError


def test_a_new_directory_gets_a_group_of_its_own_recorded_before_anything_is_read(tmp_path: Path) -> None:
    one = StateStore.claim_group(tmp_path / "a", "t.actions", requested=None, default="dm-inv")
    two = StateStore.claim_group(tmp_path / "b", "t.actions", requested=None, default="dm-inv")
    assert one.startswith("dm-inv-") and two.startswith("dm-inv-") and one != two
    assert json.loads((tmp_path / "a" / "offsets.json").read_text())["groupId"] == one
    # recorded: the same group at every start, named or not
    assert StateStore.claim_group(tmp_path / "a", "t.actions", requested=None, default="dm-inv") == one
    assert StateStore.claim_group(tmp_path / "a", "t.actions", requested=one, default="dm-inv") == one


def test_a_named_group_is_recorded_and_another_one_refused(tmp_path: Path) -> None:
    assert StateStore.claim_group(tmp_path, "t.actions", requested="cache-1", default="dm") == "cache-1"
    with pytest.raises(ConfigError, match="holds what consumer group cache-1 consumed, not group cache-2"):
        StateStore.claim_group(tmp_path, "t.actions", requested="cache-2", default="dm")
    with pytest.raises(ConfigError, match="consumer group cache-1"):
        SnapshotConsumer("127.0.0.1:1", "t.actions", state_dir=tmp_path, group_id="cache-2")
    consumer = SnapshotConsumer("127.0.0.1:1", "t.actions", state_dir=tmp_path, group_id="cache-1")
    consumer.save()
    assert json.loads((tmp_path / "offsets.json").read_text())["groupId"] == "cache-1"  # kept by saves


def test_a_directory_of_another_topic_is_refused_before_any_group_is_claimed(tmp_path: Path) -> None:
    StateStore.claim_group(tmp_path, "t.actions", requested="g", default="dm")
    with pytest.raises(ConfigError, match=r"holds the state of topic 't\.actions', not 'u\.actions'"):
        StateStore.claim_group(tmp_path, "u.actions", requested="g", default="dm")


def test_a_directory_from_before_groups_were_recorded_takes_the_group_it_is_used_with(tmp_path: Path) -> None:
    (tmp_path / "tables").mkdir()
    legacy = {"format": 3, "topic": "t.actions", "partitions": {"0": 12}, "retired": {}, "tables": {}}
    (tmp_path / "offsets.json").write_text(json.dumps(legacy))
    # no group named: the one every such directory was used with by default
    assert StateStore.claim_group(tmp_path, "t.actions", requested=None, default="dm-inv") == "dm-inv"
    written = json.loads((tmp_path / "offsets.json").read_text())
    assert written == {**legacy, "groupId": "dm-inv"}
    _, position = StateStore(tmp_path, "t.actions").load_all()
    assert position.offsets == {0: 12}  # the position is untouched


# --- a state directory belongs to the command that made it (F2 of the 2026-11-30 audit: invalidate
# over consume-snapshot's state took its group and position, and delivered nothing, exit 0) ----------

GROUPS = {"consume-snapshot": "deltamirror-snapshot-consumer", "invalidate": "deltamirror-invalidate"}


def _claim(directory: Path, command: str, requested: str | None = None) -> str:
    return StateStore.claim_group(
        directory,
        "t.actions",
        requested=requested,
        default=GROUPS[command],
        command=command,
        command_groups=GROUPS,
    )


def test_a_new_directory_records_its_command_and_the_other_command_is_refused(tmp_path: Path) -> None:
    group = _claim(tmp_path, "consume-snapshot")
    assert json.loads((tmp_path / "offsets.json").read_text())["command"] == "consume-snapshot"
    assert _claim(tmp_path, "consume-snapshot") == group
    with pytest.raises(ConfigError, match=r"is the state of consume-snapshot, not invalidate \(it records"):
        _claim(tmp_path, "invalidate")
    with pytest.raises(ConfigError, match="not invalidate"):  # a group named changes nothing
        _claim(tmp_path, "invalidate", requested=group)
    # the saves keep the record
    consumer = SnapshotConsumer("127.0.0.1:1", "t.actions", state_dir=tmp_path, group_id=group)
    consumer.save()
    assert json.loads((tmp_path / "offsets.json").read_text())["command"] == "consume-snapshot"


@pytest.mark.parametrize(
    ("group", "made_by"),
    [
        ("deltamirror-snapshot-consumer-b3a3dc77b291", "consume-snapshot"),  # the audit's directory
        ("deltamirror-snapshot-consumer", "consume-snapshot"),  # from before groups, taken by it
        ("deltamirror-invalidate-0123456789ab", "invalidate"),
        ("deltamirror-invalidate", "invalidate"),
    ],
)
def test_a_directory_from_before_commands_were_recorded_is_told_by_its_default_group(
    group: str, made_by: str, tmp_path: Path
) -> None:
    (tmp_path / "tables").mkdir()
    legacy = {"format": 3, "topic": "t.actions", "partitions": {"0": 3}, "groupId": group, "retired": {}}
    (tmp_path / "offsets.json").write_text(json.dumps(legacy))
    other = next(c for c in GROUPS if c != made_by)
    with pytest.raises(
        ConfigError, match=f"is the state of {made_by}, not {other} \\(its consumer group {group}"
    ):
        _claim(tmp_path, other)
    assert json.loads((tmp_path / "offsets.json").read_text()) == legacy  # refused: untouched
    assert _claim(tmp_path, made_by) == group
    assert json.loads((tmp_path / "offsets.json").read_text()) == {**legacy, "command": made_by}


@pytest.mark.parametrize("group", [None, "cache-1", "deltamirror-invalidate-elsewhere"])
def test_a_directory_from_before_whose_group_tells_nothing_takes_the_command_it_is_used_with(
    group: str | None, tmp_path: Path
) -> None:
    (tmp_path / "tables").mkdir()
    legacy = {"format": 3, "topic": "t.actions", "partitions": {"0": 3}, "retired": {}}
    if group is not None:
        legacy["groupId"] = group
    (tmp_path / "offsets.json").write_text(json.dumps(legacy))
    assert _claim(tmp_path, "consume-snapshot") == (group or "deltamirror-snapshot-consumer")
    assert json.loads((tmp_path / "offsets.json").read_text())["command"] == "consume-snapshot"
    with pytest.raises(ConfigError, match="is the state of consume-snapshot, not invalidate"):
        _claim(tmp_path, "invalidate")


def test_the_library_without_a_command_neither_records_nor_checks_one(tmp_path: Path) -> None:
    _claim(tmp_path, "invalidate")
    group = StateStore.claim_group(tmp_path, "t.actions", requested=None, default="x")
    assert json.loads((tmp_path / "offsets.json").read_text())["command"] == "invalidate"
    assert group.startswith("deltamirror-invalidate-")
