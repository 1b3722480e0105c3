"""``deltamirror watch`` with the broker gone: a few warnings in deltamirror's words, and a stop within 10 s.

The real command in a subprocess: what an operator sees is its stderr and how long SIGTERM takes.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from support.kafka import free_port_pair

#: what the issue asks: a SIGTERM stops the watcher within this, whatever the broker does
STOP_LIMIT_S = 10.0
#: how long the command may take to come up on a loaded machine (waited for, never slept)
START_LIMIT_S = 120.0


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_watch(log: Path, *args: str) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "deltamirror.cli.main", "watch", *args],
            stdout=out,
            stderr=out,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )


def sigterm_and_time(proc: subprocess.Popen[bytes]) -> tuple[int, float]:
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(STOP_LIMIT_S + 20)
    finally:
        if proc.poll() is None:
            proc.kill()
    return code, time.monotonic() - started


def json_lines(text: str) -> list[dict[str, Any]]:
    """Every line a JSON log record: deltamirror's own lines, no raw client output."""
    lines = []
    for line in text.splitlines():
        try:
            lines.append(json.loads(line))
        except ValueError:
            raise AssertionError(f"not a deltamirror log line: {line!r}\n{text[-3000:]}") from None
    return lines


@pytest.mark.parametrize(
    ("servers", "reason"),
    [
        (f"127.0.0.1:{closed_port()}", "Connection refused"),
        ("no-such-host.invalid:9092", "cannot resolve the host name"),
    ],
    ids=["closed-port", "unknown-host"],
)
def test_an_unreachable_broker_gives_a_few_warnings_and_sigterm_stops_within_10_s(
    tmp_path: Path, kit: Any, servers: str, reason: str
) -> None:
    table = kit.make_table(tmp_path / "t", versions=1)
    log = tmp_path / "watch.log"
    proc = start_watch(log, "--bootstrap-servers", servers, str(table))
    try:
        # until the first warning is out (however long the process takes to start), not a fixed time
        deadline = time.monotonic() + START_LIMIT_S
        while '"level": "warning"' not in (early := log.read_text().rpartition("\n")[0]):
            assert proc.poll() is None, early
            assert time.monotonic() < deadline, f"no warning within {START_LIMIT_S} s: {early}"
            time.sleep(0.05)
    finally:
        code, took = sigterm_and_time(proc)
    # nothing but deltamirror's JSON lines: no raw librdkafka line ("%3|...|FAIL|rdkafka#producer-1| ...")
    lines = json_lines(early)
    assert "rdkafka" not in early
    warnings = [line for line in lines if line["level"] == "warning"]
    assert 1 <= len(warnings) <= 3, early
    host = servers.rsplit(":", 1)[0]
    assert warnings[0]["msg"].startswith(f"Kafka at {host}"), warnings[0]
    assert reason in warnings[0]["msg"] and warnings[0]["msg"].endswith("; retrying")

    text = log.read_text()
    assert code == 0, text
    assert took < STOP_LIMIT_S, f"SIGTERM took {took:.1f} s"
    uri = f"file://{table}"
    assert f"stopping: abandoned connecting to Kafka for table {uri}; nothing committed is lost" in text, text
    assert json_lines(text)[-1]["msg"] == "stopped"


@pytest.mark.kafka
@pytest.mark.slow
@pytest.mark.isolated  # its own broker, frozen: none of the session's
@pytest.mark.timeout(300)
def test_sigterm_with_the_broker_frozen_mid_transaction_stops_within_10_s_and_loses_nothing(
    tmp_path: Path, kit: Any, watch_setup: Any
) -> None:
    """A broker that stops answering (SIGSTOP: connections hang, nothing is refused) while a
    transaction is open: the hardest case, every Kafka call waits for its whole timeout."""
    from deltamirror.devkafka.broker import LocalKafka

    broker = LocalKafka(port=free_port_pair(), data_dir=tmp_path / "kafka")
    bootstrap = broker.start()
    pid = broker.status()["pid"]
    assert pid is not None
    frozen = False
    try:
        table = kit.make_table(tmp_path / "t", versions=1)
        kit.write_versions(table, 1, 100, 2000)
        # one transaction for everything: it is open for the whole catch-up
        setup = watch_setup(bootstrap, table, txn_max_records=1_000_000, txn_max_ms=600_000)
        log = tmp_path / "watch.log"
        proc = setup.start_process(log=log)
        try:
            deadline = time.monotonic() + 90
            while _uncommitted(kit, setup) == 0:
                assert time.monotonic() < deadline, log.read_text()[-3000:]
                assert proc.poll() is None, log.read_text()[-3000:]
                time.sleep(0.1)
            os.kill(pid, signal.SIGSTOP)
            frozen = True
            time.sleep(1)
        finally:
            code, took = sigterm_and_time(proc)
        text = log.read_text()
        assert code == 0, text[-3000:]
        assert took < STOP_LIMIT_S, f"SIGTERM took {took:.1f} s\n{text[-3000:]}"
        abandoned = [line["msg"] for line in json_lines(text) if "abandoned" in line["msg"]]
        assert len(abandoned) == 1, text[-3000:]
        assert abandoned[0].startswith(
            f"stopping: abandoned the open transaction of table file://{table} version"
        )
        assert abandoned[0].endswith("; nothing committed is lost")

        # the broker comes back: a new watcher publishes everything, exactly once
        os.kill(pid, signal.SIGCONT)
        frozen = False
        restarted = setup.start_process(log=tmp_path / "restart.log")
        try:
            deadline = time.monotonic() + 120
            while _last_summary_version(kit, setup) < 100:
                assert time.monotonic() < deadline, (tmp_path / "restart.log").read_text()[-3000:]
                time.sleep(0.5)
        finally:
            assert kit.stop_process(restarted) == 0
        got = [r.value for r in setup.actions_records()]
        expected = kit.events_output(table)
        assert len(got) == len(expected) and got == expected
    finally:
        if frozen:
            os.kill(pid, signal.SIGCONT)
        broker.stop()


def _uncommitted(kit: Any, setup: Any) -> int:
    """Records of the open transaction on the actions topic (0 before the topic exists)."""
    try:
        return int(kit.uncommitted_records(setup.bootstrap, setup.actions))
    except Exception:
        return 0


def _last_summary_version(kit: Any, setup: Any) -> int:
    records = kit.consume(setup.bootstrap, [setup.commits], idle_s=0.3, timeout_s=10)
    return max((r.json["version"] for r in records if r.headers.get("kind") == b"commit"), default=-1)
