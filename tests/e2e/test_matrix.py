"""The scenario matrix: the combinations users deploy, each run end to end on a real broker.

A cell is one deployment: where the table lives (a local disk or S3 through s3proxy), which listener
(plaintext or the SASL_SSL one of ``local kafka start --security scram-tls``), what is watched (a
table, or a prefix discovered), how it starts (each snapshot mode), with or without row changes,
one member or a group of two, a snapshot signal sent while it runs, settings as flags or as a
configuration file plus flags, and who reads it (the command-line consumers, and the Spark source
beside delta-spark's own change feed). ``deltamirror watch`` runs as a process, as deployed; then
``consume-snapshot`` and ``invalidate`` read what it published. Each cell either works, checked
against ``deltamirror events`` / ``snapshot`` / ``changes`` of the same table, or is refused at start
in one line naming its settings (exit 2).

``make test`` runs the cells marked ``ci``; ``make e2e`` runs them all and writes the outcome table
(``DELTAMIRROR_MATRIX_REPORT``: the Markdown file to write; the README's table is one of those).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import yaml
from deltalake import write_deltalake

from support.records import read_topic, wait_for

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

VERSIONS = 3  # versions 0..2: an insert, an update (a cdc file), another insert


@dataclass(frozen=True)
class Cell:
    name: str
    storage: str = "local"  # local | s3
    listener: str = "plain"  # plain | scram-tls
    source: str = "table"  # table | discover
    mode: str = "initial"  # initial | latest | from-version | from-timestamp | when-needed
    row_changes: bool = False
    members: int = 1
    signal: bool = False
    settings: str = "flags"  # flags | file+flags
    spark: bool = False  # the Spark source reads the mirror too, compared with delta-spark's readChangeFeed
    refused: tuple[str, ...] = ()  # the names the one-line refusal must carry
    ci: bool = False
    extra: tuple[str, ...] = field(default_factory=tuple)

    def describe(self) -> dict[str, str]:
        return {
            "storage": self.storage,
            "listener": self.listener,
            "source": self.source,
            "snapshot mode": self.mode,
            "row changes": "yes" if self.row_changes else "no",
            "members": str(self.members),
            "signal": "yes" if self.signal else "no",
            "settings": self.settings,
            "Spark source": "yes" if self.spark else "no",
        }


CELLS = [
    Cell("flags-initial", ci=True),
    Cell("file-from-version-rows", mode="from-version", row_changes=True, settings="file+flags", ci=True),
    Cell("discover-initial-rows", source="discover", row_changes=True, ci=True),
    Cell(
        "discover-from-version-refused",
        source="discover",
        mode="from-version",
        refused=("--discover", "--from-version"),
        ci=True,
    ),
    Cell("latest", mode="latest", ci=True),
    Cell("spark-from-version-rows", mode="from-version", row_changes=True, spark=True, ci=True),
    Cell("from-timestamp", mode="from-timestamp"),
    Cell("when-needed", mode="when-needed", settings="file+flags"),
    Cell("signal-snapshot", signal=True, settings="file+flags"),
    Cell("group-of-two", members=2, mode="from-version", settings="file+flags"),
    Cell("group-of-two-discover-rows", members=2, source="discover", row_changes=True),
    Cell("s3-initial", storage="s3"),
    Cell(
        "s3-discover-from-timestamp-rows",
        storage="s3",
        source="discover",
        mode="from-timestamp",
        row_changes=True,
    ),
    Cell("scram-tls-initial", listener="scram-tls", settings="file+flags"),
    Cell(
        "scram-tls-s3-rows-signal",
        listener="scram-tls",
        storage="s3",
        mode="from-version",
        row_changes=True,
        signal=True,
        settings="file+flags",
    ),
]

RESULTS: dict[str, tuple[Cell, str]] = {}


def _write_table(path: Path, versions: range) -> None:
    for v in versions:
        data = pa.table({"id": pa.array([v % 2], pa.int64()), "name": [f"n{v}"]})
        mode = "append" if v != 1 else "overwrite"  # version 1 replaces the row of version 0
        write_deltalake(
            str(path),
            data,
            mode=mode,
            configuration={"delta.enableChangeDataFeed": "true"} if v == 0 else None,
        )


def _cli(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "deltamirror.cli.main", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _ok(*argv: str) -> str:
    done = _cli(*argv)
    assert done.returncode == 0, f"{argv}: exit {done.returncode}: {done.stderr[-2000:]}"
    return done.stdout


@dataclass
class Env:
    kafka: dict[str, Any]  # the kafka: section of a file
    client: dict[str, str]  # librdkafka settings of a test's own reader
    consumer_args: list[str]  # how a consumer command reaches the broker
    storage: list[str]  # -S options
    storage_options: dict[str, Any]
    s3: Any = None  # the S3Proxy of an S3 cell


@pytest.fixture
def env(request: pytest.FixtureRequest, tmp_path: Path) -> Env:
    cell: Cell = request.node.callspec.params["cell"]
    if cell.listener == "scram-tls":
        secure = request.getfixturevalue("secure_kafka")
        kafka = dict(secure.kafka)
        from deltamirror.mirror.settings import KafkaSettings

        client = KafkaSettings.model_validate(kafka).librdkafka_config()
        args = ["--config", str(secure.client_file)]
    else:
        bootstrap = request.getfixturevalue("kafka_bootstrap")
        kafka = {"bootstrap_servers": bootstrap}
        client = {"bootstrap.servers": bootstrap}
        args = ["--bootstrap-servers", bootstrap]
    options: dict[str, Any] = {}
    flags: list[str] = []
    s3 = None
    if cell.storage == "s3":
        s3 = request.getfixturevalue("s3")
        options = dict(s3.storage_options)
        flags = [f"-S{k}={v}" for k, v in options.items()]
    return Env(kafka, client, args, flags, options, s3 if cell.storage == "s3" else None)


def _watch_argv(cell: Cell, env: Env, tmp: Path, where: str, table_uri: str, name: str) -> list[str]:
    argv = ["watch", "--no-progress", "--poll-interval", "0.2", "--progress-topic", f"{name}.progress"]
    argv += ["--transactional-id-prefix", name]
    if cell.settings == "file+flags":  # the broker and the table in a file, the rest as flags
        cfg: dict[str, Any] = {"kafka": env.kafka, "signal_topic": f"{name}.signals"}
        if cell.source == "table":
            table: dict[str, Any] = {"uri": table_uri}
            if env.storage_options:
                table["storage_options"] = env.storage_options
            cfg["tables"] = [table]
        path = tmp / "watch.yaml"
        path.write_text(yaml.safe_dump(cfg))
        argv += ["--config", str(path)]
    else:
        argv += ["--bootstrap-servers", str(env.kafka["bootstrap_servers"])]
        if cell.source == "table":
            argv.append(table_uri)
    if cell.source == "discover":
        argv += ["--discover", where]
    if cell.storage == "s3" and not (cell.settings == "file+flags" and cell.source == "table"):
        argv += env.storage  # a discover prefix's storage options, as flags
    if cell.mode == "from-version":
        argv += ["--snapshot-mode", "from-version", "--from-version", "0"]
    elif cell.mode == "from-timestamp":  # version 1's
        history = [
            json.loads(x) for x in _ok("history", table_uri, *env.storage, "--format", "jsonl").splitlines()
        ]
        at_1 = next(h["timestamp"] for h in history if h["version"] == 1)
        argv += ["--snapshot-mode", "from-timestamp", "--from-timestamp", at_1]
    elif cell.mode != "initial":
        argv += ["--snapshot-mode", cell.mode]
    if cell.row_changes:
        argv.append("--row-changes")
    if cell.members > 1:
        argv += ["--group", name]
    return argv


def _commits(client: dict[str, str], topic: str) -> list[tuple[int, bool]]:
    return [
        (r.json["version"], bool(r.json["snapshot"]))
        for r in read_topic(client, topic)
        if r.value and r.json.get("kind") == "commit"
    ]


def _start(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "deltamirror.cli.main", *argv], stdout=out, stderr=subprocess.STDOUT
        )


def _stop(proc: subprocess.Popen[bytes]) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise


@pytest.mark.parametrize(
    "cell",
    [
        pytest.param(
            c,
            id=c.name,
            marks=(() if c.ci else (pytest.mark.e2e,)) + ((pytest.mark.spark,) if c.spark else ()),
        )
        for c in CELLS
    ],
)
def test_cell(cell: Cell, env: Env, tmp_path: Path) -> None:
    RESULTS[cell.name] = (cell, "failed")
    name = f"mx{uuid.uuid4().hex[:10]}"
    local_root = tmp_path / "lake"
    local = local_root / name
    _write_table(local, range(VERSIONS))
    where = str(local_root)
    table_uri = str(local)
    s3proxy = None
    if cell.storage == "s3":
        s3proxy = env.s3
        prefix = s3proxy.new_prefix("matrix")
        table_uri = s3proxy.upload_table(local, f"{prefix}/{name}")
        where = table_uri.rsplit("/", 1)[0]

    argv = _watch_argv(cell, env, tmp_path, where, table_uri, name)
    if cell.refused:
        done = _cli(*argv, timeout=60)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1, done.stderr[-2000:]
        assert all(n in lines[0] for n in cell.refused), lines[0]
        RESULTS[cell.name] = (cell, "refused: " + " + ".join(cell.refused))
        return

    actions, commits = f"deltamirror.{name}.actions", f"deltamirror.{name}.commits"
    log = tmp_path / "watch.log"
    procs = [_start(argv, log) for _ in range(cell.members)]
    try:

        def alive() -> None:
            for p in procs:
                assert p.poll() is None, log.read_text()[-3000:]

        def published(version: int) -> bool:
            alive()
            return any(v == version for v, _ in _commits(env.client, commits))

        if cell.mode == "latest":  # nothing before the start; versions written after it, each once
            written = [VERSIONS - 1]

            def a_new_version_published() -> bool:
                if not _commits(env.client, commits):  # the watcher may not have read its start yet
                    written.append(written[-1] + 1)
                    _write_table(local, range(written[-1], written[-1] + 1))
                return published(written[-1]) or bool(_commits(env.client, commits))

            wait_for(a_new_version_published, "a version written after the start", 120)
            wait_for(lambda: published(written[-1]), "every version written after the start", 120)
        else:
            wait_for(lambda: published(VERSIONS - 1), "every version", 120)
        if cell.signal:
            before = len(_commits(env.client, commits))
            send = ["signal", "snapshot", table_uri, *env.consumer_args]
            if cell.settings == "file+flags":
                send = ["signal", "snapshot", table_uri, "--config", str(tmp_path / "watch.yaml")]
            _ok(*send)
            wait_for(lambda: len(_commits(env.client, commits)) > before, "a snapshot on signal", 90)
    finally:
        codes = [_stop(p) for p in procs]
    assert codes == [0] * len(procs), log.read_text()[-3000:]

    published_commits = _commits(env.client, commits)
    assert len(published_commits) == len(set(published_commits)) or cell.signal, published_commits
    if cell.mode == "latest":
        first = published_commits[0][0]
        assert VERSIONS - 1 < first <= written[-1], (published_commits, written)
        assert published_commits == [(v, False) for v in range(first, written[-1] + 1)], published_commits
        # a consumer of a mirror that began after the table did holds no state: one document a version
        docs = _ok("invalidate", "--topic", actions, *env.consumer_args, "--once", "--exec", "true")
        assert len(docs.splitlines()) == len(published_commits), docs
        RESULTS[cell.name] = (cell, "works")
        return
    expected = {
        "initial": [(2, True)],
        "when-needed": [(2, True)],  # no position of its own yet: a snapshot is needed
        "from-version": [(0, False), (1, False), (2, False)],
        "from-timestamp": [(1, False), (2, False)],
    }[cell.mode]
    assert published_commits[: len(expected)] == expected, published_commits
    if cell.signal:
        assert published_commits[len(expected) :] == [(2, True)], published_commits

    # the actions published are deltamirror events' of the same versions (a snapshot: its files)
    records = [r.json for r in read_topic(env.client, actions) if r.value]
    if not expected[0][1]:
        events = [
            json.loads(line)
            for line in _ok(
                "events", table_uri, *env.storage, "--starting-version", str(expected[0][0])
            ).splitlines()
        ]
        mirrored = [r for r in records if not r.get("snapshot")][: len(events)]
        assert [(e["version"], e["type"]) for e in mirrored] == [(e["version"], e["type"]) for e in events]
    header = json.loads(_ok("snapshot", table_uri, *env.storage).splitlines()[0])

    # consume-snapshot: the table's state is deltamirror snapshot's; invalidate: one document a version
    counts = [
        json.loads(line)
        for line in _ok(
            "consume-snapshot", "--topic", actions, *env.consumer_args, "--once", "--group-id", name + "-cs"
        ).splitlines()
    ]
    assert counts[-1]["version"] == VERSIONS - 1 and counts[-1]["files"] == header["numFiles"], counts
    docs = _ok(
        "invalidate",
        "--topic",
        actions,
        *env.consumer_args,
        "--once",
        "--exec",
        "true",
        "--group-id",
        name + "-inv",
    )
    # a snapshot republished at a version the state holds changes nothing: not delivered again
    assert len(docs.splitlines()) == len({v for v, _ in published_commits}), docs

    if cell.row_changes:
        rows = [r for r in read_topic(env.client, f"deltamirror.{name}.changes") if r.value]
        if expected[0][1]:  # a snapshot: every row read
            expect_rows = len(_ok("read", table_uri, *env.storage).splitlines())
        else:
            start = str(expected[0][0])
            expect_rows = len(
                _ok("changes", table_uri, *env.storage, "--starting-version", start).splitlines()
            )
        if cell.signal:  # the snapshot on signal publishes every row again, as reads
            expect_rows += len(_ok("read", table_uri, *env.storage).splitlines())
        assert len(rows) == expect_rows, (len(rows), expect_rows)
    if cell.spark:
        _spark_reads_what_delta_spark_reads(env, tmp_path, table_uri, actions, commits, expected[0][0])
    RESULTS[cell.name] = (cell, "works")


def _spark_reads_what_delta_spark_reads(
    env: Env, tmp: Path, table_uri: str, actions: str, commits: str, start: int
) -> None:
    """The Spark source's change feed from the mirror is delta-spark's readChangeFeed of the table."""
    from deltamirror.consumer import register
    from support.spark import get_spark_session
    from support.spark_scenarios import normalize_cdf_rows

    spark = get_spark_session()
    register(spark)

    def run(stream: Any, checkpoint: Path) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        query = (
            stream.writeStream.foreachBatch(lambda df, _: rows.extend(r.asDict() for r in df.collect()))
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(300)
        assert query.exception() is None, query.exception()
        return normalize_cdf_rows(rows)

    ours = (
        spark.readStream.format("deltamirror")
        .option("kafka.bootstrap.servers", env.client["bootstrap.servers"])
        .option("actionsTopic", actions)
        .option("commitsTopic", commits)
        .option("startingVersion", str(start))
        .load(table_uri)
    )
    theirs = (
        spark.readStream.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", str(start))
        .load(table_uri)
    )
    mine, oracle = run(ours, tmp / "ours"), run(theirs, tmp / "theirs")
    assert oracle and {r["_change_type"] for r in oracle} >= {"insert", "delete"}  # version 1 overwrites
    assert mine == oracle


@pytest.fixture(scope="module", autouse=True)
def _report() -> Iterator[None]:
    yield
    target = os.environ.get("DELTAMIRROR_MATRIX_REPORT")
    if not target or not RESULTS:
        return
    columns = list(next(iter(RESULTS.values()))[0].describe())
    lines = [
        f"Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on {os.uname().nodename} "
        f"({os.cpu_count()} cores), Python {sys.version.split()[0]}.",
        "",
        "| cell | " + " | ".join(columns) + " | outcome |",
        "|" + "---|" * (len(columns) + 2),
    ]
    for cell, outcome in RESULTS.values():
        lines.append(f"| {cell.name} | " + " | ".join(cell.describe().values()) + f" | {outcome} |")
    Path(target).write_text("\n".join(lines) + "\n")
