"""What an idle ``deltamirror watch`` costs with many tables: start, threads, CPU, commit pickup.

One watcher process mirrors N local one-version tables (hand-written logs, snapshot mode
``latest``) into a local broker. Measured, per N:

* startup: from spawning the process to its ``all tables resumed`` line (every table's producer
  initialised and its progress read);
* threads: the process's thread count once ready, and per thread name (librdkafka names its
  threads ``rdk:*``), divided by N;
* idle CPU: the process's user+system CPU over ``--idle-s`` seconds (after a 5 s settle), in % of
  one core;
* pickup: a commit written (atomic rename) to one table until its action is visible to a
  ``read_committed`` consumer of the table's actions topic; ``--pickups`` tables spread over N,
  the median and the maximum;
* the load average (1 min) before and after each run: the machine has 2 cores shared with other
  work, so a figure taken at a load above ~2 is a loaded machine's, not the watcher's.

``--layer watcher`` measures the same without Kafka: a thread per table asking its watcher for
work and waiting on its waker, as a watch process does (``--long-log V`` adds a table of V
versions without a checkpoint). A watch process cannot hold much more than 1,000 librdkafka
clients (``Failed to initialize thread local storage`` at about 1,012), so with a producer per
table only the watcher layer reaches 1,000 tables and more.

``--src DIR`` runs the code of another checkout (``git clone`` of a revision) with this
interpreter: its package folders are linked into a temporary ``deltamirror`` namespace put first
on ``PYTHONPATH``, the way to measure "before" beside "after".

    python bench/bench_idle.py [--tables 100,1000] [--idle-s 30] [--pickups 5] [--src DIR]
                               [--label NAME] [--port 19392] [--kafka-data-dir DIR] [--keep-broker]
                               [--no-notifications]

Results: a markdown table on stdout and a JSON line per run appended to bench/results/idle.jsonl.
Not a test: nothing here is asserted beyond the watcher starting and picking commits up.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
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
REPO = BENCH.parent
RESULTS = BENCH / "results" / "idle.jsonl"
PACKAGES = ("core", "mirror", "ops", "producer", "consumer", "cli")
TICKS = os.sysconf("SC_CLK_TCK")
SCHEMA = {"type": "struct", "fields": [{"name": "id", "type": "long", "nullable": True, "metadata": {}}]}


def commit_text(version: int, table_id: str) -> str:
    lines: list[dict[str, Any]] = [
        {"commitInfo": {"timestamp": int(time.time() * 1000), "operation": "WRITE"}}
    ]
    if version == 0:
        lines.append({"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}})
        meta = {
            "id": table_id,
            "format": {"provider": "parquet", "options": {}},
            "schemaString": json.dumps(SCHEMA),
            "partitionColumns": [],
            "configuration": {},
            "createdTime": 1_700_000_000_000,
        }
        lines.append({"metaData": meta})
    add = {"path": f"part-{version}.parquet", "partitionValues": {}, "size": 10, "modificationTime": 1}
    lines.append({"add": {**add, "dataChange": True}})
    return "".join(json.dumps(line) + "\n" for line in lines)


def write_commit(table: Path, version: int) -> None:
    log = table / "_delta_log"
    log.mkdir(parents=True, exist_ok=True)
    tmp = log / f".{version:020d}.json.tmp"
    tmp.write_text(commit_text(version, table.name))
    os.rename(tmp, log / f"{version:020d}.json")


def proc_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def thread_names(pid: int) -> collections.Counter[str]:
    names: collections.Counter[str] = collections.Counter()
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/comm") as fh:
                name = fh.read().strip()
        except OSError:
            continue
        # rdk:broker3 / rdk:broker-1 / watch-dm-...: one name per kind
        kind = (
            name.rstrip("0123456789-").split("-dm")[0] if not name.startswith("watch-") else "watch-<table>"
        )
        names[kind] += 1
    return names


def link_tree(src: Path) -> Path:
    """A folder holding ``deltamirror/<package>`` links to the checkout's package folders, and the
    checkout's ``root/`` files (``deltamirror/__init__.py``): without them the folder's
    ``deltamirror`` is a namespace package, and the editable install's regular package (the
    working tree) wins over it whatever comes first on the path."""
    root = Path(tempfile.mkdtemp(prefix="dm-bench-src-"))
    (root / "deltamirror").mkdir()
    for name in (*PACKAGES, "devkafka"):
        if (src / name).is_dir():
            (root / "deltamirror" / name).symlink_to(src / name)
    if (src / "root").is_dir():
        for entry in (src / "root").iterdir():
            if entry.is_file():
                (root / "deltamirror" / entry.name).symlink_to(entry)
    return root


def start_broker(args: argparse.Namespace) -> tuple[str, Any]:
    sys.path.insert(0, str(REPO))
    from deltamirror.devkafka.broker import LocalKafka

    local = LocalKafka(port=args.port, data_dir=Path(args.kafka_data_dir))
    was_running = bool(local.status()["running"])
    bootstrap = local.start()
    return bootstrap, (None if was_running or args.keep_broker else local)


def wait_for_line(path: Path, needle: str, proc: subprocess.Popen[bytes], timeout_s: float) -> float | None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if needle in path.read_text(errors="replace"):
            return time.monotonic()
        if proc.poll() is not None:
            return None
        time.sleep(0.05)
    return None


def pickup_latency(
    bootstrap: str,
    table: Path,
    topic: str,
    version: int,
    timeout_s: float = 60.0,
    *,
    group_prefix: str = "dmidle",
    first_record: bool = False,
) -> float | None:
    """Seconds from writing ``version`` to ``table`` until a read_committed reader sees a record on
    ``topic``, None after ``timeout_s``; ``first_record`` polls without a fixed step (bench_scale)."""
    from confluent_kafka import Consumer, TopicPartition

    config: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "group.id": f"{group_prefix}-{uuid.uuid4().hex}",
        "isolation.level": "read_committed",
        "enable.auto.commit": False,
    }
    if first_record:
        config["fetch.wait.max.ms"] = 10
    batch, poll_s = (1, 0.05) if first_record else (10, 0.2)
    consumer = Consumer(config)
    try:
        _, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)
        consumer.assign([TopicPartition(topic, 0, high)])
        consumer.consume(1, timeout=0.5)  # connected and positioned before the clock starts
        started = time.monotonic()
        write_commit(table, version)
        while time.monotonic() - started < timeout_s:
            for m in consumer.consume(batch, timeout=poll_s):
                if m.error() is None:
                    return time.monotonic() - started
        return None
    finally:
        consumer.close()


def delete_topics(bootstrap: str, topics: list[str]) -> None:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for i in range(0, len(topics), 500):
        for future in admin.delete_topics(topics[i : i + 500], operation_timeout=60).values():
            with contextlib.suppress(Exception):  # never created: nothing to free
                future.result(timeout=120)


def run_one(args: argparse.Namespace, bootstrap: str, n: int, pythonpath: str | None) -> dict[str, Any]:
    run = uuid.uuid4().hex[:6]
    base = Path(tempfile.mkdtemp(prefix=f"dm-bench-idle-{n}-"))
    tables = [base / f"i{run}x{i}" for i in range(n)]
    for t in tables:
        write_commit(t, 0)
    config = base / "watch.yaml"  # JSON is YAML
    config.write_text(
        json.dumps(
            {
                "kafka": {"bootstrap_servers": bootstrap},
                "tables": [{"uri": str(t)} for t in tables],
                "use_notifications": not args.no_notifications,
            }
        )
    )
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    argv = [
        sys.executable,
        "-c",
        "import sys; from deltamirror.cli.main import main; sys.exit(main())",
        "watch",
        "--config",
        str(config),
        "--snapshot-mode",
        "latest",
        "--progress-topic",
        f"dmidle.{run}.progress",
        "--transactional-id-prefix",
        f"dmidle-{run}",
    ]
    stderr = base / "watch.log"
    load_before = os.getloadavg()[0]
    spawned = time.monotonic()
    with stderr.open("wb") as err:
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=err)
    out: dict[str, Any] = {"label": args.label, "tables": n, "load_before": load_before}
    try:
        ready = wait_for_line(stderr, "all tables resumed", proc, args.start_timeout_s)
        if ready is None:
            tail = stderr.read_text(errors="replace").strip().splitlines()[-3:]
            out["failed"] = f"not ready (exit {proc.poll()}): {' | '.join(tail)[-600:]}"
            return out
        out["startup_s"] = round(ready - spawned, 2)
        time.sleep(5)
        out["threads"] = len(os.listdir(f"/proc/{proc.pid}/task"))
        out["threads_by_name"] = dict(thread_names(proc.pid).most_common())
        cpu0, t0 = proc_cpu_s(proc.pid), time.monotonic()
        time.sleep(args.idle_s)
        cpu1, t1 = proc_cpu_s(proc.pid), time.monotonic()
        out["idle_cpu_pct"] = round(100 * (cpu1 - cpu0) / (t1 - t0), 2)
        out["load_idle"] = os.getloadavg()[0]
        picks = sorted({round(i * (n - 1) / max(1, args.pickups - 1)) for i in range(args.pickups)})
        latencies = [
            pickup_latency(bootstrap, tables[i], f"deltamirror.{tables[i].name}.actions", 1) for i in picks
        ]
        got = [x for x in latencies if x is not None]
        out["pickup_s"] = {
            "median": round(statistics.median(got), 3) if got else None,
            "max": round(max(got), 3) if got else None,
            "missed": len(latencies) - len(got),
        }
        out["rss_mb"] = _rss_mb(proc.pid)
    finally:
        out["load_after"] = os.getloadavg()[0]
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        out["exit_code"] = proc.returncode
        topics = [f"deltamirror.{t.name}.{kind}" for t in tables for kind in ("actions", "commits")]
        delete_topics(bootstrap, [*topics, f"dmidle.{run}.progress"])
        shutil.rmtree(base, ignore_errors=True)
    return out


def watcher_layer_child(args: argparse.Namespace) -> None:
    """In the child: N tables followed as a watch process follows them (a thread per table that
    asks its watcher for work and waits on its waker), without Kafka; prints one JSON line."""
    import resource
    import threading

    from deltamirror.producer.tailing.waker import LogWaker
    from deltamirror.producer.tailing.watcher import TableWatcher

    spawned = float(os.environ["DMIDLE_SPAWNED"])
    base = Path(args.child_base)
    tables = sorted(base.glob("ix*"), key=lambda p: int(p.name[2:]) if p.name[2:].isdigit() else -1)
    stop = threading.Event()
    seen = [threading.Event() for _ in tables]

    def follow(i: int, watcher: Any, waker: Any) -> None:
        while not stop.is_set():
            work = watcher.next_work()
            if work is None:
                waker.wait(args.poll_s, stop)
            elif getattr(work, "version", 0) >= 1:
                seen[i].set()

    threads = []
    for i, table in enumerate(tables):
        watcher = TableWatcher(str(table), mode="latest")
        watcher.start(None)
        watcher.next_work()  # the start position
        waker = LogWaker(watcher.storage, enabled=not args.no_notifications)
        thread = threading.Thread(target=follow, args=(i, watcher, waker), daemon=True)
        thread.start()
        threads.append(thread)
    out: dict[str, Any] = {"startup_s": round(time.time() - spawned, 2)}
    time.sleep(5)
    out["threads"] = threading.active_count()
    out["threads_native"] = len(os.listdir("/proc/self/task"))

    def cpu() -> float:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime

    cpu0, t0 = cpu(), time.monotonic()
    time.sleep(args.idle_s)
    out["idle_cpu_pct"] = round(100 * (cpu() - cpu0) / (time.monotonic() - t0), 2)
    out["load_idle"] = os.getloadavg()[0]
    latencies = []
    first = 1 if tables[0].name == "ixlong" else 0  # the long log is not written to
    short = len(tables) - first
    picks = sorted({first + round(i * (short - 1) / max(1, args.pickups - 1)) for i in range(args.pickups)})
    for i in picks:
        started = time.monotonic()
        write_commit(tables[i], 1)
        latencies.append(time.monotonic() - started if seen[i].wait(30) else None)
    got = [x for x in latencies if x is not None]
    out["pickup_s"] = {
        "median": round(statistics.median(got), 3) if got else None,
        "max": round(max(got), 3) if got else None,
        "missed": len(latencies) - len(got),
    }
    out["rss_mb"] = _rss_mb(os.getpid())
    stop.set()
    print(json.dumps(out), flush=True)


def run_watcher_layer(args: argparse.Namespace, n: int, pythonpath: str | None) -> dict[str, Any]:
    base = Path(tempfile.mkdtemp(prefix=f"dm-bench-idle-w{n}-"))
    for i in range(n):
        write_commit(base / f"ix{i}", 0)
    if args.long_log:
        long = base / "ixlong"
        write_commit(long, 0)
        log = long / "_delta_log"
        text = commit_text(2, "x")
        for v in range(1, args.long_log):
            (log / f"{v:020d}.json").write_text(text)
    env = dict(os.environ, DMIDLE_SPAWNED=repr(time.time()))
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    argv = [sys.executable, __file__, "--child-base", str(base), "--idle-s", str(args.idle_s)]
    argv += ["--pickups", str(args.pickups), "--poll-s", str(args.poll_s)]
    argv += ["--no-notifications"] if args.no_notifications else []
    out: dict[str, Any] = {"label": args.label, "layer": "watcher", "tables": n, "long_log": args.long_log}
    out["load_before"] = os.getloadavg()[0]
    try:
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=1800)
        if done.returncode != 0:
            out["failed"] = f"exit {done.returncode}: {done.stderr.strip()[-600:]}"
        else:
            out.update(json.loads(done.stdout.strip().splitlines()[-1]))
    finally:
        out["load_after"] = os.getloadavg()[0]
        shutil.rmtree(base, ignore_errors=True)
    return out


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    return float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--tables", default="100,1000")
    parser.add_argument("--idle-s", type=float, default=30.0)
    parser.add_argument("--pickups", type=int, default=5)
    parser.add_argument(
        "--src", type=Path, default=None, help="a checkout whose code runs (default: this one)"
    )
    parser.add_argument("--label", default="current")
    parser.add_argument("--port", type=int, default=19392)
    parser.add_argument("--kafka-data-dir", default="/tmp/dm-bench-idle-kafka")
    parser.add_argument("--keep-broker", action="store_true")
    parser.add_argument("--no-notifications", action="store_true")
    parser.add_argument("--start-timeout-s", type=float, default=900.0)
    parser.add_argument("--layer", choices=("watch", "watcher"), default="watch")
    parser.add_argument(
        "--long-log", type=int, default=0, help="with --layer watcher: one more table of V versions"
    )
    parser.add_argument("--poll-s", type=float, default=1.0)
    parser.add_argument("--child-base", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_base:
        watcher_layer_child(args)
        return 0
    pythonpath = str(link_tree(args.src.resolve())) if args.src else None
    bootstrap, owned_broker = start_broker(args) if args.layer == "watch" else ("", None)
    rows = []
    try:
        for n in (int(x) for x in args.tables.split(",")):
            if args.layer == "watcher":
                row = run_watcher_layer(args, n, pythonpath)
            else:
                row = run_one(args, bootstrap, n, pythonpath)
            rows.append(row)
            RESULTS.parent.mkdir(exist_ok=True)
            with RESULTS.open("a") as fh:
                fh.write(json.dumps(row) + "\n")
            print(json.dumps(row), file=sys.stderr, flush=True)
    finally:
        if owned_broker is not None:
            owned_broker.stop()
    print(
        "| label | tables | startup s | threads | idle CPU % core | pickup median / max s | load 1m before/idle |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        if "failed" in r:
            print(
                f"| {r['label']} | {r['tables']} | failed: {r['failed'][:80]} | | | | {r['load_before']:.2f} |"
            )
            continue
        p = r["pickup_s"]
        print(
            f"| {r['label']} | {r['tables']} | {r['startup_s']} | {r['threads']} | {r['idle_cpu_pct']} | "
            f"{p['median']} / {p['max']} ({p['missed']} missed) | {r['load_before']:.2f} / {r['load_idle']:.2f} |"
            + (f" layer {r['layer']}, long log {r['long_log']}" if "layer" in r else "")
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
