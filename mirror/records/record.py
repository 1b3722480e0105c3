"""A finished record: what an encoder returns and a producer sends as it is.

Every topic's encoder (:mod:`.actions`, :mod:`.commits`, :mod:`.progress`, :mod:`.signals`,
:mod:`.dead_letters`; row changes and their transaction metadata: :mod:`.row_changes`,
:mod:`.row_records`) returns these, headers and fragments included (:mod:`.fragments`), so that
nothing past the wire package writes a header or a key. One type for every topic: a record of an
encoder that writes to two topics (a version's row changes and its BEGIN/END) names its topic.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .headers import Headers


@dataclass(frozen=True, slots=True)
class Record:
    """One record ready to produce: value (None: a tombstone), key (None: none) and headers (None: none).

    ``topic``: where it goes when its encoder writes to more than one topic (row changes: the
    changes or the transaction topic); None: the one topic of its encoder, which the caller names.
    """

    value: bytes | None
    key: bytes | None
    headers: Headers | None = None
    topic: str | None = None


@dataclass(frozen=True, slots=True)
class KeyedRecords:
    """Consecutive records of one key, columnar: ``values[i]`` goes with the i-th of ``headers``.

    What an encoder of many records returns (a version's actions, a summary split into fragments):
    no Python object per record beyond its value and its header list; ``headers`` may be a lazy
    iterable, taken once by the producer.
    """

    key: bytes
    values: list[bytes]
    headers: Iterable[Headers]

    def __len__(self) -> int:
        return len(self.values)


__all__ = ["KeyedRecords", "Record"]
