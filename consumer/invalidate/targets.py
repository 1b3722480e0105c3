"""Where the documents go: a command (:class:`ExecTarget`) or an HTTP endpoint (:class:`WebhookTarget`).

A target makes one attempt per :meth:`~Target.send`: it returns when the document was accepted
and raises :class:`DeliveryAttemptError` (its message without secrets) otherwise; retries are the
caller's (:class:`~.delivery.Invalidator`). Nothing here prints a webhook URL as given: its secret
may be in the userinfo, a ``?token=``, or the path itself (:func:`safe_url`).

``timeout_s`` is a deadline for the whole attempt, not a limit per socket operation or per read:
a host name that takes long to resolve, a receiver that answers one byte at a time, or a command
that never exits, fails the attempt when it is reached (the command and every process it started
are killed; a lookup still going on is left to finish on its one thread, and the next attempt
waits for it instead of starting another). A webhook's answer must be a
complete HTTP response (h11 reads it: status line, headers and body as their framing says); one
cut short, or not HTTP, fails the attempt, whatever status it began with. A ``stop`` event set
during an attempt ends it within a quarter of a second (:class:`StopRequested`: the document was
not handed over).
"""

from __future__ import annotations

import base64
import concurrent.futures
import os
import shlex
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import h11

from deltamirror.core.errors import ConfigError
from deltamirror.core.redact import MASK, redact
from deltamirror.mirror.errors import StopRequested

from .payload import Payload, delivery_id

#: how long one attempt (a command run, an HTTP request) may take, all of it
DEFAULT_TIMEOUT_S = 30.0
#: how often an attempt looks at its deadline and its stop event
_SLICE_S = 0.25
#: the end of a failing command's stderr kept for its error
_STDERR_TAIL = 4096


class DeliveryAttemptError(Exception):
    """One attempt failed; the message says how, without secrets."""


class Target(Protocol):
    """Where documents go: :meth:`send` returns when one was accepted, else raises DeliveryAttemptError."""

    def describe(self) -> str:
        """What it is, fit to print (no secrets)."""
        ...

    def send(self, payload: Payload, body: bytes, attempt: int) -> None: ...


def exec_environment(payload: Mapping[str, Any], attempt: int) -> dict[str, str]:
    """The variables a command gets besides the document on stdin."""
    env = {
        "DELTAMIRROR_KIND": str(payload.get("kind", "")),
        "DELTAMIRROR_TABLE": str(payload.get("tableUri") or ""),
        "DELTAMIRROR_TABLE_ID": str(payload.get("tableId", "")),
        "DELTAMIRROR_DELIVERY_ID": delivery_id(payload),
        "DELTAMIRROR_ATTEMPT": str(attempt),
    }
    if payload.get("kind") == "version":
        env["DELTAMIRROR_VERSION"] = str(payload["version"])
        env["DELTAMIRROR_OPERATION"] = str(payload.get("operation") or "")
        env["DELTAMIRROR_TRUNCATED"] = "1" if payload.get("truncated") else "0"
    else:
        env["DELTAMIRROR_PREVIOUS_TABLE_ID"] = str(payload.get("previousTableId", ""))
    return env


def _check_timeout(timeout_s: float) -> float:
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or not timeout_s > 0:
        raise ConfigError(f"the timeout of an attempt must be more than 0 s, not {timeout_s!r}")
    return float(timeout_s)


class ExecTarget:
    """Runs ``argv`` (no shell) once per attempt, the document as JSON on stdin; exit status 0 accepts.

    Its standard output is discarded; on failure the last line of its stderr is in the error. The
    command runs in a process group of its own: at the deadline the whole group is killed, so a
    command that left a child behind does not hold the attempt past it.
    """

    def __init__(
        self,
        argv: Sequence[str],
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        stop: threading.Event | None = None,
    ) -> None:
        if not argv or not argv[0]:
            raise ConfigError("the command to run is empty")
        if shutil.which(argv[0]) is None:
            raise ConfigError(f"{argv[0]} is not an executable command (PATH, or a path to an executable)")
        self.argv = list(argv)
        self.timeout_s = _check_timeout(timeout_s)
        self.stop = stop or threading.Event()

    @classmethod
    def from_command_line(
        cls, command: str, *, timeout_s: float = DEFAULT_TIMEOUT_S, stop: threading.Event | None = None
    ) -> ExecTarget:
        """A command line split as a POSIX shell would (quotes), but run without a shell."""
        try:
            argv = shlex.split(command)
        except ValueError as exc:
            raise ConfigError(f"the command does not parse: {exc}") from None
        return cls(argv, timeout_s=timeout_s, stop=stop)

    def describe(self) -> str:
        # the program only: an argument may be a token, and nothing marks it as one
        return f"command {redact(os.path.basename(self.argv[0]))}"

    def send(self, payload: Payload, body: bytes, attempt: int) -> None:
        deadline = time.monotonic() + self.timeout_s
        env = {**os.environ, **exec_environment(payload, attempt)}
        with tempfile.TemporaryFile() as stderr:  # a file: however much it writes, nothing grows here
            try:
                proc = subprocess.Popen(
                    self.argv,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.DEVNULL,
                    stderr=stderr,
                    env=env,
                    start_new_session=True,  # its own process group: killed whole at the deadline
                )
            except OSError as exc:
                raise DeliveryAttemptError(f"the command cannot be run: {exc.strerror or exc}") from None
            returncode = self._wait(proc, body, deadline)
            if returncode != 0:
                stderr.seek(max(0, stderr.seek(0, os.SEEK_END) - _STDERR_TAIL))
                lines = stderr.read().decode(errors="replace").strip().splitlines()
                said = f": {redact(lines[-1][:500])}" if lines else ""
                raise DeliveryAttemptError(f"the command exited with status {returncode}{said}")

    def _wait(self, proc: subprocess.Popen[bytes], body: bytes, deadline: float) -> int:
        """Its exit status, once it exited; killed (with its group) at the deadline or a stop."""
        given: bytes | None = body
        while True:
            left = deadline - time.monotonic()
            if self.stop.is_set() or left <= 0:
                _kill_group(proc)
                if self.stop.is_set():
                    raise StopRequested("stop requested")
                raise DeliveryAttemptError(
                    f"the command did not finish within {self.timeout_s:g} s (killed)"
                ) from None
            try:
                proc.communicate(input=given, timeout=min(_SLICE_S, left))
            except subprocess.TimeoutExpired:
                given = None  # communicate goes on writing what it was first given
                continue
            return proc.returncode


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """Kill the command and every process of its group, and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()
    try:
        proc.communicate(timeout=5.0)
    except subprocess.TimeoutExpired:  # not possible after SIGKILL but for an unkillable process
        proc.kill()


def safe_url(url: str) -> str:
    """``url`` fit to print: scheme, host and port; userinfo, path and query values masked.

    A webhook's secret may be anywhere: userinfo, a ``?token=``, or the path itself (Slack's
    ``/services/T../B../<secret>``).
    """
    try:
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return "(a URL that does not parse)"
    if ":" in host:
        host = f"[{host}]"
    netloc = (f"{MASK}@" if parts.username or parts.password else "") + host
    netloc += f":{port}" if port is not None else ""
    path = f"/{MASK}" if parts.path not in ("", "/") else parts.path
    query = "&".join(f"{k}={MASK}" for k, _ in urllib.parse.parse_qsl(parts.query, keep_blank_values=True))
    return redact(urllib.parse.urlunsplit((parts.scheme, netloc, path, query, "")))


class _Deadline(Exception):
    """The attempt's deadline passed."""


class WebhookTarget:
    """POSTs the document (``application/json``) to ``url``; a 2xx status accepts, anything else fails.

    Userinfo in the URL becomes HTTP basic authentication; ``headers`` are added to each request
    (an ``Authorization`` token). Each request names its delivery in ``Idempotency-Key`` and its
    attempt in ``X-DeltaMirror-Attempt``. A redirect is a failure (following it would turn the POST
    into a GET, or carry the body elsewhere). Each attempt is one connection (HTTP/1.1, closed
    after the answer); ``https`` verifies the server with the system's CA certificates.
    """

    def __init__(
        self,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        stop: threading.Event | None = None,
    ) -> None:
        self.display = safe_url(url)
        try:
            parts = urllib.parse.urlsplit(url)
            host = parts.hostname
            port = parts.port
        except ValueError:
            raise ConfigError(f"the webhook URL does not parse: {self.display}") from None
        if parts.scheme not in ("http", "https") or not host:
            raise ConfigError(f"the webhook must be an http:// or https:// URL with a host: {self.display}")
        netloc = (f"[{host}]" if ":" in host else host) + (f":{port}" if port is not None else "")
        self._host, self._port = host, port or (443 if parts.scheme == "https" else 80)
        self._tls = ssl.create_default_context() if parts.scheme == "https" else None
        self._target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self._headers = {
            "Host": netloc,
            "Content-Type": "application/json",
            "User-Agent": "deltamirror-invalidate",
            "Connection": "close",
        }
        if parts.username is not None or parts.password is not None:
            user = urllib.parse.unquote(parts.username or "")
            password = urllib.parse.unquote(parts.password or "")
            token = base64.b64encode(f"{user}:{password}".encode()).decode()
            self._headers["Authorization"] = f"Basic {token}"
        self._headers.update(headers or {})
        self.timeout_s = _check_timeout(timeout_s)
        self.stop = stop or threading.Event()
        #: the host name's lookup (getaddrinfo has no timeout of its own): one at a time, on a daemon
        #: thread (it never holds the exit up), so that the deadline and a stop are seen meanwhile
        self._lookup: concurrent.futures.Future[list[Any]] | None = None

    def describe(self) -> str:
        return f"webhook {self.display}"

    def send(self, payload: Payload, body: bytes, attempt: int) -> None:
        headers = {
            **self._headers,
            "Idempotency-Key": delivery_id(payload),
            "X-DeltaMirror-Attempt": str(attempt),
        }
        deadline = time.monotonic() + self.timeout_s
        try:
            status, reason = self._exchange(body, headers, deadline)
        except _Deadline:
            raise DeliveryAttemptError(
                f"{self.display} gave no complete answer within {self.timeout_s:g} s"
            ) from None
        except h11.RemoteProtocolError as exc:  # cut short, or not HTTP
            raise DeliveryAttemptError(
                f"{self.display} sent a broken HTTP response: {redact(str(exc))[:200]}"
            ) from None
        except ssl.SSLError as exc:
            raise DeliveryAttemptError(
                f"{self.display}: TLS failed: {redact(exc.reason or str(exc))}"
            ) from None
        except OSError as exc:  # refused, reset, no route, unknown host
            raise DeliveryAttemptError(
                f"{self.display} cannot be reached: {redact(exc.strerror or str(exc) or type(exc).__name__)}"
            ) from None
        if not 200 <= status < 300:
            raise DeliveryAttemptError(f"HTTP {status} {redact(reason)[:200]}".rstrip())

    def _exchange(self, body: bytes, headers: Mapping[str, str], deadline: float) -> tuple[int, str]:
        """One request on a new connection; (status, reason) once the whole answer was read."""
        conn = h11.Connection(h11.CLIENT)
        request = h11.Request(
            method="POST",
            target=self._target,
            headers=[*headers.items(), ("Content-Length", str(len(body)))],
        )
        outgoing = conn.send(request) + conn.send(h11.Data(data=body)) + conn.send(h11.EndOfMessage())
        sock = self._connect(deadline)
        try:
            if self._tls is not None:
                sock.settimeout(self._left(deadline))
                sock = self._tls.wrap_socket(sock, server_hostname=self._host)
            sock.settimeout(self._left(deadline))  # sendall's timeout is for all of it
            sock.sendall(outgoing)
            status, reason = 0, ""
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    conn.receive_data(self._receive(sock, deadline))  # b"" at the end of the stream
                elif isinstance(event, h11.Response):
                    status, reason = event.status_code, event.reason.decode("latin-1", "replace")
                elif isinstance(event, h11.EndOfMessage):
                    return status, reason
                elif isinstance(event, h11.ConnectionClosed):
                    raise h11.RemoteProtocolError("the connection closed before an answer")
                # InformationalResponse (100 Continue) and Data (the body, not kept) go on
        except TimeoutError:
            raise _Deadline from None
        finally:
            sock.close()

    def _addresses(self, deadline: float) -> list[Any]:
        """The host's addresses, looked up within the deadline (a lookup left running by an earlier
        attempt is waited for, not started again)."""
        if self._lookup is None:
            self._lookup = self._start_lookup()
        lookup = self._lookup
        while True:
            wait = min(_SLICE_S, self._left(deadline))  # raises at the deadline: the lookup goes on
            try:
                return lookup.result(timeout=wait)
            except concurrent.futures.TimeoutError:
                continue
            finally:
                if lookup.done():  # answered or failed: the next attempt looks up again (DNS changes)
                    self._lookup = None

    def _start_lookup(self) -> concurrent.futures.Future[list[Any]]:
        lookup: concurrent.futures.Future[list[Any]] = concurrent.futures.Future()

        def resolve() -> None:
            try:
                lookup.set_result(socket.getaddrinfo(self._host, self._port, 0, socket.SOCK_STREAM))
            except BaseException as exc:
                lookup.set_exception(exc)

        threading.Thread(target=resolve, name="deltamirror-webhook-dns", daemon=True).start()
        return lookup

    def _connect(self, deadline: float) -> socket.socket:
        """A connection to the first address that takes one, as ``socket.create_connection`` makes
        it, but with the name's lookup inside the deadline too."""
        error: OSError | None = None
        for family, kind, proto, _, address in self._addresses(deadline):
            sock = socket.socket(family, kind, proto)
            try:
                sock.settimeout(self._left(deadline))
                sock.connect(address)
                return sock
            except OSError as exc:
                sock.close()
                if isinstance(exc, TimeoutError):
                    raise
                error = exc
            except BaseException:
                sock.close()
                raise
        raise error or OSError(f"no address for {self._host}")

    def _receive(self, sock: socket.socket, deadline: float) -> bytes:
        """What the server sent next, waiting in slices so that the deadline and a stop are seen."""
        while True:
            sock.settimeout(min(_SLICE_S, self._left(deadline)))
            try:
                return sock.recv(65536)
            except TimeoutError:
                continue  # _left raises once the deadline passed

    def _left(self, deadline: float) -> float:
        if self.stop.is_set():
            raise StopRequested("stop requested")
        left = deadline - time.monotonic()
        if left <= 0:
            raise _Deadline
        return left


__all__ = [
    "DEFAULT_TIMEOUT_S",
    "DeliveryAttemptError",
    "ExecTarget",
    "Target",
    "WebhookTarget",
    "exec_environment",
    "safe_url",
]
