"""The consumer's /metrics and /healthz: its states on a fake clock, then a real snapshot consumer on the
session's broker, scraped over HTTP while it consumes and after it stopped on an error."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Mapping
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from deltamirror.consumer.metrics import DEFAULT_PORT, ConsumerMetrics, serve
from deltamirror.consumer.snapshot import SnapshotConsumer
from deltamirror.mirror.errors import EventStreamError, KafkaError
from deltamirror.mirror.records.events import SCHEMA_VERSION, Heartbeat
from deltamirror.ops import ServerHandle
from deltamirror.producer.publishing.offline_events import iter_event_values
from support.tables import TABLES

TABLE = "file:///data/demo"
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


class FakeClock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class FakeReader:
    """A LagSource whose answers the test sets: a mapping, or an error (the broker gone)."""

    def __init__(self) -> None:
        self.answer: Mapping[tuple[str, int], int] | Exception = {}
        self.asked = 0

    def lag(self, timeout_s: float = 2.0) -> Mapping[tuple[str, int], int]:
        self.asked += 1
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def scrape(handle: ServerHandle) -> Samples:
    status, body = get(handle.url + "/metrics")
    assert status == 200
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
    }


def health(handle: ServerHandle) -> tuple[int, dict[str, Any]]:
    status, body = get(handle.url + "/healthz")
    return status, json.loads(body)


def of_table(samples: Samples, name: str, table: str) -> float:
    return samples[("deltamirror_consumer_" + name, (("table", table),))]


# --- the states, on a fake clock ----------------------------------------------------------------


def test_lag_rates_and_health_states_on_a_fake_clock() -> None:
    clock = FakeClock(1_800_000_000.0)
    metrics = ConsumerMetrics(clock=clock, unreachable_after_s=30, lag_interval_s=5)
    reader = FakeReader()
    with serve(metrics, port=0) as handle:
        status, body = health(handle)
        assert (status, body["status"]) == (503, "starting")

        reader.answer = {("t.actions", 0): 12, ("t.actions", 1): 0}
        metrics.batch_read(3, reader)
        metrics.version_applied(TABLE, 7, commit_ts_ms=1_799_999_998_500, actions=5)
        metrics.version_applied(TABLE, 8, commit_ts_ms=1_799_999_999_000, actions=2)
        metrics.version_published(TABLE, 10)
        status, body = health(handle)
        assert status == 200
        assert body == {
            "status": "ok",
            "tables": {
                TABLE: {"lastAppliedVersion": 8, "millisecondsBehindCommit": 1000, "versionsBehind": 2}
            },
            "recordsBehind": 12,
        }
        samples = scrape(handle)
        assert of_table(samples, "last_applied_version", TABLE) == 8
        assert of_table(samples, "milliseconds_behind_commit", TABLE) == 1000
        assert of_table(samples, "last_commit_timestamp_seconds", TABLE) == 1_799_999_999.0
        assert of_table(samples, "versions_behind", TABLE) == 2
        assert of_table(samples, "versions_applied_total", TABLE) == 2
        assert of_table(samples, "actions_applied_total", TABLE) == 7
        behind = ("deltamirror_consumer_records_behind", (("partition", "0"), ("topic", "t.actions")))
        assert samples[behind] == 12
        assert samples[("deltamirror_consumer_records_read_total", ())] == 3
        assert samples[("deltamirror_consumer_healthy", ())] == 1

        # a commit in the future is no negative lag; the lag is asked again only after the interval
        metrics.version_applied(TABLE, 9, commit_ts_ms=1_800_000_060_000, actions=1)
        assert of_table(scrape(handle), "milliseconds_behind_commit", TABLE) == 0
        clock.now += 1
        metrics.batch_read(0, reader)
        assert reader.asked == 1

        # the broker gone: healthy until it has been silent beyond the threshold
        reader.answer = KafkaError("cannot read the end offsets: Local: Broker transport failure")
        for _ in range(7):
            clock.now += 5
            metrics.batch_read(0, reader)
        assert reader.asked == 8
        status, body = health(handle)
        assert status == 503 and body["status"] == "unhealthy"
        assert body["reason"] == (
            "Kafka has not answered for 36 s: cannot read the end offsets: Local: Broker transport failure"
        )
        assert scrape(handle)[("deltamirror_consumer_healthy", ())] == 0
        reader.answer = {("t.actions", 0): 0}
        clock.now += 5
        metrics.batch_read(0, reader)
        assert health(handle)[0] == 200

        metrics.stopped()
        assert health(handle)[1]["status"] == "stopped"
        metrics.stopped(EventStreamError("a record of s3://key:secret@bucket/t is not JSON"))
        status, body = health(handle)
        assert (
            status == 503
            and body["reason"] == "stopped on an error: a record of s3://***@bucket/t is not JSON"
        )
        assert scrape(handle)[("deltamirror_consumer_errors_total", ())] == 1


def test_labels_are_redacted_and_counters_of_a_new_table_start_at_zero() -> None:
    metrics = ConsumerMetrics()
    metrics.version_published("s3://key:secret@bucket/t", 0)
    with serve(metrics, port=0) as handle:
        samples = scrape(handle)
        assert of_table(samples, "versions_applied_total", "s3://***@bucket/t") == 0
        assert of_table(samples, "versions_behind", "s3://***@bucket/t") == 1  # version 0 not applied
        assert "secret" not in get(handle.url + "/metrics")[1] + get(handle.url + "/healthz")[1]


def test_settings_that_cannot_work_are_refused() -> None:
    assert DEFAULT_PORT == 9465  # beside the watcher's 9464 on one host
    with pytest.raises(ValueError, match="lag_interval_s"):
        ConsumerMetrics(unreachable_after_s=5, lag_interval_s=5)


# --- a real snapshot consumer on the session's broker --------------------------------------------


@pytest.mark.kafka
@pytest.mark.timeout(90)
def test_a_snapshot_consumer_serves_its_lag_and_health_while_it_consumes(kafka_bootstrap: str) -> None:
    from confluent_kafka import Producer

    from deltamirror.mirror.kafka.consumer import MirrorConsumer
    from support.kafka import new_topic, wait_settled

    values = list(iter_event_values(str(TABLES / "golden__basic-with-inserts-updates")))
    events = [json.loads(v) for v in values]
    uri, table_id = events[0]["tableUri"], events[0]["tableId"]
    latest = max(e["version"] for e in events)
    last_commit_ms = next(e["commitTimestamp"] for e in events if e["version"] == latest)
    name = f"dmcm-{uuid.uuid4().hex[:10]}"
    actions, commits = (
        new_topic(kafka_bootstrap, f"{name}.actions"),
        new_topic(kafka_bootstrap, f"{name}.commits"),
    )
    # transactional, as the watcher publishes: the commit marker takes an offset of its own
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": name})
    producer.init_transactions(30)
    producer.begin_transaction()
    for value in values:
        producer.produce(actions, value, key=table_id.encode())
    producer.commit_transaction(30)
    beat = Heartbeat(
        schema_version=SCHEMA_VERSION,
        table_id=table_id,
        table_uri=uri,
        latest_version=latest + 3,  # the watcher says it stands 3 versions further
        commit_timestamp=last_commit_ms,
        commit_timestamp_source="file-time",
        heartbeat_timestamp=int(time.time() * 1000),
    )
    producer.begin_transaction()
    producer.produce(commits, beat.to_json_bytes(), key=table_id.encode())
    producer.commit_transaction(30)
    wait_settled(kafka_bootstrap, actions)  # the markers written: the lag below counts the commit's

    # the lag a reader reports is what was produced, then nothing once it read to the end
    with MirrorConsumer({"bootstrap.servers": kafka_bootstrap}) as reader:
        reader.assign([(actions, 0, None)])
        assert reader.lag() == {(actions, 0): len(values) + 1}  # the records and the commit marker
        for _ in reader.batches(until_end=True, timeout_s=30):
            pass
        assert reader.lag() == {(actions, 0): 0}

    metrics = ConsumerMetrics(lag_interval_s=0.01)
    consumer = SnapshotConsumer(
        kafka_bootstrap, actions, commits_topic=commits, metrics=metrics, group_id=name
    )
    errors: list[BaseException] = []

    def run() -> None:
        try:
            consumer.run(topic_timeout_s=10)
        except BaseException as exc:  # the test's thread looks at it
            errors.append(exc)

    with serve(metrics, port=0) as handle:
        thread = threading.Thread(target=run, daemon=True)
        started = time.time()
        thread.start()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and thread.is_alive():
            status, body = health(handle)
            table = body["tables"].get(uri, {})
            if status == 200 and table.get("lastAppliedVersion") == latest and body.get("recordsBehind") == 0:
                break
            time.sleep(0.05)
        assert not errors
        assert (status, table) == (
            200,
            {
                "lastAppliedVersion": latest,
                "millisecondsBehindCommit": table["millisecondsBehindCommit"],
                "versionsBehind": 3,
            },
        )
        samples = scrape(handle)
        assert of_table(samples, "last_applied_version", uri) == latest
        behind_ms = of_table(samples, "milliseconds_behind_commit", uri)
        assert started * 1000 - last_commit_ms <= behind_ms <= time.time() * 1000 - last_commit_ms
        assert of_table(samples, "actions_applied_total", uri) == len(values)  # every action of every version
        assert of_table(samples, "versions_applied_total", uri) == latest + 1
        assert of_table(samples, "versions_behind", uri) == 3
        assert samples[("deltamirror_consumer_records_behind", (("partition", "0"), ("topic", actions)))] == 0
        assert samples[("deltamirror_consumer_records_read_total", ())] == len(values) + 1

        # a record that breaks the contract stops the consumer: /healthz says why
        producer.begin_transaction()
        producer.produce(actions, b"not json", key=table_id.encode())
        producer.commit_transaction(30)
        thread.join(30)
        assert not thread.is_alive() and len(errors) == 1 and isinstance(errors[0], EventStreamError)
        status, body = health(handle)
        assert status == 503 and body["status"] == "unhealthy"
        assert body["reason"].startswith("stopped on an error: ") and "JSON" in body["reason"]
        assert scrape(handle)[("deltamirror_consumer_errors_total", ())] == 1
