"""The campaign's checker finds what it is there to find: a record lost, one duplicated, one out of
order, bytes changed, a commit summary missing (a checker that cannot fail would prove nothing)."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

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
