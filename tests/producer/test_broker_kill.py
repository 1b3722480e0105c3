"""The broker killed with SIGKILL while the watcher commits, and restarted at once: nothing lost or doubled.

A single broker killed while a commit is in flight comes back with the transaction half done: its
coordinator completes it, but while the restarted broker is fenced for a moment (its previous
registration's session expires after the new one started) it finds no leader for the
transaction's partitions and skips their markers, as for deleted topics. Those partitions keep
records that no marker ends: ``read_committed`` readers stop there, and the producer's next marker
on the partition decides their fate. The watcher must then never believe a version published that
the topics do not show committed: it resumes from the progress it reads back (``read_committed``),
and a transaction that nobody will end is reported (one line with Kafka's remedy) until an
operator aborts it, after which every version is on the topics exactly once.

The test kills its own broker (never the session's) a few milliseconds into a commit, several
times, restarting it at once; a reported hanging transaction gets the operator's remedy
(``abort_hanging``, Kafka's TransactionsCommand) as the log line says.
"""

from __future__ import annotations

import logging
import os
import random
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from deltamirror.devkafka.tools import abort_hanging
from deltamirror.mirror.kafka.producer import TransactionalPublisher
from deltamirror.producer import pipeline as pipeline_module
from deltamirror.producer.service import WatchService
from support.kafka import free_port_pair

pytestmark = [pytest.mark.kafka]

#: the commits (counted from the watcher's first) during which the broker is killed
KILL_AT = (6, 30, 60)


class _KillDuringCommit(TransactionalPublisher):
    """Commit number ``KILL_AT[i]`` starts a thread that SIGKILLs the broker ``jitter`` ms later."""

    pid: int | None = None
    commits = 0
    killed = threading.Event()
    rng = random.Random(7)

    def commit(self, timeout_s: float = 60.0) -> None:
        cls = type(self)
        cls.commits += 1
        if cls.commits in KILL_AT and cls.pid is not None and not cls.killed.is_set():
            pid, delay = cls.pid, cls.rng.uniform(0.0, 0.02)

            def kill() -> None:
                time.sleep(delay)  # a moment inside the commit: the coordinator may be mid-markers
                os.kill(pid, signal.SIGKILL)
                cls.killed.set()

            threading.Thread(target=kill, daemon=True).start()
        super().commit(timeout_s)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def _summary_versions(kit: Any, setup: Any) -> list[int]:
    records = kit.consume(setup.bootstrap, [setup.commits], idle_s=0.3, timeout_s=10)
    return [r.json["version"] for r in records if r.headers.get("kind") == b"commit"]


def _start_again(broker: Any) -> None:
    """``start``, again while the port is taken: a client retrying the dead broker's port from an
    ephemeral port can connect to itself on loopback (TCP simultaneous open) and hold it a moment."""
    from deltamirror.core.errors import ConfigError

    deadline = time.monotonic() + 30
    while True:
        try:
            broker.start()
            return
        except ConfigError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _abort_when_the_broker_answers(bootstrap: str) -> list[Any] | None:
    """Kafka's remedy, run as an operator runs it: again while the tool's own admin client finds no
    broker yet (``Timed out waiting for a node assignment`` right after a restart, or under load).
    None when the broker was killed meanwhile (the watcher goes on committing while the remedy
    runs): it is run again once the broker is back."""
    from deltamirror.mirror.errors import KafkaError

    deadline = time.monotonic() + 120
    while True:
        if _KillDuringCommit.killed.is_set():
            return None
        try:
            return abort_hanging(bootstrap)
        except KafkaError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1.0)


@pytest.mark.isolated  # its own broker, killed: none of the session's
@pytest.mark.timeout(420)
def test_broker_killed_mid_commit_and_restarted_loses_and_doubles_nothing(
    tmp_path: Path,
    kit: Any,
    watch_setup: Any,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from deltamirror.devkafka.broker import LocalKafka

    broker = LocalKafka(port=free_port_pair(), data_dir=tmp_path / "kafka")
    bootstrap = broker.start()
    try:
        table = kit.make_table(tmp_path / "t", versions=1)
        kit.write_versions(table, 1, 40, 1000)  # about 270 transactions of 150 records
        setup = watch_setup(bootstrap, table, txn_max_records=150)
        cfg = setup.cfg()
        cfg = cfg.model_copy(
            update={"kafka": cfg.kafka.model_copy(update={"extra": {"transaction.timeout.ms": "10000"}})}
        )
        monkeypatch.setattr(pipeline_module, "HANG_MARGIN_S", 5.0, raising=False)
        monkeypatch.setattr(_KillDuringCommit, "commits", 0)
        monkeypatch.setattr(_KillDuringCommit, "killed", threading.Event())
        monkeypatch.setattr(pipeline_module, "TransactionalPublisher", _KillDuringCommit)
        caplog.set_level(logging.INFO, logger="deltamirror")
        service = WatchService(cfg)
        kills, remedies = 0, []
        _KillDuringCommit.pid = broker.status()["pid"]

        seen = [0]

        def remedy_if_reported() -> None:
            """What the watcher's error line tells an operator to do about a hanging transaction."""
            reported = sum("transaction hanging on" in r.getMessage() for r in caplog.records)
            if reported > seen[0]:
                aborted = _abort_when_the_broker_answers(bootstrap)
                if aborted is not None:  # else the broker died under it: again once it is back
                    seen[0] = reported
                    remedies.append([str(t) for t in aborted])

        service.start()
        try:
            for _ in KILL_AT:
                deadline = time.monotonic() + 180
                while not _KillDuringCommit.killed.wait(0.5):
                    assert time.monotonic() < deadline, f"commit {KILL_AT[kills]} did not come"
                    assert service._failure is None, service._failure
                    remedy_if_reported()
                pid = _KillDuringCommit.pid
                assert pid is not None
                deadline = time.monotonic() + 30
                while _alive(pid):
                    assert time.monotonic() < deadline, "the broker survived SIGKILL"
                    time.sleep(0.05)
                kills += 1
                # at once (the killed broker's registration is still alive), as `local kafka start`
                # does it: a new handle, which finds the data dir's pid gone
                broker = LocalKafka(port=broker.port, data_dir=broker.data_dir)
                _start_again(broker)
                _KillDuringCommit.pid = broker.status()["pid"]
                _KillDuringCommit.killed.clear()
                if kills < len(KILL_AT):
                    kit.write_versions(table, 41 + 10 * (kills - 1), 10, 1000, prefix=f"k{kills}")
            last = 40 + 10 * (len(KILL_AT) - 1)
            deadline = time.monotonic() + 240
            while max(_summary_versions(kit, setup), default=-1) < last:
                assert time.monotonic() < deadline, "the watcher did not publish every version"
                assert service._failure is None, service._failure
                remedy_if_reported()
                time.sleep(0.5)
        finally:
            service.request_stop()
            assert service.wait(60), "the watcher did not stop"
            service.close()
        assert kills == len(KILL_AT)
        skipped = [
            line
            for line in broker.log_file.read_text(errors="replace").splitlines()
            if "Couldn't find leader endpoint for partitions" in line
        ]
        print(f"kills {kills}; markers skipped {len(skipped)}; remedies {remedies}")
        got = [r.value for r in setup.actions_records(idle_s=0.3)]
        expected = kit.events_output(table)
        assert len(got) == len(expected), f"{len(got)} envelopes on the topic, {len(expected)} in the log"
        assert got == expected
        assert _summary_versions(kit, setup) == list(range(last + 1))
    finally:
        broker.stop()
