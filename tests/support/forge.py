"""Forged records on real topics: a table mirrored once by the real watcher, its records copied to
fresh topics per case, hostile records appended with a plain producer (as anyone with write access
to a topic could), and the consumers run over them.

The copy keeps every record as the watcher wrote it (key, value, headers, timestamp), so what the
consumers read before the forged records is exactly the producer's output.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from support.kafka import new_topic
from support.tables import copy_table
from support.watching import watch_until

Headers = list[tuple[str, bytes]]


@dataclass(frozen=True)
class Rec:
    """One record to write: value (None: a tombstone), key, headers, timestamp (ms; None: now)."""

    value: bytes | None
    key: bytes | None = None
    headers: Headers = field(default_factory=list)
    timestamp_ms: int | None = None


@dataclass
class Base:
    """A table as the real watcher mirrored it: its records per topic, and what they say."""

    table: Path
    uri: str
    table_id: str
    actions: list[Rec]
    commits: list[Rec]
    #: the last version's events, decoded (the template of a forged next version)
    last_events: list[dict[str, Any]]

    @property
    def last_version(self) -> int:
        return int(self.last_events[0]["version"])

    @property
    def versions(self) -> list[int]:
        return sorted({json.loads(r.value or b"{}")["version"] for r in self.actions})


def read_all(bootstrap: str, topic: str) -> list[Rec]:
    """Every committed record of partition 0 of ``topic``, as written (key, value, headers, timestamp)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"forge-{uuid.uuid4().hex[:8]}",
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "enable.auto.commit": False,
        }
    )
    out: list[Rec] = []
    try:
        consumer.assign([TopicPartition(topic, 0, -2)])
        while True:
            msgs = consumer.consume(500, timeout=5.0)
            if not msgs:
                raise TimeoutError(f"no end of {topic} within 5 s")
            done = False
            for m in msgs:
                if m.error() is not None:
                    done = True
                    continue
                headers = [(k, bytes(v or b"")) for k, v in m.headers() or []]
                out.append(Rec(m.value(), m.key(), headers, m.timestamp()[1]))
            if done:
                return out
    finally:
        consumer.close()


def mirror_base(bootstrap: str, table_id: str, workdir: Path) -> Base:
    """``table_id`` (tests/data) copied to ``workdir``, mirrored by the real watcher from version 0."""
    from deltamirror.core.table import open_table

    table = copy_table(table_id, workdir)
    latest = open_table(str(table)).latest_version()
    name = f"forge-{uuid.uuid4().hex[:10]}"
    actions = f"{name}.actions"
    watch_until(bootstrap, table, actions, latest, name, snapshot_mode="from-version", from_version=0)
    action_recs = read_all(bootstrap, actions)
    commit_recs = read_all(bootstrap, actions.replace(".actions", ".commits"))
    events = [json.loads(r.value or b"") for r in action_recs]
    last = [e for e in events if e["version"] == latest]
    return Base(table, events[0]["tableUri"], events[0]["tableId"], action_recs, commit_recs, last)


@dataclass(frozen=True)
class Topics:
    actions: str
    commits: str


def write_case(
    bootstrap: str,
    base: Base,
    *,
    actions: Iterable[Rec] = (),
    commits: Iterable[Rec] = (),
    base_actions: Sequence[Rec] | None = None,
    config: dict[str, str] | None = None,
) -> Topics:
    """Fresh topics holding ``base``'s records (or ``base_actions``), then the forged ones."""
    return write_topics(
        bootstrap,
        [*(base.actions if base_actions is None else base_actions), *actions],
        [*base.commits, *commits],
        config=config,
    )


def write_topics(
    bootstrap: str, actions: Iterable[Rec], commits: Iterable[Rec], *, config: dict[str, str] | None = None
) -> Topics:
    """Fresh actions and commits topics (one partition each) holding these records, in this order."""
    from confluent_kafka import Producer

    name = f"forged-{uuid.uuid4().hex[:10]}"
    topics = Topics(f"{name}.actions", f"{name}.commits")
    for topic in (topics.actions, topics.commits):
        new_topic(bootstrap, topic, config=config)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "message.max.bytes": 2_000_000})
    try:
        for topic, recs in ((topics.actions, actions), (topics.commits, commits)):
            for rec in recs:
                kwargs: dict[str, Any] = {"key": rec.key, "headers": rec.headers, "partition": 0}
                if rec.timestamp_ms is not None:
                    kwargs["timestamp"] = rec.timestamp_ms
                producer.produce(topic, rec.value, **kwargs)
                producer.poll(0)
        assert producer.flush(60) == 0, "forged records not all written"
    finally:
        producer.flush(5)
    return topics


# --- forged records -----------------------------------------------------------------------------


def event(base: Base, **overrides: Any) -> dict[str, Any]:
    """An action event of the next version, consistent with ``base`` (a one-action ``add``)."""
    template = base.last_events[0]
    out: dict[str, Any] = {
        "schemaVersion": 1,
        "tableId": base.table_id,
        "tableUri": base.uri,
        "version": base.last_version + 1,
        "commitTimestamp": template["commitTimestamp"] + 1000,
        "commitTimestampSource": template["commitTimestampSource"],
        "count": 1,
        "snapshot": False,
        "index": 0,
        "type": "add",
        "action": add_action("part-00000-forged.snappy.parquet"),
    }
    out.update(overrides)
    return out


def add_action(path: str, **overrides: Any) -> dict[str, Any]:
    return {
        "path": path,
        "partitionValues": {},
        "size": 1,
        "modificationTime": 0,
        "dataChange": True,
        **overrides,
    }


def action_rec(
    ev: dict[str, Any] | bytes, *, key: bytes | None = None, headers: Headers | None = None
) -> Rec:
    """``ev`` as the watcher would write it: key = tableId, headers version/index/type."""
    if isinstance(ev, bytes):
        return Rec(ev, key, headers or [])
    value = json.dumps(ev, separators=(",", ":")).encode()
    if headers is None:
        headers = [
            ("version", str(ev.get("version")).encode()),
            ("index", str(ev.get("index")).encode()),
            ("type", str(ev.get("type")).encode()),
        ]
    tid = ev.get("tableId")
    return Rec(value, key if key is not None else (tid.encode() if isinstance(tid, str) else None), headers)


def commits_rec(record: dict[str, Any], *, kind: str | None = None, key: bytes | None = None) -> Rec:
    value = json.dumps(record, separators=(",", ":")).encode()
    k = kind if kind is not None else record.get("kind")
    headers = [("kind", str(k).encode())] if k is not None else []
    tid = record.get("tableId")
    return Rec(value, key if key is not None else (tid.encode() if isinstance(tid, str) else None), headers)


def summary(base: Base, **overrides: Any) -> dict[str, Any]:
    """A commit summary of the next version, consistent with ``base``."""
    template = base.last_events[0]
    out: dict[str, Any] = {
        "kind": "commit",
        "schemaVersion": 1,
        "tableId": base.table_id,
        "tableUri": base.uri,
        "version": base.last_version + 1,
        "commitTimestamp": template["commitTimestamp"] + 1000,
        "commitTimestampSource": template["commitTimestampSource"],
        "snapshot": False,
        "actionCount": 1,
        "adds": 1,
        "removes": 0,
        "cdcFiles": 0,
        "bytesAdded": 1,
        "bytesRemoved": 0,
    }
    out.update(overrides)
    return out


def padded(value: bytes) -> bytes:
    """``value`` padded with spaces to the least size of a fragment that is not a record's last
    (:data:`~deltamirror.mirror.records.fragments.MIN_FRAGMENT_BYTES`): a shorter record whose key
    holds no record in part is read as whole, its headers unread."""
    from deltamirror.mirror.records.fragments import MIN_FRAGMENT_BYTES

    return value.ljust(MIN_FRAGMENT_BYTES)


def fragments(value: bytes, index: int, total: int, key: bytes | None = None) -> Rec:
    return Rec(value, key, [("fragment", f"{index}/{total}".encode())])


# --- running the consumers ------------------------------------------------------------------------


def consume_snapshot_argv(bootstrap: str, topics: Topics, state_dir: Path, *extra: str) -> list[str]:
    return [
        "consume-snapshot",
        "--bootstrap-servers",
        bootstrap,
        "--topic",
        topics.actions,
        "--commits-topic",
        topics.commits,
        "--once",
        "--state-dir",
        str(state_dir),
        "--format",
        "jsonl",
        "--group-id",
        # one group per state directory: a state directory records its group and refuses another
        f"forge-{uuid.uuid5(uuid.NAMESPACE_URL, str(state_dir)).hex[:8]}",
        *extra,
    ]


def state_paths(state_dir: Path) -> list[str]:
    """Every path the state's Delta checkpoints name as an active file (what Spark would read)."""
    import pyarrow.parquet as pq

    out: list[str] = []
    for checkpoint in sorted(state_dir.glob("tables/*/_delta_log/*.checkpoint.parquet")):
        rows = pq.read_table(checkpoint, columns=["add"]).column("add").to_pylist()
        out += [r["path"] for r in rows if r is not None]
    return out


def state_uris(state_dir: Path) -> list[str]:
    """The table locations the saved states hold (offsets.json's index and each checkpoint's footer)."""
    text = "\n".join(p.read_text(errors="replace") for p in state_dir.rglob("*.json"))
    return sorted(set(json.loads(f'"{m}"') for m in _uris(text)))


def _uris(text: str) -> list[str]:
    import re

    return re.findall(r'"tableUri": ?"((?:[^"\\]|\\.)*)"', text)
