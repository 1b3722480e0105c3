"""A delivery attempt has a deadline, and only a whole, valid answer accepts a document.

Real receivers, no mocks: a threaded ``http.server`` that answers byte by byte, cuts its answer
short or speaks something else than HTTP, and real commands that never exit or leave a child
behind. ``timeout_s`` bounds the whole attempt (it was a limit per socket read: a receiver
dripping a 200 one byte every 2 s held an attempt 78 s with ``--timeout 3``, and with it every
later version); a header block cut short was taken as a 200.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from deltamirror.consumer.invalidate import DeliveryAttemptError, ExecTarget, WebhookTarget
from deltamirror.core.errors import ConfigError
from deltamirror.mirror.errors import StopRequested

DOC = {"kind": "version", "tableId": "t-1", "tableUri": "file:///t", "version": 7, "snapshot": False}
BODY = json.dumps(DOC).encode()
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"


class RawReceiver:
    """A threaded http.server whose handler writes ``answer(wfile, gone)`` as raw bytes after
    reading the request; ``gone`` is set when the test is over (a dripping answer stops then)."""

    def __init__(self, answer: Callable[[Any, threading.Event], None]) -> None:
        self.requests = 0
        self.gone = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                receiver.requests += 1
                try:
                    answer(self.wfile, receiver.gone)
                    self.wfile.flush()
                except OSError:  # the client hung up: what a deadline does
                    pass
                self.close_connection = True

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def close(self) -> None:
        self.gone.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def serve() -> Iterator[Callable[[Callable[[Any, threading.Event], None]], RawReceiver]]:
    made: list[RawReceiver] = []

    def make(answer: Callable[[Any, threading.Event], None]) -> RawReceiver:
        made.append(RawReceiver(answer))
        return made[-1]

    yield make
    for receiver in made:
        receiver.close()


def _drip(payload: bytes, every_s: float) -> Callable[[Any, threading.Event], None]:
    """A valid answer, one byte every ``every_s`` (each read of the client gets a byte in time)."""

    def answer(out: Any, gone: threading.Event) -> None:
        for i in range(len(payload)):
            out.write(payload[i : i + 1])
            out.flush()
            if gone.wait(every_s):
                return

    return answer


def test_a_receiver_dripping_a_valid_200_fails_the_attempt_at_its_deadline(serve: Any) -> None:
    # 60 bytes, one every 0.25 s: 15 s in all, each byte well within the 1 s timeout
    receiver = serve(_drip(OK, 0.25))
    target = WebhookTarget(receiver.url, timeout_s=1.0)
    started = time.monotonic()
    with pytest.raises(DeliveryAttemptError, match=r"gave no complete answer within 1 s"):
        target.send(DOC, BODY, 1)
    assert time.monotonic() - started < 5.0  # the deadline, not the receiver, ended the attempt
    assert receiver.requests == 1


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n", "headers cut short"),
        (b"HTTP/1.1 200 OK\r\nContent-Len", "a header line cut short"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", "body shorter than its length"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab", "a chunk cut short"),
        (b"HTTP/1.1 200", "status line cut short"),
        (b"", "nothing at all"),
        (b"OK\r\n\r\n", "not HTTP"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_a_response_cut_short_or_not_http_fails_the_attempt(serve: Any, answer: bytes, why: str) -> None:
    receiver = serve(lambda out, gone: out.write(answer))
    with pytest.raises(DeliveryAttemptError):
        WebhookTarget(receiver.url, timeout_s=10.0).send(DOC, BODY, 1)


@pytest.mark.parametrize(
    "answer",
    [
        OK,
        b"HTTP/1.1 204 No Content\r\n\r\n",
        b"HTTP/1.0 200 OK\r\n\r\nthe body runs to the end of the stream",
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 202 Accepted\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
    ],
)
def test_a_whole_2xx_answer_accepts(serve: Any, answer: bytes) -> None:
    receiver = serve(lambda out, gone: out.write(answer))
    WebhookTarget(receiver.url, timeout_s=10.0).send(DOC, BODY, 1)
    assert receiver.requests == 1


def test_a_whole_error_answer_fails_with_its_status(serve: Any) -> None:
    answer = b"HTTP/1.1 503 Busy\r\nContent-Length: 4\r\n\r\nbusy"
    receiver = serve(lambda out, gone: out.write(answer))
    with pytest.raises(DeliveryAttemptError, match=r"^HTTP 503 Busy$"):
        WebhookTarget(receiver.url, timeout_s=10.0).send(DOC, BODY, 1)


def test_a_stop_ends_an_attempt_in_progress(serve: Any) -> None:
    receiver = serve(_drip(OK, 0.25))
    stop = threading.Event()
    target = WebhookTarget(receiver.url, timeout_s=60.0, stop=stop)
    threading.Timer(0.5, stop.set).start()
    started = time.monotonic()
    with pytest.raises(StopRequested):
        target.send(DOC, BODY, 1)
    assert time.monotonic() - started < 5.0


def test_a_timeout_that_is_not_a_positive_number_is_refused() -> None:
    for bad in (0, -1.0, float("nan"), True, "3"):
        with pytest.raises(ConfigError, match="timeout"):
            WebhookTarget("http://127.0.0.1:1/", timeout_s=bad)  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="timeout"):
            ExecTarget([sys.executable], timeout_s=bad)  # type: ignore[arg-type]


# --- commands -------------------------------------------------------------------------------------------


def _gone(pid: int, within_s: float = 10.0) -> bool:
    """Whether process ``pid`` ends within ``within_s`` (it may take a moment to be reaped)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        with open(f"/proc/{pid}/stat") as stat:
            if stat.read().split(") ", 1)[1].startswith("Z"):  # a zombie: dead, not yet reaped
                return True
        time.sleep(0.05)
    return False


def test_a_command_that_never_exits_is_killed_with_its_children_at_the_deadline(tmp_path: Path) -> None:
    """The command leaves a child that holds its stderr: the attempt ends at the deadline, and
    neither the command nor its child outlives it."""
    pids = tmp_path / "pids"
    script = f"sleep 300 & echo $$ $! > {shlex.quote(str(pids))}; wait"
    target = ExecTarget(["sh", "-c", script], timeout_s=1.0)
    started = time.monotonic()
    with pytest.raises(DeliveryAttemptError, match=r"did not finish within 1 s \(killed\)"):
        target.send(DOC, BODY, 1)
    assert time.monotonic() - started < 5.0
    shell, child = map(int, pids.read_text().split())
    assert _gone(shell) and _gone(child)


def test_a_command_that_does_not_read_its_stdin_is_still_bounded(tmp_path: Path) -> None:
    """A document larger than a pipe holds, to a command that never reads it."""
    target = ExecTarget([sys.executable, "-c", "import time; time.sleep(300)"], timeout_s=1.0)
    started = time.monotonic()
    with pytest.raises(DeliveryAttemptError, match="did not finish"):
        target.send(DOC, b"x" * (4 << 20), 1)
    assert time.monotonic() - started < 5.0


def test_a_stop_ends_a_command_in_progress(tmp_path: Path) -> None:
    stop = threading.Event()
    target = ExecTarget([sys.executable, "-c", "import time; time.sleep(300)"], timeout_s=60.0, stop=stop)
    threading.Timer(0.5, stop.set).start()
    started = time.monotonic()
    with pytest.raises(StopRequested):
        target.send(DOC, BODY, 1)
    assert time.monotonic() - started < 5.0


def test_a_failing_commands_last_stderr_line_is_kept_however_much_it_wrote(tmp_path: Path) -> None:
    code = "import sys; sys.stderr.write('noise\\n' * 200000 + 'the cache is read-only\\n'); sys.exit(3)"
    with pytest.raises(DeliveryAttemptError, match=r"exited with status 3: the cache is read-only$"):
        ExecTarget([sys.executable, "-c", code], timeout_s=30.0).send(DOC, BODY, 1)


# --- a host name that takes long to resolve ---------------------------------------------------------------

#: run in a mount and network namespace of its own, whose /etc/resolv.conf names a DNS server on its
#: loopback that never answers (glibc's real resolver, waiting 30 s per try)
_SLOW_DNS = """
import json, socket, sys, threading, time
from deltamirror.consumer.invalidate import DeliveryAttemptError, WebhookTarget
from deltamirror.mirror.errors import StopRequested
silent = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
silent.bind(("127.0.0.1", 53))  # takes the queries, answers none
target = WebhookTarget("http://hook.deltamirror-test.example/x", timeout_s=1.0)
DOC = {"kind": "version", "tableId": "t-1", "tableUri": "file:///t", "version": 7}
out = {}
for attempt in (1, 2):
    start = time.monotonic()
    try:
        target.send(DOC, b"{}", attempt)
    except DeliveryAttemptError as exc:
        out[f"error{attempt}"] = str(exc)
    out[f"took{attempt}"] = time.monotonic() - start
stop = threading.Event()
stopping = WebhookTarget("http://hook2.deltamirror-test.example/x", timeout_s=60.0, stop=stop)
threading.Timer(0.5, stop.set).start()
start = time.monotonic()
try:
    stopping.send(DOC, b"{}", 1)
except StopRequested:
    out["stopped"] = True
out["stop_took"] = time.monotonic() - start
out["lookup_threads"] = sum(t.name == "deltamirror-webhook-dns" for t in threading.enumerate())
print(json.dumps(out))
"""


def _namespaces_usable() -> bool:
    import shutil
    import subprocess

    if os.geteuid() != 0 or not (shutil.which("unshare") and shutil.which("ip")):
        return False
    done = subprocess.run(["unshare", "--mount", "--net", "true"], capture_output=True)
    return done.returncode == 0


@pytest.mark.skipif(not _namespaces_usable(), reason="needs root, unshare and ip: a resolver of its own")
def test_a_host_name_that_never_resolves_fails_the_attempt_at_its_deadline(tmp_path: Path) -> None:
    import subprocess

    resolv = tmp_path / "resolv.conf"
    resolv.write_text("nameserver 127.0.0.1\noptions timeout:30 attempts:3\n")
    script = tmp_path / "slow_dns.py"
    script.write_text(_SLOW_DNS)
    shell = f"ip link set lo up && mount --bind {shlex.quote(str(resolv))} /etc/resolv.conf && exec {shlex.quote(sys.executable)} {shlex.quote(str(script))}"
    done = subprocess.run(
        ["unshare", "--mount", "--net", "sh", "-c", shell], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.splitlines()[-1])
    for attempt in (1, 2):  # the second attempt waits for the first one's lookup: no second thread
        assert (
            out[f"error{attempt}"]
            == "http://hook.deltamirror-test.example/*** gave no complete answer within 1 s"
        )
        assert out[f"took{attempt}"] < 1.0 + 1.0
    assert out["stopped"] and out["stop_took"] < 0.5 + 1.0
    assert out["lookup_threads"] == 2  # one per target, still waiting on the silent server
