"""The local services' processes (the Kafka broker, the Schema Registry): one set of helpers to
find, check and stop a JVM this package started, whatever it runs."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import ClassVar

from deltamirror.core.errors import DeltaMirrorError
from deltamirror.devkafka.jars import exclusive_lock

log = logging.getLogger(__name__)

HOST = "127.0.0.1"


def port_is_free(port: int) -> bool:
    # SO_REUSEADDR like the JVM's server sockets, so TIME_WAIT leftovers do not count as "in use".
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


def process_alive(pid: int) -> bool:
    # If we are the parent (the service was started by this process), reap it: a zombie is dead.
    with contextlib.suppress(ChildProcessError):
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie of another parent is dead too
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def command_line(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        pass
    try:
        out = subprocess.run(
            ["ps", "-o", "command=", "-p", str(pid)], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


def wait_exit(pid: int, process: subprocess.Popen[bytes] | None, timeout: float) -> bool:
    """Whether ``pid`` (``process`` when this process started it) exited within ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.pid == pid:
            if process.poll() is not None:
                return True
        elif not process_alive(pid):
            return True
        time.sleep(0.1)
    return False


def terminate(
    pid: int,
    process: subprocess.Popen[bytes] | None,
    timeout: float,
    *,
    name: str,
    pid_file: Path,
    error: type[DeltaMirrorError],
) -> None:
    """SIGTERM, then SIGKILL (its process group too) after ``timeout``; ``error`` if it survives."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    if wait_exit(pid, process, timeout):
        return
    log.warning("%s (pid %d) ignored SIGTERM for %.0f s; killing it", name, pid, timeout)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    if not wait_exit(pid, process, 10.0):
        raise error(f"{name} (pid {pid}) survived SIGKILL", file=str(pid_file))


class LocalJvmService:
    """What the local broker and the local registry share: a JVM started in a new session for a data
    dir, its pid kept in a file there, found again by a later process (``deltamirror local ... stop``)
    and stopped with SIGTERM, then SIGKILL.

    A subclass names its pid file, what it is called in messages, the error it raises, and how its
    command line shows the data dir (a pid can be reused after a reboot: only a JVM started for this
    data dir is ours)."""

    PID_FILE: ClassVar[str]
    SERVICE_NAME: ClassVar[str]
    ERROR: ClassVar[type[DeltaMirrorError]]
    STOP_TIMEOUT_S: ClassVar[float] = 30.0

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir.expanduser().resolve()
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def pid_file(self) -> Path:
        return self.data_dir / self.PID_FILE

    def _owns(self, cmdline: str) -> bool:
        """Whether a live process's command line is this data dir's JVM."""
        raise NotImplementedError

    def stop(self, timeout: float | None = None) -> None:
        """SIGTERM (the JVM shuts down cleanly), SIGKILL after ``timeout`` (``STOP_TIMEOUT_S``)."""
        with exclusive_lock(self.data_dir / ".lock"):
            pid = self._running_pid()
            if pid is not None:
                self._terminate(pid, self.STOP_TIMEOUT_S if timeout is None else timeout)
            self.pid_file.unlink(missing_ok=True)
            self._process = None

    def _running_pid(self) -> int | None:
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        if self._process is not None and self._process.pid == pid:
            return pid if self._process.poll() is None else None
        if not process_alive(pid):
            return None
        cmdline = command_line(pid)
        if cmdline is not None and not self._owns(cmdline):
            return None
        return pid

    def _spawn(self, command: list[str], output: Path) -> None:
        """Start ``command`` in the data dir, its output appended to ``output``, and keep its pid."""
        with output.open("ab") as out:
            # a new session: the service outlives this Python process and ignores its Ctrl-C
            self._process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.data_dir,
                start_new_session=True,
            )
        self.pid_file.write_text(f"{self._process.pid}\n", encoding="utf-8")

    def _terminate(self, pid: int, timeout: float | None = None) -> None:
        terminate(
            pid,
            self._process,
            self.STOP_TIMEOUT_S if timeout is None else timeout,
            name=self.SERVICE_NAME,
            pid_file=self.pid_file,
            error=self.ERROR,
        )


__all__ = ["LocalJvmService", "command_line", "port_is_free", "process_alive", "terminate", "wait_exit"]
