"""Log listing and segments: which checkpoint is used, hints, gaps, cleaned-up logs, listing cost."""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path
from typing import Any

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFileSystem

from deltamirror.core import errors
from deltamirror.core.commits import probe_next_versions
from deltamirror.core.log import LogListing, build_segment
from deltamirror.core.storage import FileInfo, TableStorage, normalize_table_uri
from deltamirror.core.table import open_table
from support.tables import TABLES, copy_table


def _names(*names: str) -> list[FileInfo]:
    return [FileInfo(n, 1, 0) for n in names]


def test_incomplete_multipart_checkpoint_is_ignored() -> None:
    listing = LogListing.from_files(
        _names(
            "00000000000000000010.checkpoint.0000000001.0000000003.parquet",
            "00000000000000000010.checkpoint.0000000002.0000000003.parquet",
            "00000000000000000005.checkpoint.parquet",
        )
    )
    assert sorted(listing.checkpoints) == [5]


def test_checkpoint_preference_at_one_version() -> None:
    v = "00000000000000000010"
    classic = f"{v}.checkpoint.parquet"
    parts = [f"{v}.checkpoint.000000000{i}.0000000002.parquet" for i in (1, 2)]
    v2 = f"{v}.checkpoint.3a0d65cd-4056-49b8-937b-95f9e3ee90e5.json"
    assert LogListing.from_files(_names(classic, *parts)).checkpoints[10].kind == "multipart"
    assert LogListing.from_files(_names(classic, *parts, v2)).checkpoints[10].kind == "v2"
    assert LogListing.from_files(_names(classic)).checkpoints[10].kind == "classic"


def test_hadoop_crc_and_other_files_are_not_versions() -> None:
    listing = LogListing.from_files(
        _names(
            ".00000000000000000000.json.crc",
            "00000000000000000000.crc",
            "_last_checkpoint",
            "._00000000000000000000.json",
        )
    )
    assert listing.versions == []
    assert list(listing.checksums) == [0]


@pytest.mark.parametrize(
    "hint", ["", "{not json", '{"version": 999, "size": 1}', '{"version": 1, "size": 1}']
)
def test_last_checkpoint_is_only_a_hint(tmp_path: Path, hint: str) -> None:
    """Empty, corrupt, ahead-of-the-log and stale hints all give the same, right answer."""
    path = copy_table("drs__table_failed_last_checkpoint_update", tmp_path)
    expected = open_table(str(path)).snapshot()
    (path / "_delta_log" / "_last_checkpoint").chmod(0o644)
    (path / "_delta_log" / "_last_checkpoint").write_text(hint)
    snap = open_table(str(path)).snapshot()
    assert snap.version == expected.version
    assert sorted(snap.files["path"].to_pylist()) == sorted(expected.files["path"].to_pylist())


def test_missing_last_checkpoint(tmp_path: Path) -> None:
    path = copy_table("golden__basic-with-inserts-deletes-checkpoint", tmp_path)
    expected = open_table(str(path)).snapshot()
    (path / "_delta_log" / "_last_checkpoint").unlink()
    snap = open_table(str(path)).snapshot()
    assert snap.segment.checkpoint is not None
    assert sorted(snap.files["path"].to_pylist()) == sorted(expected.files["path"].to_pylist())


def test_gap_after_checkpoint_names_the_missing_version(tmp_path: Path) -> None:
    path = copy_table("golden__basic-with-inserts-deletes-checkpoint", tmp_path)
    segment = build_segment(TableStorage(str(path)))
    assert segment.checkpoint is not None
    missing = segment.checkpoint.version + 2
    (path / "_delta_log" / f"{missing:020d}.json").unlink()
    with pytest.raises(errors.LogGapError) as info:
        open_table(str(path)).snapshot()
    assert info.value.version == missing
    assert f"{missing:020d}.json" in str(info.value)


def test_versions_before_a_checkpoint_may_be_cleaned_up() -> None:
    table = open_table(str(TABLES / "drs__checkpoints_vacuumed"))
    snap = table.snapshot()
    assert snap.segment.checkpoint is not None
    with pytest.raises(errors.VersionNotFoundError) as info:
        table.snapshot(version=2)
    assert "cleaned up" in str(info.value)


def test_checkpoint_only_table() -> None:
    snap = open_table(str(TABLES / "drs__table-with-domain-metadata")).snapshot(check_features=False)
    assert snap.version == 108
    assert snap.segment.commits == ()
    assert snap.domains  # clustering / rowTracking domains come from the checkpoint


def test_time_travel_by_version_and_timestamp(tmp_path: Path) -> None:
    path = copy_table("golden__snapshot-data2-deleted", tmp_path)
    table = open_table(str(path))
    stamps = table.commit_timestamps()
    for ts in stamps:
        assert table.version_at(ts.timestamp) == ts.version
        assert table.snapshot(timestamp=ts.iso).version == ts.version
    with pytest.raises(errors.TimestampOutOfRangeError):
        table.snapshot(timestamp=stamps[-1].timestamp + 1)
    with pytest.raises(errors.TimestampOutOfRangeError):
        table.snapshot(timestamp=stamps[0].timestamp - 1)


def test_uri_normalization(tmp_path: Path) -> None:
    a = normalize_table_uri(str(tmp_path / "t"))
    assert a == normalize_table_uri(f"file://{tmp_path}/t/") == normalize_table_uri(f"{tmp_path}/./t")
    with pytest.raises(errors.InvalidTableUriError):
        normalize_table_uri("nosuchproto://bucket/t")
    with pytest.raises(errors.InvalidTableUriError):
        normalize_table_uri("  ")


def test_memory_filesystem_table() -> None:
    """Any fsspec URL works: the same table copied into memory:// reads the same."""
    src = TABLES / "golden__basic-with-inserts-deletes-checkpoint"
    root = f"memory://conformance-{uuid.uuid4().hex}"
    fs = fsspec.filesystem("memory")
    for f in src.rglob("*"):
        if f.is_file():
            fs.pipe(f"{root}/{f.relative_to(src).as_posix()}", f.read_bytes())
    ours = open_table(root).snapshot()
    local = open_table(str(src)).snapshot()
    assert ours.version == local.version
    assert sorted(ours.files["path"].to_pylist()) == sorted(local.files["path"].to_pylist())
    assert ours.to_arrow().num_rows == local.to_arrow().num_rows


# --- listing cost -------------------------------------------------------------------------------


class CountingPrefixFS(MemoryFileSystem):
    """A memory store that filters by prefix server-side, like s3/gcs/abfs, and counts what it returns."""

    protocol = "countingprefix"
    returned = 0
    root_marker = ""

    def find(
        self,
        path: str,
        maxdepth: int | None = None,
        withdirs: bool = False,
        detail: bool = False,
        prefix: str = "",
        **kw: Any,
    ) -> Any:  # type: ignore[override]
        out = {
            k: v
            for k, v in super().find(path, maxdepth=maxdepth, withdirs=withdirs, detail=True).items()
            if k.rsplit("/", 1)[-1].startswith(prefix)
        }
        CountingPrefixFS.returned += len(out)
        return out if detail else list(out)


def _long_log(n: int) -> str:
    fsspec.register_implementation("countingprefix", CountingPrefixFS, clobber=True)
    root = f"countingprefix://long-{uuid.uuid4().hex}"
    fs = fsspec.filesystem("countingprefix")
    meta = {
        "metaData": {
            "id": "x",
            "format": {"provider": "parquet"},
            "schemaString": '{"type":"struct","fields":[]}',
            "partitionColumns": [],
            "configuration": {},
        }
    }
    proto = {"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}}
    for v in range(n):
        lines = [proto, meta] if v == 0 else [{"commitInfo": {"timestamp": v}}]
        fs.pipe(f"{root}/_delta_log/{v:020d}.json", "\n".join(json.dumps(x) for x in lines).encode())
    return root


def test_listing_after_a_version_does_not_read_the_whole_log() -> None:
    root = _long_log(2_500)
    storage = TableStorage(root)
    CountingPrefixFS.returned = 0
    found = [f.name for f in storage.iter_log_from(2_400)]
    assert found[0] == f"{2_400:020d}.json" and len(found) == 100
    # one block of 1,000 names at most, not 2,500
    assert CountingPrefixFS.returned <= 1_000


def test_probing_for_new_versions_costs_one_request_per_version() -> None:
    root = _long_log(300)
    storage = TableStorage(root)
    assert [v for v, _ in probe_next_versions(storage, 295)] == [296, 297, 298, 299]
    assert probe_next_versions(storage, 299) == []


def test_not_a_table(tmp_path: Path) -> None:
    with pytest.raises(errors.TableNotFoundError):
        open_table(str(tmp_path)).snapshot()
    (tmp_path / "_delta_log").mkdir()
    with pytest.raises(errors.TableNotFoundError):
        open_table(str(tmp_path)).snapshot()


def test_corrupt_commit_names_file_and_line(tmp_path: Path) -> None:
    path = copy_table("golden__snapshot-data1", tmp_path)
    f = path / "_delta_log" / f"{1:020d}.json"
    f.chmod(0o644)
    lines = f.read_text().splitlines()
    lines.insert(1, '{"add": {"path": "x"')
    f.write_text("\n".join(lines))
    with pytest.raises(errors.CorruptLogError) as info:
        open_table(str(path)).snapshot()
    assert info.value.line == 2 and info.value.file is not None and f.name in info.value.file


def test_copy_helper_is_independent(tmp_path: Path) -> None:
    path = copy_table("golden__snapshot-data0", tmp_path)
    shutil.rmtree(path / "_delta_log")
    assert (TABLES / "golden__snapshot-data0" / "_delta_log").exists()


def test_a_lone_surrogate_escape_is_refused_naming_the_line(tmp_path: Path) -> None:
    """Not JSON a strict reader accepts (nor text any consumer can encode): refused, never kept."""
    path = copy_table("golden__snapshot-data0", tmp_path)
    f = path / "_delta_log" / f"{0:020d}.json"
    f.chmod(0o644)
    lines = f.read_text().splitlines()
    f.write_text("\n".join([*lines, '{"commitInfo": {"operation": "WRITE", "note": "\\ud800"}}']) + "\n")
    with pytest.raises(errors.CorruptLogError) as info:
        open_table(str(path)).read_commit(0)
    assert info.value.line == len(lines) + 1 and info.value.message.startswith("invalid JSON")


def test_local_listing_matches_fsspec(tmp_path: Path) -> None:
    """The local scandir listing gives what fsspec's listing gives: names, sizes, times; no folders, no .crc."""
    path = copy_table("drs__simple_table_with_checkpoint", tmp_path)
    log = path / "_delta_log"
    (log / "subfolder").mkdir()
    (log / ".00000000000000000000.json.crc").write_text("x")
    storage = TableStorage(str(path))
    fs = fsspec.filesystem("file")
    expected = sorted(
        (e["name"].rsplit("/", 1)[-1], int(e["size"]), int(e["mtime"] * 1000))
        for e in fs.ls(str(log), detail=True)
        if e["type"] == "file" and not e["name"].endswith(".crc")
    )
    got = [(f.name, f.size, f.modification_time) for f in storage.list_log()]
    assert got == expected and got
    assert [f.name for f in storage.list_dir(str(log), "0000000000000000000")] == [
        n for n, _, _ in expected if n.startswith("0000000000000000000")
    ]
    assert storage.list_dir(str(tmp_path / "absent")) == []


def test_only_named_actions_are_decoded_with_their_own_line_numbers() -> None:
    from deltamirror.core.actions import iter_values, read_actions

    protocol = b'{"protocol":{"minReaderVersion":1,"minWriterVersion":2}}'
    meta = {"id": "x", "format": {"provider": "parquet"}, "partitionColumns": [], "configuration": {}}
    data = b'{"add":{"path":"a"}}\n' + json.dumps({"metaData": meta}).encode()
    # a line of one action by its shape: passed over, its body left to the readers of txn
    data += b'\n{"txn": not json at all}\n\n' + protocol + b"\n"
    runs = read_actions(data, table="t", file="f", only=(b'"metaData"', b'"protocol"'))
    assert list(iter_values(runs)) == [
        (2, "metaData", meta),
        (5, "protocol", {"minReaderVersion": 1, "minWriterVersion": 2}),
    ]
    with pytest.raises(errors.CorruptLogError) as info:  # a named line that is not JSON still fails
        list(read_actions(b'{"add":{}}\n{"metaData": oops}\n', table="t", file="f", only=(b'"metaData"',)))
    assert info.value.line == 2
    with pytest.raises(errors.CorruptLogError) as info:  # and a line that is no action line at all
        list(read_actions(b'{"add":{}}\n42\n', table="t", file="f", only=(b'"metaData"',)))
    assert info.value.line == 2
    with pytest.raises(errors.CorruptLogError) as info:  # nor one cut short, whatever it was
        cut = b'{"add":{}}\n{"txn": not json at all\n'
        list(read_actions(cut, table="t", file="f", only=(b'"metaData"',)))
    assert info.value.line == 2
