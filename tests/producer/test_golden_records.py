"""Golden records: the bytes of every record on every topic, for real tables, must not change.

What users see is the contract of docs/events.md, so a refactoring that moves the Kafka layer must
leave it byte-identical. For each run below, ``deltamirror watch`` (the real command, in a
subprocess, against the session broker) mirrors a set of tables from ``tests/data/tables``; every
record is read back as a subscriber reads it (``read_committed``) and compared with
``tests/data/golden_records/<run>/<table>.jsonl``: per topic (actions, commits, progress) and in
offset order, the partition, the Kafka timestamp, the key bytes, the headers (names, order, bytes)
and the value bytes. ``deltamirror events`` (offline) must print exactly the action values of the
golden records, and ``deltamirror schema`` exactly ``schemas/event.schema.json`` (and its golden
copy).

Determinism, and the only normalisation (``support.golden``):

- Each table is copied to ``/tmp/deltamirror-golden/<table>`` (a lock makes concurrent runs take
  turns), so ``tableUri``, the progress key, the ``transactionalId`` and the fragment boundaries
  are the same on every machine; its files get modification times from a fixed schedule, because
  a commit without ``inCommitTimestamp`` is timed by its file and git keeps no file times.
- Each run uses fresh topic names (they appear in no record) and a fixed transactional-id prefix.
- ``txn_max_ms`` is set far beyond the run, so transactions (and with them progress records) end
  only where the record limit or the end of the log says, not when a clock does.
- Progress records carry wall-clock time in their Kafka timestamp and ``updatedAt``: both become
  ``"<wall-clock>"``; an identical progress record repeated for the same table is the idle
  liveness re-write (about every 15 s) and is counted once. Nothing else is normalised.
- Not covered, because they depend on timing or on a table changing while watched: heartbeats,
  ``tableReplaced`` and clamped timestamps (``test_kafka_watch.py`` checks them).

Regenerating is a change of the contract subscribers rely on: do it only on purpose, add the
change to CHANGELOG.md, and follow the ``schemaVersion`` policy of docs/events.md. To regenerate
from the code of a given commit (not a working tree in flux)::

    git worktree add /tmp/golden-base <commit>
    .venv/bin/python -m pip install --no-deps --target /tmp/golden-site /tmp/golden-base
    PYTHONPATH=/tmp/golden-site DELTAMIRROR_UPDATE_GOLDEN=1 \\
        .venv/bin/python -m pytest tests/producer/test_golden_records.py -p no:cacheprovider
    git worktree remove --force /tmp/golden-base

(with ``PYTHONPATH`` unset it regenerates from the installed working tree). The first test prints
which ``deltamirror`` files the watcher subprocess imported.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from support.golden import (
    GoldenRecord,
    describe_difference,
    golden_lock,
    latest_commit,
    normalise,
    place_table,
    read_golden,
    read_to_end,
    table_uri,
    version_mtime_s,
    write_golden,
)
from support.tables import DATA

GOLDEN = DATA / "golden_records"
SCHEMA = Path(__file__).resolve().parents[2] / "schemas" / "event.schema.json"
UPDATE = os.environ.get("DELTAMIRROR_UPDATE_GOLDEN") == "1"
#: fixed, so the transactionalId inside progress values is fixed too
TXN_PREFIX = "deltamirror-golden"

FROM_0 = {"snapshot_mode": "from-version", "from_version": 0}
INITIAL = {"snapshot_mode": "initial"}


@dataclass(frozen=True)
class Watched:
    table: str
    mode: dict[str, Any] = field(default_factory=lambda: dict(FROM_0))


@dataclass(frozen=True)
class Run:
    """One ``deltamirror watch`` process: its settings and the tables it mirrors."""

    name: str
    settings: dict[str, Any]
    tables: tuple[Watched, ...]


#: transactions end at the record limit or the end of the log, never by the clock
NO_CLOCK = {"txn_max_ms": 3_600_000}

RUNS = (
    Run(
        "from-version",
        NO_CLOCK,
        (
            Watched("golden__basic-with-inserts-updates"),  # plain JSON commits (docs/events.md's example)
            Watched("golden__checkpoint"),  # classic checkpoints along the log
            Watched("krs__cdf-table"),  # change data feed: cdc files, partitions
            Watched("drs__cdc_ict_table"),  # cdc + in-commit timestamps
            Watched("golden__dv-partitioned-with-checkpoint"),  # deletion vectors, partitions
            Watched("kj__data-reader-partition-values-column-mapping-name"),  # column mapping, partitions
            Watched("drs__delta-2.2.0-partitioned-types"),  # partition values of many types
            Watched("drs__partition-type-primitives"),  # every primitive partition type, nulls
            Watched("golden__data-reader-partition-values"),  # escaped partition values and paths
            Watched("golden__commit-info-containing-arbitrary-operationParams-types"),
            Watched("spark__transaction_log_schema_evolvability"),  # action types Delta may add later
            Watched("drs__table_with_liquid_clustering"),  # domainMetadata, row tracking
            Watched("krs__app-txn-with-last-updated"),  # txn actions
            Watched("drs__checkpoints_vacuumed", {"snapshot_mode": "from-version", "from_version": 5}),
        ),
    ),
    Run(
        "snapshot",
        NO_CLOCK,
        (
            Watched("golden__basic-with-inserts-updates", INITIAL),
            Watched("golden__checkpoint", INITIAL),  # state from a classic checkpoint
            Watched("golden__multi-part-checkpoint", INITIAL),
            Watched("golden__v2-checkpoint-parquet", INITIAL),  # V2 checkpoint with sidecars
            Watched("golden__dv-with-columnmapping", INITIAL),
            Watched("drs__cdc_ict_table", INITIAL),
            Watched("drs__table_with_liquid_clustering", INITIAL),  # domainMetadata order
            Watched("krs__app-txn-checkpoint", INITIAL),  # txn order
            Watched("spark__transaction_log_schema_evolvability", INITIAL),
            Watched("drs__checkpoints_vacuumed", {"snapshot_mode": "when-needed"}),
            Watched("golden__data-reader-partition-values", {"snapshot_mode": "latest"}),  # progress only
            Watched(
                "krs__cdf-table",
                {"snapshot_mode": "from-timestamp", "from_timestamp": version_mtime_s(2) * 1000},
            ),
        ),
    ),
    Run(
        "small-records",  # the smallest max_record_bytes: oversize values go out as fragments
        {**NO_CLOCK, "max_record_bytes": 1024, "txn_max_records": 16},
        (
            Watched("golden__table-with-columnmapping-mode-name"),  # an 11 kB schemaString
            Watched("drs__simple_table"),  # versions larger than one transaction
            Watched("krs__v2-checkpoints-json-with-sidecars", INITIAL),  # a snapshot over many transactions
        ),
    ),
)

ALL_TABLES = sorted({w.table for run in RUNS for w in run.tables})


@pytest.fixture(scope="module")
def placed() -> Iterator[dict[str, Path]]:
    with golden_lock():
        yield {table: place_table(table) for table in ALL_TABLES}


def _golden_path(run: Run, table: str) -> Path:
    return GOLDEN / run.name / f"{table}.jsonl"


def _is_done(progress: list[GoldenRecord], targets: dict[bytes, int]) -> bool:
    last: dict[bytes | None, Any] = {}
    for record in progress:
        last[record.key] = json.loads(record.value or b"null")
    return all(
        (p := last.get(key)) is not None and p["version"] == version and p["index"] + 1 == p["count"]
        for key, version in targets.items()
    )


def _watch(bootstrap: str, run: Run, placed: dict[str, Path], workdir: Path) -> dict[str, list[GoldenRecord]]:
    """Mirror the run's tables until each is published to its latest version; its records per table."""
    name = f"golden-{uuid.uuid4().hex[:10]}"
    roles: dict[str, str] = {f"{name}.progress": "progress"}
    tables = []
    for i, watched in enumerate(run.tables):
        actions, commits = f"{name}.{i}.actions", f"{name}.{i}.commits"
        roles |= {actions: "actions", commits: "commits"}
        tables.append(
            {
                "uri": str(placed[watched.table]),
                "actions_topic": actions,
                "commits_topic": commits,
                "poll_interval_s": 0.2,
                **watched.mode,
            }
        )
    config = workdir / f"{run.name}.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "kafka": {"bootstrap_servers": bootstrap},
                "tables": tables,
                "progress_topic": f"{name}.progress",
                "transactional_id_prefix": TXN_PREFIX,
                **run.settings,
            }
        )
    )
    targets = {table_uri(w.table).encode(): latest_commit(placed[w.table]) for w in run.tables}
    log = workdir / f"{run.name}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "deltamirror.cli.main", "watch", "--config", str(config)],
            stdout=out,
            stderr=out,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    try:
        deadline = time.monotonic() + 120
        while not _is_done(
            read_to_end(bootstrap, {f"{name}.progress": "progress"})[f"{name}.progress"], targets
        ):
            tail = log.read_text(errors="replace")[-3000:]
            assert proc.poll() is None, f"the watcher exited with {proc.returncode}:\n{tail}"
            assert time.monotonic() < deadline, f"the watcher did not publish every table in time:\n{tail}"
            time.sleep(0.3)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
    assert code == 0, f"the watcher exited with {code}:\n{log.read_text(errors='replace')[-3000:]}"
    records = read_to_end(bootstrap, roles)
    progress = records[f"{name}.progress"]
    unknown = {r.key for r in progress} - set(targets)
    assert not unknown, f"progress records for tables not watched: {unknown}"
    return {
        w.table: [
            *records[f"{name}.{i}.actions"],
            *records[f"{name}.{i}.commits"],
            *(r for r in progress if r.key == table_uri(w.table).encode()),
        ]
        for i, w in enumerate(run.tables)
    }


def _imported_from() -> str:
    """Where this process and a watcher subprocess get ``deltamirror`` from (base code or working tree)."""
    import deltamirror.cli.main as here

    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import deltamirror.cli.main as m, deltamirror.core as c; print(m.__file__, c.__file__)",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return f"this process {here.__file__}; subprocesses {done.stdout.strip()}"


@pytest.mark.kafka
@pytest.mark.timeout(300)
@pytest.mark.parametrize("run", RUNS, ids=[r.name for r in RUNS])
def test_every_record_on_every_topic_is_unchanged(
    run: Run, kafka_bootstrap: str, placed: dict[str, Path], tmp_path: Path
) -> None:
    print(f"deltamirror imported from: {_imported_from()}")
    published = _watch(kafka_bootstrap, run, placed, tmp_path)
    problems = []
    for watched in run.tables:
        got = normalise(published[watched.table])
        path = _golden_path(run, watched.table)
        if UPDATE:
            write_golden(path, got)
            continue
        difference = describe_difference(read_golden(path), got)
        if difference is not None:
            problems.append(f"{watched.table} ({run.name}, {watched.mode}):\n{difference}")
    assert not problems, "records differ from tests/data/golden_records:\n" + "\n".join(problems)


def _whole_values(records: list[GoldenRecord]) -> list[bytes]:
    """The action values a subscriber rebuilds: fragments ``j/n`` concatenated, written out here so
    the check does not lean on the library's assembler."""
    out: list[bytes] = []
    parts: list[bytes] = []
    for record in records:
        if record.role != "actions":
            continue
        fragment = record.header("fragment")
        if fragment is None:
            assert not parts, "a fragment sequence was interrupted"
            out.append(record.value or b"")
            continue
        j, n = map(int, fragment.split("/"))
        assert j == len(parts), f"fragment {fragment} out of order"
        parts.append(record.value or b"")
        if j + 1 == n:
            out.append(b"".join(parts))
            parts = []
    assert not parts, "the last fragment sequence is incomplete"
    return out


EVENT_CASES = [(run, w) for run in RUNS for w in run.tables if w.mode.get("snapshot_mode") == "from-version"]


@pytest.mark.parametrize(("run", "watched"), EVENT_CASES, ids=[f"{r.name}-{w.table}" for r, w in EVENT_CASES])
def test_events_prints_the_golden_action_values(
    run: Run, watched: Watched, placed: dict[str, Path], tmp_path: Path
) -> None:
    from deltamirror.cli.main import main

    out = tmp_path / "events.jsonl"
    start = str(watched.mode["from_version"])
    assert main(["events", str(placed[watched.table]), "--starting-version", start, "-o", str(out)]) == 0
    printed = [line for line in out.read_bytes().split(b"\n") if line]
    assert printed == _whole_values(read_golden(_golden_path(run, watched.table)))


def test_schema_prints_the_committed_schema_unchanged(capsys: pytest.CaptureFixture[str]) -> None:
    from deltamirror.cli.main import main

    assert main(["schema"]) == 0
    printed = capsys.readouterr().out.encode("utf-8")
    golden = GOLDEN / "event.schema.json"
    if UPDATE:
        golden.write_bytes(printed)
    assert printed == SCHEMA.read_bytes(), "deltamirror schema differs from schemas/event.schema.json"
    assert printed == golden.read_bytes(), "the event schema differs from its golden copy"


def test_normalisation_touches_only_wall_clock_fields_and_liveness_rewrites() -> None:
    def progress(version: int, updated: int) -> GoldenRecord:
        value = f'{{"tableUri":"t","version":{version},"updatedAt":{updated}}}'.encode()
        return GoldenRecord("progress", 0, updated, b"t", (), value)

    action = GoldenRecord("actions", 0, 5, b"id", (("version", b"0"),), b'{"updatedAt":1}')
    out = normalise([action, progress(0, 10), progress(0, 20), progress(1, 30), progress(0, 40)])
    assert out[0] == action  # only progress records carry wall-clock fields
    assert [r.value for r in out[1:]] == [
        b'{"tableUri":"t","version":0,"updatedAt":"<wall-clock>"}',  # the re-write at 20 is counted once
        b'{"tableUri":"t","version":1,"updatedAt":"<wall-clock>"}',
        b'{"tableUri":"t","version":0,"updatedAt":"<wall-clock>"}',  # not a repetition of the one before
    ]
    assert {r.timestamp for r in out[1:]} == {None}
    with pytest.raises(AssertionError, match="updatedAt"):
        normalise([GoldenRecord("progress", 0, 1, b"t", (), b'{"version":0}')])
