"""The eight fault classes. Each builds its scene, lets the writer commit, injects faults at seeded
moments, records where each one hit (:mod:`chaos.evidence`), lets everything catch up, and checks.

A fault *lands* when the evidence shows it interrupted work in flight; a class fails when fewer
than ``need`` of its faults landed. A class injects faults until its ``duration`` is over and
``need`` landed, at most ``4 * need + duration / 5`` of them.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import re
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chaos.broker import cli
from chaos.checker import net_block_version, read_topic
from chaos.procs import Proc, poll_until, wait_for
from chaos.scene import ClassResult, Fault, Run, Scene, latest_version

#: how long anything may take to catch up, resume or exit on this (shared, loaded) machine
SETTLE_S = 240.0


@dataclass
class Plan:
    duration_s: float
    need: int
    tables_group: int = 21
    #: broker kill -9 beside the outages (see docs/chaos.md: Kafka may leave a hanging transaction)
    broker_kills: bool = True

    @property
    def max_faults(self) -> int:
        return 4 * self.need + int(self.duration_s / 5)


class Clock:
    def __init__(self) -> None:
        self.t0 = time.monotonic()

    def now(self) -> float:
        return round(time.monotonic() - self.t0, 1)


def _loop(result: ClassResult, plan: Plan, clock: Clock, inject: Callable[[], Fault]) -> None:
    while len(result.faults) < plan.max_faults and (
        clock.now() < plan.duration_s or result.landed < plan.need
    ):
        result.faults.append(inject())


def _finish(
    scene: Scene, result: ClassResult, survivors: list[Proc], signal_blocks: tuple[tuple[int, int], ...] = ()
) -> None:
    """Stop the writer, wait until every table is out, stop the survivors (exit 0), check
    (``signal_blocks``: the ranges the watchers began publishing on net-changes signals)."""
    scene.stop_writer()
    if not scene.caught_up(SETTLE_S):
        result.failures.append(f"not caught up within {SETTLE_S:.0f} s: {', '.join(scene.behind())}")
    for proc in survivors:
        code = proc.terminate()
        if code != 0:
            result.failures.append(f"{proc.name} exited {code} on SIGTERM")
    result.tally = scene.check(signal_blocks)


def _await_start(scene: Scene) -> None:
    """Wait until the watchers published every table's versions so far (bounded)."""
    if not scene.caught_up(SETTLE_S):
        raise TimeoutError(f"the watchers did not start within {SETTLE_S:.0f} s: {', '.join(scene.behind())}")


def _resumed(proc: Proc) -> None:
    """Wait until this run of a watcher resumed every table (so that a transaction the run before
    left open is aborted, and cannot be taken for one of this run)."""
    wait_for(
        lambda: (
            not proc.alive()
            or any(ln.get("msg") == "all tables resumed" for ln in proc.run_lines(proc.starts - 1))
        ),
        SETTLE_S,
        f"{proc.name} to resume its tables",
        every_s=0.2,
    )


def _kill_landing(scene: Scene, proc: Proc, delay_s: float, open_on: str) -> list[str]:
    """Wait ``delay_s``, then for records in an open transaction (on ``open_on``: actions or
    changes), then SIGKILL ``proc``; the evidence after its death."""
    time.sleep(delay_s)  # a seeded moment: when to look for a landing, not a wait for a condition
    partitions = [p for p in scene.partitions() if open_on in p[0]]
    # killed anyway when none comes: between transactions (the evidence says so)
    poll_until(lambda: not proc.alive() or scene.open_on(partitions), 30, every_s=0.005)
    if not proc.alive():
        return [f"{proc.name} had exited {proc.popen.returncode if proc.popen else '?'} before the kill"]
    proc.kill9()
    return scene.where_after_kill()


# --- 1 ------------------------------------------------------------------------------------------------


def watcher_kills(run: Run, plan: Plan) -> ClassResult:
    result = ClassResult(1, TITLES[1], plan.need)
    scene = Scene(run, "kill", 2, weights={"large-append": 20, "update": 20}, top={"txn_max_records": 150})
    try:
        watcher = scene.watcher("watch").start()
        _await_start(scene)
        scene.start_writer()
        clock = Clock()

        def inject() -> Fault:
            at = clock.now()
            where = _kill_landing(scene, watcher, scene.rng.uniform(0.2, 2.0), ".actions")
            landed = any(w.startswith(("open transaction", "mid-version")) for w in where)
            _resumed(watcher.start())
            return Fault("kill -9", at, where, landed)

        _loop(result, plan, clock, inject)
        _finish(scene, result, [watcher])
    finally:
        scene.close()
    return result


# --- 2 ------------------------------------------------------------------------------------------------

SESSION_MS = 6000


def group_faults(run: Run, plan: Plan) -> ClassResult:
    result = ClassResult(2, TITLES[2], plan.need)
    scene = Scene(
        run,
        "group",
        plan.tables_group,
        weights={"large-append": 4},
        top={"group": {"name": f"chaos-{run.seed}", "shards": 16, "session_timeout_ms": SESSION_MS}},
        max_pause_s=0.1,
    )
    serial = [0]

    def member() -> Proc:
        serial[0] += 1
        return scene.watcher(f"member{serial[0]}").start()

    try:
        members = [member() for _ in range(3)]
        _await_start(scene)
        scene.start_writer()
        clock = Clock()
        # every kind comes in turn, in a seeded order
        kinds = scene.rng.sample(["kill -9", "SIGSTOP", "join, then kill -9"], 3)

        def inject() -> Fault:
            at = clock.now()
            time.sleep(scene.rng.uniform(0.5, 3.0))  # a seeded moment
            kind = kinds[len(result.faults) % len(kinds)]
            where: list[str] = []
            if kind == "join, then kill -9":
                joined = member()
                members.append(joined)
                # kill an older member while the newcomer takes its share
                wait_for(
                    lambda: any(ln.get("msg") == "shards assigned" for ln in joined.lines()),
                    SETTLE_S,
                    "the new member's assignment",
                )
                time.sleep(scene.rng.uniform(0, 0.5))
            victim = scene.rng.choice(
                [m for m in members if m.alive() and m is not members[-1]]
                if kind.startswith("join")
                else [m for m in members if m.alive()]
            )
            from chaos.evidence import held_tables, moving

            held = held_tables(victim)
            moves = moving([m for m in members if m is not victim])
            if held:
                where.append(f"{victim.name} held {held} tables")
            if moves:
                where.append(f"during a table move to {', '.join(moves)}")
            if kind == "SIGSTOP":
                victim.pause()
                paused_s = SESSION_MS / 1000 + scene.rng.uniform(1, 4)
                time.sleep(paused_s)  # the fault itself: a pause past the session timeout
                victim.resume()
                kind = f"SIGSTOP {paused_s:.1f} s"
                try:
                    wait_for(
                        lambda: any(
                            str(ln.get("msg", "")).startswith(("table released", "shards lost"))
                            for ln in victim.lines(since_start=victim.starts - 1)
                        ),
                        SETTLE_S,
                        f"{victim.name} to notice it was fenced",
                    )
                    where.append(f"{victim.name} released its tables after SIGCONT")
                except TimeoutError:
                    where.append(f"{victim.name} did not say it lost its tables")
            else:
                victim.kill9()
                members.remove(victim)
                members.append(member())  # a replacement joins
            where += scene.where_after_kill()
            if not scene.caught_up(SETTLE_S):
                result.failures.append(f"after {kind} at {at} s, not caught up: {', '.join(scene.behind())}")
            return Fault(kind, at, where, held > 0)

        _loop(result, plan, clock, inject)
        _finish(scene, result, [m for m in members if m.alive()])
    finally:
        scene.close()
    return result


# --- 3 ------------------------------------------------------------------------------------------------


def broker_faults(run: Run, plan: Plan) -> ClassResult:
    result = ClassResult(3, TITLES[3], plan.need)
    scene = Scene(run, "broker", 2, weights={"large-append": 40, "update": 20}, top={"txn_max_records": 150})
    try:
        watcher = scene.watcher("watch").start()
        _await_start(scene)
        scene.start_writer()
        clock = Clock()
        turn = [0]

        def inject() -> Fault:
            at = clock.now()
            time.sleep(scene.rng.uniform(0.5, 3.0))  # a seeded moment
            outage = turn[0] % 2 == 1 or not plan.broker_kills
            turn[0] += 1
            before = scene.latest_versions()
            seen: dict[str, int] = {}
            with contextlib.suppress(TimeoutError):  # the fault comes anyway: the evidence says so
                seen = wait_for(scene.open_now, 30, "an open transaction", every_s=0.005)
            where = [f"open transaction {k}: {n} records when the fault began" for k, n in seen.items()]
            if outage:
                down_s = run.txn_timeout_ms / 1000 + scene.rng.uniform(3, 8)
                run.broker.stop()
                kind = f"broker stop {down_s:.0f} s"
            else:
                down_s = scene.rng.uniform(0, 3)
                run.broker.kill9()
                kind = f"broker kill -9, {down_s:.0f} s down"
            time.sleep(down_s)  # the fault itself: how long the broker stays away
            committed = sum(v - before[t] for t, v in scene.latest_versions().items())
            run.broker.start()
            if committed:
                where.append(f"{committed} versions committed while it was down")
            code = watcher.wait_exit(0) if not watcher.alive() else None
            if code is not None:
                result.notes.append(f"the watcher exited {code} after {kind}; restarted")
                watcher.start()
            if not _caught_up_or_remedied(run, scene, watcher, result, kind):
                result.failures.append(f"after {kind} at {at} s, not caught up: {', '.join(scene.behind())}")
            if not watcher.alive():
                result.failures.append(
                    f"the watcher exited {watcher.popen.returncode if watcher.popen else '?'} after {kind}"
                )
                watcher.start()
            landed = any(w.startswith("open transaction") for w in where) or (outage and committed > 0)
            return Fault(kind, at, where, landed)

        _loop(result, plan, clock, inject)
        _finish(scene, result, [watcher])
        for line in run.broker.skipped_markers(scene.prefix):
            result.notes.append(f"the broker skipped transaction markers at a restart: {line}")
    finally:
        scene.close()
    return result


HANGING = "transaction hanging on"


def _caught_up_or_remedied(run: Run, scene: Scene, watcher: Proc, result: ClassResult, kind: str) -> bool:
    """Whether the tables catch up within SETTLE_S. A transaction the watcher reports hanging
    (Kafka skipped its markers at the restart) gets the operator's remedy its log line names,
    ``deltamirror local kafka abort-hanging``, noted in the report; the tables must catch up then."""
    reported = sum(HANGING in str(ln.get("msg", "")) for ln in watcher.lines())
    deadline = time.monotonic() + SETTLE_S
    while (left := deadline - time.monotonic()) > 0:
        if scene.caught_up(min(left, 20.0)):
            return True
        now = sum(HANGING in str(ln.get("msg", "")) for ln in watcher.lines())
        if now > reported:
            reported = now
            aborted = run.broker.abort_hanging()
            result.notes.append(
                f"after {kind}: the watcher reported a hanging transaction; abort-hanging: "
                + ("; ".join(aborted) if aborted else "found none")
            )
    return False


# --- 4 ------------------------------------------------------------------------------------------------


def fencing(run: Run, plan: Plan) -> ClassResult:
    result = ClassResult(4, TITLES[4], plan.need)
    scene = Scene(run, "fence", 1)
    try:
        current = scene.watcher("watch0").start()
        _await_start(scene)
        scene.start_writer()
        clock = Clock()
        serial = [0]

        def inject() -> Fault:
            nonlocal current
            at = clock.now()
            time.sleep(scene.rng.uniform(0.5, 3.0))  # a seeded moment
            serial[0] += 1
            second = scene.watcher(f"watch{serial[0]}").start()
            code = current.wait_exit(SETTLE_S)
            where = []
            fenced = (
                code is not None
                and code != 0
                and any(
                    "fenced" in str(ln.get("msg", "")) + str(ln.get("error", "")) for ln in current.lines()
                )
            )
            if code is None:
                where.append(f"{current.name} still runs {SETTLE_S:.0f} s after {second.name} started")
                current.kill9()
            else:
                where.append(f"{current.name} exited {code}{' (fenced)' if fenced else ''}")
            if not second.alive():
                where.append(f"{second.name} exited too")
                result.failures.append(
                    f"{second.name} exited {second.popen.returncode if second.popen else '?'}"
                )
                second.start()
            current = second
            return Fault("second watcher", at, where, fenced)

        _loop(result, plan, clock, inject)
        _finish(scene, result, [current])
    finally:
        scene.close()
    return result


# --- 5 ------------------------------------------------------------------------------------------------

#: the --exec target of invalidate: appends "<its parent's pid> <the document>" to $CHAOS_OUT
#: a document cut short (its sender killed while writing it) is refused, as a receiver that checks
#: its input would: exit 1, so that it is delivered again
RECEIVER = 'line=$(cat); case "$line" in *"}") printf "%s %s\\n" "$PPID" "$line" >> "$CHAOS_OUT" ;; *) exit 1 ;; esac'


def consumer_kills(run: Run, plan: Plan) -> ClassResult:
    result = ClassResult(5, TITLES[5], plan.need)
    scene = Scene(run, "consumers", 1, weights={"large-append": 10})
    t = scene.topics[0]
    state = scene.dir / "snapshot-state"
    delivered = scene.dir / "invalidated.txt"
    delivered.touch()
    source = ["--bootstrap-servers", scene.bootstrap, "--topic", t.actions, "--commits-topic", t.commits]
    snapshot = scene.proc(
        "consume-snapshot",
        [
            "consume-snapshot",
            *source,
            "--state-dir",
            str(state),
            "--checkpoint-interval-versions",
            "3",
            "--group-id",
            f"chaos-snap-{run.seed}",
        ],
    )
    invalidate = scene.proc(
        "invalidate",
        [
            "invalidate",
            *source,
            "--group-id",
            f"chaos-inv-{run.seed}",
            # no --state-dir: what was delivered is stored after each batch and committed to the
            # group in the background, so a restart skips what the group acknowledged
            "--exec",
            f"sh -c '{RECEIVER}'",
        ],
        env={"CHAOS_OUT": str(delivered)},
    )
    try:
        watcher = scene.watcher("watch").start()
        _await_start(scene)
        scene.start_writer()
        wait_for(lambda: scene.commits.wait_each({t.commits: 0}, 1) is not None, SETTLE_S, "version 0")
        snapshot.start()
        invalidate.start()
        clock = Clock()

        def progress(proc: Proc) -> int:
            if proc is snapshot:
                return len(_applied(proc.run_lines(proc.starts - 1)))
            return len(_deliveries(delivered))

        def inject() -> Fault:
            at = clock.now()
            victim = scene.rng.choice([snapshot, invalidate])
            base = progress(victim)
            time.sleep(scene.rng.uniform(0.3, 2.5))  # a seeded moment
            # kill it while it works: once it applied or delivered a version more
            poll_until(lambda: progress(victim) > base, 60)
            latest = scene.latest_versions()[t.commits]
            applied = _last_versions(victim, delivered, snapshot)
            victim.kill9()
            where = (
                [f"{victim.name} at v{applied} while the table is at v{latest}"]
                if applied is not None
                else []
            )
            landed = applied is not None and applied < latest
            if landed:
                where.append(f"{latest - applied} versions still to deliver")
            victim.start()
            return Fault(f"kill -9 {victim.name}", at, where, landed)

        _loop(result, plan, clock, inject)
        scene.stop_writer()
        last = scene.latest_versions()[t.commits]
        try:
            wait_for(
                lambda: _last_versions(snapshot, delivered, snapshot) == last,
                SETTLE_S,
                "consume-snapshot to apply the last version",
            )
            wait_for(
                lambda: _last_versions(invalidate, delivered, snapshot) == last,
                SETTLE_S,
                "invalidate to deliver the last version",
            )
        except TimeoutError as exc:
            result.failures.append(str(exc))
        _finish(scene, result, [watcher, snapshot, invalidate])
        result.tally.records += _check_consumers(result, scene, state, delivered, last, snapshot)
    finally:
        scene.close()
    return result


def _last_versions(proc: Proc, delivered: Path, snapshot: Proc) -> int | None:
    """The last version ``proc`` applied (consume-snapshot's lines) or delivered (the receiver's file)."""
    import json

    if proc is snapshot:
        versions = _applied(proc.run_lines(proc.starts - 1))
    else:
        versions = [int(json.loads(line.split(" ", 1)[1])["version"]) for line in _deliveries(delivered)]
    return versions[-1] if versions else None


def _deliveries(delivered: Path) -> list[str]:
    """The receiver's complete lines: the one it is still writing has no newline yet (a shell's
    printf writes a long document in several pieces)."""
    return delivered.read_text().split("\n")[:-1]


def _applied(lines: list[dict[str, Any]]) -> list[int]:
    """The versions of consume-snapshot's output lines (its log lines have a ``msg``)."""
    return [int(ln["version"]) for ln in lines if "tableId" in ln and "msg" not in ln]


def _check_consumers(
    result: ClassResult, scene: Scene, state: Path, delivered: Path, last: int, snapshot: Proc
) -> int:
    """Each run of each consumer: consecutive versions from where the one before saved (no gap);
    all together 0..last at least once; consume-snapshot's saved state equal to ``deltamirror
    snapshot``. Returns how many deliveries were checked."""
    import json
    import os

    from chaos.broker import cli

    t = scene.topics[0]
    runs: dict[str, list[list[int]]] = {"invalidate": [], "consume-snapshot": []}
    pid = None
    for line in _deliveries(delivered):
        ppid, doc = line.split(" ", 1)
        if ppid != pid:
            runs["invalidate"].append([])
            pid = ppid
        runs["invalidate"][-1].append(int(json.loads(doc)["version"]))
    for n in range(snapshot.starts):
        runs["consume-snapshot"].append(_applied(snapshot.run_lines(n)))
    checked = 0
    for name, by_run in runs.items():
        seen_max = -1
        for versions in by_run:
            checked += len(versions)
            if not versions:
                continue
            if versions[0] > seen_max + 1:
                result.tally.lost += versions[0] - seen_max - 1
                result.tally.problems.append(f"{name}: a run began at v{versions[0]} after v{seen_max}")
            for a, b in itertools.pairwise(versions):
                if b != a + 1:
                    result.tally.out_of_order += 1
                    result.tally.problems.append(f"{name}: v{b} after v{a} in one run")
            seen_max = max(seen_max, versions[-1])
        missing = sorted(set(range(last + 1)) - {v for r in by_run for v in r})
        if missing:
            result.tally.lost += len(missing)
            result.tally.problems.append(f"{name}: never delivered {missing[:5]}")
    # the saved state against the table's own snapshot
    folders = [p for p in (state / "tables").iterdir() if p.is_dir()]
    if len(folders) != 1:
        result.failures.append(f"consume-snapshot saved {len(folders)} table states, expected 1")
        return checked
    mine = cli(
        "snapshot",
        str(folders[0]),
        "--allow-path-prefix",
        t.path.as_uri(),
        "--format",
        "jsonl",
        "--no-progress",
    )
    theirs = cli("snapshot", str(t.path), "--format", "jsonl", "--no-progress")
    if mine.returncode or theirs.returncode:
        result.failures.append(f"deltamirror snapshot failed: {mine.stderr[-300:]} {theirs.stderr[-300:]}")
        return checked
    head_m, *files_m = [json.loads(x) for x in mine.stdout.splitlines()]
    head_t, *files_t = [json.loads(x) for x in theirs.stdout.splitlines()]
    root = str(t.path)

    def absolute(p: str) -> str:
        from urllib.parse import unquote

        p = unquote(p.removeprefix("file://"))
        return os.path.normpath(p if p.startswith("/") else os.path.join(root, p))

    got = {(absolute(f["path"]), f["size"]) for f in files_m}
    want = {(absolute(f["path"]), f["size"]) for f in files_t}
    if head_m["version"] != head_t["version"] or got != want:
        result.tally.mismatched += 1
        result.tally.problems.append(
            f"consume-snapshot state v{head_m['version']} ({len(got)} files) != snapshot v{head_t['version']} "
            f"({len(want)} files; {len(got - want)} extra, {len(want - got)} missing)"
        )
    return checked


# --- 6 ------------------------------------------------------------------------------------------------


def row_change_kills(run: Run, plan: Plan) -> ClassResult:
    result = ClassResult(6, TITLES[6], plan.need)
    scene = Scene(
        run,
        "rows",
        2,
        row_changes=True,
        weights={"update": 30, "large-append": 15, "delete": 12},
        top={"txn_max_records": 400},
    )
    try:
        watcher = scene.watcher("watch").start()
        _await_start(scene)
        scene.start_writer()
        clock = Clock()

        def inject() -> Fault:
            at = clock.now()
            where = _kill_landing(scene, watcher, scene.rng.uniform(0.2, 2.0), ".changes")
            landed = any(("open transaction" in w and ".changes" in w) or " rows " in w for w in where)
            _resumed(watcher.start())
            return Fault("kill -9", at, where, landed)

        _loop(result, plan, clock, inject)
        _finish(scene, result, [watcher])
    finally:
        scene.close()
    return result


# --- 7 ------------------------------------------------------------------------------------------------

#: versions the writer commits before the watcher's first start: the first catch-up's range
AHEAD_VERSIONS = 40
#: versions published one by one after the catch-up committed, the writer still writing
TAIL_VERSIONS = 10
#: the watcher's transaction.timeout.ms here: a catch-up is one transaction, growing with the table
NET_TXN_TIMEOUT_MS = 120_000
CATCH_UP = re.compile(r"net catch-up of versions (\d+) to (\d+)")


def _catch_up_range(proc: Proc, run: int) -> tuple[int, int] | None:
    """The versions the ``run``-th run of ``proc`` said its net catch-up covers (None: not begun)."""
    for line in proc.run_lines(run):
        found = CATCH_UP.search(str(line.get("msg", "")))
        if found:
            return int(found.group(1)), int(found.group(2))
    return None


def net_catch_up_kills(run: Run, plan: Plan) -> ClassResult:
    """A table the writer is ahead on at start, watched with a net catch-up from version 0: the
    watcher is killed while the catch-up's one transaction is open (its run's log names the range,
    the broker holds records of it open, no progress is committed), restarted (its catch-up reaches
    the version the table has then), and killed again, the writer still writing; then the catch-up
    commits and the next versions go out one by one."""
    result = ClassResult(7, TITLES[7], plan.need)
    scene = Scene(
        run,
        "net",
        1,
        row_changes=True,
        net_catch_up=True,
        weights={"update": 30, "delete": 12, "large-append": 8},
        txn_timeout_ms=NET_TXN_TIMEOUT_MS,
        max_pause_s=0.5,
    )
    try:
        for _ in range(AHEAD_VERSIONS):
            scene.writer.step()
        scene.start_writer()
        scene.net_started()
        watcher = scene.watcher("watch").start()
        clock = Clock()
        committed: list[str] = []

        def inject() -> Fault:
            at = clock.now()
            n = watcher.starts - 1
            # in turn: while the range's actions go out, or once its net events do
            phase = (".actions", ".changes")[len(result.faults) % 2]
            partitions = [p for p in scene.partitions() if phase in p[0]]
            # the run's catch-up has begun (its log says so) and has records of it on the broker
            poll_until(
                lambda: (
                    not watcher.alive()
                    or bool(scene.progress.read(idle_s=0.0))
                    or (_catch_up_range(watcher, n) is not None and scene.open_on(partitions))
                ),
                SETTLE_S,
                every_s=0.02,
            )
            if phase == ".actions":
                time.sleep(scene.rng.uniform(0, 0.3))  # a seeded moment inside it
            if not watcher.alive():
                code = watcher.wait_exit(0)
                result.failures.append(f"the watcher exited {code} during its catch-up")
                watcher.start()
                return Fault("kill -9", at, [f"the watcher had exited {code} before the kill"], False)
            watcher.kill9()
            span = _catch_up_range(watcher, n)
            where = [f"catch-up of v{span[0]} to v{span[1]} begun" if span else "no catch-up begun"]
            still_open = scene.open_now()
            where += [f"open transaction {k}: {c} records" for k, c in still_open.items()]
            progress = scene.progress.read()
            if progress:
                committed.append(f"the catch-up of run {n} committed before the kill")
                where += committed
            else:
                where.append("no progress committed")
            watcher.start()
            return Fault("kill -9", at, where, span is not None and bool(still_open) and not progress)

        while (
            not committed
            and len(result.faults) < plan.max_faults
            and (clock.now() < plan.duration_s or result.landed < plan.need)
        ):
            result.faults.append(inject())
        # the last run's catch-up commits, then the versions after it go out one by one
        wait_for(scene.progress.read, SETTLE_S, "the catch-up to commit", every_s=0.5)
        # the last run that began a catch-up committed it (the runs after it found progress)
        began = [(n, r) for n in range(watcher.starts) if (r := _catch_up_range(watcher, n)) is not None]
        span = began[-1][1] if began else None
        if span is None:
            result.failures.append("no run of the watcher logged a catch-up")
        else:
            result.notes.append(
                f"the committed catch-up: v{span[0]} to v{span[1]} (run {began[-1][0] + 1} of the watcher)"
            )
            path = scene.topics[0].path
            wait_for(
                lambda: latest_version(path) >= span[1] + TAIL_VERSIONS,
                SETTLE_S,
                f"{TAIL_VERSIONS} versions after the catch-up",
            )
        _finish(scene, result, [watcher])
        t = scene.topics[0]
        assert t.transaction is not None
        on_topic = net_block_version(
            [json.loads(m.value) for m in read_topic(run.broker.bootstrap, t.transaction)]
        )
        if span is not None and on_topic != span[1]:
            result.failures.append(
                f"the net block is of v{on_topic}, the committed catch-up's log says v{span[1]}"
            )
    finally:
        scene.close()
    return result


# --- 8 ------------------------------------------------------------------------------------------------

SIGNAL_BLOCK = re.compile(r"net row changes of versions (\d+) to (\d+) on a signal")
#: how long the last signal's block may take to be committed (`signal --wait --timeout`)
SIGNAL_WAIT_S = 180.0


def signal_blocks(proc: Proc, run: int | None = None) -> list[tuple[int, int]]:
    """The (first, last) of every net block ``proc`` (its ``run``-th run, or every run) said it
    began publishing on a signal."""
    out: list[tuple[int, int]] = []
    for n in range(proc.starts) if run is None else [run]:
        for line in proc.run_lines(n):
            found = SIGNAL_BLOCK.search(str(line.get("msg", "")))
            if found:
                out.append((int(found.group(1)), int(found.group(2))))
    return out


def _send_net_changes(scene: Scene, table: Path, first: int, *extra: str) -> subprocess.CompletedProcess[str]:
    return cli(
        "signal",
        "net-changes",
        str(table),
        "--from-version",
        str(first),
        "--config",
        str(scene.config),
        *extra,
        timeout_s=SIGNAL_WAIT_S + 60,
    )


def signal_block_kills(run: Run, plan: Plan) -> ClassResult:
    """A watcher publishing row changes per version is sent ``signal net-changes`` for a range of
    the versions it published, and killed while the signal's block is out (its run logged the
    block, records of an open transaction on the changes topic): the block is aborted whole and,
    the signal taken once, not published again by the next run. The writer goes on writing; after
    the faults one more signal, sent with ``--wait``, must be answered done: its block committed."""
    result = ClassResult(8, TITLES[8], plan.need)
    scene = Scene(
        run,
        "signal",
        1,
        row_changes=True,
        weights={"update": 30, "delete": 12, "large-append": 16},
        txn_timeout_ms=NET_TXN_TIMEOUT_MS,
        max_pause_s=0.5,
    )
    table = scene.topics[0].path
    try:
        for _ in range(AHEAD_VERSIONS):  # a range whose net block is thousands of events
            scene.writer.step()
        watcher = scene.watcher("watch").start()
        _await_start(scene)
        scene.start_writer()
        clock = Clock()
        changes = [p for p in scene.partitions() if ".changes" in p[0]]

        def inject() -> Fault:
            at = clock.now()
            n = watcher.starts - 1
            begun = len(signal_blocks(watcher, n))
            first = scene.rng.randrange(1, AHEAD_VERSIONS // 2)
            sent = _send_net_changes(scene, table, first)
            if sent.returncode != 0:
                result.failures.append(f"signal net-changes exited {sent.returncode}: {sent.stderr[-500:]}")
                return Fault("kill -9", at, ["the signal was not sent"], False)
            # the block has begun (its run's log says so: it is then in its own transaction)
            poll_until(
                lambda: (
                    not watcher.alive() or (len(signal_blocks(watcher, n)) > begun and scene.open_on(changes))
                ),
                SETTLE_S,
                every_s=0.01,
            )
            if not watcher.alive():
                code = watcher.wait_exit(0)
                result.failures.append(f"the watcher exited {code} before its signal's block")
                _resumed(watcher.start())
                return Fault("kill -9", at, [f"the watcher had exited {code} before the kill"], False)
            watcher.kill9()
            blocks = signal_blocks(watcher, n)[begun:]
            where = [f"signal block of v{f} to v{b} begun" for f, b in blocks] or ["no signal block begun"]
            still_open = {k: c for k, c in scene.open_now().items() if ".changes" in k}
            where += [f"open transaction {k}: {c} records" for k, c in still_open.items()]
            _resumed(watcher.start())
            return Fault("kill -9", at, where, bool(blocks) and bool(still_open))

        _loop(result, plan, clock, inject)
        # a signal the running watcher takes whole: answered done once its block is committed
        sent = _send_net_changes(scene, table, 1, "--wait", "--timeout", str(SIGNAL_WAIT_S))
        if sent.returncode != 0:
            result.failures.append(f"the last signal (--wait) exited {sent.returncode}: {sent.stderr[-500:]}")
        else:
            result.notes.append(f"the last signal was answered: {sent.stdout.strip()[-300:]}")
        _finish(scene, result, [watcher], signal_blocks=tuple(signal_blocks(watcher)))
    finally:
        scene.close()
    return result


CLASSES = {
    1: watcher_kills,
    2: group_faults,
    3: broker_faults,
    4: fencing,
    5: consumer_kills,
    6: row_change_kills,
    7: net_catch_up_kills,
    8: signal_block_kills,
}

TITLES = {
    1: "kill -9 of a watcher",
    2: "group of 3: kill -9, SIGSTOP, join",
    3: "broker kill -9, outage past the txn timeout",
    4: "two watchers on one table",
    5: "kill -9 of consume-snapshot and invalidate",
    6: "kill -9 while rows are paired and published",
    7: "kill -9 during a net catch-up",
    8: "kill -9 during a signal's net block",
}
