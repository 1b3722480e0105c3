"""Where a table resumes after trouble, from its progress position and the tails of its topics.

Kafka writes a transaction's markers one partition at a time; a broker killed in between can leave
it committed on some partitions only, and an operator's abort of what hangs then aborts the rest.
Either way round, the table must publish every record once: records committed past the progress
are not published again, and a progress record committed over aborted actions is not believed.
"""

from __future__ import annotations

from deltamirror.core.timestamps import CommitTimestamp, TimestampSource
from deltamirror.mirror.kafka.consumer import Record
from deltamirror.producer.publishing.tails import Tail, _tail_of, reconcile
from deltamirror.producer.tailing.work import Position
from support.records import commit_info_value

TABLE = "t-1"


def _ts(version: int) -> CommitTimestamp:
    return CommitTimestamp(version, 1_700_000_000_000 + version, TimestampSource.FILE_TIME)


def _position(version: int, index: int, count: int, *, snapshot: bool = False) -> Position:
    return Position(TABLE, version, index, count, _ts(version), snapshot)


def _action_tail(version: int, index: int, count: int, *, table: str = TABLE) -> Tail:
    return Tail(table, version, False, index, count, _ts(version))


def test_actions_committed_past_the_progress_are_skipped_and_the_position_kept() -> None:
    position = _position(5, 149, 1000)
    resume = reconcile(position, _action_tail(5, 299, 1000), None)
    assert resume.position == position and resume.overstated is None
    assert resume.already.skip_actions(TABLE, 5, False, 150, 850) == 150


def test_a_progress_ahead_of_the_actions_topic_resumes_after_its_last_action() -> None:
    """The progress committed, its transaction's actions aborted (the broker-kill case)."""
    claimed = _position(5, 299, 1000)
    resume = reconcile(claimed, _action_tail(5, 149, 1000), None)
    assert resume.overstated == claimed
    assert resume.position == _position(5, 149, 1000)
    assert not resume.already  # nothing past the new position is on the topics


def test_the_rollback_can_cross_versions_and_keeps_a_committed_summary() -> None:
    claimed = _position(7, 9, 10)
    summary = Tail(TABLE, 6, False, -1)
    resume = reconcile(claimed, _action_tail(6, 3, 10), summary)
    assert resume.position == _position(6, 3, 10)
    assert resume.already.skip_summary(TABLE, 6, False)  # version 6's summary is there already
    assert not resume.already.skip_summary(TABLE, 7, False)


def test_a_start_position_and_another_tables_records_are_not_taken_as_behind() -> None:
    start = Position(TABLE, 5, -1, 0, _ts(5))  # latest mode: nothing published for version 5
    assert reconcile(start, _action_tail(3, 1, 2), None).position == start
    claimed = _position(5, 1, 2)
    assert reconcile(claimed, _action_tail(1, 0, 2, table="t-other"), None).position == claimed
    assert reconcile(claimed, None, None).position == claimed


def _record(value: bytes, offset: int) -> Record:
    return Record("a", 0, offset, offset, TABLE.encode(), value, [], 0)


def test_an_unreadable_last_record_gives_no_position_rather_than_an_older_one() -> None:
    """Anyone who can write the topic can append a record the watcher cannot read: taking the
    record before it as the tail would read as the progress overstated and publish again."""
    good = commit_info_value(TABLE, "file:///data/t", 2)
    records = [_record(good, 0), _record(b"not json", 1)]
    assert _tail_of(records, TABLE, summaries=False) is None
    tail = _tail_of(records[:1], TABLE, summaries=False)
    assert tail is not None and tail.position() == Position(
        TABLE, 2, 0, 1, CommitTimestamp(2, 1, TimestampSource.ICT)
    )
