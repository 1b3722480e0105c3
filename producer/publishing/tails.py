"""What a table's actions and commits topics end with: records a partly committed transaction left.

Kafka writes a transaction's commit markers one partition at a time, after it answered the
producer. A broker killed in between, which then skips the other markers at its restart (see
:mod:`.hanging`), leaves the transaction committed on some partitions only: the commits topic may
hold a version's summary while its actions and its progress record were later aborted (by the
producer's next abort, or an operator's). The table then resumes from the older progress record
and publishes those records again; the ones already committed must not be published twice.

The other way round, the progress record may be committed while the transaction's action records
were not: Kafka committed the progress partition, skipped the markers of the actions partition, and
an operator then aborted what hung there (the only remedy Kafka's tools offer). The progress then
claims actions the topic does not hold. The actions topic is the truth: when its last record of
the table lies before the progress position, the table resumes right after that record
(:class:`Resume`), so the aborted actions are published again, in order, and nothing is lost.

So when a table reads its position back after trouble, it also reads the last committed records
of its actions and commits topics (:func:`read_tails`). Records past the progress position that
are there already are not published again (:class:`AlreadyPublished`): every record a table
publishes after a position comes in one order (version, then a snapshot after the commit of its
version, then index), and what a partial commit left past the position is the start of that run.
Row changes (spread over the changes topic's partitions by key) are not checked.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from deltamirror.core.timestamps import CommitTimestamp, TimestampSource
from deltamirror.mirror import decode_action_event
from deltamirror.mirror.errors import EventStreamError, KafkaError
from deltamirror.mirror.kafka.consumer import MirrorConsumer, Record
from deltamirror.mirror.records.boundary import BadRecordError
from deltamirror.mirror.records.fragments import FragmentError
from deltamirror.mirror.records.headers import HEADER_FRAGMENT, HEADER_KIND

from ..tailing.work import Position

log = logging.getLogger("deltamirror.watch")

#: records read back from each partition's end at first (more when a record there is fragmented)
WINDOW = 64
#: a gathered read keeps a table's last record of a window undecoded up to this size (decoded when
#: the window is read: most are not the last), a larger one decided as it comes (bounds what it holds)
HOLD_BYTES = 16_384
#: a round of at least this many tables reads its topic through an index of the topic kept for the
#: next rounds (:class:`_Index`); a topic read for fewer (a table's own topics) is read as before
INDEX_MIN_TABLES = 32
#: ... once a windowed read of the topic had to read this many records back (per partition): the
#: index covers as many (a topic where the tables find their records near the end is read so)
INDEX_MIN_WINDOW = WINDOW * 8**3
#: an index no round used for this long is dropped (it holds each key's last record of the topic)
INDEX_IDLE_S = 120.0
#: tail reads running at once in a process: each is a short-lived consumer (librdkafka allows about
#: 1,000 clients per process, and a group member may resume many tables at once)
_READERS = threading.BoundedSemaphore(4)

#: each partition's end now: ``committed`` True for a read_committed reader, else the high watermark
EndOffsets = Callable[[str, bool], Mapping[int, int]]

#: a published record's place in a table's publishing order: (version, snapshot, index); a
#: version's snapshot comes after its commit (a snapshot asked for at the cursor), an index of -1
#: is the summary (it follows the version's actions: compared on (version, snapshot) alone)
Key = tuple[int, bool, int]


def key_of(position: Position) -> Key:
    return (position.version, position.snapshot, position.index)


@dataclass(frozen=True)
class Tail:
    """The last committed record of the table on a topic."""

    table_id: str
    version: int
    snapshot: bool
    #: the action's index (actions topic); -1 for a summary (commits topic)
    index: int
    #: an action record's ``count`` and resolved commit timestamp (None on a summary): enough to
    #: resume right after it
    count: int | None = None
    timestamp: CommitTimestamp | None = None

    @property
    def key(self) -> Key:
        return (self.version, self.snapshot, self.index)

    def position(self) -> Position | None:
        """The position of a table whose last published action is this record (None: a summary)."""
        if self.count is None or self.timestamp is None or self.index < 0:
            return None
        return Position(self.table_id, self.version, self.index, self.count, self.timestamp, self.snapshot)


@dataclass(frozen=True)
class AlreadyPublished:
    """What the topics hold past a position: the records not to publish again."""

    #: the last action record already committed past the position (None: none)
    actions: Tail | None = None
    #: the last summary already committed past the position (None: none)
    summary: Tail | None = None

    def __bool__(self) -> bool:
        return self.actions is not None or self.summary is not None

    def skip_actions(self, table_id: str, version: int, snapshot: bool, start: int, n: int) -> int:
        """How many of the ``n`` action records from index ``start`` of this unit (published after
        the position) are there already: those up to the tail, which may lie in a later version."""
        tail = self.actions
        if tail is None or tail.table_id != table_id:
            return 0
        unit, last = (version, snapshot), (tail.version, tail.snapshot)
        if unit < last:
            return n
        if unit == last:
            return max(0, min(n, tail.index - start + 1))
        return 0

    def skip_summary(self, table_id: str, version: int, snapshot: bool) -> bool:
        """Whether this unit's summary is on the commits topic already."""
        tail = self.summary
        return (
            tail is not None
            and tail.table_id == table_id
            and (version, snapshot) <= (tail.version, tail.snapshot)
        )


def past(position: Position | None, actions: Tail | None, summary: Tail | None) -> AlreadyPublished:
    """The tails that lie past ``position`` (a record at or before it was covered by it)."""
    if position is None:
        return AlreadyPublished(actions, summary)
    here = key_of(position)
    keep_actions = (
        actions
        if actions is not None and actions.table_id == position.table_id and actions.key > here
        else None
    )
    keep_summary = None
    if summary is not None and summary.table_id == position.table_id:
        unit, at = (summary.version, summary.snapshot), (position.version, position.snapshot)
        # the summary of the position's own version went with it if the position completes it
        if unit > at or (unit == at and not position.complete):
            keep_summary = summary
    return AlreadyPublished(keep_actions, keep_summary)


@dataclass(frozen=True)
class Resume:
    """Where a table publishes from after trouble: its position, and what lies committed past it."""

    position: Position | None
    already: AlreadyPublished
    #: the progress topic's position when the actions topic ends before it (else None)
    overstated: Position | None = None


def reconcile(position: Position | None, actions: Tail | None, summary: Tail | None) -> Resume:
    """The position to publish from: the progress topic's, unless the table's last action record
    on the actions topic lies before it (the progress committed, its actions aborted: then right
    after that record), with the records already committed past it."""
    if (
        position is not None
        and position.index >= 0
        and actions is not None
        and actions.table_id == position.table_id
        and actions.key < key_of(position)
    ):
        behind = actions.position()
        if behind is not None:
            return Resume(behind, past(behind, actions, summary), overstated=position)
    return Resume(position, past(position, actions, summary))


#: what :func:`_classify` says of a record that does not count (another kind, a copy's)
_SKIP: Any = object()


def _classify(record: Record, table_id: str, *, summaries: bool, table_uri: str | None) -> Any:
    """One record of the table as :func:`_tail_of` judges it from the end: its Tail, None (an
    action record nothing can be taken from: no older one counts either), or :data:`_SKIP`."""
    if summaries:
        if record.header(HEADER_KIND) != "commit":
            return _SKIP  # a heartbeat, a tableReplaced
        try:
            doc: Any = json.loads(record.value)
            if table_uri is not None and doc.get("tableUri") != table_uri:
                return _SKIP  # a copy of the table (same id) at another location
            return Tail(table_id, int(doc["version"]), bool(doc.get("snapshot", False)), -1)
        except (ValueError, KeyError, TypeError, AttributeError):
            return _SKIP  # not ours to judge here: the consumers check every record
    try:
        event = decode_action_event(record.value)
    except EventStreamError:
        # not ours to judge here (the consumers check every record), but nothing to take a
        # position from either: an older record would read as the progress overstated
        return None
    if table_uri is not None and event.table_uri != table_uri:
        return _SKIP  # a copy of the table (same id) at another location
    return Tail(
        table_id,
        event.version,
        event.snapshot,
        event.index,
        event.count,
        CommitTimestamp(
            event.version, event.commit_timestamp, TimestampSource(event.commit_timestamp_source)
        ),
    )


def _tail_of(
    records: list[Record], table_id: str, *, summaries: bool, table_uri: str | None = None
) -> Tail | None:
    """The last record of the table in ``records`` (the table's own: :func:`_read_tail` reads its
    key only) and, with ``table_uri``, at its location. A copied table folder keeps its ``tableId``,
    so on a topic shared by the tables of a prefix (``topics: shared``) a copy's records carry the
    same key: they are another table's."""
    for record in reversed(records):
        found = _classify(record, table_id, summaries=summaries, table_uri=table_uri)
        if found is not _SKIP:
            return found  # type: ignore[no-any-return]
    return None


def _read_tail(
    kafka: Mapping[str, Any],
    end_offsets: EndOffsets,
    topic: str,
    table_id: str,
    *,
    summaries: bool,
    table_uri: str | None = None,
) -> Tail | None:
    ends = end_offsets(topic, True)
    window = WINDOW
    key = table_id.encode()
    while True:
        records: list[Record] = []
        starts = {p: max(0, end - window) for p, end in ends.items() if end > 0}
        if not starts:
            return None
        try:
            with _READERS, MirrorConsumer(kafka, purpose="tail") as consumer:
                consumer.assign((topic, p, start) for p, start in starts.items())
                # the table's own records only: on a topic shared by many tables (topics: shared)
                # the window holds mostly others' (neither joined nor judged here: the window may
                # begin inside their fragments), and it grows until it finds one
                for batch in consumer.batches(
                    until_end=True,
                    timeout_s=60.0,
                    idle_timeout_s=30.0,
                    key=key,
                    ends={(topic, p): ends[p] for p in starts},
                ):
                    records += [r for r in batch if r.offset < ends[r.partition]]
        except EventStreamError:  # the window began inside a fragmented record of the table: read more
            if all(start == 0 for start in starts.values()):
                raise
            window *= 8
            continue
        found = [
            _tail_of(
                [r for r in records if r.partition == p], table_id, summaries=summaries, table_uri=table_uri
            )
            for p in starts
        ]
        tails = [t for t in found if t is not None]
        if tails or all(start == 0 for start in starts.values()):
            return max(tails, key=lambda t: t.key) if tails else None
        window *= 8  # only other tables' records, or aborted ones, in the window


@dataclass(frozen=True)
class _Ask:
    """A table's tail asked of a topic (the arguments of :func:`_read_tail`)."""

    table_id: str
    summaries: bool
    table_uri: str | None


def _cheap_skip(record: Record, ask: _Ask) -> bool:
    """Whether :func:`_classify` would skip the record, told without decoding it (a summary
    topic's heartbeats and tableReplaced records)."""
    return ask.summaries and record.header(HEADER_KIND) != "commit"


def _refuser(refused: dict[bytes | None, EventStreamError]) -> Callable[[BadRecordError], None]:
    """A refused record kept as its key's first refusal (None: a refusal of no key's)."""

    def on_bad(exc: BadRecordError) -> None:
        refused.setdefault(exc.record_key if isinstance(exc, FragmentError) else None, exc)

    return on_bad


def _read_gathered(
    kafka: Mapping[str, Any],
    end_offsets: EndOffsets,
    topic: str,
    asks: Collection[_Ask],
    *,
    on_window: Callable[[int, int], None] | None = None,
) -> dict[_Ask, Tail | EventStreamError | None]:
    """What :func:`_read_tail` gives each of ``asks`` (a Tail, None, or the EventStreamError it
    raises), from one consumer per window for all of them.

    The windows are :func:`_read_tail`'s (the same ends, taken once, the same starts, growing x8),
    read for the asks not answered yet, with each table's records only (``keys``): each table
    sees in a window exactly the records its own read sees, joined the same way (fragments are
    joined per partition and key). A table whose fragments are refused in a window (the window
    began inside its record) is answered as its read answers that: a larger window, or at the
    partition's start the error. What a window holds is not kept: per table and partition, its
    last record that is not a heartbeat (decoded once the window is read; one larger than
    :data:`HOLD_BYTES` is decoded as it comes, and kept only as its Tail); when that one does not
    count (a copy's, at another location: rare), the table reads the same window again deciding
    every record as it comes. ``on_window(window, tables)`` is called before each read."""
    ends = end_offsets(topic, True)
    answers: dict[_Ask, Tail | EventStreamError | None] = {}
    starts_at: dict[int, int] = {p: end for p, end in ends.items() if end > 0}
    if not starts_at:
        return dict.fromkeys(asks, None)
    todo = set(asks)
    #: asks whose last record in a window did not count: their records are decided as they come
    eager: set[_Ask] = set()
    window = WINDOW
    while todo:
        starts = {p: max(0, end - window) for p, end in starts_at.items()}
        whole = all(start == 0 for start in starts.values())
        group = set(todo)
        while group:
            if on_window is not None:
                on_window(window, len(group))
            by_key: dict[bytes, list[_Ask]] = {}
            for ask in group:
                by_key.setdefault(ask.table_id.encode(), []).append(ask)
            #: per (ask, partition): the last record (not decided yet) or what it was decided to be
            last: dict[tuple[_Ask, int], Any] = {}
            refused: dict[bytes | None, EventStreamError] = {}

            try:
                with _READERS, MirrorConsumer(kafka, purpose="tail") as consumer:
                    consumer.assign((topic, p, start) for p, start in starts.items())
                    for batch in consumer.batches(
                        until_end=True,
                        timeout_s=60.0,
                        idle_timeout_s=30.0,
                        keys=set(by_key),
                        on_bad_record=_refuser(refused),
                        ends={(topic, p): ends[p] for p in starts},
                    ):
                        for record in batch:
                            if record.offset >= ends[record.partition] or record.key in refused:
                                continue
                            for ask in by_key.get(record.key or b"", ()):
                                if _cheap_skip(record, ask):
                                    continue
                                if ask in eager or len(record.value) > HOLD_BYTES:
                                    found = _classify(
                                        record, ask.table_id, summaries=ask.summaries, table_uri=ask.table_uri
                                    )
                                    if found is not _SKIP:
                                        last[ask, record.partition] = found
                                else:
                                    last[ask, record.partition] = record
            except EventStreamError as exc:  # not one table's: as every table's read would, read more
                refused[None] = exc
            redo: set[_Ask] = set()
            for ask in group:
                error = refused.get(ask.table_id.encode(), refused.get(None))
                if error is not None:
                    if whole:
                        answers[ask] = error
                        todo.discard(ask)
                    continue  # the window began inside its fragmented record: read more
                tails: list[Tail] = []
                for p in starts:
                    found = last.get((ask, p))
                    if isinstance(found, Record):
                        found = _classify(
                            found, ask.table_id, summaries=ask.summaries, table_uri=ask.table_uri
                        )
                        if found is _SKIP:
                            redo.add(ask)
                            break
                    if found is not None:
                        tails.append(found)
                else:
                    if tails or whole:
                        answers[ask] = max(tails, key=lambda t: t.key) if tails else None
                        todo.discard(ask)
            eager |= redo
            group = redo
        window *= 8  # only other tables' records, or aborted ones, in the window
    return answers


#: what an index holds for a key whose last record it does not keep (larger than HOLD_BYTES)
_BIG: Any = object()


@dataclass(frozen=True)
class _Anchor:
    """The last record an index read of a partition: its next read starts at it again and checks
    it is there (a topic deleted and created again under the same name is not read as the old)."""

    first_offset: int
    offset: int
    key: bytes | None
    value_hash: int


@dataclass(eq=False)
class _Index:
    """Each key's last committed record of a topic, from its start to ``ends``: read once, then
    only from where it ended (the records committed since).

    Gathered windowed reads (:func:`_read_gathered`) read the topic from the end for the tables
    of a round, growing the window until each finds its record: on a topic shared by 10,000
    tables, most rounds read it whole, again at every round (the survivor of a move resumed its
    tables ~256 at a time, each round reading both topics whole: 2-10 s a round). An index gives
    the same answer from the records below the same ends (a committed record never changes, and
    a read to the last stable offset never ends inside a committed transaction's records), for a
    key it holds plainly: one partition, no fragment refused, a last record small enough to keep
    and of the table's location. Any other key is read as before (the windowed read), and so is
    every key when the index cannot be trusted (a partition shrank, its anchor is gone)."""

    summaries: bool
    #: a last record larger than this is not kept (None: every one is)
    hold_bytes: int | None = HOLD_BYTES
    #: per partition, where the index was read to (exclusive): a read_committed end
    ends: dict[int, int] = field(default_factory=dict)
    #: per (key, partition), its last record not skipped at once (:func:`_cheap_skip`), or _BIG
    last: dict[tuple[bytes, int], Any] = field(default_factory=dict)
    #: keys with a fragment refused, or with records on more than one partition: read as before
    unsure: set[bytes] = field(default_factory=set)
    anchors: dict[int, _Anchor] = field(default_factory=dict)
    used: float = field(default_factory=time.monotonic)
    #: records read into it, in all
    records: int = 0
    #: it began after a partition's start (a key it has no record of may have older ones)
    partial: bool = False

    def last_of(self, key: bytes) -> Any:
        """The key's last record (None: none), or _SKIP: not plain here (read as before)."""
        if key in self.unsure:
            return _SKIP
        found: Any = None
        for p in self.ends:
            record = self.last.get((key, p))
            if record is None:
                continue
            if record is _BIG or found is not None:
                return _SKIP
            found = record
        return found

    def answer(self, ask: _Ask) -> Any:
        """The ask's answer (a Tail or None), or _SKIP: not answered here (read as before)."""
        record = self.last_of(ask.table_id.encode())
        if record is None:
            # no record of it: none at all, unless the index began after a partition's start
            # (its records, if any, lie before it: read as before)
            return _SKIP if self.partial else None
        if record is _SKIP:
            return _SKIP
        # _SKIP from here too for a copy's record (same id, another location): read as before
        return _classify(record, ask.table_id, summaries=ask.summaries, table_uri=ask.table_uri)


def _index_read(
    kafka: Mapping[str, Any], topic: str, index: _Index, ends: Mapping[int, int], span: int | None = None
) -> bool:
    """The records of ``topic`` from where ``index`` was read to to ``ends``, taken into it (a new
    one from ``span`` records before the ends, None: from the start); False when the index cannot
    go on (read it anew)."""
    if set(ends) != set(index.ends) and index.ends:
        return False  # partitions added: a key's records may now lie on two
    if any(ends.get(p, 0) < end for p, end in index.ends.items()):
        return False  # a partition shrank: the topic was deleted and created again
    starts: dict[int, int] = {}
    for p, end in ends.items():
        anchor = index.anchors.get(p)
        if anchor is not None:
            start = anchor.first_offset
        elif p in index.ends:
            start = index.ends[p]
        else:  # a new index
            start = 0 if span is None else max(0, end - span)
            index.partial |= start > 0
        if end > start:
            starts[p] = start
    for p in set(ends) - set(index.ends):
        index.ends[p] = 0
    if not starts:
        return True
    #: per partition, whether its anchor was seen again (a partition with none has nothing to check)
    checked = {p: p not in index.anchors for p in starts}
    refused: dict[bytes | None, EventStreamError] = {}
    with _READERS, MirrorConsumer(kafka, purpose="tail") as consumer:
        consumer.assign((topic, p, start) for p, start in starts.items())
        for batch in consumer.batches(
            until_end=True,
            timeout_s=60.0,
            idle_timeout_s=30.0,
            on_bad_record=_refuser(refused),
            ends={(topic, p): ends[p] for p in starts},
        ):
            for record in batch:
                p = record.partition
                if record.offset >= ends[p]:
                    continue
                if not checked[p]:
                    anchor = index.anchors[p]
                    if record.offset < anchor.offset:
                        continue  # read already (another key's, between the anchor's fragments)
                    if (
                        record.offset != anchor.offset
                        or record.key != anchor.key
                        or hash(record.value) != anchor.value_hash
                    ):
                        return False
                    checked[p] = True
                    continue
                index.records += 1
                index.anchors[p] = _Anchor(record.first_offset, record.offset, record.key, hash(record.value))
                own = record.key or b""
                if record.first_offset == record.offset and record.header(HEADER_FRAGMENT) is not None:
                    # a record's last fragment read without its first (the index, or this read,
                    # began inside the record): shorter than any first fragment, the reader took
                    # it as whole; the key's last record is that record, which only a read from
                    # further back joins: read as before
                    index.unsure.add(own)
                    continue
                if index.summaries and record.header(HEADER_KIND) != "commit":
                    continue
                for q in index.ends:
                    if q != p and (own, q) in index.last:
                        index.unsure.add(own)
                big = index.hold_bytes is not None and len(record.value or b"") > index.hold_bytes
                index.last[own, p] = _BIG if big else record
    if not all(checked.values()) or None in refused:
        return False
    for bad in refused:
        if bad is not None:
            index.unsure.add(bad)
    index.ends.update({p: ends[p] for p in starts})
    return True


@dataclass(eq=False)
class _Round:
    """The asks of one topic that one gathered read answers."""

    asks: set[_Ask] = field(default_factory=set)
    ready: threading.Event = field(default_factory=threading.Event)
    answers: dict[_Ask, Tail | EventStreamError | None] = field(default_factory=dict)
    error: BaseException | None = None


@dataclass(frozen=True)
class _Pending:
    """An ask made of a topic: the round that answers it."""

    topic: str
    ask: _Ask
    round: _Round


class TailBoard:
    """One read of a topic's tail for the tables that resume together (a group moving shards).

    Without it each resuming table reads back its actions and commits topics on a consumer of its
    own: on topics shared by many tables (``topics: shared``) that read goes far back to find the
    table's last record among the others', and thousands of tables resuming at once read it once
    each (a survivor of 10,000 tables resumed ~0.3 tables a second). Here the tables that ask for
    a topic's tail while a read of it is in flight are answered by the next read, together
    (:func:`_read_gathered`); a table asking with nothing in flight is read at once, alone.

    A round is read on a thread of its own (``tail-read``), not on the thread of the table that
    opened it: a table asks its actions and its commits topics at once (:meth:`tails`), and the
    two reads run side by side instead of one after the other (asked in turn, a resuming table
    waited for two rounds of each topic in series: the survivor of a 10,000-table move had half
    of its openers waiting there).

    A round of many tables (:data:`INDEX_MIN_TABLES`) reads its topic through the topic's index
    (:class:`_Index`), kept for the next rounds: each round reads only the records committed since
    the last, where the windowed reads of a shared topic read it whole at every round.

    Each answer is what the table's own read would have given (:func:`_read_tail`): its read
    began after it asked, with the topic's ends taken then, so it sees everything committed
    before its ask, as reading alone at that moment.
    """

    def __init__(self, kafka: Mapping[str, Any], end_offsets: EndOffsets) -> None:
        self.kafka = kafka
        self.end_offsets = end_offsets
        #: how many gathered reads were made (one per round: one per topic for tables asking together)
        self.reads = 0
        #: how many windows were read (a consumer each)
        self.windows = 0
        #: seconds spent in the reads, summed (rounds of two topics overlap)
        self.read_s = 0.0
        #: the most tables one read answered
        self.largest = 0
        #: called with the topic and its asks before each round's read (tests hold a read here)
        self.before_read: Callable[[str, frozenset[_Ask]], None] | None = None
        self._lock = threading.Lock()
        self._busy: set[str] = set()
        #: per topic, the round that takes the asks made now (read once the one in flight is done)
        self._next: dict[str, _Round] = {}
        #: per topic (and kind: summaries or actions), its index, once a round of many tables read it
        self._indexes: dict[tuple[str, bool], _Index] = {}
        #: a round of this many tables reads its topic through an index (:data:`INDEX_MIN_TABLES`),
        #: once a windowed read of it read this far back (:data:`INDEX_MIN_WINDOW`; 0: at once, the
        #: index read from the topic's start)
        self.index_min_tables = INDEX_MIN_TABLES
        self.index_min_window = INDEX_MIN_WINDOW
        #: per topic and kind, the widest window a windowed read of it reached
        self._widest: dict[tuple[str, bool], int] = {}
        #: records read into indexes, in all
        self.indexed = 0
        #: asks answered by an index
        self.from_index = 0

    def waiting(self, topic: str) -> int:
        """How many asks of ``topic`` wait for the next read (not the one in flight)."""
        with self._lock:
            round_ = self._next.get(topic)
            return 0 if round_ is None else len(round_.asks)

    def tail(
        self, topic: str, table_id: str, *, summaries: bool, table_uri: str | None = None
    ) -> Tail | None:
        """What :func:`_read_tail` gives (raises the same EventStreamError, a KafkaError)."""
        (found,) = self.tails([(topic, _Ask(table_id, summaries, table_uri))])
        return found

    def tails(self, asks: Collection[tuple[str, _Ask]]) -> list[Tail | None]:
        """What :func:`_read_tail` gives each (topic, ask), asked together: each topic's read runs
        on its own thread, side by side. Raises what the first ask's read raised."""
        pending = [self._ask(topic, ask) for topic, ask in asks]
        out: list[Tail | None] = []
        for p in pending:
            p.round.ready.wait()
        for p in pending:
            if p.round.error is not None:
                raise p.round.error
            answer = p.round.answers[p.ask]
            if isinstance(answer, EventStreamError):
                raise answer
            out.append(answer)
        return out

    def _ask(self, topic: str, ask: _Ask) -> _Pending:
        """The ask joined to the round that takes it (a round opened with nothing in flight is
        read now: its asks are closed, the next ones go to a new round)."""
        with self._lock:
            round_ = self._next.get(topic)
            if round_ is None:
                round_ = _Round()
                if topic in self._busy:
                    self._next[topic] = round_  # read once the read in flight is done
                    start = False
                else:
                    self._busy.add(topic)
                    start = True
            else:
                start = False
            round_.asks.add(ask)
        if start:
            self._start(topic, round_)
        return _Pending(topic, ask, round_)

    def _start(self, topic: str, round_: _Round) -> None:
        try:
            threading.Thread(target=self._read, args=(topic, round_), name="tail-read", daemon=True).start()
        except RuntimeError:  # no thread to be had (a process at its limit): read here, not never
            self._read(topic, round_)

    def _read(self, topic: str, round_: _Round) -> None:
        started = time.monotonic()
        asks: frozenset[_Ask] = frozenset()
        windows = 0

        def on_window(window: int, tables: int) -> None:
            nonlocal windows
            windows += 1
            self._window(window, tables)

        try:
            asks = frozenset(round_.asks)  # closed: taken from _next, or never in it
            if self.before_read is not None:
                self.before_read(topic, asks)
            round_.answers = self._answer(topic, asks, on_window)
        except BaseException as exc:  # given to every table of the round
            round_.error = exc
        finally:
            took = time.monotonic() - started
            with self._lock:
                self.reads += 1
                self.read_s += took
                self.largest = max(self.largest, len(asks))
                following = self._next.pop(topic, None)
                if following is None:
                    self._busy.discard(topic)
            round_.ready.set()
            if following is not None:  # its asks are closed now: read on a thread of its own
                self._start(topic, following)
        if len(asks) > 1:  # a table reading alone (its own topics) is not worth a line
            log.info(
                "tails read",
                extra={"topic": topic, "tables": len(asks), "windows": windows, "seconds": round(took, 3)},
            )

    def _answer(
        self, topic: str, asks: frozenset[_Ask], on_window: Callable[[int, int], None]
    ) -> dict[_Ask, Tail | EventStreamError | None]:
        """The round's answers: from the topic's index for the asks it holds plainly (read to the
        ends taken now), the others by a gathered windowed read to the same ends."""
        now = time.monotonic()
        kinds = {ask.summaries for ask in asks}
        kind = next(iter(kinds))
        with self._lock:  # a topic's index is read by its round's thread only: one at a time
            for k in [k for k, ix in self._indexes.items() if now - ix.used > INDEX_IDLE_S]:
                del self._indexes[k]
            index = self._indexes.pop((topic, kind), None)  # back once read to the new ends
            widest = self._widest.get((topic, kind))
        span = None if self.index_min_window == 0 else widest
        if (
            len(kinds) > 1
            or (index is None and len(asks) < self.index_min_tables)
            or (index is None and self.index_min_window > 0 and (widest or 0) < self.index_min_window)
        ):
            return self._windowed(self.end_offsets, topic, kind, asks, on_window)
        ends = dict(self.end_offsets(topic, True))
        before = 0 if index is None else index.records
        if index is None or not _index_read(self.kafka, topic, index, ends):
            index = _Index(kind)  # anew, as far back as the windowed reads went
            before = 0
            if not _index_read(self.kafka, topic, index, ends, span):
                return self._windowed(lambda t, c: ends, topic, kind, asks, on_window)
        index.used = time.monotonic()
        with self._lock:
            self._indexes[topic, kind] = index
        answers: dict[_Ask, Tail | EventStreamError | None] = {}
        rest: list[_Ask] = []
        for ask in asks:
            found = index.answer(ask)
            if found is _SKIP:
                rest.append(ask)
            else:
                answers[ask] = found
        with self._lock:
            self.indexed += index.records - before
            self.from_index += len(answers)
        if rest:
            answers.update(self._windowed(lambda t, c: ends, topic, kind, rest, on_window))
        return answers

    def _windowed(
        self,
        end_offsets: EndOffsets,
        topic: str,
        kind: bool,
        asks: Collection[_Ask],
        on_window: Callable[[int, int], None],
    ) -> dict[_Ask, Tail | EventStreamError | None]:
        """A gathered windowed read (:func:`_read_gathered`), its widest window kept."""
        widest = 0

        def seen(window: int, tables: int) -> None:
            nonlocal widest
            widest = max(widest, window)
            on_window(window, tables)

        try:
            return _read_gathered(self.kafka, end_offsets, topic, asks, on_window=seen)
        finally:
            with self._lock:
                self._widest[topic, kind] = max(widest, self._widest.get((topic, kind), 0))

    def _window(self, window: int, tables: int) -> None:
        with self._lock:
            self.windows += 1


def read_tails(
    kafka: Mapping[str, Any],
    end_offsets: EndOffsets,
    actions_topic: str,
    commits_topic: str,
    position: Position | None,
    table_uri: str | None = None,
    board: TailBoard | None = None,
) -> Resume:
    """Where the table resumes from ``position`` (the progress topic's), given what its actions and
    commits topics hold committed (:func:`reconcile`); with ``table_uri`` only the records of the
    table at that location count (a topic shared by many tables may hold a copy's, same id).
    With ``board``, read together with the other tables resuming at the same time."""
    table_id = position.table_id if position is not None else None
    try:
        if table_id is None:
            # nothing committed: a partial first transaction is not told apart
            return Resume(position, AlreadyPublished())
        if board is not None:  # both topics at once
            actions, summary = board.tails(
                [
                    (actions_topic, _Ask(table_id, False, table_uri)),
                    (commits_topic, _Ask(table_id, True, table_uri)),
                ]
            )
        else:
            actions = _read_tail(
                kafka, end_offsets, actions_topic, table_id, summaries=False, table_uri=table_uri
            )
            summary = _read_tail(
                kafka, end_offsets, commits_topic, table_id, summaries=True, table_uri=table_uri
            )
    except (KafkaError, EventStreamError) as exc:
        raise KafkaError(
            f"cannot read the last records of {actions_topic} and {commits_topic}: {exc}"
        ) from None
    return reconcile(position, actions, summary)


__all__ = ["AlreadyPublished", "Resume", "Tail", "TailBoard", "key_of", "past", "read_tails", "reconcile"]
