"""Records larger than a topic takes: split into fragments by the producer, joined by every reader.

With the ``split`` oversize policy a value longer than the topic's limit becomes records of one
partition with the same key, in order and in one transaction, each with a ``fragment`` header
``"<i>/<n>"``. With ``fail`` such a value stops the table with :class:`RecordTooLargeError`.

On a topic of one table a record's fragments are consecutive; on a topic shared by many tables
(``topics: shared``, keyed by ``tableId``) another table's transaction may write its records
between them. So readers join fragments per (topic, partition, key) (:class:`KeyedFragments`),
each key's record bounded as one record is (:class:`FragmentAssembler`), and everything held
bounded in total (:class:`~.boundary.RecordLimits`: ``max_pending_records``, ``max_pending_bytes``).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ..errors import EventStreamError, RecordTooLargeError
from .boundary import BadRecordError, RecordLimits, shown
from .headers import HEADER_FRAGMENT, Headers

OversizePolicy = Literal["split", "fail"]

#: the least ``limit`` a value is split at (the least ``max_record_bytes``): every fragment but a
#: record's last is exactly ``limit`` bytes, so a record shorter than this is never the first
#: fragment of one. A reader takes such a record as whole, without reading its headers, when its
#: key holds no record in part (reading a record's headers makes Python objects of all of them:
#: ~3.5 us a record, half of what receiving it costs); checked then as every whole record is.
MIN_FRAGMENT_BYTES = 1024


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
    if policy == "split" and limit < MIN_FRAGMENT_BYTES:  # readers take a shorter record as whole
        raise ValueError(f"values are split at {MIN_FRAGMENT_BYTES} bytes at least, not at {limit}")
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
        #: the refused record's key as read (set by :class:`KeyedFragments`): a reader of many keys
        #: tells whose record it was (``table_id`` in the context is shown, maybe cut)
        self.record_key: bytes | None = None


class FragmentAssembler:
    """Joins the fragment records of the ``split`` oversize policy back into one value.

    Fragments of one value are records of one partition with one key, in order (on a shared topic
    other keys' records may come between them: :class:`KeyedFragments` keeps an assembler per
    key), each with a ``fragment`` header ``"<i>/<n>"``. Feed every record of the key in order;
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

    @property
    def held_bytes(self) -> int:
        """The bytes of the fragments held."""
        return self._bytes

    @property
    def since(self) -> float:
        """When the first fragment held came (by the assembler's clock)."""
        return self._since

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


#: (topic, partition)
Where = tuple[str, int]
#: (topic, partition, key): fragments of one record share them
_Slot = tuple[str, int, bytes | None]


@dataclass(slots=True)
class _Held:
    """A record's fragments taken so far, and the offset of its first."""

    assembler: FragmentAssembler
    first: int


def _has_fragment(headers: Sequence[tuple[str, bytes | str | None]] | None) -> bool:
    return any(name == HEADER_FRAGMENT for name, _ in headers or ())


def _key_text(key: bytes | None) -> str | None:
    return None if key is None else shown(key.decode("utf-8", "replace"))


class KeyedFragments:
    """Fragments of records of many partitions and keys, each record joined on its own.

    The fragments of one record share topic, partition and key and come in order; a shared topic
    may hold other keys' records between them, never the same key's. Each key's record is joined
    by a :class:`FragmentAssembler` (its bounds: ``max_fragments``, ``max_record_bytes``,
    ``fragment_wait_s``); what all keys hold together is bounded too: at most
    ``max_pending_records`` records in part and ``max_pending_bytes`` bytes of their fragments
    (the topics are input: a forged run of first fragments must not grow a reader without end).
    Past a bound the fragment is refused at once with the fragments of its record held before it.

    Every refusal is a :class:`FragmentError` naming topic, partition, the offset of the refused
    record's first fragment, and its key (as ``table_id``: the mirror's records are keyed by it).
    """

    def __init__(
        self, limits: RecordLimits | None = None, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.limits = limits if limits is not None else RecordLimits()
        self._clock = clock
        self._held: dict[_Slot, _Held] = {}
        #: per partition, how many of its keys hold a record in part
        self._partitions: dict[Where, int] = {}
        self._bytes = 0

    def __contains__(self, where: object) -> bool:
        """Whether a record of partition ``where`` (topic, partition) has come in part."""
        return where in self._partitions

    @property
    def partitions_in_part(self) -> Mapping[Where, int]:
        """The partitions with records in part (per partition, how many keys hold one), live: it
        changes as fragments are fed and records joined or refused (a reader's loop binds it once)."""
        return self._partitions

    def __len__(self) -> int:
        """How many records have come in part."""
        return len(self._held)

    @property
    def held_bytes(self) -> int:
        return self._bytes

    def holds(self, where: Where, key: bytes | None) -> bool:
        return (where[0], where[1], key) in self._held

    def starts(self) -> dict[Where, int]:
        """Per partition with records in part, the offset of the oldest one's first fragment: a
        reader that resumes must read from there, or lose that record."""
        out: dict[Where, int] = {}
        for (topic, partition, _), held in self._held.items():
            where = (topic, partition)
            if where not in out or held.first < out[where]:
                out[where] = held.first
        return out

    def clear(self) -> None:
        self._held.clear()
        self._partitions.clear()  # cleared, not replaced: partitions_in_part stays live
        self._bytes = 0

    def feed(
        self,
        where: Where,
        key: bytes | None,
        offset: int,
        value: bytes,
        headers: Sequence[tuple[str, bytes | str | None]] | None,
    ) -> tuple[bytes, int] | None:
        """A record of ``where`` keyed ``key`` at ``offset``, in partition order: (the whole
        value, the offset of its first fragment), or None while its record is incomplete."""
        slot = (where[0], where[1], key)
        held = self._held.get(slot)
        fragment = _has_fragment(headers)
        if held is None:
            if not fragment:
                return value, offset
            if len(self._held) >= self.limits.max_pending_records:
                raise self._refusal(
                    f"a record's first fragment with {len(self._held)} records already in part, as "
                    f"many as a reader holds (max_pending_records {self.limits.max_pending_records})",
                    slot,
                    offset,
                )
        if fragment and self._bytes + len(value) > self.limits.max_pending_bytes:
            size, first = self._bytes + len(value), offset if held is None else held.first
            self._drop(slot)
            raise self._refusal(
                f"the fragments of the records in part would hold {size} bytes with this one, more "
                f"than a reader holds (max_pending_bytes {self.limits.max_pending_bytes})",
                slot,
                first,
            )
        if held is None:
            held = _Held(FragmentAssembler(self.limits, clock=self._clock), offset)
        assembler = held.assembler
        before = assembler.held_bytes
        try:
            whole = assembler.feed(value, headers)
        except FragmentError as exc:
            self._bytes -= before
            self._forget(slot)
            exc.context.update(self._context(slot, held.first))
            exc.record_key = slot[2]
            raise
        self._bytes += assembler.held_bytes - before
        if whole is None:
            if slot not in self._held:
                self._held[slot] = held
                self._partitions[where] = self._partitions.get(where, 0) + 1
            return None
        self._forget(slot)
        return whole, held.first

    def cut_short(self, where: Where, why: str) -> list[FragmentError]:
        """The records of ``where`` held in part, refused (oldest first): ``why`` their last
        fragment never came (the partition ended, say)."""
        slots = sorted((s for s in self._held if s[:2] == where), key=lambda s: self._held[s].first)
        return [self._cut(slot, why) for slot in slots]

    def overdue(self) -> list[FragmentError]:
        """The records whose first fragment waited longer than ``fragment_wait_s`` for their last,
        refused (oldest first)."""
        slots = sorted(
            (s for s, h in self._held.items() if h.assembler.overdue()), key=lambda s: self._held[s].first
        )
        wait = self.limits.fragment_wait_s
        return [self._cut(slot, f"its first fragment waited {wait:.0f} s") for slot in slots]

    def _cut(self, slot: _Slot, why: str) -> FragmentError:
        held = self._held[slot]
        described = held.assembler.describe()
        self._drop(slot)
        return self._refusal(
            f"a record cut short: {described} held, {why} before its last fragment (the watcher writes "
            "a record's fragments in one transaction)",
            slot,
            held.first,
        )

    def _drop(self, slot: _Slot) -> None:
        held = self._held.get(slot)
        if held is not None:
            self._bytes -= held.assembler.held_bytes
            held.assembler.reset()
            self._forget(slot)

    def _forget(self, slot: _Slot) -> None:
        if self._held.pop(slot, None) is not None:
            where = (slot[0], slot[1])
            left = self._partitions[where] - 1
            if left:
                self._partitions[where] = left
            else:
                del self._partitions[where]

    @staticmethod
    def _context(slot: _Slot, offset: int) -> dict[str, Any]:
        # the key is the record's table id (the contract's); "key" would read as a secret's name
        return {"table_id": _key_text(slot[2]), "topic": slot[0], "partition": slot[1], "offset": offset}

    def _refusal(self, message: str, slot: _Slot, offset: int) -> FragmentError:
        refused = FragmentError(message, **self._context(slot, offset))
        refused.record_key = slot[2]
        return refused


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


__all__ = [
    "MIN_FRAGMENT_BYTES",
    "FragmentAssembler",
    "FragmentError",
    "KeyedFragments",
    "Oversize",
    "OversizePolicy",
    "split_oversize",
]
