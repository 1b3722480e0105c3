"""Records forged on a real mirror's topics: each refused at the consumers' boundary, after every
version before it was delivered, with one line naming topic, partition and offset (exit 2).

One table is mirrored once by the real watcher; each test copies its records to fresh topics and
appends what anyone with write access to a topic could write, with a plain producer. The whole
campaign of record classes is tests/forge (``make forge``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from deltamirror.mirror.records.boundary import BadRecordError
from mutation.exec import Result, run_command
from support.forge import (
    Base,
    Rec,
    Topics,
    action_rec,
    add_action,
    commits_rec,
    consume_snapshot_argv,
    event,
    fragments,
    mirror_base,
    padded,
    state_paths,
    state_uris,
    summary,
    write_case,
)

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(180)]

TABLE_ID = "krs__cdf-table-with-dv"


@pytest.fixture(scope="module")
def base(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Base:
    return mirror_base(kafka_bootstrap, TABLE_ID, tmp_path_factory.mktemp("forged"))


def _consume(bootstrap: str, topics: Topics, state: Path, cwd: Path, *extra: str) -> Result:
    argv = consume_snapshot_argv(bootstrap, topics, state, *extra)
    return run_command("consume-snapshot", argv, "", {}, None, cwd, 90.0)


def _versions(result: Result) -> list[int]:
    return [json.loads(line)["version"] for line in result.stdout.decode().splitlines() if line.strip()]


def _refused_at(result: Result, topic: str | Topics, offset: int) -> str:
    """The one line of a refusal (exit 2) naming topic (either of ``Topics``), partition and offset."""
    assert result.exit == 2, (result.exit, result.error, result.stderr[-2000:])
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert len(lines[0]) < 2000
    topics = [topic.actions, topic.commits] if isinstance(topic, Topics) else [topic]
    assert any(f"topic={t}," in lines[0] for t in topics), lines
    assert "partition=0" in lines[0] and f"offset={offset})" in lines[0], lines
    return lines[0]


@pytest.mark.parametrize("path", ["/etc/passwd", "../../../../etc/passwd", "file:///etc/passwd"])
def test_a_forged_version_adding_a_file_outside_the_table_is_refused_and_never_saved(
    kafka_bootstrap: str, base: Base, tmp_path: Path, path: str
) -> None:
    forged = action_rec(event(base, action=add_action(path)))
    topics = write_case(kafka_bootstrap, base, actions=[forged])
    state = tmp_path / "state"
    result = _consume(kafka_bootstrap, topics, state, tmp_path)
    line = _refused_at(result, topics.actions, len(base.actions))
    assert "outside the table root" in line
    assert _versions(result) == base.versions  # every good version delivered first
    assert state_paths(state) and not any("passwd" in p for p in state_paths(state))


def test_a_forged_table_location_for_a_known_table_is_refused(
    kafka_bootstrap: str, base: Base, tmp_path: Path
) -> None:
    forged = action_rec(event(base, tableUri="file:///etc", action=add_action("passwd")))
    topics = write_case(kafka_bootstrap, base, actions=[forged])
    state = tmp_path / "state"
    result = _consume(kafka_bootstrap, topics, state, tmp_path)
    line = _refused_at(result, topics.actions, len(base.actions))
    assert "file:///etc" in line and base.uri in line
    assert _versions(result) == base.versions
    assert state_uris(state) == [base.uri]


def test_a_table_location_outside_the_allowed_ones_is_refused(
    kafka_bootstrap: str, base: Base, tmp_path: Path
) -> None:
    topics = write_case(kafka_bootstrap, base)
    elsewhere = str(tmp_path / "elsewhere")
    result = _consume(kafka_bootstrap, topics, tmp_path / "s1", tmp_path, "--allow-table-location", elsewhere)
    line = _refused_at(result, topics, 0)
    assert "--allow-table-location" in line
    assert _versions(result) == []
    allowed = str(base.table.parent)
    ok = _consume(kafka_bootstrap, topics, tmp_path / "s2", tmp_path, "--allow-table-location", allowed)
    assert ok.exit == 0, ok.stderr
    assert _versions(ok) == base.versions


def test_an_unknown_schema_version_is_refused_by_name(
    kafka_bootstrap: str, base: Base, tmp_path: Path
) -> None:
    forged = action_rec(event(base, schemaVersion=999))
    topics = write_case(kafka_bootstrap, base, actions=[forged])
    result = _consume(kafka_bootstrap, topics, tmp_path / "state", tmp_path)
    line = _refused_at(result, topics.actions, len(base.actions))
    assert "schemaVersion 999" in line
    assert _versions(result) == base.versions


def test_fragments_of_a_record_too_large_to_take_are_refused_at_the_first(
    kafka_bootstrap: str, base: Base, tmp_path: Path
) -> None:
    """``fragment: i/999999`` of 1 MB each: refused at once, not gathered until memory runs out."""
    chunk = b"x" * 1_000_000
    forged = [fragments(chunk, i, 999_999, key=base.table_id.encode()) for i in range(20)]
    topics = write_case(kafka_bootstrap, base, actions=forged, config={"max.message.bytes": "2000000"})
    result = _consume(kafka_bootstrap, topics, tmp_path / "state", tmp_path)
    line = _refused_at(result, topics.actions, len(base.actions))
    assert "fragment" in line
    assert _versions(result) == base.versions


def test_a_record_cut_short_at_the_end_of_the_topic_is_an_error_not_the_end(
    kafka_bootstrap: str, base: Base, tmp_path: Path
) -> None:
    key = base.table_id.encode()  # a record's fragments share its key
    forged = [
        fragments(padded(b'{"schemaVersion":1,'), 0, 3, key=key),
        fragments(padded(b'"x":1'), 1, 3, key=key),
    ]
    topics = write_case(kafka_bootstrap, base, actions=forged)
    result = _consume(kafka_bootstrap, topics, tmp_path / "state", tmp_path)
    line = _refused_at(result, topics.actions, len(base.actions))
    assert "cut short" in line
    assert _versions(result) == base.versions


def test_a_short_record_with_a_fragment_header_is_refused_as_the_whole_record_it_is(
    kafka_bootstrap: str, base: Base, tmp_path: Path
) -> None:
    """A record shorter than any first fragment (MIN_FRAGMENT_BYTES) is read as whole, its headers
    unread: a forged ``fragment`` header on it changes nothing; the value is held to the boundary
    as every whole record is (here not an event: refused at its own offset)."""
    key = base.table_id.encode()
    forged = [fragments(b'{"schemaVersion":1,', 0, 2, key=key)]
    topics = write_case(kafka_bootstrap, base, actions=forged)
    result = _consume(kafka_bootstrap, topics, tmp_path / "state", tmp_path)
    line = _refused_at(result, topics.actions, len(base.actions))
    assert "cut short" not in line and "fragment" not in line, line
    assert _versions(result) == base.versions


def test_a_forged_fragment_of_another_key_between_a_records_fragments_is_refused_at_its_offset(
    kafka_bootstrap: str, base: Base, tmp_path: Path
) -> None:
    """Fragments are joined per key (on a shared topic another table's records may come between a
    record's fragments): another key's fragment with no first one before it is refused on its own,
    at its offset, naming its key."""
    key = base.table_id.encode()
    forged = [
        fragments(padded(b'{"schemaVersion":1,'), 0, 2, key=key),
        fragments(padded(b'"x":1'), 1, 3, key=b"another-table"),
        fragments(b'"x":1}', 1, 2, key=key),
    ]
    topics = write_case(kafka_bootstrap, base, actions=forged)
    result = _consume(kafka_bootstrap, topics, tmp_path / "state", tmp_path)
    line = _refused_at(result, topics.actions, len(base.actions) + 1)
    assert "out of order" in line and "table_id=another-table" in line, line
    assert _versions(result) == base.versions


def test_an_undecodable_record_after_good_versions_keeps_them_and_a_restart_goes_no_further(
    kafka_bootstrap: str, base: Base, tmp_path: Path
) -> None:
    topics = write_case(kafka_bootstrap, base, actions=[Rec(b"\xff\xfe not json", base.table_id.encode())])
    state = tmp_path / "state"
    first = _consume(kafka_bootstrap, topics, state, tmp_path)
    _refused_at(first, topics.actions, len(base.actions))
    assert _versions(first) == base.versions
    offsets = json.loads((state / "offsets.json").read_text())
    saved = offsets.get("offsets", offsets)
    assert json.dumps(saved).count(str(len(base.actions))) >= 1  # the position is the bad record
    again = _consume(kafka_bootstrap, topics, state, tmp_path)
    _refused_at(again, topics.actions, len(base.actions))
    assert _versions(again) == []  # nothing delivered twice, nothing past the bad record
    skipped = _consume(kafka_bootstrap, topics, state, tmp_path, "--on-bad-record", "skip")
    assert skipped.exit == 0, skipped.stderr
    said = [line for line in skipped.logs if "record skipped" in line]
    assert len(said) == 1 and f"offset={len(base.actions)})" in said[0], skipped.logs


def _between_versions(base: Base, bad: Rec) -> list[Rec]:
    """The base's action records with ``bad`` after the first version's last one."""
    first = next(
        i for i, r in enumerate(base.actions) if json.loads(r.value or b"")["version"] > base.versions[0]
    )
    return [*base.actions[:first], bad, *base.actions[first:]]


def test_skip_passes_over_a_forged_record_between_good_versions(
    kafka_bootstrap: str, base: Base, tmp_path: Path
) -> None:
    bad = action_rec(event(base, version=base.versions[0] + 1, action=add_action("/etc/passwd")))
    topics = write_case(kafka_bootstrap, base, base_actions=_between_versions(base, bad))
    stopped = _consume(kafka_bootstrap, topics, tmp_path / "s1", tmp_path)
    _refused_at(
        stopped, topics.actions, next(i for i, r in enumerate(_between_versions(base, bad)) if r is bad)
    )
    assert _versions(stopped) == base.versions[:1]  # the version before it, delivered
    skipped = _consume(kafka_bootstrap, topics, tmp_path / "s2", tmp_path, "--on-bad-record", "skip")
    assert skipped.exit == 0, skipped.stderr
    assert _versions(skipped) == base.versions
    assert len([line for line in skipped.logs if "record skipped" in line]) == 1
    assert not any("passwd" in p for p in state_paths(tmp_path / "s2"))


def test_dead_letter_copies_the_refused_record_with_where_and_why(
    kafka_bootstrap: str, base: Base, tmp_path: Path
) -> None:
    from confluent_kafka import Consumer, TopicPartition

    from support.kafka import new_topic

    bad = action_rec(event(base, schemaVersion=999))
    topics = write_case(kafka_bootstrap, base, actions=[bad])
    letters = new_topic(kafka_bootstrap, f"{topics.actions}.refused")
    argv = ["--on-bad-record", "dead-letter", "--bad-record-topic", letters]
    result = _consume(kafka_bootstrap, topics, tmp_path / "state", tmp_path, *argv)
    assert result.exit == 0, result.stderr
    assert _versions(result) == base.versions
    reader = Consumer(
        {"bootstrap.servers": kafka_bootstrap, "group.id": "dl-check", "enable.partition.eof": True}
    )
    try:
        reader.assign([TopicPartition(letters, 0, 0)])
        msgs = [m for m in reader.consume(10, timeout=10) if m.error() is None]
    finally:
        reader.close()
    assert len(msgs) == 1 and msgs[0].value() == bad.value and msgs[0].key() == bad.key
    headers = dict(msgs[0].headers() or [])
    assert headers["deltamirror.refused.topic"] == topics.actions.encode()
    assert headers["deltamirror.refused.offset"] == str(len(base.actions)).encode()
    assert b"schemaVersion 999" in headers["deltamirror.refused.reason"]


def test_the_consumer_section_of_the_config_file_is_read_and_checked(
    kafka_bootstrap: str, base: Base, tmp_path: Path
) -> None:
    bad = action_rec(event(base, action=add_action("../../x")))
    topics = write_case(kafka_bootstrap, base, actions=[bad])
    config = tmp_path / "consumer.yaml"
    config.write_text(f"kafka:\n  bootstrap_servers: {kafka_bootstrap}\nconsumer:\n  on_bad_record: skip\n")

    def argv(state: str, *extra: str) -> list[str]:
        out = consume_snapshot_argv(kafka_bootstrap, topics, tmp_path / state, *extra)
        at = out.index("--bootstrap-servers")
        out[at : at + 2] = ["--config", str(config)]
        return out

    result = run_command("consume-snapshot", argv("s1"), "", {}, None, tmp_path, 90.0)
    assert result.exit == 0, result.stderr
    assert _versions(result) == base.versions
    # a flag replaces its key; a combination that cannot work is refused at start, naming it
    flags = run_command(
        "consume-snapshot", argv("s2", "--on-bad-record", "stop"), "", {}, None, tmp_path, 90.0
    )
    _refused_at(flags, topics.actions, len(base.actions))
    wrong = run_command(
        "consume-snapshot", argv("s3", "--bad-record-topic", "x"), "", {}, None, tmp_path, 90.0
    )
    assert (
        wrong.exit == 2
        and "--bad-record-topic" in wrong.stderr
        and len(wrong.stderr.strip().splitlines()) == 1
    )
    config.write_text("kafka:\n  bootstrap_servers: b:1\nconsumer:\n  on_bad_recrod: skip\n")
    typo = run_command("consume-snapshot", argv("s4"), "", {}, None, tmp_path, 90.0)
    assert typo.exit == 2 and "on_bad_recrod" in typo.stderr and "did you mean" in typo.stderr


def test_invalidate_delivers_and_acknowledges_every_version_before_a_refused_record(
    kafka_bootstrap: str, base: Base, tmp_path: Path
) -> None:
    from confluent_kafka import Consumer, TopicPartition

    from support.forge_runner import _receiver

    topics = write_case(kafka_bootstrap, base, actions=[Rec(b"garbage", base.table_id.encode())])
    group = "forged-invalidate"
    with _receiver() as receiver:
        argv = [
            "invalidate",
            "--bootstrap-servers",
            kafka_bootstrap,
            "--topic",
            topics.actions,
            "--once",
            "--group-id",
            group,
            "--webhook",
            receiver.url,
        ]
        result = run_command("invalidate", argv, "", {}, None, tmp_path, 90.0)
        docs = list(receiver.docs)
    _refused_at(result, topics.actions, len(base.actions))
    assert [d["version"] for d in docs] == base.versions
    reader = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": group})
    try:
        (committed,) = reader.committed([TopicPartition(topics.actions, 0)], timeout=30)
    finally:
        reader.close()
    assert committed.offset == len(base.actions)  # acknowledged up to the refused record


def test_a_version_gap_read_from_the_announced_version_on_is_refused_at_its_record(
    kafka_bootstrap: str, base: Base, tmp_path: Path
) -> None:
    """The Spark source reads a range from its first version on: the actions topic goes on from the
    last real version straight to a later one the commits topic never announced. Before, the reader
    took the record for an overshoot of its seek, read the partition again from its start and
    failed without naming the record."""
    from deltamirror.consumer.mirror_changes import MirrorIndex, MirrorSettings, read_mirror_versions

    gap = base.last_version + 7
    forged = action_rec(event(base, version=gap))
    topics = write_case(kafka_bootstrap, base, actions=[forged], commits=[commits_rec(summary(base))])
    settings = MirrorSettings(
        kafka_bootstrap, topics.actions, topics.commits, str(base.table), idle_timeout_s=30
    )
    index = MirrorIndex(settings)
    index.refresh()
    assert index.table_id is not None and index.latest == base.last_version + 1
    start = base.last_version + 1
    with pytest.raises(BadRecordError) as refused:
        list(
            read_mirror_versions(
                settings,
                table_id=index.table_id,
                partition=index.actions_partition(),
                start=start,
                end=start,
                start_timestamp_ms=index.timestamp(start),
            )
        )
    said = str(refused.value)
    assert f"version {gap} follows version {base.last_version}" in said
    assert f"topic={topics.actions}," in said and f"offset={len(base.actions)})" in said
