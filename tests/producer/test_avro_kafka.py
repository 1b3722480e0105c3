"""``watch --row-format avro`` end to end: a real broker, a real Schema Registry, read back with
confluent-kafka's ``AvroDeserializer`` equal to core's change feed.

Marked ``registry`` (and ``kafka``): needs the session's ``schema_registry`` fixture (issue 30 item
4), skipped without one. Never a mock.
"""

from __future__ import annotations

import io
import json
import logging
import shutil
import threading
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from deltamirror.core.changes import read_changes
from deltamirror.core.table import open_table
from deltamirror.producer import WatchConfig
from deltamirror.producer import pipeline as pipeline_module
from deltamirror.producer.log_format import configure_logging
from deltamirror.producer.metrics import WatcherMetrics, serve
from deltamirror.producer.service import WatchService
from support.cdf_tables import cdf_table
from support.records import wait_for
from support.tables import TABLES
from support.watching import published_version, watch_row_changes

pytestmark = [pytest.mark.kafka, pytest.mark.registry]


@pytest.fixture
def registry(schema_registry: str) -> str:
    """The session's real registry's Confluent-API URL (tests/support/registry.py)."""
    return schema_registry


def test_watch_publishes_avro_row_changes_equal_to_the_change_feed(
    registry: str, kafka_bootstrap: str, tmp_path: Path, kit: Any
) -> None:
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    path = tmp_path / "t"
    end = cdf_table(path)
    name = kit.unique("avro")
    actions, changes = f"{name}.actions", f"{name}.changes"
    watch_row_changes(
        kafka_bootstrap,
        path,
        actions,
        end,
        {"format": "avro", "key_columns": ["id"], "registry": {"url": registry}},
    )
    client = SchemaRegistryClient({"url": registry})
    values, keys = AvroDeserializer(client), AvroDeserializer(client)
    records = [r for r in kit.consume(kafka_bootstrap, [changes], idle_s=0.5) if r.value is not None]
    events = [values(r.value, SerializationContext(changes, MessageField.VALUE)) for r in records]
    for r, e in zip(records, events, strict=True):
        assert keys(r.key, SerializationContext(changes, MessageField.KEY)) == {
            "id": (e["after"] or e["before"])["id"]
        }
    feed = read_changes(open_table(str(path)), starting_version=0, ending_version=end).to_arrow().to_pylist()
    inserted = sorted(
        (row["_commit_version"], row["id"], row["name"]) for row in feed if row["_change_type"] == "insert"
    )
    assert (
        sorted(
            (e["source"]["delta_version"], e["after"]["id"], e["after"]["name"])
            for e in events
            if e["op"] == "c"
        )
        == inserted
    )
    assert sum(e["op"] == "u" for e in events) == sum(
        row["_change_type"] == "update_postimage" for row in feed
    )


def _avro_watch_config(bootstrap: str, registry: str, name: str, *tables: tuple[Path, str]) -> WatchConfig:
    """A watcher of ``tables`` ((path, topic name) each: NAME.actions, .commits, .changes,
    .transaction) from version 0, with Avro row changes through ``registry``, polled every 0.1 s."""
    return WatchConfig.model_validate(
        {
            "kafka": {"bootstrap_servers": bootstrap},
            "tables": [
                {
                    "uri": str(path),
                    "snapshot_mode": "from-version",
                    "from_version": 0,
                    "actions_topic": f"{topic}.actions",
                    "commits_topic": f"{topic}.commits",
                    "poll_interval_s": 0.1,
                    "changes_topic": f"{topic}.changes",
                    "transaction_topic": f"{topic}.transaction",
                    "row_changes": {"format": "avro", "registry": {"url": registry}},
                }
                for path, topic in tables
            ],
            "progress_topic": f"{name}.progress",
            "transactional_id_prefix": name,
            "signal_topic": None,
        }
    )


def _stop(service: WatchService, server: Any) -> None:
    """Stop the watcher and its metrics server; the CLI's log lines back to pytest's capture."""
    service.request_stop()
    assert service.wait(30), "the watcher did not stop"
    service.close()
    server.stop()
    logging.getLogger("deltamirror").handlers.clear()
    logging.getLogger("deltamirror").propagate = True


def _compatibility(registry: str, subject: str, level: str) -> None:
    """The subject's compatibility level, set through the Confluent API (before it has a version)."""
    request = urllib.request.Request(
        f"{registry}/config/{subject}",
        data=json.dumps({"compatibility": level}).encode(),
        method="PUT",
        headers={"Content-Type": "application/vnd.schemaregistry.v1+json"},
    )
    with urllib.request.urlopen(request, timeout=10) as resp:
        assert resp.status == 200, resp.read()


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def _with_change_data(table: Path, table_id: str | None = None) -> Path:
    """``table`` with ``delta.enableChangeDataFeed`` in each metaData (row changes need it; the
    versions of krs__type-widening are blind appends, whose change rows are their added files),
    and ``table_id`` as its metaData.id if given (two copies in one watcher are two tables)."""
    log = table / "_delta_log"
    for crc in log.glob(".*.crc"):
        crc.unlink()
    for commit in sorted(log.glob("*.json")):
        actions = [json.loads(line) for line in commit.read_text().splitlines() if line.strip()]
        for action in actions:
            if "metaData" in action:
                action["metaData"]["configuration"]["delta.enableChangeDataFeed"] = "true"
                action["metaData"]["id"] = table_id or action["metaData"]["id"]
        commit.write_text("".join(json.dumps(a) + "\n" for a in actions))
    return table


class _CountingMetrics(WatcherMetrics):
    """The watcher's metrics, counting the attempts that stopped a table."""

    def __init__(self) -> None:
        super().__init__()
        self.errors: dict[str, int] = {}
        self._count = threading.Lock()

    def table_error(self, table: str, reason: str) -> None:
        with self._count:
            self.errors[table] = self.errors.get(table, 0) + 1
        super().table_error(table, reason)


@pytest.mark.timeout(120)
def test_an_incompatible_schema_change_stops_that_table_visibly_before_its_version_and_others_go_on(
    registry: str, kafka_bootstrap: str, tmp_path: Path, kit: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Version 2 of krs__type-widening (delta-spark) widens byte/short/int/long columns to decimals:
    int -> bytes, incompatible under BACKWARD. The table stops before anything of version 2 is on
    a topic, said in one log line (the CLI's JSON line, no traceback) naming table, version and
    subject, /healthz and the metrics say it while retries stop on it; the other table (a copy
    whose subject has no level: Apicurio's default, NONE) goes on through the same change.

    Apicurio words one refusal differently from one attempt to the next (its differences in any
    order): each retry logged it again until the pipeline told refusals apart by table, version and
    subject."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    refused = _with_change_data(shutil.copytree(TABLES / "krs__type-widening", tmp_path / "refused"))
    other = _with_change_data(
        shutil.copytree(TABLES / "krs__type-widening", tmp_path / "other"), str(uuid.uuid4())
    )
    other_end = 2
    name, name2 = kit.unique("avrostop"), kit.unique("avrogo")
    subject = f"{name}.changes-value"
    _compatibility(registry, subject, "BACKWARD")

    cfg = _avro_watch_config(kafka_bootstrap, registry, name, (refused, name), (other, name2))
    monkeypatch.setattr(pipeline_module, "BACKOFF_MIN_S", 0.05)  # retries in quick succession
    monkeypatch.setattr(pipeline_module, "BACKOFF_MAX_S", 0.1)
    stream = io.StringIO()
    configure_logging(logging.INFO, stream)  # the CLI's log lines (cli watch -> run_watch)
    metrics = _CountingMetrics()
    server = serve(metrics, port=0)
    service = WatchService(cfg, metrics=metrics, stop_budget_s=5.0)
    service.start()
    try:
        wait_for(
            lambda: sum(metrics.errors.values()) >= 4,
            "four attempts stopped on the refusal",
            60,
            every_s=0.05,
        )
        wait_for(
            lambda: published_version(kafka_bootstrap, f"{name2}.commits") == other_end,
            "the other table published every version",
            60,
        )
        status, body = _get(server.url + "/healthz")
        metrics_text = _get(server.url + "/metrics")[1]
    finally:
        _stop(service, server)

    # one log line, naming table, version and subject, no traceback; retries said at debug only
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    said = [line for line in lines if line["level"] in ("warning", "error") and subject in line["msg"]]
    assert len(said) == 1, "\n".join(f"{line['level']}: {line['msg']}" for line in lines)
    (line,) = said
    assert line["msg"].startswith("table stopped: the Schema Registry refused the schema (HTTP 409")
    assert f"(table=refused, version=2, subject={subject})" in line["msg"], line
    assert line["errorType"] == "SchemaRegistryError" and "traceback" not in line
    assert not [entry for entry in lines if entry["level"] == "error" and entry is not line]
    # /healthz: unhealthy, the table stopped with the refusal; the other table ok
    assert status == 503, body
    health = json.loads(body)
    assert health["status"] == "unhealthy"
    by_uri = {label: entry for label, entry in health["tables"].items()}
    (stopped,) = [e for label, e in by_uri.items() if label.endswith("/refused")]
    (going,) = [e for label, e in by_uri.items() if label.endswith("/other")]
    assert stopped["status"] == "error" and subject in stopped["reason"] and "version=2" in stopped["reason"]
    assert stopped["lastPublishedVersion"] == 1
    assert going["status"] == "ok" and going["lastPublishedVersion"] == other_end
    # the metrics: the table is down; the refusal counted once (not once per attempt)
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(metrics_text)
        for s in family.samples
    }
    label = next(label for label in by_uri if label.endswith("/refused"))
    label2 = next(label for label in by_uri if label.endswith("/other"))
    assert samples[("deltamirror_table_up", (("table", label),))] == 0
    assert samples[("deltamirror_table_up", (("table", label2),))] == 1
    assert samples[("deltamirror_table_errors_total", (("table", label),))] == 1
    # nothing of version 2 on any topic of the table (read_committed); versions 0 and 1 all there
    assert published_version(kafka_bootstrap, f"{name}.commits") == 1
    actions = kit.consume(kafka_bootstrap, [f"{name}.actions"], idle_s=0.5)
    assert {int(r.headers["version"]) for r in actions} == {0, 1}
    client = SchemaRegistryClient({"url": registry})
    values = AvroDeserializer(client)
    changes = [r for r in kit.consume(kafka_bootstrap, [f"{name}.changes"], idle_s=0.5) if r.value]
    events = [values(r.value, SerializationContext(f"{name}.changes", MessageField.VALUE)) for r in changes]
    assert [(e["op"], e["source"]["delta_version"]) for e in events] == [("c", 0)]
    assert client.get_versions(subject) == [1]
    # the other table took the same change (no level set): version 2's row is there, a second schema
    changes2 = [r for r in kit.consume(kafka_bootstrap, [f"{name2}.changes"], idle_s=0.5) if r.value]
    events2 = [
        values(r.value, SerializationContext(f"{name2}.changes", MessageField.VALUE)) for r in changes2
    ]
    assert [(e["op"], e["source"]["delta_version"]) for e in events2] == [("c", 0), ("c", 2)]
    assert client.get_versions(f"{name2}.changes-value") == [1, 2]
    # a refusal counted on its own (an operator's alert: a schema needs a decision), once
    refusals = "deltamirror_schema_registry_refusals_total"
    assert samples.get((refusals, (("table", label),))) == 1, sorted(k for k in samples if "refusal" in k[0])
    assert samples.get((refusals, (("table", label2),))) == 0


@pytest.mark.timeout(120)
def test_a_table_stopped_by_a_refusal_publishes_the_version_once_the_registry_accepts_it(
    registry: str, kafka_bootstrap: str, tmp_path: Path, kit: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The table of the test above, stopped at version 2 by its subject's BACKWARD level, resumes
    when an operator sets the level to NONE (the Confluent API's PUT /config/<subject>): version 2
    is published on the next attempt, after versions 0 and 1 and once (every action, one change
    event, one commit summary), the subject gets its second version, /healthz answers 200 again
    and ``deltamirror_table_up`` is 1; the log says the stop once and the resumption once."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    path = _with_change_data(shutil.copytree(TABLES / "krs__type-widening", tmp_path / "refused"))
    end = 2
    name = kit.unique("avroresume")
    subject = f"{name}.changes-value"
    _compatibility(registry, subject, "BACKWARD")
    cfg = _avro_watch_config(kafka_bootstrap, registry, name, (path, name))
    monkeypatch.setattr(pipeline_module, "BACKOFF_MIN_S", 0.05)  # retries in quick succession
    monkeypatch.setattr(pipeline_module, "BACKOFF_MAX_S", 0.1)
    stream = io.StringIO()
    configure_logging(logging.INFO, stream)
    metrics = _CountingMetrics()
    server = serve(metrics, port=0)
    service = WatchService(cfg, metrics=metrics, stop_budget_s=5.0)
    service.start()
    try:
        # stopped: two attempts refused (the table retries), nothing of version 2 committed
        wait_for(lambda: sum(metrics.errors.values()) >= 2, "two attempts stopped on the refusal", 60, 0.05)
        stopped_status, _ = _get(server.url + "/healthz")
        stopped_at = published_version(kafka_bootstrap, f"{name}.commits")
        _compatibility(registry, subject, "NONE")
        wait_for(
            lambda: published_version(kafka_bootstrap, f"{name}.commits") == end,
            "the refused version published once the registry accepts it",
            60,
        )
        _, body = wait_for(
            lambda: (r := _get(server.url + "/healthz"))[0] == 200 and r, "/healthz healthy again", 30, 0.05
        )
        metrics_text = _get(server.url + "/metrics")[1]
    finally:
        _stop(service, server)

    assert stopped_status == 503 and stopped_at == 1
    health = json.loads(body)
    assert health["status"] == "ok", health
    ((label, entry),) = health["tables"].items()
    assert entry["status"] == "ok" and entry["lastPublishedVersion"] == end, entry
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(metrics_text)
        for s in family.samples
    }
    assert samples[("deltamirror_table_up", (("table", label),))] == 1
    assert samples[("deltamirror_schema_registry_refusals_total", (("table", label),))] == 1
    # the log: the stop once, the resumption once
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    stops = [line for line in lines if line["msg"].startswith("table stopped: the Schema Registry refused")]
    assert len(stops) == 1, [line["msg"] for line in lines]
    assert sum(line["msg"] == "table resumed" for line in lines) == 1, [line["msg"] for line in lines]
    # once and in order: each version's actions as many as its commit has lines, versions ascending
    actions = kit.consume(kafka_bootstrap, [f"{name}.actions"], idle_s=0.5)
    versions = [int(r.headers["version"]) for r in actions]
    assert versions == sorted(versions)
    log = path / "_delta_log"
    for version in range(end + 1):
        lines_in_commit = [
            line for line in (log / f"{version:020d}.json").read_text().splitlines() if line.strip()
        ]
        assert versions.count(version) == len(lines_in_commit), (version, versions)
    summaries = [
        json.loads(r.value)["version"]
        for r in kit.consume(kafka_bootstrap, [f"{name}.commits"], idle_s=0.5)
        if r.value and r.value.startswith(b'{"kind":"commit"')
    ]
    assert summaries == [0, 1, 2]
    client = SchemaRegistryClient({"url": registry})
    values = AvroDeserializer(client)
    changes = [r for r in kit.consume(kafka_bootstrap, [f"{name}.changes"], idle_s=0.5) if r.value]
    events = [values(r.value, SerializationContext(f"{name}.changes", MessageField.VALUE)) for r in changes]
    assert [(e["op"], e["source"]["delta_version"]) for e in events] == [("c", 0), ("c", 2)]
    assert client.get_versions(subject) == [1, 2]
