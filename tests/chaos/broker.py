"""The campaign's broker: ``deltamirror local kafka`` on free ports in a temporary data dir.

Started, stopped and restarted through the CLI only; killed with SIGKILL by the pid the CLI prints.
The broker's transaction timeout bound (``transaction.max.timeout.ms``) is Kafka's default (15 min):
the campaign lowers the watchers' own ``transaction.timeout.ms`` instead, in their configuration.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from support.kafka import free_port_pair

CLI = [sys.executable, "-m", "deltamirror.cli.main"]


def cli(*args: str, timeout_s: float = 240) -> subprocess.CompletedProcess[str]:
    """``deltamirror ARGS`` in a child process; its output captured."""
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout_s, check=False)


class Broker:
    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.port = free_port_pair()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.pid: int | None = None

    def _args(self) -> list[str]:
        return ["--port", str(self.port), "--data-dir", str(self.data_dir)]

    def start(self) -> None:
        done = cli("local", "kafka", "start", *self._args())
        if done.returncode != 0:
            raise RuntimeError(f"local kafka start exited {done.returncode}: {done.stderr.strip()[-2000:]}")
        found = re.search(r"\(pid (\d+)", done.stdout)
        if found is None:
            raise RuntimeError(f"local kafka start printed no pid: {done.stdout!r}")
        self.pid = int(found.group(1))

    def stop(self) -> None:
        done = cli("local", "kafka", "stop", *self._args())
        if done.returncode != 0:
            raise RuntimeError(f"local kafka stop exited {done.returncode}: {done.stderr.strip()[-2000:]}")
        self.pid = None

    def kill9(self) -> None:
        """SIGKILL the broker's JVM and wait until it is gone."""
        assert self.pid is not None, "the broker is not running"
        os.kill(self.pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while _alive(self.pid):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the broker (pid {self.pid}) survived SIGKILL for 30 s")
            time.sleep(0.1)
        self.pid = None

    def skipped_markers(self, topic_prefix: str) -> list[str]:
        """The broker's own word that it dropped the commit or abort markers of a transaction on
        these topics' partitions (it found no leader for them while it was starting): those
        partitions then hold a transaction that never ends (see docs/chaos.md)."""
        log = self.data_dir / "server.log"
        if not log.is_file():
            return []
        found = []
        for line in log.read_text(errors="replace").splitlines():
            if "Couldn't find leader endpoint for partitions" in line and topic_prefix in line:
                found.append(line[:400])
        return found

    def abort_hanging(self) -> list[str]:
        """What an operator does about a hanging transaction on the local broker:
        ``deltamirror local kafka abort-hanging``; its lines (one per transaction aborted)."""
        done = cli("local", "kafka", "abort-hanging", *self._args())
        if done.returncode != 0:
            raise RuntimeError(
                f"local kafka abort-hanging exited {done.returncode}: {done.stderr.strip()[-2000:]}"
            )
        return [line for line in done.stdout.splitlines() if line.startswith("aborted: ")]

    def running(self) -> bool:
        return cli("local", "kafka", "status", *self._args()).returncode == 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is gone for our purposes (the CLI that launched it has exited: init reaps it)
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False
