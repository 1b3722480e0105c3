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

from deltamirror.core.errors import DeltaMirrorError

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


__all__ = ["command_line", "port_is_free", "process_alive", "terminate", "wait_exit"]
