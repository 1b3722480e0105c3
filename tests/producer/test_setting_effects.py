"""Each of the watcher's settings changes what it does: observed on a real broker, one setting (or
two that only make sense together) per test, against the same run without it.

These are the observers ``tests/cli/test_every_setting.py`` names for the settings of
:class:`~deltamirror.producer.WatchConfig` that act while the watcher runs (transaction bounds,
record sizes, the status line, the metrics server, the broker's health, waking and polling, the
producer's identity, paths allowed outside a table, discovery's rescans).
"""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from deltamirror.core.errors import ConfigError
from deltamirror.mirror.records.events import ProgressRecord
from deltamirror.producer import WatchConfig
from deltamirror.producer.service import WatchService
from support.records import read_topic, wait_for
from support.watching import discover_config

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(180)]


def _cfg(
    bootstrap: str, kit: Any, table: Path, *, table_settings: dict[str, Any] | None = None, **top: Any
) -> WatchConfig:
    name = kit.unique("dmfx")
    return WatchConfig.model_validate(
        {
            "kafka": {"bootstrap_servers": bootstrap},
            "tables": [
                {
                    "uri": str(table),
                    "actions_topic": f"{name}.actions",
                    "commits_topic": f"{name}.commits",
                    "poll_interval_s": 0.2,
                    **(table_settings or {"snapshot_mode": "from-version", "from_version": 0}),
                }
            ],
            "progress_topic": f"{name}.progress",
            "transactional_id_prefix": name,
            "signal_topic": None,
            **top,
        }
    )


def _commit_versions(bootstrap: str, cfg: WatchConfig) -> list[int]:
    topic = cfg.tables[0].commits_topic or ""
    return [
        r.json["version"] for r in read_topic(bootstrap, topic) if r.value and r.json.get("kind") == "commit"
    ]


class Running:
    """A WatchService started for a ``with`` block, stopped and closed after it."""

    def __init__(self, cfg: WatchConfig) -> None:
        self.service = WatchService(cfg, stop_budget_s=5.0)

    def __enter__(self) -> WatchService:
        self.service.start()
        return self.service

    def __exit__(self, *exc: object) -> None:
        self.service.request_stop()
        assert self.service.wait(30), "the watcher did not stop"
        self.service.close()


def _until(service: WatchService, condition: Callable[[], Any], what: str, timeout_s: float = 60.0) -> Any:
    def done() -> Any:
        assert service._failure is None, service._failure
        return condition()

    return wait_for(done, what, timeout_s, every_s=0.1)


# --- transaction bounds -----------------------------------------------------------------------------


def _transactions_of_version(
    bootstrap: str, kit: Any, table: Path, version: int, **bounds: int
) -> list[ProgressRecord]:
    """Version ``version`` (alone) published with ``bounds``: the progress record of each of the
    transactions that carried it (one per transaction: a transaction ends with the table's progress)."""
    cfg = _cfg(
        bootstrap,
        kit,
        table,
        table_settings={"snapshot_mode": "from-version", "from_version": version},
        **bounds,
    )
    with Running(cfg) as service:
        _until(service, lambda: version in _commit_versions(bootstrap, cfg), f"version {version} published")
    positions: list[ProgressRecord] = []
    for record in read_topic(bootstrap, cfg.progress_topic):
        if record.value:
            progress = ProgressRecord.model_validate_json(record.value)
            if not positions or (progress.index, progress.complete) != (
                positions[-1].index,
                positions[-1].complete,
            ):
                positions.append(progress)  # the idle re-write of a position is no transaction of its own
    assert positions and positions[-1].complete and all(p.version == version for p in positions)
    return positions


def test_each_transaction_bound_cuts_a_large_version_into_more_transactions(
    kafka_bootstrap: str, tmp_path: Path, kit: Any
) -> None:
    """A version of 2,500 actions is one transaction when no bound is reached; ``txn_max_records``
    cuts it every that many actions, ``txn_max_bytes`` and ``txn_max_ms`` at each batch boundary
    (1,000 actions) past which they are reached."""
    table = kit.make_table(tmp_path / "t", versions=1)
    kit.write_versions(table, 1, 1, 2499)  # version 1: a commitInfo and 2,499 adds
    roomy = {"txn_max_records": 1_000_000, "txn_max_bytes": 1 << 30, "txn_max_ms": 600_000}
    whole = _transactions_of_version(kafka_bootstrap, kit, table, 1, **roomy)
    assert len(whole) == 1

    by_records = _transactions_of_version(kafka_bootstrap, kit, table, 1, **{**roomy, "txn_max_records": 500})
    assert [p.index for p in by_records] == [499, 999, 1499, 1999, 2499]

    by_bytes = _transactions_of_version(kafka_bootstrap, kit, table, 1, **{**roomy, "txn_max_bytes": 1})
    assert [p.index for p in by_bytes] == [999, 1999, 2499]

    # 1 ms: a batch of a thousand records takes longer than that to encode and hand to the producer
    by_time = _transactions_of_version(kafka_bootstrap, kit, table, 1, **{**roomy, "txn_max_ms": 1})
    assert [p.index for p in by_time] == [999, 1999, 2499]


# --- record sizes ---------------------------------------------------------------------------------------


def _wide_table(path: Path) -> Path:
    """Version 0 with a metaData action larger than 1 KiB (60 long column names)."""
    import pyarrow as pa
    from deltalake import write_deltalake

    wide = pa.table({f"a_rather_long_column_name_{i:03d}": pa.array([i], pa.int64()) for i in range(60)})
    write_deltalake(str(path), wide)
    return path


def test_oversize_policy_fail_stops_the_table_naming_the_version_where_split_publishes_fragments(
    kafka_bootstrap: str, tmp_path: Path, kit: Any, caplog: pytest.LogCaptureFixture
) -> None:
    table = _wide_table(tmp_path / "wide")
    split = _cfg(kafka_bootstrap, kit, table, max_record_bytes=1024, oversize_policy="split")
    with Running(split) as service:
        _until(service, lambda: 0 in _commit_versions(kafka_bootstrap, split), "version 0 split")
    assert any(
        "fragment" in r.headers for r in read_topic(kafka_bootstrap, split.tables[0].actions_topic or "")
    )

    fail = _cfg(kafka_bootstrap, kit, table, max_record_bytes=1024, oversize_policy="fail")
    caplog.set_level(logging.ERROR, logger="deltamirror")
    with Running(fail) as service:
        stopped = _until(
            service,
            lambda: [r for r in caplog.records if r.getMessage().startswith("table stopped")],
            "the table stopped on the oversize record",
        )
    message = stopped[0].getMessage()
    assert "larger than max_record_bytes (1024)" in message and "version=0" in message, message
    assert read_topic(kafka_bootstrap, fail.tables[0].actions_topic or "") == []  # nothing half-published
    assert _commit_versions(kafka_bootstrap, fail) == []


# --- what the operator sees -----------------------------------------------------------------------------


def test_status_interval_s_is_how_often_the_status_line_comes(
    kafka_bootstrap: str, tmp_path: Path, kit: Any, caplog: pytest.LogCaptureFixture
) -> None:
    table = kit.make_table(tmp_path / "t", versions=2)
    caplog.set_level(logging.INFO, logger="deltamirror")
    cfg = _cfg(kafka_bootstrap, kit, table, status_interval_s=0.3)

    def lines() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.getMessage().startswith("status: ")]

    with Running(cfg) as service:
        _until(service, lambda: 1 in _commit_versions(kafka_bootstrap, cfg), "versions 0 and 1")
        started = time.monotonic()
        count = len(lines())
        _until(service, lambda: len(lines()) >= count + 3, "three more status lines", timeout_s=30)
        elapsed = time.monotonic() - started
    # the default (60 s) would have said nothing yet; three lines at 0.3 s take about a second
    assert elapsed < 30
    assert all("in the last 0.3 s" in line for line in lines()), lines()
    assert any("2 versions" in line for line in lines()), lines()


def _free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_metrics_port_and_host_serve_metrics_there_and_only_there(
    kafka_bootstrap: str, tmp_path: Path, kit: Any
) -> None:
    table = kit.make_table(tmp_path / "t", versions=1)
    port = _free_port("127.0.0.2")
    cfg = _cfg(kafka_bootstrap, kit, table, metrics_port=port, metrics_host="127.0.0.2")
    with Running(cfg) as service:
        _until(service, lambda: 0 in _commit_versions(kafka_bootstrap, cfg), "version 0")
        status, body = _get(f"http://127.0.0.2:{port}/metrics")
        assert status == 200 and "deltamirror_events_published_total" in body
        with pytest.raises(OSError):  # on the host given, not on the default one
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5)
    plain = _cfg(kafka_bootstrap, kit, table)
    with Running(plain) as service:
        _until(service, lambda: 0 in _commit_versions(kafka_bootstrap, plain), "version 0")
        with pytest.raises(OSError):  # no metrics_port: no server
            urllib.request.urlopen(f"http://127.0.0.2:{port}/metrics", timeout=5)


def test_broker_timeout_s_is_how_long_a_silent_broker_takes_to_make_healthz_unhealthy(
    tmp_path: Path, kit: Any, caplog: pytest.LogCaptureFixture
) -> None:
    table = kit.make_table(tmp_path / "t", versions=1)
    dead = f"127.0.0.1:{_free_port('127.0.0.1')}"  # nothing listens there
    port = _free_port("127.0.0.1")
    caplog.set_level(logging.ERROR, logger="deltamirror")
    cfg = _cfg(dead, kit, table, broker_timeout_s=1.0, metrics_port=port)
    started = time.monotonic()
    with Running(cfg) as service:
        body = _until(
            service,
            lambda: (
                (r := _get(f"http://127.0.0.1:{port}/healthz"))[0] == 503
                and "has not answered" in r[1]
                and r[1]
            ),
            "/healthz unhealthy for the silent broker",
            timeout_s=25,  # the default, 30 s, would not say it within this
        )
        elapsed = time.monotonic() - started
    assert f"Kafka at {dead} has not answered" in body
    assert elapsed < 25
    said = [r.getMessage() for r in caplog.records if "has not answered" in r.getMessage()]
    assert len(said) == 1, said


# --- the producer's identity --------------------------------------------------------------------------


def test_transactional_id_prefix_names_the_producer_that_wrote_the_progress(
    kafka_bootstrap: str, tmp_path: Path, kit: Any
) -> None:
    from deltamirror.producer.publishing.session import transactional_id

    table = kit.make_table(tmp_path / "t", versions=1)
    seen: list[set[str | None]] = []
    for prefix in (kit.unique("one"), kit.unique("two")):
        cfg = _cfg(kafka_bootstrap, kit, table, transactional_id_prefix=prefix)
        with Running(cfg) as service:
            _until(service, lambda cfg=cfg: 0 in _commit_versions(kafka_bootstrap, cfg), "version 0")
        ids = {
            ProgressRecord.model_validate_json(r.value).transactional_id
            for r in read_topic(kafka_bootstrap, cfg.progress_topic)
            if r.value
        }
        assert ids == {transactional_id(prefix, cfg.tables[0].normalized_uri)}
        assert all(i is not None and i.startswith(f"{prefix}-") for i in ids)
        seen.append(ids)
    assert seen[0] != seen[1]


# --- librdkafka's own properties, and the group's session ---------------------------------------------


def _cli(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "deltamirror.cli.main", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_a_property_librdkafka_refuses_in_kafka_extra_is_refused_at_start_naming_it(
    kafka_bootstrap: str, tmp_path: Path, kit: Any
) -> None:
    """The properties reach librdkafka: one it does not know is refused at start, by name, by
    ``watch`` (it retried forever, tracebacks in its threads) and by a consumer command reading the
    same ``kafka:`` section (it exited 1, as if the broker were down)."""
    table = kit.make_table(tmp_path / "t", versions=1)
    config = tmp_path / "w.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "kafka": {"bootstrap_servers": kafka_bootstrap, "extra": {"no.such.property": "x"}},
                "tables": [str(table)],
            }
        )
    )
    for argv in (
        ["watch", "--config", str(config), "--no-progress"],
        ["consume-snapshot", "--config", str(config), "--topic", "any.actions", "--once"],
    ):
        done = _cli(*argv)
        assert done.returncode == 2, (argv, done.stderr[-2000:])
        last = done.stderr.strip().splitlines()[-1]
        assert last.startswith("deltamirror: error: ") and '"no.such.property"' in last, last
        assert "Traceback" not in done.stderr
    # a value librdkafka cannot take is refused as well, without echoing it (it may be a secret)
    config.write_text(
        yaml.safe_dump(
            {
                "kafka": {"bootstrap_servers": kafka_bootstrap, "extra": {"linger.ms": "not-a-number"}},
                "tables": [str(table)],
            }
        )
    )
    done = _cli("watch", "--config", str(config), "--no-progress")
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 2 and "Invalid value for configuration property" in last, done.stderr[-2000:]
    assert "not-a-number" not in last


def _members(bootstrap: str, group_id: str) -> list[Any]:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    (future,) = admin.describe_consumer_groups([group_id]).values()
    return list(future.result(timeout=10).members)


def test_kafka_extra_and_the_session_timeout_reach_the_group_members_clients(
    kafka_bootstrap: str, tmp_path: Path, kit: Any
) -> None:
    """``kafka.extra``'s ``client.id`` is the id the broker sees for the member; a
    ``group.session_timeout_ms`` below what the broker allows (its
    ``group.min.session.timeout.ms``, 6 s by default) is refused by the broker, by name."""
    table = kit.make_table(tmp_path / "t", versions=1)
    name = kit.unique("fxg")
    client_id = kit.unique("client")
    cfg = _cfg(
        kafka_bootstrap,
        kit,
        table,
        group={"name": name, "shards": 2, "session_timeout_ms": 6000},
        transactional_id_prefix=name,
        use_notifications=False,
    )
    cfg = WatchConfig.model_validate(
        {
            **cfg.model_dump(mode="json"),
            "kafka": {"bootstrap_servers": kafka_bootstrap, "extra": {"client.id": client_id}},
        }
    )
    with Running(cfg) as service:
        _until(
            service, lambda: 0 in _commit_versions(kafka_bootstrap, cfg), "version 0 published by the group"
        )
        members = _members(kafka_bootstrap, f"{name}-{name}")
        assert [m.client_id for m in members] == [client_id]

    # below the broker's minimum: the member would never join; refused, by name (it was a warning
    # repeated forever while no table ran)
    config = tmp_path / "short.yaml"
    short = {
        **cfg.model_dump(mode="json"),
        "group": {"name": kit.unique("fxs"), "shards": 2, "session_timeout_ms": 3000},
    }
    config.write_text(yaml.safe_dump(short))
    done = _cli("watch", "--config", str(config), "--no-progress")
    assert done.returncode == 2, done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("deltamirror: error: group.session_timeout_ms: the brokers refuse 3000 ms"), last


# --- when the watcher looks: notifications, polls, rescans -------------------------------------------


def test_use_notifications_wakes_a_table_whose_poll_is_an_hour_away(
    kafka_bootstrap: str, tmp_path: Path, kit: Any
) -> None:
    table = kit.make_table(tmp_path / "t", versions=1)
    hour = {"snapshot_mode": "from-version", "from_version": 0, "poll_interval_s": 3600}
    notified = _cfg(kafka_bootstrap, kit, table, table_settings=hour, use_notifications=True)
    with Running(notified) as service:
        _until(service, lambda: 0 in _commit_versions(kafka_bootstrap, notified), "version 0")
        (pipeline,) = service.pipelines
        assert pipeline.waker.notifying
        kit.append(table)  # version 1: only a notification can wake the table before an hour
        _until(service, lambda: 1 in _commit_versions(kafka_bootstrap, notified), "version 1", timeout_s=30)
    polled = _cfg(kafka_bootstrap, kit, table, table_settings=hour, use_notifications=False)
    with Running(polled) as service:
        _until(service, lambda: 1 in _commit_versions(kafka_bootstrap, polled), "versions 0 and 1")
        (pipeline,) = service.pipelines
        assert not pipeline.waker.notifying  # the same local table, not watched: it polls


def test_poll_interval_s_is_how_long_an_idle_table_waits_between_looks(
    kafka_bootstrap: str, tmp_path: Path, kit: Any
) -> None:
    table = kit.make_table(tmp_path / "t", versions=1)
    cfg = _cfg(
        kafka_bootstrap,
        kit,
        table,
        table_settings={"snapshot_mode": "from-version", "from_version": 0, "poll_interval_s": 0.05},
        use_notifications=False,
    )
    service = WatchService(cfg, stop_budget_s=5.0)
    (pipeline,) = service.pipelines
    waits: list[float] = []
    real_step = pipeline.step_once

    def step() -> float | None:  # an idle look returns the wait until the next one (the pool waits)
        delay = real_step()
        if delay is not None and pipeline.wakeable:
            waits.append(delay)
        return delay

    pipeline.step_once = step  # type: ignore[method-assign]
    service.start()
    try:
        _until(service, lambda: 0 in _commit_versions(kafka_bootstrap, cfg), "version 0")
        started, before = time.monotonic(), len(waits)
        _until(service, lambda: len(waits) >= before + 40, "forty idle looks")
        elapsed = time.monotonic() - started
    finally:
        service.request_stop()
        assert service.wait(30)
        service.close()
    assert set(waits) == {0.05}
    assert elapsed < 20, f"forty looks took {elapsed:.1f} s (at the default 1 s they take 40 s)"


def test_discover_interval_s_is_how_soon_a_table_created_under_the_prefix_is_found(
    kafka_bootstrap: str, tmp_path: Path, kit: Any
) -> None:
    lake = tmp_path / "lake"
    kit.make_table(lake / "a", versions=1)
    name = kit.unique("fxd")
    cfg = discover_config(
        kafka_bootstrap,
        lake,
        name,
        progress_topic=f"{name}.progress",
        transactional_id_prefix=name,
        signal_topic=None,
    )

    def published(table: str) -> bool:
        topic = f"deltamirror.{name}.{table}.commits"
        return any(r.value and r.json.get("kind") == "commit" for r in read_topic(kafka_bootstrap, topic))

    with Running(cfg) as service:
        _until(service, lambda: published("a"), "the table found at start")
        kit.make_table(lake / "b", versions=1)
        # a rescan every 0.3 s finds it at once; the default (60 s) would not within this bound
        _until(service, lambda: published("b"), "the table created while running", timeout_s=30)


@pytest.mark.s3
def test_storage_options_are_how_the_watcher_reaches_a_table_on_an_object_store(
    kafka_bootstrap: str, tmp_path: Path, kit: Any, s3: Any
) -> None:
    local = kit.make_table(tmp_path / "t", versions=2)
    url = s3.upload_table(local, s3.new_prefix("fx") + "/t")
    table_settings = {"uri": url, "snapshot_mode": "from-version", "from_version": 0}
    right = _cfg(
        kafka_bootstrap, kit, local, table_settings={**table_settings, "storage_options": s3.storage_options}
    )
    with Running(right) as service:
        _until(service, lambda: 1 in _commit_versions(kafka_bootstrap, right), "versions 0 and 1 from S3")

    wrong_options = {k: ("not-the-secret" if k == "secret" else v) for k, v in s3.storage_options.items()}
    assert wrong_options != s3.storage_options
    wrong = _cfg(
        kafka_bootstrap, kit, local, table_settings={**table_settings, "storage_options": wrong_options}
    )
    # the wrong secret: refused when the service starts (as `watch` refuses it), naming the setting
    service = WatchService(wrong, stop_budget_s=5.0)
    try:
        with pytest.raises(ConfigError) as refused:
            service.start()
    finally:
        service.close()
    said = str(refused.value)
    assert "tables[0].storage_options" in said and "not-the-secret" not in said, said
    assert _commit_versions(kafka_bootstrap, wrong) == []
