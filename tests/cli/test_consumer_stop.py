"""``consume-snapshot`` and ``invalidate`` stop within 10 s of SIGTERM, whatever the broker does.

Their last step is the group commit of the offsets they stored; librdkafka's close waits for it
without a bound of its own (``session.timeout.ms`` with the broker gone, minutes with one whose
connections hang). The real commands, as an operator runs them, against a broker of their own
that is frozen (SIGSTOP) once they have read everything.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support.kafka import free_port_pair, new_topic
from support.records import action_values

#: the issue's bound: a SIGTERM stops every long-running command within this
STOP_LIMIT_S = 10.0
VERSIONS = 5
PARTITIONS = 4

pytestmark = [pytest.mark.kafka, pytest.mark.slow, pytest.mark.isolated]  # its own broker


def _publish(bootstrap: str, topic: str) -> None:
    """Versions 0.. of one table, one add each, as the watcher writes them."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap})
    try:
        for version in range(VERSIONS):
            add = {
                "path": f"f{version}",
                "partitionValues": {},
                "size": 1,
                "modificationTime": 1,
                "dataChange": True,
            }
            for value in action_values(version, [("add", add)]):
                producer.produce(topic, value, b"t")
        assert producer.flush(30) == 0
    finally:
        producer.close()


def _start(log: Path, *args: str) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "deltamirror.cli.main", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )


def _versions(log: Path) -> list[int]:
    out = []
    for line in log.read_text().splitlines():
        if line.startswith("{") and '"version"' in line:
            out.append(json.loads(line)["version"])
    return out


@pytest.mark.timeout(300)
def test_sigterm_with_the_broker_frozen_stops_both_consumers_within_10_s(tmp_path: Path) -> None:
    from deltamirror.devkafka.broker import LocalKafka

    broker = LocalKafka(port=free_port_pair(), data_dir=tmp_path / "kafka")
    bootstrap = broker.start()
    pid = broker.status()["pid"]
    assert pid is not None
    frozen = False
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        topic = new_topic(bootstrap, "stop.actions", partitions=PARTITIONS)
        _publish(bootstrap, topic)
        source = ["--bootstrap-servers", bootstrap, "--topic", topic]
        procs["consume-snapshot"] = _start(
            tmp_path / "consume-snapshot.log",
            "consume-snapshot",
            *source,
            "--state-dir",
            str(tmp_path / "state"),
        )
        procs["invalidate"] = _start(
            tmp_path / "invalidate.log", "invalidate", *source, "--exec", "sh -c 'cat > /dev/null'"
        )
        deadline = time.monotonic() + 120
        for name, proc in procs.items():  # until each handed over the last version (no fixed sleep)
            log = tmp_path / f"{name}.log"
            while VERSIONS - 1 not in _versions(log):
                assert proc.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.1)
        os.kill(pid, signal.SIGSTOP)
        frozen = True
        started = time.monotonic()
        for proc in procs.values():
            proc.send_signal(signal.SIGTERM)
        took: dict[str, float] = {}
        for name, proc in procs.items():
            try:
                proc.wait(STOP_LIMIT_S + 60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            took[name] = time.monotonic() - started
        for name, proc in procs.items():
            text = (tmp_path / f"{name}.log").read_text()
            assert proc.returncode == 0, (
                f"{name} exited {proc.returncode} after {took[name]:.1f} s\n{text[-3000:]}"
            )
            assert took[name] < STOP_LIMIT_S, f"{name} took {took[name]:.1f} s\n{text[-3000:]}"
            assert "may not be committed" in text, text[-3000:]  # said, not silent
        # the state was saved before the close: a restart continues after the last version
        offsets = json.loads((tmp_path / "state" / "offsets.json").read_text())
        assert sum(offsets["partitions"].values()) == VERSIONS
        _the_other_waits_are_bounded_too(bootstrap, topic)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if frozen:
            os.kill(pid, signal.SIGCONT)
        broker.stop()


def _the_other_waits_are_bounded_too(bootstrap: str, topic: str) -> None:
    """With the broker still frozen: the lag (asked between two batches with --metrics-port) takes
    its timeout for all partitions together, not once per partition; reading the group's committed
    offsets (invalidate's start) ends within a slice of a stop."""
    import threading

    from deltamirror.mirror.errors import KafkaError, StopRequested
    from deltamirror.mirror.kafka.consumer import MirrorConsumer

    reader = MirrorConsumer({"bootstrap.servers": bootstrap}, group_id="stop-bounds")
    try:
        reader.assign([(topic, p, None) for p in range(PARTITIONS)])
        started = time.monotonic()
        with pytest.raises(KafkaError):
            reader.lag(1.0)
        assert time.monotonic() - started < 1.0 + 1.5  # not PARTITIONS x 1 s
        stop = threading.Event()
        threading.Timer(0.5, stop.set).start()
        started = time.monotonic()
        with pytest.raises(StopRequested):
            reader.committed(topic, range(PARTITIONS), 30.0, stop=stop)
        assert time.monotonic() - started < 0.5 + 1.5  # within a slice of the stop, not 30 s
    finally:
        reader.close(1.0)
