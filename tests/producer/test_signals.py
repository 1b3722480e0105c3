"""``deltamirror signal snapshot TABLE``: the running watcher publishes a fresh snapshot, between two
versions, without a restart (real broker)."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import pytest

from deltamirror.producer.discovery.signals import (
    MAX_PENDING,
    MAX_SNAPSHOTS_PER_INTERVAL,
    SNAPSHOT_INTERVAL_S,
    Signal,
    SignalAnswer,
    SignalListener,
)
from deltamirror.producer.settings import WatchConfig

pytestmark = [pytest.mark.kafka]


def test_signal_snapshot_republishes_the_table_between_two_versions(
    kafka_bootstrap: str, tmp_path: Path, kit: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    from deltamirror.cli.main import main
    from deltamirror.producer.service import WatchService

    name = kit.unique("sig")
    table = kit.make_table(tmp_path / name, versions=2)
    signals, progress = kit.unique("signals"), kit.unique("progress")
    cfg = WatchConfig.model_validate(
        {
            "kafka": {"bootstrap_servers": kafka_bootstrap},
            "tables": [{"uri": str(table), "poll_interval_s": 0.2}],
            "signal_topic": signals,
            "progress_topic": progress,
        }
    )
    commits = f"deltamirror.{name}.commits"
    service = WatchService(cfg, stop_budget_s=5.0)
    service.start()

    def summaries(records: list[Any]) -> list[tuple[int, bool]]:
        return [
            (r.json["version"], r.json["snapshot"]) for r in records if r.headers.get("kind") == b"commit"
        ]

    try:
        kit.consume(kafka_bootstrap, [commits], until=lambda rs: summaries(rs) == [(1, True)], timeout_s=30)
        assert service.signals is not None and service.signals.listening.wait(30)
        argv = [
            "signal",
            "snapshot",
            str(table),
            "--bootstrap-servers",
            kafka_bootstrap,
            "--signal-topic",
            signals,
        ]
        assert main(argv) == 0
        sent = json.loads(capsys.readouterr().out)
        assert (sent["signal"], sent["tableUri"]) == ("snapshot", f"file://{table}")
        kit.consume(kafka_bootstrap, [commits], until=lambda rs: len(summaries(rs)) == 2, timeout_s=30)
        kit.append(table)  # version 2 follows the fresh snapshot
        kit.consume(kafka_bootstrap, [commits], until=lambda rs: len(summaries(rs)) == 3, timeout_s=30)
        assert service._failure is None, service._failure
    finally:
        service.request_stop()
        assert service.wait(30), "the watcher did not stop"
        service.close()

    records = kit.consume(kafka_bootstrap, [commits], idle_s=0.5)
    assert summaries(records) == [(1, True), (1, True), (2, False)]
    actions = kit.consume(kafka_bootstrap, [f"deltamirror.{name}.actions"], idle_s=0.5)
    snapshot_events = [r.json for r in actions if r.json["snapshot"]]
    first, second = snapshot_events[: len(snapshot_events) // 2], snapshot_events[len(snapshot_events) // 2 :]
    assert [e["action"] for e in first] == [e["action"] for e in second]  # the same state, again
    assert second[-1]["snapshotEnd"] is True
    assert [r.json["version"] for r in actions if not r.json["snapshot"]] == [2] * (
        len(actions) - len(snapshot_events)
    )
    last = [
        r for r in kit.consume(kafka_bootstrap, [progress], idle_s=0.5) if r.key == f"file://{table}".encode()
    ]
    assert (last[-1].json["version"], last[-1].json["snapshot"]) == (2, False)


def test_a_snapshot_signal_wakes_an_idle_table_whose_poll_is_an_hour_away(
    kafka_bootstrap: str, tmp_path: Path, kit: Any
) -> None:
    """A table watched by notifications polls every 30 s by default: a signal must not wait for the
    poll (before, the signalled table looked at it only at its next poll)."""
    from deltamirror.producer.discovery.signals import send_signal
    from deltamirror.producer.service import WatchService

    name = kit.unique("sigwake")
    table = kit.make_table(tmp_path / name, versions=2)
    signals = kit.unique("signals")
    cfg = WatchConfig.model_validate(
        {
            "kafka": {"bootstrap_servers": kafka_bootstrap},
            "tables": [{"uri": str(table), "poll_interval_s": 3600}],
            "signal_topic": signals,
            "progress_topic": kit.unique("progress"),
        }
    )
    commits = f"deltamirror.{name}.commits"
    service = WatchService(cfg, stop_budget_s=5.0)
    service.start()

    def snapshots(records: list[Any]) -> int:
        return sum(1 for r in records if r.headers.get("kind") == b"commit" and r.json["snapshot"])

    try:
        kit.consume(kafka_bootstrap, [commits], until=lambda rs: snapshots(rs) == 1, timeout_s=30)
        assert service.signals is not None and service.signals.listening.wait(30)
        send_signal({"bootstrap.servers": kafka_bootstrap}, signals, f"file://{table}", "snapshot")
        kit.consume(kafka_bootstrap, [commits], until=lambda rs: snapshots(rs) == 2, timeout_s=30)
        assert service._failure is None, service._failure
    finally:
        service.request_stop()
        assert service.wait(30), "the watcher did not stop"
        service.close()


def test_a_signal_sent_before_the_table_runs_here_is_acted_on_when_it_starts(
    kafka_bootstrap: str, tmp_path: Path, kit: Any
) -> None:
    from deltamirror.producer.discovery.signals import send_signal
    from deltamirror.producer.service import WatchService
    from deltamirror.producer.settings import TableConfig

    first, later = kit.unique("sigfirst"), kit.unique("siglater")
    kit.make_table(tmp_path / first, versions=1)
    table = kit.make_table(tmp_path / later, versions=2)
    signals = kit.unique("signals")
    cfg = WatchConfig.model_validate(
        {
            "kafka": {"bootstrap_servers": kafka_bootstrap},
            "tables": [{"uri": str(tmp_path / first), "poll_interval_s": 0.2}],
            "signal_topic": signals,
            "progress_topic": kit.unique("progress"),
        }
    )
    kafka = {"bootstrap.servers": kafka_bootstrap}
    service = WatchService(cfg, stop_budget_s=5.0)
    service.start()
    try:
        listener = service.signals
        assert listener is not None and listener.listening.wait(30)
        sent = send_signal(kafka, signals, f"file://{table}", "snapshot")
        _wait(lambda: f"file://{table}" in listener.pending, "the signal kept")
        service.add_table(TableConfig(uri=str(table), poll_interval_s=0.2))  # e.g. discovered now
        commits = f"deltamirror.{later}.commits"
        records = kit.consume(
            kafka_bootstrap, [commits], until=lambda rs: len(_summaries(rs)) == 2, timeout_s=30
        )
        assert _summaries(records) == [(1, True), (1, True)]  # the first snapshot, then the signal's
        assert service._failure is None, service._failure
    finally:
        service.request_stop()
        assert service.wait(30), "the watcher did not stop"
        service.close()
    on_topic = [
        Signal.model_validate_json(r.value) for r in kit.consume(kafka_bootstrap, [signals], idle_s=0.5)
    ]
    assert [(s.kind, s.id) for s in on_topic] == [("snapshot", sent.id), ("done", sent.id)]


def _summaries(records: list[Any]) -> list[tuple[int, bool]]:
    return [(r.json["version"], r.json["snapshot"]) for r in records if r.headers.get("kind") == b"commit"]


def test_old_and_foreign_records_on_the_signal_topic_are_not_acted_on() -> None:
    import threading

    taken: list[Signal] = []

    def on_signal(signal: Signal, answer: SignalAnswer) -> bool:
        taken.append(signal)
        answer(None)
        return True

    listener = SignalListener({}, "t", on_signal, stop=threading.Event())
    announced: list[Signal] = []
    listener.announce = announced.append  # type: ignore[method-assign]
    old = Signal(kind="snapshot", table_uri="file:///t", id="a", requested_at=listener.started_ms - 1)
    new = Signal(kind="snapshot", table_uri="file:///t", id="b", requested_at=listener.started_ms + 1)
    for offset, value in enumerate(
        [old.to_json_bytes(), b"not json", b'{"kind":"reboot"}', new.to_json_bytes()]
    ):
        listener._take(value, offset)
    assert [s.id for s in taken] == ["b"]
    assert [(s.kind, s.id, s.table_uri) for s in announced] == [("done", "b", "file:///t")]
    assert json.loads(new.to_json_bytes())["tableUri"] == "file:///t"
    assert time.time() * 1000 >= listener.started_ms


def _listener(running: set[str], now: list[float]) -> tuple[SignalListener, list[Signal], list[Signal]]:
    import threading

    taken: list[Signal] = []
    announced: list[Signal] = []

    def on_signal(signal: Signal, answer: SignalAnswer) -> bool:
        if signal.table_uri not in running:
            return False
        taken.append(signal)
        answer(None)
        return True

    listener = SignalListener(
        {}, "t", on_signal, stop=threading.Event(), pending_ttl_s=60, clock=lambda: now[0]
    )
    listener.announce = announced.append  # type: ignore[method-assign]
    return listener, taken, announced


def _signal(listener: SignalListener, table: str, id: str, kind: Any = "snapshot") -> bytes:
    return Signal(kind=kind, table_uri=table, id=id, requested_at=listener.started_ms + 1).to_json_bytes()


def test_a_signal_for_a_table_not_running_here_waits_for_it_within_the_ttl() -> None:
    running: set[str] = set()
    now = [0.0]
    listener, taken, announced = _listener(running, now)
    for i, table in enumerate(["file:///a", "file:///b", "file:///c"]):
        listener._take(_signal(listener, table, f"s{i}"), i)
    listener._take(_signal(listener, "file:///a", "s3"), 3)  # a newer one for a: one snapshot still
    assert taken == [] and sorted(listener.pending) == ["file:///a", "file:///b", "file:///c"]
    listener.offer_pending()
    assert taken == []
    running.add("file:///a")  # the table starts here (its shard moved here, discovery found it)
    listener.offer_pending()
    assert [s.id for s in taken] == ["s3"] and [s.id for s in announced] == ["s3"]
    listener.offer_pending()
    assert len(taken) == 1  # at most once
    # another instance acted on b's signal: its done record makes this one drop it
    listener._take(_signal(listener, "file:///b", "other-id", kind="done"), 4)
    assert "file:///b" in listener.pending  # not the signal kept here
    listener._take(_signal(listener, "file:///b", "s1", kind="done"), 5)
    assert "file:///b" not in listener.pending
    now[0] = 61.0  # c's TTL passes before c starts here
    listener.offer_pending()
    running.update({"file:///b", "file:///c"})
    listener.offer_pending()
    assert [s.id for s in taken] == ["s3"] and listener.pending == {}


def test_every_member_keeps_a_signal_and_only_the_one_that_starts_the_table_acts(
    kafka_bootstrap: str, kit: Any
) -> None:
    """Two listeners on one broker as two members of a group: neither runs the table when the
    signal comes; the one the table moves to acts, and its done record stops the other from acting
    when the table later moves there."""
    import threading

    from deltamirror.producer.discovery.signals import send_signal

    topic, table = kit.unique("signals"), "file:///moving-table"
    stop = threading.Event()
    running: list[set[str]] = [set(), set()]
    taken: list[list[str]] = [[], []]

    def member(i: int) -> SignalListener:
        def on_signal(signal: Signal, answer: SignalAnswer) -> bool:
            if signal.table_uri in running[i]:
                taken[i].append(signal.id)
                answer(None)
                return True
            return False

        return SignalListener({"bootstrap.servers": kafka_bootstrap}, topic, on_signal, stop=stop)

    members = [member(0), member(1)]
    try:
        for m in members:
            m.start()
        assert all(m.listening.wait(30) for m in members)
        sent = send_signal({"bootstrap.servers": kafka_bootstrap}, topic, table, "snapshot")
        _wait(lambda: all(table in m.pending for m in members), "both members keep the signal")
        running[1].add(table)  # the table starts on member 1
        _wait(lambda: taken[1] == [sent.id] and table not in members[0].pending, "member 1 acts, 0 drops")
        running[0].add(table)  # later it moves to member 0: nothing kept there, no second snapshot
        assert members[0].pending == {} and taken == [[], [sent.id]]
    finally:
        stop.set()
        for m in members:
            assert m._thread is not None
            m._thread.join(30)
            m.close()


def _wait(condition: Any, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out: {what}"
        time.sleep(0.05)


def _dead_address() -> str:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


def test_send_signal_is_bounded_by_its_timeout_with_the_broker_gone() -> None:
    """The library's face has the command's bound (``signal snapshot --timeout``)."""
    from deltamirror.mirror.errors import KafkaError
    from deltamirror.producer.discovery.signals import send_signal

    start = time.monotonic()
    with pytest.raises(KafkaError, match=r"cannot create topic deltamirror\.signals: .*within [0-9.]+ s"):
        send_signal(
            {"bootstrap.servers": _dead_address()},
            "deltamirror.signals",
            "file:///t",
            "snapshot",
            timeout_s=2.0,
        )
    assert time.monotonic() - start < 2.0 + 2.0


def test_send_signals_timeout_is_the_commands_and_must_be_positive() -> None:
    from deltamirror.cli.signal_cmd import DEFAULT_TIMEOUT_S
    from deltamirror.core.errors import InvalidArgumentError
    from deltamirror.producer.discovery.signals import SEND_TIMEOUT_S, send_signal

    assert SEND_TIMEOUT_S == DEFAULT_TIMEOUT_S
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(InvalidArgumentError, match="timeout_s"):
            send_signal({"bootstrap.servers": "127.0.0.1:1"}, "s", "file:///t", "snapshot", timeout_s=bad)


# --- the topic is operators' input, and anyone who can write to it: bounded -------------------------


def test_signals_with_huge_table_uris_are_neither_kept_nor_logged_whole(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """400 signals with a 900 KB tableUri once took 500 MB and logged each URI twice; a signal is a
    few hundred bytes: a larger record is skipped with one short line, never kept."""
    now = [0.0]
    listener, taken, _ = _listener(set(), now)
    huge = "file:///" + "x" * 900_000
    caplog.set_level(logging.INFO, logger="deltamirror.signals")
    for i in range(40):
        raw = {
            "kind": "snapshot",
            "tableUri": huge + str(i),
            "id": f"s{i}",
            "requestedAt": listener.started_ms + 1,
        }
        listener._take(json.dumps(raw).encode(), i)
    assert taken == [] and listener.pending == {}
    logged = sum(len(r.getMessage()) for r in caplog.records)
    assert logged < 40 * 1000, logged
    assert all(len(str(getattr(r, "table", ""))) <= 300 for r in caplog.records)


def test_kept_signals_are_bounded_in_count_and_their_logs_cut_short(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    listener, _, _ = _listener(set(), now)
    caplog.set_level(logging.INFO, logger="deltamirror.signals")
    long_uri = "file:///" + "y" * 5000
    for i in range(MAX_PENDING + 50):
        listener._take(_signal(listener, f"{long_uri}/{i}", f"s{i}"), i)
    assert len(listener.pending) == MAX_PENDING
    assert MAX_PENDING <= 1000
    assert max(len(r.getMessage()) for r in caplog.records) < 1000


def test_signals_for_a_running_table_snapshot_it_at_most_once_per_interval() -> None:
    """Every signal used to trigger a full snapshot: now one per table per interval, the signals
    in between coalesced into one acted on once the interval has passed."""
    now = [1000.0]
    listener, taken, _ = _listener({"file:///a", "file:///b"}, now)
    for i in range(5):
        listener._take(_signal(listener, "file:///a", f"a{i}"), i)
    assert [s.id for s in taken] == ["a0"] and "file:///a" in listener.pending
    listener._take(_signal(listener, "file:///b", "b0"), 9)  # another table: its own interval
    assert [s.id for s in taken] == ["a0", "b0"]
    now[0] += SNAPSHOT_INTERVAL_S - 1
    listener.offer_pending()
    assert len(taken) == 2
    now[0] += 2
    listener.offer_pending()
    assert [s.id for s in taken] == ["a0", "b0", "a4"] and listener.pending == {}


def test_signals_for_many_running_tables_are_bounded_over_the_instance() -> None:
    now = [1000.0]
    tables = {f"file:///t{i}" for i in range(3 * MAX_SNAPSHOTS_PER_INTERVAL)}
    listener, taken, _ = _listener(tables, now)
    for i, table in enumerate(sorted(tables)):
        listener._take(_signal(listener, table, f"s{i}"), i)
    assert len(taken) == MAX_SNAPSHOTS_PER_INTERVAL
    now[0] += SNAPSHOT_INTERVAL_S + 1
    listener.offer_pending()
    assert len(taken) == 2 * MAX_SNAPSHOTS_PER_INTERVAL


def test_a_signal_topic_created_here_refuses_records_larger_than_a_signal(
    kafka_bootstrap: str, kit: Any
) -> None:
    from confluent_kafka import Producer

    from deltamirror.mirror.topics import TopicManager
    from deltamirror.producer.discovery.signals import SIGNAL_MAX_BYTES, SIGNAL_TOPIC_MAX_BYTES

    topic = kit.unique("signals")
    TopicManager(
        {"bootstrap.servers": kafka_bootstrap}, max_record_bytes=SIGNAL_MAX_BYTES
    ).ensure_signal_topic(topic, SIGNAL_TOPIC_MAX_BYTES)
    errors: list[Any] = []
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "message.max.bytes": 2_000_000})
    # one batch each: the broker's limit is on a batch, and both in one batch would both be refused
    producer.produce(topic, b"x" * 900_000, on_delivery=lambda err, msg: errors.append(err))
    assert producer.flush(30) == 0
    producer.produce(topic, b"y" * 1000, on_delivery=lambda err, msg: errors.append(err))
    assert producer.flush(30) == 0
    assert errors[0] is not None and errors[0].name() == "MSG_SIZE_TOO_LARGE", errors
    assert errors[1] is None  # a signal-sized record is taken
