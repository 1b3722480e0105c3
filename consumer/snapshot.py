"""Incremental snapshots: the active files of each mirrored table, kept current from the actions topic.

:class:`IncrementalSnapshot` is the state of one table (one ``tableId``), applied version by version
from action events; :class:`SnapshotConsumer` feeds it from Kafka under ``read_committed`` and can
persist it so that a restart continues where it stopped instead of re-reading the topic.

State representation (v1): the active files are a dict keyed by the replay key of core
(:mod:`deltamirror.core.replay`: canonical path + deletion vector id) holding each ``add`` exactly
as it arrived. An event carries one action, so a per-file upsert/delete is the natural unit here;
:attr:`IncrementalSnapshot.files` builds the Arrow table (the columns of a checkpoint's ``add``, as
``Snapshot.files``) on demand and caches it until the next version.

Restarts (``state_dir``): after the records of a poll batch are handled, every table whose state
changed is written to ``<state_dir>/tables/<hash>.json``, then ``<state_dir>/offsets.json`` with the
next offset to read per partition, each atomically (temp file, fsync, rename); only then are the
offsets stored for the group commit and the applied versions reported. The stored offset of a
partition is the first record of the oldest version still incomplete in it (transactions of
several tables interleave in one partition, and a version can span transactions), so a restart
re-reads every unfinished version whole. Records a table has already applied (``version`` at or
below its state's, see :meth:`IncrementalSnapshot.apply`) are skipped on that re-read. A crash
between the two writes only makes the restart re-read, never lose, records. Without ``state_dir``
nothing is persisted and the state is rebuilt by reading the topic from its beginning (the watcher
creates its topics with unlimited retention). Either way the position comes from the state, not
from the group's committed offset: an offset is meaningless without the state it belongs to. The
group offsets are still committed, so that lag shows in Kafka's tools.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
from pydantic import ValidationError

from deltamirror.core import action_schema
from deltamirror.core.deletion_vectors import dv_unique_id
from deltamirror.core.errors import ConfigError, EventStreamError, KafkaError
from deltamirror.core.events import ActionEvent, FragmentAssembler

log = logging.getLogger(__name__)

DEFAULT_GROUP_ID = "deltamirror-snapshot-consumer"
STATE_FORMAT = 1

FileKey = tuple[str, str]
"""(canonical path, deletion vector id or ""): one logical file, as core's replay keys it."""

_FILE_SCHEME = re.compile(r"^file:/+")


def file_key(action: Mapping[str, Any]) -> FileKey:
    """The replay key of an ``add`` or ``remove`` (same rule as ``core.replay.file_keys``)."""
    path = str(action["path"])
    if path.startswith("file:"):
        path = _FILE_SCHEME.sub("/", path)
    dv = action.get("deletionVector")
    dv_id = dv_unique_id(dv["storageType"], dv["pathOrInlineDv"], dv.get("offset")) if dv else ""
    return path, dv_id


@dataclass(frozen=True)
class Invalidation:
    """What one applied version changed: what a cache of the table's files or data must drop.

    ``added`` are files active after the version that an ``add`` of it (re)wrote, ``removed`` files
    active before it and gone after; a snapshot is compared with the state it replaces. Paths
    appear once per file key (a deletion-vector update names the path in both lists).
    ``partitions`` are the distinct ``partitionValues`` of those files.
    """

    table_id: str
    version: int
    snapshot: bool
    added: tuple[str, ...]
    removed: tuple[str, ...]
    partitions: tuple[dict[str, str | None], ...]
    files: int


@dataclass
class _Pending:
    """The events of the version (or snapshot) being received, in index order."""

    version: int
    snapshot: bool
    count: int
    actions: list[tuple[str, Any]] = field(default_factory=list)


class IncrementalSnapshot:
    """The state of one table, applied from its action events in order.

    A version is applied when its last action (``index == count - 1``) arrives, all at once; until
    then nothing changes. A snapshot (``snapshot: true``) replaces the whole state at its end and
    supersedes an unfinished version. ``complete`` tells whether the state is the whole table: it
    is, once built from version 0 or from a snapshot; a stream that starts at a later version
    (watcher mode ``from-version``) only has the files added since.
    """

    def __init__(self, table_id: str, table_uri: str | None = None) -> None:
        self.table_id = table_id
        self.table_uri = table_uri
        self.version: int | None = None
        self.complete = False
        self.metadata: dict[str, Any] | None = None
        self.protocol: dict[str, Any] | None = None
        self.txns: dict[str, dict[str, Any]] = {}
        self.domains: dict[str, dict[str, Any]] = {}
        self._files: dict[FileKey, dict[str, Any]] = {}
        self._pending: _Pending | None = None
        self._invalidations: list[Invalidation] = []
        self._table: pa.Table | None = None
        #: events ignored because their version was already applied (a re-read after a restart)
        self.skipped_events = 0

    def __repr__(self) -> str:
        return f"IncrementalSnapshot({self.table_id!r}, version={self.version}, files={len(self._files)})"

    # --- reading -------------------------------------------------------------------------------

    @property
    def file_count(self) -> int:
        return len(self._files)

    @property
    def file_keys(self) -> set[FileKey]:
        return set(self._files)

    @property
    def files(self) -> pa.Table:
        """Active files, by path, with the columns of a checkpoint's ``add`` (as ``Snapshot.files``)."""
        if self._table is None:
            rows = [self._files[k] for k in sorted(self._files)]
            self._table = pa.Table.from_pylist(rows, schema=action_schema.ADD)
        return self._table

    @property
    def in_progress(self) -> bool:
        """True while a version or snapshot has arrived only in part."""
        return self._pending is not None

    def invalidations(self) -> list[Invalidation]:
        """The versions applied since the last call, oldest first (the list is then emptied)."""
        out, self._invalidations = self._invalidations, []
        return out

    # --- applying ------------------------------------------------------------------------------

    def apply(self, event: ActionEvent) -> Invalidation | None:
        """Take one event; the :class:`Invalidation` when it completed a version, else None."""
        if event.table_id != self.table_id:
            raise EventStreamError(
                f"event of table {event.table_id} given to the state of {self.table_id}",
                version=event.version,
            )
        if self._already_applied(event):
            self.skipped_events += 1
            return None
        pending = self._pending
        if event.index == 0:
            if pending is not None and not event.snapshot:
                raise EventStreamError(
                    f"version {event.version} starts while {self._describe(pending)} is incomplete "
                    f"({len(pending.actions)} of {pending.count} actions)",
                    table=self.table_id,
                    version=event.version,
                )
            if not event.snapshot and self.version is not None and event.version != self.version + 1:
                raise EventStreamError(
                    f"version {event.version} follows version {self.version}: versions are missing",
                    table=self.table_id,
                    version=event.version,
                )
            pending = self._pending = _Pending(event.version, event.snapshot, event.count)
        elif pending is None or (pending.version, pending.snapshot, pending.count) != (
            event.version,
            event.snapshot,
            event.count,
        ):
            raise EventStreamError(
                f"action {event.index} of {'snapshot' if event.snapshot else 'version'} {event.version} "
                "arrived without the actions before it",
                table=self.table_id,
                version=event.version,
            )
        elif event.index != len(pending.actions):
            raise EventStreamError(
                f"action {event.index} of {self._describe(pending)} arrived after action "
                f"{len(pending.actions) - 1}",
                table=self.table_id,
                version=event.version,
            )
        if event.table_uri:
            self.table_uri = event.table_uri
        pending.actions.append((event.type, event.action))
        if event.index + 1 < event.count:
            return None
        if event.snapshot and event.snapshot_end is not True:
            raise EventStreamError(
                f"the last event of snapshot {event.version} has no snapshotEnd",
                table=self.table_id,
                version=event.version,
            )
        self._pending = None
        return self._apply_version(pending)

    def _already_applied(self, event: ActionEvent) -> bool:
        """A version at or below the state's: re-read after a restart, or republished by the watcher."""
        if self.version is None or event.version > self.version:
            return False
        # a snapshot describes the table at its version: a whole state at or past it has it all;
        # a partial state (started after version 0) is completed by it
        return not event.snapshot or self.complete

    @staticmethod
    def _describe(pending: _Pending) -> str:
        return f"{'snapshot' if pending.snapshot else 'version'} {pending.version}"

    def _apply_version(self, pending: _Pending) -> Invalidation:
        before = self._files
        if pending.snapshot:
            files: dict[FileKey, dict[str, Any]] = {}
            self.metadata = self.protocol = None
            self.txns, self.domains = {}, {}
        else:
            files = dict(before)
        touched: dict[FileKey, Mapping[str, Any]] = {}
        for action_type, action in pending.actions:
            if action_type == "add":
                key = file_key(action)
                files[key] = action
                touched[key] = action
            elif action_type == "remove":
                key = file_key(action)
                gone = files.pop(key, None)
                touched.setdefault(key, gone or action)
            elif action_type == "metaData":
                self.metadata = action
            elif action_type == "protocol":
                self.protocol = action
            elif action_type == "txn":
                self.txns[str(action["appId"])] = action
            elif action_type == "domainMetadata":
                if action.get("removed"):
                    self.domains.pop(str(action["domain"]), None)
                else:
                    self.domains[str(action["domain"])] = action
            # commitInfo, cdc and types this version does not know change no state
        if pending.snapshot:
            touched.update({k: v for k, v in before.items() if k not in files})
        added = [k for k, a in touched.items() if k in files and (not pending.snapshot or k not in before)]
        removed = [k for k in touched if k in before and k not in files]
        partitions: dict[str, dict[str, str | None]] = {}
        for key in (*added, *removed):
            values = (files.get(key) or before.get(key) or touched[key]).get("partitionValues") or {}
            partitions.setdefault(json.dumps(values, sort_keys=True), values)
        self._files = files
        self._table = None
        self.version = pending.version
        self.complete = self.complete or pending.snapshot or pending.version == 0
        invalidation = Invalidation(
            self.table_id,
            pending.version,
            pending.snapshot,
            tuple(k[0] for k in added),
            tuple(k[0] for k in removed),
            tuple(partitions.values()),
            len(files),
        )
        self._invalidations.append(invalidation)
        return invalidation

    def apply_values(self, values: Iterable[bytes | str]) -> list[Invalidation]:
        """Apply serialized action events (e.g. the lines ``deltamirror events`` prints)."""
        out = []
        for value in values:
            applied = self.apply(parse_event(value))
            if applied is not None:
                out.append(applied)
        return out

    # --- persistence ---------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        """The applied state (an unfinished version is not part of it: it is read again)."""
        return {
            "format": STATE_FORMAT,
            "tableId": self.table_id,
            "tableUri": self.table_uri,
            "version": self.version,
            "complete": self.complete,
            "metaData": self.metadata,
            "protocol": self.protocol,
            "txns": self.txns,
            "domains": self.domains,
            "files": [self._files[k] for k in sorted(self._files)],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> IncrementalSnapshot:
        if data.get("format") != STATE_FORMAT:
            raise ConfigError(f"unknown snapshot state format {data.get('format')!r}")
        state = cls(str(data["tableId"]), data.get("tableUri"))
        state.version = data["version"]
        state.complete = bool(data["complete"])
        state.metadata = data["metaData"]
        state.protocol = data["protocol"]
        state.txns = dict(data["txns"])
        state.domains = dict(data["domains"])
        state._files = {file_key(a): a for a in data["files"]}
        return state


def parse_event(value: bytes | str) -> ActionEvent:
    """An actions-topic value as its model; a value that is not one is an :class:`EventStreamError`."""
    try:
        return ActionEvent.model_validate_json(value)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise EventStreamError(f"not an action event: {where}: {first['msg']}") from None


# --- persistence on disk --------------------------------------------------------------------------


def _write_atomically(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as out:
        out.write(json.dumps(data, separators=(",", ":")).encode())
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)


class StateStore:
    """Tables and offsets of one consumer in a directory (see the module docstring)."""

    def __init__(self, directory: str | Path, topic: str) -> None:
        self.root = Path(directory)
        self.topic = topic
        self.tables_dir = self.root / "tables"
        self.tables_dir.mkdir(parents=True, exist_ok=True)
        self.offsets_path = self.root / "offsets.json"

    def _table_path(self, table_id: str) -> Path:
        return self.tables_dir / f"{hashlib.sha1(table_id.encode()).hexdigest()[:16]}.json"

    def load(self) -> tuple[dict[str, IncrementalSnapshot], dict[int, int]]:
        offsets: dict[int, int] = {}
        if self.offsets_path.exists():
            data = json.loads(self.offsets_path.read_text())
            if data.get("topic") != self.topic:
                raise ConfigError(
                    f"state directory {self.root} holds the state of topic {data.get('topic')!r}, "
                    f"not {self.topic!r}"
                )
            offsets = {int(p): int(o) for p, o in data["partitions"].items()}
        tables = {}
        for path in sorted(self.tables_dir.glob("*.json")):
            state = IncrementalSnapshot.from_json(json.loads(path.read_text()))
            tables[state.table_id] = state
        return tables, offsets

    def save(self, tables: Iterable[IncrementalSnapshot], offsets: Mapping[int, int]) -> None:
        for state in tables:  # tables first: a crash before the offsets only means a re-read
            _write_atomically(self._table_path(state.table_id), state.to_json())
        partitions = {str(p): o for p, o in sorted(offsets.items())}
        _write_atomically(self.offsets_path, {"topic": self.topic, "partitions": partitions})


# --- the Kafka consumer ---------------------------------------------------------------------------

AppliedCallback = Callable[[Invalidation, IncrementalSnapshot], None]


class SnapshotConsumer:
    """Keeps an :class:`IncrementalSnapshot` per table of an actions topic.

    Every partition of the topic is assigned to this consumer (no group rebalancing: each
    instance keeps the whole state, so run one per ``state_dir``). ``on_applied`` is called for
    each applied version after the state that includes it is persisted.
    """

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        *,
        group_id: str = DEFAULT_GROUP_ID,
        state_dir: str | Path | None = None,
        kafka: Mapping[str, str] | None = None,
        on_applied: AppliedCallback | None = None,
        stop: threading.Event | None = None,
        batch_size: int = 1000,
    ) -> None:
        self.topic = topic
        self.config = {
            **(kafka or {}),
            "bootstrap.servers": bootstrap_servers,
            "group.id": group_id,
            "isolation.level": "read_committed",
            "enable.auto.commit": True,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
        }
        self.store = StateStore(state_dir, topic) if state_dir is not None else None
        self.tables: dict[str, IncrementalSnapshot] = {}
        self._offsets: dict[int, int] = {}
        if self.store is not None:
            self.tables, self._offsets = self.store.load()
        self.on_applied = on_applied
        self.stop_event = stop or threading.Event()
        self.batch_size = batch_size
        self._assemblers: dict[int, FragmentAssembler] = {}
        self._fragment_start: dict[int, int] = {}
        #: per partition, the offset of the first record of each table's unfinished version
        self._starts: dict[int, dict[str, int]] = {}
        self._dirty: set[str] = set()
        self._applied: list[tuple[Invalidation, IncrementalSnapshot]] = []

    def request_stop(self) -> None:
        self.stop_event.set()

    def run(self, *, once: bool = False, topic_timeout_s: float = 30.0) -> None:
        """Consume until stopped; with ``once``, until every partition is read to its end."""
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        consumer = Consumer(self.config)
        try:
            partitions = self._partitions(consumer, wait=not once, timeout_s=topic_timeout_s)
            if partitions is None:
                return
            consumer.assign(
                [TopicPartition(self.topic, p, self._offsets.get(p, OFFSET_BEGINNING)) for p in partitions]
            )
            at_end: set[int] = set()
            while not self.stop_event.is_set():
                # consume(n, timeout) waits for n records or the whole timeout: keep it short so a
                # live stream's versions are applied (and invalidated) promptly
                for msg in consumer.consume(self.batch_size, timeout=0.05):
                    if self._is_end(msg):
                        at_end.add(msg.partition() or 0)
                        continue
                    at_end.discard(msg.partition() or 0)
                    self._handle(msg.partition() or 0, msg.offset() or 0, msg.value() or b"", msg.headers())
                self._checkpoint(consumer)
                if once and at_end >= set(partitions):
                    break
            self._checkpoint(consumer)
        finally:
            consumer.close()  # commits the stored offsets

    def _partitions(self, consumer: Any, *, wait: bool, timeout_s: float) -> list[int] | None:
        deadline = time.monotonic() + timeout_s
        while not self.stop_event.is_set():
            from confluent_kafka import KafkaException

            try:
                topic = consumer.list_topics(topic=self.topic, timeout=10).topics.get(self.topic)
            except KafkaException as exc:  # no broker answered
                if not wait:
                    raise KafkaError(f"cannot read the metadata of topic {self.topic}: {exc}") from None
                log.warning("cannot read the metadata of topic %s (retrying): %s", self.topic, exc)
                continue
            if topic is not None and topic.error is None and topic.partitions:
                return sorted(topic.partitions)
            if not wait and time.monotonic() > deadline:
                raise ConfigError(f"topic {self.topic} does not exist")
            log.info("waiting for topic %s to exist", self.topic)
            self.stop_event.wait(1.0)
        return None

    @staticmethod
    def _is_end(msg: Any) -> bool:
        from confluent_kafka import KafkaError as RdKafkaError

        err = msg.error()
        if err is None:
            return False
        if err.code() == RdKafkaError._PARTITION_EOF:
            return True
        if err.fatal() or not err.retriable():
            raise KafkaError(f"consuming failed: {err.str()}", topic=msg.topic(), partition=msg.partition())
        log.warning("consumer error (retried): %s", err.str())
        return False

    def _handle(self, partition: int, offset: int, value: bytes, headers: Any) -> None:
        assembler = self._assemblers.setdefault(partition, FragmentAssembler())
        whole = assembler.feed(value, headers)
        if whole is None:
            self._fragment_start.setdefault(partition, offset)
            return
        first = self._fragment_start.pop(partition, offset)
        event = parse_event(whole)
        state = self.tables.get(event.table_id)
        if state is None:
            state = self.tables[event.table_id] = IncrementalSnapshot(event.table_id, event.table_uri)
        applied = state.apply(event)
        state.invalidations()  # reported through on_applied; the list must not grow
        starts = self._starts.setdefault(partition, {})
        if state.in_progress:
            if event.index == 0:
                starts[event.table_id] = first
        else:
            starts.pop(event.table_id, None)
        self._offsets[partition] = offset + 1
        if applied is not None:
            self._dirty.add(event.table_id)
            self._applied.append((applied, state))

    def _safe_offsets(self) -> dict[int, int]:
        """Per partition, where a restart must read from: the oldest unfinished version, or past the end."""
        return {p: min(self._starts.get(p, {}).values(), default=o) for p, o in self._offsets.items()}

    def _checkpoint(self, consumer: Any) -> None:
        if not self._dirty and not self._applied:
            return
        from confluent_kafka import TopicPartition

        offsets = self._safe_offsets()
        if self.store is not None:
            self.store.save((self.tables[t] for t in sorted(self._dirty)), offsets)
        consumer.store_offsets(offsets=[TopicPartition(self.topic, p, o) for p, o in offsets.items()])
        self._dirty.clear()
        applied, self._applied = self._applied, []
        if self.on_applied is not None:
            for invalidation, state in applied:
                self.on_applied(invalidation, state)


__all__ = [
    "DEFAULT_GROUP_ID",
    "IncrementalSnapshot",
    "Invalidation",
    "SnapshotConsumer",
    "StateStore",
    "file_key",
    "parse_event",
]
