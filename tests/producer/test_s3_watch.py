"""The watcher and discovery on S3, through s3fs against a real S3-API server and the real broker.

Commits are uploaded as new objects by another client while the watcher runs, as a writer on
another machine would. The server's own request log counts what an idle watcher costs: an object
store bills every request, and a listing per poll per table is the bill this keeps small.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from deltamirror.producer import WatchConfig
from deltamirror.producer.service import WatchService
from support.s3proxy import S3Proxy, S3Request

pytestmark = [pytest.mark.kafka, pytest.mark.s3]

#: the idle measurement: tables, seconds, poll interval
IDLE_TABLES = 4
IDLE_SECONDS = 5.0
IDLE_POLL_S = 0.25


def _config(kafka_bootstrap: str, kit: Any, s3: S3Proxy, urls: list[str], poll_s: float) -> WatchConfig:
    tables = []
    for url in urls:
        name = kit.unique("s3")
        tables.append(
            {
                "uri": url,
                "storage_options": s3.storage_options,
                "snapshot_mode": "from-version",
                "from_version": 0,
                "actions_topic": f"{name}.actions",
                "commits_topic": f"{name}.commits",
                "poll_interval_s": poll_s,
            }
        )
    return WatchConfig.model_validate(
        {
            "kafka": {"bootstrap_servers": kafka_bootstrap},
            "tables": tables,
            "progress_topic": f"{kit.unique('s3')}.progress",
            "transactional_id_prefix": kit.unique("dm"),
        }
    )


def _versions(kit: Any, bootstrap: str, commits: str) -> list[int]:
    records = kit.consume(bootstrap, [commits], idle_s=0.3, timeout_s=10)
    return [r.json["version"] for r in records if r.headers.get("kind") == b"commit"]


def _wait(condition: Any, service: WatchService, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert service._failure is None, service._failure
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _stop(service: WatchService) -> None:
    service.request_stop()
    assert service.wait(30), "the watcher did not stop"
    service.close()


@pytest.mark.timeout(180)
def test_a_table_on_s3_is_mirrored_and_a_commit_uploaded_while_running_is_published(
    kafka_bootstrap: str, tmp_path: Path, kit: Any, s3: S3Proxy
) -> None:
    local = kit.make_table(tmp_path / "t", versions=2)
    key = s3.new_prefix("watch")
    url = s3.upload_table(local, key)
    cfg = _config(kafka_bootstrap, kit, s3, [url], poll_s=0.2)
    topics = cfg.tables[0]
    service = WatchService(cfg)
    service.start()
    try:
        _wait(lambda: _versions(kit, kafka_bootstrap, topics.commits_topic) == [0, 1], service, 60, "v0, v1")
        before = s3.files_of(local)
        kit.append(local, 3, start=500)  # version 2, written locally, then uploaded as new objects
        s3.upload_table(local, key, skip=before)
        _wait(lambda: 2 in _versions(kit, kafka_bootstrap, topics.commits_topic), service, 60, "v2")
    finally:
        _stop(service)

    assert _versions(kit, kafka_bootstrap, topics.commits_topic) == [0, 1, 2]
    actions = [r.json for r in kit.consume(kafka_bootstrap, [topics.actions_topic], idle_s=0.5)]
    added = sorted(a["action"]["path"] for a in actions if a["version"] == 2 and a["type"] == "add")
    new_files = sorted(f for f in s3.files_of(local) - before if not f.startswith("_delta_log/"))
    assert added == new_files and len(added) >= 1
    assert {a["tableUri"] for a in actions} == {url}


def _per_table(requests: list[S3Request], keys: list[str]) -> dict[str, Counter[str]]:
    """Requests by table and kind; a HEAD of the next version (1: the tables have version 0 only)
    is the poll's probe, and counted apart from the periodic checks."""
    out: dict[str, Counter[str]] = {k: Counter() for k in keys}
    for r in requests:
        where = r.key or r.listed_prefix
        for k in keys:
            if where.startswith(f"{k}/"):
                probe = r.kind == "HEAD" and r.key == f"{k}/_delta_log/{1:020d}.json"
                out[k]["probe" if probe else r.kind] += 1
    return out


@pytest.mark.timeout(180)
def test_an_idle_watcher_sends_at_most_one_request_per_poll_per_table_and_never_lists(
    kafka_bootstrap: str, tmp_path: Path, kit: Any, s3: S3Proxy
) -> None:
    keys, urls = [], []
    for i in range(IDLE_TABLES):
        key = s3.new_prefix(f"idle{i}")
        urls.append(s3.upload_table(kit.make_table(tmp_path / f"t{i}", versions=1), key))
        keys.append(key)
    cfg = _config(kafka_bootstrap, kit, s3, urls, poll_s=IDLE_POLL_S)
    service = WatchService(cfg)
    service.start()
    try:
        for t in cfg.tables:
            _wait(lambda t=t: _versions(kit, kafka_bootstrap, t.commits_topic) == [0], service, 60, "v0")
        time.sleep(1.0)  # past the first idle polls' one-off checks
        mark = s3.mark()
        time.sleep(IDLE_SECONDS)
        idle = _per_table(s3.requests(mark), keys)
        assert service._failure is None, service._failure
    finally:
        _stop(service)

    polls = IDLE_SECONDS / IDLE_POLL_S
    # besides the probes: every check interval (10 s) a HEAD of 0.json and of the cursor's file
    checks = 2 * (math.ceil(IDLE_SECONDS / 10.0) + 1)
    summary = {k[:5]: dict(c) for k, c in idle.items()}
    print(f"idle S3 requests over {IDLE_SECONDS} s, {polls:.0f} polls per table: {summary}")
    for key, kinds in idle.items():
        assert kinds["LIST"] == 0, f"{key}: an idle watcher listed the log: {dict(kinds)}"
        assert set(kinds) <= {"probe", "HEAD", "LIST"}, f"{key}: {dict(kinds)}"
        assert 1 <= kinds["probe"] <= math.ceil(polls) + 1, f"{key}: {dict(kinds)} in {polls:.0f} polls"
        assert kinds["HEAD"] <= checks, f"{key}: {dict(kinds)}"


@pytest.mark.timeout(180)
def test_tables_discovered_under_an_s3_prefix_are_mirrored_including_one_created_while_running(
    kafka_bootstrap: str, tmp_path: Path, kit: Any, s3: S3Proxy
) -> None:
    prefix = s3.new_prefix("found")
    name = prefix  # the prefix's name goes first in the default topic names: unique per run
    s3.upload_table(kit.make_table(tmp_path / "orders", versions=2), f"{prefix}/sales/orders")
    cfg = WatchConfig.model_validate(
        {
            "kafka": {"bootstrap_servers": kafka_bootstrap},
            "discover": [
                {
                    "uri": s3.url(prefix),
                    "storage_options": s3.storage_options,
                    "name": name,
                    "interval_s": 0.5,
                    "poll_interval_s": 0.2,
                }
            ],
            "progress_topic": f"{kit.unique('s3')}.progress",
            "transactional_id_prefix": kit.unique("dm"),
        }
    )
    orders, returns = (f"deltamirror.{name}.sales.{t}.commits" for t in ("orders", "returns"))
    service = WatchService(cfg)
    service.start()
    try:
        # snapshot mode initial: one summary, of the snapshot at the latest version
        _wait(lambda: _versions(kit, kafka_bootstrap, orders) == [1], service, 60, "the orders snapshot")
        s3.upload_table(kit.make_table(tmp_path / "returns", versions=1), f"{prefix}/sales/returns")
        _wait(lambda: _versions(kit, kafka_bootstrap, returns) == [0], service, 60, "the new table")
    finally:
        _stop(service)


def _watch_process(tmp_path: Path, kafka_bootstrap: str, kit: Any, tables: list[dict[str, Any]]) -> Any:
    import subprocess
    import sys

    import yaml

    name = kit.unique("s3start")
    config = tmp_path / f"{name}.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "kafka": {"bootstrap_servers": kafka_bootstrap},
                "tables": [
                    {"actions_topic": f"{name}-{i}.actions", "commits_topic": f"{name}-{i}.commits", **t}
                    for i, t in enumerate(tables)
                ],
                "progress_topic": f"{name}.progress",
                "transactional_id_prefix": name,
                "signal_topic": None,
            }
        )
    )
    err = tmp_path / f"{name}.err"
    with open(err, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "deltamirror.cli.main", "watch", "--config", str(config)],
            stdout=subprocess.DEVNULL,
            stderr=out,
        )
    return proc, err


@pytest.mark.timeout(180)
def test_credentials_the_storage_refuses_are_refused_at_start_and_a_store_that_is_down_is_retried(
    kafka_bootstrap: str, tmp_path: Path, kit: Any, s3: S3Proxy
) -> None:
    """A wrong secret in a table's ``storage_options``: `watch` exits 2 at once with one line naming
    the table and ``storage_options`` (it retried forever). A store that does not answer (a closed
    port) may come back: that table is retried, and the watcher keeps running."""
    import signal
    import socket

    local = kit.make_table(tmp_path / "t", versions=1)
    prefix = s3.new_prefix("creds")
    good = {"uri": s3.upload_table(local, prefix + "/good"), "storage_options": s3.storage_options}
    url = s3.upload_table(local, prefix + "/wrong")
    wrong = {"uri": url, "storage_options": {**s3.storage_options, "secret": "not-the-secret"}}

    proc, err = _watch_process(tmp_path, kafka_bootstrap, kit, [good, wrong])
    try:
        code = proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
    lines = err.read_text().strip().splitlines()
    assert code == 2, lines
    assert lines[-1].startswith("deltamirror: error: "), lines
    assert "tables[1].storage_options" in lines[-1] and url in lines[-1], lines[-1]
    assert "not-the-secret" not in err.read_text()

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]
    down = {
        "uri": url,
        "storage_options": {
            **s3.storage_options,
            "endpoint_url": f"http://127.0.0.1:{closed}",
            # s3fs's and botocore's own retries (backing off for about half a minute) are not what
            # this checks: the watcher's own retry of the table is
            "retries": 1,
            "config_kwargs": {"retries": {"max_attempts": 1}},
        },
    }
    proc, err = _watch_process(tmp_path, kafka_bootstrap, kit, [down])
    try:
        deadline = time.monotonic() + 120
        while "table stopped" not in err.read_text():
            assert proc.poll() is None, err.read_text()  # not refused: retried
            assert time.monotonic() < deadline, err.read_text()
            time.sleep(0.2)
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(30)
    assert code == 0, err.read_text()


@pytest.mark.timeout(180)
def test_a_discover_prefix_whose_storage_refuses_the_credentials_is_refused_at_start(
    kafka_bootstrap: str, tmp_path: Path, kit: Any, s3: S3Proxy
) -> None:
    """The same class one level up: a prefix scanned with a wrong secret was retried forever."""
    import subprocess
    import sys

    import yaml

    local = kit.make_table(tmp_path / "t", versions=1)
    prefix = s3.new_prefix("creds-discover")
    s3.upload_table(local, prefix + "/sales/orders")
    name = kit.unique("s3discover")
    config = tmp_path / f"{name}.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "kafka": {"bootstrap_servers": kafka_bootstrap},
                "discover": [
                    {
                        "uri": s3.url(prefix),
                        "storage_options": {**s3.storage_options, "secret": "not-the-secret"},
                    }
                ],
                "progress_topic": f"{name}.progress",
                "transactional_id_prefix": name,
                "signal_topic": None,
            }
        )
    )
    done = subprocess.run(
        [sys.executable, "-m", "deltamirror.cli.main", "watch", "--config", str(config)],
        capture_output=True,
        timeout=120,
    )
    lines = done.stderr.decode().strip().splitlines()
    assert done.returncode == 2, lines
    assert lines[-1].startswith("deltamirror: error: "), lines
    assert "discover[0].storage_options" in lines[-1] and prefix in lines[-1], lines[-1]
    assert b"not-the-secret" not in done.stderr
