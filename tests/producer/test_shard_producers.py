"""In a group, the tables of a shard share one transactional producer (the shard carries the fence).

Real broker, in-process services. What a process costs in Kafka clients is counted twice: by the
service's registry of shard producers, and by librdkafka itself (every client has one ``rdk:main``
thread, named with pthread_setname_np and visible in ``/proc/self/task/*/comm``).
"""

from __future__ import annotations

import contextlib
import gc
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

pytestmark = [
    pytest.mark.kafka,
    pytest.mark.skipif(sys.platform != "linux", reason="thread names are read from /proc"),
]


def librdkafka_clients() -> int:
    """Live librdkafka clients of this process: their ``rdk:main`` threads."""
    gc.collect()  # a client an earlier test dropped in a reference cycle is freed only by the collector
    count = 0
    for comm in Path("/proc/self/task").glob("*/comm"):
        with contextlib.suppress(OSError):  # the thread ended meanwhile
            count += comm.read_text().strip() == "rdk:main"
    return count


def uri_of(table: Path) -> str:
    from deltamirror.core.storage import normalize_table_uri

    return normalize_table_uri(str(table))


def group_config(kafka_bootstrap: str, tables: list[Path], run: str, shards: int) -> Any:
    from deltamirror.producer.settings import WatchConfig

    return WatchConfig.model_validate(
        {
            "kafka": {"bootstrap_servers": kafka_bootstrap},
            "tables": [
                {"uri": str(t), "snapshot_mode": "from-version", "from_version": 0, "poll_interval_s": 0.2}
                for t in tables
            ],
            "progress_topic": f"deltamirror.{run}.progress",
            "transactional_id_prefix": run,
            "use_notifications": False,
            "group": {"name": run, "shards": shards, "session_timeout_ms": 6000},
        }
    )


def commits_of(
    kafka_bootstrap: str, kit: Any, tables: list[Path], until_version: int
) -> Counter[tuple[str, int]]:
    """(table uri, version) -> how many commit summaries a read_committed reader sees."""
    topics = [f"deltamirror.{t.name}.commits" for t in tables]
    uris = {uri_of(t) for t in tables}

    def versions(records: list[Any]) -> Counter[tuple[str, int]]:
        seen: Counter[tuple[str, int]] = Counter()
        for record in records:
            value = record.json
            if isinstance(value, dict) and value.get("kind") == "commit":
                seen[(value["tableUri"], value["version"])] += 1
        return seen

    def complete(records: list[Any]) -> bool:
        seen = versions(records)
        return all((u, v) in seen for u in uris for v in range(until_version + 1))

    kit.consume(kafka_bootstrap, topics, until=complete, timeout_s=60)
    return versions(kit.consume(kafka_bootstrap, topics, idle_s=1.0, timeout_s=30))


def stop(service: Any) -> None:
    service.request_stop()
    assert service.wait(30)
    service.close()


@pytest.mark.timeout(120)
def test_tables_of_a_shard_share_one_producer_and_a_bad_table_does_not_stop_the_others(
    kafka_bootstrap: str, tmp_path: Path, kit: Any
) -> None:
    from deltamirror.mirror.group import shard_of
    from deltamirror.producer.service import WatchService

    run = f"sp{uuid.uuid4().hex[:6]}"
    tables = [kit.make_table(tmp_path / f"{run}_{i}", versions=1) for i in range(6)]
    shards = 2
    owned = {shard_of(uri_of(t), shards) for t in tables}
    baseline = librdkafka_clients()
    service = WatchService(group_config(kafka_bootstrap, tables, run, shards))
    try:
        service.start()
        assert commits_of(kafka_bootstrap, kit, tables, 0) == Counter({(uri_of(t), 0): 1 for t in tables})
        assert service.running_tables() == {uri_of(t) for t in tables}
        shard_producers = service.clients.shards
        assert shard_producers is not None
        assert shard_producers.live() == len(owned)  # one per shard with tables, not one per table
        assert shard_producers.created == len(owned)
        # librdkafka's own count: the shard producers, the admin client, the group's consumer and
        # the signal reader (the progress reads' consumers are closed after each read)
        deadline = time.monotonic() + 10
        while (clients := librdkafka_clients() - baseline) != len(owned) + 3 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert clients == len(owned) + 3

        # bad input in one table: it fails alone; the other tables of its shard go on publishing
        bad, good = tables[0], tables[1:]
        (bad / "_delta_log" / f"{1:020d}.json").write_text("this is not a commit\n")
        deadline = time.monotonic() + 60  # the bad table has read it and failed (it retries with backoff)
        while service.metrics.health()[0]:  # type: ignore[attr-defined]
            assert time.monotonic() < deadline, "the bad table did not fail"
            time.sleep(0.05)
        for table in good:
            kit.write_versions(table, 1, 1, 2)
        seen = commits_of(kafka_bootstrap, kit, good, 1)
        assert seen == Counter({(uri_of(t), v): 1 for t in good for v in (0, 1)})
        assert uri_of(bad) in service.running_tables()  # still there, retrying
        healthy, details = service.metrics.health()  # type: ignore[attr-defined]
        failing = [label for label, state in details["tables"].items() if state["status"] == "error"]
        assert not healthy and len(failing) == 1, details
        assert shard_producers.live() == len(owned)  # the failing table did not close its shard's producer
        assert shard_producers.created == len(owned)
    finally:
        stop(service)
    assert service.clients.shards is not None and service.clients.shards.live() == 0


@pytest.mark.timeout(120)
def test_a_new_owner_of_a_shard_fences_every_table_of_it_and_each_version_stays_once(
    kafka_bootstrap: str, tmp_path: Path, kit: Any
) -> None:
    """Another owner's init on the shard's id fences all its tables at once here. The shard is still
    assigned here, so they start again (a new producer generation, which fences the other one),
    and every version reaches a read_committed reader exactly once."""
    from deltamirror.mirror.kafka.producer import TransactionalPublisher
    from deltamirror.producer.service import WatchService

    run = f"sf{uuid.uuid4().hex[:6]}"
    tables = [kit.make_table(tmp_path / f"{run}_{i}", versions=1) for i in range(3)]
    cfg = group_config(kafka_bootstrap, tables, run, 1)
    service = WatchService(cfg)
    try:
        service.start()
        commits_of(kafka_bootstrap, kit, tables, 0)
        shard_producers = service.clients.shards
        assert shard_producers is not None and shard_producers.live() == 1
        txn_ids = {p.txn_id for p in service.pipelines}
        assert txn_ids == {shard_producers.transactional_id(0)}
        zombie = TransactionalPublisher(cfg.kafka.librdkafka_config(), txn_ids.pop())
        zombie.init()  # what another member taking the shard does first
        zombie.close(5.0)
        for table in tables:  # the next transactions here are fenced: every table is released...
            kit.write_versions(table, 1, 2, 2)
        seen = commits_of(kafka_bootstrap, kit, tables, 2)  # ...and, the shard being here, runs again
        assert seen == Counter({(uri_of(t), v): 1 for t in tables for v in (0, 1, 2)})
        assert service.running_tables() == {uri_of(t) for t in tables}
        assert shard_producers.created == 2  # a second generation, shared again by the three tables
        assert shard_producers.live() == 1
        assert service._failure is None
    finally:
        stop(service)


@pytest.mark.timeout(60)
def test_a_replaced_producer_is_a_reconnect_for_the_other_tables_of_the_shard_not_a_fence(
    kafka_bootstrap: str,
) -> None:
    """A shard producer that broke (a fatal error other than a fence) is replaced by a new generation
    whose init fences the old one: the other tables of the shard must reconnect, not be released."""
    import threading

    from deltamirror.mirror.errors import KafkaError, ProducerFencedError
    from deltamirror.mirror.kafka.producer import TransactionalPublisher
    from deltamirror.mirror.topics import TopicManager
    from deltamirror.producer.group.shard_producers import ShardProducers

    run = f"sr{uuid.uuid4().hex[:6]}"
    topic = f"deltamirror.{run}.actions"
    kafka = {"bootstrap.servers": kafka_bootstrap}
    TopicManager(kafka, max_record_bytes=1_000_000).ensure_event_topic(topic)
    registry = ShardProducers(lambda txn_id: TransactionalPublisher(kafka, txn_id), prefix=run, group=run)
    stop_a, stop_b = threading.Event(), threading.Event()
    a = registry.lease(3, stop=stop_a, time_left=lambda: float("inf"))
    b = registry.lease(3, stop=stop_b, time_left=lambda: float("inf"))
    try:
        a.init()
        b.init()  # the same producer, initialised once
        assert registry.created == 1 and registry.live() == 1
        a.begin()
        a.produce(topic, b"a", b"k")
        assert a.in_transaction and not b.in_transaction  # b's counters and state are its own
        a.commit(30)
        a._gen.broken = True  # what a fatal error other than a fence leaves (poked: no broker makes one)
        with pytest.raises(KafkaError) as raised:
            b.begin()
        assert not isinstance(raised.value, ProducerFencedError)
        b.close()
        b = registry.lease(3, stop=stop_b, time_left=lambda: float("inf"))  # b reconnects
        b.init()  # the new generation fences the old one
        assert registry.created == 2
        b.begin()
        b.produce(topic, b"b", b"k")
        b.commit(30)
        with pytest.raises(KafkaError) as raised:  # a, on the stale generation, is told to reconnect
            a.begin()
        assert not isinstance(raised.value, ProducerFencedError)
        assert not b.fenced
    finally:
        a.close(1.0)
        b.close(1.0)
    assert registry.live() == 0


def test_a_fenced_producer_is_renewed_only_by_the_assignment_never_by_a_reconnect(
    kafka_bootstrap: str,
) -> None:
    """Two members' registries for one shard. Once the other owner fenced this member, a table of
    the shard reconnecting must be refused as fenced, not make a new producer whose init would fence
    the owner back (the members would trade the shard); only ``renew`` (the shard assigned here
    again) makes one."""
    import threading

    from deltamirror.mirror.errors import ProducerFencedError
    from deltamirror.mirror.kafka.producer import TransactionalPublisher
    from deltamirror.mirror.topics import TopicManager
    from deltamirror.producer.group.shard_producers import ShardProducers

    run = f"sf{uuid.uuid4().hex[:6]}"
    topic = f"deltamirror.{run}.actions"
    kafka = {"bootstrap.servers": kafka_bootstrap}
    TopicManager(kafka, max_record_bytes=1_000_000).ensure_event_topic(topic)
    here = ShardProducers(lambda txn_id: TransactionalPublisher(kafka, txn_id), prefix=run, group=run)
    owner = ShardProducers(lambda txn_id: TransactionalPublisher(kafka, txn_id), prefix=run, group=run)
    stop = threading.Event()
    forever = lambda: float("inf")  # noqa: E731
    mine = here.lease(5, stop=stop, time_left=forever)
    other = here.lease(5, stop=stop, time_left=forever)
    theirs = owner.lease(5, stop=stop, time_left=forever)
    try:
        mine.init()
        other.init()
        theirs.init()  # the shard moved: the owner's init fences this member's producer
        mine.begin()
        mine.produce(topic, b"zombie", b"k")
        with pytest.raises(ProducerFencedError):
            mine.commit(30)
        other.close()
        with pytest.raises(ProducerFencedError):  # a reconnect of another table: still fenced
            here.lease(5, stop=stop, time_left=forever)
        assert here.created == 1
        theirs.begin()  # the owner was not fenced back
        theirs.produce(topic, b"owner", b"k")
        theirs.commit(30)
        here.renew([5])  # the assignment gives the shard back to this member
        again = here.lease(5, stop=stop, time_left=forever)
        again.init()
        assert here.created == 2
        with pytest.raises(ProducerFencedError):  # now the other member is the zombie
            theirs.begin()
            theirs.produce(topic, b"late", b"k")
            theirs.commit(30)
        again.close(1.0)
    finally:
        mine.close(1.0)
        theirs.close(1.0)


def test_a_transaction_open_on_a_generation_another_table_replaced_ends_in_a_kafka_error(
    kafka_bootstrap: str,
) -> None:
    """The shard is renewed while table a's transaction is open; table b's next lease makes the new
    generation and closes the stale one at once. a's commit on it must say "reconnect" (a
    KafkaError the pipeline handles), never the closed client's RuntimeError."""
    import threading

    from deltamirror.mirror.errors import KafkaError
    from deltamirror.mirror.kafka.producer import TransactionalPublisher
    from deltamirror.mirror.topics import TopicManager
    from deltamirror.producer.group.shard_producers import ShardProducers

    run = f"sx{uuid.uuid4().hex[:6]}"
    topic = f"deltamirror.{run}.actions"
    kafka = {"bootstrap.servers": kafka_bootstrap}
    TopicManager(kafka, max_record_bytes=1_000_000).ensure_event_topic(topic)
    registry = ShardProducers(lambda txn_id: TransactionalPublisher(kafka, txn_id), prefix=run, group=run)
    a = registry.lease(1, stop=threading.Event(), time_left=lambda: float("inf"))
    b = None
    try:
        a.init()
        a.begin()
        a.produce(topic, b"a", b"k")
        registry.renew([1])  # the shard assigned here again: the next open makes a new generation
        b = registry.lease(1, stop=threading.Event(), time_left=lambda: float("inf"))
        with pytest.raises(KafkaError):
            a.commit(30)
        assert not a.in_transaction
        with pytest.raises(KafkaError):  # and its next transaction is told to reconnect too
            a.begin()
    finally:
        a.close(1.0)
        if b is not None:
            b.close(1.0)
    assert registry.live() == 0
