"""Helpers for the producer tests: delta-rs tables, watcher configs, and read_committed consumers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import yaml

from support.kafka import uncommitted_records


@dataclass
class Record:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: dict[str, bytes]
    timestamp: int

    @property
    def json(self) -> Any:
        return json.loads(self.value or b"null")


def rows(start: int, n: int) -> pa.Table:
    ids = list(range(start, start + n))
    return pa.table({"id": pa.array(ids, pa.int64()), "name": pa.array([f"n{i}" for i in ids])})


def make_table(path: Path, versions: int = 3, rows_per_version: int = 2) -> Path:
    """A delta-rs table with ``versions`` versions (0 creates it, then appends)."""
    from deltalake import write_deltalake

    for v in range(versions):
        write_deltalake(str(path), rows(v * rows_per_version, rows_per_version), mode="append")
    return path


def append(path: Path, n: int = 2, start: int = 1000) -> None:
    from deltalake import write_deltalake

    write_deltalake(str(path), rows(start, n), mode="append")


STATS = json.dumps({"numRecords": 10, "minValues": {"id": 1}, "maxValues": {"id": 9}, "nullCount": {"id": 0}})


def write_versions(table: Path, first: int, versions: int, actions: int, *, prefix: str = "gen") -> None:
    """Hand-written commits ``first .. first+versions-1``, each a commitInfo and ``actions`` adds."""
    log = table / "_delta_log"
    for v in range(first, first + versions):
        lines = [
            json.dumps({"commitInfo": {"operation": "WRITE", "readVersion": v - 1, "isBlindAppend": True}})
        ]
        for i in range(actions):
            add = {
                "path": f"{prefix}-{v:05d}-{i:07d}.parquet",
                "partitionValues": {},
                "size": 1000 + i,
                "modificationTime": 1_700_000_000_000,
                "dataChange": True,
                "stats": STATS,
            }
            lines.append(json.dumps({"add": add}))
        tmp = log / f".{v:020d}.json.tmp"
        tmp.write_text("\n".join(lines) + "\n")
        os.rename(tmp, log / f"{v:020d}.json")


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def consume(
    bootstrap: str,
    topics: list[str],
    *,
    isolation: str = "read_committed",
    until: Callable[[list[Record]], bool] | None = None,
    timeout_s: float = 30.0,
    idle_s: float = 2.0,
) -> list[Record]:
    """Every record of ``topics`` from the beginning (in partition order), until ``until`` holds.

    Without ``until``: until nothing new arrived for ``idle_s`` seconds.
    """
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": unique("test"),
            "isolation.level": isolation,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    deadline = time.monotonic() + timeout_s
    while True:  # the watcher may not have created the topics yet
        md = consumer.list_topics(timeout=10)
        if all(t in md.topics and md.topics[t].partitions for t in topics) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    parts = [
        TopicPartition(topic, p, -2)
        for topic in topics
        if topic in md.topics
        for p in md.topics[topic].partitions
    ]
    consumer.assign(parts)
    out: list[Record] = []
    last_new = time.monotonic()
    try:
        while time.monotonic() < deadline:
            if until is not None and until(out):
                return out
            if until is None and time.monotonic() - last_new > idle_s:
                return out
            for m in consumer.consume(5000, timeout=0.2):
                if m.error() is not None:
                    continue
                out.append(
                    Record(
                        m.topic() or "",
                        m.partition() or 0,
                        m.offset() or 0,
                        m.key(),
                        m.value(),
                        {k: v for k, v in (m.headers() or [])},
                        m.timestamp()[1],
                    )
                )
                last_new = time.monotonic()
        if until is not None:
            raise AssertionError(f"condition not met within {timeout_s} s ({len(out)} records read)")
        return out
    finally:
        consumer.close()


def events_output(table: Path | str, *args: str) -> list[bytes]:
    """What ``deltamirror events TABLE ...`` prints, one value per line."""
    done = subprocess.run(
        [sys.executable, "-m", "deltamirror.cli.main", "events", str(table), *args],
        capture_output=True,
        check=True,
        timeout=120,
    )
    return [line for line in done.stdout.split(b"\n") if line]


@dataclass
class WatchSetup:
    """One table watched with its own topics, progress topic and transactional-id prefix."""

    bootstrap: str
    table: Path
    actions: str
    commits: str
    progress: str
    prefix: str
    config: Path

    def cfg(self) -> Any:
        from deltamirror.producer.config import load_config

        return load_config(self.config)

    def start_process(self, *extra: str, log: Path | None = None) -> subprocess.Popen[bytes]:
        out = open(log, "ab") if log is not None else subprocess.DEVNULL  # noqa: SIM115
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        return subprocess.Popen(
            [sys.executable, "-m", "deltamirror.cli.main", "watch", "--config", str(self.config), *extra],
            stdout=out,
            stderr=out,
            env=env,
        )

    def actions_records(self, **kw: Any) -> list[Record]:
        return consume(self.bootstrap, [self.actions], **kw)

    def commits_records(self, **kw: Any) -> list[Record]:
        return consume(self.bootstrap, [self.commits], **kw)

    def progress_records(self, **kw: Any) -> list[Record]:
        return consume(self.bootstrap, [self.progress], **kw)


def write_config(
    path: Path,
    bootstrap: str,
    table: Path,
    *,
    table_settings: dict[str, Any] | None = None,
    **top: Any,
) -> WatchSetup:
    name = unique("t")
    setup = WatchSetup(
        bootstrap,
        table,
        f"{name}.actions",
        f"{name}.commits",
        f"{name}.progress",
        unique("dm"),
        path,
    )
    data = {
        "kafka": {"bootstrap_servers": bootstrap},
        "tables": [
            {
                "uri": str(table),
                "actions_topic": setup.actions,
                "commits_topic": setup.commits,
                "poll_interval_s": 0.2,
                **(table_settings or {"snapshot_mode": "from-version", "from_version": 0}),
            }
        ],
        "progress_topic": setup.progress,
        "transactional_id_prefix": setup.prefix,
        **top,
    }
    path.write_text(yaml.safe_dump(data))
    return setup


def stop_process(proc: subprocess.Popen[bytes], timeout: float = 30) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    return proc.wait(timeout)


@pytest.fixture
def watch_setup(tmp_path: Path) -> Iterator[Callable[..., WatchSetup]]:
    def make(bootstrap: str, table: Path, **kw: Any) -> WatchSetup:
        return write_config(tmp_path / f"{unique('watch')}.yaml", bootstrap, table, **kw)

    yield make


class Kit:
    """The helpers above, for test modules (a conftest is not importable under importlib mode)."""

    Record = Record
    rows = staticmethod(rows)
    make_table = staticmethod(make_table)
    append = staticmethod(append)
    write_versions = staticmethod(write_versions)
    unique = staticmethod(unique)
    consume = staticmethod(consume)
    uncommitted_records = staticmethod(uncommitted_records)
    events_output = staticmethod(events_output)
    stop_process = staticmethod(stop_process)


@pytest.fixture
def kit() -> type[Kit]:
    return Kit
