"""Tables resuming together read a shared topic's tail once, not once each (issue 29).

A group member that takes over a dead member's thousands of tables resumed ~0.3 tables a second:
each table read back its shared actions and commits topics on a consumer of its own, from the end
with a growing window until it found its own last record. The board answers every table asking
while a read is in flight with the next read, and each answer is what the table's own read gives.
"""

from __future__ import annotations

import threading
import time
from typing import Any, NamedTuple

import pytest

from deltamirror.mirror.errors import EventStreamError
from deltamirror.producer.publishing.tails import TailBoard, _Ask, _read_tail
from support.forge import Rec, commits_rec, fragments, write_topics
from support.records import commit_info_value

TABLES = 30


def _summary(table_id: str, uri: str, version: int) -> Rec:
    return commits_rec({"kind": "commit", "tableId": table_id, "tableUri": uri, "version": version})


def _uri(i: int) -> str:
    return f"file:///lake/t{i}"


def _forged() -> tuple[list[Rec], list[Rec], dict[str, str]]:
    """Thirty tables on one actions and one commits topic: table i's last records lie about
    30 * i records from the end (windows of 64, 512 and 4,096 needed); table 3's location has a
    copy (same id) whose records come after its own; table 5's last action is split in fragments
    that the first window begins inside; heartbeats follow the summaries."""
    ids = {_uri(i): f"id-{i}" for i in range(TABLES)}
    actions: list[Rec] = []
    commits: list[Rec] = []
    last_version = {i: 0 for i in range(TABLES)}
    # table i writes versions until round TABLES - i: the lower i, the further back its last record
    for round_ in range(TABLES * 4):
        for i in range(TABLES):
            if round_ < (TABLES - i) * 4:
                v = last_version[i] = round_ + 1
                key = ids[_uri(i)].encode()
                actions.append(Rec(commit_info_value(ids[_uri(i)], _uri(i), v), key))
                commits.append(_summary(ids[_uri(i)], _uri(i), v))
                commits.append(commits_rec({"kind": "heartbeat", "tableId": ids[_uri(i)]}, kind="heartbeat"))
    # a copy of table 3 (same id, another location) writes after it
    copy = "file:///lake/copy-of-t3"
    for v in range(last_version[3] + 1, last_version[3] + 3):
        actions.append(Rec(commit_info_value(ids[_uri(3)], copy, v), ids[_uri(3)].encode()))
        commits.append(_summary(ids[_uri(3)], copy, v))
    # table 5's last action in three fragments, the second 64 records from the end
    value = commit_info_value(ids[_uri(5)], _uri(5), last_version[5] + 1, "WRITE " + "x" * 2100)
    parts = [value[:1024], value[1024:2048], value[2048:]]  # all but the last 1024+ bytes
    key5 = ids[_uri(5)].encode()
    actions.append(fragments(parts[0], 0, 3, key5))
    filler = [
        Rec(commit_info_value(ids[_uri(29)], _uri(29), 1000 + n), ids[_uri(29)].encode()) for n in range(70)
    ]
    actions += filler[:2]
    actions.append(fragments(parts[1], 1, 3, key5))
    actions += filler[2:10]
    actions.append(fragments(parts[2], 2, 3, key5))
    actions += filler[10:]
    return actions, commits, ids


def _asked_together(
    kafka: dict[str, Any],
    end_offsets: Any,
    topic: str,
    summaries: bool,
    asks: list[tuple[str, str]],
    alone: dict[str, Any],
) -> None:
    """Every table asks at once while the first table's read is held open: two reads answer all."""
    board = TailBoard(kafka, end_offsets)
    held = threading.Event()
    rounds: list[int] = []

    def hold_first(topic: str, asked: frozenset[Any]) -> None:
        rounds.append(len(asked))
        if len(rounds) == 1:  # the first table's read waits until every other table asked
            deadline = time.monotonic() + 60
            while board.waiting(topic) < len(asks) - 1 and time.monotonic() < deadline:
                held.wait(0.01)

    board.before_read = hold_first
    answers: dict[str, Any] = {}

    def ask(uri: str, table_id: str) -> None:
        try:
            answers[uri] = board.tail(topic, table_id, summaries=summaries, table_uri=uri)
        except EventStreamError as exc:  # pragma: no cover - compared below
            answers[uri] = exc

    first = threading.Thread(target=ask, args=asks[0])
    first.start()
    deadline = time.monotonic() + 60
    while not rounds and time.monotonic() < deadline:
        held.wait(0.01)  # the first read is open, alone
    threads = [threading.Thread(target=ask, args=a) for a in asks[1:]]
    for t in threads:
        t.start()
    for t in [first, *threads]:
        t.join(120)
    assert answers == alone
    assert rounds == [1, len(asks) - 1]  # one read for the first table, one for all the others
    assert board.reads == 2
    # the tables needing the largest window bound the consumers: its windows (64, 512, 4096,
    # 32768: the whole topic), and one more for the copied table's location, per read
    assert board.windows <= 2 * 4 + 2 < len(asks)


def _written(bootstrap: str) -> tuple[dict[str, str], Any, dict[str, str], Any]:
    """The forged topics written, and their ends (nothing is written to them after)."""
    from deltamirror.mirror.topics import TopicManager

    actions, commits, ids = _forged()
    topics = write_topics(bootstrap, actions, commits)
    kafka = {"bootstrap.servers": bootstrap}
    manager = TopicManager(kafka, max_record_bytes=1_000_000)
    ends = {topic: manager.end_offsets(topic) for topic in (topics.actions, topics.commits)}
    del manager

    def end_offsets(topic: str, committed: bool) -> dict[int, int]:
        return ends[topic]

    return kafka, topics, ids, end_offsets


@pytest.mark.kafka
@pytest.mark.timeout(300)
def test_tables_asking_together_are_answered_by_one_read_each_as_their_own_read(kafka_bootstrap: str) -> None:
    kafka, topics, ids, end_offsets = _written(kafka_bootstrap)

    asks = [(uri, table_id) for uri, table_id in ids.items()]
    asks.append(("file:///lake/nowhere", "id-unknown"))  # a table with no record: None
    for topic, summaries in ((topics.actions, False), (topics.commits, True)):
        alone: dict[str, Any] = {
            uri: _read_tail(kafka, end_offsets, topic, table_id, summaries=summaries, table_uri=uri)
            for uri, table_id in asks
        }
        # the forged cases are what the table's own read makes of them
        assert alone["file:///lake/nowhere"] is None
        assert alone[_uri(3)] is not None and alone[_uri(3)].version == 4 * (TABLES - 3)  # not the copy's
        if not summaries:
            assert alone[_uri(5)] is not None and alone[_uri(5)].version == 4 * (TABLES - 5) + 1  # joined

        _asked_together(kafka, end_offsets, topic, summaries, asks, alone)


@pytest.mark.kafka
def test_a_table_alone_on_the_board_reads_as_its_own_read(kafka_bootstrap: str) -> None:
    """Per-table topics: each table asks of its own topic, alone; the answer is the same."""
    kafka, topics, ids, end_offsets = _written(kafka_bootstrap)
    board = TailBoard(kafka, end_offsets)
    for uri in (_uri(0), _uri(3), _uri(5), _uri(29)):
        for topic, summaries in ((topics.actions, False), (topics.commits, True)):
            own = _read_tail(kafka, end_offsets, topic, ids[uri], summaries=summaries, table_uri=uri)
            assert board.tail(topic, ids[uri], summaries=summaries, table_uri=uri) == own
    assert board.reads == 8


def _append(bootstrap: str, topic: str, recs: list[Rec]) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for rec in recs:
        producer.produce(topic, rec.value, key=rec.key, headers=rec.headers, partition=0)
    assert producer.flush(60) == 0


@pytest.mark.kafka
@pytest.mark.timeout(300)
def test_rounds_read_through_an_index_answer_as_their_own_read_and_read_only_what_came_since(
    kafka_bootstrap: str,
) -> None:
    """Issue 29: rounds of many tables read a shared topic whole, again at every round (a survivor
    of a 10,000-table move read both topics whole ~20 times). Through the topic's index a round
    reads only the records committed since the last one, and each answer is still the table's own
    read's: the copied location, the fragmented record and a table with no record included, and
    after new records (a copy's last record now: that table is read as before)."""
    from deltamirror.mirror.topics import TopicManager

    actions, commits, ids = _forged()
    topics = write_topics(kafka_bootstrap, actions, commits)
    kafka = {"bootstrap.servers": kafka_bootstrap}
    manager = TopicManager(kafka, max_record_bytes=1_000_000)

    def end_offsets(topic: str, committed: bool) -> dict[int, int]:
        return dict(manager.end_offsets(topic, committed=committed))

    board = TailBoard(kafka, end_offsets)
    board.index_min_tables = 1
    board.index_min_window = 0  # the index at once, from the topic's start
    asks = [(uri, table_id) for uri, table_id in ids.items()]
    asks.append(("file:///lake/nowhere", "id-unknown"))

    def both(topic: str, summaries: bool) -> tuple[dict[str, Any], dict[str, Any]]:
        own = {
            uri: _read_tail(kafka, end_offsets, topic, table_id, summaries=summaries, table_uri=uri)
            for uri, table_id in asks
        }
        found = board.tails([(topic, _Ask(table_id, summaries, uri)) for uri, table_id in asks])
        return own, dict(zip([uri for uri, _ in asks], found, strict=True))

    for topic, summaries in ((topics.actions, False), (topics.commits, True)):
        own, found = both(topic, summaries)
        assert found == own
    whole = board.indexed
    assert whole == len(actions) + len(commits) - 2  # each topic read once (fragments joined: one record)
    assert board.from_index >= 2 * (len(asks) - 1)  # all but the copied location's (read as before)

    # new records: versions of tables 0 and 7, a copy of table 4 (same id, another location) last
    more_actions = [
        Rec(commit_info_value(ids[_uri(i)], _uri(i), 500 + i), ids[_uri(i)].encode()) for i in (0, 7)
    ] + [Rec(commit_info_value(ids[_uri(4)], "file:///lake/copy-of-t4", 900), ids[_uri(4)].encode())]
    more_commits = [_summary(ids[_uri(i)], _uri(i), 500 + i) for i in (0, 7)] + [
        commits_rec({"kind": "heartbeat", "tableId": ids[_uri(0)]}, kind="heartbeat"),
        _summary(ids[_uri(4)], "file:///lake/copy-of-t4", 900),
    ]
    _append(kafka_bootstrap, topics.actions, more_actions)
    _append(kafka_bootstrap, topics.commits, more_commits)
    for topic, summaries in ((topics.actions, False), (topics.commits, True)):
        own, found = both(topic, summaries)
        assert found == own
        assert own[_uri(0)] is not None and own[_uri(0)].version == 500
    assert board.indexed == whole + len(more_actions) + len(more_commits)  # only what came since


class _Compared(NamedTuple):
    board: TailBoard
    topic: str
    end_offsets: Any
    #: per table location: its own read's answer, and the board's
    own: dict[str, Any]
    found: dict[str, Any]
    #: the windows of the first table's read alone
    windows_alone: int


def _after_a_windowed_read(bootstrap: str, index_min_window: int, first: int) -> _Compared:
    """The forged actions topic, a board that indexes a topic once a windowed read went
    ``index_min_window`` back, table ``first`` read alone (a windowed read, no index yet), then
    every table asked together, beside each table's own read."""
    kafka, topics, ids, end_offsets = _written(bootstrap)
    board = TailBoard(kafka, end_offsets)
    board.index_min_tables = 1
    board.index_min_window = index_min_window
    topic = topics.actions
    board.tail(topic, ids[_uri(first)], summaries=False, table_uri=_uri(first))
    windows = board.windows
    assert board.indexed == 0
    asks = [(uri, table_id) for uri, table_id in ids.items()]
    own = {
        uri: _read_tail(kafka, end_offsets, topic, table_id, summaries=False, table_uri=uri)
        for uri, table_id in asks
    }
    found = board.tails([(topic, _Ask(table_id, False, uri)) for uri, table_id in asks])
    answers = dict(zip([uri for uri, _ in asks], found, strict=True))
    return _Compared(board, topic, end_offsets, own, answers, windows)


@pytest.mark.kafka
@pytest.mark.timeout(300)
def test_an_index_covers_as_far_back_as_the_windowed_reads_went(kafka_bootstrap: str) -> None:
    """A topic whose tables found their records within a small window is not read whole for an
    index: the index covers the widest window read, and a table with no record in it (its last
    lies further back) is read as before, with the same answer as its own read."""
    # table 0's last record lies ~80 records from the end (behind table 29's last ones): window 512
    got = _after_a_windowed_read(kafka_bootstrap, 512, 0)
    assert got.windows_alone == 2  # its windowed read: 64, then 512
    assert got.found == got.own
    total = sum(got.end_offsets(got.topic, True).values())
    assert 0 < got.board.indexed <= 512 < total  # the last 512 offsets, not the whole topic
    assert 0 < got.board.from_index < len(got.own) - 1  # the tables further back were read as before


@pytest.mark.kafka
@pytest.mark.timeout(300)
def test_an_index_beginning_inside_a_split_record_reads_its_table_as_before(kafka_bootstrap: str) -> None:
    """Found by review: an index that begins between a split record's fragments reads its last
    fragment alone. Shorter than any first fragment, that fragment is taken as whole (its headers
    unread), became the table's last record in the index, and was answered "no tail" where the
    table's own read joins the record (a version published again after a move, or a lost one's
    check skipped). A fragment read alone now makes its table read as before."""
    # table 29's last record is within the last 64 offsets: one window of 64, then an index of 64,
    # which begins between table 5's second and last fragments (70 and 61 offsets from the end)
    got = _after_a_windowed_read(kafka_bootstrap, 64, 29)
    assert got.windows_alone == 1
    assert got.own[_uri(5)] is not None  # its own read joins the split record
    assert got.found == got.own
    assert 0 < got.board.indexed <= 64
