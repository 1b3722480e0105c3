"""``deltamirror signal snapshot``: every setting of its --config file reaches the signal, and a
broker that does not answer is one line with the reason, within --timeout.

The command used to read only the file's ``kafka:`` section: with ``signal_topic: ops.signals``
in the watchers' file it wrote to ``deltamirror.signals``, which no watcher read, and said so with
exit 0; with the broker down it printed ~105 raw librdkafka lines over 33 s and ended with an
empty reason.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from deltamirror.producer.discovery.signals import Signal

DEAD = "127.0.0.1:1"  # nothing listens there: connections are refused at once


def _signal(*args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "deltamirror.cli.main", "signal", "snapshot", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _config(path: Path, bootstrap: str, **top: Any) -> Path:
    path.write_text(yaml.safe_dump({"kafka": {"bootstrap_servers": bootstrap}, **top}))
    return path


# --- refused at start, before any broker is asked -----------------------------------------------------


def test_a_file_whose_watchers_read_no_signals_is_refused(tmp_path: Path) -> None:
    config = _config(tmp_path / "w.yaml", DEAD, tables=[str(tmp_path / "t")], signal_topic=None)
    done = _signal(str(tmp_path / "t"), "--config", str(config))
    assert done.returncode == 2, done.stderr
    assert "signal_topic is null" in done.stderr and len(done.stderr.splitlines()) == 1


def test_a_signal_topic_flag_other_than_the_files_is_refused(tmp_path: Path) -> None:
    config = _config(tmp_path / "w.yaml", DEAD, tables=[str(tmp_path / "t")], signal_topic="ops.signals")
    done = _signal(str(tmp_path / "t"), "--config", str(config), "--signal-topic", "deltamirror.signals")
    assert done.returncode == 2, done.stderr
    assert (
        "--signal-topic deltamirror.signals differs from the file's signal_topic ops.signals" in done.stderr
    )


@pytest.mark.parametrize(
    ("table", "runs"),
    [
        ("lake/sales/orders", True),  # under the prefix
        ("lake/sales/orders/", True),
        ("lake/tmp/scratch", False),  # excluded
        ("lake/a/b/c/d", False),  # deeper than max_depth
        ("elsewhere/orders", False),  # neither a table nor under a prefix
        ("single", True),  # a table of the file
    ],
)
def test_a_table_no_watcher_of_the_file_runs_is_refused(tmp_path: Path, table: str, runs: bool) -> None:
    config = _config(
        tmp_path / "w.yaml",
        DEAD,
        tables=[str(tmp_path / "single")],
        discover=[{"uri": str(tmp_path / "lake"), "exclude": ["tmp"], "max_depth": 3}],
    )
    done = _signal(str(tmp_path / table), "--config", str(config), "--timeout", "1")
    if runs:  # accepted: it goes on to the broker, which does not answer (exit 1); on a loaded
        # machine the 1 s may be spent before the broker is asked (the table is checked first)
        assert done.returncode == 1, done.stderr
        assert "did not answer" in done.stderr or "could not be completed within" in done.stderr, done.stderr
    else:
        assert done.returncode == 2 and "no watcher of it runs the table" in done.stderr, done.stderr


def test_a_file_of_kafka_settings_gives_its_signal_topic_too(tmp_path: Path) -> None:
    config = _config(tmp_path / "k.yaml", DEAD, signal_topic="not a topic!")
    done = _signal(str(tmp_path / "t"), "--config", str(config))
    assert done.returncode == 2 and "signal_topic" in done.stderr, done.stderr


@pytest.mark.parametrize("timeout", ["0", "-1", "nan", "inf"])
def test_a_timeout_that_is_not_a_positive_number_is_refused(tmp_path: Path, timeout: str) -> None:
    done = _signal(str(tmp_path / "t"), "--bootstrap-servers", DEAD, "--timeout", timeout)
    assert done.returncode == 2 and "--timeout" in done.stderr, done.stderr


# --- a broker that does not answer ----------------------------------------------------------------------


@pytest.mark.parametrize("brokers", [DEAD, "no-such-host.invalid:9092"])
def test_a_dead_broker_is_one_line_with_its_reason_within_the_timeout(tmp_path: Path, brokers: str) -> None:
    started = time.monotonic()
    done = _signal(str(tmp_path / "t"), "--bootstrap-servers", brokers, "--timeout", "3")
    took = time.monotonic() - started
    assert done.returncode == 1, done.stderr
    (line,) = done.stderr.splitlines()  # one line: no librdkafka line, no warning before it
    assert line.startswith(f"deltamirror: error: Kafka at {brokers} did not answer within 3 s (")
    reason = line.split(" s (", 1)[1].split("): ", 1)[0]
    assert reason and reason != "no broker answered", line
    assert line.endswith("the signal was not sent")
    assert took < 3 + 10, took  # the deadline, plus the interpreter's start and exit
    assert done.stdout == ""


# --- the real broker ----------------------------------------------------------------------------------


@pytest.mark.kafka
@pytest.mark.timeout(120)
def test_the_signal_goes_to_the_signal_topic_of_the_file(
    kafka_bootstrap: str, tmp_path: Path, kit: Any
) -> None:
    topic = kit.unique("ops.signals")
    table = tmp_path / "orders"
    config = _config(tmp_path / "w.yaml", kafka_bootstrap, tables=[str(table)], signal_topic=topic)
    done = _signal(str(table), "--config", str(config))
    assert done.returncode == 0, done.stderr
    line = json.loads(done.stdout)
    assert (line["topic"], line["bootstrapServers"], line["tableUri"]) == (
        topic,
        kafka_bootstrap,
        f"file://{table}",
    )
    (record,) = kit.consume(kafka_bootstrap, [topic], until=lambda rs: len(rs) >= 1, timeout_s=30)
    sent = Signal.model_validate_json(record.value)
    assert (sent.kind, sent.id, sent.table_uri) == ("snapshot", line["id"], f"file://{table}")


@pytest.mark.kafka
@pytest.mark.timeout(120)
def test_wait_returns_once_the_watcher_running_the_table_took_the_signal(
    kafka_bootstrap: str, tmp_path: Path, kit: Any
) -> None:
    from deltamirror.producer.config_file import load_config
    from deltamirror.producer.service import WatchService

    name = kit.unique("sigwait")
    table = kit.make_table(tmp_path / name, versions=2)
    topic = kit.unique("ops.signals")
    config = _config(
        tmp_path / "w.yaml",
        kafka_bootstrap,
        tables=[{"uri": str(table), "poll_interval_s": 0.2}],
        signal_topic=topic,
        progress_topic=kit.unique("progress"),
    )
    service = WatchService(load_config(config), stop_budget_s=5.0)
    service.start()
    commits = f"deltamirror.{name}.commits"

    def summaries(records: list[Any]) -> list[tuple[int, bool]]:
        return [
            (r.json["version"], r.json["snapshot"]) for r in records if r.headers.get("kind") == b"commit"
        ]

    try:
        kit.consume(kafka_bootstrap, [commits], until=lambda rs: summaries(rs) == [(1, True)], timeout_s=30)
        assert service.signals is not None and service.signals.listening.wait(30)
        done = _signal(str(table), "--config", str(config), "--wait", "--timeout", "30")
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["taken"] is True and json.loads(done.stdout)["topic"] == topic
        kit.consume(kafka_bootstrap, [commits], until=lambda rs: len(summaries(rs)) == 2, timeout_s=30)
    finally:
        service.request_stop()
        assert service.wait(30), "the watcher did not stop"
        service.close()


@pytest.mark.kafka
@pytest.mark.timeout(120)
def test_wait_with_no_watcher_running_the_table_says_so_at_the_timeout(
    kafka_bootstrap: str, tmp_path: Path, kit: Any
) -> None:
    topic = kit.unique("ops.signals")
    started = time.monotonic()
    done = _signal(
        str(tmp_path / "orders"),
        "--bootstrap-servers",
        kafka_bootstrap,
        "--signal-topic",
        topic,
        "--wait",
        "--timeout",
        "3",
    )
    assert done.returncode == 1, done.stderr
    assert f"the signal was sent to {topic}, but no watcher running" in done.stderr
    assert len(done.stderr.splitlines()) == 1 and done.stdout == ""
    assert time.monotonic() - started < 3 + 10


@pytest.mark.parametrize("version", ["-1", "x"])
def test_net_changes_takes_its_config_file_and_refuses_a_version_that_is_not_one(
    tmp_path: Path, version: str
) -> None:
    config = _config(tmp_path / "w.yaml", DEAD, tables=[str(tmp_path / "t")], signal_topic=None)
    argv = [sys.executable, "-m", "deltamirror.cli.main", "signal", "net-changes", str(tmp_path / "t")]
    done = subprocess.run(
        [*argv, "--config", str(config), "--from-version", "0"], capture_output=True, text=True
    )
    assert done.returncode == 2 and "signal_topic is null" in done.stderr, done.stderr
    done = subprocess.run(
        [*argv, "--config", str(config), "--from-version", version], capture_output=True, text=True
    )
    assert done.returncode == 2 and "--from-version" in done.stderr.splitlines()[-1], done.stderr


def test_a_watchers_file_with_a_consumer_section_is_taken_as_watch_takes_it(tmp_path: Path) -> None:
    """Audit F12: watch accepts a ``consumer:`` section (the consumer commands'), signal refused
    the same file with "consumer: unknown key"."""
    config = _config(
        tmp_path / "w.yaml", DEAD, tables=[str(tmp_path / "t")], consumer={"on_bad_record": "skip"}
    )
    done = _signal(str(tmp_path / "t"), "--config", str(config), "--timeout", "1")
    assert "unknown key" not in done.stderr
    assert done.returncode == 1, done.stderr  # taken: it went on to the (dead) broker


def test_net_changes_for_a_table_the_file_gives_no_row_changes_is_refused_at_once(tmp_path: Path) -> None:
    """Audit F12: the signal was written and its watcher refused it (seen only with --wait)."""
    config = _config(
        tmp_path / "w.yaml",
        DEAD,
        tables=[
            str(tmp_path / "plain"),
            {"uri": str(tmp_path / "cdc"), "row_changes": {"key_columns": ["id"]}},
        ],
        discover=[{"uri": str(tmp_path / "lake")}],
    )
    argv = [sys.executable, "-m", "deltamirror.cli.main", "signal", "net-changes", "--from-version", "0"]
    for table in ("plain", "lake/t"):
        done = subprocess.run(
            [*argv, str(tmp_path / table), "--config", str(config), "--timeout", "1"],
            capture_output=True,
            text=True,
        )
        assert done.returncode == 2, done.stderr
        (line,) = done.stderr.strip().splitlines()
        assert f"{tmp_path / table} publishes no row changes in this configuration" in line
    done = subprocess.run(
        [*argv, str(tmp_path / "cdc"), "--config", str(config), "--timeout", "1"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1, done.stderr  # taken: it went on to the (dead) broker
