"""SIGTERM stops every long-running command within 10 s, however many arrive, whenever they arrive.

The real commands in a subprocess, under a harness that makes the hard cases happen on purpose
instead of by timing: the command's SIGTERM handler is called while the Event the command stops on
has its lock held (as when the signal lands inside ``Event.set`` or ``Event.wait``), and a second
SIGTERM is delivered inside the first one's handling. A handler that took that lock would hang the
process for good; the test would see it not exit.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

#: what an operator is promised: the process is gone within this after the first SIGTERM
STOP_LIMIT_S = 10.0
#: how long a command may take to come up on a loaded machine (an event is waited for, not a time)
START_LIMIT_S = 120.0

HARNESS = r"""
import os, signal, sys, threading, time

stoppable = []  # objects the command stops through: each has a stop_event

def remember(cls):
    original = cls.__init__
    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        stoppable.append(self)
    cls.__init__ = init

from deltamirror.producer.service import WatchService
remember(WatchService)
try:
    from deltamirror.consumer.snapshot import SnapshotConsumer
except ImportError:
    SnapshotConsumer = None
else:
    remember(SnapshotConsumer)
    original_run = SnapshotConsumer.run
    def run(self, *args, **kwargs):
        print("HARNESS: consumer running", file=sys.stderr, flush=True)
        return original_run(self, *args, **kwargs)
    SnapshotConsumer.run = run

state = {"depth": 0, "nested": 0}
real_signal = signal.signal

def patched(sig, handler):
    if sig != signal.SIGTERM or not callable(handler):
        return real_signal(sig, handler)
    inner = handler
    def reentrant(signum, frame):
        if state["depth"]:  # the second signal, inside the first one's handling
            state["nested"] += 1
            return inner(signum, frame)
        if not stoppable:
            return inner(signum, frame)
        lock = stoppable[-1].stop_event._cond  # the lock Event.set and Event.wait hold
        state["depth"] += 1
        try:
            with lock:
                inner(signum, frame)
                os.kill(os.getpid(), signal.SIGTERM)
                deadline = time.monotonic() + 5
                while not state["nested"] and time.monotonic() < deadline:
                    pass  # the nested handler runs at the next bytecode boundary
        finally:
            state["depth"] -= 1
        print(f"HARNESS: nested handler calls {state['nested']}", file=sys.stderr, flush=True)
    return real_signal(sig, reentrant)

signal.signal = patched
from deltamirror.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def start(tmp_path: Path, log: Path, *argv: str, harness: bool = True) -> subprocess.Popen[bytes]:
    script = tmp_path / "harness.py"
    script.write_text(HARNESS)
    command = [sys.executable, str(script)] if harness else [sys.executable, "-m", "deltamirror.cli.main"]
    with open(log, "wb") as out:
        return subprocess.Popen(
            [*command, *argv], stdout=out, stderr=out, env={**os.environ, "PYTHONUNBUFFERED": "1"}
        )


def wait_for(condition: Callable[[], bool], what: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_LIMIT_S
    while not condition():
        if proc.poll() is not None:
            raise AssertionError(f"exited {proc.returncode} before {what}:\n{log.read_text()[-3000:]}")
        assert time.monotonic() < deadline, f"not {what} within {START_LIMIT_S} s:\n{log.read_text()[-3000:]}"
        time.sleep(0.05)


def sigterm(proc: subprocess.Popen[bytes], log: Path) -> tuple[int, float, str]:
    """One SIGTERM (the harness adds the second), and how long until the process is gone."""
    began = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(STOP_LIMIT_S + 10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError(
            f"still running {STOP_LIMIT_S + 10:.0f} s after SIGTERM:\n{log.read_text()[-3000:]}"
        ) from None
    return code, time.monotonic() - began, log.read_text()


@pytest.mark.kafka
@pytest.mark.timeout(300)
def test_watch_stops_on_a_second_sigterm_inside_the_first_ones_handling(
    kafka_bootstrap: str, tmp_path: Path, kit: Any, watch_setup: Any
) -> None:
    table = kit.make_table(tmp_path / "t", versions=2)
    setup = watch_setup(kafka_bootstrap, table)
    log = tmp_path / "watch.log"
    proc = start(tmp_path, log, "watch", "--config", str(setup.config))
    wait_for(lambda: "all tables resumed" in log.read_text(), "resumed", proc, log)
    code, took, text = sigterm(proc, log)
    assert code == 0, text
    assert took < STOP_LIMIT_S, f"{took:.1f} s"
    assert "HARNESS: nested handler calls 1" in text
    assert "second stop request" in text


@pytest.mark.kafka
@pytest.mark.timeout(300)
def test_consume_snapshot_stops_on_a_second_sigterm_inside_the_first_ones_handling(
    kafka_bootstrap: str, tmp_path: Path, kit: Any
) -> None:
    topic = kit.unique("actions")
    log = tmp_path / "consume.log"
    argv = ["consume-snapshot", "--bootstrap-servers", kafka_bootstrap, "--topic", topic]
    proc = start(tmp_path, log, *argv, "--state-dir", str(tmp_path / "state"))
    wait_for(lambda: "HARNESS: consumer running" in log.read_text(), "running", proc, log)
    code, took, text = sigterm(proc, log)
    assert code == 0, text
    assert took < STOP_LIMIT_S, f"{took:.1f} s"
    assert "HARNESS: nested handler calls 1" in text


@pytest.fixture
def silent_broker() -> Iterator[tuple[str, threading.Event]]:
    """A TCP port that accepts connections and never answers: a broker that does not answer.
    The event is set once a client has connected."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    server.settimeout(0.2)
    connected = threading.Event()
    done = threading.Event()
    held: list[socket.socket] = []

    def accept() -> None:
        while not done.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            held.append(conn)
            connected.set()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.getsockname()[1]}", connected
    finally:
        done.set()
        thread.join(5)
        for conn in held:
            conn.close()
        server.close()


@pytest.mark.parametrize(
    "command",
    [["consume-snapshot"], ["invalidate", "--exec", "true"]],
    ids=["consume-snapshot", "invalidate"],
)
def test_sigterm_while_a_sasl_consumer_waits_for_a_silent_broker_exits_0_at_once(
    tmp_path: Path, silent_broker: tuple[str, threading.Event], command: list[str]
) -> None:
    """The signal comes while the command still checks its login: it was taken first, so the
    process ends cleanly at once (it had taken nothing yet), not with the default 143."""
    servers, connected = silent_broker
    config = tmp_path / "kafka.yaml"
    kafka = {
        "bootstrap_servers": servers,
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "PLAIN",
        "sasl_username": "u",
        "sasl_password": "p",
    }
    config.write_text(yaml.safe_dump({"kafka": kafka}))
    log = tmp_path / "consumer.log"
    argv = [*command, "--config", str(config), "--topic", "t", "--state-dir", str(tmp_path / "state")]
    proc = start(tmp_path, log, *argv, harness=False)
    wait_for(connected.is_set, "connected", proc, log)
    code, took, text = sigterm(proc, log)
    assert code == 0, text
    assert took < STOP_LIMIT_S, f"{took:.1f} s"
