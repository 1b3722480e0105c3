"""After a failed transaction a table resumes from what the progress topic holds, not from memory.

Kafka 4.4 can acknowledge a commit and then not write its markers on some partitions (a broker
killed mid-commit comes back fenced for a moment, finds no leader for them and skips them, as for
deleted topics). Those records stay open until the producer's next marker there, and when that is
the abort of the following transaction they read as aborted: the watcher was told "committed",
the topic says otherwise. Seen in the fault campaign (39 envelopes of one version lost): the
watcher aborted the next transaction and went on from the position it held in memory.

The broker behaviour itself needs a broker kill at the right moment; its outcome for the watcher is
made here on a real broker: the publisher aborts a transaction on the broker and reports it
committed, then the next transaction fails with an abortable error.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from deltamirror.mirror.errors import TransactionAbortableError
from deltamirror.mirror.kafka.producer import TransactionalPublisher
from deltamirror.producer import pipeline as pipeline_module
from deltamirror.producer.service import WatchService

pytestmark = [pytest.mark.kafka]


class _CommittedThenAborted(TransactionalPublisher):
    """Commit number ``lie`` is aborted on the broker and reported committed (what Kafka's skipped
    markers and the next abort amount to); the commit after it fails with an abortable error."""

    lie = 3
    commits = 0

    def commit(self, timeout_s: float = 60.0) -> None:
        cls = type(self)
        cls.commits += 1
        if cls.commits in (cls.lie, cls.lie + 1):
            self._producer.flush(timeout_s)  # the records reach the broker, then read as aborted
            super().abort(timeout_s)
        if cls.commits == cls.lie:
            return
        if cls.commits == cls.lie + 1:
            raise TransactionAbortableError(
                "delivery failed (the broker restarted)", transactional_id=self.transactional_id
            )
        super().commit(timeout_s)


def _summaries(kit: Any, setup: Any) -> list[int]:
    records = kit.consume(setup.bootstrap, [setup.commits], idle_s=0.3, timeout_s=10)
    return [r.json["version"] for r in records if r.headers.get("kind") == b"commit"]


@pytest.mark.timeout(180)
def test_a_transaction_reported_committed_but_aborted_is_published_again_after_the_next_abort(
    kafka_bootstrap: str, tmp_path: Path, kit: Any, watch_setup: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = kit.make_table(tmp_path / "t", versions=1)
    kit.write_versions(table, 1, 4, 3)  # versions 1..4, four records each (commitInfo, 3 adds)
    setup = watch_setup(kafka_bootstrap, table, txn_max_records=2)  # two records a transaction
    monkeypatch.setattr(_CommittedThenAborted, "commits", 0)
    monkeypatch.setattr(pipeline_module, "TransactionalPublisher", _CommittedThenAborted)
    service = WatchService(setup.cfg())
    service.start()
    deadline = time.monotonic() + 90
    try:
        while not (summaries := _summaries(kit, setup)) or max(summaries) < 4:
            assert time.monotonic() < deadline, "the watcher did not publish every version"
            assert service._failure is None, service._failure
            time.sleep(0.2)
    finally:
        service.request_stop()
        assert service.wait(30), "the watcher did not stop"
        service.close()
    assert _CommittedThenAborted.commits > _CommittedThenAborted.lie + 1, "the failure was not driven"
    everything = kit.consume(kafka_bootstrap, [setup.actions], isolation="read_uncommitted", idle_s=0.3)
    expected = kit.events_output(table)
    got = [r.value for r in setup.actions_records(idle_s=0.3)]
    assert len(everything) > len(got), "no transaction was aborted: the test proved nothing"
    assert got == expected, f"{len(got)} envelopes on the topic, {len(expected)} in the table's log"
    assert _summaries(kit, setup) == [0, 1, 2, 3, 4]


class _CommittedOnOneTopicOnly(TransactionalPublisher):
    """The second transaction holding a record of ``topic`` ends committed on that topic only (its
    records there written again, committed, by another producer) and aborted everywhere else,
    reported committed: what a broker killed while it wrote the commit markers one partition at a
    time, then skipping the rest at its restart, and the next abort amount to. The commit after it
    fails with an abortable error."""

    topic = ""
    side: dict[str, Any] = {}
    seen = 0
    lied = False
    failed = False

    def begin(self) -> None:
        self._captured: list[tuple[bytes, bytes, list[Any], int]] = []
        super().begin()

    def produce_many(self, topic: str, values: Any, key: bytes, headers: Any, timestamp: int) -> None:
        values, headers = list(values), list(headers)
        if topic == type(self).topic:
            self._captured += [(v, key, h, timestamp) for v, h in zip(values, headers, strict=True)]
        super().produce_many(topic, values, key, headers, timestamp)

    def commit(self, timeout_s: float = 60.0) -> None:
        cls = type(self)
        if cls.lied and not cls.failed:
            cls.failed = True
            self._producer.flush(timeout_s)
            super().abort(timeout_s)
            raise TransactionAbortableError("delivery failed (the broker restarted)")
        if self._captured and not cls.lied:
            cls.seen += 1
            if cls.seen == 2:
                from confluent_kafka import Producer

                cls.lied = True
                self._producer.flush(timeout_s)
                super().abort(timeout_s)
                side = Producer(cls.side)
                side.init_transactions(30)
                side.begin_transaction()
                for value, key, headers, timestamp in self._captured:
                    side.produce(cls.topic, value, key, timestamp=timestamp, headers=headers)
                side.commit_transaction(30)
                return
        super().commit(timeout_s)


@pytest.mark.parametrize("marked", ["commits", "actions"])
@pytest.mark.timeout(180)
def test_records_a_partial_commit_left_committed_are_not_published_twice(
    marked: str,
    kafka_bootstrap: str,
    tmp_path: Path,
    kit: Any,
    watch_setup: Any,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    table = kit.make_table(tmp_path / "t", versions=1)
    kit.write_versions(table, 1, 4, 3)
    setup = watch_setup(kafka_bootstrap, table, txn_max_records=3)
    monkeypatch.setattr(_CommittedOnOneTopicOnly, "topic", getattr(setup, marked))
    monkeypatch.setattr(
        _CommittedOnOneTopicOnly,
        "side",
        {"bootstrap.servers": kafka_bootstrap, "transactional.id": kit.unique("side")},
    )
    for name, value in (("seen", 0), ("lied", False), ("failed", False)):
        monkeypatch.setattr(_CommittedOnOneTopicOnly, name, value)
    monkeypatch.setattr(pipeline_module, "TransactionalPublisher", _CommittedOnOneTopicOnly)
    service = WatchService(setup.cfg())
    service.start()
    deadline = time.monotonic() + 90
    try:
        while not (summaries := _summaries(kit, setup)) or max(summaries) < 4:
            assert time.monotonic() < deadline, "the watcher did not publish every version"
            assert service._failure is None, service._failure
            time.sleep(0.2)
    finally:
        service.request_stop()
        assert service.wait(30), "the watcher did not stop"
        service.close()
    assert _CommittedOnOneTopicOnly.failed, "the failure was not driven"
    assert [r.value for r in setup.actions_records(idle_s=0.3)] == kit.events_output(table)
    assert _summaries(kit, setup) == [0, 1, 2, 3, 4]
    assert any("not published again" in r.getMessage() for r in caplog.records)
