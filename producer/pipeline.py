"""One table, from its log to Kafka: the loop that survives every failure but a fenced producer.

A session opens a transactional producer whose ``transactional.id`` is
``<prefix>-<first 16 hex digits of sha1(normalized table URI)>``; ``init_transactions()`` first
aborts or completes whatever an earlier incarnation left open (and fences it), then the progress
topic is read ``read_committed`` to its end, and only then does publishing start, after the
recorded position. A version that was only partly published is completed first.

Failures: a table error (corrupt commit, unsupported feature, storage failure, gap) commits what
was already produced, stops the table, and retries with backoff from the committed position; an
aborted transaction is published again from the committed position; a broken producer is
replaced (a new session); a fenced producer or a configuration error ends the table (the service
stops everything, or in a group releases only this table when fenced).

The committed position is what the topics hold, never what the table remembers: after an aborted
transaction, a new session, or a connection lost to the brokers (one restarted meanwhile), the
table waits until no transaction is left open on its topics and the progress topic, then reads its
progress back before it publishes again. Kafka can acknowledge a commit and then not write its
markers on some partitions (a broker killed mid-commit skips them at its restart); the producer's
next marker there decides their fate, and an abort makes them read as aborted. The topic then says
less than memory, and the table publishes those records again (it says so). A transaction that
never ends is reported, not waited out in silence (:mod:`.hanging`).

Stopping: the open transaction is finished at the next batch boundary, within the stop budget.
Every broker call made while stopping is bounded by the time left, and what cannot be finished
in time (the broker is gone) is abandoned with one line saying what was left, e.g. ``stopping:
abandoned the open transaction of table file:///t version 7; nothing committed is lost`` (the
broker aborts that transaction, or the next start does; it is published again from the committed
position).
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from deltamirror.core.errors import ConfigError, DeltaMirrorError
from deltamirror.mirror.errors import (
    KafkaError,
    ProducerFencedError,
    RetriableKafkaError,
    SchemaRegistryError,
    SchemaRegistryUnavailableError,
    StopRequested,
    TimestampRefusedError,
    TransactionAbortableError,
)
from deltamirror.mirror.kafka.connection import KafkaConnectionReporter
from deltamirror.mirror.kafka.producer import TransactionalPublisher, transaction_timeout_s
from deltamirror.mirror.topic_names import TableTopics
from deltamirror.mirror.topics import TopicManager

from .discovery.scan import GONE_TABLES
from .group.shard_producers import ProducerLease
from .publishing.hanging import HANG_MARGIN_S, EndOffsets, OpenTransaction, remedy, wait_until_settled
from .publishing.progress import read_progress
from .publishing.row_events import RowChangesSource
from .publishing.session import close_publisher, transactional_id, wait_for_brokers
from .publishing.shared_clients import SharedClients, check_topics
from .publishing.tails import AlreadyPublished, read_tails
from .publishing.transactions import BATCH, TableTransactions
from .settings import POLL_INTERVAL_S, TableConfig, WatchConfig, poll_interval
from .tailing.retention import RetentionWatch
from .tailing.snapshot_events import SnapshotWork
from .tailing.waker import LogWaker
from .tailing.watcher import TableWatcher
from .tailing.work import (
    CommitWork,
    NetCatchUpWork,
    NetChangesWork,
    Position,
    PositionWork,
    TableDroppedWork,
    TableReplacedWork,
    Work,
)

if TYPE_CHECKING:  # for the type checker only: importing it loads prometheus_client
    from .metrics import Metrics

log = logging.getLogger("deltamirror.watch")

BACKOFF_MIN_S = 0.5
BACKOFF_MAX_S = 30.0
#: a commit file this big is read with no transaction open (its scan may be slow)
LARGE_COMMIT_BYTES = 8 * 1024 * 1024
#: how long a stop may take: tables still waiting on the broker after it are abandoned (said so)
STOP_BUDGET_S = 7.0
#: units of work (and bytes of commits) read while a committing transaction's records are still on
#: their way to the broker (see :meth:`TablePipeline._read_while_draining`)
DRAIN_AHEAD_UNITS = 32
DRAIN_AHEAD_BYTES = 64 * 1024 * 1024


def table_topics(table: TableConfig) -> TableTopics:
    """The table's topics (:meth:`TableConfig.topics`, the one source of its topic names)."""
    return table.topics()


class _EndOffsets:
    """:data:`~.publishing.hanging.EndOffsets` of a manager, and several topics' at once (``many``)."""

    def __init__(self, manager: TopicManager) -> None:
        self.manager = manager

    def __call__(self, topic: str, committed: bool) -> dict[int, int]:
        return self.manager.end_offsets(topic, committed=committed)

    def many(self, topics: Sequence[str], committed: bool) -> dict[str, dict[int, int]]:
        return self.manager.end_offsets_many(topics, committed=committed)


class _Backoff:
    def __init__(self) -> None:
        self.delay = BACKOFF_MIN_S

    def next(self) -> float:
        delay = self.delay
        self.delay = min(BACKOFF_MAX_S, self.delay * 2)
        return delay

    def reset(self) -> None:
        self.delay = BACKOFF_MIN_S


class TablePipeline:
    """Watcher -> records -> transactions for one table, until the stop flag is set.

    With ``clients`` (a service's) the table shares the admin client and the progress reads with
    the other tables, and in a group (``shard`` given) its shard's producer; without it, it
    creates its own (one table alone).
    """

    def __init__(
        self,
        cfg: WatchConfig,
        table: TableConfig,
        *,
        metrics: Metrics,
        stop: threading.Event,
        batch_size: int = BATCH,
        reporter: KafkaConnectionReporter | None = None,
        stop_budget_s: float = STOP_BUDGET_S,
        clients: SharedClients | None = None,
        shard: int | None = None,
    ) -> None:
        self.cfg = cfg
        self.clients = clients
        #: the table's shard when it shares the shard's producer (a group), else None
        self.shard = shard if clients is not None and clients.shards is not None else None
        self._opened_before = False
        self.table = table
        self.uri = table.normalized_uri
        self.metrics = metrics
        self.stop = stop
        #: when a stop must be done (monotonic); set by the service, or by the table when it sees the flag
        self.stop_deadline: float | None = None
        self.stop_budget_s = stop_budget_s
        #: True once this table said what it abandoned on stop
        self.abandoned = False
        #: why the service stopped this table alone (revoked, lost, removed); None: a process stop
        self.release_reason: str | None = None
        #: what the table is doing, for the report of a stop that could not wait for it
        self.phase = "connecting to Kafka"
        self.topics = table.topics()
        self.reporter = reporter or KafkaConnectionReporter(cfg.kafka.bootstrap_servers)
        # every client of this table routes librdkafka's logs and errors to the reporter
        self.kafka: dict[str, Any] = {**cfg.kafka.librdkafka_config(), **self.reporter.client_config()}
        self.txn_id = (
            clients.shards.transactional_id(self.shard)
            if clients is not None and clients.shards is not None and self.shard is not None
            else transactional_id(cfg.transactional_id_prefix, self.uri)
        )
        self.ready = threading.Event()
        self.watcher = TableWatcher(
            table.uri,
            table.storage_options_plain(),
            mode=table.snapshot_mode,
            from_version=table.from_version,
            from_timestamp=table.from_timestamp,
            allowed_path_prefixes=table.allowed_path_prefixes,
            drop_when_gone=table.when_deleted == "drop",
            net_catch_up=table.row_changes_on
            and table.row_changes is not None
            and table.row_changes.net_catch_up,
        )
        self.waker = LogWaker(self.watcher.storage, enabled=cfg.use_notifications)
        self.txns = TableTransactions(
            cfg,
            self.uri,
            self.topics,
            self.txn_id,
            metrics=metrics,
            stop=stop,
            time_left=self.time_left,
            batch_size=max(1, min(batch_size, cfg.txn_max_records)),
        )
        self.txns.before_bounded_commit = self._read_while_draining
        self.txns.drop_file_stats = table.drop_file_stats
        self.txns.rows = RowChangesSource.of_table(table, self.watcher.table, self.topics)
        self._log_extra = {"table": self.uri}
        #: how close the unpublished versions are to the table's log retention (warned, measured)
        self.retention = RetentionWatch(self.uri, metrics.retention_headroom)
        self._needs_start = True
        self._table_failing = False
        #: the error the table is stopped on, as last logged: said once while it stays the same
        self._error_said: str | None = None
        #: set once ``tableDropped`` is committed: the table's pipeline has ended for good
        self.dropped = threading.Event()
        #: a stop cut a batch: the open transaction holds records its progress record would not cover
        self._cut_mid_batch = False
        #: work the watcher handed out while a transaction drained, published next (in order)
        self._drained: deque[Work] = deque()
        #: what the watcher raised while a transaction drained: raised once the work before it is out
        self._drained_error: Exception | None = None
        #: why the table must read its position back from the topics before it publishes again
        #: (None: what it committed in this session is what the topics hold)
        self._resync: str | None = None
        #: the producer's lost connections when the table last read its position back
        self._disconnects_seen = 0
        #: when the table began waiting for the transactions open on its topics (for the report)
        self._settle_started = 0.0
        #: a producer session is open (``_open`` done): steps publish; else the next step opens one
        self._session_open = False
        #: back-offs between sessions (a Kafka failure) and between the steps of one (a table error)
        self._session_backoff = _Backoff()
        self._loop_backoff = _Backoff()
        #: the table ended: every later step returns None
        self._ended = False
        #: the last step returned an idle wait: a notification of a new commit may end it early
        self.wakeable = False
        #: the versions behind last reported (an idle turn reports 0 again only after a change)
        self._behind_said: int | None = None

    # --- stopping -----------------------------------------------------------------------------

    def time_left(self) -> float:
        """Seconds left before the stop must be done; infinite while no stop was requested."""
        if self.stop_deadline is None:
            if not self.stop.is_set():
                return float("inf")
            self.stop_deadline = time.monotonic() + self.stop_budget_s
        return self.stop_deadline - time.monotonic()

    def release(self, reason: str, budget_s: float | None = None) -> None:
        """Stop this table alone (its shard moved, it was removed), within ``budget_s``.

        It stops as on a process stop: the open transaction is finished at the next batch
        boundary. With ``reason`` ``lost`` (the group found this instance gone, another may
        already run the table) an idle table also commits its progress once more: a transaction
        that the new owner's producer fences, so a zombie learns it at once (and says so) instead
        of at its next commit.
        """
        deadline = time.monotonic() + (self.stop_budget_s if budget_s is None else budget_s)
        if self.stop_deadline is None or deadline < self.stop_deadline:
            self.stop_deadline = deadline
        self.release_reason = reason
        self.stop.set()

    def request_snapshot(self) -> None:
        """Publish a fresh snapshot of the table next, at the last version published (a signal)."""
        self.watcher.snapshot_requested.set()

    def request_net_changes(self, first: int, answer: Callable[[str | None], None]) -> None:
        """Publish the net row changes of versions ``first`` to the last version published next, as
        one block in a transaction of its own (a signal). ``answer`` is called once: None when the
        block is committed, else why not. What needs no reading is refused here, on the caller's
        thread; the range is read (and a range without the change data feed refused) once, on the
        table's own thread, when the block is built."""
        rows, committed, block = self.txns.rows, self.txns.committed, self.txns.block
        if rows is None:
            answer(f"table {self.uri} publishes no row changes (row_changes is not configured)")
        elif block is not None:
            answer(f"table {self.uri} is in its {block.what}")
        elif committed is None or first > committed.version:
            last = "none" if committed is None else str(committed.version)
            answer(f"version {first} is beyond the last version published ({last})")
        else:
            self.watcher.request_net_changes(first, answer)

    def unfinished_work(self) -> str:
        """What a stop now would leave undone, in words."""
        return self.txns.describe_open() or f"{self.phase} for table {self.uri}"

    def say_abandoned(self, what: str | None = None) -> None:
        """The one line a stop that could not finish this table's work prints (once)."""
        if self.abandoned:
            return
        self.abandoned = True
        log.warning(
            "stopping: abandoned %s; nothing committed is lost",
            what or self.unfinished_work(),
            extra=self._log_extra,
        )

    # --- the outer loop: producer sessions ------------------------------------------------------

    def run(self) -> None:
        """Publish until stopped, on the caller's thread (one table alone). Raises
        ProducerFencedError or ConfigError (the process must stop).

        The same steps as a :class:`~.scheduler.TableScheduler` runs (:meth:`step_once`), with the
        waits between them done here: the idle wait on the waker (a notification ends it), a
        back-off on the stop flag.
        """
        while (delay := self.step_once()) is not None:
            if delay <= 0:
                continue
            if self.wakeable:
                self.waker.wait(delay, self.stop)
            else:
                self.stop.wait(delay)

    def poll_interval(self) -> float:
        """How long the table waits idle between looks at its log: ``poll_interval_s``, or by default
        1 s, 30 s while file notifications watch its log on a local disk (:func:`.settings.poll_interval`).
        By default it is at most ``heartbeat_interval_s`` (not below 1 s, the default poll it had
        before): an idle table's heartbeats are sent at its idle looks."""
        wait = poll_interval(self.table, notified=self.waker.notified_locally)
        beat = self.cfg.heartbeat_interval_s
        if beat is None or self.table.poll_interval_s is not None:
            return wait
        return min(wait, max(beat, POLL_INTERVAL_S))

    def holding_transaction(self) -> bool:
        """A transaction of this table is open (in a group it holds its shard's producer)."""
        return not self._ended and self.txns.in_transaction

    def wait_in_transaction(self, delay: float) -> None:
        """The wait of a step that returned ``delay`` with its transaction open (a net catch-up
        whose next versions cannot be read yet): on the waker, as :meth:`run` waits."""
        self.waker.wait(delay, self.stop)

    @property
    def opening(self) -> bool:
        """Its next step opens a producer session (the scheduler runs it on an opener thread): it
        may wait for the brokers, for transactions left open on its topics, and for the batched
        topic checks and progress read it shares with the tables opening with it."""
        return not self._session_open and not self._ended

    @property
    def ended(self) -> bool:
        """True once :meth:`step_once` returned None or raised: nothing of the table is left open."""
        return self._ended

    def step_once(self) -> float | None:
        """One unit of the table's work; returns the seconds until it wants to run again.

        0: ready now (more work, or a transaction open); the poll interval when idle (then
        :attr:`wakeable`: a notification of a new commit makes it due at once); a back-off after a
        failure (not wakeable); None once the table has ended (stopped, dropped), its clients
        closed. Raises ProducerFencedError or ConfigError (ended too). Never waits for time to
        pass: the only waits are on the broker and storage calls a step makes (and, at a session's
        open, for the brokers and for transactions left open on the table's topics).
        """
        if self._ended:
            return None
        self.wakeable = False
        self.waker.clear()
        try:
            delay = self._session_step()
        except BaseException:
            self._end()
            raise
        if delay is None:
            self._end()
        return delay

    def _session_step(self) -> float | None:
        """What ``run``'s loop over sessions did, one step at a time."""
        try:
            if not self._session_open:
                if self.stop.is_set():
                    return None
                self._open()
                self._session_open = True
                self._session_backoff.reset()
                self._loop_backoff.reset()
                return 0.0
            if self.stop.is_set() or self.dropped.is_set():
                self._finish()
                return None
            return self._loop_step()
        except StopRequested:
            self.say_abandoned()
            return None
        except ProducerFencedError:
            if self.cfg.group is not None:  # the new owner aborted it; the release is the one line
                self.abandoned = True
            raise
        except ConfigError:
            raise
        except KafkaError as exc:
            log.warning("kafka failure; reconnecting", exc_info=exc, extra=self._log_extra)
            # the logged traceback must not keep the failed session's clients alive (its frames'
            # locals: an admin client no longer used would live on, retrying a broker)
            traceback.clear_frames(exc.__traceback__)
            self._close_publisher()
            self._session_open = False
            if self.stop.is_set():
                return None
            return self._session_backoff.next()

    def _end(self) -> None:
        """The table's end (stopped, dropped, fenced): its clients and its watcher go."""
        if self._ended:
            return
        self._ended = True
        try:
            self._close_publisher()
        finally:
            self.waker.close()
            for work in self._drained:  # read ahead, never published: its signal is answered
                if isinstance(work, NetChangesWork):
                    work.answer("the table stopped here before publishing the block")
            self.watcher.close()

    def _open(self) -> None:
        self.phase = "connecting to Kafka"
        pub: TransactionalPublisher | ProducerLease
        if self.clients is not None and self.clients.shards is not None and self.shard is not None:
            pub = self.clients.shards.lease(self.shard, stop=self.stop, time_left=self.time_left)
        else:
            pub = TransactionalPublisher(
                self.kafka, self.txn_id, max_message_bytes=self.cfg.max_record_bytes, stop=self.stop
            )
        self.txns.pub = pub
        wait_for_brokers(pub, self.reporter, self.stop)
        self.phase = "resuming"
        fresh, self._opened_before = self._opened_before, True  # checked again on a reconnect
        manager = (
            self.clients.topics()
            if self.clients is not None
            else TopicManager(self.kafka, max_record_bytes=self.cfg.max_record_bytes)
        )
        rows = self.txns.rows is not None
        self.txns.limits.update(
            check_topics(manager, self.topics, self.cfg.progress_topic, rows=rows, fresh=fresh)
        )
        del manager  # a table's own admin client goes now, not at its next session
        pub.init()  # fences older producers of this table (or its shard) before the progress is read
        end_offsets = self._end_offsets()
        held = self._settle(end_offsets)
        committed = self._read_committed()
        # a transaction was left open, or this session follows one that failed: what the topics
        # hold past the progress position (a transaction committed on some partitions only)
        if held or not fresh:
            committed = self._resume_point(end_offsets, committed)
        else:
            self.txns.resume(committed, None)
        self._resync = None
        self._disconnects_seen = pub.disconnects
        self.phase = "publishing"
        self._needs_start = True
        log.info(
            "resuming table",
            extra={
                **self._log_extra,
                "transactionalId": self.txn_id,
                "actionsTopic": self.topics.actions,
                "commitsTopic": self.topics.commits,
                "resumeAfter": None
                if committed is None
                else f"v{committed.version}#{committed.index}/{committed.count}",
            },
        )
        self.ready.set()

    def _close_publisher(self) -> None:
        close_publisher(self.txns, time_left=self.time_left, stop=self.stop, say_abandoned=self.say_abandoned)

    # --- the position the topics hold --------------------------------------------------------

    def _read_committed(self) -> Position | None:
        """The table's last committed progress, read back from the progress topic (read_committed)."""
        if self.clients is not None:  # one read for the tables resuming with it (after their inits)
            return self.clients.progress.committed(self.uri, stop=self.stop)
        return read_progress(self.kafka, self.cfg.progress_topic, self.uri, stop=self.stop)

    def _settled_topics(self) -> list[str]:
        """The topics a resume waits on: the table's own (only its producer writes them, unless a
        discover prefix shares them among its tables: then others' transactions are waited out
        too) and the progress topic."""
        topics = [self.topics.actions, self.topics.commits]
        rows = self.txns.rows
        if rows is not None:
            topics += [rows.topics.changes, rows.topics.transaction]
        return [*topics, self.cfg.progress_topic]

    def _end_offsets(self) -> _EndOffsets:
        """Each partition's end now (admin calls): the shared admin client, or one of the table's own."""
        return _EndOffsets(
            self.clients.topics()
            if self.clients is not None
            else TopicManager(self.kafka, max_record_bytes=self.cfg.max_record_bytes)
        )

    def _settle(self, end_offsets: _EndOffsets) -> bool:
        """Wait until every transaction open now on the table's topics has ended (True if one was);
        one that does not end within ``transaction.timeout.ms`` + :data:`HANG_MARGIN_S` is reported
        (and waited for)."""
        self._settle_started = time.monotonic()
        return wait_until_settled(
            end_offsets,
            self._settled_topics(),
            hang_after_s=transaction_timeout_s(self.kafka) + HANG_MARGIN_S,
            stop=self.stop,
            on_hang=self._report_hanging,
            on_clear=self._hanging_ended,
            many=end_offsets.many,
        )

    def _report_hanging(self, held: list[OpenTransaction]) -> None:
        """One error line per partition held by a transaction nobody ends, with Kafka's remedy."""
        waited = time.monotonic() - self._settle_started
        pub = self.txns.pub
        for h in held:
            leader = pub.partition_leader(h.topic, h.partition) if pub is not None else None
            log.error(
                "transaction hanging on %s[%d]: its records from offset %d (high watermark %d) are still "
                "uncommitted after %.0f s with no transaction of this table open; read_committed readers "
                "stop there and the table publishes nothing until it ends (a broker killed mid-commit "
                "that skipped its markers when it came back leaves one); abort it: %s",
                h.topic,
                h.partition,
                h.offset,
                h.end,
                waited,
                remedy(self.cfg.kafka.bootstrap_servers, h, leader),
                extra={**self._log_extra, "topic": h.topic, "partition": h.partition, "offset": h.offset},
            )
        self.metrics.hanging_transactions(self.uri, len(held))
        self.metrics.table_error(self.uri, f"a transaction hangs on {', '.join(str(h) for h in held)}")

    def _hanging_ended(self, held: list[OpenTransaction]) -> None:
        log.info(
            "the transaction hanging on %s ended; resuming from the progress topic",
            ", ".join(str(h) for h in held),
            extra=self._log_extra,
        )
        self.metrics.hanging_transactions(self.uri, 0)
        self.metrics.table_ok(self.uri)

    def _resume_point(self, end_offsets: EndOffsets, committed: Position | None) -> Position | None:
        """Resume the publisher from the progress topic's position as the actions and commits topics
        bear it out (:func:`~.publishing.tails.read_tails`); returns the position resumed from."""
        resume = read_tails(
            self.kafka,
            end_offsets,
            self.topics.actions,
            self.topics.commits,
            committed,
            self.uri,
            board=self.clients.tails if self.clients is not None else None,
        )
        if resume.overstated is not None:
            log.warning(
                "the progress topic holds %s but the actions topic ends at %s: a transaction Kafka "
                "committed on some partitions only, its actions aborted (by an operator's abort of a "
                "hanging transaction); publishing again from the actions topic's end",
                _describe(resume.overstated),
                _describe(resume.position),
                extra=self._log_extra,
            )
        self.txns.resume(resume.position, resume.already)
        self._say_already(resume.position, resume.already)
        return resume.position

    def _say_already(self, committed: Position | None, already: AlreadyPublished | None) -> None:
        if not already:
            return
        there = [
            f"{what} v{tail.version}{' (snapshot)' if tail.snapshot else ''}"
            + (f"#{tail.index}" if tail.index >= 0 else "")
            for what, tail in (("actions to", already.actions), ("summaries to", already.summary))
            if tail is not None
        ]
        log.warning(
            "the topics hold records committed past the progress position %s (%s): a transaction Kafka "
            "committed on some partitions only; they are not published again",
            _describe(committed),
            ", ".join(there),
            extra=self._log_extra,
        )

    def _resume_from_topics(self, why: str) -> None:
        """Read the table's position back from the topics (not memory) before publishing again."""
        self.phase = "resuming"
        remembered = self.txns.committed
        end_offsets = self._end_offsets()
        self._settle(end_offsets)
        committed = self._resume_point(end_offsets, self._read_committed())
        if self.txns.pub is not None:
            self._disconnects_seen = self.txns.pub.disconnects
        self.phase = "publishing"
        if committed != remembered:
            log.warning(
                "the progress topic holds %s where this table had committed %s (%s): a transaction "
                "Kafka acknowledged as committed reads as aborted; publishing again from the topic's position",
                _describe(committed),
                _describe(remembered),
                why,
                extra=self._log_extra,
            )
        else:
            log.info("position read back from the progress topic (%s)", why, extra=self._log_extra)

    # --- the inner loop: one unit of work at a time --------------------------------------------

    def _loop_step(self) -> float | None:
        """One unit of work of an open session; returns the seconds until the next one."""
        backoff = self._loop_backoff
        try:
            if self._needs_start:
                for work in self._drained:  # read ahead, not published: asked for again
                    if isinstance(work, NetChangesWork):
                        self.watcher.request_net_changes(work.first, work.answer, again=True)
                self._drained.clear()
                self._drained_error = None
                if self._resync is not None:
                    self._resume_from_topics(self._resync)
                    self._resync = None
                self.watcher.start(self.txns.committed)
                self._needs_start = False
            idle = self._step()
            if self._table_failing:
                self._table_failing = False
                self._error_said = None
                self.metrics.table_ok(self.uri)
                log.info("table resumed", extra=self._log_extra)
            backoff.reset()
            if idle is not None:
                self.waker.prepare()
                self.wakeable = True
                return idle
            return 0.0
        except StopRequested:
            self._cut_mid_batch = True  # the queue was full (broker gone) in the middle of a batch
            self._finish()
            return None
        except (ProducerFencedError, ConfigError):
            raise
        except TransactionAbortableError as exc:
            log.warning("transaction aborted; publishing again", exc_info=exc, extra=self._log_extra)
            self._abort()
            if isinstance(exc, TimestampRefusedError):
                topic = exc.context.get("topic")
                if isinstance(topic, str) and topic in self.txns.limits:
                    self.txns.limits[topic].always_clamp = True
            return backoff.next() / 4
        except RetriableKafkaError as exc:
            log.warning("kafka busy; publishing again", exc_info=exc, extra=self._log_extra)
            self._abort()
            return backoff.next()
        except KafkaError:
            raise
        except (DeltaMirrorError, OSError) as exc:
            self._table_error(exc)
            return backoff.next()
        except Exception as exc:  # a bug: keep the other tables going, retry this one
            self._table_error(exc, unexpected=True)
            return backoff.next()

    def _abort(self, timeout_s: float | None = None) -> None:
        """Abort the open transaction; the watcher starts again from the position the topics hold.

        The abort's markers close whatever the producer left open on those partitions, records of
        a transaction Kafka acknowledged as committed included (see the module docstring).
        """
        self.txns.abort(timeout_s)
        self._needs_start = True
        if not self.stop.is_set():
            self._resync = "after an aborted transaction"

    def _table_error(self, exc: BaseException, *, unexpected: bool = False) -> None:
        """Keep what was published before the error, stop the table, retry later from there.

        The error is logged once while every retry stops on the same one (its message names the
        table, the version and the file): /healthz and ``deltamirror_table_up`` keep saying it,
        the log says it again when it changes or after the table has resumed.
        """
        if self.txns.in_transaction and self.txns.atomic:  # an atomic block commits whole or not at all
            try:
                self._abort()
            except (ProducerFencedError, ConfigError):
                raise
            except KafkaError:
                pass  # the restart's init_transactions() aborts it
        elif self.txns.in_transaction:
            try:
                self.txns.commit()
            except (ProducerFencedError, ConfigError):
                raise
            except KafkaError:
                self._abort()
        self._needs_start = True
        self._table_failing = True
        if isinstance(exc, SchemaRegistryError) and not isinstance(exc, SchemaRegistryUnavailableError):
            self.metrics.schema_refused(self.uri)  # before table_error: counted when it stops the table
        self.metrics.table_error(self.uri, str(exc))
        said = _same_error(exc)
        if said == self._error_said:
            log.debug("table still stopped: %s", exc, extra=self._log_extra)
            return
        self._error_said = said
        if unexpected:
            log.error("unexpected error", exc_info=exc, extra=self._log_extra)
        log.error("table stopped: %s", exc, exc_info=exc, extra=self._log_extra)

    def _finish(self) -> None:
        """Stop requested: commit the open transaction (it holds only whole batches) and flush.

        Within the stop budget: what cannot be committed in time is aborted, and what cannot be
        aborted either (the broker is gone) is abandoned, said in one line. Either way the
        committed progress is where the next start resumes: nothing is lost or published twice.
        """
        if self.txns.in_transaction:
            what = self.unfinished_work()
            block = self.txns.block if not self.txns.block_complete else None  # cut short: never committed
            try:
                if self._cut_mid_batch:  # records past the last batch boundary: never commit them
                    raise RetriableKafkaError("a batch was cut by the stop")
                if block is not None:
                    raise RetriableKafkaError(f"a {block.what} was cut by the stop")
                self.txns.commit(timeout_s=max(0.0, self.time_left()))
            except ProducerFencedError:
                raise
            except KafkaError as exc:
                if block is not None:
                    log.info(
                        "stopped during a %s: aborted%s",
                        block.what,
                        " (published whole on the next start)" if block.what == "net catch-up" else "",
                    )
                elif not self._cut_mid_batch:
                    log.warning("could not commit on stop; aborting", exc_info=exc, extra=self._log_extra)
                try:
                    left = self.time_left()
                    if left <= 0:
                        raise RetriableKafkaError("no time left to abort") from None
                    self._abort(timeout_s=left)
                except KafkaError:
                    self.say_abandoned(what)
        elif self.release_reason == "lost":
            self._probe_fencing()
        if not self.abandoned:
            log.info("table stopped cleanly", extra=self._log_extra)

    def _probe_fencing(self) -> None:
        """An idle table of a lost shard: commit its progress again, which a new owner fences."""
        if self.txns.pub is None or self.txns.committed is None or self.time_left() <= 0:
            return
        try:
            self.txns.begin()
            self.txns.commit(timeout_s=max(0.0, self.time_left()))
        except ProducerFencedError:
            raise
        except KafkaError as exc:
            log.info("could not probe for a new owner: %s", exc, extra=self._log_extra)

    def _next_work(self) -> Work | None:
        if self._drained:
            return self._drained.popleft()
        if self._drained_error is not None:
            error, self._drained_error = self._drained_error, None
            raise error
        return self.watcher.next_work()

    def _read_while_draining(self) -> None:
        """Read (and validate) the next versions while the transaction about to commit drains.

        Committing waits until the broker has every record of the transaction; librdkafka sends
        them on its own threads, so the watcher's thread would wait idle. It scans the versions
        that come next meanwhile, as long as records are still on their way (at most
        :data:`DRAIN_AHEAD_UNITS` units, :data:`DRAIN_AHEAD_BYTES` of commits), and publishes
        them in the next transaction. An error the watcher raises is raised once the work before
        it has been published, as it would have been without reading ahead.
        """
        pub = self.txns.pub
        assert pub is not None
        size = 0
        while (
            pub.in_flight()
            and len(self._drained) < DRAIN_AHEAD_UNITS
            and size < DRAIN_AHEAD_BYTES
            and self._drained_error is None
            and not self.stop.is_set()
            and self.watcher.next_commit_size() <= LARGE_COMMIT_BYTES
        ):
            try:
                work = self.watcher.next_work()
            except Exception as exc:  # raised in its turn, by _next_work
                self._drained_error = exc
                return
            if work is None:
                return
            self._drained.append(work)
            if not isinstance(work, CommitWork):
                return
            size += work.scan.file.size

    def _step(self) -> float | None:
        """One unit of work; the seconds to wait when there was none (idle), else None."""
        txns = self.txns
        if isinstance(txns.pub, ProducerLease) and txns.pub.fenced:  # another table of the shard learnt it
            raise ProducerFencedError(
                "fenced: another watcher now publishes this table's shard", transactional_id=self.txn_id
            )
        if (
            not txns.in_transaction
            and txns.pub is not None
            and txns.pub.disconnects != self._disconnects_seen
        ):
            # a broker may have restarted meanwhile, leaving the last commit's markers unwritten
            self._resync = "the connection to the brokers was lost"
            self._needs_start = True
            return None
        if (
            txns.in_transaction
            and not txns.atomic
            and not self._drained
            and self.watcher.next_commit_size() > LARGE_COMMIT_BYTES
        ):
            # reading a big commit may outlast transaction.timeout.ms: do not keep a transaction open
            txns.commit()
        work = self._next_work()
        if work is None and txns.atomic:  # a catch-up's versions exist: read again (never commit a part)
            return self.poll_interval()
        if work is None:
            if txns.in_transaction:
                txns.commit()
            if self._behind_said != 0:  # not again at every idle turn: it stays 0 while idle
                self._behind_said = 0
                self.metrics.versions_behind(self.uri, 0)
            txns.idle_duties()
            return self.poll_interval()
        if isinstance(work, NetChangesWork):
            if txns.block is not None:  # never inside another atomic block's transaction
                log.warning(
                    "signal net-changes during a %s: not published", txns.block.what, extra=self._log_extra
                )
                work.answer(f"table {self.uri} is in its {txns.block.what}")
            else:
                txns.publish_net_block(work)
            return None
        if not txns.in_transaction:
            txns.begin()
        if isinstance(work, CommitWork | SnapshotWork):
            txns.publish(work)
            behind = self.watcher.versions_ahead + len(self._drained)
            self._behind_said = behind
            self.metrics.versions_behind(self.uri, behind)
            self.retention.published(work.timestamp.timestamp, behind, self.watcher.configuration)
        elif isinstance(work, TableReplacedWork) and txns.atomic:
            # re-created during a net catch-up: none of it is committed, the new table starts afresh
            self._abort()
            return None
        elif isinstance(work, TableReplacedWork):
            txns.announce_replaced(work)
            return None  # the new table's first work goes in the same transaction
        elif isinstance(work, TableDroppedWork):
            txns.announce_dropped(work)  # commits: the table's last transaction
            GONE_TABLES.note_dropped(self.uri)  # discovery forgets it
            self.dropped.set()
            return None
        elif isinstance(work, PositionWork):
            txns.produced = work.position
        elif isinstance(work, NetCatchUpWork):
            txns.begin_catch_up(work)
            return None
        if txns.block_complete:  # the whole catch-up is in: commit it
            txns.commit()
            return None
        # publish may have committed its last chunk already (a stop mid-version): no txn, no commit
        if txns.in_transaction and not txns.atomic and txns.bounds_reached():
            self._read_while_draining()
            txns.commit()
        return None


def _same_error(exc: BaseException) -> str:
    """What tells one error from another for the log (said once while the retries stop on it).

    A registry's refusal is the same one for the same subject at the same version, whatever its
    wording: Apicurio Registry lists the incompatible differences of one refusal in any order from
    one attempt to the next (each attempt's line would have been a new one)."""
    if isinstance(exc, SchemaRegistryError) and not isinstance(exc, SchemaRegistryUnavailableError):
        return f"{type(exc).__name__}: table={exc.table} version={exc.version} subject={exc.context.get('subject')}"
    return f"{type(exc).__name__}: {exc}"


def _describe(position: Position | None) -> str:
    if position is None:
        return "no position"
    return f"v{position.version}#{position.index}/{position.count}" + (
        f" rows {position.row_offset}" if position.row_offset is not None else ""
    )


__all__ = ["STOP_BUDGET_S", "TablePipeline", "table_topics", "transactional_id"]
