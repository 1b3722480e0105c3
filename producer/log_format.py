"""The watcher's logs: one JSON object per line on stderr, every text redacted.

An operator's log pipeline parses these lines, so their shape is part of the interface: ``ts``
(the one timestamp layout of every output), ``level``, ``logger``, ``msg``, then the record's extra
fields (``table``, ``version``...). A table URI or a library's error message may carry credentials,
hence the redaction here and not at each call site. librdkafka's own lines reach the
``deltamirror.librdkafka`` logger and so the same handler.
"""

from __future__ import annotations

import json
import logging
import sys
import traceback
from typing import IO, Any

from deltamirror.core.errors import DeltaMirrorError
from deltamirror.core.redact import RedactingFilter, redact
from deltamirror.core.timestamps import format_iso

_STANDARD_ATTRS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


class JsonLogFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, and the record's extra fields (table, version...).

    Every text is redacted (URL userinfo, values of secret-named keys), whoever attached this
    formatter: a table URI or a library's error message may carry credentials.
    """

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": format_iso(int(record.created * 1000)),  # the one timestamp layout of every output
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": redact(record.getMessage()),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD_ATTRS and not key.startswith("_"):
                out[key] = value if isinstance(value, int | float | bool | type(None)) else redact(str(value))
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            out["error"] = redact(str(exc))
            out["errorType"] = type(exc).__name__
            if not isinstance(exc, DeltaMirrorError):
                out["traceback"] = redact("".join(traceback.format_exception(*record.exc_info)))
        return json.dumps(out, default=str)


class StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A StreamHandler writing to ``sys.stderr`` as it is when a record comes, not as it was when
    logging was set up: a command run in-process by a caller that swaps stderr for a while (a test's
    capture, an embedding application) must not leave a handler writing to a stream closed since."""

    def __init__(self) -> None:
        logging.Handler.__init__(self)

    @property
    def stream(self) -> IO[str]:
        return sys.stderr

    @stream.setter
    def stream(self, value: IO[str]) -> None:  # StreamHandler.setStream: stderr is always the current one
        pass


def configure_logging(level: int = logging.INFO, stream: IO[str] | None = None) -> None:
    """JSON lines on stderr (``stream`` instead, when given) for the ``deltamirror`` loggers
    (librdkafka's go through them too)."""
    handler = logging.StreamHandler(stream) if stream is not None else StderrHandler()
    handler.setFormatter(JsonLogFormatter())
    handler.addFilter(RedactingFilter())
    root = logging.getLogger("deltamirror")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False


__all__ = ["JsonLogFormatter", "StderrHandler", "configure_logging"]
