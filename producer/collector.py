"""The cyclic garbage collector's full passes kept short in a process that holds many tables.

CPython's collector looks at every object of its oldest generation at a full pass, and makes one
whenever that generation grew by a quarter since the last. A table holds ~100 such objects once
its pipeline is built and more once it resumed: 10,000 tables' pipelines alone are ~850,000
objects, a full pass over them 0.6-0.7 s of CPU; in a 10,000-table start at load 16-20 the
passes took 0.05-3.3 s each, ~11 s in all, with the GIL held (every table waits meanwhile).

:class:`OldObjectFreezer` moves the old generation to the collector's permanent generation
(``gc.freeze``) once it grew by :data:`FREEZE_GROWTH` objects, after a full pass that collects
what is garbage then: the passes that follow look only at what came since. The objects of a table
that ended (moved, removed, dropped) may be garbage in cycles then: :meth:`~OldObjectFreezer.thaw`
asks the next check to unfreeze everything first, so its pass collects them (one full pass). The
thread that ended the table may still hold it at that check (a busy machine can leave it
unscheduled for longer than the check's interval): a table's pipeline still alive after the pass
is frozen again, so the check asks for another thaw, later each time (the interval, then 3, 7,
15... times it), :data:`THAW_RETRIES` times at most.
Objects alive at a freeze that die later in cycles (a commit's passing state) are held until the
next thaw: a check thaws every :data:`THAW_EVERY_S` too, so a member whose tables never end holds
them for that long at most (one full pass each time).
"""

from __future__ import annotations

import gc
import logging
import threading
import time
import weakref
from typing import Any

log = logging.getLogger("deltamirror.watch")

#: the old generation is frozen once it holds this many objects not frozen (~1,000 tables' worth)
FREEZE_GROWTH = 100_000
#: how often the freezer looks (counting the old generation's objects: ~1 ms per 100,000)
FREEZE_CHECK_S = 2.0
#: the longest objects stay frozen: a thaw (one full pass) at least this often
THAW_EVERY_S = 600.0
#: how many more thaws a check asks for while an ended table's objects are still referred to
THAW_RETRIES = 6


class OldObjectFreezer:
    """Freezes the collector's old generation once it grew, on a thread of its own (:meth:`start`),
    or when :meth:`check` is called."""

    def __init__(
        self,
        *,
        growth: int = FREEZE_GROWTH,
        interval_s: float = FREEZE_CHECK_S,
        thaw_every_s: float = THAW_EVERY_S,
    ) -> None:
        self.growth = growth
        self.interval_s = interval_s
        self.thaw_every_s = thaw_every_s
        #: when this freezer last froze (monotonic)
        self._frozen_at = 0.0
        self._lock = threading.Lock()
        #: when a thaw was asked for (monotonic), None: none pending
        self._thaw_at: float | None = None
        #: what the tables that ended left (weak references): a thaw is asked for again while one
        #: is alive after a thaw's pass, ``_retries`` times so far
        self._ended: list[weakref.ref[Any]] = []
        self._retries = 0
        self._pending = threading.Lock()  # thaw() and check(): not the check's long pass
        #: this freezer froze objects (its :meth:`release` unfreezes them)
        self.froze = False
        self._thread: threading.Thread | None = None

    def thaw(self, ended: object | None = None) -> None:
        """Objects frozen may be garbage now (a table ended; ``ended``: what it left, its pipeline):
        a check ``interval_s`` later or more unfreezes everything, collects, and freezes what is
        left. If ``ended`` is still alive then (the thread that ended the table still holds it),
        it was frozen again: the check asks for another thaw (see the module docstring)."""
        with self._pending:
            if ended is not None:
                self._ended.append(weakref.ref(ended))
            if self._thaw_at is None:
                self._thaw_at = time.monotonic()
                self._retries = 0

    def check(self) -> bool:
        """Freeze the old generation if it grew by ``growth`` objects (or a thaw was asked for),
        after a full pass; True when it did."""
        with self._lock:
            now = time.monotonic()
            with self._pending:
                thaw = (self._thaw_at is not None and now - self._thaw_at >= self.interval_s) or (
                    self.froze and now - self._frozen_at >= self.thaw_every_s
                )
                ended: list[weakref.ref[Any]] = []
                if thaw:
                    self._thaw_at = None
                    ended, self._ended = self._ended, []
            if thaw and self.froze:
                gc.unfreeze()
            elif len(gc.get_objects(generation=2)) < self.growth:
                return False
            began = time.monotonic()
            gc.collect()
            alive = [ref for ref in ended if ref() is not None]
            if alive:
                self._again(alive)
            gc.freeze()
            self.froze = True
            self._frozen_at = time.monotonic()
            log.debug(
                "old objects frozen",
                extra={"frozen": gc.get_freeze_count(), "seconds": round(time.monotonic() - began, 3)},
            )
            return True

    def _again(self, alive: list[weakref.ref[Any]]) -> None:
        """What ended tables left is still referred to after a thaw's pass (and is frozen again):
        another thaw, later than the last, unless :data:`THAW_RETRIES` were asked for already."""
        with self._pending:
            if self._retries >= THAW_RETRIES:
                return  # left to the thaw every thaw_every_s
            self._retries += 1
            self._ended.extend(alive)
            # the next check at least interval_s * (2 ** retries - 1) from now
            wait = self.interval_s * (2**self._retries - 1)
            if self._thaw_at is None:
                self._thaw_at = time.monotonic() + wait - self.interval_s
            else:  # a table that ended since asked already: no later than that
                self._thaw_at = min(self._thaw_at, time.monotonic() + wait - self.interval_s)

    def start(self, stop: threading.Event) -> None:
        """Check every ``interval_s`` until ``stop`` is set."""

        def run() -> None:
            while not stop.wait(self.interval_s):
                self.check()

        self._thread = threading.Thread(target=run, name="watch-collector", daemon=True)
        self._thread.start()

    def release(self) -> None:
        """What this freezer froze goes back to the collector (the service is closed)."""
        with self._lock:
            if self.froze:
                gc.unfreeze()
                self.froze = False


__all__ = ["FREEZE_CHECK_S", "FREEZE_GROWTH", "THAW_EVERY_S", "THAW_RETRIES", "OldObjectFreezer"]
