"""The watcher against a real broker: throughput beside bare confluent-kafka, and commit-to-consumer latency.

Three measurements in one run, against one broker:

1. **Throughput.** A generated table (``--versions`` commits holding ``--actions`` add actions in
   all, Databricks-like paths, stats and tags; cached under ``bench/.data/producer``) is mirrored
   from version 0 (``snapshot_mode: from-version``, ``from_version: 0``) into fresh topics by a
   :class:`WatchService` in this process, with the default watcher settings. The clock runs from
   the moment the table's producer is ready (topics created, ``init_transactions`` done, progress
   read: the same setup the raw peers get for free) until the transaction holding the last version
   has committed, as the watcher reports it through its metrics hook (``published_version``);
   the time from ``start()`` is reported too. Then a ``read_committed`` consumer reads the actions
   topic back and must find exactly the values ``deltamirror events`` would print, in order, once.
2. **The peer ceiling.** The same values (taken from ``iter_event_values``, the encoder the
   watcher uses), with the same key, headers and timestamps, produced by a bare confluent-kafka
   ``Producer`` built from deltamirror's own ``producer_config`` (idempotent, acks=all, lz4,
   linger 50 ms): once transactional, committing as often as the watcher did in the run just
   before (its records per transaction, rounded up to whole 1000-record batches; the watcher's
   ``txn_max_bytes``/``txn_max_ms`` bounds apply too, checked every 1000 records as the watcher
   does), once idempotent without transactions (flush at the end). Both are warmed up first (one
   record) so that producer id, connection and metadata are not timed, and both call ``produce``
   with positional arguments, as the watcher does (its fastest form: keywords cost ~20% of a
   call). Reported as records/s and as the ratio deltamirror / raw, also per round (each round's
   ratio, then their median, IQR and range); the goal is at least 0.9 against the
   transactional peer.
   The time to read and encode the table without Kafka (``iter_event_values``) is reported too:
   it is the part of the watcher's work that the peers do not do.
3. **Latency.** The watcher tails an idle table while ``--commits`` small commits (a commitInfo
   and two adds) are written every ~200 ms (uniform 150-250 ms, seeded, so commit times are not
   phase-locked to the poll loop), atomically (temp file in ``_delta_log``, then rename to
   ``NNN.json``). A ``read_committed`` consumer in a separate process stamps the wall time at
   which a version's last record arrives; latency = that time minus the time just before the
   rename. Run twice: inotify notifications off (the poll interval alone, default 1 s) and on.
   Percentiles are nearest-rank. The goal is p99 <= poll interval + 50 ms. The time at which the
   watcher's transaction committed is reported too, splitting detect+publish from broker+consumer.
   The consumer uses ``poll()``: ``consume(n, timeout)`` waits for n records or the whole timeout,
   which once added ~50 ms to every sample here.

After one untimed warm-up round of the raw transactional peer (a fresh broker is a cold JVM),
each throughput contender runs ``--reps`` times, interleaved (deltamirror, raw transactional, raw
idempotent, the order turning by one each round) so background load hits them alike; medians are reported, with process CPU seconds
(this process, all threads, librdkafka's included) and, when the bench runs its own broker, the
broker's CPU seconds. The machine has 2 cores shared by the broker, the watcher and whatever else
runs: load averages before and after are recorded, with the busiest other processes at the start
and at the end (CPU over one second).

Broker: ``--bootstrap`` or ``$KAFKA_BOOTSTRAP_SERVERS``; otherwise a local broker on
``--port`` (default 19092) with data in ``--kafka-data-dir`` (default /tmp/dm-bench-kafka), as
``deltamirror local kafka start`` runs it. A broker started by the bench is stopped at the end
(``--keep-broker`` keeps it); one already running is left as it was. Topics are deleted after use.

Results: a markdown table on stdout and bench/results/producer.json. Exit code 1 when records
were lost, duplicated or reordered, or the watcher reported an error.

    python bench/bench_producer.py [--actions 200000] [--versions 200] [--commits 100] [--reps 3]
                                   [--quick] [--only throughput|latency] [--bootstrap HOST:PORT]
                                   [--port 19092] [--kafka-data-dir DIR] [--keep-broker]

``--quick``: 20,000 actions in 20 versions, 20 commits, 1 rep (a smoke run of a minute or so).
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import math
import os
import platform
import random
import resource
import shutil
import statistics
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
DATA = BENCH / ".data" / "producer"
RESULTS = BENCH / "results" / "producer.json"
DEFAULT_PORT = 19092
DEFAULT_KAFKA_DATA = Path("/tmp/dm-bench-kafka")
RAW_BATCH = 1000  # the watcher's batch size: bounds checked and poll(0) called this often

# --- the generated table ------------------------------------------------------------------------------

_COLUMNS = (
    ("id", "long"),
    ("customer_id", "long"),
    ("event_time", "timestamp"),
    ("amount", "double"),
    ("currency", "string"),
    ("country", "string"),
    ("status", "string"),
    ("date", "date"),
)
SCHEMA_STRING = json.dumps(
    {
        "type": "struct",
        "fields": [{"name": n, "type": t, "nullable": n != "id", "metadata": {}} for n, t in _COLUMNS],
    },
    separators=(",", ":"),
)
_EPOCH_MS = 1_704_067_200_000  # 2024-01-01
_CURRENCIES = ("AUD", "BRL", "CAD", "CHF", "EUR", "GBP", "JPY", "USD")
_COUNTRIES = ("AR", "AU", "BR", "CA", "CH", "DE", "FR", "GB", "JP", "US")
_STATUSES = ("cancelled", "failed", "paid", "pending", "refunded", "shipped")


_DAYS = [time.strftime("%Y-%m-%d", time.gmtime(_EPOCH_MS // 1000 + d * 86_400)) for d in range(400)]


def _iso(ms: int) -> str:
    """ISO-8601 UTC with milliseconds, by arithmetic (strftime per call made the generator slow)."""
    day, ms_of_day = divmod(ms - _EPOCH_MS, 86_400_000)
    seconds, milli = divmod(ms_of_day, 1000)
    hours, rest = divmod(seconds, 3600)
    return f"{_DAYS[day]}T{hours:02d}:{rest // 60:02d}:{rest % 60:02d}.{milli:03d}Z"


def _add_line(version: int, i: int, prefix: str = "part") -> str:
    """One add action as Spark on Databricks writes it: a partition path, stats as a JSON string, tags."""
    h = (version * 1_000_003 + i) * 2_654_435_761 % 2**32
    day = (version + i) % 60
    date = _DAYS[day]
    rows = 40_000 + h % 20_000
    first_id = (version * 100_000 + i) * 100_000
    t0 = _EPOCH_MS + day * 86_400_000 + h % 3_600_000
    t1 = t0 + 80_000_000 + h % 6_000_000
    c0, c1 = _CURRENCIES[h % 3], _CURRENCIES[5 + h % 3]
    n0, n1 = _COUNTRIES[h % 4], _COUNTRIES[6 + h % 4]
    s0, s1 = _STATUSES[h % 2], _STATUSES[3 + h % 3]
    stats = (
        f'{{"numRecords":{rows},"minValues":{{"id":{first_id},"customer_id":{h % 1000},'
        f'"event_time":"{_iso(t0)}","amount":0.{h % 97:02d},"currency":"{c0}","country":"{n0}",'
        f'"status":"{s0}"}},"maxValues":{{"id":{first_id + rows - 1},"customer_id":{9_000_000 + h % 999_999},'
        f'"event_time":"{_iso(t1)}","amount":{9000 + h % 1000}.{h % 89:02d},"currency":"{c1}",'
        f'"country":"{n1}","status":"{s1}"}},"nullCount":{{"id":0,"customer_id":{h % 7},"event_time":0,'
        f'"amount":{h % 13},"currency":0,"country":{h % 3},"status":0}},"tightBounds":true}}'
    ).replace('"', '\\"')
    ins = (_EPOCH_MS + version * 3_600_000 + i) * 1000
    return (
        f'{{"add":{{"path":"date={date}/{prefix}-{i % 200:05d}-{h:08x}-{version:04x}-{i:04x}-'
        f'{h * 7919 % 2**48:012x}.c000.snappy.parquet","partitionValues":{{"date":"{date}"}},'
        f'"size":{100_000_000 + h % 50_000_000},"modificationTime":{_EPOCH_MS + version * 60_000},'
        f'"dataChange":true,"stats":"{stats}","tags":{{"INSERTION_TIME":"{ins}",'
        f'"MIN_INSERTION_TIME":"{ins}","MAX_INSERTION_TIME":"{ins}","OPTIMIZE_TARGET_SIZE":"268435456"}}}}}}'
    )


def _commit_info_line(version: int, adds: int) -> str:
    info = {
        "commitInfo": {
            "timestamp": _EPOCH_MS + version * 60_000,
            "operation": "WRITE",
            "operationParameters": {"mode": "Append", "partitionBy": '["date"]'},
            "readVersion": version - 1,
            "isolationLevel": "WriteSerializable",
            "isBlindAppend": True,
            "operationMetrics": {"numFiles": str(adds), "numOutputRows": str(adds * 50_000)},
            "engineInfo": "Apache-Spark/3.5.0 Delta-Lake/3.1.0",
            "txnId": str(uuid.UUID(int=version + 1)),
        }
    }
    return json.dumps(info, separators=(",", ":"))


def _version0_lines(table_id: str) -> list[str]:
    return [
        json.dumps({"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}}, separators=(",", ":")),
        json.dumps(
            {
                "metaData": {
                    "id": table_id,
                    "format": {"provider": "parquet", "options": {}},
                    "schemaString": SCHEMA_STRING,
                    "partitionColumns": ["date"],
                    "configuration": {},
                    "createdTime": _EPOCH_MS,
                }
            },
            separators=(",", ":"),
        ),
        json.dumps(
            {"commitInfo": {"timestamp": _EPOCH_MS, "operation": "CREATE TABLE", "isBlindAppend": True}},
            separators=(",", ":"),
        ),
    ]


def write_commit(log: Path, version: int, lines: list[str]) -> float:
    """Write ``NNN.json`` atomically (temp file beside it, then rename); the wall time just before the rename."""
    tmp = log / f".{version:020d}.json.{uuid.uuid4().hex[:8]}.tmp"
    with open(tmp, "w") as fh:
        fh.write("\n".join(lines))
        fh.write("\n")
    created = time.time()
    os.rename(tmp, log / f"{version:020d}.json")
    return created


def ensure_table(actions: int, versions: int, data_dir: Path) -> dict[str, Any]:
    """The throughput table (made once, checked by delta-rs, then cached): version 0 + ``versions`` appends."""
    per_version = max(1, math.ceil(actions / versions))
    root = data_dir / f"table-{versions}x{per_version}"
    manifest_file = root / "bench-manifest.json"
    if manifest_file.is_file():
        manifest: dict[str, Any] = json.loads(manifest_file.read_text())
        return manifest
    shutil.rmtree(root, ignore_errors=True)
    log = root / "_delta_log"
    log.mkdir(parents=True)
    t0 = time.perf_counter()
    write_commit(log, 0, _version0_lines(str(uuid.UUID(int=versions * 1_000_000 + per_version))))
    for v in range(1, versions + 1):
        write_commit(
            log, v, [_commit_info_line(v, per_version), *(_add_line(v, i) for i in range(per_version))]
        )
    generated_s = time.perf_counter() - t0
    from deltalake import DeltaTable  # the oracle: the generated log is a valid table

    dt = DeltaTable(str(root))
    active = dt.get_add_actions().num_rows
    if dt.version() != versions or active != versions * per_version:
        raise SystemExit(f"generated table is wrong: delta-rs sees v{dt.version()} with {active} files")
    size = sum(f.stat().st_size for f in log.glob("*.json"))
    manifest = {
        "root": str(root),
        "versions": versions + 1,
        "adds": versions * per_version,
        "adds_per_version": per_version,
        "actions": 3 + versions * (per_version + 1),
        "log_bytes": size,
        "generated_s": round(generated_s, 3),
    }
    manifest_file.write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


# --- measuring helpers ---------------------------------------------------------------------------------


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _proc_cpu_s(pid: int | None) -> float | None:
    """CPU seconds of another process (the broker), from /proc."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


class _TimedEvent(threading.Event):
    """The pipeline's ``ready`` event, remembering when (and at what CPU times) it was set."""

    def __init__(self, broker_pid: int | None = None) -> None:
        super().__init__()
        self.broker_pid = broker_pid
        self.at: float | None = None
        self.cpu: float | None = None
        self.broker_cpu: float | None = None

    def set(self) -> None:
        if self.at is None:
            self.at = time.perf_counter()
            self.cpu = _cpu_s()
            self.broker_cpu = _proc_cpu_s(self.broker_pid)
        super().set()


class BenchMetrics:
    """The watcher's real metrics, plus what the bench needs: when each version's transaction committed."""

    def __init__(self, target_version: int, broker_pid: int | None = None) -> None:
        from deltamirror.producer.metrics import WatcherMetrics

        self._inner = WatcherMetrics()
        self.target_version = target_version
        self.broker_pid = broker_pid
        self.done_broker_cpu: float | None = None
        self.published_wall: dict[int, float] = {}
        self.done = threading.Event()
        self.done_at: float | None = None
        self.done_cpu: float | None = None
        self.transactions = 0
        self.aborts = 0
        self.events = 0
        self.errors: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def published_version(self, table: str, version: int, commit_ts_ms: int) -> None:
        self._inner.published_version(table, version, commit_ts_ms)
        self.published_wall[version] = time.time()
        if version >= self.target_version and self.done_at is None:
            self.done_at = time.perf_counter()
            self.done_cpu = _cpu_s()
            self.done_broker_cpu = _proc_cpu_s(self.broker_pid)
            self.done.set()

    def transaction_committed(self, table: str) -> None:
        self._inner.transaction_committed(table)
        self.transactions += 1

    def transaction_aborted(self, table: str) -> None:
        self._inner.transaction_aborted(table)
        self.aborts += 1

    def event_published(self, table: str, n: int = 1) -> None:
        self._inner.event_published(table, n)
        self.events += n

    def table_error(self, table: str, reason: str) -> None:
        self._inner.table_error(table, reason)
        self.errors.append(reason)


def _names() -> tuple[str, str, str, str]:
    name = f"dmbench-{uuid.uuid4().hex[:10]}"
    return f"{name}.actions", f"{name}.commits", f"{name}.progress", name


def _watch_config(bootstrap: str, table: str, **over: Any) -> tuple[Any, tuple[str, str, str]]:
    from deltamirror.mirror import KafkaSettings
    from deltamirror.producer import TableConfig, WatchConfig

    actions, commits, progress, prefix = _names()
    table_over = {k: over.pop(k) for k in ("poll_interval_s",) if k in over}
    cfg = WatchConfig(
        kafka=KafkaSettings(bootstrap_servers=bootstrap),
        tables=[
            TableConfig(
                uri=table,
                snapshot_mode="from-version",
                from_version=0,
                actions_topic=actions,
                commits_topic=commits,
                **table_over,
            )
        ],
        progress_topic=progress,
        transactional_id_prefix=prefix,
        **over,
    )
    return cfg, (actions, commits, progress)


def _delete_topics(bootstrap: str, topics: list[str]) -> None:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.delete_topics(topics, operation_timeout=30).values():
        try:
            future.result(timeout=30)
        except Exception as exc:  # a topic never created: nothing to free
            print(f"  (could not delete a topic: {exc})", file=sys.stderr)


def _consume_all(bootstrap: str, topic: str, expected: int, timeout_s: float = 120.0) -> list[bytes]:
    """Every value of a single-partition topic, read_committed, until ``expected`` arrived or 5 s of silence."""
    import harness  # bench/ is on the path

    consumer = harness.committed_reader(bootstrap, topic)
    out: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    last_new = time.monotonic()
    try:
        while len(out) < expected and time.monotonic() < deadline and time.monotonic() - last_new < 5:
            for m in consumer.consume(10_000, timeout=0.5):
                if m.error() is None:
                    out.append(m.value() or b"")
                    last_new = time.monotonic()
        for m in consumer.consume(10_000, timeout=1.0):  # anything beyond the expected count is a duplicate
            if m.error() is None:
                out.append(m.value() or b"")
    finally:
        consumer.close()
    return out


Headers = list[tuple[str, str | bytes | None]]

# --- the records every contender publishes ----------------------------------------------------------------


@dataclass
class Workload:
    """The actions topic's records as the watcher publishes them: values, headers, timestamps."""

    key: bytes
    values: list[bytes]
    headers: list[Headers]
    timestamps: list[int]
    sha256: str
    value_bytes: int
    encode_s: float
    encode_cpu_s: float


def load_workload(table: str) -> Workload:
    import orjson

    from deltamirror.producer.publishing.offline_events import iter_event_values

    cpu0, t0 = _cpu_s(), time.perf_counter()
    values = list(iter_event_values(table))
    encode_s, encode_cpu = time.perf_counter() - t0, _cpu_s() - cpu0
    digest = hashlib.sha256()
    headers: list[Headers] = []
    timestamps: list[int] = []
    key = b""
    for value in values:
        digest.update(hashlib.sha256(value).digest())
        event = orjson.loads(value)
        key = event["tableId"].encode()
        headers.append(
            [
                ("version", str(event["version"]).encode()),
                ("index", str(event["index"]).encode()),
                ("type", event["type"].encode()),
            ]
        )
        timestamps.append(event["commitTimestamp"])
    return Workload(
        key, values, headers, timestamps, digest.hexdigest(), sum(map(len, values)), encode_s, encode_cpu
    )


def _digest(values: list[bytes]) -> str:
    digest = hashlib.sha256()
    for value in values:
        digest.update(hashlib.sha256(value).digest())
    return digest.hexdigest()


# --- contenders -------------------------------------------------------------------------------------------


@dataclass
class Expected:
    """What the read-back of the actions topic must find: as many records, with these bytes."""

    records: int
    sha256: str
    value_bytes: int

    @classmethod
    def of(cls, work: Workload) -> Expected:
        return cls(len(work.values), work.sha256, work.value_bytes)


def run_deltamirror(
    bootstrap: str, table: dict[str, Any], work: Expected, broker_pid: int | None, clock: Any = None
) -> dict[str, Any]:
    from deltamirror.producer.service import WatchService

    cfg, (actions, commits, progress) = _watch_config(bootstrap, table["root"])
    metrics = BenchMetrics(target_version=table["versions"] - 1, broker_pid=broker_pid)
    service = WatchService(cfg, metrics=metrics)
    ready = _TimedEvent(broker_pid)
    service.pipelines[0].ready = ready
    import harness  # bench/ is on the path: this script's folder, or bench/run.py's child

    t0 = time.perf_counter()  # the watcher starts in the call below
    stopped = harness.run_watch_until(service, metrics.done, timeout_s=600)
    assert ready.at is not None and ready.cpu is not None
    assert metrics.done_at is not None and metrics.done_cpu is not None
    publish_s = metrics.done_at - ready.at
    if clock is not None:  # bench/run.py's child: the same interval
        clock.mark("start", perf=ready.at, cpu=ready.cpu)
        clock.mark("stop", perf=metrics.done_at, cpu=metrics.done_cpu)
    n = work.records
    got = _consume_all(bootstrap, actions, n)
    exact = len(got) == n and _digest(got) == work.sha256
    _delete_topics(bootstrap, [actions, commits, progress])
    return {
        "records": n,
        "seconds": publish_s,
        "records_per_s": n / publish_s,
        "mb_per_s": work.value_bytes / publish_s / 1e6,
        "seconds_from_start": metrics.done_at - t0,
        "startup_s": ready.at - t0,
        "cpu_s": metrics.done_cpu - ready.cpu,
        "broker_cpu_s": None
        if ready.broker_cpu is None or metrics.done_broker_cpu is None
        else metrics.done_broker_cpu - ready.broker_cpu,
        "transactions": metrics.transactions,
        "records_per_transaction": n / max(1, metrics.transactions),
        "aborts": metrics.aborts,
        "errors": metrics.errors,
        "consumed_read_committed": len(got),
        "exactly_once_in_order": exact,
        "stopped_cleanly": stopped,
    }


def run_raw(
    bootstrap: str,
    work: Workload,
    *,
    transactional: bool,
    bounds: tuple[int, int, int],
    broker_pid: int | None,
    clock: Any = None,
) -> dict[str, Any]:
    """Bare confluent-kafka with deltamirror's producer settings: the ceiling for the watcher."""
    from confluent_kafka import Producer

    from deltamirror.mirror.kafka.producer import producer_config
    from deltamirror.mirror.topics import TopicManager

    topic, _, _, prefix = _names()
    kafka = {"bootstrap.servers": bootstrap}
    TopicManager(kafka, max_record_bytes=1_000_000).ensure_event_topic(topic)  # the watcher's topic settings
    conf = producer_config(kafka, f"{prefix}-raw", max_message_bytes=1_000_000)
    if not transactional:
        del conf["transactional.id"]
    errors: list[str] = []

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    conf["on_delivery"] = on_delivery
    producer = Producer(conf)
    # warm-up outside the clock: producer id, connection, topic metadata (the watcher has them too
    # before its clock starts, except the actions topic's metadata)
    if transactional:
        producer.init_transactions(60)
        producer.begin_transaction()
    producer.produce(topic, b"warm-up", work.key)
    if transactional:
        producer.commit_transaction(60)
    else:
        producer.flush(60)
    max_records, max_bytes, max_ms = bounds
    values, headers, stamps, key = work.values, work.headers, work.timestamps, work.key
    n = len(values)
    transactions = 0
    broker0 = _proc_cpu_s(broker_pid)
    cpu0, t0 = _cpu_s(), time.perf_counter()
    if clock is not None:  # bench/run.py's child: the same interval
        clock.mark("start", perf=t0, cpu=cpu0)
    produce, poll = producer.produce, producer.poll
    if transactional:
        producer.begin_transaction()
    txn_records = txn_bytes = 0
    txn_start = time.monotonic()
    for start in range(0, n, RAW_BATCH):
        end = min(n, start + RAW_BATCH)
        for i in range(start, end):
            value = values[i]
            while True:
                try:
                    # positional, confluent-kafka's fastest form (keywords cost ~20% of a call), as the
                    # watcher calls it: topic, value, key, partition (-1: partitioner), callback,
                    # on_delivery, timestamp, headers
                    produce(topic, value, key, -1, None, None, stamps[i], headers[i])
                    break
                except BufferError:
                    poll(0.05)
            txn_bytes += len(value)
        txn_records += end - start
        poll(0)
        if (
            transactional
            and end < n
            and (
                txn_records >= max_records
                or txn_bytes >= max_bytes
                or (time.monotonic() - txn_start) * 1000 >= max_ms
            )
        ):
            producer.flush(30)
            producer.commit_transaction(60)
            transactions += 1
            producer.begin_transaction()
            txn_records = txn_bytes = 0
            txn_start = time.monotonic()
    if transactional:
        producer.flush(30)
        producer.commit_transaction(60)
        transactions += 1
    else:
        left = producer.flush(60)
        if left:
            errors.append(f"{left} records still queued after flush")
    seconds, cpu = time.perf_counter() - t0, _cpu_s() - cpu0
    if clock is not None:
        clock.mark("stop", perf=t0 + seconds, cpu=cpu0 + cpu)
    broker1 = _proc_cpu_s(broker_pid)
    _delete_topics(bootstrap, [topic])
    return {
        "records": n,
        "seconds": seconds,
        "records_per_s": n / seconds,
        "mb_per_s": work.value_bytes / seconds / 1e6,
        "cpu_s": cpu,
        "broker_cpu_s": None if broker0 is None or broker1 is None else broker1 - broker0,
        "txn_max_records": max_records if transactional else None,
        "transactions": transactions if transactional else None,
        "records_per_transaction": n / transactions if transactional else None,
        "delivery_errors": errors[:5],
    }


def run_naive(bootstrap: str, root: str, broker_pid: int | None, clock: Any = None) -> dict[str, Any]:
    """The mirror a user would write in an afternoon: each commit file read, each line parsed with
    orjson and wrapped in the same envelope, produced with deltamirror's producer settings, one
    transaction per version. No checks of any kind (a line that is not an action goes out as one)."""
    import orjson
    from confluent_kafka import Producer

    from deltamirror.mirror.kafka.producer import producer_config
    from deltamirror.mirror.topics import TopicManager

    topic, _, _, prefix = _names()
    kafka = {"bootstrap.servers": bootstrap}
    TopicManager(kafka, max_record_bytes=1_000_000).ensure_event_topic(topic)
    conf = producer_config(kafka, f"{prefix}-naive", max_message_bytes=1_000_000)
    errors: list[str] = []

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    conf["on_delivery"] = on_delivery
    producer = Producer(conf)
    producer.init_transactions(60)  # warm-up outside the clock, as the raw peers
    producer.begin_transaction()
    producer.produce(topic, b"warm-up", b"warm-up")
    producer.commit_transaction(60)
    log = Path(root) / "_delta_log"
    uri = Path(root).resolve().as_uri()
    broker0 = _proc_cpu_s(broker_pid)
    cpu0, t0 = _cpu_s(), time.perf_counter()
    if clock is not None:
        clock.mark("start", perf=t0, cpu=cpu0)
    commits = sorted(p for p in log.iterdir() if p.suffix == ".json" and p.stem.isdigit())
    produce, poll, dumps, loads = producer.produce, producer.poll, orjson.dumps, orjson.loads
    n = value_bytes = 0
    table_id = ""
    for path in commits:
        version = int(path.stem)
        stamp = int(path.stat().st_mtime * 1000)
        lines = [line for line in path.read_bytes().split(b"\n") if line]
        count = len(lines)
        producer.begin_transaction()
        for index, line in enumerate(lines):
            action = loads(line)
            ((kind, body),) = action.items()
            if kind == "metaData":
                table_id = body["id"]
            value = dumps(
                {
                    "schemaVersion": 1,
                    "tableId": table_id,
                    "tableUri": uri,
                    "version": version,
                    "commitTimestamp": stamp,
                    "commitTimestampSource": "file-time",
                    "count": count,
                    "snapshot": False,
                    "index": index,
                    "type": kind,
                    "action": body,
                }
            )
            headers = [("version", str(version)), ("index", str(index)), ("type", kind)]
            while True:
                try:
                    produce(topic, value, table_id.encode(), -1, None, None, stamp, headers)
                    break
                except BufferError:
                    poll(0.05)
            value_bytes += len(value)
        n += count
        poll(0)
        producer.commit_transaction(60)
    seconds, cpu = time.perf_counter() - t0, _cpu_s() - cpu0
    if clock is not None:
        clock.mark("stop", perf=t0 + seconds, cpu=cpu0 + cpu)
    broker1 = _proc_cpu_s(broker_pid)
    got = _consume_all(bootstrap, topic, n + 1)
    _delete_topics(bootstrap, [topic])
    return {
        "records": n,
        "seconds": seconds,
        "records_per_s": n / seconds,
        "mb_per_s": value_bytes / seconds / 1e6,
        "cpu_s": cpu,
        "broker_cpu_s": None if broker0 is None or broker1 is None else broker1 - broker0,
        "transactions": len(commits),
        "consumed_read_committed": len(got) - 1,  # the warm-up record is not one of them
        "delivery_errors": errors[:5],
    }


# --- contenders: each a function bench/run.py runs in a fresh process (harness.Clock) ----------------------


def _records_file(table: dict[str, Any]) -> Path:
    return Path(table["root"]).with_name(Path(table["root"]).name + ".records.marshal")


def _watcher_bounds() -> tuple[int, int, int]:
    from deltamirror.producer import WatchConfig

    fields = WatchConfig.model_fields  # the watcher's default transaction bounds
    return (
        int(fields["txn_max_records"].default),
        int(fields["txn_max_bytes"].default),
        int(fields["txn_max_ms"].default),
    )


def setup(clock: Any, params: dict[str, Any]) -> dict[str, Any]:
    """The table, its records for the raw peers, and one untimed watcher run (a warm broker).

    The records the watcher publishes (``iter_event_values``, with key, headers and timestamps) are
    written once beside the table (marshal), so that a raw peer reads them instead of encoding
    them. The untimed watcher run gives the watcher's records per transaction, which the
    transactional peer copies (whole 1000-record batches), as ``main`` does.
    """
    import marshal

    clock.start()
    table = ensure_table(params["actions"], params["versions"], Path(params.get("data_dir", DATA)))
    records = _records_file(table)
    if not records.is_file():
        work = load_workload(table["root"])
        tmp = records.with_suffix(".tmp")
        with open(tmp, "wb") as fh:
            marshal.dump(
                (work.key, work.values, work.headers, work.timestamps, work.sha256, work.value_bytes), fh
            )
        tmp.rename(records)
        expected = Expected.of(work)
        del work
    else:
        with open(records, "rb") as fh:
            _, values, _, _, sha256, value_bytes = marshal.load(fh)
        expected = Expected(len(values), sha256, value_bytes)
        del values
    warm = run_deltamirror(params["bootstrap"], table, expected, params.get("broker_pid"))
    if not warm["exactly_once_in_order"]:
        raise SystemExit("the warm-up run of the watcher lost, duplicated or reordered records")
    bounds = _watcher_bounds()
    matched = min(bounds[0], math.ceil(warm["records_per_transaction"] / RAW_BATCH) * RAW_BATCH)
    clock.stop()
    return {
        **params,
        "table": table,
        "records_file": str(records),
        "records": expected.records,
        "sha256": expected.sha256,
        "value_bytes": expected.value_bytes,
        "raw_bounds": [matched, bounds[1], bounds[2]],
        "warmup_records_per_transaction": warm["records_per_transaction"],
        "inputs": {
            "deltamirror": [str(Path(table["root"]) / "_delta_log")],
            "raw-transactional": [str(records)],
            "raw-idempotent": [str(records)],
            "naive-mirror": [str(Path(table["root"]) / "_delta_log")],
        },
    }


def produce_deltamirror(clock: Any, params: dict[str, Any]) -> dict[str, Any]:
    """Timed: the watcher (``WatchService``, default settings) from its producer being ready until
    the transaction holding the last version has committed; then a read_committed read-back that
    must find exactly the records ``iter_event_values`` gives, in order (not timed)."""
    from deltamirror.producer.service import WatchService  # noqa: F401  (run_deltamirror's imports)

    clock.imported()
    expected = Expected(params["records"], params["sha256"], params["value_bytes"])
    result = run_deltamirror(params["bootstrap"], params["table"], expected, params.get("broker_pid"), clock)
    return {
        k: result[k]
        for k in ("records", "exactly_once_in_order", "records_per_transaction", "broker_cpu_s", "startup_s")
    } | {"ok": bool(result["exactly_once_in_order"] and not result["errors"])}


def _produce_raw(clock: Any, params: dict[str, Any], *, transactional: bool) -> dict[str, Any]:
    import marshal

    from confluent_kafka import Producer  # noqa: F401  (run_raw's imports)

    from deltamirror.mirror.kafka.producer import producer_config  # noqa: F401
    from deltamirror.mirror.topics import TopicManager  # noqa: F401

    clock.imported()
    with open(params["records_file"], "rb") as fh:
        key, values, headers, timestamps, sha256, value_bytes = marshal.load(fh)
    work = Workload(key, values, headers, timestamps, sha256, value_bytes, 0.0, 0.0)
    bounds = tuple(params["raw_bounds"])
    result = run_raw(
        params["bootstrap"],
        work,
        transactional=transactional,
        bounds=(bounds[0], bounds[1], bounds[2]),
        broker_pid=params.get("broker_pid"),
        clock=clock,
    )
    return {k: result[k] for k in ("records", "records_per_transaction", "broker_cpu_s", "transactions")} | {
        "ok": not result["delivery_errors"]
    }


def produce_raw_transactional(clock: Any, params: dict[str, Any]) -> dict[str, Any]:
    """Timed: bare confluent-kafka ``Producer`` (deltamirror's ``producer_config``: idempotent,
    acks=all, lz4, linger 50 ms), transactional, the same records, key, headers and timestamps, a
    commit every as many records as the watcher's transactions held; from the first ``produce``
    to the last ``commit_transaction`` (producer id, connection and metadata warmed before)."""
    return _produce_raw(clock, params, transactional=True)


def produce_naive_mirror(clock: Any, params: dict[str, Any]) -> dict[str, Any]:
    """Timed: :func:`run_naive` over the same commit files, from the first file read to the last
    ``commit_transaction``; then a read_committed read-back that must count every record."""
    import orjson  # noqa: F401  (run_naive's imports)
    from confluent_kafka import Producer  # noqa: F401

    from deltamirror.mirror.kafka.producer import producer_config  # noqa: F401
    from deltamirror.mirror.topics import TopicManager  # noqa: F401

    clock.imported()
    result = run_naive(params["bootstrap"], params["table"]["root"], params.get("broker_pid"), clock)
    return {k: result[k] for k in ("records", "broker_cpu_s", "transactions")} | {
        "ok": not result["delivery_errors"] and result["consumed_read_committed"] == result["records"]
    }


def produce_raw_idempotent(clock: Any, params: dict[str, Any]) -> dict[str, Any]:
    """As the transactional peer, without transactions: from the first ``produce`` to ``flush``."""
    return _produce_raw(clock, params, transactional=False)


# --- latency ----------------------------------------------------------------------------------------------


def _consumer_child(bootstrap: str, topic: str) -> int:
    """Latency probe (child process): one line per version, when its last record arrives."""
    import harness  # bench/ is on the path

    consumer = harness.committed_reader(bootstrap, topic)
    print("ready", flush=True)  # the parent waits for version 0's line before committing anything
    try:
        while True:
            # poll, not consume(n, timeout): librdkafka's consume waits for n records or the whole timeout
            m = consumer.poll(0.1)
            now = time.time()
            if m is None or m.error() is not None:
                continue
            event = json.loads(m.value() or b"null")
            if event["index"] + 1 == event["count"]:
                print(f"{event['version']} {now:.6f}", flush=True)
    except (KeyboardInterrupt, BrokenPipeError):
        return 0
    finally:
        consumer.close()


def run_latency(
    bootstrap: str, commits: int, *, notifications: bool, seed: int, interval_ms: float
) -> dict[str, Any]:
    from deltamirror.producer.service import WatchService

    root = DATA / f"latency-{uuid.uuid4().hex[:8]}"
    log = root / "_delta_log"
    log.mkdir(parents=True)
    write_commit(log, 0, _version0_lines(str(uuid.uuid4())))
    cfg, (actions, commits_topic, progress) = _watch_config(
        bootstrap, str(root), use_notifications=notifications
    )
    from deltamirror.producer.settings import poll_interval

    poll_s = poll_interval(cfg.tables[0], notified=notifications)  # its default: 30 s with notifications
    metrics = BenchMetrics(target_version=0)
    service = WatchService(cfg, metrics=metrics)
    created: dict[int, float] = {}
    received: dict[int, float] = {}
    child: subprocess.Popen[str] | None = None
    try:
        service.start()
        if not metrics.done.wait(120):
            raise SystemExit(
                f"the watcher did not publish version 0 of the latency table: {service._failure}"
            )
        child = subprocess.Popen(
            [sys.executable, __file__, "--latency-consumer", bootstrap, actions],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert child.stdout is not None
        stream = child.stdout
        if stream.readline().strip() != "ready":
            raise SystemExit("the latency consumer did not start")
        got_v0 = threading.Event()

        def read_lines() -> None:
            for line in stream:
                version, at = line.split()
                received[int(version)] = float(at)
                if int(version) == 0:
                    got_v0.set()

        reader = threading.Thread(target=read_lines, daemon=True)
        reader.start()
        if not got_v0.wait(60):
            raise SystemExit("the latency consumer never saw version 0")
        rng = random.Random(seed)
        for v in range(1, commits + 1):
            time.sleep(rng.uniform(interval_ms * 0.75, interval_ms * 1.25) / 1000)
            lines = [_commit_info_line(v, 2), _add_line(v, 0, "lat"), _add_line(v, 1, "lat")]
            created[v] = write_commit(log, v, lines)
        deadline = time.monotonic() + 60
        while len([v for v in created if v in received]) < commits and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        service.request_stop()
        service.wait(60)
        service.close()
        if child is not None:
            child.terminate()
            child.wait(10)
        _delete_topics(bootstrap, [actions, commits_topic, progress])
        shutil.rmtree(root, ignore_errors=True)
    missing = [v for v in created if v not in received]
    e2e = [(received[v] - created[v]) * 1000 for v in created if v in received]
    publish = [
        (metrics.published_wall[v] - created[v]) * 1000 for v in created if v in metrics.published_wall
    ]
    goal_ms = poll_s * 1000 + 50

    def stats(xs: list[float]) -> dict[str, float]:
        if not xs:
            return {}
        return {
            "p50_ms": _percentile(xs, 50),
            "p90_ms": _percentile(xs, 90),
            "p99_ms": _percentile(xs, 99),
            "max_ms": max(xs),
            "mean_ms": statistics.fmean(xs),
            "min_ms": min(xs),
        }

    return {
        "notifications": notifications,
        "poll_interval_s": poll_s,
        "commits": commits,
        "received": len(e2e),
        "missing_versions": missing,
        "commit_to_consumer": stats(e2e),
        "commit_to_transaction_committed": stats(publish),
        "goal_p99_ms": goal_ms,
        "meets_goal": bool(e2e) and not missing and _percentile(e2e, 99) <= goal_ms,
        "transactions": metrics.transactions,
        "errors": metrics.errors,
        "samples_ms": [round(x, 2) for x in e2e],
    }


# --- machine, broker, report -------------------------------------------------------------------------------


def _machine() -> dict[str, Any]:
    import confluent_kafka

    cpu_model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gb = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_gb = round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    try:
        commit = subprocess.run(
            ["git", "-C", str(BENCH.parent), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
    except OSError:
        commit = ""
    from importlib.metadata import version

    return {
        "cpus": os.cpu_count(),
        "cpu_model": cpu_model,
        "memory_gb": mem_gb,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "confluent_kafka": confluent_kafka.version()[0],
        "librdkafka": confluent_kafka.libversion()[0],
        "deltamirror": version("deltamirror"),
        "git_commit": commit,
    }


def _busiest_processes(n: int = 5, window_s: float = 1.0) -> list[str]:
    """The processes using the most CPU over ``window_s`` (from /proc; this one excluded): who shares the cores."""

    def sample() -> dict[int, tuple[float, str]]:
        out: dict[int, tuple[float, str]] = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                args = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            except OSError:
                continue
            out[int(entry.name)] = (int(fields[11]) + int(fields[12]), args)
        return out

    try:
        first = sample()
        time.sleep(window_s)
        second = sample()
    except OSError:
        return []
    ticks = os.sysconf("SC_CLK_TCK") * window_s
    busy = sorted(
        ((cpu - first[pid][0]) / ticks * 100, args) for pid, (cpu, args) in second.items() if pid in first
    )[::-1]
    return [f"{pct:5.1f}% {args[:120]}" for pct, args in busy if pct > 0 and args][:n]


@dataclass
class Broker:
    bootstrap: str
    local: Any = None
    started_here: bool = False
    pid: int | None = None
    kafka_version: str | None = None


def open_broker(args: argparse.Namespace) -> Broker:
    given = args.bootstrap or os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if given:
        return Broker(given)
    from deltamirror.devkafka.broker import LocalKafka

    local = LocalKafka(port=args.port, data_dir=args.kafka_data_dir)
    was_running = bool(local.status()["running"])
    print(
        f"{'using' if was_running else 'starting'} the local broker on port {args.port}...", file=sys.stderr
    )
    bootstrap = local.start()
    state = local.status()
    return Broker(bootstrap, local, not was_running, state["pid"], state["kafka_version"])


def _spread(values: list[float]) -> dict[str, Any]:
    """Median, quartiles and range of per-round figures (quartiles need two of them)."""
    ordered = sorted(values)
    q1, _, q3 = statistics.quantiles(ordered, n=4) if len(ordered) > 1 else (ordered[0],) * 3
    return {
        "median": statistics.median(ordered),
        "q1": q1,
        "q3": q3,
        "min": ordered[0],
        "max": ordered[-1],
        "n": len(ordered),
        "values": ordered,
    }


def _median_of(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(values) if values else None


def _summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    keys = (
        "records_per_s",
        "mb_per_s",
        "seconds",
        "seconds_from_start",
        "startup_s",
        "cpu_s",
        "broker_cpu_s",
        "records_per_transaction",
    )
    out: dict[str, Any] = {k: _median_of(runs, k) for k in keys if _median_of(runs, k) is not None}
    out["runs"] = runs
    return out


def _fmt(x: float | None, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def markdown(report: dict[str, Any]) -> str:
    lines: list[str] = []
    m, load = report["machine"], report["load_average"]
    lines.append(
        f"machine: {m['cpus']} CPUs ({m['cpu_model']}), {m['memory_gb']} GB, Python {m['python']}, "
        f"librdkafka {m['librdkafka']}, broker {report['broker']['bootstrap']} "
        f"(Kafka {report['broker']['kafka_version'] or '?'}); load average (1/5/15 min) "
        f"{'/'.join(f'{x:.2f}' for x in load['before'])} before, {'/'.join(f'{x:.2f}' for x in load['after'])} after"
    )
    for when in ("start", "end"):
        procs = report.get(f"busiest_processes_at_{when}") or []
        lines.append(
            f"busiest other processes at the {when} (CPU over 1 s): "
            + ("; ".join(p[:70] for p in procs[:3]) or "none")
        )
    tp = report.get("throughput")
    if tp:
        t = tp["table"]
        lines += [
            "",
            f"Throughput: {t['actions']:,} actions ({t['versions']} versions, {t['adds_per_version']} adds each, "
            f"{tp['value_bytes'] / 1e6:.0f} MB of values, {tp['value_bytes'] / t['actions']:.0f} B/record), "
            f"median of {tp['reps']} runs",
            "",
            "| contender | records/s | MB/s | seconds | records/txn | CPU s (process) | CPU s (broker) | deltamirror / this |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        dm = tp["deltamirror"]
        for name, label in (
            ("deltamirror", "deltamirror watch (ready -> last version committed)"),
            ("raw_transactional", "confluent-kafka, transactional (watcher's txn sizes)"),
            ("raw_idempotent", "confluent-kafka, idempotent, no transactions"),
        ):
            s = tp[name]
            ratio = dm["records_per_s"] / s["records_per_s"]
            lines.append(
                f"| {label} | {s['records_per_s']:,.0f} | {_fmt(s.get('mb_per_s'), '.1f')} | "
                f"{_fmt(s.get('seconds'))} | {_fmt(s.get('records_per_transaction'), ',.0f')} | "
                f"{_fmt(s.get('cpu_s'))} | {_fmt(s.get('broker_cpu_s'))} | {ratio:.2f} |"
            )
        enc = tp["read_encode_only"]
        lines += [
            "",
            f"deltamirror from `start()` (topics, init_transactions, progress read included): "
            f"{dm['seconds_from_start']:.2f} s ({t['actions'] / dm['seconds_from_start']:,.0f} actions/s); "
            f"read+encode alone (`iter_event_values`, no Kafka): {enc['seconds']:.2f} s "
            f"({enc['records_per_s']:,.0f} records/s). Exactly once, in order (read_committed read-back): "
            f"{'yes' if tp['exactly_once_in_order'] else 'NO'}.",
        ]
        pr = tp.get("per_round_ratio_vs_raw_transactional")
        if pr:
            lines.append(
                f"Per-round ratio deltamirror / raw transactional (same round): median {pr['median']:.2f}, "
                f"IQR {pr['q1']:.2f}-{pr['q3']:.2f}, min-max {pr['min']:.2f}-{pr['max']:.2f} "
                f"over {pr['n']} rounds. Goal >= 0.9: {'met' if pr['median'] >= 0.9 else 'NOT met'}."
            )
    lat = report.get("latency")
    if lat:
        lines += [
            "",
            f"Latency: {lat['commits']} commits of 3 actions, one every ~{lat['interval_ms']:.0f} ms, "
            "commit file rename -> read_committed consumer has the version's last record (nearest-rank)",
            "",
            "| watcher | p50 ms | p90 ms | p99 ms | max ms | detect+commit p50 / p99 ms | goal p99 | met |",
            "|---|---:|---:|---:|---:|---:|---:|---|",
        ]
        for r in lat["runs"]:
            e, pub = r["commit_to_consumer"], r["commit_to_transaction_committed"]
            label = f"poll {r['poll_interval_s']:g} s, " + (
                "inotify on" if r["notifications"] else "inotify off"
            )
            lines.append(
                f"| {label} | {_fmt(e.get('p50_ms'), '.0f')} | {_fmt(e.get('p90_ms'), '.0f')} | "
                f"{_fmt(e.get('p99_ms'), '.0f')} | {_fmt(e.get('max_ms'), '.0f')} | "
                f"{_fmt(pub.get('p50_ms'), '.0f')} / {_fmt(pub.get('p99_ms'), '.0f')} | "
                f"<= {r['goal_p99_ms']:.0f} | {'yes' if r['meets_goal'] else 'NO'} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--actions", type=int, default=200_000, help="add actions in the throughput table")
    parser.add_argument("--versions", type=int, default=200, help="commits the adds are spread over")
    parser.add_argument("--commits", type=int, default=100, help="commits made for the latency measurement")
    parser.add_argument("--interval-ms", type=float, default=200.0, help="mean time between latency commits")
    parser.add_argument("--reps", type=int, default=3, help="runs of each throughput contender")
    parser.add_argument("--quick", action="store_true", help="20k actions / 20 versions, 20 commits, 1 rep")
    parser.add_argument("--only", choices=("throughput", "latency"), default=None)
    parser.add_argument(
        "--bootstrap", default=None, help="an existing broker (else $KAFKA_BOOTSTRAP_SERVERS)"
    )
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="port of the bench's own broker")
    parser.add_argument("--kafka-data-dir", type=Path, default=DEFAULT_KAFKA_DATA)
    parser.add_argument("--keep-broker", action="store_true", help="leave a broker started here running")
    parser.add_argument("--data-dir", type=Path, default=DATA)
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--latency-consumer", nargs=2, metavar=("BOOTSTRAP", "TOPIC"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.latency_consumer:
        return _consumer_child(*args.latency_consumer)
    if args.quick:
        args.actions, args.versions, args.commits, args.reps = 20_000, 20, 20, 1

    load_before = os.getloadavg()
    busiest = _busiest_processes()
    broker = open_broker(args)
    report: dict[str, Any] = {
        "machine": _machine(),
        "broker": {
            "bootstrap": broker.bootstrap,
            "started_by_bench": broker.started_here,
            "kafka_version": broker.kafka_version,
        },
        "busiest_processes_at_start": busiest,
    }
    ok = True
    try:
        if args.only in (None, "throughput"):
            table = ensure_table(args.actions, args.versions, args.data_dir)
            print(f"table {table['root']}: {table['actions']:,} actions", file=sys.stderr)
            work = load_workload(table["root"])
            # the records are kept for the whole run: out of the collector's sight, so that they do not
            # slow down the watcher's own collections (a real watcher holds no such heap)
            gc.freeze()
            if len(work.values) != table["actions"]:
                raise SystemExit(
                    f"iter_event_values gave {len(work.values)} records, expected {table['actions']}"
                )
            from deltamirror.producer import WatchConfig

            fields = WatchConfig.model_fields  # the watcher's default transaction bounds
            bounds = (
                int(fields["txn_max_records"].default),
                int(fields["txn_max_bytes"].default),
                int(fields["txn_max_ms"].default),
            )
            # a fresh broker is a cold JVM: one untimed round of the raw peer first
            print("  warm-up: raw_transactional...", file=sys.stderr)
            warmup = run_raw(broker.bootstrap, work, transactional=True, bounds=bounds, broker_pid=broker.pid)
            runs: dict[str, list[dict[str, Any]]] = {
                "deltamirror": [],
                "raw_transactional": [],
                "raw_idempotent": [],
            }
            names = list(runs)
            for rep in range(args.reps):
                # the order turns each round: background work a contender leaves behind (its topic's
                # deletion, the read-back) lands on each contender alike, not always on the next one
                for name in names[rep % len(names) :] + names[: rep % len(names)]:
                    print(f"  rep {rep + 1}/{args.reps}: {name}...", file=sys.stderr)
                    if name == "deltamirror":
                        result = run_deltamirror(broker.bootstrap, table, Expected.of(work), broker.pid)
                    else:
                        # transactions as large as the watcher's just before (whole batches), so both
                        # pay the same number of commits; the watcher's byte and time bounds still hold
                        dm_txn = runs["deltamirror"][-1]["records_per_transaction"]
                        matched = min(bounds[0], math.ceil(dm_txn / RAW_BATCH) * RAW_BATCH)
                        result = run_raw(
                            broker.bootstrap,
                            work,
                            transactional=name == "raw_transactional",
                            bounds=(matched, bounds[1], bounds[2]),
                            broker_pid=broker.pid,
                        )
                    print(f"    {result['records_per_s']:,.0f} records/s", file=sys.stderr)
                    runs[name].append(result)
            summary = {name: _summarize(r) for name, r in runs.items()}
            exact = all(r["exactly_once_in_order"] and not r["errors"] for r in runs["deltamirror"])
            raw_ok = all(
                not r["delivery_errors"]
                for name in ("raw_transactional", "raw_idempotent")
                for r in runs[name]
            )
            ok = ok and exact and raw_ok
            dm_rate = summary["deltamirror"]["records_per_s"]
            report["throughput"] = {
                "table": table,
                "reps": args.reps,
                "value_bytes": work.value_bytes,
                "transaction_bounds": dict(zip(("records", "bytes", "ms"), bounds, strict=True)),
                "warmup_records_per_s": warmup["records_per_s"],
                "read_encode_only": {
                    "seconds": work.encode_s,
                    "cpu_s": work.encode_cpu_s,
                    "records_per_s": len(work.values) / work.encode_s,
                },
                **summary,
                "ratio_vs_raw_transactional": dm_rate / summary["raw_transactional"]["records_per_s"],
                "ratio_vs_raw_idempotent": dm_rate / summary["raw_idempotent"]["records_per_s"],
                # the figure the performance goals ask for: each round's deltamirror / raw, then their median
                "per_round_ratio_vs_raw_transactional": _spread(
                    [
                        d["records_per_s"] / r["records_per_s"]
                        for d, r in zip(runs["deltamirror"], runs["raw_transactional"], strict=True)
                    ]
                ),
                "exactly_once_in_order": exact,
            }
            del work
        if args.only in (None, "latency"):
            lat_runs = []
            for notifications in (False, True):
                label = "on" if notifications else "off"
                print(f"  latency, inotify {label}: {args.commits} commits...", file=sys.stderr)
                result = run_latency(
                    broker.bootstrap,
                    args.commits,
                    notifications=notifications,
                    seed=args.seed,
                    interval_ms=args.interval_ms,
                )
                ok = ok and not result["missing_versions"] and not result["errors"]
                lat_runs.append(result)
            report["latency"] = {"commits": args.commits, "interval_ms": args.interval_ms, "runs": lat_runs}
    finally:
        if broker.local is not None and broker.started_here and not args.keep_broker:
            broker.local.stop()
    report["load_average"] = {"before": list(load_before), "after": list(os.getloadavg())}
    report["busiest_processes_at_end"] = _busiest_processes()
    text = markdown(report)
    report["markdown"] = text
    print(text)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {args.output}")
    if not ok:
        print(
            "FAILED: records lost, duplicated or reordered, or the watcher reported errors", file=sys.stderr
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
