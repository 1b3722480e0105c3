"""A discover prefix with ``topics: shared``: every table found publishes to the prefix's two
topics, keyed by its ``tableId``, and each table read back alone is its own events, nothing of the
other tables mixed in (issue 29 item 2)."""

from __future__ import annotations

import itertools
import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from deltamirror.cli.main import main
from deltamirror.consumer.mirror_changes import MirrorIndex, MirrorSettings, read_mirror_versions
from deltamirror.core.errors import ConfigError
from deltamirror.core.storage import normalize_table_uri
from deltamirror.core.timestamps import CommitTimestamp, TimestampSource
from deltamirror.mirror.kafka.consumer import Record
from deltamirror.producer.discovery.scan import DiscoveredTable, discovered_config
from deltamirror.producer.publishing.tails import _tail_of
from deltamirror.producer.settings import DiscoverConfig, WatchConfig, merge_overrides
from deltamirror.producer.tailing.work import Position
from support.records import commit_info_value
from support.watching import shared_watch_settings


def _whole(records: list[Any]) -> int:
    """How many whole records ``records`` hold: a split one counts at its last fragment."""
    n = 0
    for r in records:
        fragment = r.headers.get("fragment")
        if fragment is None:
            n += 1
        else:
            index, total = fragment.decode().split("/")
            n += int(index) + 1 == int(total)
    return n


def _watch_until(kafka_bootstrap: str, kit: Any, lake: Path, name: str, wanted: int, **top: Any) -> list[Any]:
    """Run a watcher over ``lake`` with shared topics (``top``: more settings of the watcher) until
    its actions topic holds ``wanted`` whole records; the records of both topics."""
    from deltamirror.producer.service import WatchService

    cfg = WatchConfig.model_validate(shared_watch_settings(kafka_bootstrap, lake, name, **top))
    service = WatchService(cfg, stop_budget_s=5.0)
    service.start()
    try:
        actions = kit.consume(
            kafka_bootstrap,
            [f"deltamirror.{name}.actions"],
            until=lambda rs: _whole(rs) >= wanted,
            timeout_s=90,
        )
        commits = kit.consume(
            kafka_bootstrap,
            [f"deltamirror.{name}.commits"],
            until=lambda rs: (
                {r.json["tableUri"] for r in rs if r.headers.get("kind") == b"commit"}
                >= {normalize_table_uri(str(p)) for p in _tables(lake)}
            ),
            timeout_s=60,
        )
        assert service._failure is None, service._failure
    finally:
        service.request_stop()
        assert service.wait(30), "the watcher did not stop"
        service.close()
    assert _whole(actions) == wanted  # nothing more came while waiting for the summaries
    return [*actions, *commits]


def _tables(lake: Path) -> list[Path]:
    return sorted(p.parent for p in lake.rglob("_delta_log"))


def _own_events(kit: Any, table: Path) -> list[Any]:
    return [json.loads(line) for line in kit.events_output(table)]


def _mirror_read(
    bootstrap: str, name: str, table: Path, commits: str | None = None
) -> list[tuple[int, list[Any]]]:
    """What the Spark source's reader takes from the shared topics for ``table``: (version, actions).
    ``name``: the prefix's (its topics deltamirror.NAME.actions/.commits), or with ``commits`` the
    actions topic itself."""
    actions = name if commits is not None else f"deltamirror.{name}.actions"
    settings = MirrorSettings(bootstrap, actions, commits or f"deltamirror.{name}.commits", str(table))
    index = MirrorIndex(settings)
    index.refresh()
    assert index.first == 0 and index.latest is not None and index.table_id is not None
    index.check_available(0, index.latest)
    versions = read_mirror_versions(
        settings,
        table_id=index.table_id,
        partition=index.actions_partition(),
        start=0,
        end=index.latest,
        start_timestamp_ms=index.timestamp(0),
    )
    return [(v.version, [action for _, action in v.actions]) for v in versions]


def _by_version(events: list[Any]) -> list[tuple[int, list[Any]]]:
    out: dict[int, list[Any]] = {}
    for e in events:
        out.setdefault(e["version"], []).append(e["action"])
    return sorted(out.items())


@pytest.mark.kafka
def test_two_tables_on_shared_topics_read_back_per_table_equal_their_own_events(
    kafka_bootstrap: str, tmp_path: Path, kit: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    lake = tmp_path / "lake"
    a = kit.make_table(lake / "a", versions=3)
    b = kit.make_table(lake / "sales" / "b", versions=2)
    own = {normalize_table_uri(str(t)): _own_events(kit, t) for t in (a, b)}
    assert len({events[0]["tableId"] for events in own.values()}) == 2
    name = kit.unique("shared")
    records = _watch_until(kafka_bootstrap, kit, lake, name, sum(len(e) for e in own.values()))

    # one topic each for actions and commits, whatever the number of tables; keyed by tableId
    assert {r.topic for r in records} == {f"deltamirror.{name}.actions", f"deltamirror.{name}.commits"}
    for uri, events in own.items():
        mine = [r for r in records if r.json["tableUri"] == uri]
        assert {r.key for r in mine} == {events[0]["tableId"].encode()}
        assert [r.json for r in mine if r.topic.endswith(".actions")] == events
        assert [r.json["version"] for r in mine if r.headers.get("kind") == b"commit"] == sorted(
            {e["version"] for e in events}
        )

    # the Spark source's reader takes one table's records off the shared topics
    for table in (a, b):
        assert _mirror_read(kafka_bootstrap, name, table) == _by_version(own[normalize_table_uri(str(table))])

    # consume-snapshot and invalidate keep each table of the topic apart (their lines are per table)
    _consumers_see_each_table(kafka_bootstrap, kit, f"deltamirror.{name}.actions", own, tmp_path, capsys)


def _consumers_see_each_table(
    bootstrap: str,
    kit: Any,
    topic: str,
    own: dict[str, list[Any]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    commits: str | None = None,
) -> None:
    """consume-snapshot and invalidate over ``topic`` (and its commits topic) see each table of
    ``own`` (location -> its events) version by version, every file of it."""
    group = [
        "--bootstrap-servers",
        bootstrap,
        "--once",
        *(["--commits-topic", commits] if commits else ["--commits-topic"]),
        "--topic",
        topic,
        "--group-id",
    ]
    capsys.readouterr()
    assert main(["consume-snapshot", *group, kit.unique("snap")]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    delivered = tmp_path / f"delivered-{kit.unique('d')}.txt"
    delivered.touch()
    hook = f"sh -c 'echo \"$DELTAMIRROR_TABLE $DELTAMIRROR_VERSION\" >> {delivered}'"
    assert main(["invalidate", *group, kit.unique("inv"), "--exec", hook]) == 0
    handed = [line.split() for line in delivered.read_text().splitlines()]
    for uri, events in own.items():
        n = len(_by_version(events))
        files = [
            (x["version"], x["files"])
            for x in lines
            if "kind" not in x and x["tableId"] == events[0]["tableId"]
        ]
        assert files == [(v, v + 1) for v in range(n)]
        assert [int(v) for table, v in handed if table == uri] == list(range(n))
    assert len(handed) == sum(len(_by_version(e)) for e in own.values())


def _wide_table(path: Path, versions: int) -> Path:
    """A table of 60 columns: its metaData (the schema) and each add (its stats) pass 1 KB."""
    import pyarrow as pa
    from deltalake import write_deltalake

    for v in range(versions):
        wide = pa.table({f"a_rather_long_column_name_{i:03d}": pa.array([v], pa.int64()) for i in range(60)})
        write_deltalake(str(path), wide, mode="append")
    return path


def _interleaved(records: list[Any]) -> list[Any]:
    """The records of each key in their order, the keys taking turns record by record: every
    table's split record gets the other tables' records between its fragments."""
    by_key: dict[bytes | None, list[Any]] = {}
    for r in records:
        by_key.setdefault(r.key, []).append(r)
    queues = list(by_key.values())
    out: list[Any] = []
    while any(queues):
        for queue in queues:
            if queue:
                out.append(queue.pop(0))
    return out


def _event_position(event: dict[str, Any]) -> Position:
    timestamp = CommitTimestamp(
        event["version"], event["commitTimestamp"], TimestampSource(event["commitTimestampSource"])
    )
    return Position(
        event["tableId"], event["version"], event["index"], event["count"], timestamp, event["snapshot"]
    )


@pytest.mark.kafka
@pytest.mark.timeout(240)
def test_split_records_between_another_tables_on_a_shared_topic_are_read_whole_by_every_reader(
    kafka_bootstrap: str, tmp_path: Path, kit: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """oversize_policy split (the default) on shared topics: two tables' records, each split into
    fragments, written so that the other table's records come between every two fragments. The
    change feed's reader (the Spark source's), consume-snapshot, invalidate and the watcher's tail
    read each take every record whole (they joined fragments per partition and refused them)."""
    from deltamirror.mirror.topics import TopicManager
    from deltamirror.producer.publishing.tails import read_tails
    from support.forge import read_all, write_topics

    lake = tmp_path / "lake"
    tables = [_wide_table(lake / "a", 2), _wide_table(lake / "sales" / "b", 3)]
    own = {normalize_table_uri(str(t)): _own_events(kit, t) for t in tables}
    name = kit.unique("split")
    _watch_until(kafka_bootstrap, kit, lake, name, sum(len(e) for e in own.values()), max_record_bytes=1024)
    written = read_all(kafka_bootstrap, f"deltamirror.{name}.actions")
    actions = _interleaved(written)
    runs: dict[bytes | None, list[int]] = {}  # per key, the places of its records' fragments
    for at, r in enumerate(actions):
        if dict(r.headers).get("fragment") is not None:
            runs.setdefault(r.key, []).append(at)
    assert len(runs) == 2, "both tables' records were split"
    # another table's record between two fragments of one record of each table
    assert all(any(b - a > 1 for a, b in itertools.pairwise(places)) for places in runs.values())
    topics = write_topics(kafka_bootstrap, actions, read_all(kafka_bootstrap, f"deltamirror.{name}.commits"))

    # the Spark source's reader: one table's records, each whole
    for table in tables:
        uri = normalize_table_uri(str(table))
        assert _mirror_read(kafka_bootstrap, topics.actions, table, topics.commits) == _by_version(own[uri])
    # consume-snapshot and invalidate: every table, every version, every file
    _consumers_see_each_table(kafka_bootstrap, kit, topics.actions, own, tmp_path, capsys, topics.commits)
    # the watcher's tail read at a restart: each table's last record and summary, whole
    manager = TopicManager({"bootstrap.servers": kafka_bootstrap}, max_record_bytes=1_000_000)
    ends = {topic: manager.end_offsets(topic) for topic in (topics.actions, topics.commits)}
    del manager  # its admin client goes with it (no client is left open by a test)

    def end_offsets(topic: str, committed: bool) -> dict[int, int]:
        return ends[topic]  # nothing is written any more: the ends of a read_committed reader

    for uri, events in own.items():
        first, last = events[0], events[-1]
        resume = read_tails(
            {"bootstrap.servers": kafka_bootstrap},
            end_offsets,
            topics.actions,
            topics.commits,
            _event_position(first),
            uri,
        )
        assert resume.overstated is None and resume.already.actions is not None, resume
        assert resume.already.actions.key == (last["version"], last["snapshot"], last["index"])
        assert resume.already.summary is not None and resume.already.summary.version == last["version"]


@pytest.mark.kafka
def test_a_copied_table_on_the_same_shared_topic_is_another_table_to_the_reader(
    kafka_bootstrap: str, tmp_path: Path, kit: Any
) -> None:
    """A copied folder keeps its tableId: on a shared topic the copy's records carry the same key.
    The reader of one location takes that location's records only (it refused the copy's as a
    record moving the table before)."""
    lake = tmp_path / "lake"
    a = kit.make_table(lake / "a", versions=2)
    copy = Path(shutil.copytree(a, lake / "copy"))
    kit.append(copy, n=3)  # the copy goes on alone: version 2 is the copy's only
    own = {t: _own_events(kit, t) for t in (a, copy)}
    assert own[a][0]["tableId"] == own[copy][0]["tableId"]
    name = kit.unique("copies")
    _watch_until(kafka_bootstrap, kit, lake, name, sum(len(e) for e in own.values()))
    for table in (a, copy):
        assert _mirror_read(kafka_bootstrap, name, table) == _by_version(own[table])


def test_a_tables_tail_on_a_shared_topic_is_its_own_not_a_copys_with_the_same_id() -> None:
    """After trouble a table skips what its topics hold past its progress: a copy's later records
    (same id, same key) taken as its own would skip versions the table never published."""
    records = [
        Record("t", 0, i, i, b"same-id", commit_info_value("same-id", uri, v), [], 0)
        for i, (uri, v) in enumerate([("file:///lake/a", 2), ("file:///lake/copy", 7)])
    ]
    tail = _tail_of(records, "same-id", summaries=False, table_uri="file:///lake/a")
    assert tail is not None and tail.position() == Position(
        "same-id", 2, 0, 1, CommitTimestamp(2, 1, TimestampSource.ICT)
    )


def test_shared_topics_are_named_by_the_prefix_and_refused_with_row_changes(tmp_path: Path) -> None:
    prefix = DiscoverConfig.model_validate({"uri": str(tmp_path / "lake"), "topics": "shared"})
    found = discovered_config(DiscoveredTable(f"file://{tmp_path}/lake/x/y", "x/y", "x.y"), prefix)
    assert (found.topics().actions, found.topics().commits) == (
        "deltamirror.lake.actions",
        "deltamirror.lake.commits",
    )
    named = DiscoverConfig.model_validate({"uri": str(tmp_path), "topics": "shared", "name": "eu"})
    assert named.shared_topics() is not None and named.shared_topics().actions == "deltamirror.eu.actions"
    per_table = discovered_config(
        DiscoveredTable(f"file://{tmp_path}/x", "x", "x"), DiscoverConfig(uri=str(tmp_path))
    )
    assert per_table.topics().actions == "deltamirror.x.actions"
    with pytest.raises(ConfigError) as refused:
        merge_overrides(
            {
                "kafka": {"bootstrap_servers": "k:9092"},
                "discover": [{"uri": str(tmp_path), "topics": "shared"}],
            },
            {"row_changes": True},
        )
    message = str(refused.value)
    assert "\n" not in message and "topics" in message and "row_changes" in message, message


def _last_versions(kit: Any, bootstrap: str, commits: str) -> dict[str, int]:
    last: dict[str, int] = {}
    for r in kit.consume(bootstrap, [commits], idle_s=0.3, timeout_s=10):
        if r.headers.get("kind") == b"commit":
            last[r.json["tableUri"]] = max(last.get(r.json["tableUri"], -1), r.json["version"])
    return last


@pytest.mark.kafka
@pytest.mark.timeout(240)
def test_kill_9_with_two_tables_in_transactions_on_one_shared_partition_loses_and_duplicates_nothing(
    kafka_bootstrap: str, tmp_path: Path, kit: Any
) -> None:
    """Two tables' transactions interleave on the shared partition; a kill while records of an open
    one are there, then a restart: each table's records once, in order (its progress is its own)."""
    import os
    import signal
    import subprocess
    import sys

    import yaml

    lake = tmp_path / "lake"
    tables = [kit.make_table(lake / n, versions=1) for n in ("a", "b")]
    for t in tables:
        kit.write_versions(t, 1, 75, 1000)
    name = kit.unique("kill")
    actions, commits = f"deltamirror.{name}.actions", f"deltamirror.{name}.commits"
    config = tmp_path / "watch.yaml"
    config.write_text(
        yaml.safe_dump(shared_watch_settings(kafka_bootstrap, lake, name, txn_max_records=5000))
    )
    log = tmp_path / "watch.log"
    argv = [sys.executable, "-m", "deltamirror.cli.main", "watch", "--config", str(config)]

    def start() -> subprocess.Popen[bytes]:
        with log.open("ab") as out:
            return subprocess.Popen(argv, stdout=out, stderr=out)

    def open_records() -> int:
        try:
            return int(kit.uncommitted_records(kafka_bootstrap, actions))
        except Exception:  # the watcher has not created the topic yet
            return 0

    last, interrupted = 75, False
    for _ in range(5):  # a kill between two transactions proves nothing: try again
        proc = start()
        deadline = time.monotonic() + 60
        while proc.poll() is None and open_records() == 0 and time.monotonic() < deadline:
            if min(_last_versions(kit, kafka_bootstrap, commits).values(), default=-1) >= last:
                break
        assert proc.poll() is None, log.read_text()[-3000:]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        if open_records() > 0:
            interrupted = True
            break
        for t in tables:  # everything was published: more to publish
            kit.write_versions(t, last + 1, 25, 1000, prefix=f"more{last}")
        last += 25
    assert interrupted, "no kill landed inside a transaction in 5 tries"
    restarted = start()
    try:
        deadline = time.monotonic() + 180
        while min(_last_versions(kit, kafka_bootstrap, commits).values(), default=-1) < last:
            assert restarted.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
    finally:
        assert kit.stop_process(restarted) == 0, log.read_text()[-3000:]
    records = kit.consume(kafka_bootstrap, [actions], idle_s=0.5)
    for t in tables:
        uri = normalize_table_uri(str(t))
        assert [r.value for r in records if json.loads(r.value)["tableUri"] == uri] == kit.events_output(t)
    assert len(records) == sum(len(kit.events_output(t)) for t in tables)


def _watch_config(tmp_path: Path, **top: Any) -> dict[str, Any]:
    return {
        "kafka": {"bootstrap_servers": "k:9092"},
        "discover": [{"uri": str(tmp_path / "lake"), "topics": "shared"}],
        **top,
    }


def _refusal(data: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as refused:
        merge_overrides(data, {})
    message = str(refused.value)
    assert "\n" not in message, message
    return message


def test_shared_topics_take_split_records_and_refuse_topics_another_table_or_prefix_has(
    tmp_path: Path,
) -> None:
    """A shared prefix's topics are its own; records are split on them as anywhere (readers join a
    record's fragments per partition and key: another table's records may come between them)."""
    for policy in ("split", "fail"):
        assert merge_overrides(_watch_config(tmp_path, oversize_policy=policy), {}).oversize_policy == policy
    assert merge_overrides(_watch_config(tmp_path), {}).oversize_policy == "split"  # the default

    # another prefix of the same last segment (no name): the same shared topics
    other = {"uri": str(tmp_path / "elsewhere" / "lake"), "topics": "shared"}
    data = _watch_config(tmp_path)
    message = _refusal({**data, "discover": [*data["discover"], other]})
    assert "discover.1.name" in message and "deltamirror.lake.actions" in message, message
    # a configured table whose default topics are the prefix's shared ones
    message = _refusal({**data, "tables": [{"uri": str(tmp_path / "other" / "lake")}]})
    assert "tables" in message and "deltamirror.lake" in message and "shared topic" in message, message


def test_a_table_of_another_prefix_is_refused_on_a_shared_topic_and_one_dropped_frees_nothing(
    tmp_path: Path,
) -> None:
    from deltamirror.producer.discovery.topic_claims import TopicClaims

    shared_prefix = DiscoverConfig.model_validate({"uri": str(tmp_path / "raw"), "topics": "shared"})
    owners = WatchConfig.model_validate(
        {
            "kafka": {"bootstrap_servers": "k:9092"},
            "discover": [{"uri": str(tmp_path / "raw"), "topics": "shared"}],
        }
    ).shared_topic_owners()
    claims = TopicClaims(owners)
    a, b = (
        discovered_config(DiscoveredTable(f"file://{tmp_path}/raw/{n}", n, n), shared_prefix)
        for n in ("a", "b")
    )
    claims.admit(a)
    claims.admit(b)
    claims.release(a.normalized_uri)  # one of the prefix's tables dropped: the topics stay the prefix's
    # a table found under another (per-table) prefix, whose path names its default topics "raw"
    per_table = discovered_config(
        DiscoveredTable(f"file://{tmp_path}/other/raw", "raw", "raw"),
        DiscoverConfig(uri=str(tmp_path / "other")),
    )
    assert per_table.topics().actions == "deltamirror.raw.actions"
    with pytest.raises(ConfigError, match="the shared topic of the tables under"):
        claims.admit(per_table)
    claims.admit(b)  # the prefix's own table again: still its topic
