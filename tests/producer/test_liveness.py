"""What tells an operator that watch works: the status line, the broker's health, the retention."""

from __future__ import annotations

import logging
import socket

import pytest

from deltamirror.mirror.topics import TopicManager
from deltamirror.producer.liveness import NAMED_TABLES, BrokerWatch, StatusLog, Tee
from deltamirror.producer.metrics import WatcherMetrics
from deltamirror.producer.tailing.retention import (
    DEFAULT_RETENTION_S,
    RetentionWatch,
    parse_interval,
    retention_of,
)


def test_a_tee_hands_every_report_to_each_target_also_after_the_first_of_its_kind() -> None:
    first, second = StatusLog(60), StatusLog(60)
    tee = Tee(first, second)
    for n in (3, 5):  # the second report of a kind goes through what the first one kept
        tee.versions_behind("file:///a", n)
        tee.event_published("file:///a", n)
    for status in (first, second):
        assert status._behind == {"file:///a": 5}
        assert status._events == 8


def test_the_status_line_says_what_was_published_and_what_is_behind() -> None:
    status = StatusLog(60)
    status.published_version("file:///a", 7, 1_700_000_000_000)
    status.published_version("file:///a", 8, 1_700_000_000_000)
    status.event_published("file:///a", 12)
    status.versions_behind("file:///b", 40)
    status.table_error("file:///c", "boom")
    message, fields = status.line(3)
    assert message == (
        "status: 2 versions (12 events) of 1 tables published in the last 60 s; "
        "1 of 3 tables behind, 1 stopped on an error"
    )
    assert fields["mostBehind"] == "file:///b (40 versions)"
    assert fields["lastPublished"] == "file:///a v8"
    message, fields = status.line(3)  # counts are since the last line; where tables stand stays
    assert fields["versionsPublished"] == 0 and fields["lastPublished"] == "file:///a v8"
    status.versions_behind("file:///b", 0)
    status.table_ok("file:///c")
    assert status.line(3)[1]["tablesBehind"] == 0 and status.line(3)[1]["tablesFailing"] == 0


def test_the_status_line_stays_one_line_at_thousands_of_tables() -> None:
    status = StatusLog(60)
    for i in range(5000):
        status.published_version(f"file:///t{i}", 1, 0)
        status.versions_behind(f"file:///t{i}", i)
    message, fields = status.line(5000)
    assert "lastPublished" not in fields and NAMED_TABLES < 5000
    assert fields["mostBehind"].count("versions") == 3 and fields["mostBehind"].startswith("file:///t4999")
    assert len(message) + len(str(fields)) < 1000


def test_a_broker_that_does_not_answer_makes_healthz_unhealthy_once(caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as s:  # a port nothing listens on: a real client, a broker that is not there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    manager = TopicManager(
        {"bootstrap.servers": f"127.0.0.1:{port}", "log_level": 0}, max_record_bytes=1 << 20
    )
    metrics = WatcherMetrics()
    metrics.set_healthy(True)
    now = [0.0]
    watch = BrokerWatch(manager.reachable, f"127.0.0.1:{port}", 30.0, metrics, clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="deltamirror.watch"):
        watch.check()
        assert metrics.health()[0]  # silent for less than the bound
        now[0] = 31.0
        watch.check()
        watch.check()
        ok, body = metrics.health()
        assert not ok and body["reason"] == f"Kafka at 127.0.0.1:{port} has not answered for 31 s"
        assert metrics.registry.get_sample_value("deltamirror_kafka_reachable") == 0
        errors = [r for r in caplog.records if r.levelno == logging.ERROR]
        assert len(errors) == 1 and "/healthz reports unhealthy" in errors[0].getMessage()
        watch.probe = lambda timeout_s: True  # it answers again
        watch.check()
    assert metrics.health()[0]
    assert caplog.records[-1].getMessage().endswith("answers again")


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("interval 30 days", 30 * 86400),
        ("interval 1 week", 7 * 86400),
        ("2 days 12 hours", 2.5 * 86400),
        ("INTERVAL 90 MINUTES", 5400),
        ("interval 1 month", None),
        ("thirty days", None),
        ("", None),
    ],
)
def test_log_retention_intervals_as_delta_writes_them(text: str, seconds: float | None) -> None:
    assert parse_interval(text) == seconds


def test_a_table_behind_close_to_its_log_retention_is_warned_once(caplog: pytest.LogCaptureFixture) -> None:
    assert retention_of({}) == DEFAULT_RETENTION_S == 30 * 86400
    assert retention_of({"delta.logRetentionDuration": "bogus"}) == DEFAULT_RETENTION_S
    metrics = WatcherMetrics()
    now_s = 100 * 86400.0
    watch = RetentionWatch("file:///t", metrics.retention_headroom, clock=lambda: now_s)
    week = {"delta.logRetentionDuration": "interval 7 days"}
    day_ms = 86400 * 1000
    with caplog.at_level(logging.WARNING, logger="deltamirror.watch"):
        assert watch.published(int(now_s * 1000) - 2 * day_ms, 10, week) == 5 * 86400  # far from it
        assert not caplog.records
        watch.published(int(now_s * 1000) - 6 * day_ms, 10, week)  # 1 of 7 days left
        watch.published(int(now_s * 1000) - 6 * day_ms, 9, week)
        assert len(caplog.records) == 1 and "1.0 of 7.0 days left" in caplog.records[0].getMessage()
        headroom = metrics.registry.get_sample_value(
            "deltamirror_log_retention_headroom_seconds", {"table": "file:///t"}
        )
        assert headroom == 86400
        watch.published(int(now_s * 1000), 0, week)  # caught up: the whole retention, warned again later
        watch.published(int(now_s * 1000) - 6 * day_ms, 10, week)
        assert len(caplog.records) == 2
