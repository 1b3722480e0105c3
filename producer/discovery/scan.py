"""Finding the Delta tables under a prefix, and following them as they are created and dropped.

A Delta table is a folder holding ``_delta_log/`` with at least one commit or checkpoint. The scan
walks the prefix one folder level at a time with ``ls`` (one listing request per folder on object
stores), to ``max_depth`` levels: a folder whose listing shows ``_delta_log`` is a table and is
not descended into (its data folders can hold millions of files); names starting with ``.`` or
``_`` are never descended into either (hidden, ``_delta_log``, ``_checkpoints``...). Whether a
``_delta_log`` holds a commit costs one ``info`` of version 0 or of ``_last_checkpoint`` for almost
every table, a listing of the log folder only when both are missing (a cleaned log).

Topic names: a discovered table's default ``<name>`` is its path relative to the prefix, ``/``
written ``.`` (``sales/orders`` -> ``deltamirror.sales.orders.actions``), after the prefix's own
``name`` when it has one (the rule is :func:`~deltamirror.mirror.topic_names.discovered_topic_name`'s). A table
whose topics would still be another's (the same relative path under two prefixes without
``name``, a configured table's topics) is not mirrored, and one error line says so.

:class:`DiscoveryLoop` rescans every ``interval_s`` and hands new tables to the service
(``add_tables``). A table no longer found is marked gone (:data:`GONE_TABLES`); its own watcher
checks its log and, when no commit or checkpoint is left, its pipeline publishes ``tableDropped``
in a transaction with a tombstone of its progress record and ends (the table is configured with
``when_deleted: drop``); the loop then forgets it (``remove_table``). A table found again before
that (re-created) is unmarked and goes on as a re-created table does. Tables deleted while no
watcher ran are found once, at start, on the progress topic: published under a prefix, not found
by its scan, they are run once more to announce their drop the same way.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from deltamirror.core.errors import ConfigError, DeltaMirrorError, StorageError
from deltamirror.core.log import CLASSIC_CP_RE, COMMIT_RE, MULTIPART_CP_RE, UUID_CP_RE
from deltamirror.core.storage import TableStorage, normalize_table_uri
from deltamirror.mirror.errors import KafkaError, StopRequested, TopicNotFoundError
from deltamirror.mirror.topic_names import NAME_PATTERN, discovered_topic_name

from ..metrics import DiscoveryMetrics
from ..settings import DiscoverConfig, TableConfig, WatchConfig, matches_path
from .topic_claims import TopicClaims

log = logging.getLogger("deltamirror.discovery")

LOG_DIR = "_delta_log"


class TableService(Protocol):
    """What discovery needs of the watch service."""

    def add_tables(
        self, tables: Sequence[TableConfig], *, each: Callable[[TableConfig], None] | None = None
    ) -> dict[str, ConfigError]:
        """Mirror ``tables`` too (those it knows already are left as they are), calling ``each``
        with every one admitted; returns the refused ones by normalized URI."""

    def remove_table(self, normalized_uri: str, *, reason: str) -> None: ...
    def running_tables(self) -> set[str]: ...


@dataclass(frozen=True)
class DiscoveredTable:
    """One table found under a prefix: where it is, its path below the prefix, its topic name."""

    uri: str
    relative: str
    #: the ``<name>`` of its default topics (None: the directory name, for a prefix that is a table)
    topic_name: str | None

    @functools.cached_property
    def normalized_uri(self) -> str:  # asked several times per table per scan: made once
        return normalize_table_uri(self.uri)


# --- names --------------------------------------------------------------------------------------


def selected(relative: str, source: DiscoverConfig) -> bool:
    """Whether the include/exclude globs of ``source`` keep the table at ``relative``."""
    if matches_path(relative, source.exclude):
        return False
    return not source.include or matches_path(relative, source.include)


# --- the scan -----------------------------------------------------------------------------------


def _name(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1]


def _is_log_file(name: str) -> bool:
    return any(r.match(name) for r in (COMMIT_RE, CLASSIC_CP_RE, MULTIPART_CP_RE, UUID_CP_RE))


def log_has_versions(fs: Any, log_dir: str) -> bool:
    """Whether a ``_delta_log`` folder holds a commit or a checkpoint (cheap checks first).

    The store's cached listing of the folder (the table's watcher may have made one through the
    same filesystem object) is dropped first: a deleted log must not look present.
    """
    fs.invalidate_cache(log_dir)
    for probe in ("00000000000000000000.json", "_last_checkpoint"):
        try:
            if fs.exists(f"{log_dir}/{probe}"):
                return True
        except OSError:
            pass
    try:
        names = fs.ls(log_dir, detail=False, refresh=True)
    except FileNotFoundError:
        return False
    return any(_is_log_file(_name(str(n))) for n in names)


def _table_at(base_uri: str, relative: str, prefix_name: str | None) -> DiscoveredTable:
    if not relative:  # the prefix is a table itself: named as a configured table would be
        return DiscoveredTable(base_uri, "", prefix_name)
    return DiscoveredTable(f"{base_uri}/{relative}", relative, discovered_topic_name(relative, prefix_name))


def _local_entries(path: str) -> list[dict[str, str]]:
    """A local folder's entries as ``fs.ls(detail=True)`` names them (name, type), from the folder's
    own listing: no stat per entry (a prefix of 10,000 tables is listed at every scan)."""
    with os.scandir(path) as entries:
        return [{"name": entry.path, "type": "directory" if entry.is_dir() else "file"} for entry in entries]


def find_tables(source: DiscoverConfig, known: Container[str] = ()) -> dict[str, DiscoveredTable]:
    """Every Delta table under ``source.uri`` that its globs keep, by normalized URI.

    A table in ``known`` (normalized URIs found before) whose folder is still listed is taken as it
    is, without looking into its log: a rescan costs one listing per folder above the tables (on a
    local disk a table found before costs one ``stat`` of its ``_delta_log``; on an object store
    nothing, its folder being in its parent's listing), and a table whose log is emptied in place is
    left to its own watcher to notice.

    Raises StorageError (retryable) when the prefix cannot be listed; a folder that vanishes
    during the scan is skipped (it is looked at again at the next scan). Listings are asked with
    ``refresh`` (s3fs and others keep a listing cache that would hide new tables).
    """
    storage = TableStorage(source.uri, source.storage_options_plain())
    fs = storage.fs
    root = storage.root
    base_uri = source.uri.rstrip("/")
    found: dict[str, DiscoveredTable] = {}
    level: list[tuple[str, str]] = [(root, "")]
    try:
        for depth in range(source.max_depth + 1):
            next_level: list[tuple[str, str]] = []
            for path, relative in level:
                if relative and known:
                    table = _table_at(base_uri, relative, source.name)
                    if (
                        table.normalized_uri in known
                        and selected(relative, source)
                        and (not storage.is_local or os.path.isdir(f"{path}/{LOG_DIR}"))
                    ):
                        # a table found before: one stat, not a listing of its folder (its data files)
                        # at every rescan; 10,000 tables' rescans idled at several % of a core. On an
                        # object store not even that: its folder is in its parent's listing (a folder
                        # is there while any object is), and a log emptied in place is its watcher's
                        # to notice (1,000 tables on S3 were one LIST each per scan)
                        found[table.normalized_uri] = table
                        continue
                try:
                    entries = (
                        _local_entries(path)
                        if storage.is_local
                        else fs.ls(path, detail=True, refresh=True)  # not a cached listing
                    )
                except FileNotFoundError:
                    if depth == 0:
                        return found  # an empty prefix (object stores have no empty folders)
                    continue
                folders = [str(e["name"]).rstrip("/") for e in entries if e.get("type") == "directory"]
                if LOG_DIR in {_name(f) for f in folders}:
                    table = _table_at(base_uri, relative, source.name)
                    if (not relative or selected(relative, source)) and (
                        table.normalized_uri in known or log_has_versions(fs, f"{path}/{LOG_DIR}")
                    ):
                        found[table.normalized_uri] = table
                    continue  # a table: its data folders are not looked into
                if depth == source.max_depth:
                    continue
                for full in folders:
                    name = _name(full)
                    if name.startswith((".", "_")):
                        continue
                    child = f"{relative}/{name}" if relative else name
                    if matches_path(child, source.exclude):
                        continue
                    next_level.append((full, child))
            level = next_level
            if not level:
                break
    except DeltaMirrorError:
        raise
    except OSError as exc:
        raise StorageError(f"cannot list the discover prefix: {exc}", table=storage.uri) from None
    return found


#: the settings a discover prefix gives every table it finds: each one both models have, found
#: from the models themselves (a per-table setting added to both is carried without a list here)
INHERITED = tuple(sorted((set(DiscoverConfig.model_fields) & set(TableConfig.model_fields)) - {"uri"}))


def _validated_config(uri: str, topic_name: str | None, source: DiscoverConfig) -> TableConfig:
    inherited = {name: getattr(source, name) for name in INHERITED if name in source.model_fields_set}
    shared = source.shared_topics()
    if shared is not None:  # topics: shared: the prefix's two topics, named in the table's settings
        inherited |= {"actions_topic": shared.actions, "commits_topic": shared.commits}
    return TableConfig(uri=uri, topic_name=topic_name, when_deleted="drop", **inherited)


#: a discovered table's ``topic_name`` as :class:`TableConfig` takes it (its ``NAME_PATTERN``)
_TOPIC_NAME = re.compile(NAME_PATTERN)
#: per prefix (by identity; the prefix kept with it): its tables' settings validated once, at the
#: prefix's own location; each table's are a copy with its location and topic name
_TEMPLATES: dict[int, tuple[DiscoverConfig, TableConfig]] = {}
_TEMPLATES_KEPT = 64


def _template(source: DiscoverConfig) -> TableConfig:
    kept = _TEMPLATES.get(id(source))
    if kept is not None and kept[0] is source:
        return kept[1]
    template = _validated_config(source.uri, None, source)
    if len(_TEMPLATES) >= _TEMPLATES_KEPT:
        _TEMPLATES.clear()
    _TEMPLATES[id(source)] = (source, template)
    return template


def discovered_config(table: DiscoveredTable, source: DiscoverConfig) -> TableConfig:
    """The settings a discovered table is mirrored with: its prefix's per-table settings
    (:data:`INHERITED`), topics named by its path (the prefix's shared ones with ``topics:
    shared``), dropped when deleted.

    The prefix's settings are validated once (at the prefix's location), and each table's are a
    copy with its own location and topic name: validating a model per table was a fifth of a
    table's hand-off at 10,000 tables. What the copy skips depends on the location and the name
    only: a location that normalizes, the name's pattern, and whether the location is local
    (storage options are refused there); a table that differs from its prefix there is validated
    whole, and refused as before."""
    template = _template(source)
    name = table.topic_name
    try:
        uri = table.normalized_uri
    except DeltaMirrorError:
        uri = ""
    if (
        not uri
        or (name is not None and _TOPIC_NAME.fullmatch(name) is None)
        or uri.startswith("file://") != template.normalized_uri.startswith("file://")
    ):
        return _validated_config(table.uri, name, source)
    config = template.model_copy(update={"uri": table.uri, "topic_name": name})
    config.__pydantic_private__["_normalized_uri"] = uri  # type: ignore[index]
    return config


# --- tables the scan no longer finds --------------------------------------------------------------


class GoneTables:
    """Normalized URIs discovery no longer finds: their watchers check whether the log is gone.

    Thread-safe sets shared by the discovery loop (which marks and unmarks), the watchers (which
    look, once per idle poll: a set lookup) and the pipelines, which note a table whose
    ``tableDropped`` they committed (also one they found gone on their own) so that discovery
    forgets it.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._uris: set[str] = set()
        self._dropped: set[str] = set()

    def mark(self, uri: str) -> None:
        with self._lock:
            self._uris.add(uri)

    def unmark(self, uri: str) -> None:
        with self._lock:
            self._uris.discard(uri)

    def __contains__(self, uri: object) -> bool:
        return uri in self._uris

    def note_dropped(self, uri: str) -> None:
        with self._lock:
            self._dropped.add(uri)

    def dropped(self, uri: str) -> bool:
        return uri in self._dropped

    def forget(self, uri: str) -> None:
        with self._lock:
            self._uris.discard(uri)
            self._dropped.discard(uri)


#: the one set of the process (a watcher is told nothing else about discovery)
GONE_TABLES = GoneTables()


# --- the loop ------------------------------------------------------------------------------------


def published_tables(kafka: dict[str, Any], progress_topic: str, *, stop: threading.Event) -> set[str]:
    """Normalized URIs whose last progress record is not a tombstone: the progress topic read
    ``read_committed`` to its end (one compacted record per table)."""
    from deltamirror.mirror.kafka.consumer import MirrorConsumer

    live: dict[bytes, bool] = {}
    with MirrorConsumer(kafka, purpose="discovery") as consumer:
        try:
            partitions = consumer.partitions(progress_topic, stop=stop)
        except TopicNotFoundError:
            return set()
        assert partitions is not None
        consumer.assign((progress_topic, p, None) for p in partitions)
        for batch in consumer.batches(until_end=True, stop=stop, timeout_s=120.0):
            for record in batch:
                if record.key is not None:
                    live[record.key] = bool(record.value)
    return {key.decode(errors="replace") for key, alive in live.items() if alive}


class DiscoveryLoop:
    """Scans every prefix of ``cfg.discover`` on its own interval; adds and forgets tables.

    ``scan_now()`` runs one round synchronously (tests; the first round at start). After the first
    scan the progress topic is read once for tables of the prefixes that were published but are
    gone now (deleted while no watcher ran): they get their ``tableDropped`` too.

    Each scan and each dropped table is reported to ``metrics`` (by default the service's own
    metrics, when they measure discovery: ``/metrics`` has them with the tables').
    """

    def __init__(
        self,
        cfg: WatchConfig,
        service: TableService,
        *,
        stop: threading.Event | None = None,
        gone: GoneTables = GONE_TABLES,
        metrics: DiscoveryMetrics | None = None,
    ) -> None:
        self.cfg = cfg
        self.service = service
        if metrics is None:
            own = getattr(service, "metrics", None)
            metrics = own if isinstance(own, DiscoveryMetrics) else None
        self.metrics = metrics
        self.stop = stop if stop is not None else threading.Event()
        self.gone = gone
        explicit = {t.normalized_uri for t in cfg.tables}
        #: configured tables: never discovered again, and their topics are taken
        self._explicit = explicit
        self._taken_topics = TopicClaims(cfg.shared_topic_owners())
        for t in cfg.tables:
            self._taken_topics.claim(t)
        #: tables discovered and handed to the service, by normalized uri -> (prefix index, table)
        self.tables: dict[str, tuple[int, DiscoveredTable]] = {}
        self._next_scan = [0.0] * len(cfg.discover)
        self._refused: set[str] = set()
        #: prefixes scanned once at least (only their tables can be told gone)
        self._scanned: set[int] = set()
        #: the progress topic was read for tables dropped while no watcher ran
        self._adopted = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="watch-discovery", daemon=True)
        self._thread.start()

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self.stop.is_set():
            self.scan_now(only_due=True)
            if not self._adopted and self._scanned:
                self._adopt_unannounced()
            due = min(self._next_scan, default=time.monotonic() + 1.0)
            self.stop.wait(max(0.05, min(1.0, due - time.monotonic())))

    def scan_now(self, *, only_due: bool = False) -> None:
        """One scan of every prefix (of every one whose interval has passed, with ``only_due``)."""
        now = time.monotonic()
        for i, source in enumerate(self.cfg.discover):
            if only_due and now < self._next_scan[i]:
                continue
            self._next_scan[i] = now + source.interval_s
            began = time.monotonic()
            try:
                found = find_tables(source, known=self.tables)
            except DeltaMirrorError as exc:  # storage trouble: nothing is concluded from this scan
                log.warning("discovery: %s", exc.message, extra={"table": exc.table})
                if self.metrics is not None:
                    self.metrics.discovery_scanned(source.uri, time.monotonic() - began, None)
                continue
            if self.metrics is not None:
                self.metrics.discovery_scanned(source.uri, time.monotonic() - began, len(found))
            self._scanned.add(i)
            self._apply(i, source, found)
        self._forget_finished()

    def _apply(self, index: int, source: DiscoverConfig, found: dict[str, DiscoveredTable]) -> None:
        new: list[tuple[str, DiscoveredTable]] = []
        for uri, table in sorted(found.items()):
            if uri in self._explicit:
                continue
            self.gone.unmark(uri)
            if uri not in self.tables:
                new.append((uri, table))
        self._admit_many(index, source, new)
        for uri, (i, _) in self.tables.items():
            if i == index and uri not in found and uri not in self.gone:
                self.gone.mark(uri)
                log.info("discovery: table no longer found; checking its log", extra={"table": uri})
                wake = getattr(self.service, "wake_table", None)
                if wake is not None:  # it looks at once, not at its next poll (30 s by default)
                    wake(uri)

    def _admit_many(
        self,
        index: int,
        source: DiscoverConfig,
        new: list[tuple[str, DiscoveredTable]],
        *,
        say_found: bool = True,
    ) -> list[str]:
        """Hand a scan's new tables to the service at once, unless their topics are another's (said
        once per table). The service starts them on several threads (a table's start waits on its
        storage; one by one here, 10,000 tables took 44 s), and says each table found there
        (``say_found``), not here (a log line is a write). Returns the admitted tables' URIs."""
        configs: list[tuple[str, DiscoveredTable, TableConfig]] = []
        for uri, table in new:
            try:
                config = discovered_config(table, source)
                self._taken_topics.check(
                    config,
                    hint="give the discover prefixes a name, or configure the table with its own topics",
                )
            except ConfigError as exc:
                self._refuse(uri, exc)
                continue
            self._taken_topics.claim(config)  # a later table of this scan on the same topics is refused
            configs.append((uri, table, config))

        def found(config: TableConfig) -> None:
            log.info(
                "discovery: new table", extra={"table": config.normalized_uri, "topicName": config.topic_name}
            )

        if not configs:
            return []
        refused = self.service.add_tables(
            [config for _, _, config in configs], each=found if say_found else None
        )
        admitted: list[str] = []
        for uri, table, _ in configs:
            refusal = refused.get(uri)
            if refusal is not None:
                self._taken_topics.release(uri)
                self._refuse(uri, refusal)
                continue
            self._refused.discard(uri)
            self.tables[uri] = (index, table)
            admitted.append(uri)
        return admitted

    def _refuse(self, uri: str, exc: ConfigError) -> None:
        if uri not in self._refused:
            log.error("discovery: not mirroring %s: %s", uri, exc.message, extra={"table": uri})
            self._refused.add(uri)

    def _adopt_unannounced(self) -> None:
        """Tables of the prefixes with published progress that the scans no longer find: dropped while
        no watcher ran. Each is run once more, marked gone, so that it ends with its ``tableDropped``
        (its pipeline resumes from the progress, finds the log empty and announces it)."""
        try:
            published = published_tables(
                self.cfg.kafka.librdkafka_config(), self.cfg.progress_topic, stop=self.stop
            )
        except (KafkaError, StopRequested) as exc:
            log.warning("discovery: cannot read the progress topic yet: %s", exc)
            return
        self._adopted = True
        for i, source in enumerate(self.cfg.discover):
            if i not in self._scanned:
                continue
            base = normalize_table_uri(source.uri)
            for uri in sorted(published):
                relative = uri[len(base) + 1 :]
                if (
                    not uri.startswith(base + "/")
                    or uri in self.tables
                    or uri in self._explicit
                    or uri in self._refused
                    or relative.count("/") >= source.max_depth
                    or not selected(relative, source)
                ):
                    continue
                table = _table_at(source.uri.rstrip("/"), relative, source.name)
                # one at a time: each is marked gone before the next starts, as it was before
                for admitted in self._admit_many(i, source, [(uri, table)], say_found=False):
                    self.gone.mark(admitted)
                    log.info(
                        "discovery: table dropped while no watcher ran; announcing it",
                        extra={"table": admitted},
                    )

    def _forget_finished(self) -> None:
        """Forget gone tables whose pipeline has ended (after publishing ``tableDropped``)."""
        gone = [u for u in self.tables if u in self.gone or self.gone.dropped(u)]
        if not gone:
            return
        running = self.service.running_tables()
        for uri in gone:
            if uri in running:
                continue
            self.service.remove_table(uri, reason="table dropped")
            index, _ = self.tables.pop(uri)
            if self.metrics is not None:
                self.metrics.discovery_table_dropped(self.cfg.discover[index].uri)
            self.gone.forget(uri)
            self._taken_topics.release(uri)
            log.info("discovery: table dropped and forgotten", extra={"table": uri})


__all__ = [
    "GONE_TABLES",
    "INHERITED",
    "DiscoveredTable",
    "DiscoveryLoop",
    "GoneTables",
    "TableService",
    "discovered_config",
    "find_tables",
    "log_has_versions",
    "published_tables",
    "selected",
]
