"""The snapshot consumer on a 1M-file table: ``consume-snapshot`` against a real broker beside the raw
consume + decode peer, the apply rate with the state saved as a Delta checkpoint at its interval, what
one save costs, and a restart (loading the saved state) in a fresh process.

Consume section (``--only consume``), against a broker (``--bootstrap``, ``$KAFKA_BOOTSTRAP_SERVERS``,
or a local one the bench starts on ``--port``):

- The topic (not timed; reused while the broker keeps it): the synthetic table of
  ``make_checkpoint_table`` (1M files in a V1 checkpoint with stats at version C, then ``--commits``
  commits) mirrored by the watcher (snapshot mode ``initial``): a snapshot of version C (every active
  file one record), then each later commit, linked into the log one by one once the snapshot is
  published: what a consumer meets in production (the topic bench/bench_consume.py builds too).
- Contenders, each in its own process, interleaved, the order turning by one each round (``--rounds``,
  default 7), each timed by the parent from just before it starts the process:
  ``deltamirror``: ``deltamirror consume-snapshot --once --state-dir <fresh dir>`` (the console
  script's own ``main``; the state saved at the default intervals), to the stdout line of the last
  version applied (``applied_s``; the CPU the process had used then, from /proc: ``cpu_applied_s``)
  and to its exit (``exit_s``, the final save included); ``raw-orjson`` (the peer): bare
  confluent-kafka, read_committed, MirrorConsumer's fetch settings (fetch.wait.max.ms 10, partition
  EOF), the batched ``consume(num_messages=10000)``, ``orjson.loads`` of every value, to its last
  value (``--peer-json json`` adds the stdlib decoder); ``deltamirror-restart``: the same command
  again over the state the run saved, nothing new to read, to its exit; ``base`` (with
  ``--base-site DIR``: a link tree of another revision's packages) the same command from that tree.
  CPU (``cpu_s``) is the process's own (wait4: every thread, start and teardown included); peak RSS
  is its VmHWM.
- Reported: per contender the medians, and against the peer of the same round the median of the
  per-round ratios with their IQR and min-max, beside the load average before each round.

Apply section (``--only apply``; no Kafka):

1. State: core's snapshot of the synthetic table at its checkpoint version becomes the consumer's state.
2. Apply rate: the table's commits after the checkpoint, as the watcher's events (without Kafka),
   given to ``SnapshotConsumer.handle``, one version per batch with ``checkpoint()`` after each, for
   ``checkpoint_interval_versions`` None (never saved: applying alone), 100 (the default) and 10.
   Reported: versions/s and actions/s including the saves, the number of saves and their time.
3. Restart: ``StateStore(dir).load_all()`` of the state saved by the interval-100 run (version
   checkpoint + 100), each in a fresh process (imports excluded), median of ``--reps`` after one
   warm-up: wall time, CPU time (all threads), peak RSS. The loaded files must be the generator's
   active-file count, and (once, in the parent) the same replay keys as core's snapshot at that
   version, or the script exits non-zero.

The machine may be shared: the load average is printed; CPU time is the steadier figure. Each
contender function (``run_consume_deltamirror``, ``run_consume_raw``, ``run_restart``,
``publish_table``) can be called on its own.

    python bench/bench_snapshot_consumer.py [--only consume|apply] [--rounds 7] [--files 1000000]
        [--commits 100] [--reps 5] [--bootstrap HOST:PORT] [--base-site DIR] [--peer-json orjson]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
RESULTS = BENCH / "results" / "snapshot-consumer.json"
TOPIC = "bench.actions"
sys.path.insert(0, str(BENCH))

import harness  # noqa: E402
from bench_snapshot import _cpu_s, _rss_mb  # noqa: E402
from make_checkpoint_table import DATA, ensure_table  # noqa: E402

INTERVALS: tuple[int | None, ...] = (None, 100, 10)


# --- child side: one restart in a fresh process ---------------------------------------------------


def _child(state_dir: str) -> dict[str, Any]:
    from deltamirror.consumer.snapshot import StateStore

    imported_rss = _rss_mb()
    cpu = _cpu_s()
    t0 = time.perf_counter()
    tables, _ = StateStore(state_dir, TOPIC).load_all()
    total = time.perf_counter() - t0
    (state,) = tables.values()
    return {
        "total_s": total,
        "cpu_s": _cpu_s() - cpu,
        "files": state.file_count,
        "version": state.version,
        "import_rss_mb": imported_rss,
        "peak_rss_mb": _rss_mb(),
    }


def _run_child(state_dir: Path) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", str(state_dir)], check=True, capture_output=True, text=True
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


# --- parent side ----------------------------------------------------------------------------------


def _initial_state(root: str, version: int) -> Any:
    """core's snapshot at ``version`` as the consumer's state (the actions as JSON, as published)."""
    from deltamirror.consumer.snapshot import IncrementalSnapshot
    from deltamirror.core.table import open_table

    snap = open_table(root).snapshot(version)
    state = IncrementalSnapshot(snap.metadata.id, f"file://{root}")
    document = state.document() | {
        "version": snap.version,
        "complete": True,
        "metaData": json.loads(snap.metadata.model_dump_json(by_alias=True, exclude_none=True)),
        "protocol": json.loads(snap.protocol.model_dump_json(by_alias=True, exclude_none=True)),
    }
    return IncrementalSnapshot.from_document(document, snap.files)


def _apply_run(
    state: Any, versions: list[list[bytes]], interval: int | None, state_dir: Path
) -> dict[str, Any]:
    from deltamirror.consumer.snapshot import IncrementalSnapshot, SnapshotConsumer

    consumer = SnapshotConsumer(
        "unused:9092",
        TOPIC,
        state_dir=state_dir,
        checkpoint_interval_versions=interval,
        checkpoint_interval_s=None,
    )
    # the same starting state each run (its Arrow files are shared, never changed in place)
    consumer.tables[state.table_id] = IncrementalSnapshot.from_document(state.document(), state.files)
    offset = 0
    save_s = 0.0
    actions = 0
    cpu = _cpu_s()
    t0 = time.perf_counter()
    for records in versions:
        for value in records:
            consumer.handle(TOPIC, 0, offset, value)
            offset += 1
        actions += len(records)
        saves = consumer.saves
        s0 = time.perf_counter()
        consumer.checkpoint()
        if consumer.saves > saves:
            save_s += time.perf_counter() - s0
    total = time.perf_counter() - t0
    return {
        "interval_versions": interval,
        "versions": len(versions),
        "actions": actions,
        "total_s": total,
        "cpu_s": _cpu_s() - cpu,
        "versions_per_s": len(versions) / total,
        "actions_per_s": actions / total,
        "saves": consumer.saves,
        "save_s": save_s,
        "files": consumer.tables[state.table_id].file_count,
        "version": consumer.tables[state.table_id].version,
    }


def _same_keys(state_dir: Path, root: str, version: int) -> bool:
    from deltamirror.consumer.snapshot import StateStore
    from deltamirror.core.replay import file_keys
    from deltamirror.core.table import open_table

    (state,) = StateStore(state_dir, TOPIC).load_all()[0].values()
    snap = open_table(root).snapshot(version)
    ours = file_keys(state.files["path"], state.files["deletionVector"]).sort()
    theirs = file_keys(snap.files["path"], snap.files["deletionVector"]).sort()
    return state.version == version and bool(ours.equals(theirs))


# --- consume-snapshot against a real broker, beside the raw consume + decode peer ------------------------

#: run first in every consume child: where deltamirror comes from (``DM_BENCH_SITE``: a link tree of
#: another revision, every other copy dropped from sys.path), and at exit one line on stderr with the
#: process's own CPU seconds and peak RSS (VmHWM: ru_maxrss survives fork+exec)
CHILD_PRELUDE = r"""
import atexit, json, os, resource, sys, time
_site = os.environ.get("DM_BENCH_SITE")
if _site:
    sys.path[:] = [_site] + [p for p in sys.path if not os.path.isdir(os.path.join(p or ".", "deltamirror"))]
def _bench_report():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    hwm = None
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                hwm = int(line.split()[1]) / 1024
    origin = None
    if "deltamirror.cli" in sys.modules:
        origin = os.path.dirname(os.path.dirname(sys.modules["deltamirror.cli"].__file__))
    sys.stderr.write("BENCH " + json.dumps({"cpu_s": usage.ru_utime + usage.ru_stime,
        "peak_rss_mb": hwm, "exit_at": time.time(), "deltamirror_from": origin}) + "\n")
    sys.stderr.flush()
atexit.register(_bench_report)
"""

#: ``deltamirror consume-snapshot`` itself (the console script's main), its arguments after ``-c``
CLI_CHILD = CHILD_PRELUDE + "from deltamirror.cli.main import main\nsys.exit(main(sys.argv[1:]))\n"

#: the peer: bare confluent-kafka, read_committed, the settings MirrorConsumer gives a reader that reads
#: to the end (fetch.wait.max.ms 10, partition EOF), the batched consume(num_messages=...) API, every
#: value decoded into Python objects (orjson, or the stdlib's json with PEER_JSON=json)
RAW_PEER = (
    CHILD_PRELUDE
    + r"""
import uuid
from confluent_kafka import Consumer, KafkaError, TopicPartition
if os.environ.get("PEER_JSON") == "json":
    from json import loads
else:
    from orjson import loads
bootstrap, topic, batch = sys.argv[1], sys.argv[2], int(sys.argv[3])
consumer = Consumer({
    "bootstrap.servers": bootstrap,
    "group.id": "dmbench-raw-" + uuid.uuid4().hex[:12],
    "isolation.level": "read_committed",
    "enable.partition.eof": True,
    "auto.offset.reset": "earliest",
    "enable.auto.commit": False,
    "fetch.wait.max.ms": 10,
})
partitions = sorted(consumer.list_topics(topic, timeout=30).topics[topic].partitions)
consumer.assign([TopicPartition(topic, p, -2) for p in partitions])
pending, records, size = set(partitions), 0, 0
while pending:
    for msg in consumer.consume(batch, timeout=0.05):
        err = msg.error()
        if err is not None:
            if err.code() == KafkaError._PARTITION_EOF:
                pending.discard(msg.partition())
                continue
            raise SystemExit(err.str())
        value = msg.value()
        loads(value)
        records += 1
        size += len(value)
print(json.dumps({"records": records, "bytes": size}), flush=True)
consumer.close()
"""
)


def _proc_cpu_s(pid: int) -> float | None:
    """CPU seconds of a running process, every thread (utime + stime of /proc/PID/stat)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _stamped_child(argv: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``argv``; the wall time from just before the process starts to each stdout line and to its
    exit, its CPU (wait4: every thread, interpreter start and teardown included) and peak RSS."""
    lines: list[tuple[float, str]] = []
    t0 = time.time()
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, **(env or {})}
    )
    assert proc.stdout is not None and proc.stderr is not None
    err_lines: list[str] = []
    reader = threading.Thread(target=lambda: err_lines.extend(proc.stderr.read().decode().splitlines()))  # type: ignore[union-attr]
    reader.start()
    for raw in proc.stdout:
        lines.append((time.time(), raw.decode().rstrip("\n"), _proc_cpu_s(proc.pid)))
    _, status, usage = os.wait4(proc.pid, 0)
    ended = time.time()
    proc.returncode = os.waitstatus_to_exitcode(status)
    reader.join()
    report = next((json.loads(x[6:]) for x in reversed(err_lines) if x.startswith("BENCH ")), {})
    if proc.returncode != 0:
        tail = "\n".join(err_lines[-15:])
        raise SystemExit(f"{argv[:3]}... exited {proc.returncode}:\n{tail}")
    return {
        "lines": lines,
        "exit_s": report.get("exit_at", ended) - t0,
        "reaped_s": ended - t0,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "cpu_self_s": report.get("cpu_s"),
        "peak_rss_mb": report.get("peak_rss_mb"),
        "deltamirror_from": report.get("deltamirror_from"),
        "started_at": t0,
    }


def run_consume_deltamirror(
    bootstrap: str,
    topic: str,
    state_dir: Path,
    *,
    site: str | None = None,
    batch: int | None = None,
    group_id: str | None = None,
) -> dict[str, Any]:
    """``deltamirror consume-snapshot --once --state-dir DIR`` in a fresh process (``site``: another
    revision's link tree). Timed from just before the process starts to the stdout line of the
    last applied version (``applied_s``) and to its exit, the state saved (``exit_s``). A restart
    over a saved state passes the ``group_id`` it was saved with: a state dir holds what one
    consumer group consumed, and the command refuses it to another."""
    argv = [sys.executable, "-c", CLI_CHILD, "consume-snapshot", "--bootstrap-servers", bootstrap]
    argv += ["--topic", topic, "--once", "--state-dir", str(state_dir)]
    argv += ["--group-id", group_id or f"dmbench-{uuid.uuid4().hex[:12]}"]
    run = _stamped_child(argv, {"DM_BENCH_SITE": site} if site else None)
    versions = [(at, json.loads(text), cpu) for at, text, cpu in run.pop("lines") if text.startswith("{")]
    last_at, last, cpu_at = versions[-1] if versions else (None, None, None)
    return {
        **run,
        "applied_s": None if last_at is None else last_at - run["started_at"],
        "cpu_applied_s": cpu_at,
        "versions": len(versions),
        "version": None if last is None else last["version"],
        "files": None if last is None else last["files"],
    }


def run_consume_raw(
    bootstrap: str, topic: str, *, batch: int = 10_000, decoder: str = "orjson"
) -> dict[str, Any]:
    """The peer (RAW_PEER) in a fresh process: from just before it starts to the last value decoded."""
    run = _stamped_child(
        [sys.executable, "-c", RAW_PEER, bootstrap, topic, str(batch)], {"PEER_JSON": decoder}
    )
    (at, text, cpu), *_ = run.pop("lines")
    return {**run, **json.loads(text), "applied_s": at - run["started_at"], "cpu_applied_s": cpu}


def run_restart(
    bootstrap: str, topic: str, state_dir: Path, group_id: str, *, site: str | None = None
) -> dict[str, Any]:
    """consume-snapshot --once again on a saved state at the topic's end (saved by ``group_id``):
    process start to exit."""
    return run_consume_deltamirror(bootstrap, topic, state_dir, site=site, group_id=group_id)


# --- the topic: the table as the watcher publishes it ------------------------------------------------


def _commits_summaries(bootstrap: str, commits_topic: str) -> list[Any]:
    from deltamirror.mirror.kafka.consumer import MirrorConsumer
    from deltamirror.mirror.records.events import CommitSummary, decode_commits_record

    out = []
    with MirrorConsumer({"bootstrap.servers": bootstrap}, purpose="bench") as consumer:
        parts = consumer.partitions(commits_topic)
        assert parts is not None
        consumer.assign([(commits_topic, p, None) for p in parts])
        for batch in consumer.batches(until_end=True, timeout_s=120):
            for record in batch:
                summary = decode_commits_record(
                    record.value, record.header("deltamirror-kind"), wanted={"commit"}
                )
                if isinstance(summary, CommitSummary):
                    out.append(summary)
    return out


def _topic_exists(bootstrap: str, topic: str) -> bool:
    from confluent_kafka.admin import AdminClient

    return topic in AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=30).topics


def publish_table(bootstrap: str, manifest: dict[str, Any], data_dir: Path = DATA) -> dict[str, Any]:
    """The table's actions topic as ``deltamirror watch`` (snapshot mode ``initial``) fills it while
    the table is written: a snapshot of the checkpoint version (every active file one record), then
    each later commit, linked into the table's log one by one once the snapshot is published (as
    bench/bench_consume.py builds its topic). Reused when a previous run of the bench left it
    complete on this broker (its commits topic holds the summary of the last version)."""
    from deltamirror.mirror import KafkaSettings
    from deltamirror.producer import TableConfig, WatchConfig
    from deltamirror.producer.service import WatchService

    name = f"dmbench-snapcons-{manifest['checkpoint_files']}-{manifest['commits']}-staged"
    actions, commits = f"{name}.actions", f"{name}.commits"
    latest, start = manifest["version"], manifest["checkpoint_version"]
    if _topic_exists(bootstrap, commits):
        summaries = _commits_summaries(bootstrap, commits)
        if any(s.version == latest for s in summaries):
            records = sum(s.action_count for s in summaries)
            return {"actions_topic": actions, "commits_topic": commits, "records": records, "reused": True}
    root = data_dir / f"{name}-table"
    shutil.rmtree(root, ignore_errors=True)
    log = root / "_delta_log"
    log.mkdir(parents=True)
    os.link(manifest["checkpoint"], log / Path(manifest["checkpoint"]).name)
    later = sorted(
        p
        for p in (Path(manifest["root"]) / "_delta_log").glob("*.json")
        if p.stem.isdigit() and int(p.stem) > start
    )
    cfg = WatchConfig(
        kafka=KafkaSettings(bootstrap_servers=bootstrap),
        tables=[
            TableConfig(
                uri=str(root),
                snapshot_mode="initial",
                actions_topic=actions,
                commits_topic=commits,
                poll_interval_s=0.2,
            )
        ],
        progress_topic=f"{name}.progress",
        transactional_id_prefix=name,
    )
    published: set[int] = set()
    done = threading.Event()

    class Done:
        def __init__(self) -> None:
            from deltamirror.producer.metrics import WatcherMetrics

            self.inner = WatcherMetrics()

        def __getattr__(self, attr: str) -> Any:
            return getattr(self.inner, attr)

        def published_version(self, table: str, version: int, commit_ts_ms: int) -> None:
            self.inner.published_version(table, version, commit_ts_ms)
            published.add(version)
            if version >= latest:
                done.set()

    service = WatchService(cfg, metrics=Done())  # type: ignore[arg-type]
    linked = False

    def link_later_commits() -> None:
        nonlocal linked
        if not linked and start in published:
            for commit in later:  # one by one, in order, as a writer commits them
                os.link(commit, log / commit.name)
            linked = True

    try:
        t0 = time.perf_counter()  # the watcher starts in the call below
        harness.run_watch_until(service, done, timeout_s=1800, each=link_later_commits)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    records = sum(s.action_count for s in _commits_summaries(bootstrap, commits))
    return {
        "actions_topic": actions,
        "commits_topic": commits,
        "records": records,
        "reused": False,
        "publish_s": time.perf_counter() - t0,
    }


def _ratio_stats(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    q = statistics.quantiles(ordered, n=4) if len(ordered) >= 2 else [ordered[0]] * 3
    return {
        "median": statistics.median(ordered),
        "q1": q[0],
        "q3": q[2],
        "min": ordered[0],
        "max": ordered[-1],
    }


def measure_consume(
    bootstrap: str,
    manifest: dict[str, Any],
    *,
    rounds: int,
    work: Path,
    base_site: str | None = None,
    peer_decoders: tuple[str, ...] = ("orjson",),
) -> dict[str, Any]:
    """Every contender in its own process, interleaved, the order turning by one each round; per
    round each contender's figures divided by the peer's (``raw-<first decoder>``) of that round."""
    topic = publish_table(bootstrap, manifest)
    expected = manifest["active_files"]
    names = ["deltamirror", *(["base"] if base_site else []), *(f"raw-{d}" for d in peer_decoders)]
    peer = f"raw-{peer_decoders[0]}"
    runs: list[dict[str, dict[str, Any]]] = []
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        this: dict[str, dict[str, Any]] = {}
        load = os.getloadavg()
        for name in order:
            if name.startswith("raw-"):
                this[name] = run_consume_raw(bootstrap, topic["actions_topic"], decoder=name[4:])
                continue
            state_dir = work / f"state-{name}-{r}"
            site = base_site if name == "base" else None
            group_id = f"dmbench-{uuid.uuid4().hex[:12]}"
            result = run_consume_deltamirror(
                bootstrap, topic["actions_topic"], state_dir, site=site, group_id=group_id
            )
            if result["files"] != expected:
                raise SystemExit(f"{name} ended with {result['files']} files, not {expected}")
            this[name] = result
            this[f"{name}-restart"] = run_restart(
                bootstrap, topic["actions_topic"], state_dir, group_id, site=site
            )
            shutil.rmtree(state_dir, ignore_errors=True)
        for result in this.values():
            result["load_avg"] = load
        line = "  ".join(
            f"{n} {v['applied_s'] or v['exit_s']:.2f}s/{v['cpu_s']:.2f}cpu/{v['peak_rss_mb']:.0f}MB"
            for n, v in this.items()
        )
        print(f"round {r + 1}/{rounds} (load {load[0]:.2f}): {line}", file=sys.stderr)
        runs.append(this)
    summary: dict[str, Any] = {}
    for name in names:
        if name == peer:
            continue
        summary[name] = {
            key: _ratio_stats([run[name][key] / run[peer][key] for run in runs])
            for key in ("applied_s", "exit_s", "cpu_s", "cpu_applied_s", "peak_rss_mb")
        }
    absolute = {
        name: {
            key: statistics.median(run[name][key] or 0.0 for run in runs)
            for key in ("applied_s", "exit_s", "cpu_s", "cpu_applied_s", "peak_rss_mb")
        }
        for name in runs[0]
    }
    return {
        "topic": topic,
        "rounds": rounds,
        "peer": peer,
        "ratios": summary,
        "medians": absolute,
        "runs": runs,
    }


def _versions() -> dict[str, str]:
    from importlib.metadata import version

    return {p: version(p) for p in ("pyarrow", "deltamirror")} | {"python": platform.python_version()}


def _markdown(apply: list[dict[str, Any]], restart: dict[str, Any], save: dict[str, Any]) -> str:
    lines = [
        "| checkpoint_interval_versions | versions/s | actions/s | saves | time in saves |",
        "|---|---:|---:|---:|---:|",
    ]
    for run in apply:
        interval = run["interval_versions"] if run["interval_versions"] is not None else "None (no save)"
        lines.append(
            f"| {interval} | {run['versions_per_s']:.1f} | {run['actions_per_s']:.0f} | {run['saves']} "
            f"| {run['save_s']:.2f} s |"
        )
    lines += [
        "",
        "| 1M-file state | wall (median) | CPU | peak RSS | size |",
        "|---|---:|---:|---:|---:|",
        f"| save (checkpoint + marker + hint + offsets) | {save['total_s']:.2f} s | {save['cpu_s']:.2f} s | | "
        f"{save['size_mb']:.0f} MB |",
        f"| restart (StateStore.load_all, fresh process) | {restart['total_s']:.3f} s | {restart['cpu_s']:.2f} s "
        f"| {restart['peak_rss_mb']:.0f} MB | |",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--files", type=int, default=1_000_000)
    parser.add_argument("--commits", type=int, default=100)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=7, help="rounds of the consume section (default 7)")
    parser.add_argument("--only", choices=("apply", "consume"), help="run one section only")
    parser.add_argument(
        "--bootstrap", help="a broker to use (default: $KAFKA_BOOTSTRAP_SERVERS or a local one)"
    )
    parser.add_argument("--port", type=int, default=19492, help="port of the local broker (default 19492)")
    parser.add_argument("--kafka-data-dir", type=Path, default=Path("/tmp/dm-bench-snapcons-kafka"))
    parser.add_argument("--keep-broker", action="store_true", help="leave a broker the bench started running")
    parser.add_argument(
        "--base-site", help="also time the CLI of another revision (a link tree of its packages)"
    )
    parser.add_argument(
        "--peer-json",
        action="append",
        choices=("orjson", "json"),
        help="the peer's decoder(s) (default orjson)",
    )
    parser.add_argument("--data-dir", type=Path, default=DATA)
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--child", metavar="STATE_DIR", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.child:
        print(json.dumps(_child(args.child)))
        return 0

    manifest = ensure_table(args.files, args.commits, data_dir=args.data_dir)
    report: dict[str, Any] = {"table": manifest, "cpus": os.cpu_count(), "versions": _versions()}
    previous = json.loads(args.output.read_text()) if args.output.exists() else {}
    ok = True
    if args.only in (None, "apply"):
        section, ok = apply_section(manifest, args.reps)
        report.update(section)
    elif "apply" in previous:  # keep the other section's last figures
        report.update(
            {
                k: previous[k]
                for k in ("apply", "save", "restart", "reps", "state_matches_core")
                if k in previous
            }
        )
    if args.only in (None, "consume"):
        report["consume"] = consume_section(manifest, args)
        print(_consume_markdown(report["consume"]))
    elif "consume" in previous:
        report["consume"] = previous["consume"]
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {args.output}")
    return 0 if ok else 1


def consume_section(manifest: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    bootstrap = args.bootstrap or os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    broker = None
    if not bootstrap:
        from deltamirror.devkafka.broker import LocalKafka

        local = LocalKafka(port=args.port, data_dir=args.kafka_data_dir)
        started = not local.status()["running"]
        bootstrap = local.start()
        broker = local if started and not args.keep_broker else None
    work = Path(tempfile.mkdtemp(prefix="bench-snapshot-consume-"))
    load_before = os.getloadavg()
    try:
        result = measure_consume(
            bootstrap,
            manifest,
            rounds=args.rounds,
            work=work,
            base_site=args.base_site,
            peer_decoders=tuple(args.peer_json or ("orjson",)),
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if broker is not None:
            broker.stop()
    return {**result, "load_avg_before": load_before, "load_avg_after": os.getloadavg()}


def _consume_markdown(consume: dict[str, Any]) -> str:
    peer = consume["peer"]
    lines = [
        f"consume-snapshot of {consume['topic']['records']} records, {consume['rounds']} rounds, load avg "
        f"{consume['load_avg_before'][0]:.1f} -> {consume['load_avg_after'][0]:.1f}; ratios: median of per-round "
        f"ratios to {peer} [IQR] (min-max)",
        "",
        "| contender | to last version applied | to exit | CPU to last version | CPU to exit | peak RSS |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, m in consume["medians"].items():
        ratios = consume["ratios"].get(name)
        cells = []
        for key, unit in (
            ("applied_s", "s"),
            ("exit_s", "s"),
            ("cpu_applied_s", "s"),
            ("cpu_s", "s"),
            ("peak_rss_mb", " MB"),
        ):
            cell = f"{m[key]:.2f}{unit}" if unit == "s" else f"{m[key]:.0f}{unit}"
            if ratios is not None:
                r = ratios[key]
                cell += f" = {r['median']:.2f}x [{r['q1']:.2f}-{r['q3']:.2f}] ({r['min']:.2f}-{r['max']:.2f})"
            cells.append(cell)
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def apply_section(manifest: dict[str, Any], reps: int) -> tuple[dict[str, Any], bool]:
    from deltamirror.consumer.snapshot import StateStore
    from deltamirror.producer.publishing.offline_events import iter_event_values

    root, start, latest = manifest["root"], manifest["checkpoint_version"], manifest["version"]
    load_before = os.getloadavg()
    state = _initial_state(root, start)
    by_version: dict[int, list[bytes]] = {}
    for value in iter_event_values(root, starting_version=start + 1):
        by_version.setdefault(json.loads(value)["version"], []).append(value)
    versions = [by_version[v] for v in sorted(by_version)]

    work = Path(tempfile.mkdtemp(prefix="bench-snapshot-consumer-"))
    try:
        saves = []
        for i in range(2):  # one save of the whole state, twice (the second with a warm page cache)
            store = StateStore(work / f"save-{i}", TOPIC)
            cpu, t0 = _cpu_s(), time.perf_counter()
            store.save([state], {0: 0})
            saves.append({"total_s": time.perf_counter() - t0, "cpu_s": _cpu_s() - cpu})
        folder = store.folder(state.table_id) / "_delta_log"
        size_mb = sum(p.stat().st_size for p in folder.iterdir()) / 2**20
        save = {**saves[-1], "size_mb": size_mb, "runs": saves}

        apply = [_apply_run(state, versions, interval, work / f"apply-{interval}") for interval in INTERVALS]
        saved_dir = work / "apply-100"
        agree = _same_keys(saved_dir, root, latest) and all(
            r["files"] == manifest["active_files"] and r["version"] == latest for r in apply
        )
        _run_child(saved_dir)  # warm-up
        runs = [_run_child(saved_dir) for _ in range(reps)]
        agree = agree and all(r["files"] == manifest["active_files"] and r["version"] == latest for r in runs)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    load_after = os.getloadavg()
    restart = {k: statistics.median(r[k] for r in runs) for k in ("total_s", "cpu_s", "peak_rss_mb")}
    restart["runs"] = runs
    print(
        f"state: {manifest['active_files']} files, versions {start} -> {latest} ({len(versions)} versions, "
        f"{sum(map(len, versions))} actions); {reps} restarts after a warm-up; {os.cpu_count()} CPUs, "
        f"load avg {load_before[0]:.1f} -> {load_after[0]:.1f}\n"
    )
    print(_markdown(apply, restart, save))
    if not agree:
        print("MISMATCH: the saved or loaded state is not core's snapshot", file=sys.stderr)
    section = {
        "reps": reps,
        "load_avg_before": load_before,
        "load_avg_after": load_after,
        "state_matches_core": agree,
        "apply": apply,
        "save": save,
        "restart": restart,
        "markdown": _markdown(apply, restart, save),
    }
    return section, agree


if __name__ == "__main__":
    sys.exit(main())
