"""What an applied version changed (:class:`Invalidation`), its lists kept in Arrow until read."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import overload

import pyarrow as pa

from deltamirror.core.partitions import distinct_partitions


class Paths(Sequence[str]):
    """File paths held in Arrow: a Python string is made only for a path read (a snapshot's
    ``added`` names every active file). Compares equal to a tuple or list of the same paths."""

    __slots__ = ("_paths",)

    def __init__(self, paths: pa.Array | pa.ChunkedArray | Iterable[str] = ()) -> None:
        if not isinstance(paths, pa.Array | pa.ChunkedArray):
            paths = pa.array(list(paths), pa.string())
        self._paths = paths

    def __len__(self) -> int:
        return len(self._paths)

    @overload
    def __getitem__(self, item: int) -> str: ...

    @overload
    def __getitem__(self, item: slice) -> tuple[str, ...]: ...

    def __getitem__(self, item: int | slice) -> str | tuple[str, ...]:
        n = len(self._paths)
        if isinstance(item, slice):
            start, stop, step = item.indices(n)
            if step == 1:
                return tuple(self._paths.slice(start, max(0, stop - start)).to_pylist())
            return tuple(self._paths.take(pa.array(range(start, stop, step), pa.int64())).to_pylist())
        at = item + n if item < 0 else item
        if not 0 <= at < n:
            raise IndexError("path index out of range")
        return str(self._paths[at].as_py())

    def __iter__(self) -> Iterator[str]:
        for start in range(0, len(self._paths), 4096):
            yield from self._paths.slice(start, 4096).to_pylist()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Paths | tuple | list):
            return len(other) == len(self) and list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        if len(self) <= 8:
            return repr(tuple(self))
        return f"Paths({len(self)} paths: {self[0]!r}, {self[1]!r}, ...)"

    def to_arrow(self) -> pa.Array:
        paths = self._paths
        return paths.combine_chunks() if isinstance(paths, pa.ChunkedArray) else paths


class Partitions(Sequence[dict[str, str | None]]):
    """The distinct ``partitionValues`` of a version's files, found (in Arrow) when first read."""

    __slots__ = ("__dict__", "_values")

    def __init__(self, values: pa.ChunkedArray) -> None:
        self._values = values

    @cached_property
    def _found(self) -> tuple[dict[str, str | None], ...]:
        return tuple(distinct_partitions(self._values, keep_empty=True)[0])

    def __len__(self) -> int:
        return len(self._found)

    @overload
    def __getitem__(self, item: int) -> dict[str, str | None]: ...

    @overload
    def __getitem__(self, item: slice) -> tuple[dict[str, str | None], ...]: ...

    def __getitem__(self, item: int | slice) -> dict[str, str | None] | tuple[dict[str, str | None], ...]:
        return self._found[item]

    def __iter__(self) -> Iterator[dict[str, str | None]]:
        return iter(self._found)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Partitions | tuple | list):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(self._found)


@dataclass(frozen=True)
class Invalidation:
    """What one applied version changed: what a cache of the table's files or data must drop.

    ``added`` are files active after the version that an ``add`` of it (re)wrote, ``removed`` files
    active before it and gone after; a snapshot is compared with the state it replaces. Paths
    (canonical: ``file:`` prefixes dropped) appear once per file key (a deletion-vector update
    names the path in both lists). ``partitions`` are the distinct ``partitionValues`` of those
    files; ``files`` is the number of active files after the version. The lists stay in Arrow
    (:class:`Paths`, :class:`Partitions`) until read: a snapshot of a million files costs no
    Python object per file.
    """

    table_id: str
    version: int
    snapshot: bool
    added: Sequence[str]
    removed: Sequence[str]
    partitions: Sequence[dict[str, str | None]]
    files: int


__all__ = ["Invalidation", "Partitions", "Paths"]
