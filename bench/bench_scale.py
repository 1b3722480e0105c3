"""What a group of ``deltamirror watch`` instances costs with many tables, and how fast tables move.

Two measurements against a local broker of its own (tiny hand-written one-version tables,
snapshot mode ``latest``, notifications on as by default):

* ``idle``: ONE ``watch --group G`` instance with N tables (it owns every shard). From spawning it
  to the sum of its ``tables of the assigned shards resumed`` lines reaching N (startup; with
  ``--layout shared``, N tables' ``resuming table`` lines) and the CPU it took by then
  (``startup_cpu_s``), its thread count, its CPU (user+system of the whole process, all threads, from ``/proc``) over
  ``--idle-s`` seconds after a 5 s settle in % of one core, its RSS, and the commit pickup latency:
  a commit written (atomic rename) to one random table until its action is visible to a
  ``read_committed`` consumer of that table's actions topic (``--pickups`` tables, median/max,
  p50/p99; earlier rows were read in 0.2 s steps: their ``pickup_s.step_s`` says so).
  ``--layout per-table`` (default): the tables are configured, each with its own two topics;
  ``--layout shared``: the tables are found under one ``discover`` prefix with ``topics: shared``
  (two topics for all of them, keyed by tableId), which a broker holds at any table count.
  ``--poll-interval``: the tables' ``poll_interval_s`` (not set by default: 30 s for these local
  tables watched by notifications, 1 s before 2026-11-29's default). A commit wakes its table at
  once and the poll only bounds a lost notification: the idle CPU was mostly these polls.
  ``--settle-s``: the wait between the start and the idle measurement (default 5 s; after its
  resume each table still commits its first position, which at 10,000 tables takes longer).
  ``--workers``: the watchers' ``workers`` (not set by default: the setting's default).
  ``--storage s3`` (with ``--layout shared``): the tables are uploaded to a local S3 server
  (s3proxy, started as the tests start it: tests/support/s3proxy.py) and found under one S3
  prefix; the requests the server received during the idle seconds are counted from its request
  log (``s3_idle``: by kind, per table per poll at the tables' interval, 1 s on object stores by
  default, and per probe, the HEAD of version 1 each poll makes). No pickups there (the bench
  writes its commits locally). ``DM_BENCH_SCALE_RESULTS`` names another results file (trials),
  ``DM_BENCH_SCALE_KEEP_LOGS`` a folder the move's watcher logs are copied to, with its rows
  (``killed_at``: the kill's time, seconds since the epoch).
* ``move``: TWO instances in one group over ``--move-tables`` tables; once both run and every
  table published, one is SIGKILLed (or SIGTERMed), a commit is written to every table right after,
  and the time from the kill until every table has published it is taken (``all_published_s``;
  rows without ``measured_from`` ran from the last of those commits written, seconds later at
  10,000 tables: ``commits_written_s``): the survivor's own tables publish at
  once, so the figure is the time the dead member's tables took to move (the survivor's log gives
  how many moved, and when the last of them resumed: ``last_resumed_s``, publishing follows). The group's session timeout is recorded with it, and the survivor's CPU over
  that time (``survivor_cpu_s``: user+system, all threads). With ``--layout shared`` the
  tables are under one discover prefix with shared topics, published from version 0 (snapshot
  mode ``from-timestamp`` at the epoch), only the SIGKILL is measured, and the shared topics are
  then checked exactly once per table (``exactly_once``: lost, duplicated, out of order, with the
  fault campaign's reader and tally, tests/chaos/checker.py).

The 1-minute load average is recorded before and after each measurement: the machine is shared,
and a figure taken at a load above the core count is a loaded machine's, not the watcher's.
A size that does not start is a result too: its error line is kept (``failed``).

    python bench/bench_scale.py [--tables 100,1000] [--rounds 1] [--move-tables 200] [--no-move]
                                [--no-idle] [--idle-s 30] [--pickups 5] [--session-ms 10000]
                                [--port 19394] [--src DIR] [--fresh] [--layout per-table|shared]
                                [--poll-interval S] [--settle-s 5] [--storage local|s3]
                                [--workers N]

Results: rows appended to bench/results/scale.json (``--fresh`` starts it over), the plot
bench/results/scale.png, and a markdown table on stdout. Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import platform
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent / "tests"))  # support.commits_reader, shared with the group tests

from bench_idle import (  # noqa: E402  (a sibling script, not a package)
    _rss_mb,
    delete_topics,
    link_tree,
    pickup_latency,
    proc_cpu_s,
    thread_names,
    write_commit,
)

from support.commits_reader import CommitsReader  # noqa: E402

RESULTS = Path(os.environ.get("DM_BENCH_SCALE_RESULTS", BENCH / "results" / "scale.json"))
PLOT = BENCH / "results" / "scale.png"
RESUMED = "tables of the assigned shards resumed"


def cpu_by_thread_kind(pid: int) -> dict[str, float]:
    """CPU seconds of each kind of thread (rdk:broker, watch-<table>, python...) so far."""
    ticks = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/stat") as fh:
                head, rest = fh.read().rsplit(")", 1)
        except OSError:
            continue
        name = head.split("(", 1)[1]
        kind = (
            name.rstrip("0123456789-").split("-dm")[0] if not name.startswith("watch-") else "watch-<table>"
        )
        fields = rest.split()
        out[kind] = out.get(kind, 0.0) + (int(fields[11]) + int(fields[12])) / ticks
    return out


def load() -> float:
    return round(os.getloadavg()[0], 2)


def log_lines(path: Path) -> list[dict[str, Any]]:
    out = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            out.append(value)
    return out


def resumed_tables(path: Path, since: int = 0) -> int:
    return sum(int(x.get("tables", 0)) for x in log_lines(path)[since:] if x.get("msg") == RESUMED)


def resumed_lines(path: Path, since: int = 0) -> int:
    """Tables that logged ``resuming table`` (each once per resume) after line ``since``."""
    return len({x.get("table") for x in log_lines(path)[since:] if x.get("msg") == "resuming table"})


def board_rounds(path: Path, since: int = 0) -> dict[str, Any]:
    """The survivor's shared reads after line ``since``: per kind (``tails read`` per topic,
    ``progress read``), how many rounds, their tables (largest, total) and seconds (summed, max).
    Rounds of one table are not logged."""
    out: dict[str, Any] = {}
    for x in log_lines(path)[since:]:
        msg = x.get("msg")
        if msg not in ("tails read", "progress read"):
            continue
        kind = "progress" if msg == "progress read" else str(x.get("topic", "")).rsplit(".", 1)[-1]
        took = float(x.get("seconds", x.get("read_s", 0.0))) + float(x.get("settle_s", 0.0))
        r = out.setdefault(kind, {"rounds": 0, "tables": 0, "largest": 0, "seconds": 0.0, "max_s": 0.0})
        r["rounds"] += 1
        r["tables"] += int(x.get("tables", 0))
        r["largest"] = max(r["largest"], int(x.get("tables", 0)))
        r["seconds"] = round(r["seconds"] + took, 3)
        r["max_s"] = round(max(r["max_s"], took), 3)
    return out


def last_resumed_s(path: Path, since: int, killed_at: float) -> float | None:
    """When the last table resumed on this member after line ``since``, in seconds after
    ``killed_at`` (epoch seconds): the end of the moved tables' opens (publishing follows)."""
    last = None
    for x in log_lines(path)[since:]:
        if x.get("msg") == "resuming table" and isinstance(x.get("ts"), str):
            last = x["ts"]
    if last is None:
        return None
    at = datetime.datetime.fromisoformat(last.replace("Z", "+00:00")).timestamp()
    return round(at - killed_at, 2)


def assigned_tables(path: Path, since: int = 0) -> int:
    return sum(int(x.get("tables", 0)) for x in log_lines(path)[since:] if x.get("msg") == "shards assigned")


def error_line(path: Path) -> str:
    """The most telling line of a watcher that did not make it: its last error, else its tail."""
    lines = path.read_text(errors="replace").strip().splitlines()
    for line in reversed(lines):
        if any(word in line for word in ("ERROR", '"error"', "Error", "refus", "Failed", "limit")):
            return line[-400:]
    return " | ".join(lines[-2:])[-400:]


def make_tables(base: Path, n: int, run: str) -> list[Path]:
    tables = [base / "lake" / f"s{run}x{i}" for i in range(n)]
    for t in tables:
        write_commit(t, 0)
    return tables


def write_config(
    base: Path,
    bootstrap: str,
    tables: list[Path],
    run: str,
    session_ms: int,
    mode: str = "latest",
    layout: str = "per-table",
    poll_interval_s: float | None = None,
    s3: Any = None,
    s3_prefix: str = "",
    workers: int | None = None,
) -> Path:
    """``latest`` for the idle case; ``from-version`` 0 for moves: a table that resumes without
    progress after a commit would take that commit as its start (``latest``) and never publish it.
    ``shared``: the tables' folder as a discover prefix with ``topics: shared`` (``latest``, or
    ``from-timestamp`` from the epoch: version 0 on, for moves). ``s3``: the tables were uploaded
    under ``s3_prefix`` of that server (an :class:`S3Proxy`), the discover prefix is there.
    ``workers``: the watchers' ``workers`` (None: not set, the default)."""
    config = base / "watch.yaml"  # JSON is YAML
    if layout == "shared":
        where: dict[str, Any] = {
            "tables": [],
            "discover": [
                {
                    "uri": s3.url(s3_prefix) if s3 is not None else str(base / "lake"),
                    **({"storage_options": s3.storage_options} if s3 is not None else {}),
                    "name": f"dmscale-{run}",
                    "topics": "shared",
                    "snapshot_mode": mode,
                    # a prefix takes no from_version: from the epoch is from version 0
                    **({"from_timestamp": "1970-01-01T00:00:00Z"} if mode == "from-timestamp" else {}),
                    **({"poll_interval_s": poll_interval_s} if poll_interval_s is not None else {}),
                }
            ],
            "oversize_policy": "fail",  # records are not split on shared topics
        }
    else:
        where = {
            "tables": [
                {
                    "uri": str(t),
                    "snapshot_mode": mode,
                    **({"from_version": 0} if mode == "from-version" else {}),
                    **({"poll_interval_s": poll_interval_s} if poll_interval_s is not None else {}),
                }
                for t in tables
            ]
        }
    config.write_text(
        json.dumps(
            {
                "kafka": {"bootstrap_servers": bootstrap},
                **where,
                "progress_topic": f"dmscale.{run}.progress",
                "transactional_id_prefix": f"dmscale-{run}",
                "group": {"name": f"dmscale-{run}", "session_timeout_ms": session_ms},
                **({"workers": workers} if workers is not None else {}),
            }
        )
    )
    return config


#: ``--src``: a folder put first on the watchers' PYTHONPATH (another checkout's code)
PYTHONPATH: dict[str, str] = {}


def spawn(config: Path, log: Path) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "deltamirror.cli.main", "watch", "--config", str(config)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **PYTHONPATH}
    with log.open("ab") as out:
        return subprocess.Popen(argv, stdout=out, stderr=out, env=env)


def stop(proc: subprocess.Popen[bytes]) -> int | None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(90)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def actions_topic(table: Path, run: str, layout: str) -> str:
    return f"deltamirror.dmscale-{run}.actions" if layout == "shared" else f"deltamirror.{table.name}.actions"


class ResumingLines:
    """How many tables logged ``resuming table`` so far (the log read on from where it was left)."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset, self.tables, self._rest = path, 0, set[str](), b""

    def count(self) -> int:
        if not self.path.exists():
            return 0
        with self.path.open("rb") as fh:
            fh.seek(self.offset)
            data = self._rest + fh.read()
            self.offset = fh.tell()
        *lines, self._rest = data.split(b"\n")
        for line in lines:
            if b"resuming table" in line:
                try:
                    self.tables.add(str(json.loads(line).get("table")))
                except ValueError:
                    continue
        return len(self.tables)


#: the bench broker's pid (set in main): its memory maps are what bounds the partitions it holds
BROKER_PID: list[int] = []


def broker_load(bootstrap: str) -> dict[str, Any]:
    """What the local broker holds now: topics, partitions, and its memory maps (each partition's
    log segment maps an offset and a time index) beside vm.max_map_count."""
    from confluent_kafka.admin import AdminClient

    topics = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=30).topics
    out: dict[str, Any] = {
        "topics": len(topics),
        "partitions": sum(len(t.partitions) for t in topics.values()),
        "max_map_count": int(Path("/proc/sys/vm/max_map_count").read_text()),
    }
    if BROKER_PID:
        try:
            out["maps"] = len(Path(f"/proc/{BROKER_PID[0]}/maps").read_text().splitlines())
            out["rss_mb"] = _rss_mb(BROKER_PID[0])
        except OSError:
            pass
    return out


def cleanup(bootstrap: str, tables: list[Path], run: str, base: Path) -> None:
    topics = [f"deltamirror.{t.name}.{kind}" for t in tables for kind in ("actions", "commits")]
    topics += [f"deltamirror.dmscale-{run}.actions", f"deltamirror.dmscale-{run}.commits"]
    delete_topics(bootstrap, [*topics, f"dmscale.{run}.progress", f"deltamirror.dmscale-{run}.shards"])
    shutil.rmtree(base, ignore_errors=True)


def upload_tables(s3: Any, base: Path, tables: list[Path], prefix: str) -> None:
    """Every table's files put under ``prefix`` of the S3 server, in batches (s3fs sends a batch's
    PUTs concurrently)."""
    fs = s3.filesystem()
    files = [(t, f) for t in tables for f in sorted(s3.files_of(t))]
    for i in range(0, len(files), 2000):
        fs.pipe(
            {
                f"{s3.bucket}/{prefix}/{t.relative_to(base / 'lake').as_posix()}/{f}": (t / f).read_bytes()
                for t, f in files[i : i + 2000]
            }
        )


def s3_idle_requests(s3: Any, since: int, n: int, seconds: float, poll_s: float) -> dict[str, Any]:
    """What the S3 server received since ``since`` while the watcher idled: requests by kind, and per
    table per poll (``poll_s``: the tables' poll interval)."""
    requests = s3.requests(since)
    kinds = collections.Counter(r.kind for r in requests)
    total = sum(kinds.values())
    # the idle poll's probe: a HEAD of the next version's commit file (the bench's tables hold version
    # 0: version 1's, 404 while idle); the periodic checks HEAD version 0's
    probes = sum(1 for r in requests if r.kind == "HEAD" and r.key.endswith(f"/_delta_log/{1:020d}.json"))
    polls = n * seconds / poll_s
    return {
        "requests": dict(kinds),
        "probes": probes,
        "seconds": round(seconds, 2),
        "poll_s": poll_s,
        # at the nominal interval (polls that came late count as made: then this is low) ...
        "per_table_per_poll": round(total / polls, 3),
        # ... and per poll made (a poll is one probe, the rest is the periodic checks and scans)
        "per_probe": round(total / probes, 3) if probes else None,
        "per_table_per_s": round(total / (n * seconds), 3),
    }


def measure_idle(
    args: argparse.Namespace, bootstrap: str, n: int, rnd: int, s3: Any = None
) -> dict[str, Any]:
    run = uuid.uuid4().hex[:6]
    base = Path(tempfile.mkdtemp(prefix=f"dm-bench-scale-{n}-"))
    tables = make_tables(base, n, run)
    prefix = f"scale-{run}"
    if s3 is not None:
        upload_tables(s3, base, tables, prefix)
    config = write_config(
        base,
        bootstrap,
        tables,
        run,
        args.session_ms,
        layout=args.layout,
        poll_interval_s=args.poll_interval,
        s3=s3,
        s3_prefix=prefix,
        workers=args.workers,
    )
    log = base / "watch.log"
    out: dict[str, Any] = {
        "kind": "idle",
        **({"storage": "s3 (s3proxy)"} if s3 is not None else {}),
        "layout": args.layout,
        # None: not set (the setting's default: 30 s for a local table watched by notifications)
        "poll_interval_s": args.poll_interval,
        "workers": args.workers,
        "tables": n,
        "round": rnd,
        "load_before": load(),
    }
    resuming = ResumingLines(log)

    def started() -> int:
        return resuming.count() if args.layout == "shared" else resumed_tables(log)

    spawned = time.monotonic()
    proc = spawn(config, log)
    try:
        deadline = spawned + args.start_timeout_s
        while started() < n:
            if proc.poll() is not None or time.monotonic() > deadline:
                out["failed"] = (
                    f"{'exit ' + str(proc.returncode) if proc.poll() is not None else 'timeout'}"
                    f" after {time.monotonic() - spawned:.0f} s, {started()} of {n}"
                    f" resumed: {error_line(log)}"
                )
                kept = Path(tempfile.gettempdir()) / f"dm-bench-scale-failed-{n}-{run}.log"
                shutil.copyfile(log, kept)  # the whole story, outside the folder cleaned up below
                out["log"] = str(kept)
                return out
            time.sleep(0.1 if n <= 1000 else 0.5)
        out["startup_s"] = round(time.monotonic() - spawned, 2)
        # the CPU the start took (user+system, all threads): on a shared machine the wall time
        # follows the load, the CPU much less
        out["startup_cpu_s"] = round(proc_cpu_s(proc.pid), 2)
        out["load_started"] = load()
        # after its resume each table still reads its log and commits its first position (one
        # transaction per table through its shard's producer): at 10,000 tables that outlasts 5 s
        time.sleep(args.settle_s)
        out["settle_s"] = args.settle_s
        out["threads"] = len(os.listdir(f"/proc/{proc.pid}/task"))
        names = thread_names(proc.pid)
        out["threads_by_name"] = dict(names.most_common(6))
        out["kafka_clients"] = names.get("rdk:main", 0)  # librdkafka: one rdk:main thread per client
        kinds0 = cpu_by_thread_kind(proc.pid)
        mark = s3.mark() if s3 is not None else 0
        cpu0, t0 = proc_cpu_s(proc.pid), time.monotonic()
        time.sleep(args.idle_s)
        cpu1, t1 = proc_cpu_s(proc.pid), time.monotonic()
        if s3 is not None:
            # the poll interval of a table on an object store: poll_interval_s, else 1 s
            out["s3_idle"] = s3_idle_requests(s3, mark, n, t1 - t0, args.poll_interval or 1.0)
        kinds1 = cpu_by_thread_kind(proc.pid)
        # where the idle CPU goes, in % of one core, by kind of thread (threads that ended are missing)
        out["idle_cpu_pct_by_thread"] = {
            k: round(100 * (v - kinds0.get(k, 0.0)) / (t1 - t0), 2)
            for k, v in sorted(kinds1.items(), key=lambda kv: kinds0.get(kv[0], 0.0) - kv[1])[:6]
        }
        out["idle_cpu_pct"] = round(100 * (cpu1 - cpu0) / (t1 - t0), 2)
        out["load_idle"] = load()
        # a commit written to a local table: none on S3 (the pickup there is bounded by the poll)
        picks = random.Random(f"{n}-{rnd}").sample(range(n), min(args.pickups, n) if s3 is None else 0)
        latencies = [
            pickup_latency(
                bootstrap,
                tables[i],
                actions_topic(tables[i], run, args.layout),
                1,
                group_prefix="dmscale",
                first_record=True,
            )
            for i in picks
        ]
        got = [x for x in latencies if x is not None]
        cuts = statistics.quantiles(got, n=100, method="inclusive") if len(got) >= 2 else got * 99
        out["pickup_s"] = {
            "median": round(statistics.median(got), 3) if got else None,
            "max": round(max(got), 3) if got else None,
            "p50": round(cuts[49], 3) if got else None,
            "p99": round(cuts[98], 3) if got else None,
            "n": len(latencies),
            "step_s": None,
            "missed": len(latencies) - len(got),
        }
        out["rss_mb"] = _rss_mb(proc.pid)
        out["broker"] = broker_load(bootstrap)
    finally:
        out["load_after"] = load()
        out["exit_code"] = stop(proc)
        cleanup(bootstrap, tables, run, base)
    return out


class SharedCommitsReader(CommitsReader):
    """:class:`CommitsReader` for one shared commits topic: the versions summarized per table
    (by its key, the tableId), every partition read."""

    def __init__(self, bootstrap: str, topic: str, keys: list[str]) -> None:
        super().__init__(bootstrap, keys)  # ``topics`` and ``latest``: one entry per table
        self.topic = topic

    def _assign_new(self) -> None:
        from confluent_kafka import TopicPartition

        if self.assigned:
            return
        md = self.consumer.list_topics(timeout=10).topics
        if self.topic in md and md[self.topic].partitions:
            self.assigned.add(self.topic)
            self.consumer.assign(
                [TopicPartition(self.topic, p, -2) for p in sorted(md[self.topic].partitions)]
            )

    def _poll(self) -> None:
        if time.monotonic() - self._last_assign > 1.0:
            self._assign_new()
            self._last_assign = time.monotonic()
        for msg in self.consumer.consume(10_000, timeout=0.1):
            value = msg.value() or b""
            if msg.error() is None and value.startswith(b'{"kind":"commit"'):
                key = (msg.key() or b"").decode()
                if key in self.latest:
                    self.latest[key] = max(self.latest[key], json.loads(value)["version"])


def check_shared_topics(bootstrap: str, run: str, tables: list[Path], last_version: int) -> dict[str, Any]:
    """Exactly once on the shared topics, per table (by key): the fault campaign's reader and
    tally (tests/chaos/checker.py: every partition read_committed; lost, duplicated, out of
    order), its per-table check by hand: one commit summary per version 0..``last_version`` in
    order, and per version each action envelope (version, index) once, in order, as many as the
    summary's ``actionCount``. (The campaign's ``check_table`` compares each table with ``deltamirror
    events`` and reads a topic of its own: a process per table, not for 10,000 tables on one topic.)"""
    import itertools

    from chaos.checker import Tally, _tally_sequence, read_topic

    keys = {t.name for t in tables}
    commits: dict[str, list[dict[str, Any]]] = {k: [] for k in keys}
    for m in read_topic(bootstrap, f"deltamirror.dmscale-{run}.commits", timeout_s=600):
        if m.headers.get("kind") == b"commit" and (m.key or b"").decode() in keys:
            commits[(m.key or b"").decode()].append(json.loads(m.value))
    actions: dict[str, list[tuple[int, int]]] = {k: [] for k in keys}
    for m in read_topic(bootstrap, f"deltamirror.dmscale-{run}.actions", timeout_s=600):
        key = (m.key or b"").decode()
        if key in keys:
            env = json.loads(m.value)
            actions[key].append((env["version"], env["index"]))
    total = Tally()
    for key in sorted(keys):
        tally = Tally(versions=last_version + 1)
        summaries = commits[key]
        tally.records += len(summaries) + len(actions[key])
        _tally_sequence(
            tally, key, "commit summaries", [c["version"] for c in summaries], list(range(last_version + 1))
        )
        want = sorted({(c["version"], i) for c in summaries for i in range(c["actionCount"])})
        seen = collections.Counter(actions[key])
        tally.duplicated += sum(c - 1 for c in seen.values() if c > 1)
        tally.out_of_order += sum(1 for a, b in itertools.pairwise(actions[key]) if b < a)
        tally.lost += sum(1 for ident in want if ident not in seen)
        tally.mismatched += sum(1 for ident in seen if ident not in set(want))
        total.add(tally)
    return {
        "tables": len(keys),
        "versions": total.versions,
        "records": total.records,
        "lost": total.lost,
        "duplicated": total.duplicated,
        "out_of_order": total.out_of_order,
        "mismatched": total.mismatched,
        "clean": total.clean,
        "problems": total.problems[:5],
    }


def wait_published(
    reader: CommitsReader, version: int, since: float, limit: float, row: dict[str, Any]
) -> float | None:
    """Seconds from ``since`` (monotonic) until every table published ``version``; None after
    ``limit`` seconds. ``row["published_by_s"]``: how many had, every 5 s meanwhile (the pace of the
    survivor's transactions: its own tables' first, then the moved tables' as they resume)."""
    curve: list[list[float]] = []
    row["published_by_s"] = curve
    while (left := limit - (time.monotonic() - since)) > 0:
        if reader.wait_all(version, min(5.0, left)) is not None:
            return time.monotonic() - since
        done = sum(1 for v in reader.latest.values() if v >= version)
        curve.append([round(time.monotonic() - since, 1), done])
    return None


def measure_move(args: argparse.Namespace, bootstrap: str, rnd: int) -> list[dict[str, Any]]:
    """SIGKILL then SIGTERM one of two members; a new member is started in between.

    ``--layout shared``: the tables under one discover prefix with shared topics, from version 0
    (``from-timestamp`` at the epoch), the SIGKILL only, then the topics checked exactly once
    (:func:`check_shared_topics`)."""
    n = args.move_tables
    run = uuid.uuid4().hex[:6]
    base = Path(tempfile.mkdtemp(prefix=f"dm-bench-scale-move-{n}-"))
    tables = make_tables(base, n, run)
    shared = args.layout == "shared"
    config = write_config(
        base,
        bootstrap,
        tables,
        run,
        args.session_ms,
        mode="from-timestamp" if shared else "from-version",
        layout=args.layout,
        poll_interval_s=args.poll_interval,
        workers=args.workers,
    )
    reader: CommitsReader = (
        SharedCommitsReader(bootstrap, f"deltamirror.dmscale-{run}.commits", [t.name for t in tables])
        if shared
        else CommitsReader(bootstrap, [f"deltamirror.{t.name}.commits" for t in tables])
    )
    events = (
        (("SIGKILL", signal.SIGKILL, "b", None),)
        if shared
        else (
            ("SIGKILL", signal.SIGKILL, "b", None),
            ("SIGTERM", signal.SIGTERM, "c", "c"),
        )
    )
    procs: dict[str, subprocess.Popen[bytes]] = {}
    logs = {name: base / f"{name}.log" for name in "abc"}
    rows: list[dict[str, Any]] = []
    version = 0
    # shared (10,000 tables): a move past the goal's 60 s is still measured, not cut off
    limit = args.session_ms / 1000 + (300 if shared else 60)
    try:
        procs["a"] = spawn(config, logs["a"])
        procs["b"] = spawn(config, logs["b"])
        for name, signum, survivor, joiner in events:
            row: dict[str, Any] = {"kind": "move", "event": name, "tables": n, "round": rnd}
            row["layout"] = args.layout
            row["workers"] = args.workers  # None: the watchers' default
            row["session_timeout_ms"] = args.session_ms
            rows.append(row)
            if joiner:  # back to two members: the survivor and a new one
                procs[joiner] = spawn(config, logs[joiner])
                victim = "b"
            else:
                victim = "a"
            # both members hold shards and every table published: the steady state before the event
            # (a resumed report is dropped when shards are revoked during the resume: count assignments)
            settle = time.monotonic()
            # shared: discovery finds the tables after the first assignment (of no table): each
            # member has resumed tables of its own
            holds = (
                (lambda m: resumed_lines(logs[m]) > 0) if shared else (lambda m: assigned_tables(logs[m]) > 0)
            )
            while not all(holds(m) for m in (victim, survivor)):
                if time.monotonic() - settle > args.start_timeout_s or any(
                    procs[m].poll() is not None for m in (victim, survivor)
                ):
                    row["failed"] = f"members did not both run: {error_line(logs[victim])}"
                    return rows
                time.sleep(0.2)
            version += 1
            for t in tables:
                write_commit(t, version)
            if reader.wait_all(version, args.start_timeout_s) is None:
                row["failed"] = f"{len(reader.behind(version))} tables never published version {version}"
                return rows
            time.sleep(2)  # the group settled: no rebalance in flight
            seen = len(log_lines(logs[survivor]))
            row["load_before"] = load()
            cpu_before = proc_cpu_s(procs[survivor].pid)
            procs[victim].send_signal(signum)
            killed = time.monotonic()
            row["killed_at"] = round(time.time(), 3)  # the watchers' logs are in UTC wall time
            version += 1
            for t in tables:
                write_commit(t, version)
            # the figure runs from the kill: writing 10,000 commits takes seconds, during the move
            written = time.monotonic() - killed
            row["commits_written_s"] = round(written, 2)
            took = wait_published(reader, version, killed, limit, row)
            row["load_after"] = load()
            # the survivor's CPU (all threads) from the kill until every table published
            row["survivor_cpu_s"] = round(proc_cpu_s(procs[survivor].pid) - cpu_before, 2)
            if took is None:
                row["failed"] = (
                    f"{len(reader.behind(version))} of {n} tables not published after {limit:.0f} s"
                )
                return rows
            row["all_published_s"] = round(took, 2)
            row["measured_from"] = "kill"  # rows without it ran from the last commit written
            row["last_resumed_s"] = last_resumed_s(logs[survivor], seen, row["killed_at"])
            row["moved_tables"] = (
                resumed_lines(logs[survivor], seen) if shared else assigned_tables(logs[survivor], seen)
            )
            if shared:
                row["survivor_reads"] = board_rounds(logs[survivor], seen)
            if name == "SIGTERM":
                row["exit_code"] = procs[victim].wait(60)
            else:
                procs[victim].wait(10)
            if shared:
                row["exactly_once"] = check_shared_topics(bootstrap, run, tables, version)
    finally:
        reader.close()
        for proc in procs.values():
            stop(proc)
        keep = os.environ.get("DM_BENCH_SCALE_KEEP_LOGS")
        if keep:  # the watchers' logs, for a look at where a move waited
            into = Path(keep) / f"move-{n}-{run}"
            into.mkdir(parents=True, exist_ok=True)
            for name, path in logs.items():
                if path.exists():
                    shutil.copy(path, into / f"{name}.log")
            (into / "rows.json").write_text(json.dumps(rows, indent=1) + "\n")
        cleanup(bootstrap, tables, run, base)
    return rows


def plot(rows: list[dict[str, Any]]) -> str:
    """Every local-disk run of ``rows`` against the number of tables (log scale), each point
    coloured by the 1-minute load it started at, with issue 29's goals at 10,000 tables dotted:
    runs accumulate over months, so the points, not labels, carry them."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install -e '.[bench]'): no plot"
    rows = [r for r in rows if "storage" not in r]  # the local disk's (S3 rows have no pickups)
    idle = [r for r in rows if r["kind"] == "idle" and "failed" not in r]
    moves = [r for r in rows if r["kind"] == "move" and "failed" not in r]
    did_not_start = [r for r in rows if r["kind"] == "idle" and "failed" in r]
    fig, axes = plt.subplots(1, 3, figsize=(13, 4.2))
    colours = {"cmap": "viridis_r", "vmin": 0, "vmax": 30, "edgecolors": "black", "linewidths": 0.4}
    panels = (
        (axes[0], idle, lambda r: r["idle_cpu_pct"], "o", "idle CPU, % of one core"),
        (
            axes[1],
            idle,
            lambda r: r["pickup_s"].get("p99", r["pickup_s"]["max"]),
            "o",
            "commit pickup p99, s",
        ),
    )
    shown: Any = None
    for ax, runs, value, marker, title in panels:
        shown = ax.scatter(
            [r["tables"] for r in runs],
            [value(r) for r in runs],
            c=[r["load_before"] for r in runs],
            marker=marker,
            **colours,
        )
        ax.scatter(
            [r["tables"] for r in did_not_start],
            [0] * len(did_not_start),
            marker="x",
            color="tab:red",
            label="did not start",
        )
        ax.set_title(title, fontsize=10)
    for event, marker in (("SIGKILL", "o"), ("SIGTERM", "s")):
        runs = [r for r in moves if r["event"] == event]
        if runs:
            shown = axes[2].scatter(
                [r["tables"] for r in runs],
                [r["all_published_s"] for r in runs],
                c=[r["load_before"] for r in runs],
                marker=marker,
                label=f"after {event}",
                **colours,
            )
    axes[2].set_title("every moved table published again, s (2 members)", fontsize=10)
    for ax, goal in zip(axes, (10.0, 1.0, 60.0), strict=True):
        ax.set_xscale("log")
        ax.set_xlabel("tables")
        ax.set_ylim(bottom=0)
        ax.scatter([10_000], [goal], marker="_", s=400, color="tab:red", label="goal at 10,000 tables")
        ax.legend(fontsize=7, loc="upper left")
    fig.colorbar(shown, ax=axes, label="1-min load at the start", fraction=0.02, pad=0.01)
    fig.suptitle(
        f"deltamirror watch, local broker, {os.cpu_count()} shared cores: every run of bench/results/scale.json"
    )
    PLOT.parent.mkdir(exist_ok=True)
    fig.savefig(PLOT, dpi=100, bbox_inches="tight")
    return f"plot: {PLOT}"


def table(rows: list[dict[str, Any]]) -> str:
    out = [
        "| tables | layout, poll s | round | startup s | threads | idle CPU % core | pickup median / max s | RSS MB | load before / idle / after |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in (r for r in rows if r["kind"] == "idle"):
        poll = r.get("poll_interval_s", 1.0)
        how = f"{r.get('layout', 'per-table')}, {'default' if poll is None else f'{poll:g}'}"
        if "storage" in r:
            how += f", {r['storage']}"
        if "failed" in r:
            out.append(
                f"| {r['tables']} | {how} | {r['round']} | did not start: {r['failed'][:160]} | | | | | "
                f"{r['load_before']} |"
            )
            continue
        p = r["pickup_s"]
        if "s3_idle" in r:  # no pickups on S3: its requests per table per idle poll instead
            q = r["s3_idle"]
            out.append(
                f"| {r['tables']} | {how} | {r['round']} | {r['startup_s']} | {r['threads']} | {r['idle_cpu_pct']} | "
                f"S3: {q['per_table_per_poll']} requests per table per poll {q['requests']} | {r['rss_mb']} | "
                f"{r['load_before']} / {r['load_idle']} / {r['load_after']} |"
            )
            continue
        out.append(
            f"| {r['tables']} | {how} | {r['round']} | {r['startup_s']} | {r['threads']} | {r['idle_cpu_pct']} | "
            f"{p['median']} / {p['max']} ({p['missed']} of {p['n']} missed) | {r['rss_mb']} | "
            f"{r['load_before']} / {r['load_idle']} / {r['load_after']} |"
        )
    out += [
        "",
        "| event | tables | round | session timeout s | all published again s | moved | load before / after |",
    ]
    out.append("|---|---|---|---|---|---|---|")
    for r in (r for r in rows if r["kind"] == "move"):
        took = r.get("all_published_s", f"failed: {r.get('failed', '')[:120]}")
        out.append(
            f"| {r['event']} | {r['tables']} | {r['round']} | {r['session_timeout_ms'] / 1000:g} | {took} | "
            f"{r.get('moved_tables', '')} | {r.get('load_before', '')} / {r.get('load_after', '')} |"
        )
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--tables", default="100,1000", help="idle sizes, comma-separated")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--first-round", type=int, default=0, help="number of the first round (appending)")
    parser.add_argument("--idle-s", type=float, default=30.0)
    parser.add_argument(
        "--poll-interval",
        type=float,
        default=None,
        help="the tables' poll_interval_s (default: not set, the setting's default: 30 s for a local "
        "table watched by notifications); with notifications on a local disk it only bounds a lost one",
    )
    parser.add_argument(
        "--settle-s",
        type=float,
        default=5.0,
        help="seconds between the start and the idle measurement (the tables' first commits end)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        help="the watchers' workers (default: not set, the setting's default)",
    )
    parser.add_argument("--pickups", type=int, default=5)
    parser.add_argument("--move-tables", type=int, default=200)
    parser.add_argument("--session-ms", type=int, default=10_000, help="the group's session timeout")
    parser.add_argument("--no-move", action="store_true")
    parser.add_argument("--no-idle", action="store_true")
    parser.add_argument("--start-timeout-s", type=float, default=600.0)
    parser.add_argument("--port", type=int, default=19394)
    parser.add_argument("--kafka-data-dir", default="/tmp/dm-bench-scale-kafka")
    parser.add_argument(
        "--src", type=Path, help="run the watchers from this checkout (e.g. git archive HEAD)"
    )
    parser.add_argument("--fresh", action="store_true", help="start scale.json over")
    parser.add_argument(
        "--layout",
        choices=("per-table", "shared"),
        default="per-table",
        help="idle case: configured tables with topics each, or one discover prefix with topics: shared",
    )
    parser.add_argument(
        "--storage",
        choices=("local", "s3"),
        default="local",
        help="idle case: the tables on the local disk, or uploaded to a local S3 server (s3proxy, "
        "tests/support/s3proxy.py; --layout shared only): the S3 requests of the idle seconds are "
        "counted from its request log, per table per poll (no pickups: the commits are written locally)",
    )
    args = parser.parse_args()
    if args.storage == "s3" and args.layout != "shared":
        parser.error("--storage s3 needs --layout shared (the tables are found under one S3 prefix)")
    if args.src:
        PYTHONPATH["PYTHONPATH"] = str(link_tree(args.src.resolve()))
    from deltamirror.devkafka.broker import LocalKafka

    broker = LocalKafka(port=args.port, data_dir=Path(args.kafka_data_dir))
    was_running = bool(broker.status()["running"])
    bootstrap = broker.start()
    if broker.status()["pid"]:
        BROKER_PID.append(int(broker.status()["pid"]))
    doc: dict[str, Any] = {"rows": []}
    if RESULTS.exists() and not args.fresh:
        doc = json.loads(RESULTS.read_text())
    head = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": " ".join(["python", "bench/bench_scale.py", *sys.argv[1:]]),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "revision": subprocess.run(
            ["git", "-C", str(BENCH.parent), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip(),
        "code": str(args.src) if args.src else "working tree",
    }
    sizes = [] if args.no_idle else [int(x) for x in args.tables.split(",")]
    s3 = None
    if args.storage == "s3":
        from support.s3proxy import S3Proxy

        s3 = S3Proxy(Path(tempfile.mkdtemp(prefix="dm-bench-scale-s3-")))
        s3.start()
    try:
        for rnd in range(args.first_round, args.first_round + args.rounds):
            for n in sizes[rnd % max(1, len(sizes)) :] + sizes[: rnd % max(1, len(sizes))]:  # order rotated
                row = {**head, **measure_idle(args, bootstrap, n, rnd, s3)}
                doc["rows"].append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
                RESULTS.write_text(json.dumps(doc, indent=1) + "\n")
            if not args.no_move:
                for row in measure_move(args, bootstrap, rnd):
                    doc["rows"].append({**head, **row})
                    print(json.dumps(row), file=sys.stderr, flush=True)
                RESULTS.write_text(json.dumps(doc, indent=1) + "\n")
    finally:
        if s3 is not None:
            s3.stop()
        if not was_running:
            broker.stop()
    print(table(doc["rows"]))
    print(plot(doc["rows"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
