"""``deltamirror watch``: many tables in one process, each published exactly once and in order.

Every table is served by a bounded pool of workers (``workers``, :mod:`.scheduler`): a table is a
sequence of steps (:class:`~.pipeline.TablePipeline`), on one worker at a time, so its order is
kept; an idle table costs no thread, only a place in the scheduler's heap. Alone, each table has its
own transactional producer, whose ``transactional.id`` is ``<prefix>-<first 16 hex digits of
sha1(normalized table URI)>``: one id per table, so a second watcher on the same table fences the
first, whatever process or host it runs on, while tables never block each other. In a group the
tables of a shard share one producer, ``<prefix>-<group>-shard-<n>`` (:mod:`.group.shard_producers`):
the shard is what moves between members, so it carries the fence, and a process holds one client
per shard instead of one per table (librdkafka allows about 1,000 per process). The admin client
and the progress reads are shared by every table (:class:`~.shared_clients.SharedClients`).

Resume order, per table (see docs/events.md): ``init_transactions()`` first, which aborts or
completes whatever an earlier incarnation left open; then the progress topic is read with
``read_committed`` to its end; only then does publishing start, after the recorded position
(:mod:`.pipeline`). What a transaction holds: :mod:`.publishing.transactions`.

The set of tables is dynamic: :meth:`WatchService.add_table` and :meth:`WatchService.remove_table`
start and stop a table while the others run (discovery calls them). With a ``group``
(``watch --group NAME``, :mod:`.group.sharing`) only the tables of the shards Kafka's group protocol
assigns to this instance run here, and they start and stop as shards move (docs/scale-out.md).

Alone, a fenced producer or a configuration error in any table stops every table, and the
process exits non-zero. In a group a fenced table is only released here (another instance took
it over; the group decides who runs it). SIGTERM/SIGINT set one stop flag: each open transaction
is finished at the next batch boundary, the producers flushed, and the process exits 0. A stop has
a budget (``STOP_BUDGET_S``): a table that cannot finish in time (the broker is gone) is abandoned
with one line saying what was left, and a second signal stops at once, with the same report.

Logs: JSON lines, redacted (:mod:`.log_format`); librdkafka's own lines go to the
``deltamirror.librdkafka`` logger at DEBUG, and a broker that cannot be reached is reported by
:class:`~deltamirror.mirror.kafka.connection.KafkaConnectionReporter`, one warning at most every 30 s.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import cast

from deltamirror.core.errors import ConfigError
from deltamirror.mirror.errors import KafkaError, ProducerFencedError
from deltamirror.mirror.kafka.clients import check_config
from deltamirror.mirror.kafka.connection import KafkaConnectionReporter

from .collector import OldObjectFreezer
from .config_file import redacted
from .discovery.scan import DiscoveryLoop
from .discovery.signals import Signal, SignalAnswer, SignalListener
from .discovery.table_check import check_prefixes_reachable, check_tables_exist
from .discovery.topic_claims import TopicClaims
from .group.sharing import TableSharing
from .liveness import PROBE_INTERVAL_S, BrokerHealth, BrokerWatch, StatusLog, Tee
from .log_format import configure_logging
from .metrics import GroupMetrics, Metrics, ServedMetrics, ServerHandle, WatcherMetrics, serve
from .pipeline import STOP_BUDGET_S, TablePipeline
from .publishing.row_events import check_registries
from .publishing.row_transform import check_row_settings
from .publishing.shared_clients import SharedClients
from .scheduler import Slot, TableScheduler, default_workers
from .settings import TableConfig, WatchConfig

log = logging.getLogger("deltamirror.watch")

#: the main thread's extra wait after the budget, for tables that are just finishing
STOP_GRACE_S = 0.5
#: how long closing waits for the signal and discovery threads (stopped already) to close their clients
CLOSE_JOIN_S = 1.0
#: in a group, how long leaving the group may take after the stop budget (the process ends within
#: the budget, the grace and this: below deltamirror.ops.stopping.DEADLINE_S)
LEAVE_AFTER_BUDGET_S = 1.5
#: in a group, how long a table fenced while its shard is still here waits before it runs again
FENCED_RESTART_S = 1.0
#: threads that build the pipelines of tables started together (:meth:`WatchService.start_tables`)
START_THREADS = 16


@dataclass(eq=False)
class _Running:
    """A table with a pipeline here: its slot in the scheduler is None until the service starts."""

    pipeline: TablePipeline
    slot: Slot | None = None

    def alive(self) -> bool:
        """Scheduled and not ended yet."""
        return self.slot is not None and not self.slot.done.is_set()


class WatchService:
    """The tables of a configuration (and those added later), served by a pool of workers.

    ``metrics`` receives what the tables report (default: a new :class:`WatcherMetrics`); with
    ``metrics_port`` set it must be one that can be served (a registry and ``/healthz``).
    """

    def __init__(
        self,
        cfg: WatchConfig,
        *,
        metrics: Metrics | None = None,
        stop: threading.Event | None = None,
        stop_budget_s: float = STOP_BUDGET_S,
        freeze_old_objects: bool = False,
    ) -> None:
        self.cfg = cfg
        #: ``freeze_old_objects`` (the ``watch`` command's): the collector's full passes skip what
        #: the tables held when they were frozen (:mod:`~deltamirror.producer.collector`)
        self.freezer = OldObjectFreezer() if freeze_old_objects else None
        #: the configured locations were checked (tables exist, storages take the credentials):
        #: by :meth:`start`, or by its caller before (``run_watch``, before its ``starting`` line)
        self.locations_checked = False
        self.metrics: Metrics = metrics if metrics is not None else WatcherMetrics()
        if cfg.metrics_port is not None and not isinstance(self.metrics, ServedMetrics):
            raise ConfigError(
                f"metrics_port is set but {type(self.metrics).__name__} cannot be served "
                "(it has no Prometheus registry and no health): pass WatcherMetrics, or unset metrics_port"
            )
        self.group_metrics = self.metrics if isinstance(self.metrics, GroupMetrics) else None
        #: the periodic status line (deltamirror.producer.liveness): it hears what the metrics hear
        self.status = StatusLog(cfg.status_interval_s)
        self.reports = cast(Metrics, Tee(self.metrics, self.status))
        self.stop_event = stop if stop is not None else threading.Event()
        self.stop_budget_s = stop_budget_s
        #: when the requested stop must be done (monotonic), None until one is requested
        self.stop_deadline: float | None = None
        #: one reporter for every client: one warning per interval for a cluster that is down
        self.reporter = KafkaConnectionReporter(cfg.kafka.bootstrap_servers)
        kafka = {**cfg.kafka.librdkafka_config(), **self.reporter.client_config()}
        check_config(kafka)  # a property librdkafka refuses (kafka.extra): refused now, not retried
        #: the admin client, the progress reads and (in a group) the shard producers every table shares
        self.clients = SharedClients(cfg, kafka)
        self._lock = threading.RLock()
        #: every table this service was given, by normalized uri (it runs here, or in a group maybe not)
        self._tables: dict[str, TableConfig] = {}
        #: the topics of every table given (a collision is refused)
        self._topics = TopicClaims(cfg.shared_topic_owners())
        for table in cfg.tables:
            self._admit(table)
        self._running: dict[str, _Running] = {}
        #: the workers every table of this service runs on
        self.scheduler = TableScheduler(cfg.workers if cfg.workers is not None else default_workers())
        self._started = False
        self._failure: BaseException | None = None
        self._server: ServerHandle | None = None
        self._broker_watch: threading.Thread | None = None
        self.sharing = (
            TableSharing(
                self,
                cfg.group,
                kafka={**cfg.kafka.librdkafka_config(), **self.reporter.client_config()},
                transactional_id_prefix=cfg.transactional_id_prefix,
                max_record_bytes=cfg.max_record_bytes,
                metrics=self.group_metrics,
            )
            if cfg.group is not None
            else None
        )
        #: the prefixes of ``cfg.discover``, scanned on their own thread once started
        self.discovery = DiscoveryLoop(cfg, self, stop=self.stop_event) if cfg.discover else None
        #: operators' signals (``deltamirror signal``), read on their own thread once started
        self.signals = (
            SignalListener(
                {**cfg.kafka.librdkafka_config(), **self.reporter.client_config()},
                cfg.signal_topic,
                self._on_signal,
                stop=self.stop_event,
            )
            if cfg.signal_topic is not None
            else None
        )
        if self.sharing is None:
            for table in self._tables.values():
                self._running[table.normalized_uri] = _Running(self._new_pipeline(table))

    # --- the table set --------------------------------------------------------------------------

    @property
    def pipelines(self) -> list[TablePipeline]:
        """The pipelines of the tables that run here now."""
        with self._lock:
            return [entry.pipeline for entry in self._running.values()]

    def tables(self) -> list[TableConfig]:
        """Every table this service was given (in a group, the ones of other shards too)."""
        with self._lock:
            return list(self._tables.values())

    def running_tables(self) -> set[str]:
        """Normalized URIs of the tables with a live pipeline here."""
        with self._lock:
            return set(self._running)

    def add_table(self, table: TableConfig) -> None:
        """Mirror ``table`` too (nothing happens if it is known); in a group, only if its shard is here.
        Raises ConfigError when it is refused (:meth:`add_tables` for one table)."""
        for refusal in self.add_tables([table]).values():
            raise refusal

    def add_tables(
        self, tables: Sequence[TableConfig], *, each: Callable[[TableConfig], None] | None = None
    ) -> dict[str, ConfigError]:
        """:meth:`add_table` for many tables (a discovery scan's new ones): each is admitted here,
        then the owned ones are started on :data:`START_THREADS` threads (:meth:`start_tables`),
        after ``each`` is called with it (on those threads; for a table not owned too). Returns
        the refused ones by normalized URI: those whose topics are another's (not admitted) and
        those whose start refused them (admitted, as :meth:`add_table` leaves them); one refusal
        never keeps the others from starting or from being returned."""
        refused: dict[str, ConfigError] = {}
        admitted: list[TableConfig] = []
        with self._lock:
            for table in tables:
                if table.normalized_uri in self._tables:
                    continue
                try:
                    self._admit(table)
                except ConfigError as exc:
                    refused[table.normalized_uri] = exc
                    continue
                admitted.append(table)

        def start(table: TableConfig) -> TablePipeline | None:
            try:
                if each is not None:
                    each(table)
                if self.sharing is None or self.sharing.owns(table.normalized_uri):
                    return self.start_table(table)
            except ConfigError as exc:  # its pipeline refused (as add_table's caller is told): it alone
                refused[table.normalized_uri] = exc
            return None

        self._in_parallel(start, admitted)
        return refused

    def start_tables(self, tables: Sequence[TableConfig]) -> list[TablePipeline | None]:
        """:meth:`start_table` for each of ``tables`` (a scan's new tables, a group's assigned
        shards), on up to :data:`START_THREADS` threads, in the order given."""
        return self._in_parallel(self.start_table, tables)

    @staticmethod
    def _in_parallel(
        fn: Callable[[TableConfig], TablePipeline | None], tables: Sequence[TableConfig]
    ) -> list[TablePipeline | None]:
        # building a pipeline waits on its storage and its log watch (system calls): on one thread,
        # with the tables that resume already holding the GIL, each such wait took a switch
        # interval, and 10,000 tables were handed over one by one in 44 s; on several threads the
        # waits overlap. Starting tables has no order between tables (each one's own order is kept
        # by its pipeline), and start_table is safe on concurrent threads. The threads are daemons,
        # as the discovery and membership threads that call this are: a stop never waits on a start
        # in progress (a slow store) beyond its budget (concurrent.futures joins its threads at exit).
        if len(tables) <= 1:
            return [fn(t) for t in tables]
        results: list[TablePipeline | None] = [None] * len(tables)
        failed: list[tuple[int, BaseException]] = []
        todo = iter(enumerate(tables))
        taking = threading.Lock()

        def work() -> None:
            while True:
                with taking:
                    item = next(todo, None)
                if item is None:
                    return
                i, table = item
                try:
                    results[i] = fn(table)
                except BaseException as exc:  # raised once every table was tried: one stops none
                    failed.append((i, exc))

        threads = [
            threading.Thread(target=work, name=f"watch-start-{n}", daemon=True)
            for n in range(min(START_THREADS, len(tables)))
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if failed:
            raise min(failed, key=lambda f: f[0])[1]
        return results

    def remove_table(self, normalized_uri: str, *, reason: str) -> None:
        """Stop the table at its next batch boundary (its open transaction finished) and forget it,
        its series on /metrics too (once its pipeline has ended, if it still runs)."""
        with self._lock:
            table = self._tables.pop(normalized_uri, None)
            if table is not None:
                self._topics.release(normalized_uri)
        self.release_tables([normalized_uri], reason, wait_s=0.0)
        if normalized_uri not in self.running_tables():
            self.reports.forget_table(normalized_uri)

    def wake_table(self, normalized_uri: str) -> None:
        """An idle table running here looks at its log now, not at its next poll (discovery found it
        gone, a signal asks it for something)."""
        with self._lock:
            entry = self._running.get(normalized_uri)
        if entry is not None and entry.slot is not None:
            self.scheduler.wake(entry.slot)

    def _on_signal(self, signal: Signal, answer: SignalAnswer) -> bool:
        """A signal for a table running here: its pipeline publishes a fresh snapshot, or the net row
        changes from the signal's version; answered through ``answer`` (at once, or by the table's
        thread once its net block is published or refused). False: the table does not run here."""
        with self._lock:
            entry = self._running.get(signal.table_uri)
        if entry is None or entry.pipeline.release_reason is not None:
            return False
        if signal.kind == "net-changes":
            if signal.from_version is None:
                answer("a net-changes signal names no fromVersion")
            else:
                entry.pipeline.request_net_changes(signal.from_version, answer)
                self.wake_table(signal.table_uri)  # not at its next poll (30 s by default)
            return True
        entry.pipeline.request_snapshot()
        self.wake_table(signal.table_uri)
        answer(None)
        return True

    def _admit(self, table: TableConfig) -> None:
        """Remember the table; refuse it when it would publish to another's topic (:class:`TopicClaims`)."""
        self._topics.admit(table)
        self._tables[table.normalized_uri] = table

    def _new_pipeline(self, table: TableConfig) -> TablePipeline:
        # each table has its own stop flag: it can be stopped alone (moved, removed)
        return TablePipeline(
            self.cfg,
            table,
            metrics=self.reports,
            stop=threading.Event(),
            reporter=self.reporter,
            stop_budget_s=self.stop_budget_s,
            clients=self.clients,
            shard=self.sharing.shard(table.normalized_uri) if self.sharing is not None else None,
        )

    def start_table(self, table: TableConfig) -> TablePipeline | None:
        """Run ``table`` here (if it is not running already); None once a stop was requested.

        A pipeline of the same table that is still stopping (its shard was lost and comes back) is
        waited for first, within the stop budget: two producers of one table never overlap here.
        """
        uri = table.normalized_uri
        with self._lock:
            if self.stop_event.is_set():
                return None
            current = self._running.get(uri)
            if current is not None and current.pipeline.release_reason is None:
                return current.pipeline
        if current is not None and current.slot is not None:
            current.slot.done.wait(self.stop_budget_s + STOP_GRACE_S)
        entry = _Running(self._new_pipeline(table))  # outside the lock: it opens the table's storage
        with self._lock:
            occupant = self._running.get(uri)  # None, or the stopping one it may replace
            started = not self.stop_event.is_set() and (occupant is None or occupant is current)
            if started:
                self._running[uri] = entry
                if self._started:
                    self._schedule(entry)
        if not started:  # stopping, or started meanwhile by another caller
            entry.pipeline.waker.close()
            entry.pipeline.watcher.close()
            return None if self.stop_event.is_set() else self._running.get(uri, entry).pipeline
        self._count_owned()
        return entry.pipeline

    def release_tables(self, uris: Iterable[str], reason: str, *, wait_s: float) -> list[str]:
        """Stop these tables at their next batch boundary; wait up to ``wait_s`` for them to end.

        Returns the ones that are still running after the wait (abandoned to finish on their own).
        """
        entries: list[_Running] = []
        with self._lock:
            for uri in uris:
                entry = self._running.get(uri)
                if entry is not None:
                    entry.pipeline.release(reason)
                    if entry.slot is not None:  # its next step finishes it: due now
                        self.scheduler.wake(entry.slot, always=True)
                    entries.append(entry)
        deadline = time.monotonic() + wait_s
        for entry in entries:
            if entry.slot is not None:
                entry.slot.done.wait(max(0.0, deadline - time.monotonic()))
            elif entry.pipeline.uri in self._running:  # never started: nothing to finish
                self._forget(entry)
        return [e.pipeline.uri for e in entries if e.alive()]

    def _forget(self, entry: _Running) -> None:
        with self._lock:
            if self._running.get(entry.pipeline.uri) is entry:
                del self._running[entry.pipeline.uri]
        self._count_owned()

    def _count_owned(self) -> None:
        if self.group_metrics is not None and self.sharing is not None:
            self.group_metrics.owned_tables(len(self._running))

    # --- running ----------------------------------------------------------------------------

    def check_locations(self) -> None:
        """Refuse now (ConfigError) a configured table that does not exist (and is not waited for),
        a table or discover prefix whose storage refuses the credentials, a table whose
        row_changes name a column it lacks, and a Schema Registry that refuses a table's or
        prefix's credentials: no retry changes them."""
        check_tables_exist(self.cfg.tables)
        check_prefixes_reachable(self.cfg.discover)
        check_row_settings(self.cfg.tables)  # a filter or key naming a column the table lacks
        # a Schema Registry refusing the credentials (HTTP 401/403) of a table or discover prefix
        check_registries([*self.cfg.tables, *self.cfg.discover])
        self.locations_checked = True

    def let_wakers_go(self) -> None:
        """For a service refused before it started: its tables' wakers subscribed to the process's
        file notifier when they were made; their subscriptions go (the notifier stops with the last)."""
        with self._lock:
            for entry in self._running.values():
                entry.pipeline.waker.close()

    def start(self) -> None:
        if not self.locations_checked:  # a library caller gets the refusals the command gives
            try:
                self.check_locations()
            except BaseException:
                self.let_wakers_go()
                raise
        if self.cfg.metrics_port is not None:
            assert isinstance(self.metrics, ServedMetrics)  # checked when built
            self._server = serve(self.metrics, self.cfg.metrics_host or "127.0.0.1", self.cfg.metrics_port)
        with self._lock:
            self._started = True
            for entry in self._running.values():
                self._schedule(entry)
        threading.Thread(target=self._relay_stop, name="watch-stop", daemon=True).start()
        self.status.start(lambda: len(self.running_tables()), self.stop_event)
        self._broker_watch = threading.Thread(
            target=self._watch_broker, name="watch-broker-health", daemon=True
        )
        self._broker_watch.start()
        if self.freezer is not None:
            self.freezer.start(self.stop_event)
        if self.discovery is not None:
            self.discovery.start()
        if self.signals is not None:
            self.signals.start()
        if self.sharing is not None:
            self.sharing.start()
        else:
            threading.Thread(target=self._report_ready, name="watch-ready", daemon=True).start()

    def _schedule(self, entry: _Running) -> None:
        """Serve the table on the workers from now on; a notification of a commit makes it due."""
        if entry.slot is not None:
            return
        entry.slot = self.scheduler.add(entry.pipeline, lambda _slot, exc: self._pipeline_ended(entry, exc))
        entry.pipeline.waker.listen(self.scheduler.waker_of(entry.slot))

    def _watch_broker(self) -> None:
        """Ask the brokers now and then (the shared admin client: no client of its own); a silence
        longer than ``broker_timeout_s`` makes /healthz unhealthy (:class:`~.liveness.BrokerWatch`)."""
        health = self.metrics if isinstance(self.metrics, BrokerHealth) else None
        watch = BrokerWatch(
            self.clients.reachable, self.cfg.kafka.bootstrap_servers, self.cfg.broker_timeout_s, health
        )
        while not self.stop_event.is_set():
            watch.check()
            self.stop_event.wait(PROBE_INTERVAL_S)

    def _relay_stop(self) -> None:
        """The service's stop flag, set by a signal, a failed table or a caller, stops every table."""
        self.stop_event.wait()
        self.request_stop()

    def _report_ready(self) -> None:
        for pipeline in self.pipelines:
            while not pipeline.ready.wait(0.5):
                if self.stop_event.is_set():
                    return
        self.metrics.set_healthy(True)
        log.info("all tables resumed", extra={"tables": len(self._running)})

    def _pipeline_ended(self, entry: _Running, error: BaseException | None) -> None:
        """On the worker that ran its last step: what the table's end means for the service."""
        pipeline = entry.pipeline
        fenced_here = False
        try:
            if error is not None:
                raise error
        except ProducerFencedError as exc:
            if self.sharing is None:
                self._fail(exc, pipeline)
            else:  # another instance runs it now: the group decides who keeps it
                log.warning("table released: %s", exc, extra={"table": pipeline.uri, "reason": "fenced"})
                if self.group_metrics is not None:
                    self.group_metrics.table_released(pipeline.uri, "fenced")
                fenced_here = pipeline.release_reason is None
        except KafkaError as exc:
            if self.sharing is not None and pipeline.release_reason is not None:
                log.warning("table released: %s", exc, extra={"table": pipeline.uri, "reason": "failed"})
            else:
                self._fail(exc, pipeline)
        except BaseException as exc:
            self._fail(exc, pipeline)
        else:
            reason = pipeline.release_reason
            if reason is not None and self.group_metrics is not None and not self.stop_event.is_set():
                self.group_metrics.table_released(pipeline.uri, reason)
        finally:
            self._forget(entry)
            if self.freezer is not None and not self.stop_event.is_set():
                # its objects may be garbage in cycles: the next check collects them
                self.freezer.thaw(pipeline)
            if not self.stop_event.is_set() and (
                pipeline.dropped.is_set() or pipeline.release_reason is not None
            ):  # it no longer runs here (dropped, removed, moved): its series go with it
                self.reports.forget_table(pipeline.uri)
        if fenced_here:  # it waits a little first: not on a worker
            threading.Thread(
                target=self._restart_if_owned, args=(pipeline.uri,), name="watch-refenced", daemon=True
            ).start()

    def _restart_if_owned(self, uri: str) -> None:
        """A table fenced while its shard is still assigned here runs here again: a member woken from
        a pause can start a table it has just discovered before it learns that its shards are gone,
        and its producer fences the owner's. The assignment decides; a zombie learns it soon."""
        if self.stop_event.wait(FENCED_RESTART_S) or self.sharing is None or not self.sharing.owns(uri):
            return
        with self._lock:
            table = self._tables.get(uri)
        if table is not None:
            log.warning("table fenced while its shard is here: starting it again", extra={"table": uri})
            if self.clients.shards is not None:  # the assignment says the shard is ours: fence back
                self.clients.shards.renew([self.sharing.shard(uri)], only_fenced=True)
            self.start_table(table)

    def renew_shard_producers(self, shards: set[int]) -> None:
        """A shard assigned here gets a new producer, not one left from before it went away."""
        if self.clients.shards is not None:
            self.clients.shards.renew(shards)

    def group_ready(self) -> None:
        """The tables of the group's first assignment resumed: healthy."""
        self.metrics.set_healthy(True)

    def fail(self, exc: BaseException) -> None:
        """Stop the service for ``exc`` (the group's membership cannot go on)."""
        self._fail(exc)

    def _fail(self, exc: BaseException, pipeline: TablePipeline | None = None) -> None:
        if self._failure is None:
            self._failure = exc
        self.metrics.set_healthy(False, str(exc))
        extra = {"table": pipeline.uri} if pipeline is not None else {}
        log.error("stopping the watcher: %s", exc, exc_info=exc, extra=extra)
        self.stop_event.set()

    def request_stop(self, budget_s: float | None = None) -> None:
        """Stop every table within ``budget_s`` (default ``stop_budget_s``); a shorter one wins."""
        deadline = time.monotonic() + (self.stop_budget_s if budget_s is None else budget_s)
        with self._lock:
            if self.stop_deadline is None or deadline < self.stop_deadline:
                self.stop_deadline = deadline
            self.stop_event.set()
            for entry in self._running.values():
                pipeline = entry.pipeline
                if pipeline.stop_deadline is None or self.stop_deadline < pipeline.stop_deadline:
                    pipeline.stop_deadline = self.stop_deadline
                pipeline.stop.set()
                if entry.slot is not None:  # its next step finishes it: due now
                    self.scheduler.wake(entry.slot, always=True)

    def _alive(self) -> list[_Running]:
        with self._lock:
            return [e for e in self._running.values() if e.alive()]

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for every table to end (then, once stopped, leave the group); True when all did."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while alive := self._alive():
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            assert alive[0].slot is not None
            alive[0].slot.done.wait(None if left is None else min(left, 0.5))
        if self.sharing is not None and self.stop_event.is_set():
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            return self.sharing.leave(left)
        return True

    def close(self) -> None:
        """Stop serving and, once stopped, let every client of the service go: none outlives it
        (a client left open retries a broker that is gone, and says so, after the service ended)."""
        if self.sharing is not None:
            self.sharing.leave(0.0)
        if self.stop_event.is_set():
            self.scheduler.close()  # its workers end once every table ended
        if self._server is not None:
            self._server.stop()
            self._server = None
        if self.stop_event.is_set():
            for loop in (self.signals, self.discovery, self._broker_watch):
                if loop is not None:
                    loop.join(CLOSE_JOIN_S)
            if self.signals is not None:  # after the tables: a stopping one may still answer a signal
                self.signals.close()
            self.clients.close()
            if self.freezer is not None:
                self.freezer.release()

    def run(self) -> int:
        """Start, wait until stopped; 0 after a clean stop. A fenced table raises ProducerFencedError
        (alone; in a group it is released).

        The stop takes at most the budget (plus ``STOP_GRACE_S``): a table still waiting on the
        broker then is abandoned (the workers are daemons) after saying what it leaves undone.
        """
        self.start()
        try:
            while not self.stop_event.wait(0.2):
                pass
            if self.stop_deadline is None:  # a table failed and set the flag itself
                self.request_stop()
            self._wait_for_stop()
            if self.sharing is not None:  # within the stop's bound (deltamirror.ops.stopping.DEADLINE_S)
                deadline = self.stop_deadline if self.stop_deadline is not None else time.monotonic()
                self.sharing.leave(
                    max(0.0, min(STOP_GRACE_S + 5.0, deadline + LEAVE_AFTER_BUDGET_S - time.monotonic()))
                )
        finally:
            self.close()
        if self._failure is not None:
            raise self._failure
        return 0

    def _wait_for_stop(self) -> None:
        alive: list[_Running] = []
        while True:
            alive = self._alive()
            deadline = self.stop_deadline
            if not alive or (deadline is not None and time.monotonic() > deadline + STOP_GRACE_S):
                break
            assert alive[0].slot is not None
            alive[0].slot.done.wait(0.1)
        for entry in alive:
            entry.pipeline.say_abandoned()


def run_watch(cfg: WatchConfig) -> int:
    """The ``watch`` command: JSON logs, signal handling, the service.

    SIGTERM/SIGINT are taken by :class:`deltamirror.ops.stopping.StopSignals` (the command line
    installs it first; a library caller in the main thread gets one here): the first finishes the
    open transactions within the stop budget, a second stops at once, and the process ends within
    :data:`deltamirror.ops.stopping.DEADLINE_S` of the first whatever happens.
    """
    from deltamirror.ops.stopping import StopSignals, installed

    own = None
    stops = installed()
    if stops is None and threading.current_thread() is threading.main_thread():
        stops = own = StopSignals().install()
    try:
        configure_logging()
        service = WatchService(cfg, freeze_old_objects=True)
        # a location that holds no table, or whose storage refuses the credentials: refused now,
        # before the starting line, not retried forever (start() lets the wakers go on a refusal)
        try:
            service.check_locations()
        except BaseException:
            service.let_wakers_go()
            raise
        log.info("starting", extra={"config": json.dumps(redacted(cfg), default=str)})

        def on_stop(now: bool) -> None:  # on the signal thread, never in a signal handler
            if now:
                log.warning("second stop request: stopping now")
                service.request_stop(0.0)
                return
            log.info(
                "stop requested: finishing the open transactions (at most %.0f s)", service.stop_budget_s
            )
            service.request_stop()

        if stops is not None:
            stops.use_stop_mode()
            stops.on_stop(on_stop)
        code = service.run()
    finally:
        if own is not None:
            own.uninstall()
    log.info("stopped", extra={"exitCode": code})
    return code


__all__ = ["STOP_GRACE_S", "WatchService", "run_watch"]
