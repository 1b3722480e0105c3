"""A table's topics: the partitioner, and their creation with settings that lose nothing.

Names are :mod:`.topic_names`'. Records are keyed by table id and placed by Kafka's default
partitioner (murmur2), which readers compute too.

Creation:
- Actions and commits topics keep records forever by default (``retention.ms=-1``): record
  timestamps are commit times, which can be years old, so a time-based retention would delete a
  backfill the moment it is written. An existing topic with time or size retention is accepted
  with a warning (the operator chose it).
- The progress topic must be compacted and must not delete by age: losing a progress record means
  publishing a table again from its snapshot mode (duplicates). A wrong one is refused.
- Topics created here take the producer's compression (the producer compresses with lz4), one
  partition (one table per topic, keyed by table id), ``CreateTime`` timestamps with no limit on
  how old or how far in the future a record's timestamp may be, and room for the largest record
  the watcher publishes. On an existing topic, the timestamp limits it has are read so that a
  commit timestamp it would refuse is clamped (and said so in a header) instead of stalling.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import IsolationLevel, KafkaException, TopicCollection, TopicPartition
from confluent_kafka import KafkaError as _RdKafkaError
from confluent_kafka.admin import ConfigResource, NewTopic, OffsetSpec, ResourceType

from deltamirror.core.errors import ConfigError

from .errors import KafkaError
from .kafka import clients
from .kafka.producer import RECORD_OVERHEAD

# --- the partitioner -------------------------------------------------------------------------------


def murmur2(key: bytes) -> int:
    """Kafka's murmur2 hash of ``key`` (``org.apache.kafka.common.utils.Utils.murmur2``), as a signed int."""
    m, mask = 0x5BD1E995, 0xFFFFFFFF
    length = len(key)
    h = (0x9747B28C ^ length) & mask
    for i in range(0, length - length % 4, 4):
        k = int.from_bytes(key[i : i + 4], "little")
        k = (k * m) & mask
        k ^= k >> 24
        k = (k * m) & mask
        h = ((h * m) & mask) ^ k
    tail = length % 4
    base = length - tail
    if tail == 3:
        h ^= key[base + 2] << 16
    if tail >= 2:
        h ^= key[base + 1] << 8
    if tail >= 1:
        h ^= key[base]
        h = (h * m) & mask
    h ^= h >> 13
    h = (h * m) & mask
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def murmur2_partition(key: bytes, partitions: int) -> int:
    """The partition Kafka's default partitioner (and librdkafka's ``murmur2_random``) gives ``key``."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


# --- creation --------------------------------------------------------------------------------------

log = logging.getLogger(__name__)

LONG_MAX = 2**63 - 1
BROKER_DEFAULT_MAX_MESSAGE_BYTES = 1_048_588
#: keep this far inside a topic's timestamp window when clamping (clock skew with the broker)
CLAMP_MARGIN_MS = 60_000


@dataclass
class TopicLimits:
    """What one topic accepts: record size and timestamp window (None: no limit)."""

    name: str
    max_value_bytes: int
    before_max_ms: int | None = None
    after_max_ms: int | None = None
    #: set when the broker refused a timestamp anyway: every record then gets the current time
    always_clamp: bool = False
    warned: set[str] = field(default_factory=set)

    def clamp(self, timestamp: int, now_ms: int) -> int | None:
        """The timestamp to send instead of ``timestamp``, or None when the topic accepts it."""
        if self.always_clamp:
            return now_ms if timestamp != now_ms else None
        if self.before_max_ms is not None and timestamp < now_ms - self.before_max_ms + CLAMP_MARGIN_MS:
            return now_ms - self.before_max_ms + CLAMP_MARGIN_MS
        if self.after_max_ms is not None and timestamp > now_ms + self.after_max_ms - CLAMP_MARGIN_MS:
            return now_ms
        return None


def event_topic_config(max_record_bytes: int) -> dict[str, str]:
    return {
        "cleanup.policy": "delete",
        "retention.ms": "-1",
        "retention.bytes": "-1",
        "compression.type": "producer",
        "message.timestamp.type": "CreateTime",
        "message.timestamp.before.max.ms": str(LONG_MAX),
        "message.timestamp.after.max.ms": str(LONG_MAX),
        "max.message.bytes": str(max(BROKER_DEFAULT_MAX_MESSAGE_BYTES, max_record_bytes + RECORD_OVERHEAD)),
    }


def progress_topic_config() -> dict[str, str]:
    return {
        "cleanup.policy": "compact",
        "compression.type": "producer",
        "min.cleanable.dirty.ratio": "0.1",
        "segment.ms": str(24 * 3600 * 1000),
    }


#: how long the first of several threads asking the admin client waits for the others to join its request
ADMIN_GATHER_S = 0.02
#: topics in one admin request at most
ADMIN_BATCH = 500


class _Batch:
    def __init__(self, deadline: float) -> None:
        self.items: dict[Any, Any] = {}
        #: callers waiting for it
        self.callers = 0
        #: set when its opener may send it, and once its answers are in
        self.turn = threading.Event()
        self.ready = threading.Event()
        self.answers: dict[Any, Any] = {}
        self.error: BaseException | None = None
        #: when its answers are due (``time.monotonic()``): its opener's ask plus its timeout
        self.deadline = deadline
        self.opened = time.monotonic()
        #: when its request went out (one queued behind another may reach its deadline first)
        self.sent_at: float | None = None

    def why_unanswered(self) -> str:
        """Empty when the request went out at once and was not answered in time; else what its
        wait behind the request before it took."""
        if self.sent_at is None:
            waited = max(0.0, min(time.monotonic(), self.deadline) - self.opened)
            return f"not asked: it waited {waited:.1f} s behind the request before it, until its deadline"
        waited = self.sent_at - self.opened
        if waited < 0.1:
            return ""
        return (
            f"asked after waiting {waited:.1f} s behind the request before it, "
            f"no answer in the {max(0.0, self.deadline - self.sent_at):.1f} s left"
        )


class _Batches:
    """Requests of many threads about many keys (topics) sent as one request.

    The caller that opens a batch sends it; the others that ask while it is open join it and wait
    for its answer only (no thread is woken for a batch it is not in). Two ways to close a batch:

    - gathering (``gather_s``, at most ``limit`` keys): the opener waits ``gather_s`` for others,
      then sends; several batches may be in flight. A process that starts (or takes over) a
      thousand tables would otherwise send a CreateTopics and a DescribeConfigs request per topic,
      one after the other on the broker's side: on a small broker, a thousand tables' first start
      took minutes, and requests timed out.
    - ``one_in_flight``: a batch opened while nothing is in flight is sent at once; a key asked
      while one is in flight goes in the next batch, sent once that one is answered, with every key
      asked meanwhile. Each answer is taken after its caller asked (as a call of its own would have
      been), and a thousand tables resuming together on the same topics cost a request per round
      instead of one per table (their end offsets were what a 10,000-table start waited on).

    A batch has one deadline, its opener's ask plus its timeout (the earliest of its callers'):
    ``send`` gets it and answers what it reached by then; a key it did not answer, or a caller
    still waiting at its own deadline, gets ``missed(key, why)`` raised, ``why`` empty when the
    request was sent and not answered in time, or saying that the batch waited behind the one in
    flight until its deadline and was never sent (which a message blaming the brokers would hide).
    No caller waits longer than its own timeout, however many keys share its batch (a batch of end
    offsets once cost a timeout per topic).
    """

    def __init__(
        self,
        send: Callable[[list[Any], float], dict[Any, Any]],
        missed: Callable[[Any, str], BaseException],
        *,
        one_in_flight: bool = False,
        gather_s: float = 0.0,
        limit: int | None = None,
    ) -> None:
        if one_in_flight and limit is not None:
            raise ValueError("a batch sent one at a time takes every key asked meanwhile: no limit")
        self._send = send
        self._missed = missed
        self._one_in_flight = one_in_flight
        self._gather_s = gather_s
        self._limit = limit
        self._lock = threading.Lock()
        #: the batch that takes the keys asked now
        self._open: _Batch | None = None
        #: a batch is being sent (``one_in_flight``)
        self._busy = False

    def ask(self, key: Any, item: Any, timeout_s: float) -> Any:
        """What ``send`` answered for ``key`` (``item`` is what the request needs of it)."""
        return self._answer(self._join({key: item}, timeout_s), key)

    def ask_many(self, items: Mapping[Any, Any], timeout_s: float) -> dict[Any, Any]:
        """:meth:`ask` for several keys at once (by key, what the request needs of it): one batch,
        one wait, where asking them in turn waited for a batch each."""
        batch = self._join(items, timeout_s)
        return {key: self._answer(batch, key) for key in items}

    def _join(self, items: Mapping[Any, Any], timeout_s: float) -> _Batch:
        """The batch that took ``items``, answered (or its error or deadline reached)."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            batch = self._open
            opened = batch is None
            if batch is None:
                batch = self._open = _Batch(deadline)
            for key, item in items.items():
                batch.items.setdefault(key, item)
            batch.callers += 1
            if self._limit is not None and len(batch.items) >= self._limit:
                self._open = None  # full: whoever asks next opens another
            if opened and not (self._one_in_flight and self._busy):
                if self._one_in_flight:  # sent now, with this caller's key alone
                    self._busy = True
                    self._open = None
                batch.turn.set()
        if not opened:
            if not batch.ready.wait(max(0.0, deadline - time.monotonic())):
                raise self._missed(next(iter(items)), batch.why_unanswered())
            return batch
        batch.turn.wait()  # one in flight: it ends by its deadline, which is before this one's
        if self._gather_s:
            time.sleep(self._gather_s)
            with self._lock:
                if self._open is batch:
                    self._open = None
        try:
            if time.monotonic() < batch.deadline:
                batch.sent_at = time.monotonic()
                batch.answers = self._send(list(batch.items.values()), batch.deadline)
        except BaseException as exc:  # given to every caller of the batch
            batch.error = exc
        finally:
            batch.ready.set()
            if self._one_in_flight:
                with self._lock:
                    following, self._open = self._open, None
                    self._busy = following is not None
                if following is not None:  # its keys are closed now: its opener sends it
                    following.turn.set()
        return batch

    def _answer(self, batch: _Batch, key: Any) -> Any:
        if batch.error is not None:
            raise batch.error
        if key not in batch.answers:
            raise self._missed(key, batch.why_unanswered())
        return batch.answers[key]


class TopicManager:
    """Creates or validates topics through the admin API; remembers what it learned about each.

    One manager (one admin client) can serve every table of a process, from any thread: a topic
    checked once is not asked about again (each caller gets its own copy of its
    :class:`TopicLimits`) unless ``fresh`` is passed, as a table does when it reconnects after a
    failure (the topic may have been deleted meanwhile). Concurrent checks of one topic wait for
    the first one instead of all asking the broker.
    """

    def __init__(self, kafka: dict[str, str], *, max_record_bytes: int, timeout_s: float = 30.0) -> None:
        admin_conf: dict[str, str | int | float | bool] = {
            k: v for k, v in kafka.items() if not k.startswith(("linger", "compression"))
        }
        self._admin = clients.admin(admin_conf)
        self.max_record_bytes = max_record_bytes
        self.timeout_s = timeout_s
        self.limits: dict[str, TopicLimits] = {}
        #: (kind, topic) -> what the check found; kind tells the event, row and progress checks apart
        self._checked: dict[tuple[str, str], TopicLimits] = {}
        self._locks: dict[tuple[str, str], threading.Lock] = {}
        self._locks_lock = threading.Lock()
        # a caller's own wait that ends unanswered is a future's timeout (no text), as its .result()'s
        self._creates = _Batches(
            lambda specs, _: self._admin.create_topics(specs, operation_timeout=self.timeout_s),
            lambda _key, _why: TimeoutError(),
            gather_s=ADMIN_GATHER_S,
            limit=ADMIN_BATCH,
        )
        self._describes = _Batches(
            lambda resources, _: {r.name: f for r, f in self._admin.describe_configs(resources).items()},
            lambda _key, _why: TimeoutError(),
            gather_s=ADMIN_GATHER_S,
            limit=ADMIN_BATCH,
        )
        #: the end offsets asked by many threads at once, one request for all
        self._ends = _Batches(
            self._read_ends,
            lambda key, why: KafkaError(
                f"cannot read the end offsets of {key[0]}: {why or self._unanswered()}", topic=key[0]
            ),
            one_in_flight=True,
        )

    def _cached(self, kind: str, name: str, fresh: bool, check: Callable[[], TopicLimits]) -> TopicLimits:
        key = (kind, name)
        with self._locks_lock:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            limits = None if fresh else self._checked.get(key)
            if limits is None:
                limits = check()
                self._checked[key] = limits
        return dataclasses.replace(limits, warned=set())

    def ensure_event_topic(
        self, name: str, *, compacted_ok: bool = False, fresh: bool = False
    ) -> TopicLimits:
        """An actions, commits or (``compacted_ok``: keyed by row, compaction is the user's choice)
        row changes topic; created with one partition (create it beforehand for more)."""
        kind = "rows" if compacted_ok else "events"
        return self._cached(kind, name, fresh, lambda: self._ensure_event_topic(name, compacted_ok))

    def _ensure_event_topic(self, name: str, compacted_ok: bool) -> TopicLimits:
        created = self._create(name, 1, event_topic_config(self.max_record_bytes))
        config = self._describe(name)
        if not created:
            retention = config.get("retention.ms")
            if retention not in (None, "-1"):
                log.warning(
                    "topic %s deletes records older than retention.ms=%s: commit timestamps can be old, "
                    "so a subscriber may miss history",
                    name,
                    retention,
                    extra={"topic": name},
                )
            if (
                not compacted_ok
                and "compact" in config.get("cleanup.policy", "")
                and "delete" not in config.get("cleanup.policy", "")
            ):
                raise ConfigError(
                    f"topic {name} is compacted: events of one table share a key and would be lost",
                    topic=name,
                )
        return self._limits(name, config)

    def ensure_progress_topic(self, name: str, *, fresh: bool = False) -> TopicLimits:
        return self._cached("progress", name, fresh, lambda: self._ensure_progress_topic(name))

    def reachable(self, timeout_s: float) -> bool:
        """True when a broker answered a metadata request within ``timeout_s``."""
        try:
            self._admin.list_topics(timeout=timeout_s)
        except KafkaException:
            return False
        return True

    def end_offsets(self, name: str, *, committed: bool = True) -> dict[int, int]:
        """Each partition's end now: for a ``read_committed`` reader (its last stable offset), or
        with ``committed=False`` the high watermark (records of open transactions included).

        "Now" is a moment after the call: concurrent calls (tables resuming together on shared
        topics ask the same) are answered by one request for all (:class:`_Batches`), within
        the manager's timeout.
        """
        answer = self._ends.ask((name, committed), (name, committed), self.timeout_s)
        if isinstance(answer, BaseException):
            raise answer
        return dict(answer)

    def end_offsets_many(self, names: Sequence[str], *, committed: bool = True) -> dict[str, dict[int, int]]:
        """:meth:`end_offsets` of several topics, by topic, asked at once (one batch to wait for)."""
        keys = {(name, committed): (name, committed) for name in names}
        out: dict[str, dict[int, int]] = {}
        for (name, _), answer in self._ends.ask_many(keys, self.timeout_s).items():
            if isinstance(answer, BaseException):
                raise answer
            out[name] = dict(answer)
        return out

    def _read_ends(self, keys: list[tuple[str, bool]], deadline: float) -> dict[tuple[str, bool], Any]:
        """The ends of ``keys`` ((topic, committed) pairs): one metadata request for all their
        topics and one ListOffsets request per isolation level, each given what is left until
        ``deadline``; a topic's failure is its own, and a key not reached by then is left out."""
        out: dict[tuple[str, bool], Any] = {}
        partitions: dict[str, list[int]] = {}
        names = list(dict.fromkeys(name for name, _ in keys))
        try:
            # one Metadata request naming the batch's topics (not every topic of the cluster)
            described = self._admin.describe_topics(TopicCollection(names), request_timeout=_left(deadline))
        except KafkaException as exc:
            return {k: KafkaError(f"cannot read the end offsets of {k[0]}: {exc}", topic=k[0]) for k in keys}
        for name in names:
            reason = "it has no partitions"
            try:
                found = described[name].result(timeout=_left(deadline)).partitions
            except KafkaException as exc:  # the broker's reason: unknown topic, not authorized...
                found, reason = None, str(exc)
            except TimeoutError:
                found, reason = None, self._unanswered()
            if not found:
                error = KafkaError(f"cannot read the metadata of topic {name}: {reason}", topic=name)
                out.update({k: error for k in keys if k[0] == name})
            else:
                partitions[name] = sorted(p.id for p in found)
        for committed in (True, False):
            names = [name for name, c in keys if c == committed and name in partitions]
            if not names:
                continue
            wanted = {TopicPartition(n, p): OffsetSpec.latest() for n in names for p in partitions[n]}  # type: ignore[no-untyped-call]
            try:
                futures = self._admin.list_offsets(
                    wanted,
                    isolation_level=IsolationLevel.READ_COMMITTED
                    if committed
                    else IsolationLevel.READ_UNCOMMITTED,
                    request_timeout=_left(deadline),
                )
            except KafkaException as exc:
                out.update(
                    {
                        (n, committed): KafkaError(f"cannot read the end offsets of {n}: {exc}", topic=n)
                        for n in names
                    }
                )
                continue
            ends: dict[str, dict[int, int]] = {n: {} for n in names}
            for tp, future in futures.items():
                key = (tp.topic, committed)
                if key in out:
                    continue
                try:
                    ends[tp.topic][tp.partition] = future.result(timeout=_left(deadline)).offset
                except KafkaException as exc:
                    out[key] = KafkaError(f"cannot read the end offsets of {tp.topic}: {exc}", topic=tp.topic)
                except TimeoutError:  # the future's own wait, which can end before the request's timeout
                    out[key] = KafkaError(
                        f"cannot read the end offsets of {tp.topic}: {self._unanswered()}", topic=tp.topic
                    )
            for n in names:
                out.setdefault((n, committed), ends[n])
        return out

    def _unanswered(self) -> str:
        return f"the brokers did not answer within {round(self.timeout_s, 1):g} s"

    def _ensure_progress_topic(self, name: str) -> TopicLimits:
        created = self._create(name, 1, progress_topic_config())
        config = self._describe(name)
        policy = config.get("cleanup.policy", "")
        if not created and ("compact" not in policy or "delete" in policy):
            raise ConfigError(
                f"progress topic {name} must have cleanup.policy=compact (it has {policy!r}): "
                "a progress record deleted by age makes the watcher publish its tables again",
                topic=name,
            )
        return self._limits(name, config)

    def ensure_signal_topic(self, name: str, max_message_bytes: int | None = None) -> None:
        """Create the operators' signal topic if needed: one partition, signals kept a day, and
        records up to ``max_message_bytes`` (the broker refuses larger ones; None: its default)."""
        config = {"cleanup.policy": "delete", "retention.ms": str(24 * 3600 * 1000)}
        if max_message_bytes is not None:
            config["max.message.bytes"] = str(max_message_bytes)
        self._create(name, 1, config)

    def ensure_assignment_topic(self, name: str, partitions: int) -> int:
        """Create a group's assignment topic (nothing is written to it); its partition count."""
        self._create(name, partitions, {"cleanup.policy": "delete", "retention.ms": str(3600 * 1000)})
        topic = self._admin.list_topics(topic=name, timeout=self.timeout_s).topics.get(name)
        if topic is None or topic.error is not None:
            raise KafkaError(f"cannot read the metadata of topic {name}", topic=name)
        return len(topic.partitions)

    def _limits(self, name: str, config: dict[str, str]) -> TopicLimits:
        topic_max = _int(config.get("max.message.bytes")) or BROKER_DEFAULT_MAX_MESSAGE_BYTES
        limits = TopicLimits(name, max(1024, min(self.max_record_bytes, topic_max - RECORD_OVERHEAD)))
        if config.get("message.timestamp.type", "CreateTime") == "CreateTime":
            before = _int(config.get("message.timestamp.before.max.ms"))
            after = _int(config.get("message.timestamp.after.max.ms"))
            limits.before_max_ms = before if before is not None and before < LONG_MAX else None
            limits.after_max_ms = after if after is not None and after < LONG_MAX else None
        self.limits[name] = limits
        return limits

    def _create(self, name: str, partitions: int, config: dict[str, str]) -> bool:
        """True if the topic was created now, False if it existed."""
        spec = NewTopic(name, num_partitions=partitions, replication_factor=-1, config=config)
        try:
            self._creates.ask(name, spec, self.timeout_s).result(timeout=self.timeout_s)
        except KafkaException as exc:
            err = exc.args[0]
            if err.code() == _RdKafkaError.TOPIC_ALREADY_EXISTS:
                return False
            raise KafkaError(f"cannot create topic {name}: {err.str()}", topic=name) from exc
        except Exception as exc:  # a future timeout (whose text is empty)
            reason = str(exc) or self._unanswered()
            raise KafkaError(f"cannot create topic {name}: {reason}", topic=name) from exc
        self._wait_for_leaders(name)
        log.info("created topic %s", name, extra={"topic": name})
        return True

    def _wait_for_leaders(self, name: str) -> None:
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            try:
                topic = self._admin.list_topics(topic=name, timeout=10).topics.get(name)
            except KafkaException:  # a busy broker's metadata timeout: ask again until the deadline
                time.sleep(0.1)
                continue
            if (
                topic is not None
                and topic.error is None
                and topic.partitions
                and all(p.leader >= 0 for p in topic.partitions.values())
            ):
                return
            time.sleep(0.1)
        raise KafkaError(f"topic {name} has no leader after {self.timeout_s:.0f} s", topic=name)

    def _describe(self, name: str) -> dict[str, str]:
        resource = ConfigResource(ResourceType.TOPIC, name)
        try:
            entries: dict[str, Any] = self._describes.ask(name, resource, self.timeout_s).result(
                timeout=self.timeout_s
            )
        except KafkaException as exc:
            raise KafkaError(f"cannot read the configuration of topic {name}: {exc.args[0].str()}") from exc
        except Exception as exc:  # a future timeout (whose text is empty)
            reason = str(exc) or self._unanswered()
            raise KafkaError(f"cannot read the configuration of topic {name}: {reason}", topic=name) from exc
        return {key: entry.value for key, entry in entries.items() if entry.value is not None}


def _left(deadline: float) -> float:
    """The seconds left until ``deadline`` (``time.monotonic()``), a little at least: a request
    given no time is not sent."""
    return max(0.001, deadline - time.monotonic())


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


__all__ = [
    "TopicLimits",
    "TopicManager",
    "event_topic_config",
    "murmur2",
    "murmur2_partition",
    "progress_topic_config",
]
