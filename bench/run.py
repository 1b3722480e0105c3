"""``make bench``: every performance goal, measured side by side: own processes, interleaved, rounds, per-round ratios.

For each group of contenders (one row of the issue's table) the inputs are generated or reused
(bench/.data), then every contender runs in its own process, ``--rounds`` rounds (default 7),
interleaved, the order turning by one each round, so that background load hits them alike. Each
run reports the interval its contender's docstring defines (``work_s``), the time from process
start (``from_start_s``: the parent stamps the wall clock just before it spawns the process), the
time after the contender's imports (``after_imports_s``), CPU and peak RSS. Groups that read files
run twice per round: with the inputs evicted from the page cache (``cold``: ``posix_fadvise``
DONTNEED on every input file, or ``--drop-caches``: ``sync; echo 3 > /proc/sys/vm/drop_caches``,
which empties the cache of everyone on the machine) and after reading them once (``warm``).
deltamirror's modules are compiled to bytecode before the first run, as pip does when it installs
the wheel (an editable install under ``PYTHONDONTWRITEBYTECODE`` has none: each process would
compile the sources again, and the figures of process start would include that).

Verdicts are medians of per-round ratios deltamirror / peer (same round, same cache state), with
their IQR and min-max, beside the 1-minute load average before and after every run and round.

Results: bench/results/run-<group>.json, bench/results/README.md (the tables), PNG plots in
bench/results/ (``--quick``: bench/results/tmp/quick/, never judged by time). Exit code 1 when a
contender failed or the contenders disagree on what they read (rows, files, records). A run
whose imports failed (another process rewriting the editable install at that moment) is run once
more, and says so. The broker is the bench's own (port 19192, or the next free pair of ports),
unless ``--bootstrap`` names one.

    python bench/run.py [--rounds 7] [--only GROUP ...] [--quick] [--drop-caches]
                        [--bootstrap HOST:PORT] [--no-spark] [--no-kafka]
    python bench/run.py --child GROUP CONTENDER PARAMS_JSON RESULT_JSON   (one run; used by the above)
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness

QUICK_RESULTS = harness.RESULTS / "tmp" / "quick"
BENCH_PORT = 19192
BENCH_KAFKA_DATA = Path("/tmp/dm-bench-run-kafka")


@dataclass(frozen=True)
class Contender:
    name: str
    function: str
    #: "deltamirror" (the subject), "peer", "floor", or "alone" (a figure of its own, no ratio)
    role: str = "peer"
    label: str = ""


@dataclass(frozen=True)
class Goal:
    """One limit of the issue: ``ratio`` of deltamirror (or ``contender``) to ``peer`` (or the
    ``contender``'s own value when ``peer`` is None) on ``metric``, at most ``limit``; an infinite
    ``limit`` is a figure reported beside the goals, not judged."""

    text: str
    metric: str
    limit: float
    peer: str | None = None
    contender: str = "deltamirror"
    unit: str = "x"


@dataclass(frozen=True)
class Group:
    name: str
    title: str
    module: str
    contenders: tuple[Contender, ...]
    params: dict[str, Any]
    quick_params: dict[str, Any]
    metric: str = "work_s"
    goals: tuple[Goal, ...] = ()
    cold: bool = False
    needs: frozenset[str] = frozenset()
    warmup: bool = True
    #: the facts all contenders (or those named) must agree on
    agree: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)

    def contender(self, name: str) -> Contender:
        return next(c for c in self.contenders if c.name == name)


GROUPS: tuple[Group, ...] = (
    Group(
        "import",
        "`import deltamirror.core` vs `import deltalake`",
        "bench_imports",
        (
            Contender("deltamirror", "import_deltamirror_core", "deltamirror", "import deltamirror.core"),
            Contender("deltalake", "import_deltalake", "peer", "import deltalake"),
            Contender("pyarrow", "import_pyarrow", "floor", "import pyarrow"),
        ),
        {},
        {},
        metric="import_s",
        goals=(
            Goal("6. `import deltamirror.core` <= 1.5x `import deltalake`", "import_s", 1.5, "deltalake"),
        ),
    ),
    Group(
        "snapshot",
        "snapshot, {checkpoint_files:,} files (V1 checkpoint with stats + {commits} commits)",
        "bench_snapshot",
        (
            Contender("deltamirror", "snapshot_deltamirror", "deltamirror", "open_table().snapshot().files"),
            Contender("delta-rs", "snapshot_delta_rs", "peer", "DeltaTable() + get_add_actions()"),
            Contender("pyarrow", "snapshot_pyarrow", "floor", 'pq.read_table(checkpoint, columns=["add"])'),
        ),
        {"files": 1_000_000, "commits": 100},
        {"files": 5_000, "commits": 5},
        goals=(
            Goal("4. snapshot <= 0.25x delta-rs's time", "work_s", 0.25, "delta-rs"),
            Goal("4. snapshot memory <= 0.4x delta-rs's", "peak_rss_mb", 0.4, "delta-rs"),
        ),
        cold=True,
        agree=("files",),
        notes=("the pyarrow floor reads the checkpoint's `add` column only (not the commits after it)",),
    ),
    Group(
        "big-commit",
        "one commit of {commit_mb} MB of file entries",
        "bench_big_commit",
        (
            Contender(
                "deltamirror", "big_commit_deltamirror", "deltamirror", "open_table().snapshot().files"
            ),
            Contender("delta-rs", "big_commit_delta_rs", "peer", "DeltaTable() + get_add_actions()"),
        ),
        {"commit_mb": 200},
        {"commit_mb": 2},
        metric="memory_x_commit",
        goals=(
            Goal(
                "4. a 200 MB commit of file entries in memory <= 2x its size",
                "memory_x_commit",
                2.0,
                unit="x",
            ),
            Goal("4. … beside delta-rs (a figure)", "memory_x_commit", float("inf"), "delta-rs"),
        ),
        agree=("files",),
        notes=("memory is the peak RSS over the RSS after imports, per byte of the commit file",),
    ),
    Group(
        "change-feed",
        "change feed, {versions:,} versions",
        "bench_changes",
        (
            Contender("deltamirror", "changes_deltamirror", "deltamirror", "read_changes(table, 0)"),
            Contender("delta-rs", "changes_delta_rs", "peer", "DeltaTable.load_cdf(0)"),
            Contender("pyarrow", "changes_pyarrow", "floor", "pyarrow.dataset over every file read"),
        ),
        {"versions": 1000, "rows_per_append": 1500},
        {"versions": 40, "rows_per_append": 100},
        goals=(
            Goal("3. change feed, every column: CPU <= delta-rs's", "work_cpu_s", 1.0, "delta-rs"),
            Goal("3. … memory <= delta-rs's", "peak_rss_mb", 1.0, "delta-rs"),
            Goal("3. … time beside delta-rs's (a figure)", "work_s", float("inf"), "delta-rs"),
            Goal("3. … time beside the decode floor's (a figure)", "work_s", float("inf"), "pyarrow"),
        ),
        cold=True,
        agree=("rows",),
        notes=(
            "delta-spark's batch change feed is measured in the Spark groups (about a minute a run "
            "on this table: 7 rounds of it would double the whole run)",
        ),
    ),
    Group(
        "change-feed-columns",
        "change feed, {versions:,} versions, 2 of 4 columns (id, n)",
        "bench_changes",
        (
            Contender(
                "deltamirror",
                "changes_projected_deltamirror",
                "deltamirror",
                'read_changes(table, 0, columns=["id", "n"])',
            ),
            Contender(
                "delta-rs",
                "changes_projected_delta_rs",
                "peer",
                'DeltaTable.load_cdf(0, columns=["id", "n", <the 3 CDF columns>])',
            ),
        ),
        {"versions": 1000, "rows_per_append": 1500},
        {"versions": 40, "rows_per_append": 100},
        goals=(
            Goal("3. projected change feed: CPU <= delta-rs's", "work_cpu_s", 1.0, "delta-rs"),
            Goal("3. … memory <= delta-rs's", "peak_rss_mb", 1.0, "delta-rs"),
        ),
        cold=True,
        agree=("rows", "columns"),
        notes=("the same table as the change-feed group; both readers give the same five columns",),
    ),
    Group(
        "log-to-kafka",
        "log -> Kafka, {records:,} actions",
        "bench_producer",
        (
            Contender(
                "deltamirror", "produce_deltamirror", "deltamirror", "deltamirror watch (WatchService)"
            ),
            Contender(
                "raw-transactional", "produce_raw_transactional", "peer", "confluent-kafka, transactional"
            ),
            Contender("raw-idempotent", "produce_raw_idempotent", "peer", "confluent-kafka, idempotent"),
            Contender(
                "naive-mirror",
                "produce_naive_mirror",
                "peer",
                "orjson per line, same envelope, a transaction per version, no checks",
            ),
        ),
        {"actions": 200_000, "versions": 200},
        {"actions": 4_000, "versions": 10},
        goals=(
            Goal(
                "2. log -> Kafka >= 0.9x the naive mirror's throughput (time <= 1.11x)",
                "work_s",
                1 / 0.9,
                "naive-mirror",
            ),
            Goal(
                "2. log -> Kafka CPU <= 1.6x raw transactional produce",
                "work_cpu_s",
                1.6,
                "raw-transactional",
            ),
            Goal(
                "naive mirror's own time against raw transactional produce (no limit: reported)",
                "work_s",
                float("inf"),
                "raw-transactional",
                contender="naive-mirror",
            ),
        ),
        cold=True,
        needs=frozenset({"kafka"}),
        agree=("records",),
    ),
    Group(
        "parse-floor",
        "what parsing the producer's log costs, {actions:,} actions in {versions} commits",
        "bench_parse_floor",
        (
            Contender(
                "deltamirror", "scan_deltamirror", "deltamirror", "iter_event_values (the producer's scan)"
            ),
            Contender("boundary", "boundary", "floor", "read_actions (the log boundary alone)"),
            Contender("parse", "floor_parse", "floor", "pydantic_core.from_json per line, no check"),
            Contender("arrow-json", "floor_arrow_json", "floor", "pyarrow.json.read_json per commit"),
            Contender("utf8", "floor_utf8", "floor", "UTF-8 decode of every commit"),
            Contender("read", "floor_read", "floor", "reading every commit"),
        ),
        {"actions": 200_000, "versions": 200},
        {"actions": 4_000, "versions": 10},
        notes=(
            "no goal: the floors say what any strict check of these bytes costs; the revision before "
            "checks (scan without parsing) is measured by bench/compare_revisions.py",
        ),
    ),
    Group(
        "consume-snapshot",
        "`consume-snapshot` of a {active_files:,}-file table, process start to last version applied",
        "bench_consume",
        (
            Contender("deltamirror", "consume_deltamirror", "deltamirror", "deltamirror consume-snapshot"),
            Contender("raw", "consume_raw", "peer", "raw read_committed consume + orjson decode"),
            Contender("restart", "consume_restart", "alone", "restart over the saved state"),
        ),
        {"files": 1_000_000, "commits": 100},
        {"files": 5_000, "commits": 5},
        metric="from_start_s",
        goals=(
            Goal("1. consume-snapshot wall <= 1.1x the raw peer's", "from_start_s", 1.1, "raw"),
            Goal("1. consume-snapshot CPU <= 1.5x the raw peer's", "cpu_s", 1.5, "raw"),
            Goal("1. consume-snapshot memory <= 400 MB", "peak_rss_mb", 400, None, unit="MB"),
            Goal("1. restart <= 1 s", "from_start_s", 1.0, None, "restart", unit="s"),
        ),
        needs=frozenset({"kafka"}),
    ),
    Group(
        "spark-small",
        'Spark `format("deltamirror")` vs delta-spark CDF stream, small table ({rows_per_version} rows a '
        "version, maxFilesPerTrigger {max_files_per_trigger})",
        "bench_spark",
        (
            Contender("deltamirror", "spark_deltamirror", "deltamirror", 'readStream.format("deltamirror")'),
            Contender("delta-spark", "spark_delta_stream", "peer", "delta-spark readChangeFeed stream"),
        ),
        {"versions": 30, "rows_per_version": 50, "options": {"maxFilesPerTrigger": 3}},
        {"versions": 24, "rows_per_version": 20, "options": {"maxFilesPerTrigger": 20}, "by_version": True},
        goals=(
            Goal("5. Spark source >= 1.0x delta-spark's stream, small table", "work_s", 1.0, "delta-spark"),
        ),
        needs=frozenset({"kafka", "spark"}),
        warmup=False,
        agree=("rows", "checksum", "by_version"),
    ),
    Group(
        "spark-large",
        'Spark `format("deltamirror")` vs delta-spark CDF stream, large table ({rows_per_version:,} rows a '
        "version)",
        "bench_spark",
        (
            Contender("deltamirror", "spark_deltamirror", "deltamirror", 'readStream.format("deltamirror")'),
            Contender("delta-spark", "spark_delta_stream", "peer", "delta-spark readChangeFeed stream"),
            Contender("delta-spark-batch", "spark_delta_batch", "peer", "delta-spark batch readChangeFeed"),
        ),
        {"versions": 40, "rows_per_version": 20_000},
        {"versions": 24, "rows_per_version": 200, "by_version": True},
        goals=(
            Goal("5. Spark source >= 1.0x delta-spark's stream, large table", "work_s", 1.0, "delta-spark"),
        ),
        needs=frozenset({"kafka", "spark"}),
        warmup=False,
        agree=("rows", "checksum", "by_version"),
    ),
)


def group_named(name: str) -> Group:
    for group in GROUPS:
        if group.name == name:
            return group
    raise SystemExit(f"no group {name!r} (groups: {', '.join(g.name for g in GROUPS)})")


# --- one child ------------------------------------------------------------------------------------------


def child(argv: list[str]) -> int:
    kind, rest = argv[0], argv[1:]
    if kind == "--setup":
        group_name, params_file, result_file = rest
        return harness.child_main(group_named(group_name).module, "setup", params_file, result_file)
    if kind == "--child-groups":
        *names, params_file, result_file = rest
        specs = {
            n: (group_named(n).module, {c.name: c.function for c in group_named(n).contenders}) for n in names
        }
        return harness.child_groups(specs, params_file, result_file)
    group_name, contender, params_file, result_file = rest
    group = group_named(group_name)
    return harness.child_main(group.module, group.contender(contender).function, params_file, result_file)


# --- the broker -------------------------------------------------------------------------------------------


class Broker:
    """The bench's own broker (its own port and data dir, so that no other run stops it), or a given one."""

    def __init__(self, bootstrap: str | None) -> None:
        self.given = bootstrap
        self.local: Any = None
        self.bootstrap = bootstrap or ""
        self.pid: int | None = None
        self.version: str | None = None
        self.started_here = False

    def ensure(self) -> str:
        if self.bootstrap:
            return self.bootstrap
        from deltamirror.devkafka.broker import LocalKafka

        port = _bench_port()
        self.local = LocalKafka(port=port, data_dir=_bench_kafka_data(port))
        self.started_here = not self.local.status()["running"]
        print(f"  {'starting' if self.started_here else 'using'} the bench broker on port {port}")
        self.bootstrap = self.local.start()
        state = self.local.status()
        self.pid, self.version = state["pid"], state["kafka_version"]
        return self.bootstrap

    def delete_topics(self, topics: list[str]) -> None:
        if not topics or not self.bootstrap:
            return
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        for future in admin.delete_topics(topics, operation_timeout=30).values():
            try:
                future.result(timeout=30)
            except Exception as exc:
                print(f"  (could not delete a topic: {exc})")

    def close(self) -> None:
        if self.local is not None and self.started_here:
            self.local.stop()


def _bench_kafka_data(port: int) -> Path:
    return BENCH_KAFKA_DATA if port == BENCH_PORT else Path(f"{BENCH_KAFKA_DATA}-{port}")


def _bench_port() -> int:
    """BENCH_PORT, or the next port pair free for a new broker when another program holds it (the
    data dir of a local broker is bound to its ports: each port has its own)."""
    import socket

    from deltamirror.devkafka.broker import LocalKafka

    def free(port: int) -> bool:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                return False
        return True

    for port in range(BENCH_PORT, BENCH_PORT + 100, 5):
        if LocalKafka(port=port, data_dir=_bench_kafka_data(port)).status()["running"]:
            return port  # our own broker from an earlier run
        if free(port) and free(port + 1):
            return port
    raise SystemExit(f"no free port pair for the bench broker in {BENCH_PORT}-{BENCH_PORT + 99}")


# --- one group ------------------------------------------------------------------------------------------


def _has_setup(group: Group) -> bool:
    import importlib

    return hasattr(importlib.import_module(group.module), "setup")


def _inputs_for(params: dict[str, Any], contender: str) -> list[str]:
    inputs = params.get("inputs") or []
    if isinstance(inputs, dict):
        return list(inputs.get(contender, []))
    return list(inputs)


def _all_inputs(params: dict[str, Any]) -> list[str]:
    inputs = params.get("inputs") or []
    if isinstance(inputs, dict):
        return sorted({p for paths in inputs.values() for p in paths})
    return list(inputs)


def _round_ratios(
    runs: list[dict[str, Any]], state: str, rounds: int, metric: str, subject: str, peer: str
) -> dict[str, Any]:
    """``subject``'s ``metric`` over ``peer``'s, per round (both measured in that round), and their spread."""
    per_round: list[float] = []
    for r in range(rounds):
        a = [
            _value(x, metric)
            for x in runs
            if x["round"] == r and x["state"] == state and x["contender"] == subject
        ]
        b = [
            _value(x, metric)
            for x in runs
            if x["round"] == r and x["state"] == state and x["contender"] == peer
        ]
        if a and b and a[0] is not None and b[0] and b[0] > 0:
            per_round.append(a[0] / b[0])
    return {**harness.spread(per_round), "per_round": per_round}


def _value(run: dict[str, Any], metric: str) -> float | None:
    if "error" in run:
        return None
    value = run["measures"].get(metric, run["facts"].get(metric))
    return None if value is None else float(value)


def setup_group(group: Group, args: argparse.Namespace, broker: Broker, log_dir: Path) -> dict[str, Any]:
    """The group's inputs (its ``setup`` in a child process): the parameters every contender gets."""
    params: dict[str, Any] = dict(group.quick_params if args.quick else group.params)
    for item in args.param or ():
        key, _, value = item.partition("=")
        if key not in params:
            raise SystemExit(f"--param {key}: group {group.name} has no such parameter ({', '.join(params)})")
        params[key] = json.loads(value)
    if "kafka" in group.needs:
        params["bootstrap"] = broker.ensure()
        params["broker_pid"] = broker.pid
    print(f"\n== {group.name}: setup", flush=True)
    t0 = time.perf_counter()
    if _has_setup(group):
        setup = harness.spawn(
            ["--setup", group.name], params, timeout_s=3600, label=f"{group.name}-setup", log_dir=log_dir
        )
        params = setup["facts"]
    print(f"   setup {time.perf_counter() - t0:.1f} s", flush=True)
    return params


def run_group(
    group: Group,
    args: argparse.Namespace,
    broker: Broker,
    log_dir: Path,
    params: dict[str, Any] | None = None,
    preset: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Set up (unless ``params`` are given) and measure one group; ``preset``: the results of a
    ``--quick`` run that measured every contender of several groups in one process."""
    quick = args.quick
    if params is None:
        params = setup_group(group, args, broker, log_dir)
    timeout = 300.0 if quick else 1800.0
    rounds = args.rounds
    names = [c.name for c in group.contenders]
    states = ["cold", "warm"] if group.cold and _all_inputs(params) else ["warm"]
    cold_how = "posix_fadvise(DONTNEED) of every input file before each cold run"
    if "cold" in states and args.drop_caches:
        cold_how = "sync; echo 3 > /proc/sys/vm/drop_caches before each cold run"
    shared = preset is not None
    runs: list[dict[str, Any]] = []
    round_loads: list[dict[str, Any]] = []
    problems: list[str] = []
    try:
        if group.warmup and not quick:
            print("   warm-up (not counted):", " ".join(names), flush=True)
            for name in names:
                try:
                    harness.spawn(
                        ["--child", group.name, name],
                        params,
                        timeout_s=timeout,
                        label=f"{group.name}-{name}-warmup",
                        log_dir=log_dir,
                    )
                except harness.ChildFailed as exc:
                    problems.append(f"warm-up of {name} failed: {exc}")
        for r in range(rounds):
            order = names[r % len(names) :] + names[: r % len(names)]
            round_load = {"round": r, "order": order, "load_before": harness.load_average()}
            for state in states:
                if state == "warm" and "cold" in states:
                    harness.prewarm(_all_inputs(params))
                shared_results: dict[str, Any] | None = preset
                for position, name in enumerate(order):
                    cache: dict[str, Any] | None = None
                    if state == "cold":
                        if args.drop_caches:
                            failed = harness.drop_all_caches()
                            cache = {"dropped_all": failed is None, "error": failed}
                            if failed:
                                cache |= harness.evict(_inputs_for(params, name))
                        else:
                            cache = harness.evict(_inputs_for(params, name))
                    run: dict[str, Any] = {
                        "round": r,
                        "state": state,
                        "contender": name,
                        "position": position,
                        "load_before": harness.load_average(),
                    }
                    if cache is not None:
                        run["cache"] = cache
                    try:
                        if shared:  # --quick: measured in one process with the other Spark groups
                            if not shared_results or name not in shared_results:
                                raise harness.ChildFailed(
                                    "the shared Spark process failed (spark-all-quick.log)"
                                )
                            result = shared_results[name]
                        else:
                            result = _spawn_contender(group, name, params, run, args, timeout, log_dir)
                        run["measures"] = harness.measures(result)
                        run["facts"] = result["facts"]
                        if result["facts"].get("ok") is False:
                            problems.append(
                                f"round {r} {state} {name}: the run reported a failure: {result['facts']}"
                            )
                    except harness.ChildFailed as exc:
                        run["error"] = str(exc)
                        problems.append(f"round {r} {state} {name}: {exc}")
                    run["load_after"] = harness.load_average()
                    runs.append(run)
                    value = _value(run, group.metric)
                    shown = f"{value:.3f}" if value is not None else "FAILED"
                    print(
                        f"   round {r + 1}/{rounds} {state:4} {name:18} {group.metric} {shown}"
                        f"  (load {run['load_before'][0]:.2f})",
                        flush=True,
                    )
            round_load["load_after"] = harness.load_average()
            round_loads.append(round_load)
    finally:
        cleanup = params.get("cleanup") or {}
        broker.delete_topics(list(cleanup.get("topics", [])))
        for folder in cleanup.get("dirs", []):
            import shutil

            shutil.rmtree(folder, ignore_errors=True)
    problems += _disagreements(group, runs)
    return _group_report(group, params, runs, round_loads, states, cold_how, problems, args)


#: a child that could not import its modules: another process rewriting the editable install's
#: link tree (``pip install -e``) at that moment; worth one more try, never a figure of its own
_IMPORT_FAILURES = ("ModuleNotFoundError", "ImportError")


def _spawn_contender(
    group: Group,
    name: str,
    params: dict[str, Any],
    run: dict[str, Any],
    args: argparse.Namespace,
    timeout: float,
    log_dir: Path,
) -> dict[str, Any]:
    """One contender's run; once more (after a pause, with its inputs evicted again when cold)
    when its imports failed. The first failure stays in the run's record (``retried_after``)."""
    label = f"{group.name}-{name}-r{run['round']}-{run['state']}"
    try:
        return harness.spawn(
            ["--child", group.name, name], params, timeout_s=timeout, label=label, log_dir=log_dir
        )
    except harness.ChildFailed as exc:
        if not any(marker in str(exc) for marker in _IMPORT_FAILURES):
            raise
        run["retried_after"] = str(exc)
        print(f"   (the imports of {name} failed; once more in 20 s: {str(exc)[-120:]})", flush=True)
    time.sleep(20)
    if run["state"] == "cold":
        run["cache"] = harness.evict(_inputs_for(params, name))
    run["load_before"] = harness.load_average()
    return harness.spawn(
        ["--child", group.name, name], params, timeout_s=timeout, label=f"{label}-retry", log_dir=log_dir
    )


def _versions_apart(seen: dict[str, set[Any]]) -> str:
    """The versions whose facts (a JSON object of version -> [rows, hash of the columns but
    ``_commit_timestamp``, latest ``_commit_timestamp`` in us]) differ between contenders."""
    by_contender = {name: [json.loads(v) for v in values] for name, values in seen.items()}
    versions = sorted({int(k) for runs in by_contender.values() for run in runs for k in run})
    apart = []
    for version in versions:
        facts = {
            name: {tuple(run.get(str(version)) or ()) for run in runs} for name, runs in by_contender.items()
        }
        if len({f for fs in facts.values() for f in fs}) > 1:
            apart.append(f"v{version} {facts}")
    return "; ".join(apart) or "none (the runs of one contender differ)"


def _disagreements(group: Group, runs: list[dict[str, Any]]) -> list[str]:
    out = []
    for fact in group.agree:
        seen: dict[str, set[Any]] = {}
        for run in runs:
            if "error" not in run and fact in run["facts"]:
                seen.setdefault(run["contender"], set()).add(run["facts"][fact])
        values = {v for vs in seen.values() for v in vs}
        if len(values) > 1 and fact == "by_version":
            out.append(f"the contenders disagree on these versions: {_versions_apart(seen)}")
        elif len(values) > 1:
            out.append(f"the contenders disagree on {fact}: {seen}")
    return out


def _public_params(params: dict[str, Any]) -> dict[str, Any]:
    """The parameters without the long lists (file names) and the broker's address."""
    return {
        k: v
        for k, v in params.items()
        if k not in ("data_files", "change_files", "inputs", "cleanup", "broker_pid")
        and not (isinstance(v, list) and len(v) > 20)
    }


def _group_report(
    group: Group,
    params: dict[str, Any],
    runs: list[dict[str, Any]],
    round_loads: list[dict[str, Any]],
    states: list[str],
    cold_how: str,
    problems: list[str],
    args: argparse.Namespace,
) -> dict[str, Any]:
    metrics = ("work_s", "from_start_s", "after_imports_s", "imports_s", "cpu_s", "work_cpu_s", "peak_rss_mb")
    extra = (group.metric,) if group.metric not in metrics else ()
    summary: dict[str, dict[str, dict[str, Any]]] = {}
    ratios: dict[str, dict[str, dict[str, Any]]] = {}
    for state in states:
        summary[state] = {}
        for c in group.contenders:
            mine = [r for r in runs if r["state"] == state and r["contender"] == c.name]
            summary[state][c.name] = {
                m: harness.spread([v for r in mine if (v := _value(r, m)) is not None])
                for m in metrics + extra
            }
            summary[state][c.name]["failed"] = sum(1 for r in mine if "error" in r)
        ratios[state] = {}
        subject = next(c.name for c in group.contenders if c.role == "deltamirror")
        for peer in (c for c in group.contenders if c.role in ("peer", "floor")):
            ratios[state][peer.name] = {
                m: _round_ratios(runs, state, args.rounds, m, subject, peer.name) for m in metrics + extra
            }
    goals = []
    for goal in group.goals:
        state = "warm"
        if goal.peer is None:
            figure = summary[state][goal.contender][goal.metric]
            values: list[float] = [
                v
                for r in runs
                if r["state"] == state
                and r["contender"] == goal.contender
                and (v := _value(r, goal.metric)) is not None
            ]
        elif goal.contender == subject:
            figure = ratios[state][goal.peer][goal.metric]
            values = figure.get("per_round", [])
        else:  # a peer against another peer (the naive mirror against raw produce)
            figure = _round_ratios(runs, state, args.rounds, goal.metric, goal.contender, goal.peer)
            values = figure.get("per_round", [])
        median = figure.get("median")
        goals.append(
            {
                "goal": goal.text,
                "metric": goal.metric,
                "peer": goal.peer,
                "contender": goal.contender,
                "limit": None if math.isinf(goal.limit) else goal.limit,
                "unit": goal.unit,
                "state": state,
                "median": median,
                "q1": figure.get("q1"),
                "q3": figure.get("q3"),
                "min": figure.get("min"),
                "max": figure.get("max"),
                "values": values,
                "met": None if median is None or math.isinf(goal.limit) else bool(median <= goal.limit),
            }
        )
    loads = [x for r in runs for x in (r["load_before"][0], r["load_after"][0])]
    return {
        "group": group.name,
        "title": group.title.format(**_title_fields(params)),
        "quick": args.quick,
        "rounds": args.rounds,
        "states": states,
        "cold": {
            "measured": "cold" in states,
            "how": cold_how if "cold" in states else None,
            "why_not": None if "cold" in states else _why_no_cold(group),
        },
        "metric": group.metric,
        "contenders": [
            {
                "name": c.name,
                "role": c.role,
                "label": c.label,
                "interval": _docstring(group.module, c.function),
            }
            for c in group.contenders
        ],
        "params": _public_params(params),
        "load_1min": {
            "min": min(loads, default=None),
            "max": max(loads, default=None),
            "rounds": round_loads,
        },
        "runs": runs,
        "summary": summary,
        "ratios": ratios,
        "goals": goals,
        "notes": list(group.notes),
        "problems": problems,
    }


def _title_fields(params: dict[str, Any]) -> dict[str, Any]:
    fields = dict(params)
    table = params.get("table")
    if isinstance(table, dict):
        fields = {**table, **fields}
    fields["max_files_per_trigger"] = (params.get("options") or {}).get("maxFilesPerTrigger", "default")
    fields.setdefault("records", params.get("records", 0))
    fields.setdefault("active_files", params.get("active_files", params.get("files", 0)))
    fields.setdefault("checkpoint_files", params.get("files", 0))
    return fields


def _why_no_cold(group: Group) -> str:
    if "spark" in group.needs:
        return "not measured: the JVM's start and planning dominate; the table's files are a few MB"
    if group.name == "consume-snapshot":
        return (
            "not measured: the records are read from the broker, whose page cache this bench does not control"
        )
    if group.name == "import":
        return (
            "not measured: evicting the interpreter's libraries would slow every other process on the machine"
        )
    return "not measured"


def _docstring(module: str, function: str) -> str:
    import importlib

    fn = getattr(importlib.import_module(module), function)
    return " ".join((fn.__doc__ or "").split())


# --- main ------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("--child", "--child-groups", "--setup"):
        return child(argv)
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=None, help="rounds per group (default 7; --quick: 1)")
    parser.add_argument(
        "--only", action="append", choices=[g.name for g in GROUPS], help="only this group (repeatable)"
    )
    parser.add_argument(
        "--quick", action="store_true", help="tiny inputs, 1 round: a smoke run (CI), never judged by time"
    )
    parser.add_argument(
        "--drop-caches",
        action="store_true",
        help="cold runs: drop the whole page cache (root; disturbs everyone)",
    )
    parser.add_argument(
        "--bootstrap", help="an existing broker (default: the bench's own, port 19192 or the next free pair)"
    )
    parser.add_argument(
        "--param",
        action="append",
        metavar="KEY=JSON",
        help="override a parameter of the groups run (e.g. files=200000: a smaller input while working)",
    )
    parser.add_argument("--no-spark", action="store_true", help="leave out the groups that need Spark")
    parser.add_argument("--no-kafka", action="store_true", help="leave out the groups that need a broker")
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="measure nothing: write README.md and the plots again from the stored run-*.json",
    )
    parser.add_argument(
        "--output", type=Path, help="results folder (default bench/results, --quick: bench/results/tmp/quick)"
    )
    args = parser.parse_args(argv)
    if args.rounds is None:
        args.rounds = 1 if args.quick else 7
    if not args.quick and args.rounds < 7:
        print(f"note: {args.rounds} rounds; the issue asks for at least 7", file=sys.stderr)
    out = args.output or (QUICK_RESULTS if args.quick else harness.RESULTS)
    out.mkdir(parents=True, exist_ok=True)
    if args.report_only:
        import report as report_module

        stored = report_module.load_reports(out, [])
        for one in stored:  # the stored results, written again in the compact form
            _write_json(out / f"run-{one['group']}.json", one)
        index = json.loads((out / "run.json").read_text())
        print(report_module.write(out, index, stored, partial=False))
        return 0
    log_dir = harness.DATA / "logs" / ("quick" if args.quick else "full")
    groups = [g for g in GROUPS if not args.only or g.name in args.only]
    groups = [g for g in groups if not (args.no_spark and "spark" in g.needs)]
    groups = [g for g in groups if not (args.no_kafka and "kafka" in g.needs)]

    started = time.time()
    bytecode = harness.compile_bytecode()
    print(f"  {bytecode}")
    broker = Broker(args.bootstrap or None)
    reports: list[dict[str, Any]] = []
    failed = False
    try:
        presets = _quick_spark(groups, args, broker, log_dir) if args.quick else {}
        for group in groups:
            try:
                if group.name in presets:
                    report = run_group(group, args, broker, log_dir, *presets[group.name])
                else:
                    report = run_group(group, args, broker, log_dir)
            except harness.ChildFailed as exc:
                print(f"   {group.name}: setup failed: {exc}", file=sys.stderr)
                failed = True
                continue
            report["machine"] = harness.machine()
            report["git"] = harness.versions()["git"]
            report["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
            reports.append(report)
            _write_json(out / f"run-{group.name}.json", report)
            for problem in report["problems"]:
                print(f"   PROBLEM: {problem}", file=sys.stderr)
            failed = failed or bool(report["problems"])
    finally:
        broker.close()
    import report as report_module

    index = {
        "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)),
        "seconds": round(time.time() - started, 1),
        "quick": args.quick,
        "rounds": args.rounds,
        "argv": argv,
        "machine": harness.machine(),
        "versions": harness.versions(broker.version),
        "drop_caches": _drop_caches_note(args),
        "bytecode": bytecode,
        "groups": [r["group"] for r in reports],
    }
    if not args.only:
        (out / "run.json").write_text(json.dumps(index, indent=2) + "\n")
    markdown = report_module.write(out, index, reports, partial=bool(args.only))
    print("\n" + markdown)
    print(f"\nwrote {out} in {index['seconds']:.0f} s")
    if failed:
        print("FAILED: a contender failed or the contenders disagree (see PROBLEM above)", file=sys.stderr)
        return 1
    return 0


def _quick_spark(
    groups: list[Group], args: argparse.Namespace, broker: Broker, log_dir: Path
) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """--quick: every Spark contender of every Spark group in one process (one JVM start), so that
    the smoke run stays within its two minutes. Each group's parameters and its contenders' results."""
    spark = [g for g in groups if "spark" in g.needs]
    if not spark:
        return {}
    params = {g.name: setup_group(g, args, broker, log_dir) for g in spark}
    try:
        results = harness.spawn(
            ["--child-groups", *params], params, timeout_s=600, label="spark-all-quick", log_dir=log_dir
        )["groups"]
    except harness.ChildFailed as exc:
        print(f"   the Spark contenders failed: {exc}", file=sys.stderr)
        return {name: (p, {}) for name, p in params.items()}
    return {name: (p, results[name]) for name, p in params.items()}


def _rounded(value: Any) -> Any:
    """Floats to 4 decimals (0.1 ms, 0.0001 MB): what a figure needs, a third of the file."""
    if isinstance(value, float):
        return round(value, 4)
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


def _write_json(path: Path, report: dict[str, Any]) -> None:
    """One group's results, compact: a line per key (two levels deep) and per run, so that the file
    stays small and a diff still shows what changed."""

    def one(value: Any) -> str:
        return json.dumps(value, separators=(",", ":"))

    def entry(key: str, value: Any) -> str:
        if isinstance(value, dict) and value:
            inner = ",\n".join(f"  {one(k)}: {one(v)}" for k, v in value.items())
            return f" {one(key)}: {{\n{inner}\n }}"
        if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            inner = ",\n".join(f"  {one(v)}" for v in value)
            return f" {one(key)}: [\n{inner}\n ]"
        return f" {one(key)}: {one(value)}"

    rounded = _rounded(report)
    text = "{\n" + ",\n".join(entry(k, v) for k, v in rounded.items()) + "\n}\n"
    if json.loads(text) != rounded:  # what we write must read back as it was
        raise AssertionError(f"{path}: the compact JSON does not read back")
    path.write_text(text)


def _drop_caches_note(args: argparse.Namespace) -> str:
    if args.drop_caches:
        return "asked: sync; echo 3 > /proc/sys/vm/drop_caches before each cold run"
    return (
        "not used: cold runs evict only their input files (posix_fadvise DONTNEED), so that other "
        "processes on this shared machine keep their cache; --drop-caches drops everything (root)"
    )


if __name__ == "__main__":
    sys.exit(main())
