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
asks the next check to unfreeze everything first, so its pass collects them (one full pass).
Objects alive at a freeze that die later in cycles (a commit's passing state) are held until the
next thaw: a check thaws every :data:`THAW_EVERY_S` too, so a member whose tables never end holds
them for that long at most (one full pass each time).
"""

from __future__ import annotations

import gc
import logging
import threading
import time

log = logging.getLogger("deltamirror.watch")

#: the old generation is frozen once it holds this many objects not frozen (~1,000 tables' worth)
FREEZE_GROWTH = 100_000
#: how often the freezer looks (counting the old generation's objects: ~1 ms per 100,000)
FREEZE_CHECK_S = 2.0
#: the longest objects stay frozen: a thaw (one full pass) at least this often
THAW_EVERY_S = 600.0


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
        #: this freezer froze objects (its :meth:`release` unfreezes them)
        self.froze = False
        self._thread: threading.Thread | None = None

    def thaw(self) -> None:
        """Objects frozen may be garbage now (a table ended): a check ``interval_s`` later or more
        unfreezes everything, collects, and freezes what is left (the thread that ended the table
        has let it go by then: one still referred to at the check would be frozen again)."""
        if self._thaw_at is None:
            self._thaw_at = time.monotonic()

    def check(self) -> bool:
        """Freeze the old generation if it grew by ``growth`` objects (or a thaw was asked for),
        after a full pass; True when it did."""
        with self._lock:
            now = time.monotonic()
            thaw = (self._thaw_at is not None and now - self._thaw_at >= self.interval_s) or (
                self.froze and now - self._frozen_at >= self.thaw_every_s
            )
            if thaw:
                self._thaw_at = None
            if thaw and self.froze:
                gc.unfreeze()
            elif len(gc.get_objects(generation=2)) < self.growth:
                return False
            began = time.monotonic()
            gc.collect()
            gc.freeze()
            self.froze = True
            self._frozen_at = time.monotonic()
            log.debug(
                "old objects frozen",
                extra={"frozen": gc.get_freeze_count(), "seconds": round(time.monotonic() - began, 3)},
            )
            return True

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


__all__ = ["FREEZE_CHECK_S", "FREEZE_GROWTH", "THAW_EVERY_S", "OldObjectFreezer"]
