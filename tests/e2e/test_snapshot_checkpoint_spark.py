"""delta-spark opens the snapshot consumer's checkpoint folder as the table at the state's version
and reads the original table's data through it (absolute paths, ``p`` deletion vectors)."""

from __future__ import annotations

import json
import shutil
import urllib.parse
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from deltamirror.consumer.snapshot import IncrementalSnapshot, StateStore
from deltamirror.core.table import open_table
from deltamirror.producer.publishing.offline_events import iter_event_values
from support.tables import TABLES

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@pytest.mark.spark
@pytest.mark.timeout(300)
def test_delta_spark_reads_the_table_through_the_checkpoint_folder(
    spark: SparkSession, tmp_path: Path
) -> None:
    # deletion vectors and partitions, at a location whose URI needs percent-encoding
    table = tmp_path / "a table #1 %20"
    shutil.copytree(TABLES / "golden__dv-partitioned-with-checkpoint", table)
    original = open_table(str(table)).snapshot()
    values = list(iter_event_values(str(table)))
    state = IncrementalSnapshot(json.loads(values[0])["tableId"])
    state.apply_values(values)
    store = StateStore(tmp_path / "state", "t.actions")
    store.save([state], {0: len(values)})
    folder = store.folder(state.table_id)

    df = spark.read.format("delta").load(str(folder))
    on_disk = {str(table / urllib.parse.unquote(p)) for p in original.files["path"].to_pylist()}
    # Hadoop paths print decoded: file:/dir/a table #1 %20/part=0/...
    assert {f.removeprefix("file:") for f in df.inputFiles()} == on_disk
    assert df.count() == original.to_arrow().num_rows  # the deletion vectors applied
    (detail,) = spark.sql(f"DESCRIBE DETAIL delta.`{folder}`").select("numFiles").collect()
    assert detail.numFiles == original.files.num_rows
    history = spark.sql(f"DESCRIBE HISTORY delta.`{folder}`").select("version").collect()
    assert [row.version for row in history] == [original.version]

    # the marker commit is what delta-spark needs: without it, it refuses the log
    bare = tmp_path / "bare"
    shutil.copytree(folder, bare)
    (bare / "_delta_log" / f"{state.version:020d}.json").unlink()
    with pytest.raises(Exception, match="Could not find any delta files"):
        spark.read.format("delta").load(str(bare)).count()
