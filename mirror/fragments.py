"""Records larger than a topic takes: split into fragments by the producer, joined by every reader.

With the ``split`` oversize policy a value longer than the topic's limit becomes consecutive
records of one partition (same key, same transaction), each with a ``fragment`` header
``"<i>/<n>"``. With ``fail`` such a value stops the table with :class:`RecordTooLargeError`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any, Literal

from .errors import EventStreamError, RecordTooLargeError
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


class FragmentAssembler:
    """Joins the fragment records of the ``split`` oversize policy back into one value.

    Fragments of one value are consecutive records of one partition (same key, same transaction),
    each with a ``fragment`` header ``"<i>/<n>"``. Feed every record of a partition in order;
    :meth:`feed` returns a whole value, or ``None`` while a value is still incomplete. A fragment
    out of order means records were lost or reordered: that is an error, never a guess.
    """

    def __init__(self) -> None:
        self._parts: list[bytes] = []
        self._total = 0

    def feed(self, value: bytes, headers: Sequence[tuple[str, bytes | str | None]] | None) -> bytes | None:
        fragment = next((v for k, v in headers or () if k == HEADER_FRAGMENT), None)
        if fragment is None:
            if self._parts:
                raise EventStreamError(
                    f"fragment {len(self._parts)}/{self._total} missing: a whole record came next"
                )
            return value
        index, total, text = _fragment_of(fragment)
        if index != len(self._parts) or (self._parts and total != self._total):
            raise EventStreamError(
                f"fragment {text} out of order (expected {len(self._parts)}/{self._total or total})"
            )
        self._parts.append(value)
        self._total = total
        if index + 1 < total:
            return None
        whole, self._parts, self._total = b"".join(self._parts), [], 0
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


__all__ = ["FragmentAssembler", "OversizePolicy", "split_oversize"]
