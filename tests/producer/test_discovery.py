"""Discovery: Delta tables found under a prefix (local and in-memory stores; S3 in
test_s3_discovery.py), followed as they are created and dropped, and the ``tableDropped`` record a
dropped table ends with (real broker)."""

from __future__ import annotations

import json
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

import fsspec
import pytest

from deltamirror.core.errors import ConfigError
from deltamirror.mirror.records.events import TableDropped, decode_commits_record, json_schema
from deltamirror.mirror.topic_names import discovered_topic_name
from deltamirror.producer.discovery.scan import (
    GONE_TABLES,
    DiscoveredTable,
    DiscoveryLoop,
    GoneTables,
    _validated_config,
    discovered_config,
    find_tables,
)
from deltamirror.producer.settings import DiscoverConfig, WatchConfig, merge_overrides
from support.watching import RecordingService, discover_config

V0 = "00000000000000000000.json"


def _kinds(records: list[Any]) -> list[bytes]:
    return [r.headers.get("kind", b"") for r in records]


def _commit0(table_id: str = "t") -> str:
    lines = [
        {"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}},
        {
            "metaData": {
                "id": table_id,
                "format": {"provider": "parquet", "options": {}},
                "schemaString": json.dumps(
                    {
                        "type": "struct",
                        "fields": [{"name": "id", "type": "long", "nullable": True, "metadata": {}}],
                    }
                ),
                "partitionColumns": [],
                "configuration": {},
                "createdTime": 1_700_000_000_000,
            }
        },
        {"commitInfo": {"operation": "CREATE TABLE", "timestamp": 1_700_000_000_000}},
    ]
    return "\n".join(json.dumps(line) for line in lines) + "\n"


def _local_table(path: Path, log_file: str = V0) -> None:
    (path / "_delta_log").mkdir(parents=True)
    (path / "_delta_log" / log_file).write_text(_commit0(path.name))


def _tree(root: Path) -> None:
    """Tables, a folder that only looks like one, a table nested in a table's data, hidden ones."""
    _local_table(root / "orders")
    (root / "orders" / "part=1").mkdir()
    _local_table(root / "orders" / "part=1" / "nested")  # inside a table's data: never looked at
    _local_table(root / "sales" / "eu" / "items")
    _local_table(root / "sales" / "us", "00000000000000000010.checkpoint.parquet")  # cleaned log
    (root / "empty" / "_delta_log").mkdir(parents=True)  # no commit: not a table (yet)
    _local_table(root / ".hidden" / "t")
    _local_table(root / "tmp" / "scratch")
    _local_table(root / "a" / "b" / "c" / "d" / "deep")


def _relatives(source: DiscoverConfig) -> set[str]:
    return {t.relative for t in find_tables(source).values()}


def test_finds_tables_in_a_local_tree(tmp_path: Path) -> None:
    _tree(tmp_path)
    found = find_tables(DiscoverConfig(uri=str(tmp_path)))
    assert {t.relative for t in found.values()} == {
        "orders",
        "sales/eu/items",
        "sales/us",
        "tmp/scratch",
        "a/b/c/d/deep",
    }
    by_rel = {t.relative: t for t in found.values()}
    assert by_rel["sales/eu/items"].uri == f"{tmp_path}/sales/eu/items"
    assert f"file://{tmp_path}/orders" in found  # keyed by normalized URI
    itself = find_tables(DiscoverConfig(uri=str(tmp_path / "orders")))  # a prefix that is a table
    assert [(t.relative, t.topic_name) for t in itself.values()] == [("", None)]  # not its nested one
    assert _relatives(DiscoverConfig(uri=str(tmp_path), max_depth=3)) == {
        "orders",
        "sales/eu/items",
        "sales/us",
        "tmp/scratch",
    }


def test_include_and_exclude_globs(tmp_path: Path) -> None:
    _tree(tmp_path)
    assert _relatives(DiscoverConfig(uri=str(tmp_path), include=["sales"])) == {"sales/eu/items", "sales/us"}
    assert _relatives(DiscoverConfig(uri=str(tmp_path), include=["*/items", "orders"])) == {
        "sales/eu/items",
        "orders",
    }
    assert _relatives(DiscoverConfig(uri=str(tmp_path), exclude=["tmp", "a/*", "sales/u?"])) == {
        "orders",
        "sales/eu/items",
    }


def test_does_not_descend_into_a_table(monkeypatch: pytest.MonkeyPatch) -> None:
    fs = fsspec.filesystem("memory")
    root = f"/disc-{uuid.uuid4().hex[:8]}"
    for rel in ("t1", "x/t2"):
        fs.pipe(f"{root}/{rel}/_delta_log/{V0}", _commit0().encode())
    for i in range(20):  # a table's data: partition folders with files
        fs.pipe(f"{root}/t1/p={i}/sub/f.parquet", b"x")
    listed: list[str] = []
    original = type(fs).ls

    def counting_ls(self: Any, path: str, detail: bool = True, **kw: Any) -> Any:
        listed.append(path)
        return original(self, path, detail=detail, **kw)

    monkeypatch.setattr(type(fs), "ls", counting_ls)
    found = find_tables(DiscoverConfig(uri=f"memory://{root}"))
    assert sorted(t.relative for t in found.values()) == ["t1", "x/t2"]
    assert sorted(t.uri for t in found.values()) == [f"memory://{root}/t1", f"memory://{root}/x/t2"]
    assert not [p for p in listed if "/t1/" in p], f"listed inside a table: {listed}"
    assert len(listed) <= 4  # root, t1, x, x/t2: one listing per folder above the tables


def test_new_and_dropped_tables_in_memory() -> None:
    fs = fsspec.filesystem("memory")
    root = f"/disc-{uuid.uuid4().hex[:8]}"
    source = DiscoverConfig(uri=f"memory://{root}")
    assert find_tables(source) == {}  # the prefix does not exist yet
    fs.pipe(f"{root}/a/_delta_log/{V0}", _commit0().encode())
    assert _relatives(source) == {"a"}
    fs.pipe(f"{root}/b/_delta_log/{V0}", _commit0().encode())
    assert _relatives(source) == {"a", "b"}
    fs.rm(f"{root}/a/_delta_log/{V0}")
    assert _relatives(source) == {"b"}  # a log without versions is no table


def test_topic_names_follow_the_relative_path() -> None:
    assert discovered_topic_name("sales/orders") == "sales.orders"
    assert discovered_topic_name("orders", "lake1") == "lake1.orders"
    # lossy spellings get a digest of the path: a.b/c and a/b.c must not meet
    dotted, other = discovered_topic_name("a.b/c"), discovered_topic_name("a/b.c")
    assert dotted != other
    assert dotted.startswith("a.b.c-") and len(dotted) == len("a.b.c-") + 8
    assert discovered_topic_name("my table/x") == discovered_topic_name("my table/x")  # deterministic
    assert len(discovered_topic_name("x" * 300)) == 200


@pytest.mark.parametrize(
    "prefix",
    [
        {"topics": "shared", "snapshot_mode": "latest", "poll_interval_s": 5},
        {"name": "eu", "snapshot_mode": "from-timestamp", "from_timestamp": "2026-01-01T00:00:00Z"},
        {"exclude": ["tmp*"], "allowed_path_prefixes": ["/elsewhere"], "drop_file_stats": True},
    ],
)
def test_a_discovered_tables_settings_are_its_prefixs_validated_once_and_its_own(
    tmp_path: Path, prefix: dict[str, Any]
) -> None:
    """The copy of the prefix's validated settings a table gets is what validating its own gives."""
    source = DiscoverConfig.model_validate({"uri": str(tmp_path / "lake"), **prefix})
    for relative in ("sales/orders", "a.b/c", "my table/x", "x" * 300, ""):
        table = DiscoveredTable(
            f"{source.uri}/{relative}" if relative else source.uri,
            relative,
            discovered_topic_name(relative, source.name) if relative else None,
        )
        copied, whole = (
            discovered_config(table, source),
            _validated_config(table.uri, table.topic_name, source),
        )
        assert copied == whole and copied.model_fields_set == whole.model_fields_set, relative
        assert copied.normalized_uri == whole.normalized_uri == table.normalized_uri
        assert copied.topics() == whole.topics()
    # a prefix's settings are validated once, never changed by a table's copy
    first = discovered_config(DiscoveredTable(f"{source.uri}/a", "a", "a"), source)
    assert discovered_config(DiscoveredTable(f"{source.uri}/b", "b", "b"), source).normalized_uri.endswith(
        "/b"
    )
    assert first.normalized_uri.endswith("/a")


def test_a_discovered_table_whose_name_its_settings_refuse_is_refused_as_before(tmp_path: Path) -> None:
    """A name the copy cannot vouch for is validated whole: the same refusal as before."""
    source = DiscoverConfig.model_validate({"uri": str(tmp_path / "lake")})
    with pytest.raises(ValueError, match="topic_name"):
        discovered_config(DiscoveredTable(f"{source.uri}/x", "x", "bad name\n"), source)


def _watch_cfg(**kw: Any) -> WatchConfig:
    return WatchConfig.model_validate({"kafka": {"bootstrap_servers": "localhost:1"}, **kw})


def test_loop_adds_new_tables_and_forgets_dropped_ones_after_their_pipeline(tmp_path: Path) -> None:
    _local_table(tmp_path / "one")
    explicit = tmp_path / "configured"
    _local_table(explicit)
    cfg = _watch_cfg(tables=[str(explicit)], discover=[{"uri": str(tmp_path), "poll_interval_s": 0.5}])
    service, gone = RecordingService(), GoneTables()
    loop = DiscoveryLoop(cfg, service, gone=gone)
    loop.scan_now()
    assert [t.uri for t in service.added] == [f"{tmp_path}/one"]  # the configured table is not added again
    added = service.added[0]
    assert (added.topic_name, added.when_deleted, added.poll_interval_s) == ("one", "drop", 0.5)

    _local_table(tmp_path / "two" / "nested")  # created while running
    loop.scan_now()
    assert [t.uri for t in service.added][1:] == [f"{tmp_path}/two/nested"]
    assert service.added[1].topic_name == "two.nested"

    one = f"file://{tmp_path}/one"
    shutil.rmtree(tmp_path / "one")
    loop.scan_now()
    assert one in gone  # its watcher looks at the log now
    assert service.removed == []  # its pipeline still runs: it publishes tableDropped first
    service.running.discard(one)  # ... and ends
    loop.scan_now()
    assert service.removed == [(one, "table dropped")]
    assert one not in gone
    loop.scan_now()
    assert len(service.removed) == 1


def test_discovery_metrics_per_prefix_without_secrets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prometheus_client import generate_latest

    from deltamirror.core.errors import StorageError
    from deltamirror.producer.discovery import scan as discovery
    from deltamirror.producer.metrics import WatcherMetrics

    _local_table(tmp_path / "one")
    _local_table(tmp_path / "sub" / "two")
    unreachable = "s3://AKIAEXAMPLE:s3cr3t@bucket/raw"
    real_find = discovery.find_tables

    def find(source: DiscoverConfig, known: Any = ()) -> Any:
        if source.uri == unreachable:
            raise StorageError("cannot list the discover prefix: no route", table=source.uri)
        return real_find(source, known)

    monkeypatch.setattr(discovery, "find_tables", find)

    class MeasuredService(RecordingService):
        metrics = WatcherMetrics()  # what the watch service has: discovery reports there by default

    service = MeasuredService()
    loop = DiscoveryLoop(_watch_cfg(discover=[str(tmp_path), unreachable]), service, gone=GoneTables())
    loop.scan_now()
    shutil.rmtree(tmp_path / "one")
    loop.scan_now()
    service.running.discard(f"file://{tmp_path}/one")  # its pipeline announced the drop and ended
    loop.scan_now()

    samples = {
        (m.name, s.labels.get("prefix")): s.value
        for m in service.metrics.registry.collect()
        for s in m.samples
        if m.name.startswith("deltamirror_discovery") and not s.name.endswith("_created")
    }
    local, s3 = str(tmp_path), "s3://***@bucket/raw"
    assert samples[("deltamirror_discovery_tables", local)] == 1  # two, then one after the drop
    assert samples[("deltamirror_discovery_scans", local)] == 3
    assert samples[("deltamirror_discovery_scan_errors", local)] == 0
    assert samples[("deltamirror_discovery_tables_dropped", local)] == 1
    assert samples[("deltamirror_discovery_scans", s3)] == 3
    assert samples[("deltamirror_discovery_scan_errors", s3)] == 3
    assert ("deltamirror_discovery_tables", s3) not in samples  # never listed: no count
    assert 0 <= samples[("deltamirror_discovery_last_scan_seconds", local)] < 10
    text = generate_latest(service.metrics.registry).decode()
    assert "deltamirror_discovery_scans_total{" in text and "s3cr3t" not in text and "AKIA" not in text


def test_colliding_topic_names_are_refused(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    _local_table(tmp_path / "p1" / "orders")
    _local_table(tmp_path / "p2" / "orders")
    cfg = _watch_cfg(discover=[str(tmp_path / "p1"), str(tmp_path / "p2")])
    service = RecordingService()
    loop = DiscoveryLoop(cfg, service, gone=GoneTables())
    loop.scan_now()
    loop.scan_now()
    assert [t.uri for t in service.added] == [f"{tmp_path}/p1/orders"]
    refusals = [r for r in caplog.records if "not mirroring" in r.getMessage()]
    assert len(refusals) == 1 and "would share the default actions topic" in refusals[0].getMessage()

    named = _watch_cfg(
        discover=[{"uri": str(tmp_path / "p1"), "name": "a"}, {"uri": str(tmp_path / "p2"), "name": "b"}]
    )
    service = RecordingService()
    DiscoveryLoop(named, service, gone=GoneTables()).scan_now()
    assert sorted(t.topic_name or "" for t in service.added) == ["a.orders", "b.orders"]


def test_settings_allow_discover_without_tables() -> None:
    cfg = _watch_cfg(discover=["s3://lake/tables"])
    assert cfg.tables == [] and cfg.discover[0].interval_s == 60.0
    with pytest.raises(ConfigError) as exc:
        merge_overrides(None, {"bootstrap_servers": "h:1"})
    assert "--discover" in exc.value.message
    from deltamirror.producer.settings import validate_watch_config

    with pytest.raises(ConfigError) as exc:
        validate_watch_config({"kafka": {"bootstrap_servers": "h:1"}}, "w.yaml")
    assert "discover" in exc.value.message and "\n" not in exc.value.message
    with pytest.raises(ConfigError) as exc:
        validate_watch_config(
            {"kafka": {"bootstrap_servers": "h:1"}, "discover": [{"uri": "/x", "interval_s": -1}]}, "w.yaml"
        )
    assert "discover.0.interval_s" in exc.value.message.replace("[", ".").replace("]", "")
    merged = merge_overrides(
        None, {"bootstrap_servers": "h:1", "discover": ["/data/lake"], "poll_interval_s": 0.25}
    )
    assert [(d.uri, d.poll_interval_s) for d in merged.discover] == [("/data/lake", 0.25)]


def test_watcher_ends_a_gone_table_with_table_dropped_work(tmp_path: Path) -> None:
    from deltamirror.producer.tailing.watcher import TableWatcher
    from deltamirror.producer.tailing.work import TableDroppedWork

    watchers = {}
    for name, drop in (("t", True), ("u", False)):
        _local_table(tmp_path / name)
        watcher = watchers[name] = TableWatcher(str(tmp_path / name), drop_when_gone=drop)
        watcher.start(None)
        assert watcher.next_work() is not None  # the snapshot
        assert watcher.next_work() is None
        GONE_TABLES.mark(watcher.uri)
    try:
        assert watchers["t"].next_work() is None  # discovery says gone, but the log is still there
        for name in watchers:
            shutil.rmtree(tmp_path / name / "_delta_log")
        work = watchers["t"].next_work()
        assert isinstance(work, TableDroppedWork)
        assert (work.table_id, work.last_version) == ("t", 0)
        assert watchers["u"].next_work() is None  # a configured table waits for its log to come back
    finally:
        for watcher in watchers.values():
            GONE_TABLES.unmark(watcher.uri)
            watcher.close()


def test_a_gone_marked_table_whose_log_remains_costs_stats_not_listings(tmp_path: Path) -> None:
    from collections import Counter

    from deltamirror.producer.tailing.watcher import TableWatcher
    from deltamirror.producer.tailing.work import TableDroppedWork

    _local_table(tmp_path / "t")
    (tmp_path / "t" / "_delta_log" / "00000000000000000001.json").write_text(
        '{"commitInfo": {"operation": "WRITE", "timestamp": 1700000000001}}\n'
    )
    now = [0.0]
    watcher = TableWatcher(
        str(tmp_path / "t"), drop_when_gone=True, check_interval_s=10, clock=lambda: now[0]
    )
    watcher.start(None)
    assert watcher.next_work() is not None and watcher.next_work() is None
    calls: Counter[str] = Counter()
    for name in ("list_dir", "list_log", "iter_log_from", "info", "exists", "read_bytes", "open"):
        real = getattr(watcher.storage, name)
        setattr(watcher.storage, name, lambda *a, _n=name, _r=real, **k: (calls.update([_n]), _r(*a, **k))[1])
    GONE_TABLES.mark(watcher.uri)
    try:
        assert watcher.next_work() is None  # the first poll since the mark lists the log once
        listings = calls["list_dir"] + calls["list_log"] + calls["iter_log_from"]
        assert listings >= 1, calls
        calls.clear()
        for _ in range(20):  # then: the next version's stat and one of the newest file seen
            assert watcher.next_work() is None
        assert calls == Counter(info=40), calls
        shutil.rmtree(tmp_path / "t" / "_delta_log")
        work = watcher.next_work()  # the newest file gone: a listing, which finds nothing left
        assert isinstance(work, TableDroppedWork) and (work.table_id, work.last_version) == ("t", 1)
    finally:
        GONE_TABLES.unmark(watcher.uri)
        watcher.close()


def test_table_dropped_is_in_the_contract() -> None:
    value = (
        b'{"kind":"tableDropped","schemaVersion":1,"tableUri":"file:///t","tableId":"id1",'
        b'"lastVersion":4,"reason":"gone","detectedAt":1}'
    )
    record = decode_commits_record(value)
    assert isinstance(record, TableDropped) and (record.table_id, record.last_version) == ("id1", 4)
    assert decode_commits_record(value, "tableDropped", wanted={"commit"}) is None
    assert "TableDropped" in json_schema()["$defs"]


def test_dropped_notice_invalidates_the_whole_table() -> None:
    from deltamirror.consumer.invalidate.payload import delivery_id, describe, replacement_payload
    from deltamirror.consumer.snapshot import TableReplacement

    notice = TableReplacement("file:///t", "id1", "id1", 4, "gone", 4, 12, dropped=True)
    payload = replacement_payload(notice)
    assert payload["kind"] == "tableDropped" and payload["tableId"] == "id1" and payload["lastVersion"] == 4
    assert delivery_id(payload) == "id1:dropped"
    assert describe(payload) == "the drop of table id1"


@pytest.mark.kafka
def test_a_table_discovery_no_longer_finds_is_looked_at_then_not_at_its_next_poll(
    kafka_bootstrap: str, tmp_path: Path, kit: Any
) -> None:
    """Idle tables on a local disk poll every 30 s by default: the scan that finds a table gone wakes
    it (before, it ended with tableDropped only at its next poll, an hour away here)."""
    from deltamirror.producer.service import WatchService

    lake = tmp_path / "lake"
    kit.make_table(lake / "a", versions=1)
    name = kit.unique("discwake")
    cfg = discover_config(
        kafka_bootstrap, lake, name, poll_interval_s=3600, progress_topic=kit.unique("progress")
    )
    commits = f"deltamirror.{name}.a.commits"
    service = WatchService(cfg, stop_budget_s=5.0)
    service.start()

    try:
        kit.consume(kafka_bootstrap, [commits], until=lambda rs: b"commit" in _kinds(rs), timeout_s=30)
        shutil.rmtree(lake / "a")
        kit.consume(kafka_bootstrap, [commits], until=lambda rs: b"tableDropped" in _kinds(rs), timeout_s=30)
        assert service._failure is None, service._failure
    finally:
        service.request_stop()
        assert service.wait(30), "the watcher did not stop"
        service.close()


@pytest.mark.kafka
def test_watch_discovers_created_tables_and_announces_dropped_ones_once(
    kafka_bootstrap: str, tmp_path: Path, kit: Any
) -> None:
    from deltamirror.consumer.snapshot import SnapshotConsumer, TableReplacement
    from deltamirror.producer.service import WatchService

    lake = tmp_path / "lake"
    kit.make_table(lake / "a", versions=2)
    name = kit.unique("disc")
    progress = kit.unique("progress")
    cfg = discover_config(kafka_bootstrap, lake, name, progress_topic=progress)
    a_commits, b_commits = f"deltamirror.{name}.a.commits", f"deltamirror.{name}.sub.b.commits"
    a_uri = f"file://{lake}/a"
    service = WatchService(cfg, stop_budget_s=5.0)
    service.start()

    try:
        kit.consume(kafka_bootstrap, [a_commits], until=lambda rs: b"commit" in _kinds(rs), timeout_s=30)
        kit.make_table(lake / "sub" / "b", versions=1)  # created while the watcher runs
        kit.consume(kafka_bootstrap, [b_commits], until=lambda rs: b"commit" in _kinds(rs), timeout_s=30)

        shutil.rmtree(lake / "a")
        kit.consume(
            kafka_bootstrap, [a_commits], until=lambda rs: b"tableDropped" in _kinds(rs), timeout_s=30
        )
        deadline = time.monotonic() + 15
        while a_uri in {t.normalized_uri for t in service.tables()}:  # forgotten once its pipeline ended
            assert time.monotonic() < deadline, "the dropped table was not forgotten"
            assert service._failure is None, service._failure
            time.sleep(0.1)
        assert a_uri not in service.running_tables()
        assert f"file://{lake}/sub/b" in service.running_tables()
        time.sleep(1.0)  # several polls and scans more: nothing else is published for it
    finally:
        service.request_stop()
        assert service.wait(30), "the watcher did not stop"
        service.close()
    assert service._failure is None

    records = kit.consume(kafka_bootstrap, [a_commits], idle_s=0.5, timeout_s=15)
    dropped = [r for r in records if r.headers.get("kind") == b"tableDropped"]
    assert len(dropped) == 1
    assert dropped[0] is records[-1]  # the table's last record
    event = decode_commits_record(dropped[0].value or b"")
    assert isinstance(event, TableDropped)
    summaries = [r.json for r in records if r.headers.get("kind") == b"commit"]
    assert (event.table_uri, event.table_id, event.last_version) == (a_uri, summaries[-1]["tableId"], 1)
    assert dropped[0].key == event.table_id.encode()
    last_progress = [
        r for r in kit.consume(kafka_bootstrap, [progress], idle_s=0.5) if r.key == a_uri.encode()
    ]
    assert last_progress[-1].value is None  # a tombstone: a table created there later starts afresh

    # b is deleted while no watcher runs: the next watcher announces it (and not a again)
    shutil.rmtree(lake / "sub")
    service = WatchService(cfg, stop_budget_s=5.0)
    service.start()
    try:
        kit.consume(
            kafka_bootstrap, [b_commits], until=lambda rs: b"tableDropped" in _kinds(rs), timeout_s=30
        )
        time.sleep(1.0)
    finally:
        service.request_stop()
        assert service.wait(30), "the watcher did not stop"
        service.close()
    assert service._failure is None
    for topic, count in ((a_commits, 1), (b_commits, 1)):
        again = kit.consume(kafka_bootstrap, [topic], idle_s=0.5, timeout_s=15)
        assert _kinds(again).count(b"tableDropped") == count, topic

    notices: list[TableReplacement] = []
    consumer = SnapshotConsumer(
        kafka_bootstrap,
        f"deltamirror.{name}.a.actions",
        commits_topic=a_commits,
        group_id=kit.unique("g"),
        on_replaced=notices.append,
    )
    consumer.run(once=True)
    assert consumer.tables == {}  # the dropped table's state is gone
    assert [(n.dropped, n.table_id, n.previous_version) for n in notices] == [(True, event.table_id, 1)]


def test_watch_takes_repeated_discover_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import deltamirror.producer.service as service_module
    from deltamirror.cli.main import main

    seen: list[WatchConfig] = []
    monkeypatch.setattr(service_module, "run_watch", lambda cfg: seen.append(cfg) or 0)
    argv = [
        "watch",
        "--bootstrap-servers",
        "h:1",
        "--discover",
        str(tmp_path / "a"),
        "--discover",
        "memory://lake",
    ]
    assert main([*argv, "--poll-interval", "0.5", "--snapshot-mode", "latest", "--no-progress"]) == 0
    (cfg,) = seen
    assert cfg.tables == []
    assert [(d.uri, d.poll_interval_s, d.snapshot_mode) for d in cfg.discover] == [
        (str(tmp_path / "a"), 0.5, "latest"),
        ("memory://lake", 0.5, "latest"),
    ]


def test_a_configured_table_with_when_deleted_drop_ends_without_discovery(tmp_path: Path) -> None:
    from deltamirror.core.errors import TableNotFoundError
    from deltamirror.producer.tailing.watcher import TableWatcher
    from deltamirror.producer.tailing.work import Position, TableDroppedWork

    now = [0.0]
    table = tmp_path / "t"
    _local_table(table)
    watcher = TableWatcher(str(table), drop_when_gone=True, check_interval_s=10, clock=lambda: now[0])
    watcher.start(None)
    assert watcher.next_work() is not None and watcher.next_work() is None
    shutil.rmtree(table / "_delta_log")
    assert watcher.next_work() is None  # the slow check is not due yet
    now[0] += 11
    work = watcher.next_work()
    assert isinstance(work, TableDroppedWork) and (work.table_id, work.last_version) == ("t", 0)
    # a restart with the table's progress, the table gone: the same announcement
    watcher.start(Position("t", 0, 2, 3, _ts()))
    assert watcher.next_work() == TableDroppedWork("t", 0, "no commit or checkpoint left in the log")
    # nothing ever published there: a wrong location is an error, not a drop
    with pytest.raises(TableNotFoundError):
        watcher.start(None)
    watcher.close()


def _ts() -> Any:
    from deltamirror.core.timestamps import CommitTimestamp, TimestampSource

    return CommitTimestamp(0, 1_700_000_000_000, TimestampSource.FILE_TIME)


def test_discover_in_a_config_file_with_secrets_redacted(tmp_path: Path) -> None:
    from deltamirror.producer.config_file import load_config, redacted

    path = tmp_path / "w.yaml"
    path.write_text(
        "kafka: {bootstrap_servers: 'h:1'}\n"
        "discover:\n"
        "  - s3://lake/raw\n"
        "  - uri: s3://lake/curated\n"
        "    name: curated\n"
        "    include: ['sales/*']\n"
        "    exclude: ['*/tmp']\n"
        "    interval_s: 30\n"
        "    storage_options: {key: AKIA, secret: s3cr3t}\n"
    )
    cfg = load_config(str(path), environ={})
    raw, curated = cfg.discover
    assert (raw.uri, raw.include, raw.name) == ("s3://lake/raw", [], None)
    assert (curated.name, curated.include, curated.exclude, curated.interval_s) == (
        "curated",
        ["sales/*"],
        ["*/tmp"],
        30.0,
    )
    assert curated.storage_options_plain()["secret"] == "s3cr3t"
    assert "s3cr3t" not in json.dumps(redacted(cfg), default=str)


def test_a_table_emptied_in_place_is_forgotten_once_its_pipeline_dropped_it(tmp_path: Path) -> None:
    _local_table(tmp_path / "t")
    cfg = _watch_cfg(discover=[str(tmp_path)])
    service, gone = RecordingService(), GoneTables()
    loop = DiscoveryLoop(cfg, service, gone=gone)
    loop.scan_now()
    uri = f"file://{tmp_path}/t"
    (tmp_path / "t" / "_delta_log" / V0).unlink()  # the folder stays: a rescan does not look inside
    loop.scan_now()
    assert uri not in gone and service.removed == []
    gone.note_dropped(uri)  # its watcher found the log empty; the pipeline announced it and ended
    service.running.discard(uri)
    loop.scan_now()
    assert service.removed == [(uri, "table dropped")]
    loop.scan_now()
    assert len(service.added) == 1  # not a table any more
    _local_table(tmp_path / "again")
    (tmp_path / "t" / "_delta_log" / V0).write_text(_commit0("t2"))  # created anew
    loop.scan_now()
    assert [t.uri for t in service.added][1:] == [f"{tmp_path}/again", f"{tmp_path}/t"]
