"""Where the documents go: a command (:class:`ExecTarget`) or an HTTP endpoint (:class:`WebhookTarget`).

A target makes one attempt per :meth:`~Target.send`: it returns when the document was accepted
and raises :class:`DeliveryAttemptError` (its message without secrets) otherwise; retries are the
caller's (:class:`~.delivery.Invalidator`). Nothing here prints a webhook URL as given: its secret
may be in the userinfo, a ``?token=``, or the path itself (:func:`safe_url`).
"""

from __future__ import annotations

import base64
import os
import shlex
import shutil
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from http.client import HTTPException
from typing import Any, Protocol

from deltamirror.core.errors import ConfigError
from deltamirror.core.redact import MASK, redact

from .payload import Payload, delivery_id

#: how long one attempt (a command run, an HTTP request) may take
DEFAULT_TIMEOUT_S = 30.0


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


class ExecTarget:
    """Runs ``argv`` (no shell) once per attempt, the document as JSON on stdin; exit status 0 accepts.

    The command's output is captured: on failure the last line of its stderr is in the error.
    """

    def __init__(self, argv: Sequence[str], *, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        if not argv or not argv[0]:
            raise ConfigError("the command to run is empty")
        if shutil.which(argv[0]) is None:
            raise ConfigError(f"{argv[0]} is not an executable command (PATH, or a path to an executable)")
        self.argv = list(argv)
        self.timeout_s = timeout_s

    @classmethod
    def from_command_line(cls, command: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> ExecTarget:
        """A command line split as a POSIX shell would (quotes), but run without a shell."""
        try:
            argv = shlex.split(command)
        except ValueError as exc:
            raise ConfigError(f"the command does not parse: {exc}") from None
        return cls(argv, timeout_s=timeout_s)

    def describe(self) -> str:
        # the program only: an argument may be a token, and nothing marks it as one
        return f"command {redact(os.path.basename(self.argv[0]))}"

    def send(self, payload: Payload, body: bytes, attempt: int) -> None:
        env = {**os.environ, **exec_environment(payload, attempt)}
        try:
            done = subprocess.run(
                self.argv, input=body, capture_output=True, timeout=self.timeout_s, env=env, check=False
            )
        except subprocess.TimeoutExpired:
            raise DeliveryAttemptError(f"the command did not finish within {self.timeout_s:g} s") from None
        except OSError as exc:
            raise DeliveryAttemptError(f"the command cannot be run: {exc.strerror or exc}") from None
        if done.returncode != 0:
            lines = done.stderr.decode(errors="replace").strip().splitlines()
            said = f": {redact(lines[-1][:500])}" if lines else ""
            raise DeliveryAttemptError(f"the command exited with status {done.returncode}{said}")


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


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is a failure: following it would turn the POST into a GET, or carry the body elsewhere."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


class WebhookTarget:
    """POSTs the document (``application/json``) to ``url``; a 2xx status accepts, anything else fails.

    Userinfo in the URL becomes HTTP basic authentication; ``headers`` are added to each request
    (an ``Authorization`` token). Each request names its delivery in ``Idempotency-Key`` and its
    attempt in ``X-DeltaMirror-Attempt``.
    """

    def __init__(
        self, url: str, *, headers: Mapping[str, str] | None = None, timeout_s: float = DEFAULT_TIMEOUT_S
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
        self._headers = {"Content-Type": "application/json", "User-Agent": "deltamirror-invalidate"}
        if parts.username is not None or parts.password is not None:
            user = urllib.parse.unquote(parts.username or "")
            password = urllib.parse.unquote(parts.password or "")
            token = base64.b64encode(f"{user}:{password}".encode()).decode()
            self._headers["Authorization"] = f"Basic {token}"
        self._headers.update(headers or {})
        netloc = (f"[{host}]" if ":" in host else host) + (f":{port}" if port is not None else "")
        self._url = urllib.parse.urlunsplit((parts.scheme, netloc, parts.path or "/", parts.query, ""))
        self._opener = urllib.request.build_opener(_NoRedirect)
        self.timeout_s = timeout_s

    def describe(self) -> str:
        return f"webhook {self.display}"

    def send(self, payload: Payload, body: bytes, attempt: int) -> None:
        headers = {
            **self._headers,
            "Idempotency-Key": delivery_id(payload),
            "X-DeltaMirror-Attempt": str(attempt),
        }
        request = urllib.request.Request(self._url, data=body, headers=headers, method="POST")
        try:
            with self._opener.open(request, timeout=self.timeout_s) as response:
                status = int(response.status)
                response.read(65536)
        except urllib.error.HTTPError as exc:
            exc.close()
            raise DeliveryAttemptError(f"HTTP {exc.code} {redact(str(exc.reason))[:200]}") from None
        except urllib.error.URLError as exc:
            raise DeliveryAttemptError(
                f"{self.display} cannot be reached: {redact(str(exc.reason))}"
            ) from None
        except (OSError, HTTPException) as exc:  # a timeout, a connection reset, a broken response
            raise DeliveryAttemptError(
                f"{self.display} failed: {redact(str(exc) or type(exc).__name__)}"
            ) from None
        if not 200 <= status < 300:
            raise DeliveryAttemptError(f"HTTP {status}")


__all__ = [
    "DEFAULT_TIMEOUT_S",
    "DeliveryAttemptError",
    "ExecTarget",
    "Target",
    "WebhookTarget",
    "exec_environment",
    "safe_url",
]
