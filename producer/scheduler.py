"""A bounded pool of workers serving every table of a watcher (``workers``, default from the cores).

A table is a sequence of steps (:meth:`~.pipeline.TablePipeline.step_once`), each returning when
it wants to run again: now (more work), after its poll interval (idle), after a back-off (a
failure), or never (it ended). The scheduler keeps a heap of due times and ``workers`` threads
that take the table due first, run one turn of it and put it back at its next due time:

- a table is on one worker at a time: it is out of the heap while a worker runs it, so its steps
  run in order, one after the other, exactly as on a thread of its own;
- a turn lasts while the table holds an open transaction (at most one transaction's bounds:
  ``txn_max_records``, ``txn_max_bytes``, ``txn_max_ms``), then the table goes back behind every
  table already due: a busy table takes turns with the others instead of starving them, and a
  transaction (which holds its shard's producer in a group) is never parked while another table
  of the shard waits for that producer;
- a notification of a new commit (the waker's listener) makes an idle table due at once, and so
  does a stop (:meth:`wake`, the service calls it): the table's next step finishes it;
- a step that opens a table's producer session (its first, or one after a Kafka failure) runs on
  an opener thread, not on a worker: openers start as tables need them, up to ``openers`` at a
  time, and end once no table waits to open. Tables opening together share the broker calls of an
  open (one CreateTopics/DescribeConfigs request for their topics, one read of the progress topic:
  :mod:`deltamirror.mirror.topics`, :mod:`.publishing.progress`), which gather the threads that
  ask at about the same time: on ``workers`` threads a member's start would gather ``workers``
  tables at a time (100 tables started 5 times slower). The waits of an open (for the brokers, for
  transactions left open on the table's topics) hold an opener, never a worker;
- the other waits in a step are the table's calls to the broker and to its storage (and a net
  catch-up in a transaction waiting for versions it cannot read yet): a table waiting there holds
  one worker, the others go on. ``workers`` tables blocked there at once stall the rest.
"""

from __future__ import annotations

import collections
import heapq
import itertools
import logging
import math
import os
import threading
import time
from collections.abc import Callable
from typing import Protocol

from .settings import DUE_EARLY_S

log = logging.getLogger("deltamirror.watch")

#: default number of workers per CPU: a step mostly waits on storage and on the broker, not the CPU
WORKERS_PER_CPU = 4
#: at least this many workers by default (a machine with one core still overlaps a few waits)
MIN_DEFAULT_WORKERS = 4
#: opener threads at most (tables opening their session at once, sharing its batched broker calls)
OPENERS = 256
#: an opener with no table to open ends after this long
OPENER_IDLE_S = 1.0


def default_workers() -> int:
    """``workers`` when it is not set: :data:`WORKERS_PER_CPU` per CPU this process may use."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        cpus = os.cpu_count() or 1
    return max(MIN_DEFAULT_WORKERS, WORKERS_PER_CPU * cpus)


class Steppable(Protocol):
    """What the scheduler runs (a :class:`~.pipeline.TablePipeline`)."""

    wakeable: bool

    @property
    def opening(self) -> bool:
        """Its next step opens a session (runs on an opener, not on a worker)."""
        ...

    def step_once(self) -> float | None: ...

    def holding_transaction(self) -> bool: ...

    def wait_in_transaction(self, delay: float) -> None: ...


class Slot:
    """One table in the scheduler: when it is due, whether a worker runs it, how it ended."""

    def __init__(self, table: Steppable, on_end: Callable[[Slot, BaseException | None], None]) -> None:
        self.table = table
        self.on_end = on_end
        self.due = 0.0
        #: a worker runs it now (it is not in the heap)
        self.running = False
        #: woken by a notification while running: due at once after its turn, if idle
        self.woken = False
        #: woken by a stop while running: due at once after its turn, whatever it returned
        self.urgent = False
        #: the heap entry that is current (older ones are skipped when popped)
        self.token = 0
        #: set once the table ended (and ``on_end`` was called)
        self.done = threading.Event()


class TableScheduler:
    """``workers`` threads serving every table added, each on one worker at a time."""

    def __init__(
        self,
        workers: int,
        *,
        openers: int = OPENERS,
        name: str = "deltamirror-worker",
        opener_name: str = "deltamirror-opener",
    ) -> None:
        if workers < 1 or openers < 1:
            raise ValueError("workers and openers must be at least 1")
        self.workers = workers
        self.openers = openers
        self.opener_name = opener_name
        self.name = name
        lock = threading.RLock()
        #: the workers wait on it for a due table, the openers on ``_open_cond`` for one to open
        self._cond = threading.Condition(lock)
        self._open_cond = threading.Condition(lock)
        self._heap: list[tuple[float, int, int, Slot]] = []
        self._order = itertools.count()
        self._threads: list[threading.Thread] = []
        #: due tables whose next step opens a session, in due order, for the openers
        self._to_open: collections.deque[Slot] = collections.deque()
        #: opener threads alive, and how many of them wait for a table
        self._openers: list[threading.Thread] = []
        self._openers_idle = 0
        #: the most openers alive at once (for the tests and the bench)
        self.openers_peak = 0
        self._closed = False
        #: the due time one worker waits for with a timeout (inf: none does); the other idle
        #: workers wait until notified: with every worker waiting for the head's due time, each
        #: idle table's turn woke them all (10,000 tables polled every 30 s: 333 turns a second)
        self._timer_due = math.inf
        #: idle workers now, and how many of them wait with a timeout (for the tests)
        self.waiting = 0
        self.timed_waiting = 0
        #: slots added and not ended (for tests and the status)
        self._slots: set[Slot] = set()

    # --- the tables ---------------------------------------------------------------------------

    def add(self, table: Steppable, on_end: Callable[[Slot, BaseException | None], None]) -> Slot:
        """Serve ``table`` from now on (its first step is due at once); ``on_end`` is called on a
        worker once it ended: with None, or with what its step raised."""
        slot = Slot(table, on_end)
        with self._cond:
            if self._closed:
                raise RuntimeError("the scheduler is closed")
            self._slots.add(slot)
            self._start_workers()
            if not self._push(slot, time.monotonic()):  # one worker woken for it, not two
                self._cond.notify()
        return slot

    def wake(self, slot: Slot, *, always: bool = False) -> None:
        """Make ``slot`` due now if it waits idle (a notification), or whatever it waits for with
        ``always`` (a stop: its next step finishes it). Never blocks (the notifier calls it)."""
        with self._cond:
            if slot.done.is_set():
                return
            if slot.running:
                slot.woken = True
                slot.urgent |= always  # the back-off after this turn is cut short too
                return
            if not (always or slot.table.wakeable):
                return
            now = time.monotonic()
            # pushed when it waits for later; one worker woken for it, not two
            if slot.due > now and not self._push(slot, now):
                self._cond.notify()

    def waker_of(self, slot: Slot) -> Callable[[], None]:
        """The listener a table's waker calls on a notification."""
        return lambda: self.wake(slot)

    @property
    def tables(self) -> int:
        with self._cond:
            return len(self._slots)

    def close(self) -> None:
        """No more tables: the workers end once idle (a worker stuck in a step ends after it)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            self._open_cond.notify_all()

    def threads(self) -> list[threading.Thread]:
        """The workers (openers come and go: not listed)."""
        with self._cond:
            return list(self._threads)

    # --- under the lock -----------------------------------------------------------------------

    def _push(self, slot: Slot, due: float) -> bool:
        """``slot`` in the heap, due at ``due``; True when a worker was woken for it."""
        slot.due = due
        slot.token += 1
        heapq.heappush(self._heap, (due, next(self._order), slot.token, slot))
        if due < self._timer_due:  # before what the waiting worker waits for: one wakes for it
            self._cond.notify()
            return True
        return False

    def _start_workers(self) -> None:
        while len(self._threads) < min(self.workers, len(self._slots)):
            thread = threading.Thread(
                target=self._work, name=f"{self.name}-{len(self._threads)}", daemon=True
            )
            self._threads.append(thread)
            thread.start()

    def _take(self) -> Slot | None:
        """The next due table (waiting for one); None once closed with nothing left to run."""
        with self._cond:
            while True:
                while self._heap and self._heap[0][3].token != self._heap[0][2]:
                    heapq.heappop(self._heap)  # a stale entry: the slot was pushed again since
                if self._closed and not self._slots:
                    return None
                if self._heap:
                    due = self._heap[0][0]
                    left = due - time.monotonic()
                    if left <= DUE_EARLY_S:
                        slot = heapq.heappop(self._heap)[3]
                        slot.token += 1  # no other entry of it is current
                        slot.running = True
                        slot.woken = slot.urgent = False
                        if self._heap:  # an idle worker waits for the next one (or takes it)
                            self._cond.notify()
                        if slot.table.opening:  # to an opener: never wait on a worker for an open
                            self._hand_to_opener(slot)
                            continue
                        return slot
                    if due < self._timer_due:  # this worker waits for the head's due time
                        self._timer_due = due
                        self._wait(left)
                        if self._timer_due == due:
                            self._timer_due = math.inf
                        continue
                self._wait(None)  # another worker waits for the head: this one until notified

    def _wait(self, timeout: float | None) -> None:
        self.waiting += 1
        self.timed_waiting += timeout is not None
        try:
            self._cond.wait(timeout)
        finally:
            self.waiting -= 1
            self.timed_waiting -= timeout is not None

    def _hand_to_opener(self, slot: Slot) -> None:
        """Under the lock: ``slot`` (taken, running) is opened by an opener, started if none waits."""
        self._to_open.append(slot)
        if self._openers_idle >= len(self._to_open) or len(self._openers) >= self.openers:
            self._open_cond.notify()  # an idle opener takes it (or the next to finish its open)
            return
        thread = threading.Thread(target=self._open_tables, name=self.opener_name, daemon=True)
        self._openers.append(thread)
        self.openers_peak = max(self.openers_peak, len(self._openers))
        thread.start()

    def _take_to_open(self) -> Slot | None:
        """The next table to open; None once none came for :data:`OPENER_IDLE_S` (the opener ends)."""
        me = threading.current_thread()
        with self._cond:
            deadline = time.monotonic() + OPENER_IDLE_S
            while not self._to_open:
                left = deadline - time.monotonic()
                if left <= 0 or (self._closed and not self._slots):
                    self._openers.remove(me)
                    return None
                self._openers_idle += 1
                try:
                    self._open_cond.wait(left)
                finally:
                    self._openers_idle -= 1
            return self._to_open.popleft()

    # --- the workers and the openers ------------------------------------------------------------

    def _open_tables(self) -> None:
        while (slot := self._take_to_open()) is not None:
            self._run(slot)
            del slot  # an ended table's slot (its pipeline) is not kept while this thread waits

    def _work(self) -> None:
        while (slot := self._take()) is not None:
            self._run(slot)
            del slot  # an ended table's slot (its pipeline) is not kept while this worker waits

    def _run(self, slot: Slot) -> None:
        """One turn of ``slot`` (taken: out of the heap), then back in the heap, or its end."""
        delay: float | None
        error: BaseException | None = None
        try:
            delay = self._turn(slot.table)
        except BaseException as exc:  # the table ended on it: the service decides what it means
            delay, error = None, exc
        if delay is None:
            with self._cond:
                slot.running = False
                self._slots.discard(slot)
                if self._closed and not self._slots:
                    self._cond.notify_all()
                    self._open_cond.notify_all()
            try:
                slot.on_end(slot, error)
            except Exception:  # a worker must survive what the service does
                log.exception("a table's end could not be handled")
            finally:
                slot.done.set()
            return
        with self._cond:
            slot.running = False
            now = time.monotonic()
            soon = slot.urgent or (slot.woken and slot.table.wakeable)
            self._push(slot, now if soon else now + delay)  # notifies a worker if it is due first

    @staticmethod
    def _turn(table: Steppable) -> float | None:
        """Steps of one table while it holds a transaction (never parked holding its producer)."""
        while True:
            delay = table.step_once()
            if delay is None or not table.holding_transaction():
                return delay
            if delay > 0:  # a catch-up whose next versions are not readable yet: it keeps the worker
                table.wait_in_transaction(delay)


__all__ = ["Slot", "TableScheduler", "default_workers"]
