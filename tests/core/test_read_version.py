"""The one core call a tailing reader makes per version: read, validated, checked as a whole, timed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from deltamirror.core import commits, errors
from deltamirror.core.commits import TimestampTracker, read_version, version_actions
from deltamirror.core.log import commit_name
from deltamirror.core.storage import TableStorage
from deltamirror.core.timestamps import IctConfig, TimestampSource

SCHEMA = json.dumps(
    {"type": "struct", "fields": [{"name": "id", "type": "long", "nullable": True, "metadata": {}}]}
)


def _metadata(schema: str = SCHEMA, configuration: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metaData": {
            "id": "6f0b0b1c-1d7b-4c56-9e83-6c1d2f0d9a11",
            "format": {"provider": "parquet", "options": {}},
            "schemaString": schema,
            "partitionColumns": [],
            "configuration": configuration or {},
            "createdTime": 1,
        }
    }


def _add(n: int) -> dict[str, Any]:
    return {
        "add": {
            "path": f"part-{n}.parquet",
            "partitionValues": {},
            "size": 10 + n,
            "modificationTime": 1,
            "dataChange": True,
        }
    }


def _table(tmp_path: Path, *versions: list[dict[str, Any]]) -> TableStorage:
    log = tmp_path / "t" / "_delta_log"
    log.mkdir(parents=True)
    for version, actions in enumerate(versions):
        (log / commit_name(version)).write_text("".join(json.dumps(a) + "\n" for a in actions))
    return TableStorage(str(tmp_path / "t"))


def _info(storage: TableStorage, version: int) -> Any:
    return storage.info(storage.log_file(commit_name(version)))


def _v0() -> list[dict[str, Any]]:
    return [{"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}}, _metadata(), _add(0)]


def test_a_version_comes_back_validated_with_its_own_protocol_and_metadata_as_models(tmp_path: Path) -> None:
    storage = _table(tmp_path, _v0(), [{"commitInfo": {"operation": "WRITE"}}, _add(1), _add(2)])
    first = read_version(storage, 0, _info(storage, 0))
    assert first.protocol is not None and first.protocol.min_reader_version == 1
    assert first.metadata is not None and first.in_force is first.metadata
    second = read_version(storage, 1, _info(storage, 1), in_force=first.metadata)
    assert (second.count, second.protocol, second.metadata) == (3, None, None)
    assert second.in_force is first.metadata and second.commit_info == {"operation": "WRITE"}
    assert second.timestamp is None  # no tracker given: the caller times it
    assert [name for name, _ in version_actions(storage, second)] == ["commitInfo", "add", "add"]


def test_the_tracker_resolves_the_commit_timestamp_and_learns_ict_from_the_versions_own_metadata(
    tmp_path: Path,
) -> None:
    ict_on = _metadata(configuration={"delta.enableInCommitTimestamps": "true"})
    storage = _table(tmp_path, _v0(), [{"commitInfo": {"inCommitTimestamp": 1_700_000_000_000}}, ict_on])
    tracker = TimestampTracker(IctConfig.from_configuration({}))
    read_version(storage, 0, _info(storage, 0), timestamps=tracker)
    checked = read_version(storage, 1, _info(storage, 1), timestamps=tracker)
    assert checked.timestamp is not None
    assert (checked.timestamp.timestamp, checked.timestamp.source) == (1_700_000_000_000, TimestampSource.ICT)


def test_a_protocol_needing_an_unsupported_reader_feature_is_refused_by_its_name(tmp_path: Path) -> None:
    protocol = {
        "protocol": {
            "minReaderVersion": 3,
            "minWriterVersion": 7,
            "readerFeatures": ["madeUpFeature"],
            "writerFeatures": ["madeUpFeature"],
        }
    }
    storage = _table(tmp_path, _v0(), [protocol])
    with pytest.raises(errors.UnsupportedFeatureError, match="madeUpFeature") as caught:
        read_version(storage, 1, _info(storage, 1))
    assert caught.value.version == 1


def test_a_metadata_with_a_type_no_feature_brings_is_refused_naming_file_and_line(tmp_path: Path) -> None:
    bad = json.dumps(
        {"type": "struct", "fields": [{"name": "x", "type": "madeUpType", "nullable": True, "metadata": {}}]}
    )
    storage = _table(tmp_path, _v0(), [{"commitInfo": {}}, _metadata(schema=bad)])
    with pytest.raises(errors.CorruptLogError, match="schemaString") as caught:
        read_version(storage, 1, _info(storage, 1))
    assert caught.value.file is not None and caught.value.file.endswith(commit_name(1))
    assert caught.value.line == 2


def test_an_empty_commit_is_refused(tmp_path: Path) -> None:
    storage = _table(tmp_path, _v0(), [])
    with pytest.raises(errors.CorruptLogError, match="no actions"):
        read_version(storage, 1, _info(storage, 1))


def test_a_large_commit_is_streamed_twice_and_gives_the_same_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = _table(tmp_path, _v0(), [{"commitInfo": {}}, *(_add(n) for n in range(50))])
    small = read_version(storage, 1, _info(storage, 1))
    monkeypatch.setattr(commits, "SMALL_COMMIT_BYTES", 10)
    seen: list[str] = []
    large = read_version(
        storage, 1, _info(storage, 1), observe=lambda run: seen.extend([run.name] * len(run))
    )
    assert small.actions is not None and large.actions is None
    assert large.count == small.count == len(seen) == 51
    assert list(version_actions(storage, large)) == list(version_actions(storage, small)) == small.actions
