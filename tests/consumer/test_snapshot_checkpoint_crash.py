"""kill -9 of the snapshot consumer at random points, against a real broker: what is on disk after
each kill is core's snapshot at its version, a restart ends at core's latest snapshot, and every
version is reported at least once."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from deltamirror.consumer.snapshot import SnapshotConsumer, StateStore
from deltamirror.core.replay import file_keys
from deltamirror.core.table import open_table
from support.tables import copy_table
from support.watching import watch_until

# a consumer that prints each version it reports, saving every few versions, a few records a batch
CHILD = """
import sys
from deltamirror.consumer.snapshot import SnapshotConsumer

bootstrap, topic, state_dir, catch_up_saves = sys.argv[1:5]
SnapshotConsumer(
    bootstrap,
    topic,
    group_id=topic + "-crash",
    state_dir=state_dir,
    on_applied=lambda inv, _: print(inv.version, flush=True),
    batch_size=5,
    checkpoint_interval_versions=3,
    checkpoint_interval_s=None,
    catch_up_saves=catch_up_saves == "1",
).run(once=True)
"""


def _keys(files: object) -> set[str]:
    return set(file_keys(files["path"], files["deletionVector"]).to_pylist())  # type: ignore[index]


def _kill_after(
    bootstrap: str, topic: str, state_dir: Path, reports: int, delay_s: float, catch_up_saves: bool
) -> list[int]:
    """Run the child until it has reported ``reports`` versions, wait ``delay_s``, SIGKILL it."""
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, bootstrap, topic, str(state_dir), "1" if catch_up_saves else "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    seen: list[int] = []
    try:
        assert child.stdout is not None
        while len(seen) < reports:
            line = child.stdout.readline()
            if not line:  # it read everything first
                break
            seen.append(int(line))
        time.sleep(delay_s)
        child.send_signal(signal.SIGKILL)
        child.wait(30)
        # the rest through the same buffered reader: readline may have read ahead of its line
        out, err = child.stdout.read(), child.stderr.read() if child.stderr else b""
    finally:
        if child.poll() is None:
            os.kill(child.pid, signal.SIGKILL)
            child.wait(10)
    assert child.returncode in (0, -signal.SIGKILL), err.decode()[-2000:]
    return seen + [int(line) for line in out.split()]


@pytest.mark.kafka
@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "catch_up_saves", [True, False], ids=["saves-while-catching-up", "saves-once-caught-up"]
)
def test_a_consumer_killed_at_random_points_restarts_to_cores_snapshot(
    kafka_bootstrap: str, tmp_path: Path, catch_up_saves: bool
) -> None:
    """Killed while it reads the topic's backlog: with ``catch_up_saves`` the checkpoints saved
    at the interval are on disk; without, no save comes before the end (the restart re-reads)."""
    table = copy_table("kj__basic-dv-with-checkpoint", tmp_path)  # 47 versions, deletion vectors
    core = open_table(str(table))
    latest = core.latest_version()
    name = f"dmck-{uuid.uuid4().hex[:10]}"
    actions = f"{name}.actions"
    watch_until(kafka_bootstrap, table, actions, latest, name, snapshot_mode="from-version", from_version=0)
    root = f"file://{table}"

    behind = 0
    for seed in (1, 2, 3):
        rng = random.Random(seed)
        state_dir = tmp_path / f"state-{seed}"
        reported: list[int] = []
        for _ in range(2):
            reported += _kill_after(
                kafka_bootstrap,
                actions,
                state_dir,
                rng.randrange(1, latest),
                rng.uniform(0, 0.03),
                catch_up_saves,
            )
            # what the restart finds: each table's checkpoint is core's snapshot at its version
            tables, _ = StateStore(state_dir, actions).load()
            saved = max((s.version or 0 for s in tables.values()), default=-1)
            behind += saved < max(reported, default=-1)  # killed between saves: a re-read follows
            for state in tables.values():
                assert state.version is not None
                snap = core.snapshot(state.version)
                assert _keys(state.files) == _keys(snap.files), (
                    f"seed {seed}: files differ at {state.version}"
                )
                assert state.metadata is not None and state.metadata["id"] == snap.metadata.id
                folder = StateStore(state_dir, actions).folder(state.table_id)
                from_folder = open_table(str(folder), allowed_path_prefixes=[root]).snapshot()
                assert from_folder.version == state.version
                assert from_folder.files.num_rows == snap.files.num_rows
        consumer = SnapshotConsumer(
            kafka_bootstrap,
            actions,
            group_id=f"{actions}-crash",
            state_dir=state_dir,
            on_applied=lambda inv, _, seen=reported: seen.append(inv.version),
        )
        consumer.run(once=True)
        (state,) = consumer.tables.values()
        latest_snap = core.snapshot(latest)
        assert state.version == latest and _keys(state.files) == _keys(latest_snap.files)
        (saved,) = StateStore(state_dir, actions).load()[0].values()
        assert saved.version == latest and saved.files.equals(state.files)
        # at least once: no version went unreported across the kills
        assert set(reported) == set(range(latest + 1)), (
            f"seed {seed}: {sorted(set(range(latest + 1)) - set(reported))}"
        )
        assert json.loads((state_dir / "offsets.json").read_text())["format"] == 3
    assert behind, "no kill landed between two saves"


@pytest.mark.kafka
@pytest.mark.timeout(120)
def test_no_save_while_catching_up_with_the_backlog_then_the_interval_applies(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """A consumer reading a backlog saves its state once caught up (here: at the end), not at each
    interval on the way; with ``catch_up_saves`` it saves at the interval throughout."""
    table = copy_table("kj__basic-dv-with-checkpoint", tmp_path)
    core = open_table(str(table))
    latest = core.latest_version()
    name = f"dmcu-{uuid.uuid4().hex[:10]}"
    actions = f"{name}.actions"
    watch_until(kafka_bootstrap, table, actions, latest, name, snapshot_mode="from-version", from_version=0)

    def run(state_dir: Path, catch_up_saves: bool) -> SnapshotConsumer:
        consumer = SnapshotConsumer(
            kafka_bootstrap,
            actions,
            group_id=f"{name}-{state_dir.name}",
            state_dir=state_dir,
            batch_size=5,  # many batches, each a checkpoint: a save would be due at each
            checkpoint_interval_versions=1,
            checkpoint_interval_s=None,
            catch_up_saves=catch_up_saves,
        )
        consumer.run(once=True)
        assert consumer.caught_up
        (state,) = consumer.tables.values()
        assert state.version == latest and _keys(state.files) == _keys(core.snapshot(latest).files)
        (saved,) = StateStore(state_dir, actions).load()[0].values()
        assert saved.version == latest and saved.files.equals(state.files)
        return consumer

    assert run(tmp_path / "default", False).saves == 1  # the first save comes once caught up
    assert run(tmp_path / "throughout", True).saves > latest // 2
