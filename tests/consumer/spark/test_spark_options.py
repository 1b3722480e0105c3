"""The Spark source's options and planning without Spark or a broker: delta-spark's names and rules.

What delta-spark does is pinned against delta-spark itself in test_spark_source.py; here the same
rules are checked fast, on plain options, a hand-fed commits index and tables on disk.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from deltamirror.consumer.mirror_changes import MirrorIndex, MirrorSettings, _VersionReader
from deltamirror.consumer.spark.options import KNOWN, REFUSED, SourceOptions
from deltamirror.consumer.spark.planning import initial_offset, next_offset, readable_runs
from deltamirror.consumer.spark.schema_log import (
    SchemaLog,
    TrackedSchema,
    check_unblocked,
    refuse_untracked,
    tracking_folder,
)
from deltamirror.core.changes import ReadSchema
from deltamirror.core.changes.read_schema import is_read_compatible, is_widening
from deltamirror.core.errors import (
    ChangeTimestampAfterLatestError,
    InvalidArgumentError,
    StartingVersionAndTimestampError,
    StreamingNonAdditiveSchemaChangeError,
    StreamingSchemaChangeBlockedError,
    StreamStartNotFoundError,
)
from deltamirror.core.models import Metadata
from deltamirror.core.schema import parse_schema
from deltamirror.core.table import open_table
from deltamirror.mirror.errors import EventStreamError
from deltamirror.mirror.records.events import SCHEMA_VERSION, ActionEvent, CommitSummary
from support.tables import copy_table

DOCS = Path(__file__).resolve().parents[3] / "docs" / "spark.md"
BASE = {"path": "/data/t", "kafka.bootstrap.servers": "b1:9092"}


def _parse(**options: str) -> SourceOptions:
    return SourceOptions.parse({**BASE, **options})


# --- options -------------------------------------------------------------------------------------


def test_delta_spark_options_parse_with_its_meanings_in_any_case() -> None:
    # Spark hands the options over lower-cased
    parsed = SourceOptions.parse(
        {
            **BASE,
            "startingtimestamp": "2024-05-01T12:00:00.250Z",
            "maxfilespertrigger": "7",
            "maxbytespertrigger": "10m",
            "failondataloss": "FALSE",
            "skipchangecommits": "true",
            "readchangefeed": "true",
            "actionstopic": "a.actions",
            "storage.AWS_REGION": "eu",
        }
    )
    assert parsed.starting_version is None
    assert parsed.starting_timestamp_ms == 1714564800250
    assert (parsed.max_files_per_trigger, parsed.max_bytes_per_trigger) == (7, 10 * 1024 * 1024)
    assert parsed.read_limit() == (7, 10 * 1024 * 1024)
    assert parsed.fail_on_data_loss is False
    assert parsed.settings.actions_topic == "a.actions"
    assert dict(parsed.storage_options) == {"AWS_REGION": "eu"}
    # delta-spark's defaults: 1000 files a batch, failOnDataLoss on; a date is midnight UTC
    default = _parse(startingVersion="latest", maxBytesPerTrigger="1g")
    assert default.starting_version == "latest" and default.fail_on_data_loss is True
    assert default.read_limit() == (None, 1 << 30)
    assert _parse().read_limit() == (1000, None)
    assert _parse(startingTimestamp="2024-05-01").starting_timestamp_ms == 1714521600000


@pytest.mark.parametrize(
    ("given", "size"),
    [
        ("1048576", 1048576),
        ("1048576b", 1048576),
        ("  512 ", 512),
        ("1k", 1024),
        ("1kb", 1024),
        ("2m", 2 << 20),
    ],
)
def test_max_bytes_per_trigger_without_a_unit_or_with_b_is_bytes(given: str, size: int) -> None:
    """As delta-spark documents it: ``1048576`` is one MiB, not one GiB."""
    assert _parse(maxBytesPerTrigger=given).max_bytes_per_trigger == size


def test_allow_path_prefixes_reach_the_table_and_the_mirror_reader(tmp_path: Path) -> None:
    """A shallow clone's files live under its source: allowed as the CLI's --allow-path-prefix."""
    parsed = _parse(allowPathPrefixes=f"{tmp_path}/src, file:///data/other")
    assert parsed.allowed_path_prefixes == (f"{tmp_path}/src", "file:///data/other")
    assert parsed.settings.allowed_path_prefixes == parsed.allowed_path_prefixes
    assert parsed.settings.rules().allowed_path_prefixes == parsed.allowed_path_prefixes
    assert _parse(onBadRecord="SKIP").settings.on_bad_record == "skip"
    assert _parse().settings.on_bad_record == "stop"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"allowPathPrefixes": "a,,b"}, r"^option allowPathPrefixes must be locations separated by commas"),
        (
            {"allowPathPrefixes": "s3://bucket/src"},
            r"^option allowPathPrefixes: allowed path prefix 's3://bucket/src' is not on",
        ),
        ({"onBadRecord": "ignore"}, r"^option onBadRecord must be 'stop' or 'skip', got 'ignore'"),
        ({"startingversion": "soon"}, r"^option startingVersion must be a version number, got 'soon'"),
        ({"startingTimestamp": "yesterday"}, r"^option startingTimestamp: invalid timestamp 'yesterday'"),
        ({"maxFilesPerTrigger": "0"}, r"^option maxFilesPerTrigger must be a positive integer, got '0'"),
        ({"maxBytesPerTrigger": "1.5g"}, r"^option maxBytesPerTrigger must be a size such as '10g'"),
        ({"failOnDataLoss": "yes"}, r"^option failOnDataLoss must be 'true' or 'false', got 'yes'"),
        ({"readChangeFeed": "false"}, r"^option readChangeFeed is false, but this source reads only"),
        ({"keyColumns": "id"}, r"^option keyColumns names the columns netChanges tells rows apart by"),
        ({"netChanges": "yes"}, r"^option netChanges must be 'true' or 'false', got 'yes'"),
        ({"netChanges": "true", "keyColumns": "id,"}, r"^option keyColumns must be column names"),
        ({"startingVersoin": "3"}, r"^unknown option 'startingversoin' for format\(\"deltamirror\"\)"),
        (
            {"excludeRegex": ".*"},
            r"^option excludeRegex is not supported by format\(\"deltamirror\"\): filter",
        ),
        ({"endingversion": "4"}, r"^option endingVersion is not supported .*: a stream has no end"),
        (
            {"allowSourceColumnRenameAndDrop": "always"},
            r"^option allowSourceColumnRenameAndDrop is not supported .*only as a SQL configuration",
        ),
        (
            {"allowSourceColumnRename": "always"},
            r"^option allowSourceColumnRename is read only with schemaTr",
        ),
        ({"streamingSourceTrackingId": "a"}, r"^option streamingSourceTrackingId is read only with schemaTr"),
        (
            {"schemaTrackingLocation": "/c", "allowSourceColumnDrop": "yes"},
            r"^option allowSourceColumnDrop must be 'always' or the version of the schema change, got 'yes'",
        ),
        (
            {"schemaTrackingLocation": "/c", "schemaLocation": "/d"},
            r"^options schemaTrackingLocation and schemaLocation name different folders",
        ),
        (
            {"schemaTrackingLocation": "/c", "streamingSourceTrackingId": "a/b"},
            r"^option streamingSourceTrackingId must be letters, digits",
        ),
    ],
)
def test_a_bad_or_unknown_option_is_refused_by_name_on_one_line(
    options: dict[str, str], message: str
) -> None:
    with pytest.raises(InvalidArgumentError, match=message) as err:
        _parse(**options)
    assert err.value.exit_code == 2 and "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("key", "said"),
    [
        ("group.id", "assigns the partitions itself"),
        ("auto.offset.reset", "the ranges its offsets"),
        ("enable.auto.commit", "never in a group"),
        ("enable.auto.offset.store", "never in a group"),
        ("enable.partition.eof", "the end of each partition"),
        ("isolation.level", "read_committed"),
        ("transactional.id", "a producer's property"),
        ("acks", "a producer's property"),
    ],
)
def test_a_kafka_property_the_source_sets_itself_is_refused_by_name(key: str, said: str) -> None:
    """Its readers set these over the options (or, a producer's, ignore them): silently not taken
    before (audit 2026-11-30)."""
    value = "read_uncommitted" if key == "isolation.level" else "x"
    with pytest.raises(InvalidArgumentError) as err:
        _parse(**{f"kafka.{key}": value})
    message = str(err.value)
    assert message.startswith(f'option kafka.{key} is not supported by format("deltamirror"): ')
    assert said in message and err.value.exit_code == 2 and "\n" not in message


def test_both_starting_options_are_refused_with_delta_sparks_class() -> None:
    with pytest.raises(StartingVersionAndTimestampError) as err:
        _parse(startingVersion="1", startingTimestamp="2024-01-01")
    assert str(err.value).startswith("[DELTA_STARTING_VERSION_AND_TIMESTAMP_BOTH_SET]")


def test_the_docs_table_names_every_option_the_source_reads_or_refuses() -> None:
    text = DOCS.read_text()
    table = text[text.index("## Options") :]
    first_cells = [line.split("|")[1] for line in table.splitlines() if line.startswith("| `")]
    named = {name for cell in first_cells for name in re.findall(r"`([^`]+)`", cell)}
    missing = (set(KNOWN.values()) | set(REFUSED)) - named
    assert not missing, f"docs/spark.md has no row for {sorted(missing)}"


# --- type widening (read compatibility) ----------------------------------------------------------


def _types(*types: str) -> list[object]:
    fields = [{"name": f"c{i}", "type": t, "nullable": True, "metadata": {}} for i, t in enumerate(types)]
    return list(parse_schema(json.dumps({"type": "struct", "fields": fields})).fields)


@pytest.mark.parametrize(
    ("old", "new", "widens"),
    [
        ("integer", "long", True),
        ("short", "integer", True),
        ("byte", "long", True),
        ("float", "double", True),
        ("integer", "double", True),
        ("date", "timestamp_ntz", True),
        ("decimal(6,2)", "decimal(12,4)", True),
        ("integer", "decimal(10,0)", True),
        ("long", "decimal(20,0)", True),
        ("long", "integer", False),
        ("double", "float", False),
        ("long", "double", False),
        ("decimal(6,2)", "decimal(6,3)", False),  # fewer integer digits
        ("decimal(6,2)", "decimal(8,1)", False),  # smaller scale
        ("integer", "decimal(9,0)", False),
        ("long", "decimal(19,0)", False),
        ("date", "timestamp", False),
        ("string", "binary", False),
    ],
)
def test_type_widening_is_delta_sparks_list_of_supported_changes(old: str, new: str, widens: bool) -> None:
    (a, b) = _types(old, new)
    assert is_widening(a.type, b.type) is widens  # type: ignore[attr-defined]


def _struct(**fields: object) -> dict[str, object]:
    return {
        "type": "struct",
        "fields": [{"name": n, "type": t, "nullable": True, "metadata": {}} for n, t in fields.items()],
    }


def test_widened_columns_read_compatible_only_where_widening_is_allowed() -> None:
    old = parse_schema(json.dumps(_struct(id="integer", s=_struct(f="float"))))
    new = parse_schema(json.dumps(_struct(id="long", s=_struct(f="double"))))
    assert not is_read_compatible(old, new, forbid_tighten_nullability=True)  # the batch reader's rule
    assert is_read_compatible(old, new, forbid_tighten_nullability=True, allow_widening=True)
    assert not is_read_compatible(new, old, forbid_tighten_nullability=True, allow_widening=True)


# --- planning over a hand-fed commits index --------------------------------------------------------


def _summary(version: int, *, files: int = 1, size: int = 100, cdc: int = 0, snapshot: bool = False) -> bytes:
    return CommitSummary(
        schema_version=SCHEMA_VERSION,
        table_id="id-1",
        table_uri="file:///data/t",
        version=version,
        commit_timestamp=1_000 + version,
        commit_timestamp_source="file-time",
        snapshot=snapshot,
        action_count=files + cdc + 1,
        adds=files,
        removes=0,
        cdc_files=cdc,
        bytes_added=size,
        bytes_removed=0,
    ).to_json_bytes()


def _index(*summaries: bytes) -> MirrorIndex:
    index = MirrorIndex(MirrorSettings("unused:1", "t.actions", "t.commits", "/data/t"))
    for value in summaries:
        index._take(value, b"commit")
    return index


def test_a_micro_batch_takes_whole_versions_and_at_least_one() -> None:
    # versions 1-5: 1, 3 (as cdc files), 1, 0 (metaData only) and 2 files; 100 bytes a file
    index = _index(
        _summary(1),
        _summary(2, files=2, cdc=3, size=300),
        _summary(3),
        _summary(4, files=0, size=0),
        _summary(5, files=2, size=200),
    )
    ends = {limit: index.admit(1, 5, max_files=limit, max_bytes=None) for limit in (1, 2, 4, 5, 7, 100)}
    # 2 files: version 1, then version 2's 3 cdc files do not fit; 4: versions 1-2 fill it exactly
    assert ends == {1: 1, 2: 1, 4: 2, 5: 3, 7: 5, 100: 5}
    assert index.admit(2, 5, max_files=1, max_bytes=None) == 2  # larger than the limit: admitted whole
    assert index.admit(4, 5, max_files=1, max_bytes=None) == 5  # a file-less version fills nothing
    assert index.admit(1, 5, max_files=None, max_bytes=250) == 1
    assert index.admit(1, 5, max_files=None, max_bytes=400) == 2
    assert index.admit(1, 5, max_files=100, max_bytes=500) == 3  # both limits: whichever comes first
    assert index.admit(1, 5, max_files=2, max_bytes=10_000) == 1


def test_next_offset_respects_the_limit_the_available_now_target_and_the_snapshot() -> None:
    index = _index(*(_summary(v) for v in range(0, 6)))
    assert next_offset(index, {"version": 1}, target=None, limit=None) == {"version": 6}
    assert next_offset(index, {"version": 1}, target=None, limit=(2, None)) == {"version": 3}
    assert next_offset(index, {"version": 1}, target=3, limit=(10, None)) == {"version": 4}
    assert next_offset(index, {"version": 4}, target=3, limit=(10, None)) == {"version": 4}  # done
    assert next_offset(index, {"version": 6}, target=None, limit=None) == {"version": 6}  # nothing new
    snapshot = {"version": 2, "snapshot": True}
    assert next_offset(index, snapshot, target=None, limit=(1000, None)) == {"version": 3}
    assert next_offset(index, snapshot, target=None, limit=None) == {"version": 6}


def test_versions_gone_from_the_mirror_fail_or_are_skipped_with_fail_on_data_loss() -> None:
    # the mirror's commits start at 3; 6-7 skipped by a re-snapshot at 8; 10 a snapshot
    index = _index(
        _summary(2, snapshot=True),
        _summary(3),
        _summary(4),
        _summary(5),
        _summary(8, snapshot=True),
        _summary(9),
        _summary(10, snapshot=True),
        _summary(11),
    )
    with pytest.raises(EventStreamError, match=r"versions 1-2 are not in the mirror .*failOnDataLoss"):
        readable_runs(index, 1, 11, fail_on_data_loss=True)
    with pytest.raises(
        EventStreamError, match=r"versions 6-7 are not in the mirror .*re-snapshotted at version 8"
    ):
        readable_runs(index, 4, 9, fail_on_data_loss=True)
    assert readable_runs(index, 4, 5, fail_on_data_loss=True) == [(4, 5)]
    assert readable_runs(index, 1, 11, fail_on_data_loss=False) == [(3, 5), (9, 9), (11, 11)]
    with pytest.raises(EventStreamError, match="not all in the mirror yet"):  # not data loss: never skipped
        readable_runs(index, 9, 12, fail_on_data_loss=False)


def _event(version: int, index: int, count: int) -> bytes:
    return ActionEvent(
        schema_version=SCHEMA_VERSION,
        table_id="id-1",
        table_uri="file:///data/t",
        version=version,
        commit_timestamp=1_000 + version,
        commit_timestamp_source="file-time",
        index=index,
        count=count,
        type="commitInfo",
        snapshot=False,
        action={"operation": "WRITE"},
    ).to_json_bytes()


def _read(start: int, end: int, events: list[bytes], *, skip_lost: bool) -> tuple[list[int], _VersionReader]:
    reader = _VersionReader(
        MirrorSettings("unused:1", "t.actions", "t.commits", "/data/t"),
        "id-1",
        start,
        end,
        skip_lost=skip_lost,
    )
    got = []
    for offset, value in enumerate(events):
        version = reader._take(value, offset)
        if version is not None:
            got.append(version.version)
        if reader.done or reader.overshot:
            break
    return got, reader


def test_records_gone_from_the_actions_topic_are_skipped_only_with_fail_on_data_loss_false() -> None:
    # retention took version 2 and the first action of version 3: the partition starts there
    events = [_event(3, 1, 2), _event(4, 0, 1), _event(5, 0, 2), _event(5, 1, 2)]
    got, reader = _read(2, 5, events, skip_lost=False)
    assert got == [] and reader.overshot  # the caller then fails, naming the versions
    got, reader = _read(2, 5, events, skip_lost=True)
    assert got == [4, 5] and reader.done
    got, reader = _read(2, 3, events, skip_lost=True)  # nothing of the range is left
    assert got == [] and reader.done


# --- where a stream starts, on a table on disk ----------------------------------------------------


@pytest.fixture
def dated_table(tmp_path: Path) -> str:
    """krs__cdf-table (versions 0-3) with commit times 1000, 2000, 3000 and 4000 s after the epoch."""
    path = copy_table("krs__cdf-table", tmp_path)
    for v in range(4):
        os.utime(path / "_delta_log" / f"{v:020d}.json", (1000 * (v + 1), 1000 * (v + 1)))
    return str(path)


def _start(table: str, index: MirrorIndex | None = None, **options: str) -> dict[str, object]:
    parsed = SourceOptions.parse({"path": table, "kafka.bootstrap.servers": "b:9092", **options})
    snapshot = open_table(table).snapshot()
    mirrored = index or _index(*(_summary(v) for v in range(4)))
    return initial_offset(parsed, mirrored, ReadSchema(snapshot.metadata, snapshot.version))


def test_starting_version_must_exist_and_latest_starts_after_the_last_commit(dated_table: str) -> None:
    index = _index(*(_summary(v) for v in range(3)))  # the watcher lags: version 3 is not mirrored yet
    assert _start(dated_table, index, startingVersion="3") == {"version": 3}  # the rows wait for it
    assert _start(dated_table, index, startingVersion="latest") == {"version": 4}
    with pytest.raises(StreamStartNotFoundError) as err:
        _start(dated_table, index, startingVersion="4")
    assert str(err.value).startswith("[DELTA_VERSION_NOT_FOUND] startingVersion 4 does not exist")
    assert _start(dated_table, index) == {"version": 2, "snapshot": True}


@pytest.mark.parametrize(
    ("timestamp", "version"),
    [
        ("1970-01-01T00:33:20Z", 1),  # version 1's time exactly (2000 s)
        ("1970-01-01T00:33:20.001Z", 2),  # just after it: the next commit
        ("1970-01-01T00:53:21+00:20", 2),  # 2001 s, with an offset
        ("1970-01-01", 0),  # before every commit: the first one
        ("1970-01-01T01:06:40Z", 3),  # the last commit's time
    ],
)
def test_starting_timestamp_starts_at_the_first_commit_at_or_after_it(
    dated_table: str, timestamp: str, version: int
) -> None:
    assert _start(dated_table, startingTimestamp=timestamp) == {"version": version}


def test_a_starting_timestamp_after_the_last_commit_fails_as_in_delta_spark(dated_table: str) -> None:
    with pytest.raises(ChangeTimestampAfterLatestError) as err:
        _start(dated_table, startingTimestamp="1970-01-01T01:06:40.001Z")
    assert str(err.value).startswith("[DELTA_TIMESTAMP_GREATER_THAN_COMMIT]")


# --- a data file gone from storage, in a task ------------------------------------------------------


def test_a_missing_data_file_fails_naming_it_or_its_rows_are_skipped(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from deltamirror.consumer.spark.rows import change_rows
    from deltamirror.core.changes import VersionActions
    from deltamirror.core.errors import DataFileNotFoundError

    path = copy_table("krs__cdf-table", tmp_path)  # version 0 adds 10 files, versions 1-3 use cdc files
    table = open_table(str(path))
    stamps = {t.version: t.timestamp for t in table.commit_timestamps()}
    versions = [
        VersionActions(v, stamps[v], [next(iter(a.items())) for a in table.read_commit(v)]) for v in range(4)
    ]
    snapshot = table.snapshot()
    read = ReadSchema(snapshot.metadata, snapshot.version)
    everything = pa.Table.from_batches(list(change_rows(table, read, versions, fail_on_data_loss=True)))
    gone = "birthday=2023-12-22/part-00000-592a7e14-f790-4236-9c61-120d006eb3b8.c000.snappy.parquet"
    lost_rows = pq.read_table(path / gone).num_rows
    os.remove(path / gone)  # as VACUUM would, version 1 having removed it

    with pytest.raises(DataFileNotFoundError, match="failOnDataLoss") as err:
        list(change_rows(table, read, versions, fail_on_data_loss=True))
    assert err.value.file == gone and err.value.version == 0
    skipped = pa.Table.from_batches(list(change_rows(table, read, versions, fail_on_data_loss=False)))
    assert lost_rows > 0 and skipped.num_rows == everything.num_rows - lost_rows
    later = everything.filter(pc.greater(everything["_commit_version"], 0))
    assert skipped.filter(pc.greater(skipped["_commit_version"], 0)).equals(later)


def test_a_refused_record_stops_the_stream_once_the_versions_before_it_are_planned() -> None:
    from deltamirror.mirror.records.boundary import BadRecordError

    index = _index(*(_summary(v) for v in range(3)))
    index.refused = BadRecordError("forged", topic="t.commits", partition=0, offset=3)
    assert next_offset(index, {"version": 0}, target=None, limit=(1, None)) == {"version": 1}
    assert next_offset(index, {"version": 1}, target=None, limit=None) == {"version": 3}
    with pytest.raises(BadRecordError, match="offset=3"):
        next_offset(index, {"version": 3}, target=None, limit=None)


# --- the columns option: what a task reads --------------------------------------------------------


def test_the_columns_option_is_names_separated_by_commas() -> None:
    assert _parse().columns is None
    assert _parse(columns=" amount , ID").columns == ("amount", "ID")
    for bad in ("", "id,,name", "id,"):
        with pytest.raises(InvalidArgumentError, match=r"^option columns must be column names") as err:
            _parse(columns=bad)
        assert "\n" not in str(err.value)


def _mirrored(tmp_path: Path, name: str) -> tuple[object, ReadSchema, list[object]]:
    from deltamirror.core.changes import VersionActions

    path = copy_table(name, tmp_path)
    table = open_table(str(path))
    stamps = {t.version: t.timestamp for t in table.commit_timestamps()}
    snapshot = table.snapshot()
    versions = [
        VersionActions(v, stamps[v], [next(iter(a.items())) for a in table.read_commit(v)])
        for v in range(snapshot.version + 1)
    ]
    return table, ReadSchema(snapshot.metadata, snapshot.version), versions


def test_a_task_decodes_only_the_columns_option_and_gives_the_full_reads_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The source's tasks (change rows of mirrored versions, and the initial snapshot) pass the
    columns to the Parquet reader: the others are never decoded."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from deltamirror.consumer.spark.rows import change_rows, feed_schema, snapshot_rows

    table, read, versions = _mirrored(tmp_path, "krs__cdf-table")  # partitioned by birthday; cdc files
    columns = ["birthday", "name"]  # a partition column, a data column; "id" left out
    cdf = ["_change_type", "_commit_version", "_commit_timestamp"]
    full = pa.Table.from_batches(list(change_rows(table, read, versions, fail_on_data_loss=True)))
    last = read.version
    full_snapshot = pa.Table.from_batches(list(snapshot_rows(table, read, last, 0)))

    asked: list[list[str] | None] = []
    real = pq.ParquetFile.iter_batches

    def iter_batches(pf: pq.ParquetFile, *args: object, **kw: object) -> object:
        asked.append(kw.get("columns"))  # type: ignore[arg-type]
        return real(pf, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", iter_batches)
    some = pa.Table.from_batches(
        list(change_rows(table, read, versions, fail_on_data_loss=True, columns=columns))
    )
    assert feed_schema(table, read, columns).names == [*columns, *cdf] == some.schema.names
    assert some.num_rows and some.to_pylist() == full.select(some.schema.names).to_pylist()
    some_snapshot = pa.Table.from_batches(list(snapshot_rows(table, read, last, 0, columns)))
    assert some_snapshot.to_pylist() == full_snapshot.select(some_snapshot.schema.names).to_pylist()
    data_reads = [a for a in asked if a != ["add"]]  # the checkpoint's reads are the log's
    assert data_reads and all(a is not None and "id" not in a for a in data_reads), data_reads


def test_an_unknown_column_in_the_columns_option_is_refused_naming_it(tmp_path: Path) -> None:
    from deltamirror.consumer.spark.rows import feed_schema
    from deltamirror.core.errors import UnknownColumnError

    table, read, _ = _mirrored(tmp_path, "krs__cdf-table")
    with pytest.raises(UnknownColumnError) as err:
        feed_schema(table, read, ["name", "nope"])  # type: ignore[arg-type]
    assert err.value.column == "nope" and "\n" not in str(err.value)


def test_the_row_ids_option_adds_delta_spark_row_ids_to_change_and_snapshot_rows() -> None:
    """rowIds: the tasks' rows carry the row ids read_changes gives (checked there against
    delta-spark's _metadata.row_id), after the three change-feed columns; refused without row tracking."""
    import pyarrow as pa

    from deltamirror.consumer.spark.rows import change_rows, feed_schema, snapshot_rows
    from deltamirror.core.changes import VersionActions, read_changes
    from deltamirror.core.errors import InvalidArgumentError as Refused
    from support.corpus import CORPUS, normal_rows

    assert _parse().row_ids is False and _parse(rowIds="TRUE").row_ids is True
    with pytest.raises(InvalidArgumentError, match="rowIds"):
        _parse(rowIds="maybe")
    # netChanges with rowIds tells rows apart by _row_id unless keyColumns says otherwise
    assert _parse(rowIds="true", netChanges="true").key_columns == ("_row_id",)
    assert _parse(rowIds="true", netChanges="true", keyColumns="id").key_columns == ("id",)
    assert _parse(netChanges="true").key_columns is None
    table = open_table(str(CORPUS / "tables" / "spark__row_ids_dv"))
    stamps = {t.version: t.timestamp for t in table.commit_timestamps()}
    snapshot = table.snapshot()
    read = ReadSchema(snapshot.metadata, snapshot.version)
    versions = [
        VersionActions(v, stamps[v], [next(iter(a.items())) for a in table.read_commit(v)])
        for v in range(snapshot.version + 1)
    ]
    schema = feed_schema(table, read, row_ids=True)
    assert schema.names[-5:] == [
        "_change_type",
        "_commit_version",
        "_commit_timestamp",
        "_row_id",
        "_row_commit_version",
    ]
    rows = pa.Table.from_batches(
        list(change_rows(table, read, versions, fail_on_data_loss=True, row_ids=True))
    )
    expected = read_changes(table, starting_version=0, row_ids=True).to_arrow()
    assert rows.num_rows and normal_rows(rows.to_pylist()) == normal_rows(expected.to_pylist())
    snap = pa.Table.from_batches(
        list(snapshot_rows(table, read, snapshot.version, 0, ["name"], row_ids=True))
    )
    assert snap.schema.names == [
        "name",
        "_change_type",
        "_commit_version",
        "_commit_timestamp",
        "_row_id",
        "_row_commit_version",
    ]
    oracle = json.loads((CORPUS / "expected" / "spark__row_ids_dv.json").read_text())
    latest = oracle["versions"][str(snapshot.version)]["rows_with_row_ids"]
    assert sorted((r["name"], r["_row_id"], r["_row_commit_version"]) for r in snap.to_pylist()) == sorted(
        (r["name"], r["row_id"], r["row_commit_version"]) for r in latest
    )
    plain = open_table(str(CORPUS / "tables" / "spark__dml"))
    with pytest.raises(Refused, match="row tracking"):
        feed_schema(plain, ReadSchema(plain.snapshot().metadata, 0), row_ids=True)


# --- the schema tracking log (schemaTrackingLocation) ---------------------------------------------


def _cm_metadata(*columns: tuple[str, int]) -> Metadata:
    """Metadata of a column-mapping ('name') table with change data on: (name, column id) per column."""
    fields = [
        {
            "name": name,
            "type": "string",
            "nullable": True,
            "metadata": {"delta.columnMapping.id": cid, "delta.columnMapping.physicalName": f"col-{cid}"},
        }
        for name, cid in columns
    ]
    return Metadata.model_validate(
        {
            "id": "t-1",
            "format": {"provider": "parquet", "options": {}},
            "schemaString": json.dumps({"type": "struct", "fields": fields}),
            "partitionColumns": [],
            "configuration": {"delta.columnMapping.mode": "name", "delta.enableChangeDataFeed": "true"},
        }
    )


def test_the_schema_log_keeps_whole_entries_per_table_and_tracking_id(tmp_path: Path) -> None:
    v0 = _cm_metadata(("id", 1), ("name", 2))
    v2 = _cm_metadata(("id", 1), ("label", 2))
    log = SchemaLog.at(tmp_path, "t-1", None, "/data/t")
    assert log.latest() is None
    log.append(0, v0)
    assert log.append(0, v0).seq == 0  # the same schema at the same version: nothing new
    log.append(2, v2)
    assert [(e.seq, e.version, [f.name for f in e.metadata.table_schema.fields]) for e in log.entries()] == [
        (0, 0, ["id", "name"]),
        (1, 2, ["id", "label"]),
    ]
    assert sorted(p.name for p in log.folder.iterdir()) == ["0", "1"]  # no temporary left
    assert SchemaLog.at(tmp_path, "t-1", "second", "/data/t").latest() is None  # another stream's log
    (log.folder / "1").write_text("v9\n{}")
    with pytest.raises(InvalidArgumentError, match="cannot be read"):
        log.entries()


def test_a_tracked_rename_or_drop_needs_its_option_and_an_untracked_one_is_refused() -> None:
    v0 = _cm_metadata(("id", 1), ("name", 2), ("amount", 3))
    v2 = _cm_metadata(("id", 1), ("label", 2), ("amount", 3))
    v4 = _cm_metadata(("id", 1), ("label", 2))
    entries = [TrackedSchema(0, 0, v0), TrackedSchema(1, 2, v2)]
    with pytest.raises(
        StreamingSchemaChangeBlockedError, match=r"'name' renamed to 'label'.*allowSourceColumnRename"
    ):
        check_unblocked(entries, {}, "/data/t")
    with pytest.raises(StreamingSchemaChangeBlockedError):
        check_unblocked(entries, {"allowSourceColumnRename": "3"}, "/data/t")  # another version's
    with pytest.raises(StreamingSchemaChangeBlockedError, match="allowSourceColumnDrop"):
        check_unblocked([*entries, TrackedSchema(2, 4, v4)], {"allowSourceColumnRename": "always"}, "/data/t")
    check_unblocked(entries, {"allowSourceColumnRename": "2"}, "/data/t")
    check_unblocked([*entries, TrackedSchema(2, 4, v4)], {"allowSourceColumnDrop": "always"}, "/data/t")
    # without a log: read with v2's schema, a version of v0's or v4's is refused, v2's is not
    for version, metadata in ((0, v0), (4, v4)):
        with pytest.raises(StreamingNonAdditiveSchemaChangeError, match="schemaTrackingLocation"):
            refuse_untracked(v2, 2, metadata, version, "/data/t")
    refuse_untracked(v2, 2, v2, 2, "/data/t")


@pytest.mark.parametrize("location", ["s3://bucket/cp/schema", "", "hdfs://nn/cp"])
def test_a_tracking_location_that_is_no_local_folder_is_refused(location: str) -> None:
    with pytest.raises(InvalidArgumentError, match="schemaTracking"):
        tracking_folder(location, "/data/t") if location else _parse(schemaTrackingLocation=location)


def test_tracking_folders_as_paths_and_file_uris() -> None:
    assert tracking_folder("file:///cp/s", "/t") == Path("/cp/s") == tracking_folder("/cp/s", "/t")
    parsed = _parse(schemaLocation="/cp/s", streamingSourceTrackingId="a-1", allowSourceColumnRename="always")
    assert parsed.schema_tracking_location == "/cp/s" and parsed.tracking_id == "a-1"
    assert dict(parsed.unblock) == {"allowSourceColumnRename": "always"}
