"""The signal topic's records: operators' signals to running watchers, and the watchers' ``done``.

A :class:`Signal` is one JSON record keyed by the table's normalized location (so a ``done``
follows its signal in the topic's one partition), without headers. The topic is input anyone
with write access can fill: :func:`decode_signal` is its one decoder, which refuses a record larger
than :data:`MAX_SIGNAL_BYTES` unread and anything that is not a signal.
"""

from __future__ import annotations

import time
import uuid
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

from .boundary import BadRecordError
from .events import MAX_URI_CHARS
from .record import Record

#: a signal is a few hundred bytes: a larger record is refused unread
MAX_SIGNAL_BYTES = 16_384

SignalKind = Literal["snapshot", "net-changes", "done"]


class Signal(BaseModel):
    """One signal: what to do (``kind``), to which table, when it was asked for (epoch ms).

    ``done`` is written by the instance that acted on the signal of the same ``id``; ``refused``
    (on a ``done``) says why that instance refused it instead. ``net-changes`` names the first
    version of its range (``fromVersion``).
    """

    model_config = ConfigDict(frozen=True, alias_generator=to_camel, populate_by_name=True, extra="ignore")

    kind: SignalKind
    table_uri: str = Field(min_length=1, max_length=MAX_URI_CHARS)
    id: str = Field(min_length=1, max_length=128)
    requested_at: int = Field(ge=0, le=2**63 - 1)
    from_version: int | None = Field(default=None, ge=0, le=2**63 - 1)
    refused: str | None = Field(default=None, max_length=1000)

    def to_json_bytes(self) -> bytes:
        return self.model_dump_json(by_alias=True, exclude_none=True).encode()


def new_signal(
    kind: SignalKind,
    table_uri: str,
    signal_id: str | None = None,
    *,
    from_version: int | None = None,
    refused: str | None = None,
) -> Signal:
    """A signal asked for now: a fresh id (or ``signal_id``: a ``done`` names the signal it answers)."""
    return Signal(
        kind=kind,
        table_uri=table_uri,
        id=signal_id if signal_id is not None else uuid.uuid4().hex,
        requested_at=int(time.time() * 1000),
        from_version=from_version,
        refused=refused[:1000] if refused is not None else None,
    )


def encode_signal(signal: Signal) -> Record:
    """``signal`` as the topic carries it: keyed by its table's location, no headers."""
    return Record(signal.to_json_bytes(), signal.table_uri.encode())


def decode_signal(value: bytes | None) -> Signal:
    """A signal-topic value as its model; anything else is a :class:`~.boundary.BadRecordError`
    whose message says why (the size of a record too large to read, or the first problem)."""
    if value is not None and len(value) > MAX_SIGNAL_BYTES:
        raise BadRecordError(f"{len(value)} bytes; a signal has at most {MAX_SIGNAL_BYTES}")
    try:
        return Signal.model_validate_json(value or b"")
    except ValidationError as exc:
        first = exc.errors(include_url=False, include_input=False)[0]
        where = ".".join(map(str, first["loc"]))
        raise BadRecordError(f"{where}: {first['msg']}" if where else first["msg"]) from None


__all__ = ["MAX_SIGNAL_BYTES", "Signal", "SignalKind", "decode_signal", "encode_signal", "new_signal"]
