"""One fault class's world: its tables (written by :class:`chaos.writer.Writer`), their topics, the
watcher configuration, and the readers that see what the broker holds while faults land."""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml
from chaos.broker import Broker
from chaos.checker import TableTopics, Tally, check_table
from chaos.evidence import ProgressTail, mid_version, open_transactions
from chaos.procs import Proc, watch_argv
from chaos.writer import Writer

from support.commits_reader import CommitsReader
from support.kafka import TransactionProbe, new_topic

#: partitions of each changes topic (created before the watcher starts): rows spread by key
CHANGES_PARTITIONS = 3


@dataclass
class Fault:
    kind: str
    at_s: float
    where: list[str]
    landed: bool

    def describe(self) -> str:
        mark = "landed" if self.landed else "missed"
        return f"{self.at_s:7.1f}s {self.kind}: {mark}: {'; '.join(self.where) or 'no evidence'}"


@dataclass
class ClassResult:
    number: int
    title: str
    need: int
    faults: list[Fault] = field(default_factory=list)
    tally: Tally = field(default_factory=Tally)
    notes: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def landed(self) -> int:
        return sum(f.landed for f in self.faults)

    @property
    def ok(self) -> bool:
        return self.landed >= self.need and self.tally.clean and not self.failures


@dataclass
class Run:
    """What every class shares: the broker, a work folder, the seed."""

    broker: Broker
    work: Path
    seed: int
    #: the watchers' transaction.timeout.ms (low, so that an outage past it is short in wall time)
    txn_timeout_ms: int = 10_000


class Scene:
    def __init__(
        self,
        run: Run,
        slug: str,
        tables: int,
        *,
        row_changes: bool = False,
        weights: dict[str, int] | None = None,
        top: dict[str, Any] | None = None,
        max_pause_s: float = 0.3,
        net_catch_up: bool = False,
        txn_timeout_ms: int | None = None,
    ) -> None:
        self.run = run
        self.bootstrap = run.broker.bootstrap
        self.slug = slug
        self.dir = run.work / slug
        self.dir.mkdir(parents=True)
        self.rng = random.Random(f"{run.seed}-{slug}")
        paths = [self.dir / f"{slug}-t{i:02d}" for i in range(tables)]
        prefix = f"chaos-{run.seed}-{slug}"
        self.prefix = prefix
        self.topics = [
            TableTopics(
                p,
                f"{prefix}.{p.name}.actions",
                f"{prefix}.{p.name}.commits",
                f"{prefix}.{p.name}.changes" if row_changes else None,
                f"{prefix}.{p.name}.transaction" if row_changes else None,
            )
            for p in paths
        ]
        self.writer = Writer(paths, self.rng.randrange(2**31), max_pause_s=max_pause_s)
        if weights:
            self.writer.weights.update(weights)
        self.writer.create()
        for t in self.topics:
            if t.changes is not None:
                new_topic(self.bootstrap, t.changes, CHANGES_PARTITIONS, {"retention.ms": "-1"})
        self.progress_topic = f"{prefix}.progress"
        self.config = self.dir / "watch.yaml"
        table_entries = []
        for t in self.topics:
            entry: dict[str, Any] = {
                "uri": str(t.path),
                "snapshot_mode": "from-version",
                "from_version": 0,
                "actions_topic": t.actions,
                "commits_topic": t.commits,
                "poll_interval_s": 0.2,
            }
            if row_changes:
                entry.update(
                    changes_topic=t.changes,
                    transaction_topic=t.transaction,
                    row_changes={
                        "enabled": True,
                        "key_columns": ["id"],
                        "pairing_memory_mb": 1,
                        **({"net_catch_up": True} if net_catch_up else {}),
                    },
                )
            table_entries.append(entry)
        config = {
            "kafka": {
                "bootstrap_servers": self.bootstrap,
                "extra": {"transaction.timeout.ms": str(txn_timeout_ms or run.txn_timeout_ms)},
            },
            "tables": table_entries,
            "progress_topic": self.progress_topic,
            "transactional_id_prefix": prefix,
            "signal_topic": f"{prefix}.signals",
            **(top or {}),
        }
        self.config.write_text(yaml.safe_dump(config, sort_keys=False))
        self.probe = TransactionProbe(self.bootstrap)
        self.progress = ProgressTail(self.bootstrap, self.progress_topic)
        self.commits = CommitsReader(self.bootstrap, [t.commits for t in self.topics])
        self.procs: list[Proc] = []
        #: with a net catch-up: each table's version when its first watcher started (see net_started)
        self.net_catch_up = net_catch_up
        self.net_from: dict[Path, int] = {}
        self._stop_writer = threading.Event()
        self._writer_thread: threading.Thread | None = None

    # --- processes -------------------------------------------------------------------------------

    def watcher(self, name: str, *extra: str) -> Proc:
        proc = Proc(name, watch_argv(self.config, *extra), self.dir / f"{name}.log")
        self.procs.append(proc)
        return proc

    def proc(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Proc:
        proc = Proc(name, argv, self.dir / f"{name}.log", env)
        self.procs.append(proc)
        return proc

    # --- the writer ------------------------------------------------------------------------------

    def start_writer(self) -> None:
        self._stop_writer.clear()
        self._writer_thread = self.writer.run_until(self._stop_writer)

    def stop_writer(self) -> None:
        self._stop_writer.set()
        if self._writer_thread is not None:
            self._writer_thread.join(120)

    # --- what the broker holds -----------------------------------------------------------------

    def latest_versions(self) -> dict[str, int]:
        """Each commits topic -> its table's latest version, from the log folder."""
        return {t.commits: latest_version(t.path) for t in self.topics}

    def caught_up(self, timeout_s: float) -> bool:
        """Whether every table's summary of its latest version (now) is out within ``timeout_s``.

        Every 30 s without it, the reader starts over with a new client: after a broker restart a
        consumer that was assigned before it was once seen to read nothing more (CI, class 3),
        while a new one read every summary at once."""
        targets = self.latest_versions()
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            if self.commits.wait_each(targets, min(left, 30.0)) is not None:
                return True
            self.commits.close()
            self.commits = CommitsReader(self.bootstrap, [t.commits for t in self.topics])
        return False

    def behind(self) -> list[str]:
        latest = self.latest_versions()
        return [
            f"{t.rsplit('.', 2)[-2]} at v{self.commits.latest.get(t, -1)} of {v}"
            for t, v in latest.items()
            if self.commits.latest.get(t, -1) < v
        ]

    def partitions(self) -> list[tuple[str, int]]:
        out = [(t.actions, 0) for t in self.topics]
        for t in self.topics:
            if t.changes is not None:
                out += [(t.changes, p) for p in range(CHANGES_PARTITIONS)]
        return out

    def open_now(self) -> dict[str, int]:
        return open_transactions(self.probe, self.partitions())

    def open_on(self, partitions: list[tuple[str, int]]) -> bool:
        """Whether any of these partitions has records in an open transaction now."""
        return bool(open_transactions(self.probe, partitions))

    def where_after_kill(self) -> list[str]:
        """The evidence once the killed process is gone: open transactions, versions cut."""
        where = [f"open transaction {k}: {n} records" for k, n in self.open_now().items()]
        where += [f"mid-version {m}" for m in mid_version(self.progress.read())]
        return where

    def net_started(self) -> None:
        """Note each table's version now, as its first watcher starts: a net catch-up's block is of
        that version or a later one."""
        for t in self.topics:
            self.net_from.setdefault(t.path, latest_version(t.path))

    def check(self, signal_blocks: tuple[tuple[int, int], ...] = ()) -> Tally:
        tally = Tally()
        for t in self.topics:
            if self.net_catch_up:
                t = replace(t, net_from=self.net_from.get(t.path, 0))
            if signal_blocks:
                t = replace(t, signal_blocks=signal_blocks)
            tally.add(check_table(self.bootstrap, t, latest_version(t.path)))
        for proc in self.procs:
            tally.problems += [f"{proc.name}: traceback: {tb}" for tb in proc.tracebacks()]
        return tally

    def close(self) -> None:
        self.stop_writer()
        for proc in self.procs:
            if proc.alive():
                proc.resume()
                proc.kill9()
        self.probe.close()
        self.progress.close()
        self.commits.close()


def latest_version(table: Path) -> int:
    """The newest commit file's version in ``table``'s log."""
    names = [p.name for p in (table / "_delta_log").glob("*.json")]
    return max(int(n[:20]) for n in names if len(n) == 25 and n[:20].isdigit())
