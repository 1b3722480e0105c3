"""Every table of a watcher on a bounded pool of workers (``workers``, producer/scheduler.py).

Under a thread per table, the thread count grows with the tables; here it stays at the pool's
size plus the service's own few threads. A table is on one worker at a time, so its versions are
published once and in order with one worker or two; a table with much to publish takes turns with
the others (one transaction per turn) instead of holding the only worker until it is idle.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import pytest

from deltamirror.producer import WatchConfig
from deltamirror.producer.scheduler import Slot, TableScheduler, default_workers
from deltamirror.producer.service import WatchService
from support.records import read_topics, wait_for

# --- the scheduler alone (no broker): what it promises any table ----------------------------------


class Steps:
    """A table of ``n`` steps that says when two workers run it at once, and in which order."""

    def __init__(self, name: str, n: int, log: list[tuple[str, int]], *, idle_s: float = 0.0) -> None:
        self.name = name
        self.n = n
        self.log = log
        self.idle_s = idle_s
        self.wakeable = False
        #: the scheduler runs a step on an opener while it is true (never here)
        self.opening = False
        self.done = 0
        self.inside = 0
        self.overlapped = False
        self.lock = threading.Lock()
        #: the first step waits for it (set: no wait)
        self.gate = threading.Event()
        self.gate.set()

    def step_once(self) -> float | None:
        assert self.gate.wait(30)
        with self.lock:
            self.inside += 1
            self.overlapped |= self.inside > 1
        try:
            if self.done == self.n:
                return None
            self.log.append((self.name, self.done))
            self.done += 1
            self.wakeable = self.idle_s > 0
            return self.idle_s
        finally:
            with self.lock:
                self.inside -= 1

    def holding_transaction(self) -> bool:
        return False

    def wait_in_transaction(self, delay: float) -> None:  # never called: no transaction
        raise AssertionError("no transaction here")


def _run(scheduler: TableScheduler, tables: list[Steps]) -> None:
    """Every table added before any step runs, then run to its end."""
    ended: list[BaseException | None] = []
    for t in tables:
        t.gate.clear()
    slots = [scheduler.add(t, lambda _slot, exc: ended.append(exc)) for t in tables]
    for t in tables:
        t.gate.set()
    for slot in slots:
        assert slot.done.wait(30), "a table did not end"
    assert ended == [None] * len(tables)
    scheduler.close()


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_each_table_runs_its_steps_in_order_never_on_two_workers(workers: int) -> None:
    log: list[tuple[str, int]] = []
    tables = [Steps(f"t{i}", 50, log) for i in range(7)]
    scheduler = TableScheduler(workers)
    _run(scheduler, tables)
    for t in tables:
        assert [s for name, s in log if name == t.name] == list(range(50))
        assert not t.overlapped, f"{t.name} ran on two workers at once"
    assert len(scheduler.threads()) == workers


def test_a_table_with_many_steps_takes_turns_with_the_others_on_one_worker() -> None:
    log: list[tuple[str, int]] = []
    busy, other = Steps("busy", 100, log), Steps("other", 3, log)
    _run(TableScheduler(1), [busy, other])
    # the other table's steps all come before the busy one's last: it was not left waiting
    assert log.index(("other", 2)) < log.index(("busy", 99))


def test_a_wake_makes_an_idle_table_due_at_once() -> None:
    log: list[tuple[str, int]] = []
    idle = Steps("idle", 3, log, idle_s=3600.0)  # its next step would be an hour away
    scheduler = TableScheduler(1)
    slot: Slot = scheduler.add(idle, lambda _slot, _exc: None)
    for step in (1, 2, 3):
        wait_for(lambda step=step: idle.done == step and not slot.running, f"step {step}", 30, 0.01)
        scheduler.wake(slot)
    assert slot.done.wait(30)
    scheduler.close()
    assert log == [("idle", 0), ("idle", 1), ("idle", 2)]


def test_one_idle_worker_waits_for_the_next_due_table_the_others_until_notified() -> None:
    """Issue 29: with every idle worker waiting for the first due table, each idle table's turn
    woke all the workers (10,000 tables at a 30 s poll: 333 turns a second, times the workers)."""
    log: list[tuple[str, int]] = []
    idle = [Steps(f"idle{i}", 3, log, idle_s=3600.0) for i in range(3)]
    scheduler = TableScheduler(4)
    slots = [scheduler.add(t, lambda _slot, _exc: None) for t in idle]
    wait_for(
        lambda: all(t.done == 1 for t in idle) and scheduler.waiting == len(scheduler.threads()),
        "the first steps",
        30,
        0.01,
    )
    assert scheduler.timed_waiting == 1  # the others wait without a timeout
    for step, slot in enumerate(slots):  # a table made due wakes a worker all the same
        scheduler.wake(slot)
        wait_for(lambda slot=slot: idle[slots.index(slot)].done == 2, f"table {step}", 30, 0.01)
    earlier = Steps("soon", 2, log, idle_s=1800.0)  # due before the others' next: the timer moves
    slots.append(scheduler.add(earlier, lambda _slot, _exc: None))
    wait_for(
        lambda: earlier.done == 1 and scheduler.waiting == len(scheduler.threads()),
        "the new table's first step",
        30,
        0.01,
    )
    # a worker waits for the new earliest due time; the one that waited for the later one may still
    # wait out its own timeout (it then finds nothing due: harmless), which worker wakes first is
    # the threads' order
    assert 1 <= scheduler.timed_waiting <= 2
    assert scheduler._timer_due == min(s.due for s in scheduler._slots)
    for slot in slots:  # every table to its end: the workers end with the last
        while not slot.done.is_set():
            scheduler.wake(slot, always=True)
            slot.done.wait(0.05)
    scheduler.close()
    for worker in scheduler.threads():
        worker.join(30)
        assert not worker.is_alive()


def test_a_stop_cuts_a_back_off_short() -> None:
    """A table backing off after an error (not wakeable: a notification leaves it be) runs at once
    when the service stops it (``always``): its next step is what finishes it."""
    log: list[tuple[str, int]] = []
    failing = Steps("failing", 2, log, idle_s=3600.0)
    failing.step_once = _not_wakeable(failing.step_once)  # type: ignore[method-assign]
    scheduler = TableScheduler(1)
    slot = scheduler.add(failing, lambda _slot, _exc: None)
    wait_for(lambda: failing.done == 1 and not slot.running, "the first step", 30, 0.01)
    scheduler.wake(slot, always=True)
    wait_for(lambda: failing.done == 2 and not slot.running, "the second step", 30, 0.01)
    scheduler.wake(slot, always=True)
    assert slot.done.wait(30)
    scheduler.close()


def _not_wakeable(step: Any) -> Any:
    def run() -> float | None:
        delay = step()
        step.__self__.wakeable = False
        return delay

    return run


class Opening(Steps):
    """A table whose first step opens its session: it calls ``open_step`` (which may block)."""

    def __init__(self, name: str, n: int, log: list[tuple[str, int]], open_step: Any) -> None:
        super().__init__(name, n, log)
        self.opening = True
        self.open_step = open_step
        self.opened_on: str | None = None

    def step_once(self) -> float | None:
        if self.opening:
            self.opened_on = threading.current_thread().name
            self.open_step()
            self.opening = False
            return 0.0
        return super().step_once()


def test_tables_opening_together_open_at_once_whatever_the_workers() -> None:
    """A member's start opens its tables together, so that they share the batched broker calls of
    an open (one topic request, one progress read for all): on a single worker, one table after
    the other, 100 tables took 39 s in one run at a load of 4-7, where a thread per table had taken 8 s)."""
    n = 6
    together = threading.Barrier(n, timeout=20)  # every open waits until all are inside theirs
    log: list[tuple[str, int]] = []
    tables = [Opening(f"t{i}", 3, log, together.wait) for i in range(n)]
    scheduler = TableScheduler(1)
    _run(scheduler, tables)
    assert not together.broken
    assert all(t.done == 3 for t in tables)
    assert all(t.opened_on is not None and "opener" in t.opened_on for t in tables)
    assert len(scheduler.threads()) == 1  # the workers: openers come and go


def test_a_table_waiting_in_its_open_holds_no_worker() -> None:
    """The brokers down, or a transaction left open on its topics: a table waits in its open (on an
    opener), while the tables already open go on on the only worker."""
    log: list[tuple[str, int]] = []
    brokers_back = threading.Event()
    waiting = Opening("waiting", 2, log, lambda: brokers_back.wait(30))
    other = Steps("other", 20, log)
    scheduler = TableScheduler(1)
    ended: list[str] = []
    first = scheduler.add(waiting, lambda _slot, _exc: ended.append("waiting"))  # due first
    second = scheduler.add(other, lambda _slot, _exc: ended.append("other"))
    assert second.done.wait(20), "a table waiting in its open held the only worker"
    assert not first.done.is_set() and waiting.done == 0
    brokers_back.set()
    assert first.done.wait(20)
    scheduler.close()
    assert ended == ["other", "waiting"]


def test_the_openers_are_bounded() -> None:
    inside = 0
    most = 0
    lock = threading.Lock()
    two_in = threading.Event()
    release = threading.Event()

    def open_step() -> None:
        nonlocal inside, most
        with lock:
            inside += 1
            most = max(most, inside)
            if inside == 2:
                two_in.set()
        release.wait(30)
        with lock:
            inside -= 1

    log: list[tuple[str, int]] = []
    tables = [Opening(f"t{i}", 1, log, open_step) for i in range(5)]
    scheduler = TableScheduler(2, openers=2)
    slots = [scheduler.add(t, lambda _slot, _exc: None) for t in tables]
    assert two_in.wait(20)
    release.set()
    for slot in slots:
        assert slot.done.wait(20)
    scheduler.close()
    assert most == 2 and scheduler.openers_peak == 2


def test_the_default_pool_follows_the_cores() -> None:
    assert default_workers() >= 4


# --- the watcher on a broker ------------------------------------------------------------------------


def _config(bootstrap: str, kit: Any, tables: list[Path], **top: Any) -> tuple[WatchConfig, list[str]]:
    name = kit.unique("pool")
    commits = [f"{name}-{i}.commits" for i in range(len(tables))]
    cfg = WatchConfig.model_validate(
        {
            "kafka": {"bootstrap_servers": bootstrap},
            "tables": [
                {
                    "uri": str(table),
                    "actions_topic": f"{name}-{i}.actions",
                    "commits_topic": commits[i],
                    "poll_interval_s": 3600,  # only a notification wakes an idle table in time
                    "snapshot_mode": "from-version",
                    "from_version": 0,
                }
                for i, table in enumerate(tables)
            ],
            "progress_topic": f"{name}.progress",
            "transactional_id_prefix": name,
            "signal_topic": None,
            **top,
        }
    )
    return cfg, commits


def _versions(bootstrap: str, topic: str) -> list[int]:
    return _all_versions(bootstrap, [topic])[topic]


def _all_versions(bootstrap: str, topics: list[str]) -> dict[str, list[int]]:
    """Each commits topic's published versions, read through one consumer."""
    return {
        topic: [r.json["version"] for r in recs if r.value and r.json.get("kind") == "commit"]
        for topic, recs in read_topics(bootstrap, topics).items()
    }


def _all_at(bootstrap: str, topics: list[str], versions: list[int]) -> bool:
    return all(v == versions for v in _all_versions(bootstrap, topics).values())


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.kafka
@pytest.mark.timeout(300)
def test_tables_on_one_or_two_workers_publish_every_version_once_in_order_taking_turns(
    kafka_bootstrap: str, tmp_path: Path, kit: Any, caplog: pytest.LogCaptureFixture, workers: int
) -> None:
    tables = [kit.make_table(tmp_path / f"t{i}", versions=1) for i in range(4)]
    # a transaction holds a version: a table with 40 versions to publish needs 40 turns
    cfg, commits = _config(kafka_bootstrap, kit, tables, workers=workers, txn_max_records=4)
    with Serving(cfg):  # a first run creates the topics: the second one only publishes
        wait_for(lambda: _all_at(kafka_bootstrap, commits, [0]), "version 0 of every table", 120, 0.2)
    for table in tables:
        kit.write_versions(table, 1, 39, 3)
    caplog.set_level(logging.DEBUG, logger="deltamirror.watch")
    with Serving(cfg) as service:
        wait_for(
            lambda: all(len(v) >= 40 for v in _all_versions(kafka_bootstrap, commits).values()),
            "40 versions of every table",
            120,
            0.5,
        )
        kit.write_versions(tables[0], 40, 2, 3)  # a commit while idle: the notification wakes it
        wait_for(lambda: len(_versions(kafka_bootstrap, commits[0])) >= 42, "versions 40, 41", 60, 0.2)
        assert service._failure is None, service._failure
        pool = [t for t in threading.enumerate() if t.name.startswith("deltamirror-worker")]
        assert len(pool) == workers
    published_versions = _all_versions(kafka_bootstrap, commits)
    for topic, n in zip(commits, (42, 40, 40, 40), strict=True):
        assert published_versions[topic] == list(range(n)), topic
    published = [
        (str(getattr(r, "table", "")), int(getattr(r, "version", -1)))
        for r in caplog.records
        if r.getMessage() == "published"
    ]
    uris = [cfg.tables[i].normalized_uri for i in range(4)]
    first = {u: next(i for i, (t, _) in enumerate(published) if t == u) for u in uris}
    last = {u: max(i for i, (t, v) in enumerate(published) if t == u and v < 40) for u in uris}
    # turns: every table began publishing before any other had published its 39 new versions (one
    # worker serving a table until it is idle would publish them one table after the other)
    assert max(first.values()) < min(last.values()), (first, last)


@pytest.mark.kafka
@pytest.mark.timeout(300)
def test_tables_sharing_a_shard_producer_on_one_worker_never_wait_for_a_parked_transaction(
    kafka_bootstrap: str, tmp_path: Path, kit: Any
) -> None:
    """In a group the tables of a shard take turns on its producer (a transaction holds it from
    begin to commit). On one worker, a table parked with its transaction open would leave the next
    table waiting for the producer forever: a turn lasts until the transaction is committed."""
    tables = [kit.make_table(tmp_path / f"t{i}", versions=1) for i in range(3)]
    for table in tables:
        kit.write_versions(table, 1, 9, 3)
    group = {"name": kit.unique("g"), "shards": 1}
    # the default bounds: a transaction holds every version there is to catch up, one step each
    cfg, commits = _config(kafka_bootstrap, kit, tables, workers=1, group=group)
    with Serving(cfg) as service:
        for topic in commits:
            wait_for(lambda topic=topic: len(_versions(kafka_bootstrap, topic)) >= 10, topic, 180, 0.5)
        assert service._failure is None, service._failure
        assert service.clients.shards is not None and service.clients.shards.live() == 1
    for topic in commits:
        assert _versions(kafka_bootstrap, topic) == list(range(10)), topic


class Serving:
    """A WatchService started for a ``with`` block, stopped and closed after it."""

    def __init__(self, cfg: WatchConfig) -> None:
        self.service = WatchService(cfg, stop_budget_s=5.0)

    def __enter__(self) -> WatchService:
        self.service.start()
        return self.service

    def __exit__(self, *exc: object) -> None:
        self.service.request_stop()
        assert self.service.wait(30), "the watcher did not stop"
        self.service.close()


@pytest.mark.kafka
@pytest.mark.timeout(300)
def test_many_tables_run_on_the_pool_not_on_a_thread_each(
    kafka_bootstrap: str, tmp_path: Path, kit: Any
) -> None:
    """40 tables, workers 2: the service's threads stay at the pool plus a few of its own (a thread
    per table would be 40 more); each table publishes, and a commit to each one is published."""
    before = {t.ident for t in threading.enumerate()}
    tables = [kit.make_table(tmp_path / f"t{i}", versions=1) for i in range(40)]
    cfg, commits = _config(kafka_bootstrap, kit, tables, workers=2)
    service = WatchService(cfg, stop_budget_s=5.0)
    service.start()
    try:
        wait_for(lambda: _all_at(kafka_bootstrap, commits, [0]), "version 0 of every table", 120, 0.2)
        # every table opened: its opener ends once no table is left to open
        wait_for(
            lambda: not any(t.name == "deltamirror-opener" for t in threading.enumerate()), "openers", 30, 0.1
        )
        added = [t for t in threading.enumerate() if t.ident not in before]
        workers = [t for t in added if t.name.startswith("deltamirror-worker")]
        assert len(workers) == 2, [t.name for t in added]
        # the service's own: stop relay, broker health, status, ready, the file notifier, ...
        assert len(added) <= 2 + 12, sorted(t.name for t in added)
        for table in tables:
            kit.append(table)
        wait_for(lambda: _all_at(kafka_bootstrap, commits, [0, 1]), "version 1 of every table", 120, 0.2)
        assert service._failure is None, service._failure
    finally:
        service.request_stop()
        assert service.wait(30), "the watcher did not stop"
        service.close()


def test_a_table_added_or_woken_wakes_one_worker_not_two() -> None:
    """Issue 29 (fewer wake-ups at a start): adding a table notified a worker twice, once for the
    heap's new head and once more, and so did a wake; 10,000 tables added woke 20,000 workers, half
    of them to find nothing and wait again."""
    log: list[tuple[str, int]] = []
    scheduler = TableScheduler(4)
    first = Steps("first", 3, log, idle_s=3600.0)
    slots = [scheduler.add(first, lambda _slot, _exc: None)]
    wait_for(lambda: first.done == 1 and scheduler.waiting == len(scheduler.threads()), "first", 30, 0.01)
    notified: list[int] = []
    real_notify = scheduler._cond.notify

    def notify(n: int = 1) -> None:
        notified.append(n)
        real_notify(n)

    scheduler._cond.notify = notify  # type: ignore[method-assign]
    second = Steps("second", 3, log, idle_s=3600.0)
    second.gate.clear()  # its step waits: the notifications of the add alone are counted
    slots.append(scheduler.add(second, lambda _slot, _exc: None))
    assert notified == [1]
    second.gate.set()
    wait_for(lambda: second.done == 1 and scheduler.waiting == len(scheduler.threads()), "second", 30, 0.01)
    notified.clear()
    scheduler.wake(slots[0])
    assert notified == [1]
    wait_for(lambda: first.done == 2, "the woken table", 30, 0.01)
    scheduler._cond.notify = real_notify  # type: ignore[method-assign]
    for slot in slots:
        while not slot.done.is_set():
            scheduler.wake(slot, always=True)
            slot.done.wait(0.05)
    scheduler.close()
