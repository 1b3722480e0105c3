"""``deltamirror watch``: many tables in one process, each published exactly once and in order.

Each table runs in its own thread (:class:`~.pipeline.TablePipeline`) with its own transactional
producer, whose ``transactional.id`` is ``<prefix>-<first 16 hex digits of sha1(normalized table
URI)>``: one id per table, so a second watcher on the same table fences the first (which then
exits non-zero), whatever process or host it runs on, while tables never block each other.

Resume order, per table (see docs/events.md): ``init_transactions()`` first, which aborts or
completes whatever an earlier incarnation left open; then the progress topic is read with
``read_committed`` to its end; only then does publishing start, after the recorded position
(:mod:`.pipeline`). What a transaction holds: :mod:`.transactions`.

A fenced producer or a configuration error in any table stops every table, and the process
exits non-zero. SIGTERM/SIGINT set one stop flag: each open transaction is finished at the next
batch boundary, the producers flushed, and the process exits 0. A stop has a budget
(``STOP_BUDGET_S``): a table that cannot finish in time (the broker is gone) is abandoned with one
line saying what was left, and a second signal stops at once, with the same report.

Logs: JSON lines, redacted (:mod:`.log_format`); librdkafka's own lines go to the
``deltamirror.librdkafka`` logger at DEBUG, and a broker that cannot be reached is reported by
:class:`~deltamirror.mirror.connection.KafkaConnectionReporter`, one warning at most every 30 s.
"""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
from types import FrameType

from deltamirror.core.errors import ConfigError
from deltamirror.mirror.connection import KafkaConnectionReporter

from .config_file import redacted
from .log_format import configure_logging
from .metrics import Metrics, ServedMetrics, ServerHandle, WatcherMetrics, serve
from .pipeline import STOP_BUDGET_S, TablePipeline, table_topics
from .settings import WatchConfig

log = logging.getLogger("deltamirror.watch")

#: the main thread's extra wait after the budget, for tables that are just finishing
STOP_GRACE_S = 0.5


class WatchService:
    """All tables of a configuration, each in its own thread.

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
    ) -> None:
        self.cfg = cfg
        self.metrics: Metrics = metrics if metrics is not None else WatcherMetrics()
        if cfg.metrics_port is not None and not isinstance(self.metrics, ServedMetrics):
            raise ConfigError(
                f"metrics_port is set but {type(self.metrics).__name__} cannot be served "
                "(it has no Prometheus registry and no health): pass WatcherMetrics, or unset metrics_port"
            )
        self.stop_event = stop if stop is not None else threading.Event()
        self.stop_budget_s = stop_budget_s
        #: when the requested stop must be done (monotonic), None until one is requested
        self.stop_deadline: float | None = None
        self._check_topic_collisions()
        #: one reporter for every client: one warning per interval for a cluster that is down
        self.reporter = KafkaConnectionReporter(cfg.kafka.bootstrap_servers)
        self.pipelines = [
            TablePipeline(
                cfg,
                t,
                metrics=self.metrics,
                stop=self.stop_event,
                reporter=self.reporter,
                stop_budget_s=stop_budget_s,
            )
            for t in cfg.tables
        ]
        self._threads: list[threading.Thread] = []
        self._failure: BaseException | None = None
        self._server: ServerHandle | None = None

    def _check_topic_collisions(self) -> None:
        seen: dict[str, str] = {}
        for table in self.cfg.tables:
            topics = table_topics(table)
            explicit = {table.actions_topic, table.commits_topic}
            for name in (topics.actions, topics.commits):
                other = seen.get(name)
                if other is not None and name not in explicit:
                    raise ConfigError(
                        f"tables {other} and {table.uri} would share the default topic {name}: "
                        "set actions_topic and commits_topic for one of them",
                        table=table.uri,
                    )
                seen[name] = table.uri

    def start(self) -> None:
        if self.cfg.metrics_port is not None:
            assert isinstance(self.metrics, ServedMetrics)  # checked when built
            self._server = serve(self.metrics, self.cfg.metrics_host, self.cfg.metrics_port)
        for pipeline in self.pipelines:
            thread = threading.Thread(
                target=self._run_pipeline, args=(pipeline,), name=f"watch-{pipeline.txn_id}", daemon=True
            )
            self._threads.append(thread)
            thread.start()
        threading.Thread(target=self._report_ready, name="watch-ready", daemon=True).start()

    def _report_ready(self) -> None:
        for pipeline in self.pipelines:
            while not pipeline.ready.wait(0.5):
                if self.stop_event.is_set():
                    return
        self.metrics.set_healthy(True)
        log.info("all tables resumed", extra={"tables": len(self.pipelines)})

    def _run_pipeline(self, pipeline: TablePipeline) -> None:
        try:
            pipeline.run()
        except BaseException as exc:
            if self._failure is None:
                self._failure = exc
            self.metrics.set_healthy(False, str(exc))
            log.error("stopping the watcher: %s", exc, exc_info=exc, extra={"table": pipeline.uri})
            self.stop_event.set()

    def request_stop(self, budget_s: float | None = None) -> None:
        """Stop every table within ``budget_s`` (default ``stop_budget_s``); a shorter one wins."""
        deadline = time.monotonic() + (self.stop_budget_s if budget_s is None else budget_s)
        if self.stop_deadline is None or deadline < self.stop_deadline:
            self.stop_deadline = deadline
            for pipeline in self.pipelines:
                pipeline.stop_deadline = deadline
        self.stop_event.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for every table thread to end; True when they all did."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for thread in self._threads:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            thread.join(left)
        return all(not t.is_alive() for t in self._threads)

    def close(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None

    def run(self) -> int:
        """Start, wait until stopped; 0 after a clean stop. A fenced table raises ProducerFencedError.

        The stop takes at most the budget (plus ``STOP_GRACE_S``): a table still waiting on the
        broker then is abandoned (its thread is a daemon) after saying what it leaves undone.
        """
        self.start()
        try:
            while not self.stop_event.wait(0.2):
                pass
            if self.stop_deadline is None:  # a table failed and set the flag itself
                self.request_stop()
            self._wait_for_stop()
        finally:
            self.close()
        if self._failure is not None:
            raise self._failure
        return 0

    def _wait_for_stop(self) -> None:
        while True:
            alive = [p for p, t in zip(self.pipelines, self._threads, strict=True) if t.is_alive()]
            deadline = self.stop_deadline
            if not alive or (deadline is not None and time.monotonic() > deadline + STOP_GRACE_S):
                break
            self._threads[self.pipelines.index(alive[0])].join(0.1)
        for pipeline in alive:
            pipeline.say_abandoned()


def run_watch(cfg: WatchConfig) -> int:
    """The ``watch`` command: JSON logs, signal handling, the service."""
    configure_logging()
    log.info("starting", extra={"config": json.dumps(redacted(cfg), default=str)})
    service = WatchService(cfg)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if service.stop_event.is_set():
            log.warning("second stop request (%s): stopping now", name)
            service.request_stop(0.0)
            return
        log.info(
            "stop requested (%s): finishing the open transactions (at most %.0f s)",
            name,
            service.stop_budget_s,
        )
        service.request_stop()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        code = service.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    log.info("stopped", extra={"exitCode": code})
    return code


__all__ = ["STOP_GRACE_S", "WatchService", "run_watch"]
