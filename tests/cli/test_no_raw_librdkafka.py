"""No command prints a raw librdkafka line (``%3|…|FAIL|…``), even with its broker gone.

Every command that takes a broker is run, as an operator runs it, against an address where nothing
listens, until it has said in its own words that the broker does not answer (or has exited); then
its stderr holds no line in librdkafka's own format. The commands are enumerated from the parser,
so a new one must be added here (or to the commands that reach no broker) the day it is added.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from deltamirror.cli.main import build_parser

pytestmark = pytest.mark.slow

#: librdkafka's own log line: ``%<syslog level>|<seconds>|<facility>|<client>| …``
RAW_LINE = re.compile(r"^%\d+\|")
#: at most this long for a command to say that its broker does not answer
SAY_WITHIN_S = 60.0

#: commands that never reach a broker
NO_BROKER = {
    ("snapshot",),
    ("read",),
    ("history",),
    ("changes",),
    ("events",),
    ("schema",),
    ("local", "kafka", "start"),  # starts its own
    ("local", "kafka", "stop"),
    ("local", "registry", "start"),  # a Schema Registry: no Kafka client in it
    ("local", "registry", "stop"),
    ("local", "registry", "status"),
}


@dataclass
class DeadBrokerRun:
    argv: list[str]
    #: a pattern of the stderr line saying the broker does not answer; None: wait for the command to exit
    says: str | None
    env: dict[str, str] = field(default_factory=dict)
    #: how soon the line must come (a consumer once said nothing for 60 s: two metadata timeouts)
    within_s: float = SAY_WITHIN_S


def leaf_commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield path
    for action in subs:
        for name, child in action.choices.items():
            yield from leaf_commands(child, (*path, name))


def dead_address() -> str:
    """An address where nothing listens (a port taken and released)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


def runs(tmp_path: Path) -> dict[tuple[str, ...], DeadBrokerRun]:
    dead = dead_address()
    port = dead.rsplit(":", 1)[1]
    lake = tmp_path / "lake"
    lake.mkdir()
    import pyarrow as pa
    from deltalake import write_deltalake

    table = lake / "t"
    write_deltalake(str(table), pa.table({"x": [1]}))
    config = tmp_path / "watch.yaml"
    config.write_text(
        f"kafka: {{bootstrap_servers: '{dead}'}}\n"
        f"tables: ['{table}']\ndiscover: ['{lake}']\ngroup: g\nbroker_timeout_s: 1\n"
    )
    unreachable = "unreachable|transport failure"
    return {
        # one watcher with a table, a discover prefix (its progress reader) and a group (its consumer)
        ("watch",): DeadBrokerRun(["watch", "--config", str(config)], "has not answered"),
        ("demo",): DeadBrokerRun(
            ["demo", "--dir", str(tmp_path / "demo")], unreachable, {"KAFKA_BOOTSTRAP_SERVERS": dead}
        ),
        ("consume-snapshot",): DeadBrokerRun(
            ["consume-snapshot", "--bootstrap-servers", dead, "--topic", "t.actions"],
            unreachable,
            within_s=15.0,
        ),
        ("invalidate",): DeadBrokerRun(
            ["invalidate", "--bootstrap-servers", dead, "--topic", "t.actions", "--exec", "true"],
            unreachable,
            within_s=15.0,
        ),
        ("signal", "snapshot"): DeadBrokerRun(
            ["signal", "snapshot", str(table), "--bootstrap-servers", dead, "--timeout", "2"], None
        ),
        ("signal", "net-changes"): DeadBrokerRun(
            [
                "signal",
                "net-changes",
                str(table),
                "--from-version",
                "0",
                "--bootstrap-servers",
                dead,
                "--timeout",
                "2",
            ],
            None,
        ),
        ("local", "kafka", "status"): DeadBrokerRun(["local", "kafka", "status", "--port", port], None),
        ("local", "kafka", "abort-hanging"): DeadBrokerRun(
            ["local", "kafka", "abort-hanging", "--port", port, "--data-dir", str(tmp_path / "kafka")], None
        ),
    }


def test_every_command_is_run_against_a_dead_broker_or_reaches_none(tmp_path: Path) -> None:
    commands = set(leaf_commands(build_parser()))
    assert commands == set(runs(tmp_path)) | NO_BROKER
    for command in NO_BROKER:  # their flags name no broker
        parser = build_parser()
        for name in command:
            parser = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[
                name
            ]
        assert not {"--bootstrap-servers", "--config"} & {
            o for a in parser._actions for o in a.option_strings
        }


def _run(run: DeadBrokerRun, tmp_path: Path) -> tuple[list[str], int]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "deltamirror.cli.main", *run.argv],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **run.env},
        cwd=tmp_path,
    )
    lines: list[str] = []
    said = threading.Event()

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line.rstrip("\n"))
            if run.says is not None and re.search(run.says, line):
                said.set()
        said.set()  # the command ended

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert said.wait(run.within_s), (
            f"{run.argv[0]} said nothing of its dead broker within {run.within_s:.0f} s: {lines[-5:]}"
        )
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        code = proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(10)
    return lines, code


COMMANDS = [
    ("watch",),
    ("demo",),
    ("consume-snapshot",),
    ("invalidate",),
    ("signal", "snapshot"),
    ("signal", "net-changes"),
    ("local", "kafka", "status"),
    ("local", "kafka", "abort-hanging"),
]


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_a_dead_broker_never_shows_a_raw_librdkafka_line(command: tuple[str, ...], tmp_path: Path) -> None:
    run = runs(tmp_path)[command]
    lines, code = _run(run, tmp_path)
    raw = [line for line in lines if RAW_LINE.match(line)]
    assert not raw, f"{' '.join(command)} printed {len(raw)} raw librdkafka lines, first: {raw[0]}"
    assert not any("Traceback" in line for line in lines), "\n".join(lines)
    assert code in (0, 1, 3, 130, 143), (code, lines[-5:])
    if run.says is not None:
        assert any(re.search(run.says, line) for line in lines)


def test_the_commands_run_here_are_those_that_reach_a_broker(tmp_path: Path) -> None:
    assert set(COMMANDS) == set(runs(tmp_path))
