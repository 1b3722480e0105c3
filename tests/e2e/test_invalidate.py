"""Invalidation documents, retries, a real HTTP endpoint and a real command; no broker here.

The broker side (offsets after delivery, restarts, dead letters) is tests/cli/test_invalidate_cli.py.
"""

from __future__ import annotations

import base64
import json
import os
import shlex
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from deltamirror.consumer.invalidate import (
    DeadLetterTopic,
    DeliveryAttemptError,
    ExecTarget,
    InvalidationConsumer,
    InvalidationDeliveryError,
    Invalidator,
    Outcome,
    RetryPolicy,
    WebhookTarget,
    safe_url,
    version_payload,
)
from deltamirror.consumer.snapshot import IncrementalSnapshot
from deltamirror.core.errors import ConfigError
from deltamirror.mirror.errors import StopRequested
from deltamirror.mirror.kafka.consumer import Record
from deltamirror.producer.publishing.offline_events import iter_event_values
from support.tables import TABLES

TABLE = TABLES / "krs__cdf-table-partitioned"


def _log_versions(table: Path) -> dict[int, dict[str, Any]]:
    """What each commit file says, read here from the JSON lines: the expected side."""
    out: dict[int, dict[str, Any]] = {}
    for path in sorted((table / "_delta_log").glob("*.json")):
        actions = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        adds = [a["add"] for a in actions if "add" in a]
        removes = [a["remove"] for a in actions if "remove" in a]
        out[int(path.stem)] = {
            "operation": next(a["commitInfo"]["operation"] for a in actions if "commitInfo" in a),
            "added": [a["path"] for a in adds],
            "removed": [r["path"] for r in removes],
            "partitions": {json.dumps(f["partitionValues"], sort_keys=True) for f in adds + removes},
        }
    return out


def test_a_versions_document_names_its_files_partitions_operation_and_time() -> None:
    values = list(iter_event_values(str(TABLE)))
    events = [json.loads(v) for v in values]
    state = IncrementalSnapshot(events[0]["tableId"])
    expected = _log_versions(TABLE)
    for inv in state.apply_values(values):
        first = next(e for e in events if e["version"] == inv.version)
        doc = version_payload(
            inv,
            table_uri=state.table_uri,
            commit_timestamp=first["commitTimestamp"],
            operation=expected[inv.version]["operation"],
        )
        want = expected[inv.version]
        assert doc["kind"] == "version" and doc["tableId"] == first["tableId"]
        assert doc["tableUri"] == first["tableUri"] and doc["commitTimestamp"] == first["commitTimestamp"]
        assert doc["operation"] == want["operation"] and doc["snapshot"] is False
        assert sorted(doc["added"]) == sorted(want["added"]) and doc["addedCount"] == len(want["added"])
        assert sorted(doc["removed"]) == sorted(want["removed"])
        assert {json.dumps(p, sort_keys=True) for p in doc["partitions"]} == want["partitions"]
        assert not doc["truncated"] and json.loads(json.dumps(doc)) == doc  # JSON as it is


def test_long_lists_are_cut_and_flagged_with_their_full_length() -> None:
    values = list(iter_event_values(str(TABLE), ending_version=0))
    state = IncrementalSnapshot(json.loads(values[0])["tableId"])
    (inv,) = state.apply_values(values)
    doc = version_payload(inv, table_uri=None, commit_timestamp=1, operation="WRITE", max_items=1)
    assert len(doc["added"]) == 1 and doc["addedCount"] == 4 and doc["addedTruncated"]
    assert len(doc["partitions"]) == 1 and doc["partitionsCount"] == 2 and doc["partitionsTruncated"]
    assert doc["removed"] == [] and not doc["removedTruncated"] and doc["truncated"]


def test_retry_policy_defaults_double_from_half_a_second_up_to_the_cap() -> None:
    policy = RetryPolicy()
    assert policy.max_attempts == 5
    assert [policy.backoff_s(n) for n in range(1, 5)] == [0.5, 1.0, 2.0, 4.0]
    assert RetryPolicy(max_backoff_s=3).backoff_s(10) == 3
    assert policy.gives_up_after(5) and not policy.gives_up_after(4)
    assert not RetryPolicy(max_attempts=0).gives_up_after(10_000)
    with pytest.raises(ConfigError):
        RetryPolicy(max_attempts=-1)


def test_printed_urls_keep_no_userinfo_path_or_query_values() -> None:
    shown = safe_url("https://alice:s3cr3t@hooks.example.com:8443/services/T0/B0/XyZsecret?token=abc&x=1")
    assert shown == "https://***@hooks.example.com:8443/***?token=***&x=***"
    assert safe_url("http://[::1]:80/") == "http://[::1]:80/"
    with pytest.raises(ConfigError) as refused:
        WebhookTarget("ftp://bob:hunter2@example.com/x")
    assert "hunter2" not in str(refused.value)


# --- a real HTTP endpoint ---------------------------------------------------------------------------


class Receiver:
    """A local HTTP server answering each POST with the next scripted status (then 200)."""

    def __init__(self, statuses: list[int]) -> None:
        self.statuses = list(statuses)
        self.requests: list[tuple[int, dict[str, str], Any]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                status = receiver.statuses.pop(0) if receiver.statuses else 200
                receiver.requests.append(
                    (status, {k.lower(): v for k, v in self.headers.items()}, json.loads(body))
                )
                self.send_response(status)
                if 300 <= status < 400:
                    self.send_header("Location", "/elsewhere")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver([])
    yield r
    r.server.shutdown()
    r.server.server_close()


FAST = RetryPolicy(max_attempts=3, initial_backoff_s=0.01, max_backoff_s=0.02)
DOC = {"kind": "version", "tableId": "t-1", "tableUri": "file:///t", "version": 7, "snapshot": False}


def test_a_webhook_answering_500_twice_gets_the_document_a_third_time(receiver: Receiver) -> None:
    receiver.statuses = [500, 500]
    outcomes: list[Outcome] = []
    url = receiver.url.replace("http://", "http://user:p%40ss@")
    Invalidator(WebhookTarget(url, headers={"X-Token": "t0k"}), policy=FAST, on_outcome=outcomes.append)(DOC)
    assert [s for s, _, _ in receiver.requests] == [500, 500, 200]
    assert all(body == DOC for _, _, body in receiver.requests)
    _, headers, _ = receiver.requests[-1]
    assert headers["idempotency-key"] == "t-1:7" and headers["x-deltamirror-attempt"] == "3"
    assert headers["authorization"] == "Basic " + base64.b64encode(b"user:p@ss").decode()
    assert headers["x-token"] == "t0k" and headers["content-type"] == "application/json"
    assert outcomes == [Outcome(DOC, 3)]


def test_a_redirect_is_a_failure_not_a_get(receiver: Receiver) -> None:
    receiver.statuses = [307]
    with pytest.raises(DeliveryAttemptError, match="HTTP 307"):
        WebhookTarget(receiver.url).send(DOC, json.dumps(DOC).encode(), 1)


def test_given_up_without_a_dead_letter_topic_is_a_retryable_error_without_secrets(
    receiver: Receiver,
) -> None:
    receiver.statuses = [503] * 3
    url = receiver.url.replace("http://", "http://user:hunter2@") + "?token=hunter3"
    with pytest.raises(InvalidationDeliveryError) as failed:
        Invalidator(WebhookTarget(url), policy=FAST)(DOC)
    message = str(failed.value)
    assert failed.value.exit_code == 1 and "version 7 of table t-1" in message and "HTTP 503" in message
    assert "after 3 attempts" in message and "hunter" not in message
    assert len(receiver.requests) == 3


def test_given_up_with_a_dead_letter_topic_sends_the_document_and_the_error(receiver: Receiver) -> None:
    receiver.statuses = [500] * 3
    sent: list[tuple[str, bytes, bytes | None, Any]] = []

    class Producer:
        def send(self, topic: str, value: bytes, key: bytes | None = None, headers: Any = None) -> None:
            sent.append((topic, value, key, headers))

    outcome = Invalidator(
        WebhookTarget(receiver.url), policy=FAST, dead_letters=DeadLetterTopic(Producer(), "dlt")
    )(DOC)
    assert outcome.dead_lettered and outcome.attempts == 3
    ((topic, value, key, headers),) = sent
    letter = json.loads(value)
    assert topic == "dlt" and key == b"t-1" and ("version", b"7") in headers
    assert letter["payload"] == DOC and letter["attempts"] == 3 and letter["error"].startswith("HTTP 500")


def test_a_stop_ends_the_wait_between_attempts(receiver: Receiver) -> None:
    receiver.statuses = [500] * 10
    stop = threading.Event()
    invalidator = Invalidator(
        WebhookTarget(receiver.url), policy=RetryPolicy(max_attempts=0, initial_backoff_s=30), stop=stop
    )
    threading.Timer(0.3, stop.set).start()
    started = time.monotonic()
    with pytest.raises(StopRequested):
        invalidator(DOC)
    assert time.monotonic() - started < 5 and len(receiver.requests) == 1


# --- a real command -----------------------------------------------------------------------------------

SCRIPT = """\
import json, os, sys
log, mode = sys.argv[1], sys.argv[2]
doc = json.load(sys.stdin)
env = {k: v for k, v in os.environ.items() if k.startswith("DELTAMIRROR_")}
seen = os.path.exists(log) and any(json.loads(l)["doc"] == doc for l in open(log))
fail = mode == "always" or (mode == "once" and not seen)
with open(log, "a") as f:
    f.write(json.dumps({"doc": doc, "env": env, "failed": fail}) + "\\n")
if fail:
    print("could not drop the cache, password=hunter2", file=sys.stderr)
    sys.exit(1)
"""


def _command(tmp_path: Path, mode: str) -> tuple[str, Path]:
    script = tmp_path / "receiver.py"
    script.write_text(SCRIPT)
    log = tmp_path / "received.jsonl"
    return shlex.join([sys.executable, str(script), str(log), mode]), log


def _received(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_a_command_exiting_1_then_0_gets_the_document_on_stdin_twice(tmp_path: Path) -> None:
    command, log = _command(tmp_path, "once")
    outcome = Invalidator(ExecTarget.from_command_line(command), policy=FAST)(DOC)
    first, second = _received(log)
    assert (first["failed"], second["failed"], outcome.attempts) == (True, False, 2)
    assert first["doc"] == second["doc"] == DOC
    # the target's own variables (the test's environment may hold other DELTAMIRROR_* ones, as CI does)
    assert {k: v for k, v in second["env"].items() if k not in os.environ} == {
        "DELTAMIRROR_KIND": "version",
        "DELTAMIRROR_TABLE": "file:///t",
        "DELTAMIRROR_TABLE_ID": "t-1",
        "DELTAMIRROR_VERSION": "7",
        "DELTAMIRROR_OPERATION": "",
        "DELTAMIRROR_TRUNCATED": "0",
        "DELTAMIRROR_DELIVERY_ID": "t-1:7",
        "DELTAMIRROR_ATTEMPT": "2",
    }


def test_a_failing_commands_stderr_is_in_the_error_redacted(tmp_path: Path) -> None:
    command, _ = _command(tmp_path, "always")
    with pytest.raises(InvalidationDeliveryError) as failed:
        Invalidator(ExecTarget.from_command_line(command), policy=FAST)(DOC)
    assert "exited with status 1: could not drop the cache" in str(failed.value)
    assert "hunter2" not in str(failed.value)


def test_a_command_that_cannot_be_found_is_refused_at_start(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not an executable command"):
        ExecTarget.from_command_line(str(tmp_path / "missing.sh"))
    with pytest.raises(ConfigError, match="does not parse"):
        ExecTarget.from_command_line("'unclosed")


def test_a_command_slower_than_its_timeout_fails_the_attempt() -> None:
    target = ExecTarget([sys.executable, "-c", "import time; time.sleep(5)"], timeout_s=0.3)
    with pytest.raises(DeliveryAttemptError, match=r"did not finish within 0\.3 s"):
        target.send(DOC, b"{}", 1)


# --- offsets: stored after the reports ------------------------------------------------------------------


class Offsets:
    def __init__(self) -> None:
        self.stored: list[dict[tuple[str, int], int]] = []

    def store_offsets(self, offsets: Any) -> None:
        self.stored.append(dict(offsets))


def _records(values: list[bytes]) -> list[Record]:
    """The values as the watcher publishes them: keyed by table id, with version/index/type headers."""
    out = []
    for offset, value in enumerate(values):
        event = json.loads(value)
        headers: list[tuple[str, str | bytes | None]] = [
            ("version", str(event["version"]).encode()),
            ("index", str(event["index"]).encode()),
            ("type", event["type"].encode()),
        ]
        out.append(Record("t.actions", 0, offset, offset, event["tableId"].encode(), value, headers, 0))
    return out


def test_offsets_are_stored_after_delivery_and_capped_at_the_version_that_failed() -> None:
    values = list(iter_event_values(str(TABLE)))
    versions = [json.loads(v)["version"] for v in values]
    last_of = {v: max(i for i, w in enumerate(versions) if w == v) for v in set(versions)}
    got: list[dict[str, Any]] = []

    def deliver(doc: dict[str, Any]) -> None:
        if doc["version"] == 1:
            raise InvalidationDeliveryError("refused")
        got.append(doc)

    consumer = InvalidationConsumer("127.0.0.1:1", "t.actions", on_payload=deliver)
    for record in _records(values):
        consumer.take(record)
    offsets = Offsets()
    with pytest.raises(InvalidationDeliveryError):
        consumer.checkpoint(offsets)
    assert [d["version"] for d in got] == [0]
    assert [d["operation"] for d in got] == ["WRITE"]
    # a restart treats what ends before the stored offset as delivered: version 0 only
    assert offsets.stored == [{("t.actions", 0): last_of[1]}]
    assert last_of[0] < last_of[1]
    # the loop's last checkpoint and save (after a stop) store and save nothing more
    consumer.checkpoint(offsets)
    consumer.save()
    assert offsets.stored == [{("t.actions", 0): last_of[1]}] and consumer.undelivered
    assert consumer.unsaved  # nothing was saved: a state_dir would still hold the state before it

    # all delivered: the offsets are those of the snapshot consumer, stored once, after the reports
    delivered: list[int] = []
    consumer = InvalidationConsumer(
        "127.0.0.1:1", "t.actions", on_payload=lambda d: delivered.append(d["version"])
    )
    for record in _records(values):
        consumer.take(record)
    offsets = Offsets()
    consumer.checkpoint(offsets)
    assert delivered == [0, 1, 2] and offsets.stored == [{("t.actions", 0): len(values)}]
