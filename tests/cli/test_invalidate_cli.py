"""``deltamirror invalidate`` and ``consume-snapshot --format jsonl`` against the real broker.

One table (3 versions: WRITE, MERGE, DELETE on a partitioned table) is mirrored once by the real
watcher; each test reads it with its own consumer group, into a real local HTTP server or a real
command, with failures injected: every version is delivered at least once, in order, none skipped,
and a restart delivers from the first version not acknowledged.
"""

from __future__ import annotations

import json
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from deltamirror.producer.publishing.offline_events import iter_event_values
from support.kafka import new_topic
from support.tables import copy_table
from support.watching import watch_until

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(120)]

TABLE_ID = "krs__cdf-table-partitioned"


class Mirrored:
    def __init__(self, bootstrap: str, actions: str, table: Path) -> None:
        self.bootstrap = bootstrap
        self.actions = actions
        self.table = table
        events = [json.loads(v) for v in iter_event_values(str(table))]
        self.table_id = events[0]["tableId"]
        self.commit_timestamps = {e["version"]: e["commitTimestamp"] for e in events}
        self.expected = _log_versions(table)


def _log_versions(table: Path) -> dict[int, dict[str, Any]]:
    """Operation, paths and partitions of each commit, read here from the log's JSON lines."""
    out: dict[int, dict[str, Any]] = {}
    for path in sorted((table / "_delta_log").glob("*.json")):
        actions = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        adds = [a["add"] for a in actions if "add" in a]
        removes = [a["remove"] for a in actions if "remove" in a]
        out[int(path.stem)] = {
            "operation": next(a["commitInfo"]["operation"] for a in actions if "commitInfo" in a),
            "added": sorted(a["path"] for a in adds),
            "removed": sorted(r["path"] for r in removes),
            "partitions": sorted({json.dumps(f["partitionValues"], sort_keys=True) for f in adds + removes}),
        }
    return out


@pytest.fixture(scope="module")
def mirrored(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Mirrored:
    table = copy_table(TABLE_ID, tmp_path_factory.mktemp("invalidate"))
    name = f"dminv-{uuid.uuid4().hex[:10]}"
    actions = f"{name}.actions"
    # every version its own document (no initial snapshot)
    watch_until(kafka_bootstrap, table, actions, 2, name, snapshot_mode="from-version", from_version=0)
    return Mirrored(kafka_bootstrap, actions, table)


def _check_document(doc: dict[str, Any], m: Mirrored) -> None:
    want = m.expected[doc["version"]]
    assert doc["kind"] == "version" and doc["tableId"] == m.table_id and not doc["snapshot"]
    assert doc["tableUri"].startswith("file://") and doc["tableUri"].rstrip("/").endswith(TABLE_ID)
    assert doc["commitTimestamp"] == m.commit_timestamps[doc["version"]]
    assert doc["operation"] == want["operation"]
    assert sorted(doc["added"]) == want["added"] and sorted(doc["removed"]) == want["removed"]
    assert sorted(json.dumps(p, sort_keys=True) for p in doc["partitions"]) == want["partitions"]
    assert not doc["truncated"]


def _cli(m: Mirrored, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "deltamirror.cli.main", *args, "--bootstrap-servers", m.bootstrap],
        capture_output=True,
        timeout=timeout,
    )


def _invalidate(m: Mirrored, group: str, *args: str) -> subprocess.CompletedProcess[bytes]:
    return _cli(
        m, "invalidate", "--topic", m.actions, "--group-id", group, "--once", "--backoff", "0.05", *args
    )


def _lines(done: subprocess.CompletedProcess[bytes]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in done.stdout.splitlines() if line]


# --- a real HTTP endpoint -------------------------------------------------------------------------------


class Receiver:
    """A local HTTP server: each POST gets the next status scripted for its version (then 200)."""

    def __init__(self) -> None:
        self.script: dict[int, list[int]] = {}
        self.always: int | None = None
        self.requests: list[tuple[int, dict[str, Any]]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                doc = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                planned = receiver.script.get(doc.get("version"), [])
                status = receiver.always or (planned.pop(0) if planned else 200)
                receiver.requests.append((status, doc))
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/invalidate"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def versions(self, status: int | None = None) -> list[int]:
        return [d["version"] for s, d in self.requests if status is None or s == status]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.server.shutdown()
    r.server.server_close()


def test_a_webhook_failing_twice_gets_every_version_in_order_and_a_rerun_nothing(
    mirrored: Mirrored, receiver: Receiver
) -> None:
    receiver.script = {1: [500, 500]}
    group = f"g-{uuid.uuid4().hex[:8]}"
    done = _invalidate(mirrored, group, "--webhook", receiver.url)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert receiver.versions() == [0, 1, 1, 1, 2]
    assert receiver.versions(200) == [0, 1, 2]
    for _, doc in receiver.requests:
        _check_document(doc, mirrored)
    assert [(line["version"], line["attempts"], line["outcome"]) for line in _lines(done)] == [
        (0, 1, "delivered"),
        (1, 3, "delivered"),
        (2, 1, "delivered"),
    ]
    assert b"HTTP 500" in done.stderr  # each failed attempt is said, then retried

    # the group acknowledged all three: a rerun delivers nothing
    again = _invalidate(mirrored, group, "--webhook", receiver.url)
    assert again.returncode == 0, again.stderr.decode()[-2000:]
    assert len(receiver.requests) == 5 and _lines(again) == []

    # consume-snapshot --format jsonl prints the same documents (from the topic's beginning)
    printed = _cli(mirrored, "consume-snapshot", "--topic", mirrored.actions, "--once", "--format", "jsonl")
    assert printed.returncode == 0, printed.stderr.decode()[-2000:]
    assert _lines(printed) == [doc for status, doc in receiver.requests if status == 200]


# --- a real command ---------------------------------------------------------------------------------------

SCRIPT = """\
import json, os, sys
log, mode = sys.argv[1], sys.argv[2]
doc = json.load(sys.stdin)
seen = os.path.exists(log) and any(json.loads(l)["doc"] == doc for l in open(log))
fail = mode == "always" or (mode == "once-at-1" and doc["version"] == 1 and not seen) or (
    mode == "from-1" and doc["version"] >= 1)
env = {k: v for k, v in os.environ.items() if k.startswith("DELTAMIRROR_")}
with open(log, "a") as f:
    f.write(json.dumps({"doc": doc, "env": env, "failed": fail}) + "\\n")
if fail:
    print("cache refused version", doc["version"], file=sys.stderr)
sys.exit(1 if fail else 0)
"""


def _command(tmp_path: Path, mode: str, log: Path) -> str:
    script = tmp_path / "receiver.py"
    script.write_text(SCRIPT)
    return shlex.join([sys.executable, str(script), str(log), mode])


def _received(log: Path) -> list[tuple[int, bool]]:
    return [(e["doc"]["version"], e["failed"]) for e in map(json.loads, log.read_text().splitlines())]


def test_a_command_exiting_1_then_0_gets_each_version_on_stdin_in_order(
    mirrored: Mirrored, tmp_path: Path
) -> None:
    log = tmp_path / "got.jsonl"
    done = _invalidate(mirrored, f"g-{uuid.uuid4().hex[:8]}", "--exec", _command(tmp_path, "once-at-1", log))
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert _received(log) == [(0, False), (1, True), (1, False), (2, False)]
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    for entry in entries:
        _check_document(entry["doc"], mirrored)
        env = entry["env"]
        assert env["DELTAMIRROR_TABLE_ID"] == mirrored.table_id
        assert env["DELTAMIRROR_VERSION"] == str(entry["doc"]["version"])
        assert env["DELTAMIRROR_TABLE"] == entry["doc"]["tableUri"]
    assert [e["env"]["DELTAMIRROR_ATTEMPT"] for e in entries] == ["1", "1", "2", "1"]
    assert b"cache refused version 1" in done.stderr


def test_given_up_without_a_dead_letter_topic_exits_1_and_a_restart_resumes_at_that_version(
    mirrored: Mirrored, tmp_path: Path
) -> None:
    group, log = f"g-{uuid.uuid4().hex[:8]}", tmp_path / "got.jsonl"
    failing = _command(tmp_path, "from-1", log)
    done = _invalidate(mirrored, group, "--exec", failing, "--max-attempts", "2")
    assert done.returncode == 1, done.stderr.decode()[-2000:]
    assert _received(log) == [(0, False), (1, True), (1, True)]
    error = done.stderr.decode().strip().splitlines()[-1]
    assert error.startswith("deltamirror: error: version 1 of table") and "after 2 attempts" in error
    assert [line["version"] for line in _lines(done)] == [0]

    # the receiver is fixed: the restart starts at version 1 (version 0 was acknowledged)
    log.unlink()
    done = _invalidate(mirrored, group, "--exec", _command(tmp_path, "ok", log))
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert _received(log) == [(1, False), (2, False)]


def test_given_up_with_a_dead_letter_topic_each_version_is_a_record_there_and_secrets_stay_hidden(
    mirrored: Mirrored, receiver: Receiver
) -> None:
    from confluent_kafka import Consumer, TopicPartition

    receiver.always = 500
    dlt = new_topic(mirrored.bootstrap, f"dminv-dlt-{uuid.uuid4().hex[:8]}")
    group = f"g-{uuid.uuid4().hex[:8]}"
    url = receiver.url.replace("http://", "http://alice:hunter2@") + "?token=hunter3"
    args = ("--webhook", url, "--header", "Authorization: Bearer hunter4", "--dead-letter-topic", dlt)
    done = _invalidate(mirrored, group, *args, "--max-attempts", "2")
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert receiver.versions() == [0, 0, 1, 1, 2, 2]
    assert [(line["version"], line["outcome"]) for line in _lines(done)] == [
        (0, "deadLettered"),
        (1, "deadLettered"),
        (2, "deadLettered"),
    ]
    assert b"hunter" not in done.stdout + done.stderr

    reader = Consumer({"bootstrap.servers": mirrored.bootstrap, "group.id": f"r-{uuid.uuid4().hex[:8]}"})
    try:
        reader.assign([TopicPartition(dlt, 0, 0)])
        letters: list[Any] = []
        deadline = time.monotonic() + 20
        while len(letters) < 3 and time.monotonic() < deadline:
            letters.extend(m for m in reader.consume(10, timeout=1.0) if m.error() is None)
    finally:
        reader.close()
    values = [json.loads(m.value()) for m in letters]
    assert [v["payload"]["version"] for v in values] == [0, 1, 2]
    assert [m.key() for m in letters] == [mirrored.table_id.encode()] * 3
    for value in values:
        _check_document(value["payload"], mirrored)
        assert value["attempts"] == 2 and value["error"].startswith("HTTP 500")
    assert b"hunter" not in b"".join(m.value() for m in letters)

    # dead-lettered counts as handled: a rerun of the group offers nothing
    receiver.always = None
    again = _invalidate(mirrored, group, *args)
    assert again.returncode == 0 and _lines(again) == [] and len(receiver.requests) == 6


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def test_sigterm_stops_a_running_invalidator_cleanly_with_its_deliveries_acknowledged(
    mirrored: Mirrored, receiver: Receiver
) -> None:
    group, port = f"g-{uuid.uuid4().hex[:8]}", _free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "deltamirror.cli.main",
            "invalidate",
            "--bootstrap-servers",
            mirrored.bootstrap,
            "--topic",
            mirrored.actions,
            "--group-id",
            group,
            "--webhook",
            receiver.url,
            "--metrics-port",
            str(port),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 40
        while len(receiver.requests) < 3 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        assert receiver.versions() == [0, 1, 2]
        # the consumer's /healthz and /metrics, with the deliveries counted
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as health:
            assert health.status == 200 and json.loads(health.read())["status"] == "ok"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as scraped:
            text = scraped.read().decode()
        assert 'deltamirror_consumer_deliveries_total{outcome="delivered"} 3.0' in text
        assert "deltamirror_consumer_versions_applied_total" in text
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err.decode()[-2000:]
    assert [json.loads(line)["version"] for line in out.splitlines()] == [0, 1, 2]
    again = _invalidate(mirrored, group, "--webhook", receiver.url)
    assert again.returncode == 0 and _lines(again) == [] and len(receiver.requests) == 3


def test_invalidate_refuses_bad_flags_with_exit_2(mirrored: Mirrored, tmp_path: Path) -> None:
    missing = _invalidate(mirrored, "g", "--exec", str(tmp_path / "nope.sh"))
    assert missing.returncode == 2 and b"not an executable command" in missing.stderr
    header = _invalidate(mirrored, "g", "--webhook", "http://127.0.0.1:1/", "--header", "sekret-token")
    assert header.returncode == 2 and b"--header #1" in header.stderr and b"sekret" not in header.stderr
    neither = _invalidate(mirrored, "g")
    assert neither.returncode == 2 and b"one of the arguments --exec --webhook is required" in neither.stderr
    dlt = _invalidate(mirrored, "g", "--webhook", "http://127.0.0.1:1/", "--dead-letter-topic", "no.such.dlt")
    assert dlt.returncode == 2 and b"no.such.dlt" in dlt.stderr


def _readme_script() -> str:
    """The README's worked example ("Invalidating a cache"), as the README has it."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    start = readme.index("#!/bin/sh\n# drop-cached.sh")
    return readme[start : readme.index("```", start)]


def test_the_readmes_shell_example_drops_the_touched_partitions_only(
    mirrored: Mirrored, tmp_path: Path
) -> None:
    import os

    script = tmp_path / "drop-cached.sh"
    script.write_text(_readme_script())
    script.chmod(0o755)
    cache = tmp_path / "cache"
    for part in ("part=0", "part=1", "part=2"):
        (cache / part).mkdir(parents=True)
        (cache / part / "result.json").write_text("{}")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "deltamirror.cli.main",
            "invalidate",
            "--bootstrap-servers",
            mirrored.bootstrap,
            "--topic",
            mirrored.actions,
            "--group-id",
            f"g-{uuid.uuid4().hex[:8]}",
            "--once",
            "--exec",
            str(script),
        ],
        capture_output=True,
        timeout=60,
        env={**os.environ, "CACHE": str(cache)},
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert [line["version"] for line in _lines(done)] == [0, 1, 2]
    assert sorted(p.name for p in cache.iterdir()) == ["part=2"]  # never touched: still cached


@pytest.mark.parametrize("failure", ["refused", "stopped"])
def test_with_a_state_dir_nothing_is_saved_past_a_version_not_delivered(
    mirrored: Mirrored, tmp_path: Path, failure: str
) -> None:
    """The library with a state directory: saved after each version, never past the one that
    failed (refused: the run raises) or whose delivery a stop interrupted (the run returns)."""
    from deltamirror.consumer.invalidate import InvalidationConsumer, InvalidationDeliveryError
    from deltamirror.mirror.errors import StopRequested

    group, state_dir = f"g-{uuid.uuid4().hex[:8]}", tmp_path / "state"
    got: list[int] = []

    def fail_at_2(doc: dict[str, Any]) -> None:
        if doc["version"] == 2:
            raise InvalidationDeliveryError("refused") if failure == "refused" else StopRequested("stop")
        got.append(doc["version"])

    options: dict[str, Any] = {
        "group_id": group,
        "state_dir": state_dir,
        "batch_size": 1,  # a checkpoint per record: a save after each version
        "checkpoint_interval_versions": 1,
    }
    first = InvalidationConsumer(mirrored.bootstrap, mirrored.actions, on_payload=fail_at_2, **options)
    if failure == "refused":
        with pytest.raises(InvalidationDeliveryError):
            first.run(once=True)
    else:
        first.run(once=True)  # the loop's end checkpoints and saves: here, nothing
    assert got == [0, 1] and first.saves >= 2

    again: list[int] = []
    second = InvalidationConsumer(
        mirrored.bootstrap, mirrored.actions, on_payload=lambda d: again.append(d["version"]), **options
    )
    assert second.tables[mirrored.table_id].version == 1  # the saved state stops before version 2
    second.run(once=True)
    assert again == [2]


# --- where a start begins: the state directory and the consumer group -------------------------------------


def _run(m: Mirrored, command: str, *args: str) -> subprocess.CompletedProcess[bytes]:
    return _cli(m, command, "--topic", m.actions, "--once", *args)


def test_a_new_state_dir_gets_every_version_whatever_the_default_group_acknowledged(
    mirrored: Mirrored, receiver: Receiver, tmp_path: Path
) -> None:
    """A new --state-dir with the default group delivered nothing and exited 0 once that group had
    committed offsets: a new state is a new consumer, with a group of its own."""
    stateless = _run(mirrored, "invalidate", "--webhook", receiver.url, "--backoff", "0.05")
    assert stateless.returncode == 0, stateless.stderr.decode()[-2000:]
    assert receiver.versions() == [0, 1, 2]  # the default group acknowledged them all

    state = tmp_path / "state"
    first = _run(mirrored, "invalidate", "--webhook", receiver.url, "--state-dir", str(state))
    assert first.returncode == 0, first.stderr.decode()[-2000:]
    assert [line["version"] for line in _lines(first)] == [0, 1, 2]
    assert receiver.versions() == [0, 1, 2, 0, 1, 2]
    group = json.loads((state / "offsets.json").read_text())["groupId"]
    assert group.startswith("deltamirror-invalidate-")

    # the same state again: its own group acknowledged everything
    again = _run(mirrored, "invalidate", "--webhook", receiver.url, "--state-dir", str(state))
    assert again.returncode == 0 and _lines(again) == [], again.stderr.decode()[-2000:]
    named = _run(
        mirrored, "invalidate", "--webhook", receiver.url, "--state-dir", str(state), "--group-id", group
    )
    assert named.returncode == 0 and _lines(named) == [], named.stderr.decode()[-2000:]

    # another group with this state: refused by name, before anything is delivered
    other = _run(
        mirrored, "invalidate", "--webhook", receiver.url, "--state-dir", str(state), "--group-id", "another"
    )
    assert other.returncode == 2, other.stderr.decode()
    assert f"holds what consumer group {group} consumed, not group another" in other.stderr.decode()
    assert len(receiver.requests) == 6


def test_a_start_without_a_position_of_its_own_says_what_the_group_acknowledged(
    mirrored: Mirrored, receiver: Receiver
) -> None:
    group = f"g-{uuid.uuid4().hex[:8]}"
    assert _invalidate(mirrored, group, "--webhook", receiver.url).returncode == 0
    again = _invalidate(mirrored, group, "--webhook", receiver.url)
    assert again.returncode == 0 and _lines(again) == []
    said = again.stderr.decode()
    assert f"consumer group {group} acknowledged {mirrored.actions}[0] up to offset" in said
    assert "a new receiver needs a consumer group of its own" in said


def test_consume_snapshot_starts_from_its_state_never_from_the_groups_offsets(
    mirrored: Mirrored, tmp_path: Path
) -> None:
    """The group's committed offsets only show lag: a new state reads the topic from its
    beginning, whatever the group committed; and a state refuses another group."""
    group = f"g-{uuid.uuid4().hex[:8]}"
    first = _run(mirrored, "consume-snapshot", "--group-id", group)
    assert first.returncode == 0 and [line["version"] for line in _lines(first)] == [0, 1, 2]
    state = tmp_path / "state"
    fresh = _run(mirrored, "consume-snapshot", "--group-id", group, "--state-dir", str(state))
    assert fresh.returncode == 0, fresh.stderr.decode()[-2000:]
    assert [line["version"] for line in _lines(fresh)] == [0, 1, 2]
    assert json.loads((state / "offsets.json").read_text())["groupId"] == group
    restarted = _run(mirrored, "consume-snapshot", "--state-dir", str(state))  # the group it records
    assert restarted.returncode == 0 and _lines(restarted) == [], restarted.stderr.decode()[-2000:]
    other = _run(mirrored, "consume-snapshot", "--group-id", "another", "--state-dir", str(state))
    assert other.returncode == 2 and f"consumer group {group}" in other.stderr.decode()


def test_invalidate_refuses_the_state_dir_of_consume_snapshot(
    mirrored: Mirrored, receiver: Receiver, tmp_path: Path
) -> None:
    """invalidate over consume-snapshot's --state-dir took its group and position: exit 0 and
    nothing delivered (F2 of the 2026-11-30 audit). Each command's directory is its own."""
    state = tmp_path / "state"
    read = _run(mirrored, "consume-snapshot", "--state-dir", str(state))
    assert read.returncode == 0 and [line["version"] for line in _lines(read)] == [0, 1, 2]
    taken = _run(mirrored, "invalidate", "--webhook", receiver.url, "--state-dir", str(state))
    assert taken.returncode == 2, taken.stderr.decode()[-2000:]
    said = taken.stderr.decode()
    assert f"state directory {state} is the state of consume-snapshot, not invalidate" in said, said
    assert len(said.splitlines()) == 1 and receiver.requests == []
    own = _run(mirrored, "invalidate", "--webhook", receiver.url, "--state-dir", str(tmp_path / "own"))
    assert own.returncode == 0 and receiver.versions() == [0, 1, 2], own.stderr.decode()[-2000:]


def test_a_state_dir_written_before_groups_were_recorded_takes_the_group_it_was_used_with(
    mirrored: Mirrored, receiver: Receiver, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    group = f"g-{uuid.uuid4().hex[:8]}"
    done = _invalidate(mirrored, group, "--webhook", receiver.url, "--state-dir", str(state))
    assert done.returncode == 0 and receiver.versions() == [0, 1, 2]
    offsets = json.loads((state / "offsets.json").read_text())
    del offsets["groupId"]  # as an older deltamirror wrote it
    (state / "offsets.json").write_text(json.dumps(offsets))
    again = _invalidate(mirrored, group, "--webhook", receiver.url, "--state-dir", str(state))
    assert again.returncode == 0 and _lines(again) == []
    assert json.loads((state / "offsets.json").read_text())["groupId"] == group


def test_the_line_of_a_dropped_tables_document_is_printed() -> None:
    """A tableDropped document has no previousTableId: its outcome line once raised a KeyError."""
    from deltamirror.cli.consumer_cmds import _outcome_line
    from deltamirror.consumer.invalidate import Outcome, replacement_payload
    from deltamirror.consumer.snapshot import TableReplacement

    notice = TableReplacement("file:///t", "id-1", "id-1", 4, "gone", None, 0, dropped=True)
    line = _outcome_line(Outcome(replacement_payload(notice), 1))
    assert line == {
        "kind": "tableDropped",
        "tableId": "id-1",
        "lastVersion": 4,
        "attempts": 1,
        "outcome": "delivered",
    }
