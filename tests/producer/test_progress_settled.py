"""A progress read sees a table's last committed record even behind another table's open transaction.

Every table's progress record goes to the one partition of the progress topic. A watcher killed
while table B's transaction was committing leaves B's progress record open *below* table A's
committed one. A read_committed reader stops at the last stable offset (B's open record), so a
read "to the end" then misses A's last position, and A, resumed elsewhere, would publish its
versions again. The read must wait until the transactions open when it began have ended.

Real broker: two raw transactional producers write the records, as two tables' producers do.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest

pytestmark = pytest.mark.kafka


def progress_value(uri: str, version: int) -> bytes:
    from deltamirror.core.timestamps import CommitTimestamp, TimestampSource
    from deltamirror.producer.publishing.progress import progress_record
    from deltamirror.producer.tailing.work import Position

    ts = CommitTimestamp(version, 1_700_000_000_000 + version, TimestampSource.FILE_TIME)
    return progress_record(Position("tid", version, 0, 1, ts, False, None), uri, "t").to_json_bytes()


def transactional(bootstrap: str, txn_id: str) -> Any:
    from confluent_kafka import Producer

    producer = Producer(
        {"bootstrap.servers": bootstrap, "transactional.id": txn_id, "enable.idempotence": True}
    )
    producer.init_transactions(30)
    return producer


def commit_progress(producer: Any, topic: str, uri: str, version: int) -> None:
    """One progress record of ``uri`` at ``version``, in a transaction of its own, committed."""
    producer.begin_transaction()
    producer.produce(topic, progress_value(uri, version), uri.encode())
    producer.commit_transaction(30)


@pytest.fixture
def progress_topic(kafka_bootstrap: str) -> str:
    from support.kafka import new_topic

    return new_topic(
        kafka_bootstrap, f"dm-settle-{uuid.uuid4().hex[:8]}.progress", 1, {"cleanup.policy": "compact"}
    )


def open_b_then_commit_a(bootstrap: str, topic: str, run: str) -> Any:
    """B's record open below A's committed record at version 2; returns B's producer (still open)."""
    a = transactional(bootstrap, f"{run}-a")
    commit_progress(a, topic, "file:///t/a", 1)
    b = transactional(bootstrap, f"{run}-b")
    b.begin_transaction()
    b.produce(topic, progress_value("file:///t/b", 7), b"file:///t/b")
    b.flush(30)  # on the broker, in the open transaction
    commit_progress(a, topic, "file:///t/a", 2)
    return b


def read_in_thread(read: Any) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["position"] = read()
        except BaseException as exc:  # the test thread reports it
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


@pytest.mark.parametrize("how", ["alone", "board"])
def test_a_read_waits_for_the_open_transaction_below_the_last_record(
    kafka_bootstrap: str, progress_topic: str, how: str
) -> None:
    from deltamirror.mirror.topics import TopicManager
    from deltamirror.producer.publishing.progress import ProgressBoard, read_progress

    kafka = {"bootstrap.servers": kafka_bootstrap}
    run = f"settle-{uuid.uuid4().hex[:8]}"
    b = open_b_then_commit_a(kafka_bootstrap, progress_topic, run)
    if how == "alone":
        thread, out = read_in_thread(lambda: read_progress(kafka, progress_topic, "file:///t/a"))
    else:
        manager = TopicManager(kafka, max_record_bytes=1_000_000)
        board = ProgressBoard(
            kafka,
            progress_topic,
            end_offsets=lambda t, committed: manager.end_offsets(t, committed=committed),
        )
        thread, out = read_in_thread(lambda: board.committed("file:///t/a"))
    thread.join(2.0)
    # a read that stopped at the stable offset would be back already, with version 1
    assert thread.is_alive(), f"the read did not wait for B's open transaction: {out}"
    started = time.monotonic()
    transactional(kafka_bootstrap, f"{run}-b")  # B's new owner: its init aborts B's open transaction
    thread.join(30.0)
    assert not thread.is_alive() and "error" not in out, out
    assert out["position"].version == 2
    assert time.monotonic() - started < 30
    del b


def test_a_transaction_opened_after_the_read_began_does_not_hold_it(
    kafka_bootstrap: str, progress_topic: str
) -> None:
    from deltamirror.mirror.topics import TopicManager
    from deltamirror.producer.publishing.progress import settled_ends

    kafka = {"bootstrap.servers": kafka_bootstrap}
    run = f"settle-{uuid.uuid4().hex[:8]}"
    a = transactional(kafka_bootstrap, f"{run}-a")
    commit_progress(a, progress_topic, "file:///t/a", 1)
    manager = TopicManager(kafka, max_record_bytes=1_000_000)
    calls: list[bool] = []

    def ends(topic: str, committed: bool) -> dict[int, int]:
        got = manager.end_offsets(topic, committed=committed)
        calls.append(committed)
        if len(calls) == 1:  # the watermark is taken; then another table opens a transaction
            a.begin_transaction()
            a.produce(progress_topic, progress_value("file:///t/a", 2), b"file:///t/a")
            a.flush(30)
        return got

    settled = settled_ends(ends, progress_topic, timeout_s=10)
    assert calls[0] is False and calls[1] is True
    assert settled[0] >= 2  # record 1 and its commit marker; the open record lies past them
    a.abort_transaction(30)


def test_the_table_that_opened_a_round_stops_at_once_while_the_others_get_the_read(
    kafka_bootstrap: str, progress_topic: str
) -> None:
    """The read runs on the board's thread: a table whose stop is set stops waiting (a released table
    must not outlive its stop budget behind a slow read), and the other tables of its round still get
    their positions."""
    from deltamirror.mirror.errors import StopRequested
    from deltamirror.mirror.topics import TopicManager
    from deltamirror.producer.publishing.progress import ProgressBoard

    kafka = {"bootstrap.servers": kafka_bootstrap}
    run = f"settle-{uuid.uuid4().hex[:8]}"
    a = transactional(kafka_bootstrap, f"{run}-a")
    commit_progress(a, progress_topic, "file:///t/b", 4)
    manager = TopicManager(kafka, max_record_bytes=1_000_000)
    slow = threading.Event()

    def ends(topic: str, committed: bool) -> dict[int, int]:
        slow.wait(60)  # the read is held here until the test lets it go
        return manager.end_offsets(topic, committed=committed)

    board = ProgressBoard(kafka, progress_topic, end_offsets=ends, gather_s=0.5)
    stop_leader = threading.Event()
    leader, led = read_in_thread(lambda: board.committed("file:///t/a", stop=stop_leader))
    follower, followed = read_in_thread(lambda: board.committed("file:///t/b"))
    stop_leader.set()
    leader.join(5.0)
    assert not leader.is_alive() and isinstance(led.get("error"), StopRequested), led
    assert follower.is_alive()  # still waiting for the read
    slow.set()
    follower.join(30.0)
    assert not follower.is_alive() and "error" not in followed, followed
    assert followed["position"].version == 4
    assert board.reads == 1


def test_rounds_read_through_an_index_see_what_a_read_from_the_start_sees(
    kafka_bootstrap: str, progress_topic: str
) -> None:
    """Issue 29: every round of a survivor resuming thousands of tables read the whole progress
    topic. Through its index a round reads only what was committed since the last round, and each
    table's position is what a read from the start gives (a later version, a tombstone, a table
    never published)."""
    from deltamirror.mirror.topics import TopicManager
    from deltamirror.producer.publishing.progress import ProgressBoard, read_progress

    kafka = {"bootstrap.servers": kafka_bootstrap}
    run = f"index-{uuid.uuid4().hex[:8]}"
    a = transactional(kafka_bootstrap, f"{run}-a")
    uris = [f"file:///t/{i}" for i in range(5)]
    for uri in uris:
        commit_progress(a, progress_topic, uri, 1)
    commit_progress(a, progress_topic, uris[0], 2)
    manager = TopicManager(kafka, max_record_bytes=1_000_000)
    board = ProgressBoard(
        kafka,
        progress_topic,
        end_offsets=lambda t, committed: manager.end_offsets(t, committed=committed),
        gather_s=0.01,
    )
    board.index_min_tables = 1

    def positions() -> None:
        for uri in [*uris, "file:///t/never"]:
            found = board.committed(uri)
            assert found == read_progress(kafka, progress_topic, uri), uri

    positions()
    assert board.indexed == 6 and board.from_index == 6  # read once: the later rounds read nothing
    commit_progress(a, progress_topic, uris[1], 5)
    a.begin_transaction()
    a.produce(progress_topic, None, uris[2].encode())  # a tombstone: the table starts over
    a.commit_transaction(30)
    positions()
    assert board.committed(uris[1]).version == 5  # type: ignore[union-attr]
    assert board.committed(uris[2]) is None
    assert board.indexed == 8  # only the two records committed since
