"""How a signal the owner takes is answered: once, from whichever thread acts on it, and never left
unanswered when the net block it asked for is replaced or its table stops (no broker needed)."""

from __future__ import annotations

import threading
from pathlib import Path

from deltamirror.producer.discovery.signals import Signal, SignalAnswer, SignalListener
from deltamirror.producer.tailing.watcher import TableWatcher
from deltamirror.producer.tailing.work import NetChangesWork
from support.cdf_tables import cdf_table


def test_a_signal_is_answered_once_whatever_thread_answers_it() -> None:
    kept: list[SignalAnswer] = []

    def on_signal(signal: Signal, answer: SignalAnswer) -> bool:
        kept.append(answer)  # answered later, by another thread (a table's)
        return True

    listener = SignalListener({}, "t", on_signal, stop=threading.Event())
    announced: list[Signal] = []
    listener.announce = announced.append  # type: ignore[method-assign]
    sent = Signal(
        kind="net-changes",
        table_uri="file:///t",
        id="s",
        requested_at=listener.started_ms + 1,
        from_version=1,
    )
    listener._take(sent.to_json_bytes(), 0)
    assert announced == [] and len(kept) == 1  # taken, not answered yet
    answering = threading.Thread(target=kept[0], args=("no change data feed",))
    answering.start()
    answering.join(10)
    kept[0](None)  # a second answer is ignored
    assert [(s.kind, s.id, s.refused) for s in announced] == [("done", "s", "no change data feed")]


def test_a_net_block_is_handed_out_between_versions_and_carries_its_answer(tmp_path: Path) -> None:
    latest = cdf_table(tmp_path / "t")
    watcher = TableWatcher(str(tmp_path / "t"), mode="from-version", from_version=0)
    watcher.start(None)
    try:
        while watcher.next_work() is not None:
            pass
        answers: list[str | None] = []
        watcher.request_net_changes(1, answers.append)
        work = watcher.next_work()
        assert isinstance(work, NetChangesWork) and (work.first, work.last) == (1, latest)
        work.answer(None)
        assert answers == [None] and watcher.next_work() is None  # handed out once
    finally:
        watcher.close()


def test_a_net_block_replaced_or_left_when_the_table_stops_is_refused_not_forgotten(tmp_path: Path) -> None:
    cdf_table(tmp_path / "t")
    watcher = TableWatcher(str(tmp_path / "t"), mode="from-version", from_version=0)
    first: list[str | None] = []
    second: list[str | None] = []
    watcher.request_net_changes(1, first.append)
    watcher.request_net_changes(2, second.append)
    assert len(first) == 1 and first[0] is not None and "replaced by a newer" in first[0]
    assert second == []
    watcher.close()  # the table stops here before the block was handed out
    assert len(second) == 1 and second[0] is not None and "stopped" in second[0]


def test_a_request_to_a_stopped_watcher_is_refused_at_once_and_one_read_ahead_yields_to_a_newer(
    tmp_path: Path,
) -> None:
    cdf_table(tmp_path / "t")
    watcher = TableWatcher(str(tmp_path / "t"), mode="from-version", from_version=0)
    watcher.close()
    late: list[str | None] = []
    watcher.request_net_changes(1, late.append)  # the table stopped here: never left waiting
    assert len(late) == 1 and late[0] is not None and "stopped" in late[0]

    watcher.start(None)
    try:
        newer: list[str | None] = []
        older: list[str | None] = []
        watcher.request_net_changes(2, newer.append)
        # a block read ahead and not published (the table restarted) is asked for again: the newer
        # request waiting keeps its place and the older one is answered
        watcher.request_net_changes(1, older.append, again=True)
        assert newer == [] and len(older) == 1 and older[0] is not None and "replaced" in older[0]
        again: list[str | None] = []
        watcher.request_net_changes(3, newer.append)  # answers nothing twice: 2 is replaced by 3
        watcher.request_net_changes(1, again.append, again=True)
        assert len(newer) == 1 and len(again) == 1
    finally:
        watcher.close()
