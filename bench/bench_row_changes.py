"""Row changes end to end: the watcher beside the change feed read alone and beside raw confluent-kafka.

One table (built once under ``bench/.data/row-changes``, delta-rs, change data feed on): version 0
inserts ``--rows`` rows, version 1 updates every one of them (``n = n + 1``; delta-rs writes change
data files with the pre- and post-images). With ``key_columns: [id]`` the watcher publishes
``--rows`` ``c`` events and ``--rows`` ``u`` events (plus BEGIN/END per version on the
transaction topic): both encoder paths, the pairing pass included.

Three contenders, each in a fresh process (``harness.child_main``), interleaved, the order turning
by one each round:

- ``watch``: a :class:`WatchService` mirrors the table from version 0 with row changes on (default
  settings, fresh topics). Timed from the moment the table's producer is ready (topics created,
  ``init_transactions`` done, progress read) until the transaction holding version 1 has committed
  (the watcher's ``published_version`` hook): from then on every record is visible to a
  ``read_committed`` consumer, which then reads both topics back and must count every record once.
- ``feed``: ``read_changes(open_table(path), 0, 1)``, every batch consumed (no encoding, no Kafka).
- ``raw``: bare confluent-kafka with deltamirror's own ``producer_config``, producing the same
  records (the bytes the set-up's untimed watcher run published, read back read_committed: keys,
  values, timestamps, streamed from a file) to topics made by the same ``TopicManager`` call,
  transactional, committing at the watcher's default ``txn_max_records``/``txn_max_bytes`` bounds,
  ``produce`` called positionally in 1000-record batches. Warmed up (one record) before the clock.

- ``spark_job`` (with ``--spark``): the job a user would write instead, on the same table from the
  same version: ``readStream.format("delta").option("readChangeFeed", "true")`` ->
  ``to_json(struct(*))`` keyed by ``id`` -> ``writeStream.format("kafka")``, ``Trigger.AvailableNow``,
  in its own local[2] SparkSession (bench_spark's). Timed from ``start()`` to ``awaitTermination()``
  returning; CPU is the JVM's over that interval, memory the JVM's peak plus its Python driver's.
  It writes every change-feed row (``3 * --rows``: inserts, then pre- and post-images, unpaired);
  the read-back must count them all.

Row changes/s is the same figure for every contender: ``2 * --rows`` (rows inserted plus rows
updated) over its timed seconds. Ratios are per round (same run, same table): watch/feed = feed seconds / watch seconds, watch/raw =
raw seconds / watch seconds, watch/spark_job = Spark seconds / watch seconds (above 1: the
watcher mirrors the same versions faster), with CPU and peak memory as watcher / Spark job; their median, quartiles and range are reported with the load average.

Memory: the peak RSS (``VmHWM``) of a watcher process publishing only version 1 (the update
version) of the table above and of a second table with ``--mem-rows`` rows updated in one version.

The memory runs set ``transaction.timeout.ms`` to 15 min, a margin for a loaded machine (the
pairing pass of a version with over 8 MiB of change data runs with no record pending, so the
default 60 s is not what bounds it). delta-rs writes all post-images of the update before its
pre-images, so every image must wait for its partner: the pairing keeps them within
``row_changes.pairing_memory_mb`` (default 256) and spills the rest to temporary Arrow files, and
the peak RSS should stay flat from 1M to 5M updated rows.

    python bench/bench_row_changes.py [--rows 1000000] [--mem-rows 5000000] [--rounds 5]
                                      [--only throughput|memory] [--bootstrap HOST:PORT] [--quick]
                                      [--spark]

Results: bench/results/row-changes.json. Exit code 1 when a read-back found a record missing or
duplicated.
"""

from __future__ import annotations

import argparse
import json
import marshal
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import harness  # noqa: E402  (bench/ is not a package)

DATA = BENCH / ".data" / "row-changes"
RESULT = BENCH / "results" / "row-changes.json"
CONTENDERS = ("watch", "feed", "raw")
SPARK = "spark_job"
RAW_BATCH = 1000
MEMORY_TXN_TIMEOUT_MS = 900_000


# --- the tables -------------------------------------------------------------------------------------------


def build_table(path: Path, rows: int) -> dict[str, Any]:
    """Version 0 inserts ``rows`` rows (one writer call), version 1 updates every one of them."""
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    done = path / "_built.json"
    if done.is_file():
        info: dict[str, Any] = json.loads(done.read_text())
        if info.get("rows") == rows:
            return info
    if path.exists():
        shutil.rmtree(path)
    t0 = time.perf_counter()

    def batches() -> Any:
        step = 500_000
        for lo in range(0, rows, step):
            n = min(step, rows - lo)
            yield pa.record_batch(
                {
                    "id": pa.array(range(lo, lo + n), pa.int64()),
                    "val": pa.array([f"value-{i}" for i in range(lo, lo + n)]),
                    "n": pa.array([i % 1000 for i in range(lo, lo + n)], pa.int64()),
                    "ts": pa.array(
                        [1_700_000_000_000_000 + i for i in range(lo, lo + n)], pa.timestamp("us", tz="UTC")
                    ),
                }
            )

    first = next(iter(batches()))
    reader = pa.RecordBatchReader.from_batches(first.schema, batches())
    write_deltalake(str(path), reader, configuration={"delta.enableChangeDataFeed": "true"})
    table = DeltaTable(str(path))
    table.update(updates={"n": "n + 1"})
    info = {
        "path": str(path),
        "rows": rows,
        "update_version": table.version(),
        "build_s": time.perf_counter() - t0,
    }
    done.write_text(json.dumps(info))
    return info


# --- contenders (each in a fresh process) -----------------------------------------------------------------


def _names() -> dict[str, str]:
    name = f"dmbench-rows-{uuid.uuid4().hex[:10]}"
    return {k: f"{name}.{k}" for k in ("actions", "commits", "changes", "transaction", "progress")} | {
        "prefix": name
    }


def _delete_topics(bootstrap: str, topics: list[str]) -> None:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.delete_topics(topics, operation_timeout=30).values():
        try:
            future.result(timeout=30)
        except Exception as exc:  # a topic never created: nothing to free
            print(f"  (could not delete a topic: {exc})", file=sys.stderr)


def _read_back(bootstrap: str, topic: str, sink: Any = None, idle_s: float = 5.0) -> int:
    """Records of a single-partition topic, read_committed, until 5 s of silence; each to ``sink``."""

    consumer = harness.committed_reader(bootstrap, topic)
    n = 0
    last_new = time.monotonic()
    try:
        while time.monotonic() - last_new < idle_s:
            msgs = [m for m in consumer.consume(10_000, timeout=0.5) if m.error() is None]
            if msgs:
                last_new = time.monotonic()
                n += len(msgs)
                if sink is not None:
                    sink([(m.key(), m.value(), m.timestamp()[1], m.headers()) for m in msgs])
    finally:
        consumer.close()
    return n


def _watch(
    bootstrap: str,
    path: str,
    from_version: int,
    last_version: int,
    clock: Any,
    kafka_extra: dict[str, str] | None = None,
) -> dict[str, Any]:
    from bench_producer import BenchMetrics, _TimedEvent

    from deltamirror.mirror import KafkaSettings
    from deltamirror.producer import TableConfig, WatchConfig
    from deltamirror.producer.service import WatchService
    from deltamirror.producer.settings import RowChangesConfig

    names = _names()
    cfg = WatchConfig(
        kafka=KafkaSettings(bootstrap_servers=bootstrap, extra=dict(kafka_extra or {})),
        tables=[
            TableConfig(
                uri=path,
                snapshot_mode="from-version",
                from_version=from_version,
                actions_topic=names["actions"],
                commits_topic=names["commits"],
                changes_topic=names["changes"],
                transaction_topic=names["transaction"],
                row_changes=RowChangesConfig(key_columns=["id"]),
            )
        ],
        progress_topic=names["progress"],
        transactional_id_prefix=names["prefix"],
    )
    clock.imported()
    metrics = BenchMetrics(target_version=last_version)
    service = WatchService(cfg, metrics=metrics)
    ready = _TimedEvent(None)
    service.pipelines[0].ready = ready
    harness.run_watch_until(service, metrics.done, timeout_s=1800)
    assert ready.at is not None and metrics.done_at is not None
    clock.mark("start", perf=ready.at, cpu=ready.cpu)
    clock.mark("stop", perf=metrics.done_at, cpu=metrics.done_cpu)
    return {
        "seconds": metrics.done_at - ready.at,
        "cpu_s": (metrics.done_cpu or 0) - (ready.cpu or 0),
        "transactions": metrics.transactions,
        "aborts": metrics.aborts,
        "errors": metrics.errors,
        "topics": names,
    }


def watch(clock: Any, params: dict[str, Any]) -> dict[str, Any]:
    """Timed: producer ready -> the transaction holding the last version committed."""
    bootstrap = params["bootstrap"]
    out = _watch(
        bootstrap,
        params["path"],
        params.get("from_version", 0),
        params["last_version"],
        clock,
        params.get("kafka_extra"),
    )
    names = out.pop("topics")
    peak = harness.peak_rss_mb()
    records_file = params.get("save_records")
    if records_file:  # the set-up run: keep the bytes for the raw peer
        with open(records_file, "wb") as fh:
            for topic in ("changes", "transaction"):

                def sink(chunk: list[Any], kind: str = topic) -> None:
                    marshal.dump((kind, chunk), fh)

                out[f"{topic}_records"] = _read_back(bootstrap, names[topic], sink)
    else:
        out["changes_records"] = _read_back(bootstrap, names["changes"])
        out["transaction_records"] = _read_back(bootstrap, names["transaction"])
    _delete_topics(bootstrap, [v for k, v in names.items() if k != "prefix"])
    out["watcher_peak_rss_mb"] = peak
    return out


def feed(clock: Any, params: dict[str, Any]) -> dict[str, Any]:
    """Timed: ``read_changes(open_table(path), 0, last)``, every batch consumed."""
    from deltamirror.core import open_table
    from deltamirror.core.changes import read_changes

    clock.imported()
    clock.start()
    stream = read_changes(
        open_table(params["path"]),
        starting_version=params.get("from_version", 0),
        ending_version=params["last_version"],
    )
    rows = sum(b.num_rows for b in stream)
    clock.stop()
    return {"change_feed_rows": rows}


def _jvm_cpu_s(pid: int) -> float:
    """CPU seconds (user + system, every thread) of another process, from ``/proc/<pid>/stat``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def spark_job(clock: Any, params: dict[str, Any]) -> dict[str, Any]:
    """Timed: the Spark job a user would write instead, from ``start()`` to ``awaitTermination()``:
    ``readStream.format("delta").option("readChangeFeed", "true")`` from the same version, every
    change row as ``to_json(struct(*))`` keyed by ``id``, ``writeStream.format("kafka")`` with
    ``Trigger.AvailableNow`` (Spark's Kafka sink: idempotent, not transactional). Its CPU is the
    JVM's over the interval; its memory the JVM's peak plus this driver's."""
    from bench_spark import _jvm_peak_mb, _session
    from pyspark.sql import functions as F

    from deltamirror.mirror.topics import TopicManager

    work_dir = tempfile.mkdtemp(prefix="dmbench-rows-spark-")
    names = _names()
    TopicManager({"bootstrap.servers": params["bootstrap"]}, max_record_bytes=1_000_000).ensure_event_topic(
        names["changes"], compacted_ok=True
    )
    try:
        spark = _session(work_dir)
        jvm = int(spark.sparkContext._jvm.ProcessHandle.current().pid())
        clock.imported()
        cpu0 = _jvm_cpu_s(jvm)
        clock.start()
        changes = (
            spark.readStream.format("delta")
            .option("readChangeFeed", "true")
            .option("startingVersion", str(params.get("from_version", 0)))
            .load(params["path"])
        )
        query = (
            changes.select(
                F.col("id").cast("string").alias("key"), F.to_json(F.struct(*changes.columns)).alias("value")
            )
            .writeStream.format("kafka")
            .option("kafka.bootstrap.servers", params["bootstrap"])
            .option("topic", names["changes"])
            .option("checkpointLocation", str(Path(work_dir) / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        clock.stop()
        cpu = _jvm_cpu_s(jvm) - cpu0
        if query.exception() is not None:
            raise SystemExit(f"the query failed: {query.exception()}")
        jvm_peak = _jvm_peak_mb(spark)
        spark.stop()
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    records = _read_back(params["bootstrap"], names["changes"])
    _delete_topics(params["bootstrap"], [names["changes"]])
    return {
        "changes_records": records,
        "jvm_cpu_s": cpu,
        "jvm_peak_rss_mb": jvm_peak,
        "peak_rss_mb_with_driver": jvm_peak + harness.peak_rss_mb(),
    }


def raw(clock: Any, params: dict[str, Any]) -> dict[str, Any]:
    """Timed: the saved records produced transactionally by bare confluent-kafka (watcher's bounds)."""
    from confluent_kafka import Producer

    from deltamirror.mirror.kafka.producer import producer_config
    from deltamirror.mirror.topics import TopicManager
    from deltamirror.producer.settings import WatchConfig

    clock.imported()
    bootstrap = params["bootstrap"]
    names = _names()
    kafka = {"bootstrap.servers": bootstrap}
    manager = TopicManager(kafka, max_record_bytes=1_000_000)
    topics = {k: names[k] for k in ("changes", "transaction")}
    for name in topics.values():
        manager.ensure_event_topic(name, compacted_ok=True)
    conf = producer_config(kafka, f"{names['prefix']}-raw", max_message_bytes=1_000_000)
    errors: list[str] = []

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    conf["on_delivery"] = on_delivery
    producer = Producer(conf)
    producer.init_transactions(60)
    producer.begin_transaction()
    producer.produce(topics["changes"], b"warm-up", b"warm-up")
    producer.produce(topics["transaction"], b"warm-up", b"warm-up")
    producer.commit_transaction(60)
    fields = WatchConfig.model_fields
    max_records = int(fields["txn_max_records"].default)
    max_bytes = int(fields["txn_max_bytes"].default)
    max_ms = int(fields["txn_max_ms"].default)
    produce, poll = producer.produce, producer.poll
    n = transactions = txn_records = txn_bytes = 0
    with open(params["records_file"], "rb") as fh:
        clock.start()
        producer.begin_transaction()
        txn_start = time.monotonic()
        while True:
            try:
                kind, chunk = marshal.load(fh)
            except EOFError:
                break
            topic = topics[kind]
            for lo in range(0, len(chunk), RAW_BATCH):
                part = chunk[lo : lo + RAW_BATCH]
                for key, value, ts, headers in part:
                    while True:
                        try:
                            produce(topic, value, key, -1, None, None, ts, headers)
                            break
                        except BufferError:
                            poll(0.05)
                    if value is not None:
                        txn_bytes += len(value)
                n += len(part)
                txn_records += len(part)
                poll(0)
                if (
                    txn_records >= max_records
                    or txn_bytes >= max_bytes
                    or (time.monotonic() - txn_start) * 1000 >= max_ms
                ):
                    producer.commit_transaction(60)
                    transactions += 1
                    producer.begin_transaction()
                    txn_records = txn_bytes = 0
                    txn_start = time.monotonic()
        producer.commit_transaction(60)
        transactions += 1
        clock.stop()
    _delete_topics(bootstrap, list(topics.values()))
    return {"records": n, "transactions": transactions, "delivery_errors": errors[:5]}


# --- parent -----------------------------------------------------------------------------------------------


def spawn(function: str, params: dict[str, Any], log_dir: Path, label: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="dmbench-rows-") as tmp:
        pf, rf = Path(tmp) / "p.json", Path(tmp) / "r.json"
        pf.write_text(json.dumps(params))
        log = log_dir / f"{label}.log"
        with open(log, "w") as out:
            proc = subprocess.run(
                [sys.executable, str(Path(__file__)), "--child", function, str(pf), str(rf)],
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=str(harness.REPO),
                timeout=3600,
            )
        if proc.returncode != 0 or not rf.is_file():
            tail = " | ".join(log.read_text(errors="replace").strip().splitlines()[-6:])
            raise SystemExit(f"{label} failed ({proc.returncode}): {tail}")
        result: dict[str, Any] = json.loads(rf.read_text())
    marks = result["marks"]
    result["seconds"] = marks["stop"]["perf"] - marks["start"]["perf"]
    result["cpu_s"] = marks["stop"]["cpu"] - marks["start"]["cpu"]
    return result


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        return harness.child_main("bench_row_changes", sys.argv[2], sys.argv[3], sys.argv[4])
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--mem-rows", type=int, default=5_000_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS"))
    parser.add_argument(
        "--port", type=int, default=19392, help="the bench's own local broker (no --bootstrap)"
    )
    parser.add_argument("--keep-broker", action="store_true", help="leave a broker started here running")
    parser.add_argument("--only", choices=("throughput", "memory"), help="one of the two measurements")
    parser.add_argument(
        "--spark",
        action="store_true",
        help="add the Spark job a user would write instead (delta CDF stream -> to_json -> Kafka sink)",
    )
    parser.add_argument("--quick", action="store_true", help="10,000 rows, 2 rounds, memory at 20,000 rows")
    parser.add_argument("--output", type=Path, default=RESULT)
    args = parser.parse_args()
    if args.quick:
        args.rows, args.mem_rows, args.rounds = 10_000, 20_000, 2
    load_before = harness.load_average()
    started = time.time()
    local = None
    started_here = False
    bootstrap = args.bootstrap
    if not bootstrap:
        from deltamirror.devkafka.broker import LocalKafka

        local = LocalKafka(port=args.port, data_dir=Path("/tmp/dm-bench-rows-kafka"))
        started_here = not local.status()["running"]
        bootstrap = local.start()
    log_dir = DATA / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    table = build_table(DATA / f"table-{args.rows}", args.rows)
    print(f"table: {table}", file=sys.stderr)
    records_file = DATA / f"records-{args.rows}.marshal"
    base = {"bootstrap": bootstrap, "path": table["path"], "last_version": 1}
    events = 2 * args.rows
    spark_records = 3 * args.rows  # the change feed's rows: inserts, then pre- and post-images
    failures: list[str] = []
    if args.only != "memory":
        setup = spawn("watch", base | {"save_records": str(records_file)}, log_dir, "setup")
        expected = setup["facts"]["changes_records"]
        if expected != events or setup["facts"]["transaction_records"] != 4:
            failures.append(f"set-up read back {expected} change records (expected {events})")
    contenders = (*CONTENDERS, SPARK) if args.spark else CONTENDERS
    runs: dict[str, list[dict[str, Any]]] = {c: [] for c in contenders}
    ratios: dict[str, list[float]] = {"watch/feed": [], "watch/raw": []}
    if args.spark:  # throughput (its time / ours), CPU and memory (ours / its) against the Spark job
        ratios |= {"watch/spark_job": [], "cpu watch/spark_job": [], "memory watch/spark_job": []}
    loads: list[list[float]] = []
    memory: dict[str, Any] = {}

    def write_report() -> dict[str, Any]:
        def per_s(name: str) -> dict[str, Any]:
            return harness.spread([x["row_changes_per_s"] for x in runs[name]])

        report = {
            "what": "row changes (1 insert version + 1 update version, key id) end to end, beside the change "
            "feed read alone and raw confluent-kafka transactional produce of the same records",
            "command": " ".join(["python", "bench/bench_row_changes.py", *sys.argv[1:]]),
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
            "machine": harness.machine(),
            "load_before": load_before,
            "load_per_round": loads,
            "rows": args.rows,
            "row_changes": events,
            "change_feed_rows": runs["feed"][0]["facts"]["change_feed_rows"] if runs["feed"] else None,
            "rounds": args.rounds,
            "row_changes_per_s": {name: per_s(name) for name in contenders if runs[name]},
            "ratios": {k: harness.spread(v) for k, v in ratios.items() if v},
            "memory": memory,
            "failures": failures,
            "runs": {
                k: [{kk: vv for kk, vv in x.items() if kk != "facts"} for x in v] for k, v in runs.items()
            },
        }
        args.output.write_text(json.dumps(report, indent=1) + "\n")
        return report

    for r in range(args.rounds if args.only != "memory" else 0):
        turn = r % len(contenders)
        order = contenders[turn:] + contenders[:turn]
        seconds: dict[str, float] = {}
        for name in order:
            params = base | ({"records_file": str(records_file)} if name == "raw" else {})
            res = spawn(name, params, log_dir, f"{name}-{r}")
            facts = res["facts"]
            if name == "watch" and (facts["changes_records"] != events or facts["transaction_records"] != 4):
                failures.append(f"round {r}: read back {facts['changes_records']} change records")
            if name == SPARK and facts["changes_records"] != spark_records:
                failures.append(f"round {r}: the Spark job wrote {facts['changes_records']} records")
            seconds[name] = res["seconds"]
            runs[name].append(
                {
                    "seconds": res["seconds"],
                    "cpu_s": res["cpu_s"],
                    "row_changes_per_s": events / res["seconds"],
                    "peak_rss_mb": res["peak_rss_mb"],
                    # the Spark job's own memory is its JVM's (plus this driver's), the watcher's its process's
                    **{
                        k: facts[k]
                        for k in ("peak_rss_mb_with_driver", "jvm_cpu_s", "watcher_peak_rss_mb")
                        if k in facts
                    },
                    "facts": facts,
                }
            )
        loads.append(harness.load_average())
        ratios["watch/feed"].append(seconds["feed"] / seconds["watch"])
        ratios["watch/raw"].append(seconds["raw"] / seconds["watch"])
        if args.spark:
            ours, theirs = runs["watch"][-1], runs[SPARK][-1]
            ratios["watch/spark_job"].append(seconds[SPARK] / seconds["watch"])
            ratios["cpu watch/spark_job"].append(ours["cpu_s"] / theirs["facts"]["jvm_cpu_s"])
            ratios["memory watch/spark_job"].append(
                ours["facts"]["watcher_peak_rss_mb"] / theirs["facts"]["peak_rss_mb_with_driver"]
            )
        print(
            f"round {r}: "
            + ", ".join(f"{k} {events / v:,.0f} row changes/s" for k, v in seconds.items())
            + f"; load {loads[-1]}",
            file=sys.stderr,
        )
        write_report()  # every round's figures, kept if a later round does not finish
    write_report()  # the throughput figures, kept even if the memory runs do not finish
    if args.only != "throughput":
        mem_table = build_table(DATA / f"update-{args.mem_rows}", args.mem_rows)
        for label, info, version in (
            (str(args.mem_rows), mem_table, mem_table["update_version"]),
            (str(args.rows), table, 1),
        ):
            res = spawn(
                "watch",
                {
                    "bootstrap": bootstrap,
                    "path": info["path"],
                    "from_version": version,
                    "last_version": version,
                    # the pairing pass of a big version runs inside an open transaction: the
                    # default 60 s timeout fences the watcher on a loaded machine
                    "kafka_extra": {"transaction.timeout.ms": str(MEMORY_TXN_TIMEOUT_MS)},
                },
                log_dir,
                f"memory-{label}",
            )
            rows = int(label)
            if res["facts"]["changes_records"] != rows:
                failures.append(f"memory run {label}: read back {res['facts']['changes_records']} records")
            memory[label] = {
                "updated_rows": rows,
                "peak_rss_mb": res["facts"]["watcher_peak_rss_mb"],
                "rss_after_imports_mb": res["marks"]["imported"]["rss_mb"],
                "seconds": res["seconds"],
                "row_changes_per_s": rows / res["seconds"],
                "load": harness.load_average(),
            }
            print(f"memory {label}: {memory[label]}", file=sys.stderr)
            write_report()
    if local is not None and started_here and not args.keep_broker:
        local.stop()

    report = write_report()
    print(json.dumps({k: report[k] for k in ("row_changes_per_s", "ratios", "memory", "failures")}, indent=1))
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
