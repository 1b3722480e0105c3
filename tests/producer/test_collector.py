"""The collector's old generation is frozen as it grows (issue 29): a full pass of CPython's cyclic
collector over 10,000 tables' objects held the GIL 0.3-3.3 s (the 1-2 s commit pickups) and the
passes made while they started ~11 s in all. What is garbage is collected, never frozen; a table
that ended lets its frozen objects be collected at the next check."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from deltamirror.producer.collector import OldObjectFreezer


class Node:
    """A tracked object that can be in a cycle and be referred to weakly."""

    def __init__(self) -> None:
        self.other: Node | None = None


def _cycle() -> tuple[Node, weakref.ref[Node]]:
    a, b = Node(), Node()
    a.other, b.other = b, a
    return a, weakref.ref(a)


def _in_generations(obj: object) -> bool:
    """``obj`` is in one of the collector's generations (a frozen object is in none of them)."""
    return any(o is obj for o in gc.get_objects())


@pytest.fixture(autouse=True)
def _unfrozen() -> Iterator[None]:
    assert gc.get_freeze_count() == 0  # the test process froze nothing of its own
    yield
    gc.unfreeze()


def test_the_old_generation_is_frozen_once_it_grew_and_not_before() -> None:
    gc.collect()  # what the test session holds is old now
    freezer = OldObjectFreezer(growth=len(gc.get_objects(generation=2)) + 20_000)
    held = [Node() for _ in range(5_000)]
    gc.collect()
    assert not freezer.check()  # grew by less than ``growth``
    assert gc.get_freeze_count() == 0 and _in_generations(held[0])
    held += [Node() for _ in range(30_000)]
    gc.collect()
    assert freezer.check()
    assert gc.get_freeze_count() >= len(held) and not _in_generations(held[-1])
    assert freezer.check() is False  # nothing grew since


def test_garbage_at_a_check_is_collected_not_frozen() -> None:
    freezer = OldObjectFreezer(growth=0)
    node, ref = _cycle()
    del node
    assert freezer.check()
    assert ref() is None  # collected by the check's full pass, not kept frozen for good


def test_a_thaw_lets_the_next_check_collect_what_was_frozen() -> None:
    """A table that ended (moved, removed, dropped): its objects were frozen while it ran, and
    garbage in cycles once it ended; frozen, no pass would ever look at them again."""
    freezer = OldObjectFreezer(growth=0)
    node, ref = _cycle()
    assert freezer.check()
    assert not _in_generations(node)
    del node
    freezer.growth = 10**9  # no growth asked for: only the thaw makes the next check collect
    assert not freezer.check() and ref() is not None  # frozen: left alone
    freezer.thaw()
    assert freezer.check()
    assert ref() is None


def test_release_gives_back_what_it_froze() -> None:
    freezer = OldObjectFreezer(growth=0)
    node = Node()
    assert freezer.check() and not _in_generations(node)
    freezer.release()
    assert gc.get_freeze_count() == 0 and _in_generations(node)
