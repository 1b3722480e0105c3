"""Running a forged-record case through every consumer, and judging what each made of it.

``consume-snapshot`` and ``invalidate`` run in-process as the CLI (:func:`support.mutation_exec.run_command`),
each with a state directory, ``invalidate`` into a real local HTTP receiver; the change feed read
from the mirror runs as the library (:class:`MirrorIndex`, :func:`read_mirror_versions`); the Spark
source as a streaming query (``maxFilesPerTrigger`` 1: a micro-batch per version). A flood case
runs ``consume-snapshot`` as a process, its peak RSS measured.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from support.forge import Base, Topics, consume_snapshot_argv, state_paths, state_uris, write_case
from support.forge_cases import Case
from support.mutation_exec import Result, run_command


@dataclass
class Outcome:
    case: Case
    consumer: str
    outcome: str
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0
    detail: str = ""
    #: peak RSS of the consumer's process (flood cases), MB
    rss_mb: float | None = None

    @property
    def expected(self) -> frozenset[str]:
        return self.case.expect[self.consumer]


class _Receiver:
    """A local webhook receiver: every document POSTed, in order."""

    def __init__(self) -> None:
        self.docs: list[dict[str, Any]] = []
        docs = self.docs

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                docs.append(json.loads(self.rfile.read(length)))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@contextmanager
def _receiver() -> Iterator[_Receiver]:
    receiver = _Receiver()
    try:
        yield receiver
    finally:
        receiver.close()


def _forged_in_state(base: Base, state: Path) -> list[str]:
    """What of a forged record a saved state holds: a path outside the table (the state's
    checkpoint names each file by its absolute location), a forged file, another location."""
    problems = []
    root = base.uri + "/"
    for path in state_paths(state):
        inside = path[len(root) :] if path.startswith(root) else None
        if inside is None or ".." in inside or "passwd" in inside or "forged" in inside:
            problems.append(f"forged-applied: the state names {path[:120]!r}")
    uris = [u for u in state_uris(state) if u != base.uri]
    if uris:
        problems.append(f"forged-applied: the state holds a table at {uris[0][:120]!r}")
    return problems


def _versions(docs: list[dict[str, Any]]) -> tuple[list[int], bool]:
    """The versions of the documents delivered, and whether a table was dropped or replaced after
    one of its versions was (what a forged ``tableDropped``/``tableReplaced`` must never do: read
    before the table's events, it names a table the consumer does not know, and changes nothing)."""
    versions: list[int] = []
    dropped_known = False
    for doc in docs:
        if doc.get("kind") == "version":
            versions.append(doc["version"])
        elif versions:
            dropped_known = True
    return versions, dropped_known


def _lines(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(x) for x in stdout.splitlines() if x.strip()]


class Runner:
    """Cases over one mirrored table (``base``), on the session's broker."""

    def __init__(self, bootstrap: str, base: Base, workdir: Path, *, timeout_s: float = 120.0) -> None:
        self.bootstrap = bootstrap
        self.base = base
        self.workdir = workdir
        self.timeout_s = timeout_s
        self._feed_baseline: list[Any] | None = None
        self._spark_baseline: int | None = None
        self.spark: Any = None

    # --- one case ----------------------------------------------------------------------------

    def run_case(self, case: Case, consumers: tuple[str, ...] | None = None) -> list[Outcome]:
        actions, commits = case.build(self.base)
        topics = write_case(
            self.bootstrap,
            self.base,
            actions=actions,
            commits=commits,
            config={"max.message.bytes": "2000000"},
        )
        out = []
        for consumer in case.expect:
            if consumers is not None and consumer not in consumers:
                continue
            if consumer == "spark" and self.spark is None:
                continue
            start = time.perf_counter()
            if consumer == "consume-snapshot" and "rss" in case.tags:
                outcome = self._consume_snapshot_process(case, topics)
            else:
                run = {
                    "consume-snapshot": self._consume_snapshot,
                    "invalidate": self._invalidate,
                    "mirror-feed": self._mirror_feed,
                    "spark": self._spark,
                }[consumer]
                outcome = run(case, topics)
            outcome.seconds = time.perf_counter() - start
            if outcome.outcome not in outcome.expected:
                outcome.failures.insert(
                    0,
                    f"unexpected: {outcome.outcome} (expected {'/'.join(sorted(outcome.expected))}) {outcome.detail}",
                )
            out.append(outcome)
        return out

    # --- the CLI consumers -----------------------------------------------------------------------

    def _judge_cli(
        self, case: Case, consumer: str, result: Result, versions: list[int], topics: Topics
    ) -> Outcome:
        base = self.base
        if result.exit is None:
            kind = "timeout" if result.timed_out else "traceback"
            return Outcome(case, consumer, kind, detail=(result.error + " " + result.tb[-600:]).strip())
        lines = result.stderr.strip().splitlines()
        if result.exit == 2:
            outcome = Outcome(case, consumer, "refused", detail=lines[-1][:300] if lines else "")
            if len(lines) != 1:
                outcome.failures.append(
                    f"bad-refusal: {len(lines)} lines on stderr: {result.stderr[-300:]!r}"
                )
            elif not (
                any(f"topic={t}," in lines[0] for t in (topics.actions, topics.commits))
                and "partition=" in lines[0]
                and "offset=" in lines[0]
            ):
                outcome.failures.append(
                    f"bad-refusal: topic, partition and offset not named: {lines[0][:300]}"
                )
            elif len(lines[0]) > 2000:
                outcome.failures.append(f"bad-refusal: a line of {len(lines[0])} characters")
            # the records read before it are delivered: all of the actions topic's before a refused
            # actions record (forged records come after the base's), a prefix of them for a refused
            # commits-topic record (Kafka orders nothing across topics)
            on_commits = (
                bool(lines) and f"topic={topics.commits}," in lines[0]
            ) or "cross-topic" in case.tags
            delivered = (
                versions == base.versions[: len(versions)] if on_commits else versions == base.versions
            )
            if not delivered:
                outcome.failures.append(
                    f"lost-versions: delivered {versions}, expected {base.versions} first"
                )
            return outcome
        if result.exit == 0:
            if versions == base.versions:
                kind = "skipped" if "skipped" in case.expect[consumer] else "unchanged"
                return Outcome(case, consumer, kind)
            forged = list(range(base.last_version + 1, base.last_version + 1 + case.adds_versions))
            if case.adds_versions and versions == [*base.versions, *forged]:
                return Outcome(case, consumer, "accepted")
            return Outcome(case, consumer, "applied", detail=f"delivered versions {versions}")
        return Outcome(case, consumer, f"exit-{result.exit}", detail=result.stderr[-300:])

    def _consume_snapshot(self, case: Case, topics: Topics) -> Outcome:
        state = Path(tempfile.mkdtemp(prefix="state-", dir=self.workdir))
        argv = consume_snapshot_argv(self.bootstrap, topics, state)
        result = run_command("consume-snapshot", argv, "", {}, None, self.workdir, self.timeout_s)
        versions, dropped_known = _versions(_lines(result.stdout.decode()))
        outcome = self._judge_cli(case, "consume-snapshot", result, versions, topics)
        if dropped_known:
            outcome.failures.append("forged-applied: a table was dropped or replaced after its versions")
        if outcome.outcome != "accepted":
            outcome.failures += _forged_in_state(self.base, state)
        return outcome

    def _invalidate(self, case: Case, topics: Topics) -> Outcome:
        state = Path(tempfile.mkdtemp(prefix="inv-", dir=self.workdir))
        with _receiver() as receiver:
            argv = [
                "invalidate",
                "--bootstrap-servers",
                self.bootstrap,
                "--topic",
                topics.actions,
                "--commits-topic",
                topics.commits,
                "--once",
                "--state-dir",
                str(state),
                "--group-id",
                f"forge-{uuid.uuid4().hex[:8]}",
                "--webhook",
                receiver.url,
            ]
            result = run_command("invalidate", argv, "", {}, None, self.workdir, self.timeout_s)
            docs = list(receiver.docs)
        versions, dropped_known = _versions(docs)
        outcome = self._judge_cli(case, "invalidate", result, versions, topics)
        if dropped_known:
            outcome.failures.append("forged-applied: a table was dropped or replaced after its versions")
        for doc in docs:
            if doc.get("kind") == "version" and (
                doc.get("tableUri") != self.base.uri or doc.get("tableId") != self.base.table_id
            ):
                outcome.failures.append(
                    f"forged-applied: a document of {doc.get('tableId')!r} at {doc.get('tableUri')!r}"
                )
                break
        return outcome

    def _consume_snapshot_process(self, case: Case, topics: Topics) -> Outcome:
        """``consume-snapshot`` as a process of its own: exit, stderr and its peak RSS."""
        state = Path(tempfile.mkdtemp(prefix="flood-", dir=self.workdir))
        argv = consume_snapshot_argv(self.bootstrap, topics, state)
        rss, code, stderr, stdout = peak_rss(
            [
                sys.executable,
                "-c",
                "import sys; from deltamirror.cli.main import main; sys.exit(main())",
                *argv,
            ],
            self.timeout_s,
        )
        lines = stderr.strip().splitlines()
        versions, _ = _versions(_lines(stdout))
        if code == 2 and len(lines) == 1 and "offset=" in lines[0]:
            outcome = Outcome(case, "consume-snapshot", "refused", detail=lines[0][:300], rss_mb=rss)
            # a flood of new tables is taken up to the limit (each a table as any other), then refused
            if versions[: len(self.base.versions)] != self.base.versions:
                outcome.failures.append(f"lost-versions: delivered {versions[:20]}...")
        else:
            outcome = Outcome(case, "consume-snapshot", f"exit-{code}", detail=stderr[-300:], rss_mb=rss)
        return outcome

    # --- the change feed read from the mirror ------------------------------------------------------

    def _feed(self, topics: Topics) -> list[Any]:
        from deltamirror.consumer.mirror_changes import MirrorIndex, MirrorSettings, read_mirror_versions

        settings = MirrorSettings(
            self.bootstrap, topics.actions, topics.commits, str(self.base.table), idle_timeout_s=30
        )
        index = MirrorIndex(settings)
        index.refresh()
        got: list[Any] = []
        if index.latest is not None:  # the versions before a refused record are read first
            assert index.table_id is not None and index.first is not None
            versions = read_mirror_versions(
                settings,
                table_id=index.table_id,
                partition=index.actions_partition(),
                start=index.first,
                end=index.latest,
                start_timestamp_ms=index.timestamp(index.first),
            )
            got = [(v.version, v.timestamp_ms, json.dumps(list(v.actions), sort_keys=True)) for v in versions]
        if index.refused is not None:
            raise index.refused
        return got

    def _mirror_feed(self, case: Case, topics: Topics) -> Outcome:
        from deltamirror.core.errors import DeltaMirrorError
        from deltamirror.mirror.boundary import BadRecordError
        from deltamirror.mirror.errors import EventStreamError

        if self._feed_baseline is None:
            self._feed_baseline = self._feed(write_case(self.bootstrap, self.base))
        try:
            got = self._feed(topics)
        except BadRecordError as exc:
            outcome = Outcome(case, "mirror-feed", "refused", detail=str(exc)[:300])
            if "offset=" not in str(exc) or "topic=" not in str(exc):
                outcome.failures.append(f"bad-refusal: topic and offset not named: {str(exc)[:300]}")
            return outcome
        except EventStreamError as exc:  # the versions announced are not there whole: refused too
            return Outcome(case, "mirror-feed", "refused", detail=str(exc)[:300])
        except DeltaMirrorError as exc:
            return Outcome(case, "mirror-feed", f"error-{type(exc).__name__}", detail=str(exc)[:300])
        except Exception as exc:
            return Outcome(case, "mirror-feed", "traceback", detail=f"{type(exc).__name__}: {str(exc)[:300]}")
        if got == self._feed_baseline:
            return Outcome(
                case, "mirror-feed", "skipped" if "skipped" in case.expect["mirror-feed"] else "unchanged"
            )
        if case.adds_versions and got[: len(self._feed_baseline)] == self._feed_baseline:
            return Outcome(case, "mirror-feed", "accepted")
        return Outcome(case, "mirror-feed", "applied", detail=str(got[len(self._feed_baseline) :])[:300])

    # --- the Spark source ----------------------------------------------------------------------------

    def _spark_rows(self, topics: Topics) -> tuple[int, str | None]:
        """Rows the stream delivered, and the query's error (None when it ended well)."""
        rows = [0]

        def collect(df: Any, _id: int) -> None:
            rows[0] += df.count()

        stream = (
            self.spark.readStream.format("deltamirror")
            .option("kafka.bootstrap.servers", self.bootstrap)
            .option("actionsTopic", topics.actions)
            .option("commitsTopic", topics.commits)
            .option("startingVersion", "0")
            .option("maxFilesPerTrigger", "1")
            .load(str(self.base.table))
        )
        checkpoint = tempfile.mkdtemp(prefix="spark-", dir=self.workdir)
        query = stream.writeStream.foreachBatch(collect).option("checkpointLocation", checkpoint)
        started = query.trigger(availableNow=True).start()
        try:
            started.awaitTermination()
        except Exception as exc:  # pyspark raises the query's error here
            return rows[0], str(exc)
        error = started.exception()
        return rows[0], None if error is None else str(error)

    def _spark(self, case: Case, topics: Topics) -> Outcome:
        if self._spark_baseline is None:
            rows, error = self._spark_rows(write_case(self.bootstrap, self.base))
            assert error is None, error
            self._spark_baseline = rows
        rows, error = self._spark_rows(topics)
        if error is not None:
            outcome = Outcome(
                case,
                "spark",
                "refused" if "BadRecordError" in error or "offset=" in error else "failed",
                detail=error[-300:],
            )
            if rows != self._spark_baseline:
                outcome.failures.append(
                    f"lost-versions: {rows} rows delivered before it, {self._spark_baseline} expected"
                )
            return outcome
        if rows == self._spark_baseline:
            return Outcome(case, "spark", "skipped" if "skipped" in case.expect["spark"] else "unchanged")
        return Outcome(
            case, "spark", "applied", detail=f"{rows} rows, {self._spark_baseline} without the record"
        )


def peak_rss(
    argv: list[str], timeout_s: float, env: dict[str, str] | None = None
) -> tuple[float, int, str, str]:
    """(peak RSS in MB, exit code, stderr, stdout) of a process run through a one-child wrapper
    (getrusage of its children is that process's alone)."""
    wrapper = (
        "import resource, subprocess, sys\n"
        "r = subprocess.run(sys.argv[1:], capture_output=True)\n"
        "sys.stdout.buffer.write(r.stdout); sys.stderr.buffer.write(r.stderr)\n"
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr)\n"
        "sys.exit(r.returncode)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", wrapper, *argv],
        capture_output=True,
        timeout=timeout_s,
        env={**os.environ, **(env or {})},
    )
    stderr = done.stderr.decode("utf-8", "replace")
    *lines, rss_kb = stderr.rstrip("\n").split("\n")
    return int(rss_kb) / 1024, done.returncode, "\n".join(lines), done.stdout.decode("utf-8", "replace")


def signal_flood(
    bootstrap: str,
    table: Path,
    workdir: Path,
    *,
    signals: int = 400,
    uri_bytes: int = 900_000,
    env: dict[str, str] | None = None,
    settle_s: float = 120.0,
) -> dict[str, float]:
    """A ``watch`` process on ``table`` with a signal topic, then ``signals`` records with a
    ``uri_bytes`` tableUri for tables not running there, written with a plain producer: the
    watcher's peak RSS (before and after), and what it wrote to stderr. The signals are read once
    the watcher's stderr stops growing (at most ``settle_s``)."""
    import yaml
    from confluent_kafka import Producer

    name = f"sigflood-{uuid.uuid4().hex[:8]}"
    config = workdir / f"{name}.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "kafka": {"bootstrap_servers": bootstrap},
                "tables": [
                    {
                        "uri": str(table),
                        "poll_interval_s": 0.5,
                        "actions_topic": f"{name}.actions",
                        "commits_topic": f"{name}.commits",
                    }
                ],
                "signal_topic": f"{name}.signals",
                "progress_topic": f"{name}.progress",
                "transactional_id_prefix": name,
            }
        )
    )
    # a topic that takes large records (one the watcher creates refuses them at the broker): what
    # the listener itself does with them is measured
    from support.kafka import new_topic

    new_topic(bootstrap, f"{name}.signals", config={"max.message.bytes": "2000000"})
    err_path = workdir / f"{name}.stderr"
    with open(err_path, "wb") as err:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import sys; from deltamirror.cli.main import main; sys.exit(main())",
                "watch",
                "--config",
                str(config),
            ],
            stdout=subprocess.DEVNULL,
            stderr=err,
            env={**os.environ, **(env or {})},
        )
    try:
        from support.watching import published_version

        deadline = time.monotonic() + 120
        while published_version(bootstrap, f"{name}.commits") < 0:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"the watcher did not start: {err_path.read_text()[-2000:]}")
            time.sleep(0.5)
        time.sleep(2.0)  # the listener reads the signal topic from its start: only later signals count
        before = _vm_hwm(proc.pid)
        start_err = err_path.stat().st_size
        producer = Producer({"bootstrap.servers": bootstrap, "message.max.bytes": 2_000_000, "linger.ms": 5})
        requested = int(time.time() * 1000) + 1000
        for i in range(signals):
            uri = "file:///" + "x" * uri_bytes + f"/{i}"
            value = json.dumps({"kind": "snapshot", "tableUri": uri, "id": f"s{i}", "requestedAt": requested})
            producer.produce(f"{name}.signals", value.encode(), uri[-32:].encode())
            producer.poll(0)
        producer.flush(120)
        last, stable_since, deadline = -1, time.monotonic(), time.monotonic() + settle_s
        while time.monotonic() < deadline and time.monotonic() - stable_since < 5.0:
            size = err_path.stat().st_size
            if size != last:
                last, stable_since = size, time.monotonic()
            time.sleep(0.5)
        return {
            "rss_before_mb": before,
            "rss_peak_mb": _vm_hwm(proc.pid),
            "stderr_mb": (err_path.stat().st_size - start_err) / 1e6,
        }
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def _vm_hwm(pid: int) -> float:
    """Peak resident set of a running process, MB (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


__all__ = ["Outcome", "Runner", "peak_rss", "signal_flood"]
