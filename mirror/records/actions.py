"""The actions topic's records, finished: one version's (or snapshot's) values, key and headers.

A record per Delta action, keyed by the table's ``tableId``, with the headers ``version``,
``index`` and ``type`` (and any the caller adds to every record, such as ``clampedFrom``), a value
longer than the topic takes split into fragments or refused (:class:`~.fragments.Oversize`). The
values come from :class:`~.events.EnvelopeEncoder` (the envelope encoded once per version) and the
headers from :func:`~.headers.action_headers`: columnar, no Python object per record beyond its
value and its header list. The one decoder is :func:`~.events.decode_action_event` (and
:mod:`.event_batches` for Arrow).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from .events import EnvelopeEncoder
from .fragments import Oversize
from .headers import HEADER_VERSION, Headers, action_headers
from .record import KeyedRecords


class ActionRecords:
    """Encodes the action records of one version (or snapshot), a batch of consecutive actions at a time."""

    __slots__ = ("_extra", "_oversize", "_version_header", "encoder", "key", "version")

    def __init__(
        self,
        encoder: EnvelopeEncoder,
        *,
        extra_headers: Headers | None = None,
        oversize: Oversize | None = None,
    ) -> None:
        """The records of the version ``encoder`` encodes the values of (its table id is their key)."""
        self.encoder = encoder
        self.key = encoder.table_id.encode()
        self.version = encoder.version
        self._version_header = (HEADER_VERSION, str(encoder.version).encode())
        self._extra: Headers = list(extra_headers or ())
        self._oversize = oversize

    def encode(
        self, start: int, actions: Sequence[tuple[str, bytes | Any]], *, skip: int = 0
    ) -> KeyedRecords:
        """The records of consecutive ``actions`` (type, body: raw JSON bytes or data), the first at
        index ``start``, without their first ``skip`` (records the topic holds already); values
        longer than the topic takes are split or refused as ``oversize`` says."""
        values = self.encoder.encode_many(start, actions)
        headers: Iterable[Headers] = action_headers(self._version_header, start, actions, self._extra)
        if skip:
            values, headers = values[skip:], list(headers)[skip:]
        if self._oversize is not None:
            values, headers = self._oversize.split(values, headers, self.version, start + skip)
        return KeyedRecords(self.key, values, headers)


__all__ = ["ActionRecords"]
