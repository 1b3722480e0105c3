"""The CLI processes of a campaign (``deltamirror watch``, ``consume-snapshot``, ``invalidate``):
started as children with their JSON log lines in a file, signalled by pid, read back as evidence."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from chaos.broker import CLI


class Proc:
    """One CLI process; every start of it appends to the same log file."""

    def __init__(self, name: str, argv: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.name = name
        self.argv = argv
        self.log = log
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.popen: subprocess.Popen[bytes] | None = None
        self.starts = 0
        #: exit codes of the runs that ended (a kill is -9)
        self.exits: list[int] = []

    def start(self) -> Proc:
        assert not self.alive(), f"{self.name} already runs"
        with open(self.log, "ab") as out:
            out.write(f'{{"chaos":"start","n":{self.starts}}}\n'.encode())
            out.flush()
            self.popen = subprocess.Popen([*CLI, *self.argv], stdout=out, stderr=out, env=self.env)
        self.starts += 1
        return self

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def _reap(self, timeout_s: float) -> int:
        assert self.popen is not None
        code = self.popen.wait(timeout_s)
        self.exits.append(code)
        return code

    def kill9(self) -> int:
        os.kill(self.pid, signal.SIGKILL)
        return self._reap(30)

    def pause(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.pid, signal.SIGCONT)

    def terminate(self, timeout_s: float = 60) -> int:
        """SIGTERM and its exit code (SIGKILL, -9, past ``timeout_s``)."""
        if not self.alive():
            assert self.popen is not None
            code = self.popen.returncode
            if not self.exits or self.exits[-1] != code:
                self.exits.append(code)
            return code
        self.popen.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
        try:
            return self._reap(timeout_s)
        except subprocess.TimeoutExpired:
            return self.kill9()

    def wait_exit(self, timeout_s: float) -> int | None:
        """The exit code once it exits by itself within ``timeout_s``, else None."""
        try:
            return self._reap(timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def lines(self, since_start: int | None = None) -> list[dict[str, Any]]:
        """The JSON log lines (others as ``{"raw": text}``), of the ``since_start``-th run on if given."""
        out: list[dict[str, Any]] = []
        run = -1
        for raw in self.log.read_text(errors="replace").splitlines():
            try:
                line = json.loads(raw)
            except ValueError:
                line = {"raw": raw}
            if not isinstance(line, dict):
                line = {"raw": raw}
            if line.get("chaos") == "start":
                run = int(line["n"])
                continue
            if since_start is None or run >= since_start:
                out.append(line)
        return out

    def run_lines(self, n: int) -> list[dict[str, Any]]:
        """The JSON log lines of the ``n``-th run only."""
        out: list[dict[str, Any]] = []
        run = -1
        for raw in self.log.read_text(errors="replace").splitlines():
            try:
                line = json.loads(raw)
            except ValueError:
                line = {"raw": raw}
            if isinstance(line, dict) and line.get("chaos") == "start":
                run = int(line["n"])
            elif run == n:
                out.append(line if isinstance(line, dict) else {"raw": raw})
        return out

    def tracebacks(self) -> list[str]:
        """Log lines that carry a traceback: always a defect."""
        found = []
        for line in self.lines():
            if "traceback" in line or "Traceback (most recent call last)" in line.get("raw", ""):
                found.append(json.dumps(line)[:600])
        return found


def wait_for(condition: Callable[[], Any], timeout_s: float, what: str, every_s: float = 0.1) -> Any:
    """Poll ``condition`` until it returns something true; raises TimeoutError naming ``what``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(every_s)


def poll_until(condition: Callable[[], Any], timeout_s: float, every_s: float = 0.1) -> bool:
    """Whether ``condition`` became true within ``timeout_s`` (for a fault that may also come
    without it: the evidence then says where it hit)."""
    try:
        wait_for(condition, timeout_s, "a condition", every_s)
    except TimeoutError:
        return False
    return True


def watch_argv(config: Path, *extra: str) -> list[str]:
    return ["watch", "--config", str(config), "--no-progress", *extra]


PYTHON = sys.executable
