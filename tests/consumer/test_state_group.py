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
