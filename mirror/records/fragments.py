"""Records larger than a topic takes: split into fragments by the producer, joined by every reader.

With the ``split`` oversize policy a value longer than the topic's limit becomes consecutive
records of one partition (same key, same transaction), each with a ``fragment`` header
``"<i>/<n>"``. With ``fail`` such a value stops the table with :class:`RecordTooLargeError`.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ..errors import EventStreamError, RecordTooLargeError
from .boundary import BadRecordError, RecordLimits
from .headers import HEADER_FRAGMENT, Headers

OversizePolicy = Literal["split", "fail"]


def split_oversize(
    values: list[bytes],
    headers: Iterable[Headers],
    limit: int,
    policy: OversizePolicy,
    **where: Any,
) -> tuple[list[bytes], Iterable[Headers]]:
    """``values`` and their headers with every value longer than ``limit`` split into fragments.

    ``where`` names the records for the error of the ``fail`` policy (topic, table, version,
    index of the first value: the index of the failing one is derived from it).
    """
    if not values or max(map(len, values)) <= limit:
        return values, headers
    out_v: list[bytes] = []
    out_h: list[Headers] = []
    first_index = where.pop("index", None)
    topic = where.pop("topic", None)
    for i, (value, hdrs) in enumerate(zip(values, headers, strict=True)):
        if len(value) <= limit:
            out_v.append(value)
            out_h.append(hdrs)
            continue
        if policy == "fail":
            raise RecordTooLargeError(
                f"record of {len(value)} bytes is larger than max_record_bytes ({limit}) for topic "
                f"{topic}; raise the limit or use oversize_policy split",
                index=None if first_index is None else first_index + i,
                **where,
            )
        n = -(-len(value) // limit)
        for j in range(n):
            out_v.append(value[j * limit : (j + 1) * limit])
            out_h.append([*hdrs, (HEADER_FRAGMENT, f"{j}/{n}".encode())])
    return out_v, out_h


@dataclass(frozen=True, slots=True)
class Oversize:
    """What one topic takes (``limit`` bytes a value) and what a longer value becomes (``policy``):
    handed to an encoder, which returns its records split (or raises) accordingly."""

    limit: int
    policy: OversizePolicy
    topic: str
    table: str

    def split(
        self, values: list[bytes], headers: Iterable[Headers], version: int, index: int
    ) -> tuple[list[bytes], Iterable[Headers]]:
        """:func:`split_oversize` of consecutive records of ``version``, the first at ``index``."""
        return split_oversize(
            values,
            headers,
            self.limit,
            self.policy,
            topic=self.topic,
            table=self.table,
            version=version,
            index=index,
        )


class FragmentError(BadRecordError):
    """Fragments that do not make a record a reader takes: missing, out of order, too many, too
    large, or waiting too long for their last. ``keeps_current``: the record being fed was not
    part of the refused ones (a whole record, or the first fragment of another) and may be fed
    again once the assembler was reset (what a reader that skips refused records does)."""

    def __init__(self, message: str, *, keeps_current: bool = False, **context: Any) -> None:
        super().__init__(message, **context)
        self.keeps_current = keeps_current


class FragmentAssembler:
    """Joins the fragment records of the ``split`` oversize policy back into one value.

    Fragments of one value are consecutive records of one partition (same key, same transaction),
    each with a ``fragment`` header ``"<i>/<n>"``. Feed every record of a partition in order;
    :meth:`feed` returns a whole value, or ``None`` while a value is still incomplete. A fragment
    out of order means records were lost or reordered: that is an error, never a guess. What one
    value may take is bounded (``limits``: :class:`~.boundary.RecordLimits`): at most
    ``max_fragments`` fragments, ``max_record_bytes`` bytes joined, and ``fragment_wait_s`` from
    its first fragment to its last (:meth:`overdue`); past a bound the fragments are refused at
    once, not gathered. After a :class:`FragmentError` the assembler holds nothing.
    """

    def __init__(
        self, limits: RecordLimits | None = None, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.limits = limits if limits is not None else RecordLimits()
        self._clock = clock
        self._parts: list[bytes] = []
        self._total = 0
        self._bytes = 0
        self._since = 0.0

    @property
    def pending(self) -> bool:
        """True while a value has come only in part."""
        return bool(self._parts)

    def describe(self) -> str:
        """What is held: ``fragments 0-4 of 999999 (5000000 bytes)``."""
        return f"fragments 0-{len(self._parts) - 1} of {self._total} ({self._bytes} bytes)"

    def reset(self) -> None:
        self._parts, self._total, self._bytes = [], 0, 0

    def overdue(self) -> bool:
        """True when the value held waits for its last fragment longer than ``fragment_wait_s``."""
        return bool(self._parts) and self._clock() - self._since > self.limits.fragment_wait_s

    def feed(self, value: bytes, headers: Sequence[tuple[str, bytes | str | None]] | None) -> bytes | None:
        fragment = next((v for k, v in headers or () if k == HEADER_FRAGMENT), None)
        if fragment is None:
            if self._parts:
                held = self.describe()
                self.reset()
                raise FragmentError(
                    f"a record cut short: {held} held, a whole record came next", keeps_current=True
                )
            return value
        try:
            index, total, text = _fragment_of(fragment)
        except EventStreamError as exc:
            had_parts = bool(self._parts)
            self.reset()
            raise FragmentError(
                exc.message + (" (after a record's first fragments)" if had_parts else "")
            ) from None
        if index != len(self._parts) or (self._parts and total != self._total):
            expected = f"{len(self._parts)}/{self._total or total}"
            restarts = index == 0 and bool(self._parts)
            self.reset()
            raise FragmentError(f"fragment {text} out of order (expected {expected})", keeps_current=restarts)
        limits = self.limits
        if total > limits.max_fragments:
            self.reset()
            raise FragmentError(
                f"fragment {text}: a record of {total} fragments is more than a reader takes "
                f"({limits.max_fragments})"
            )
        if self._bytes + len(value) > limits.max_record_bytes:
            size = self._bytes + len(value)
            self.reset()
            raise FragmentError(
                f"fragment {text}: the record's fragments hold {size} bytes so far, more than a reader "
                f"takes ({limits.max_record_bytes})"
            )
        if not self._parts:
            self._since = self._clock()
        self._parts.append(value)
        self._total = total
        self._bytes += len(value)
        if index + 1 < total:
            return None
        whole = b"".join(self._parts)
        self.reset()
        return whole


_FRAGMENT = re.compile(r"([0-9]{1,9})/([0-9]{1,9})")


def _fragment_of(header: bytes | str) -> tuple[int, int, str]:
    """(index, total, text) of a ``fragment`` header; anything but ``"<i>/<n>"`` with i < n is refused."""
    try:
        text = header.decode("ascii") if isinstance(header, bytes) else str(header)
    except UnicodeDecodeError:
        raise EventStreamError(f"malformed fragment header {header!r}: not ASCII text") from None
    match = _FRAGMENT.fullmatch(text)
    if match is None or not int(match[1]) < int(match[2]):
        raise EventStreamError(f"malformed fragment header {text[:40]!r}: expected <index>/<count>")
    return int(match[1]), int(match[2]), text


__all__ = ["FragmentAssembler", "FragmentError", "Oversize", "OversizePolicy", "split_oversize"]
