"""Row-change records as Debezium's own consumers read them: Kafka Connect's JsonConverter and
Debezium's ExtractNewRecordState, the real classes from Maven Central on the JVM (support.debezium_jvm).

The expected rows are delta-spark's / delta-kernel-rs's change feeds (tests/data/expected/cdf), turned
into Debezium events by the documented pairing rule, written out here independently of the encoder:
an update's images become one ``u`` only when key columns are configured and the key occurs exactly
once as a pre-image and once as a post-image in the version; otherwise ``d`` + ``c``.

One JVM start reads every record of the module (the module fixture), so the whole file takes seconds.
The expected events come from support.row_change_expectations.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from deltamirror.core import open_table
from deltamirror.core.changes import read_changes
from deltamirror.core.errors import EnvironmentMissingError
from deltamirror.mirror.records.record import Record
from deltamirror.mirror.records.row_changes import RowChangesFormat, RowChangesOptions, VersionRows
from support.debezium_jvm import FLATTEN, JvmRecord, load_pins, run_checks, run_flink
from support.row_change_expectations import Event, expected_events, table_columns, text
from support.watching import watch_until

DATA = Path(__file__).resolve().parents[1] / "data"

#: what a Connect sink configures: schemas on, ExtractNewRecordState with the operation, commit time
#: and Delta version added, deletes rewritten to the before-image with ``__deleted: "true"``
FLAT_SETTINGS = {**FLATTEN, "add.fields": "op,source.ts_ms,source.delta_version"}
PROFILES: dict[str, dict[str, Any]] = {
    "schema-flat": {"key.schemas.enable": "true", "value.schemas.enable": "true", "transform": FLAT_SETTINGS},
    "schema-envelope": {"key.schemas.enable": "true", "value.schemas.enable": "true", "transform": None},
    "plain-envelope": {"key.schemas.enable": "false", "value.schemas.enable": "false", "transform": None},
    "plain-flat": {
        "key.schemas.enable": "false",
        "value.schemas.enable": "false",
        "transform": FLAT_SETTINGS,
    },
}


@dataclass(frozen=True)
class Case:
    """A table of the corpus, its expected change feed, and how its rows are published."""

    name: str
    expected_file: str
    key: tuple[str, ...]
    fmt: RowChangesFormat
    dates: frozenset[str] = frozenset()
    tombstones: bool = False

    @property
    def expected(self) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads((DATA / "expected" / "cdf" / self.expected_file).read_text())
        return doc

    @property
    def topic(self) -> str:
        return f"deltamirror.{self.name}.changes"


CASES = [
    # updates (paired by id), deletes, re-inserts; date, long, boolean, double, smallint columns
    Case(
        "nonpart-schema",
        "krs__cdf-table-non-partitioned__cdf_non_partitioned__0-latest.json",
        ("id",),
        "json-schema",
        frozenset({"birthday"}),
        tombstones=True,
    ),
    Case(
        "nonpart-plain",
        "krs__cdf-table-non-partitioned__cdf_non_partitioned__0-latest.json",
        ("id",),
        "json",
        frozenset({"birthday"}),
    ),
    # deletion vectors, no key: the whole row is the key, updates are d + c
    Case("dv-schema", "krs__cdf-table-with-dv__cdf_with_deletion_vector__0-latest.json", (), "json-schema"),
    # column mapping (name mode), from version 1
    Case(
        "colmap-schema",
        "krs__cdf-column-mapping-name-mode__cdf_with_column_mapping_name_mode__1-latest.json",
        ("id",),
        "json-schema",
    ),
    # 1197 change rows over 130+ versions, MERGEs touching a key more than once
    Case("long-schema", "gen__long-log-cdf__0-latest.json", ("id",), "json-schema"),
    Case("long-plain", "gen__long-log-cdf__0-latest.json", ("id",), "json"),
    Case("dv-plain", "krs__cdf-table-with-dv__cdf_with_deletion_vector__0-latest.json", (), "json"),
]

#: Flink's debezium-json reads plain JSON; the tables' columns as Flink types (dates: INT days)
FLINK_COLUMNS = {
    "nonpart-plain": [
        ("id", "INT"),
        ("name", "STRING"),
        ("birthday", "INT"),
        ("long_field", "BIGINT"),
        ("boolean_field", "BOOLEAN"),
        ("double_field", "DOUBLE"),
        ("smallint_field", "SMALLINT"),
    ],
    "long-plain": [("id", "BIGINT"), ("part", "STRING"), ("val", "STRING"), ("n", "INT")],
    "dv-plain": [("value", "INT")],
}


def flink_row_type(columns: list[tuple[str, str]]) -> str:
    return "ROW<" + ", ".join(f"`{name}` {t}" for name, t in columns) + ">"


# --- the records, from the encoder over core's change feed -----------------------------------------


def version_batches(case: Case) -> Iterator[tuple[int, int, list[pa.RecordBatch]]]:
    """(version, commit ms, batches) of the table's change feed from the expected start."""
    exp = case.expected
    table = open_table(str(DATA / "tables" / exp["table"]))
    grouped: dict[int, list[pa.RecordBatch]] = defaultdict(list)
    for batch in read_changes(table, starting_version=exp["start_version"] or 0):
        grouped[batch.column("_commit_version")[0].as_py()].append(batch)
    for version in sorted(grouped):
        stamp: dt.datetime = grouped[version][0].column("_commit_timestamp")[0].as_py()
        yield (
            version,
            (stamp - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) // dt.timedelta(milliseconds=1),
            grouped[version],
        )


def encode(case: Case) -> tuple[list[Record], dict[int, int]]:
    options = RowChangesOptions(
        changes_topic=case.topic,
        transaction_topic=f"deltamirror.{case.name}.transaction",
        table_name=case.name,
        table_id=f"id-{case.name}",
        key_columns=case.key,
        format=case.fmt,
        tombstones=case.tombstones,
    )
    records: list[Record] = []
    stamps: dict[int, int] = {}
    for version, ts_ms, batches in version_batches(case):
        stamps[version] = ts_ms
        rows = VersionRows(options, lambda b=batches: b, version=version, ts_ms=ts_ms)  # type: ignore[misc]
        for chunk in rows.records():
            records.extend(chunk)
    return records, stamps


def snapshot_records(case: Case) -> list[Record]:
    """The table's rows at its latest version as an initial snapshot publishes them (``op: "r"``)."""
    snap = open_table(str(DATA / "tables" / case.expected["table"])).snapshot()
    batches = [
        b.append_column("_change_type", pa.array(["insert"] * b.num_rows))
        for b in snap.iter_batches()
        if b.num_rows
    ]
    options = RowChangesOptions(
        changes_topic=case.topic,
        transaction_topic=f"deltamirror.{case.name}.transaction",
        table_name=case.name,
        table_id=f"id-{case.name}",
        key_columns=case.key,
        format=case.fmt,
    )
    rows = VersionRows(
        options,
        lambda: batches,
        version=snap.version,
        ts_ms=1_700_000_000_000,
        op_override="r",
        snapshot=lambda last: "last" if last else "true",
        may_have_updates=False,
    )
    return [r for chunk in rows.records() for r in chunk if r.topic == case.topic]


def final_state(case: Case) -> Counter[tuple[str | None, ...]]:
    """The table's rows after the last version, replayed from the expected change feed."""
    state: Counter[tuple[str | None, ...]] = Counter()
    for _op, before, after, _ in sorted(
        expected_events(case.expected, case.key).elements(), key=lambda e: e[3]
    ):
        if before is not None:
            state[before] -= 1
        if after is not None:
            state[after] += 1
    return +state


# --- the types case: every Arrow type the change feed gives, with hand-written Connect values -----

TYPES_SCHEMA = pa.schema(
    [
        ("i8", pa.int8()),
        ("i16", pa.int16()),
        ("i32", pa.int32()),
        ("i64", pa.int64()),
        ("f32", pa.float32()),
        ("f64", pa.float64()),
        ("b", pa.bool_()),
        ("s", pa.string()),
        ("bin", pa.binary()),
        ("dec", pa.decimal128(10, 2)),
        ("d", pa.date32()),
        ("ts", pa.timestamp("us", tz="UTC")),
        ("ts_ntz", pa.timestamp("us")),
        ("st", pa.struct([("a", pa.int32()), ("b", pa.string())])),
        ("l", pa.list_(pa.int64())),
        ("m", pa.map_(pa.string(), pa.int64())),
        ("_change_type", pa.string()),
    ]
)
TYPES_ROW = {
    "i8": -1,
    "i16": 300,
    "i32": 70000,
    "i64": 2**40,
    "f32": 1.5,
    "f64": -2.25,
    "b": True,
    "s": 'é"\n',
    "bin": b"\x00\xff",
    "dec": Decimal("-12.30"),
    "d": dt.date(1969, 12, 31),
    "ts": dt.datetime(2024, 1, 2, 3, 4, 5, 678901, tzinfo=dt.UTC),
    "ts_ntz": dt.datetime(1960, 1, 1, 0, 0, 0, 1),
    "st": {"a": 1, "b": "x"},
    "l": [1, 2],
    "m": [("k", 1)],
    "_change_type": "insert",
}
#: what a Connect sink sees (JsonConverter's schemaless rendering; numbers read exactly)
TYPES_CONNECT = {
    "i8": -1,
    "i16": 300,
    "i32": 70000,
    "i64": 1099511627776,
    "f32": Decimal("1.5"),
    "f64": Decimal("-2.25"),
    "b": True,
    "s": 'é"\n',
    "bin": "AP8=",
    "dec": Decimal("-12.30"),
    "d": -1,  # io.debezium.time.Date: days since the epoch
    "ts": 1704164645678901,  # io.debezium.time.MicroTimestamp
    "ts_ntz": -315619199999999,
    "st": {"a": 1, "b": "x"},
    "l": [1, 2],
    "m": {"k": 1},
}
NON_FINITE_ROW = {**{f.name: None for f in TYPES_SCHEMA}, "i64": 7, "f64": float("nan"), "f32": float("inf")}
NON_FINITE_ROW["_change_type"] = "insert"


def types_records(fmt: RowChangesFormat, rows: Sequence[dict[str, Any]]) -> list[Record]:
    options = RowChangesOptions(
        changes_topic="deltamirror.types.changes",
        transaction_topic="deltamirror.types.transaction",
        table_name="types",
        table_id="id-types",
        key_columns=["i64"],
        format=fmt,
    )
    batch = pa.RecordBatch.from_pylist(list(rows), schema=TYPES_SCHEMA)
    vr = VersionRows(options, lambda: [batch], version=3, ts_ms=1_700_000_000_000)
    return [r for chunk in vr.records() for r in chunk if r.topic == options.changes_topic]


# --- one JVM run for the module --------------------------------------------------------------------


@dataclass
class Checked:
    record: Record
    profile: str
    result: dict[str, Any]


@dataclass
class Run:
    by_case: dict[str, list[Checked]]
    stamps: dict[str, dict[int, int]]
    #: format -> the encoder's error for a record it refuses to write
    refused: dict[str, str]
    #: case -> Flink debezium-json's result for each change event value (tombstones left out)
    flink: dict[str, list[dict[str, Any]]]


def profiles_for(case: Case) -> tuple[str, ...]:
    return (
        ("schema-flat", "schema-envelope") if case.fmt == "json-schema" else ("plain-envelope", "plain-flat")
    )


@pytest.fixture(scope="module")
def run() -> Run:
    planned: list[tuple[str, str, Record]] = []
    stamps: dict[str, dict[int, int]] = {}
    refused: dict[str, str] = {}
    for case in CASES:
        records, stamps[case.name] = encode(case)
        planned += [(case.name, p, r) for r in records for p in profiles_for(case)]
    planned += [("snapshot", "schema-flat", r) for r in snapshot_records(CASES[0])]
    for fmt, profile in (("json-schema", "schema-envelope"), ("json", "plain-envelope")):
        rows = [TYPES_ROW, {**{f.name: None for f in TYPES_SCHEMA}, "i64": 0, "_change_type": "insert"}]
        planned += [(f"types-{fmt}", profile, r) for r in types_records(fmt, rows)]  # type: ignore[arg-type]
        try:
            nonfinite = types_records(fmt, [NON_FINITE_ROW])  # type: ignore[arg-type]
        except Exception as exc:  # refusing to write is a fine answer; writing 0.0 is not
            refused[fmt] = repr(exc)
        else:
            planned += [(f"nonfinite-{fmt}", profile, r) for r in nonfinite]
    flink_values = {
        name: [
            r.value
            for n, p, r in planned
            if n == name and p == "plain-envelope" and r.topic.endswith(".changes")
        ]
        for name in FLINK_COLUMNS
    }
    try:
        results = run_checks(PROFILES, [JvmRecord(p, r.topic, r.key, r.value) for _, p, r in planned])
        flink = {
            name: run_flink(flink_row_type(FLINK_COLUMNS[name]), [v for v in values if v is not None])
            for name, values in flink_values.items()
        }
    except EnvironmentMissingError as exc:
        if os.environ.get("DELTAMIRROR_REQUIRE_ALL"):
            pytest.fail(str(exc))
        pytest.skip(str(exc))
    by_case: dict[str, list[Checked]] = defaultdict(list)
    for (name, profile, record), result in zip(planned, results, strict=True):
        by_case[name].append(Checked(record, profile, result))
    return Run(by_case, stamps, refused, flink)


def accepted(checked: Sequence[Checked], profile: str, topic_suffix: str = ".changes") -> list[Checked]:
    chosen = [c for c in checked if c.profile == profile and c.record.topic.endswith(topic_suffix)]
    refused = [
        (c.result["error"], c.record.value[:300] if c.record.value else None)
        for c in chosen
        if c.result["error"]
    ]
    assert not refused, f"{len(refused)} records refused by the JVM components, first: {refused[0]}"
    return chosen


def image(case: Case, columns: list[str], row: dict[str, Any] | None) -> tuple[str | None, ...] | None:
    if row is None:
        return None
    out = []
    for c in columns:
        v = row[c]
        if c in case.dates and v is not None:
            v = (dt.date(1970, 1, 1) + dt.timedelta(days=int(v))).isoformat()
        out.append(text(v))
    return tuple(out)


# --- the tests ---------------------------------------------------------------------------------------


def test_pins_match_the_broker_kafka() -> None:
    """connect-json and kafka-clients are the project's Kafka version (the broker's jars)."""
    from deltamirror.devkafka.jars import load_distribution

    doc, pins = load_pins()
    kafka = load_distribution().kafka_version
    assert doc["kafka_version"] == kafka
    versions = {p.artifact: p.version for p in pins}
    assert versions["connect-json"] == versions["kafka-clients"] == versions["connect-api"] == kafka
    assert versions["debezium-connect-plugins"] == doc["debezium_version"]


@pytest.mark.parametrize("case", [c for c in CASES if c.fmt == "json-schema"], ids=lambda c: c.name)
def test_extract_new_record_state_flattens_to_the_change_feed(run: Run, case: Case) -> None:
    """JsonConverter (schemas on) + ExtractNewRecordState: the rows a Connect sink writes are the
    change feed's rows, each with its operation, commit version and commit time."""
    columns = table_columns(case.expected)
    checked = accepted(run.by_case[case.name], "schema-flat")
    stamps = run.stamps[case.name]
    got: Counter[tuple[Any, ...]] = Counter()
    for c in checked:
        if c.record.value is None:  # tombstones: ExtractNewRecordState drops them in rewrite mode
            assert c.result["dropped"], c.result
            continue
        value = c.result["value"]
        assert c.result["valueSchema"] == f"{case.topic}.Value"
        assert value["__source_ts_ms"] == stamps[value["__source_delta_version"]]
        got[
            (image(case, columns, value), value["__op"], value["__deleted"], value["__source_delta_version"])
        ] += 1
    want: Counter[tuple[Any, ...]] = Counter()
    for (op, before, after, version), n in expected_events(case.expected, case.key).items():
        want[(before if op == "d" else after, op, "true" if op == "d" else "false", version)] += n
    assert got == want


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_the_envelope_as_connect_reads_it(run: Run, case: Case) -> None:
    """JsonConverter alone (schemas on for json-schema, off for plain JSON): before/after/op as the
    change feed says, keys as configured, the source block and the transaction block."""
    columns = table_columns(case.expected)
    profile = "schema-envelope" if case.fmt == "json-schema" else "plain-envelope"
    checked = accepted(run.by_case[case.name], profile)
    got: Counter[Event] = Counter()
    total_order: dict[int, list[int]] = defaultdict(list)
    tombstone_keys, delete_keys = [], []
    for c in checked:
        key = c.result["key"]
        if c.record.value is None:
            assert c.result["value"] is None
            tombstone_keys.append(key)
            continue
        v = c.result["value"]
        row = v["after"] if v["after"] is not None else v["before"]
        assert key == {k: row[k] for k in (case.key or columns)}
        if v["op"] == "d":
            delete_keys.append(key)
        version = v["source"]["delta_version"]
        assert v["ts_ms"] == v["source"]["ts_ms"] == run.stamps[case.name][version]
        assert v["source"]["connector"] == "deltamirror"
        assert v["source"]["table_id"] == f"id-{case.name}"
        assert v["transaction"]["id"] == f"id-{case.name}:{version}"
        total_order[version].append(v["transaction"]["total_order"])
        got[(v["op"], image(case, columns, v["before"]), image(case, columns, v["after"]), version)] += 1
    assert got == expected_events(case.expected, case.key)
    for orders in total_order.values():
        assert sorted(orders) == list(range(1, len(orders) + 1))
    assert tombstone_keys == (delete_keys if case.tombstones else [])


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_transaction_metadata_as_connect_reads_it(run: Run, case: Case) -> None:
    """BEGIN and END per version with a changes event; END counts the version's events per topic."""
    profile = "schema-envelope" if case.fmt == "json-schema" else "plain-envelope"
    checked = accepted(run.by_case[case.name], profile, ".transaction")
    per_version = Counter(
        version
        for (_, _, _, version), n in expected_events(case.expected, case.key).items()
        for _ in range(n)
    )
    seen: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for c in checked:
        value = c.result["value"]
        assert c.result["key"] == {"id": value["id"]}
        seen[value["id"]].append(value)
    assert set(seen) == {f"id-{case.name}:{v}" for v in per_version}
    for tid, (begin, end) in seen.items():
        version = int(tid.rsplit(":", 1)[1])
        assert (begin["status"], end["status"]) == ("BEGIN", "END")
        assert end["event_count"] == per_version[version]
        assert end["data_collections"] == [
            {"data_collection": case.topic, "event_count": per_version[version]}
        ]


@pytest.mark.parametrize("name", sorted(FLINK_COLUMNS))
def test_flink_debezium_json_reads_plain_json(run: Run, name: str) -> None:
    """Flink's debezium-json format turns the plain JSON records into the change feed as a changelog:
    +I for c, -U/+U for u, -D for d (dates as INT days since the epoch)."""
    case = next(c for c in CASES if c.name == name)
    results = run.flink[name]
    refused = [r["error"] for r in results if r["error"]]
    assert not refused, f"{len(refused)} records refused by Flink's debezium-json, first: {refused[0]}"
    columns = table_columns(case.expected)
    flink_names = [n for n, _ in FLINK_COLUMNS[name]]
    got = Counter(
        (row["kind"], image(case, columns, dict(zip(flink_names, row["fields"], strict=True))))
        for r in results
        for row in r["rows"]
    )
    want: Counter[tuple[str, Any]] = Counter()
    for (op, before, after, _), n in expected_events(case.expected, case.key).items():
        for kind, img in {"c": [("+I", after)], "u": [("-U", before), ("+U", after)], "d": [("-D", before)]}[
            op
        ]:
            want[(kind, img)] += n
    assert got == want


def test_snapshot_rows_flatten_to_the_table(run: Run) -> None:
    """An initial snapshot's ``r`` records flatten to the table's rows at its latest version."""
    case = CASES[0]
    columns = table_columns(case.expected)
    checked = accepted(run.by_case["snapshot"], "schema-flat")
    assert {(c.result["value"]["__op"], c.result["value"]["__deleted"]) for c in checked} == {("r", "false")}
    assert Counter(image(case, columns, c.result["value"]) for c in checked) == final_state(case)


def test_extract_new_record_state_leaves_plain_json_unchanged(run: Run) -> None:
    """Debezium's ExtractNewRecordState needs the envelope's schema: a schemaless (plain JSON)
    record passes through untouched. Connect sinks that flatten need the json-schema format."""
    checked = run.by_case["nonpart-plain"]
    envelope = {id(c.record): c.result for c in accepted(checked, "plain-envelope")}
    flat = accepted(checked, "plain-flat")
    assert flat
    for c in flat:
        assert c.result["valueSchema"] is None
        assert c.result["value"] == envelope[id(c.record)]["value"]
        assert set(c.result["value"]) >= {"before", "after", "op", "source"}


@pytest.mark.parametrize("fmt", ["json-schema", "json"])
def test_every_column_type_as_connect_reads_it(run: Run, fmt: str) -> None:
    checked = accepted(
        run.by_case[f"types-{fmt}"], "schema-envelope" if fmt == "json-schema" else "plain-envelope"
    )
    after = [c.result["value"]["after"] for c in checked]
    want = dict(TYPES_CONNECT)
    if fmt == "json":  # plain JSON: decimals as exact text (decimal.handling.mode=string)
        want["dec"] = "-12.30"
    assert after[0] == want
    assert after[1] == {**{k: None for k in TYPES_CONNECT}, "i64": 0}
    assert [c.result["key"] for c in checked] == [{"i64": 1099511627776}, {"i64": 0}]


def test_non_finite_floats_are_not_silently_zero_in_connect(run: Run) -> None:
    """A NaN / infinity must not reach a Connect sink as 0.0: refused, or carried as itself."""
    if "json-schema" in run.refused:
        return
    (checked,) = run.by_case["nonfinite-json-schema"]
    if checked.result["error"] is None:
        after = checked.result["value"]["after"]
        assert after["f64"] != 0 and after["f32"] != 0, after


def test_non_finite_floats_in_plain_json_stay_text(run: Run) -> None:
    (checked,) = accepted(run.by_case["nonfinite-json"], "plain-envelope")
    after = checked.result["value"]["after"]
    assert (after["f64"], after["f32"]) == ("NaN", "Infinity")


# --- records the watcher published -------------------------------------------------------------------


def committed_records(bootstrap: str, topic: str) -> list[Record]:
    """Every committed record of ``topic`` (one partition), as a read_committed consumer sees them."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"t-{uuid.uuid4().hex[:8]}",
            "isolation.level": "read_committed",
        }
    )
    try:
        meta = consumer.list_topics(topic, timeout=10).topics[topic]
        consumer.assign([TopicPartition(topic, p, -2) for p in meta.partitions])
        out: list[Record] = []
        while msgs := consumer.consume(500, timeout=2.0):
            for m in msgs:
                assert m.error() is None, m.error()
                out.append(Record(m.value(), m.key() or b"", None, topic))
        return out
    finally:
        consumer.close()


@pytest.mark.kafka
def test_watcher_records_through_connect(kafka_bootstrap: str) -> None:
    """The watcher with row changes on (json-schema, key ``id``, tombstones), read back from the
    broker: JsonConverter + ExtractNewRecordState turn the records into the table's change rows."""
    case = CASES[0]
    uid = uuid.uuid4().hex[:8]
    changes, transaction = f"dbz{uid}.t.changes", f"dbz{uid}.t.transaction"
    watch_until(
        kafka_bootstrap,
        DATA / "tables" / case.expected["table"],
        f"dbz{uid}.t.actions",
        4,
        f"dbz{uid}",
        snapshot_mode="from-version",
        from_version=0,
        changes_topic=changes,
        transaction_topic=transaction,
        row_changes={"key_columns": list(case.key), "format": "json-schema", "tombstones": True},
    )
    records = committed_records(kafka_bootstrap, changes)
    txn = committed_records(kafka_bootstrap, transaction)
    planned = [("schema-flat", r) for r in records] + [("schema-envelope", r) for r in records + txn]
    try:
        results = run_checks(PROFILES, [JvmRecord(p, r.topic, r.key, r.value) for p, r in planned])
    except EnvironmentMissingError as exc:
        if os.environ.get("DELTAMIRROR_REQUIRE_ALL"):
            pytest.fail(str(exc))
        pytest.skip(str(exc))
    checked = [Checked(r, p, res) for (p, r), res in zip(planned, results, strict=True)]
    columns = table_columns(case.expected)
    got: Counter[tuple[Any, ...]] = Counter()
    for c in accepted(checked, "schema-flat"):
        if c.record.value is None:
            assert c.result["dropped"]
            continue
        v = c.result["value"]
        got[(image(case, columns, v), v["__op"], v["__deleted"], v["__source_delta_version"])] += 1
    want: Counter[tuple[Any, ...]] = Counter()
    events = expected_events(case.expected, case.key)
    for (op, before, after, version), n in events.items():
        want[(before if op == "d" else after, op, "true" if op == "d" else "false", version)] += n
    assert got == want
    envelopes = accepted(checked, "schema-envelope")
    deletes = [
        c.result["key"] for c in envelopes if c.record.value is not None and c.result["value"]["op"] == "d"
    ]
    assert [c.result["key"] for c in envelopes if c.record.value is None] == deletes
    ends = [c.result["value"] for c in accepted(checked, "schema-envelope", ".transaction")]
    per_version = Counter(v for (_, _, _, v), n in events.items() for _ in range(n))
    assert {e["id"].rsplit(":", 1)[1]: e["event_count"] for e in ends if e["status"] == "END"} == {
        str(v): n for v, n in per_version.items()
    }
