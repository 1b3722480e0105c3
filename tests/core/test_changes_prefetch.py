"""Reading ahead (core/changes/prefetch.py): order kept whoever reads a group, errors in their
place, and the caller's thread reading alone while a worker gets too little CPU to pay."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator

import pyarrow as pa
import pytest

from deltamirror.core.changes import prefetch
from deltamirror.core.changes.prefetch import FileRead, prefetched


class Boom(Exception):
    pass


def _reads(n: int, *, fail_at: int | None = None, big_every: int = 0) -> list[FileRead]:
    """``n`` reads of one-row batches holding their index; every ``big_every``-th too big to prefetch."""

    def read(i: int) -> Iterator[pa.RecordBatch]:
        if i == fail_at:
            raise Boom(i)
        yield pa.record_batch({"i": [i]})
        yield pa.record_batch({"i": [i]})  # two batches per read

    out = []
    for i in range(n):
        big = big_every and i % big_every == big_every - 1
        out.append(FileRead(i // 3, None if big else 100, lambda i=i: read(i)))
    return out


def _drain(reads: list[FileRead]) -> list[tuple[int, list[int]]]:
    return [
        (version, [v for b in batches for v in b.column(0).to_pylist()])
        for version, batches in prefetched(iter(reads))
    ]


@pytest.mark.parametrize("big_every", [0, 7])
def test_reads_come_out_in_order_whoever_reads_them(big_every: int) -> None:
    got = _drain(_reads(200, big_every=big_every))
    assert got == [(i // 3, [i, i]) for i in range(200)]


def test_an_error_comes_after_the_reads_before_it() -> None:
    seen: list[int] = []
    with pytest.raises(Boom):
        for _, batches in prefetched(iter(_reads(100, fail_at=57))):
            seen.extend(b.column(0)[0].as_py() for b in batches)
    assert seen == [i for i in range(57) for _ in range(2)]


def test_a_worker_starved_of_cpu_hands_the_next_groups_to_the_caller(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prefetch, "PREFETCH_FIRST_GROUP_FILES", 4)
    monkeypatch.setattr(prefetch, "PREFETCH_GROUP_FILES", 4)
    monkeypatch.setattr(prefetch, "INLINE_GROUPS", 3)
    real = prefetch._timed_drain
    share = {"value": 0.1}

    def starved(group: list[FileRead]) -> prefetch._Timed:
        drained, _, wall = real(group)
        return drained, share["value"] * wall, wall

    monkeypatch.setattr(prefetch, "_timed_drain", starved)
    readers: list[str] = []
    reads = []
    for r in _reads(80):

        def read(r: FileRead = r) -> Iterator[pa.RecordBatch]:
            readers.append(threading.current_thread().name)
            return r.read()

        reads.append(FileRead(r.version, r.size, read))
    submitted: list[bool] = []
    real_group = prefetch._Readers.group

    def group(self: prefetch._Readers, reads: list[FileRead]) -> prefetch._Group:
        made = real_group(self, reads)
        submitted.append(made._future is not None)
        return made

    monkeypatch.setattr(prefetch._Readers, "group", group)
    assert _drain(reads) == [(i // 3, [i, i]) for i in range(80)]
    # the first groups go to a worker; after its verdict, runs of groups read by the caller,
    # each followed by a single group trying a worker again
    first_inline = submitted.index(False)
    assert all(submitted[:first_inline]) and first_inline <= prefetch.PREFETCH_GROUPS + 1
    rest = submitted[first_inline:]
    probes = [i for i, to_worker in enumerate(rest) if to_worker]
    assert len(probes) >= 2
    assert all(not rest[i + 1] for i in probes if i + 1 < len(rest))  # never two workers in a row
    assert all(b - a > prefetch.INLINE_GROUPS - 1 for a, b in itertools.pairwise(probes))
    # ...and a worker that gets its CPU keeps reading
    share["value"] = 0.9
    submitted.clear()
    assert _drain(reads) == [(i // 3, [i, i]) for i in range(80)]
    assert all(submitted)
    assert any(name.startswith("deltamirror-cdf") for name in readers)
