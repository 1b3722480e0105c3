"""The Spark source's per-version checks without Spark: a protocol a mirrored version sets is held to
core's feature rule (refused by the feature's name, as every reader of deltamirror refuses it)."""

from __future__ import annotations

import json

import pytest

from deltamirror.consumer.spark.rows import checked_versions
from deltamirror.core.changes import ReadSchema, VersionActions
from deltamirror.core.errors import UnsupportedFeatureError
from deltamirror.core.models import Metadata

SCHEMA = {"type": "struct", "fields": [{"name": "id", "type": "long", "nullable": True, "metadata": {}}]}
METADATA = Metadata.model_validate(
    {
        "id": "t",
        "format": {"provider": "parquet", "options": {}},
        "schemaString": json.dumps(SCHEMA),
        "partitionColumns": [],
        "configuration": {"delta.enableChangeDataFeed": "true"},
    }
)
READ = ReadSchema(METADATA, 0)


def _protocol(*reader_features: str) -> tuple[str, dict[str, object]]:
    return (
        "protocol",
        {
            "minReaderVersion": 3,
            "minWriterVersion": 7,
            "readerFeatures": list(reader_features),
            "writerFeatures": list(reader_features),
        },
    )


def test_a_version_setting_a_readable_protocol_passes() -> None:
    (version,) = checked_versions([VersionActions(1, 5, [_protocol("deletionVectors")])], READ, "file:///t")
    assert version.version == 1 and [name for name, _ in version.actions] == ["protocol"]


def test_a_version_setting_an_unsupported_reader_feature_is_refused_by_its_name() -> None:
    versions = checked_versions([VersionActions(2, 5, [_protocol("someFutureFeature")])], READ, "file:///t")
    with pytest.raises(UnsupportedFeatureError) as info:
        list(versions)
    assert info.value.feature == "someFutureFeature" and info.value.version == 2
    assert info.value.table == "file:///t"
