"""The campaign's checker finds what it is there to find: a record lost, one duplicated, one out of
order, bytes changed, a commit summary missing, a net catch-up block published twice or not at all
(a checker that cannot fail would prove nothing)."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from chaos.checker import TableTopics, check_table
from chaos.writer import Writer

from support.kafka import new_topic

pytestmark = pytest.mark.kafka


def _publish(
    bootstrap: str, topic: str, values: list[bytes], headers: list[tuple[str, bytes]] | None = None
) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap})
    for value in values:
        producer.produce(topic, value, headers=headers or [])
    assert producer.flush(30) == 0


def _summaries(lines: list[bytes]) -> list[bytes]:
    import json

    by_version: dict[int, list[dict[str, int]]] = {}
    for line in lines:
        env = json.loads(line)
        by_version.setdefault(env["version"], []).append(env)
    return [
        json.dumps(
            {
                "kind": "commit",
                "version": v,
                "actionCount": len(envs),
                "commitTimestamp": envs[0]["commitTimestamp"],
            }
        ).encode()
        for v, envs in sorted(by_version.items())
    ]


@pytest.mark.timeout(180)
def test_the_checker_counts_lost_duplicated_out_of_order_and_changed_records(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    from chaos.checker import _cli_lines

    table = tmp_path / "t"
    writer = Writer([table], seed=3)
    writer.create()
    writer.step(operation="append")
    writer.step(operation="update")
    lines = _cli_lines("events", str(table))
    assert len(lines) >= 6

    def topics(lines_on_topic: list[bytes], summaries: list[bytes]) -> TableTopics:
        name = f"chk-{uuid.uuid4().hex[:8]}"
        t = TableTopics(
            table,
            new_topic(kafka_bootstrap, f"{name}.actions"),
            new_topic(kafka_bootstrap, f"{name}.commits"),
        )
        _publish(kafka_bootstrap, t.actions, lines_on_topic)
        _publish(kafka_bootstrap, t.commits, summaries, [("kind", b"commit")])
        return t

    clean = check_table(kafka_bootstrap, topics(lines, _summaries(lines)), 2)
    assert clean.clean and clean.versions == 3 and clean.records == len(lines) + 3, clean

    changed = lines[3].replace(b'"schemaVersion":1', b'"schemaVersion":1 ')
    faulty = [lines[0], lines[2], lines[1], lines[2], changed, *lines[5:]]  # 4 lost, 2 again, 1 before 2
    summaries = _summaries(lines)
    tally = check_table(kafka_bootstrap, topics(faulty, [summaries[0], summaries[2], summaries[2]]), 2)
    assert tally.lost == 1 + 1  # the envelope at index 4 of the list, and version 1's summary
    assert tally.duplicated == 1 + 1  # lines[2] twice, version 2's summary twice
    assert tally.out_of_order == 1  # lines[1] after lines[2]
    assert tally.mismatched == 1  # lines[3]'s bytes changed
    assert not tally.clean


def _copy(bootstrap: str, topic: str, keep: Callable[[dict[str, Any]], bool]) -> int:
    """Publish again the committed records of ``topic`` that ``keep`` takes; how many."""
    import json

    from chaos.checker import read_topic
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap})
    records = [m for m in read_topic(bootstrap, topic) if keep(json.loads(m.value))]
    for m in records:
        producer.produce(topic, m.value, m.key, partition=m.partition, headers=list(m.headers.items()))
    assert producer.flush(30) == 0
    return len(records)


@pytest.mark.timeout(240)
def test_the_checker_takes_one_net_catch_up_block_and_fails_a_second_one_or_none(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    from chaos.scene import latest_version

    from support.watching import watch_until

    table = tmp_path / "t"
    writer = Writer([table], seed=5)
    writer.create()
    for operation in ("append", "update", "delete", "large-append", "update"):
        writer.step(operation=operation)
    at_start = latest_version(table)

    def topics(net_from: int | None) -> TableTopics:
        name = f"chk-{uuid.uuid4().hex[:8]}"
        return TableTopics(
            table,
            f"{name}.actions",
            f"{name}.commits",
            new_topic(kafka_bootstrap, f"{name}.changes", 3),
            f"{name}.transaction",
            net_from=net_from,
        )

    def watch(t: TableTopics, until: int, net: bool) -> None:
        watch_until(
            kafka_bootstrap,
            table,
            t.actions,
            until,
            t.actions.split(".")[0],
            snapshot_mode="from-version",
            from_version=0,
            changes_topic=t.changes,
            transaction_topic=t.transaction,
            row_changes={"key_columns": ["id"], "net_catch_up": net},
        )

    t = topics(at_start)
    watch(t, at_start, net=True)
    writer.step(operation="update")
    writer.step(operation="append")
    last = latest_version(table)
    watch(t, last, net=True)
    clean = check_table(kafka_bootstrap, t, last)
    assert clean.clean and clean.versions == last + 1, clean

    # pretend the block was published twice: its events and its BEGIN/END once more
    assert t.changes is not None and t.transaction is not None
    block = _copy(kafka_bootstrap, t.changes, lambda v: int(v["source"]["delta_version"]) == at_start)
    marks = _copy(kafka_bootstrap, t.transaction, lambda v: v["id"].endswith(f":{at_start}"))
    assert block > 0 and marks == 2
    twice = check_table(kafka_bootstrap, t, last)
    assert twice.duplicated == block + 2 and twice.lost == 0 and not twice.clean, twice

    # a watcher that published every version's rows on its own: no net block
    per_version = topics(at_start)
    watch(per_version, last, net=False)
    none = check_table(kafka_bootstrap, per_version, last)
    assert none.mismatched >= 1 and not none.clean, none
    assert any("net block" in p for p in none.problems), none.problems
