"""After a run: every topic of every table, read_committed, against what the CLI says the table holds.

- actions topic against ``deltamirror events TABLE --starting-version 0 --ending-version V``: each
  envelope is identified by (version, index); one missing is *lost*, one seen again *duplicated*,
  one whose identity is below the one before it *out of order*, one whose bytes differ from the
  CLI's line a *mismatch* (the whole value is compared: no field may differ);
- commits topic: one summary per version, 0..V in order, whose ``actionCount`` and
  ``commitTimestamp`` are those of the version's envelopes;
- changes topic (row changes on) against ``deltamirror changes TABLE --format jsonl`` turned into
  Debezium events by the documented pairing rule (``support.row_change_expectations``): per
  (op, before, after, version), the count on the topic against the count expected; in each
  partition, (version, index) increasing;
- transaction topic: per version with row changes one ``BEGIN`` then one ``END`` whose
  ``event_count`` is the version's row count, versions in order.

A table watched with a net catch-up (``net_from``) has one block more to account for: its first
committed ``BEGIN`` names the catch-up's last version Vc (the table's version when the run whose
catch-up committed started, at least ``net_from``). The changes expected up to Vc are then ``deltamirror changes --net
--key id`` over 0..Vc, all at version Vc (one ``BEGIN``/``END`` block), and per version after it,
as above; a second block (a catch-up committed twice) is counted duplicated, a block missing lost.

A table sent ``net-changes`` signals (``signal_blocks``: every range a watcher's log said it began
publishing on a signal) may hold signal blocks on top of its per-version rows: events marked
``source.snapshot`` (``true``, ``last``), all at the block's last version B. Each block on the topic
must equal ``deltamirror changes --net --key id`` over a logged range ending at B, whole (a block
cut short by a kill is a mismatch; one committed twice is duplicated), its events in order within
each partition, and its own ``BEGIN``/``END`` after those of version B, the ``END`` counting the
block. A block a kill aborted is not on the topic at all.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaos.broker import CLI
from harness import committed_reader

from support.row_change_expectations import expected_events

KEY_COLUMNS = ("id",)


@dataclass(frozen=True)
class TableTopics:
    path: Path
    actions: str
    commits: str
    changes: str | None = None
    transaction: str | None = None
    #: with a net catch-up: the table's version when its first watcher started (the net block's
    #: version is at least that); None: no net catch-up
    net_from: int | None = None
    #: (first, last) of every net block a watcher began publishing on a signal (killed or not)
    signal_blocks: tuple[tuple[int, int], ...] = ()


@dataclass
class Tally:
    versions: int = 0
    records: int = 0
    lost: int = 0
    duplicated: int = 0
    out_of_order: int = 0
    mismatched: int = 0
    problems: list[str] = field(default_factory=list)

    def add(self, other: Tally) -> None:
        self.versions += other.versions
        self.records += other.records
        self.lost += other.lost
        self.duplicated += other.duplicated
        self.out_of_order += other.out_of_order
        self.mismatched += other.mismatched
        self.problems.extend(other.problems)

    @property
    def clean(self) -> bool:
        return not (self.lost or self.duplicated or self.out_of_order or self.mismatched or self.problems)


@dataclass
class Msg:
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    headers: dict[str, bytes]


def read_topic(bootstrap: str, topic: str, timeout_s: float = 120) -> list[Msg]:
    """Every committed record of ``topic`` (all partitions, each in offset order)."""
    from confluent_kafka import Consumer

    meta = Consumer({"bootstrap.servers": bootstrap, "group.id": "chaos-meta"})
    try:
        partitions = sorted(meta.list_topics(topic, timeout=30).topics[topic].partitions)
    finally:
        meta.close()
    out: list[Msg] = []
    from confluent_kafka import TopicPartition

    for partition in partitions:
        consumer = committed_reader(bootstrap, topic, partition)
        try:
            tp = TopicPartition(topic, partition)
            end = consumer.get_watermark_offsets(tp, timeout=30, cached=False)[1]
            deadline = time.monotonic() + timeout_s
            last_new = time.monotonic()
            while end > 0:
                batch = consumer.consume(10_000, timeout=0.5)
                for m in batch:
                    if m.error() is None:
                        value = m.value() or b""
                        out.append(Msg(partition, m.offset() or 0, m.key(), value, dict(m.headers() or [])))
                if batch:
                    last_new = time.monotonic()
                position = consumer.position([tp])[0].offset
                # the position passes control records too; past the last committed record, an
                # aborted tail delivers nothing: 5 s of silence is the end of it
                if position >= end or time.monotonic() - last_new > 5:
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{topic}[{partition}]: read to {position} of {end} in {timeout_s} s")
        finally:
            consumer.close()
    return out


def _cli_lines(*args: str) -> list[bytes]:
    done = subprocess.run([*CLI, *args], capture_output=True, timeout=600, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"deltamirror {' '.join(args)} exited {done.returncode}: {done.stderr[-2000:]!r}")
    return [line for line in done.stdout.split(b"\n") if line]


def check_table(bootstrap: str, t: TableTopics, last_version: int) -> Tally:
    tally = Tally(versions=last_version + 1)
    name = t.path.name
    expected = _cli_lines(
        "events", str(t.path), "--starting-version", "0", "--ending-version", str(last_version)
    )
    by_id: dict[tuple[int, int], bytes] = {}
    per_version: Counter[int] = Counter()
    timestamps: dict[int, int] = {}
    for line in expected:
        env = json.loads(line)
        by_id[(env["version"], env["index"])] = line
        per_version[env["version"]] += 1
        timestamps[env["version"]] = env["commitTimestamp"]

    actions = read_topic(bootstrap, t.actions)
    tally.records += len(actions)
    seen: Counter[tuple[int, int]] = Counter()
    previous = (-1, -1)
    for m in actions:
        env = json.loads(m.value)
        ident = (env["version"], env["index"])
        if ident not in by_id:
            tally.mismatched += 1
            tally.problems.append(f"{name}: actions offset {m.offset}: no such envelope {ident}")
            continue
        seen[ident] += 1
        if seen[ident] > 1:
            tally.duplicated += 1
        elif ident < previous:
            tally.out_of_order += 1
        if m.value != by_id[ident]:
            tally.mismatched += 1
            if tally.mismatched <= 3:
                tally.problems.append(f"{name}: actions offset {m.offset} {ident}: bytes differ from events")
        previous = max(previous, ident)
    missing = [i for i in by_id if i not in seen]
    tally.lost += len(missing)
    if missing:
        tally.problems.append(f"{name}: {len(missing)} envelopes lost, first {sorted(missing)[:3]}")

    commits = read_topic(bootstrap, t.commits)
    tally.records += len(commits)
    summaries = [json.loads(m.value) for m in commits if m.headers.get("kind") == b"commit"]
    versions = [s["version"] for s in summaries]
    _tally_sequence(tally, name, "commit summaries", versions, list(range(last_version + 1)))
    for s in summaries:
        v = s["version"]
        if v in per_version and (s["actionCount"] != per_version[v] or s["commitTimestamp"] != timestamps[v]):
            tally.mismatched += 1
            tally.problems.append(
                f"{name}: summary of v{v} says {s['actionCount']} actions at {s['commitTimestamp']}"
            )

    if t.changes is not None:
        _check_changes(bootstrap, t, last_version, tally)
    return tally


def _tally_sequence(tally: Tally, name: str, what: str, got: list[int], want: list[int]) -> None:
    counts = Counter(got)
    lost = [v for v in want if v not in counts]
    tally.lost += len(lost)
    tally.duplicated += sum(c - 1 for c in counts.values() if c > 1)
    tally.out_of_order += sum(1 for a, b in itertools.pairwise(got) if b < a)
    extra = [v for v in counts if v not in set(want)]
    if lost or extra or got != want:
        tally.problems.append(f"{name}: {what} {_runs(got)} where {_runs(want)} expected")


def _runs(values: list[int]) -> str:
    if not values:
        return "none"
    parts, start, prev = [], values[0], values[0]
    for v in values[1:]:
        if v != prev + 1:
            parts.append(f"{start}..{prev}" if start != prev else str(start))
            start = v
        prev = v
    parts.append(f"{start}..{prev}" if start != prev else str(start))
    return ",".join(parts[:8]) + (",..." if len(parts) > 8 else "")


def _image(row: dict[str, Any] | None, columns: list[str]) -> tuple[str | None, ...] | None:
    from support.row_change_expectations import text

    return None if row is None else tuple(text(row.get(c)) for c in columns)


COLUMNS = ["id", "bucket", "name", "amount"]


def _changes_table(path: Path, first: int, last: int, *, net_at: int | None = None) -> dict[str, Any]:
    """``deltamirror changes`` over ``first``..``last`` as an expected change feed; with ``net_at``
    its ``--net --key id`` rows, every one at version ``net_at`` (the version a net block carries)."""
    args = ["--starting-version", str(first), "--ending-version", str(last), "--format", "jsonl"]
    if net_at is not None:
        args += ["--net", "--key", ",".join(KEY_COLUMNS)]
    rows = [json.loads(line) for line in _cli_lines("changes", str(path), *args, "--no-progress")]
    return {
        "columns": [*COLUMNS, "_change_type", "_commit_version"],
        "rows": [
            [r[c] for c in COLUMNS] + [r["_change_type"], r["_commit_version"] if net_at is None else net_at]
            for r in rows
        ],
    }


def net_block_version(txn: list[dict[str, Any]]) -> int | None:
    """The version of the first committed ``BEGIN`` of a transaction topic: a net catch-up's block
    comes before any other (None: no block at all)."""
    begins = [int(r["id"].rsplit(":", 1)[1]) for r in txn if r["status"] == "BEGIN"]
    return begins[0] if begins else None


def expected_row_events(path: Path, last_version: int, net_at: int | None) -> Counter[Any]:
    """(op, before, after, version) of every row event expected on the changes topic: per version
    0..``last_version``, or one net block at ``net_at`` then per version after it."""
    if net_at is None:
        return expected_events(_changes_table(path, 0, last_version), KEY_COLUMNS)
    want = expected_events(_changes_table(path, 0, net_at, net_at=net_at), KEY_COLUMNS)
    if net_at < last_version:
        want += expected_events(_changes_table(path, net_at + 1, last_version), KEY_COLUMNS)
    return want


def _check_changes(bootstrap: str, t: TableTopics, last_version: int, tally: Tally) -> None:
    assert t.changes is not None and t.transaction is not None
    name = t.path.name
    txn = [json.loads(m.value) for m in read_topic(bootstrap, t.transaction)]
    tally.records += len(txn)
    net_at = net_block_version(txn) if t.net_from is not None else None
    if t.net_from is not None and (net_at is None or net_at < t.net_from):
        # rows before the table's version at start went out per version: no net block at all
        tally.mismatched += 1
        tally.problems.append(
            f"{name}: first BEGIN at v{net_at} where a net block of v{t.net_from} or later was expected"
        )
    columns = COLUMNS
    want = expected_row_events(t.path, last_version, net_at)
    per_version_rows: Counter[int] = Counter()
    for (_, _, _, version), n in want.items():
        per_version_rows[version] += n

    records = read_topic(bootstrap, t.changes)
    tally.records += len(records)
    got: Counter[Any] = Counter()
    #: a signal's block (events marked as a snapshot's) -> its events, by the block's last version
    in_blocks: dict[int, Counter[Any]] = {}
    last_in_partition: dict[tuple[bool, int], tuple[int, int]] = {}
    for m in records:
        value = json.loads(m.value)
        source = value["source"]
        ident = (int(source["delta_version"]), int(source["index"]))
        event = (value["op"], _image(value["before"], columns), _image(value["after"], columns), ident[0])
        block = source.get("snapshot") in ("true", "last")
        (in_blocks.setdefault(ident[0], Counter()) if block else got)[event] += 1
        # per partition, a block's events in order among themselves, the per-version ones too
        if ident <= last_in_partition.get((block, m.partition), (-1, -1)):
            tally.out_of_order += 1
        last_in_partition[(block, m.partition)] = max(
            ident, last_in_partition.get((block, m.partition), (-1, -1))
        )
    block_sizes = _check_signal_blocks(t, in_blocks, tally)
    lost, extra = want - got, got - want
    # an event both short on one side and over on the other is a wrong one, not two faults
    tally.lost += sum(lost.values())
    tally.duplicated += sum(extra.values())
    if lost or extra:
        tally.problems.append(
            f"{name}: row changes: {sum(lost.values())} missing, {sum(extra.values())} extra, "
            f"e.g. {next(iter(lost or extra))}"
        )

    begins = [int(r["id"].rsplit(":", 1)[1]) for r in txn if r["status"] == "BEGIN"]
    ends_in_order = [(int(r["id"].rsplit(":", 1)[1]), r["event_count"]) for r in txn if r["status"] == "END"]
    for b, size in block_sizes.items():  # a block's BEGIN and END come after those of its version
        if b in begins:
            begins.pop(len(begins) - 1 - begins[::-1].index(b))
        at = [i for i, (v, _) in enumerate(ends_in_order) if v == b]
        if not at or ends_in_order[at[-1]][1] != size:
            tally.mismatched += 1
            tally.problems.append(f"{name}: the signal block at v{b} ({size} events) has no END counting it")
        if at:
            ends_in_order.pop(at[-1])
    ends = dict(ends_in_order)
    end_order = [v for v, _ in ends_in_order]
    with_rows = sorted(v for v, n in per_version_rows.items() if n)
    _tally_sequence(tally, name, "BEGIN records", begins, with_rows)
    _tally_sequence(tally, name, "END records", end_order, with_rows)
    wrong = [v for v in with_rows if v in ends and ends[v] != per_version_rows[v]]
    if wrong:
        tally.mismatched += len(wrong)
        tally.problems.append(f"{name}: END event_count wrong for versions {wrong[:5]}")


def _check_signal_blocks(t: TableTopics, in_blocks: dict[int, Counter[Any]], tally: Tally) -> dict[int, int]:
    """Each signal block on the changes topic against the net changes of a range a watcher logged
    for it; the size of each block found (by its last version)."""
    name = t.path.name
    sizes: dict[int, int] = {}
    for last, got in sorted(in_blocks.items()):
        sizes[last] = sum(got.values())
        firsts = sorted({f for f, b in t.signal_blocks if b == last})
        if not firsts:
            tally.mismatched += sizes[last]
            tally.problems.append(f"{name}: a signal block at v{last} that no watcher logged")
            continue
        # two signals may have ended at the same version (one killed): the block is one of theirs
        wants = [expected_events(_changes_table(t.path, f, last, net_at=last), KEY_COLUMNS) for f in firsts]
        want = min(wants, key=lambda w: sum(((w - got) + (got - w)).values()))
        lost, extra = want - got, got - want
        tally.lost += sum(lost.values())
        tally.duplicated += sum(extra.values())
        if lost or extra:
            tally.problems.append(
                f"{name}: signal block at v{last}: {sum(lost.values())} missing, {sum(extra.values())} "
                f"extra, e.g. {next(iter(lost or extra))}"
            )
    return sizes
