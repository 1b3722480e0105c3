"""A synthetic Delta table of many files: one classic checkpoint and JSON commits after it.

Real tables with a million files are too big to keep in the repo, so tests and benchmarks build one.
The checkpoint is assembled column by column with Arrow kernels (a million rows in seconds); only
the commits, a few thousand actions, are written from Python dicts. The generator keeps its own
account of which files each commit touches, so the expected active-file count is known without
asking any Delta reader (it is an oracle for deltamirror and delta-rs alike).

Shape, as real writers produce it:
- checkpoint at ``checkpoint_version`` (older commits cleaned up), a Spark-like V1 checkpoint schema
  (txn, add, remove, metaData, protocol struct columns; one action per row), snappy parquet;
- ``add`` with path, partitionValues map, size, modificationTime, dataChange, tags (null),
  deletionVector (set on ~1% of files, pointing into a few shared DV files), baseRowId and
  defaultRowCommitVersion (null), and a JSON ``stats`` string with numRecords/min/max/nullCount;
- a few ``remove`` tombstones; protocol 3/7 with the deletionVectors feature;
- each commit: removes some checkpoint files and adds as many new ones, rewrites some checkpoint
  files' deletion vectors (remove with the old DV, add with a new one), drops a file an earlier
  commit added; one commit re-adds files an earlier commit removed (as RESTORE does).
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

STRING_MAP = pa.map_(pa.string(), pa.string())
DV_TYPE = pa.struct(
    [
        pa.field("storageType", pa.string()),
        pa.field("pathOrInlineDv", pa.string()),
        pa.field("offset", pa.int32()),
        pa.field("sizeInBytes", pa.int32()),
        pa.field("cardinality", pa.int64()),
        pa.field("maxRowIndex", pa.int64()),
    ]
)
ADD_TYPE = pa.struct(
    [
        pa.field("path", pa.string()),
        pa.field("partitionValues", STRING_MAP),
        pa.field("size", pa.int64()),
        pa.field("modificationTime", pa.int64()),
        pa.field("dataChange", pa.bool_()),
        pa.field("tags", STRING_MAP),
        pa.field("deletionVector", DV_TYPE),
        pa.field("baseRowId", pa.int64()),
        pa.field("defaultRowCommitVersion", pa.int64()),
        pa.field("stats", pa.string()),
    ]
)
REMOVE_TYPE = pa.struct(
    [
        pa.field("path", pa.string()),
        pa.field("deletionTimestamp", pa.int64()),
        pa.field("dataChange", pa.bool_()),
        pa.field("extendedFileMetadata", pa.bool_()),
        pa.field("partitionValues", STRING_MAP),
        pa.field("size", pa.int64()),
        pa.field("deletionVector", DV_TYPE),
        pa.field("baseRowId", pa.int64()),
        pa.field("defaultRowCommitVersion", pa.int64()),
    ]
)
TXN_TYPE = pa.struct(
    [pa.field("appId", pa.string()), pa.field("version", pa.int64()), pa.field("lastUpdated", pa.int64())]
)
METADATA_TYPE = pa.struct(
    [
        pa.field("id", pa.string()),
        pa.field("name", pa.string()),
        pa.field("description", pa.string()),
        pa.field("format", pa.struct([pa.field("provider", pa.string()), pa.field("options", STRING_MAP)])),
        pa.field("schemaString", pa.string()),
        pa.field("partitionColumns", pa.list_(pa.string())),
        pa.field("configuration", STRING_MAP),
        pa.field("createdTime", pa.int64()),
    ]
)
PROTOCOL_TYPE = pa.struct(
    [
        pa.field("minReaderVersion", pa.int32()),
        pa.field("minWriterVersion", pa.int32()),
        pa.field("readerFeatures", pa.list_(pa.string())),
        pa.field("writerFeatures", pa.list_(pa.string())),
    ]
)

BASE_TIME_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
TABLE_SCHEMA = {
    "type": "struct",
    "fields": [
        {"name": "id", "type": "long", "nullable": True, "metadata": {}},
        {"name": "value", "type": "double", "nullable": True, "metadata": {}},
        {"name": "name", "type": "string", "nullable": True, "metadata": {}},
        {"name": "part", "type": "integer", "nullable": True, "metadata": {}},
    ],
}
PROTOCOL = {
    "minReaderVersion": 3,
    "minWriterVersion": 7,
    "readerFeatures": ["deletionVectors"],
    "writerFeatures": ["deletionVectors"],
}
_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"


@dataclass(frozen=True)
class SyntheticTable:
    """What was written, and the expected state at the latest version (from the generator's books)."""

    root: str
    checkpoint: str
    checkpoint_version: int
    version: int
    checkpoint_files: int
    commits: int
    active_files: int
    tombstones_in_checkpoint: int
    files_with_dv: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def z85_encode(data: bytes) -> str:
    """ZeroMQ Z85 of a multiple of 4 bytes (a DV's UUID is 16 bytes, 20 characters)."""
    out = []
    for i in range(0, len(data), 4):
        value = int.from_bytes(data[i : i + 4], "big")
        out.append("".join(_Z85[(value // 85**k) % 85] for k in range(4, -1, -1)))
    return "".join(out)


# --- columns of the checkpoint, built with kernels ----------------------------------------------------


def _mod(values: pa.Array, m: int) -> pa.Array:
    return pc.subtract(values, pc.multiply(pc.divide(values, m), m))


def _fixed_width_strings(data: str, width: int, n: int) -> pa.Array:
    """``n`` strings of ``width`` characters cut from one ASCII string, without a Python str each."""
    offsets = pa.array(range(0, (n + 1) * width, width), pa.int32())
    return pa.StringArray.from_buffers(n, offsets.buffers()[1], pa.py_buffer(data.encode("ascii")))


def _uuids(rng: random.Random, n: int) -> pa.Array:
    """``n`` random UUID strings (8-4-4-4-12 hex digits)."""
    hexes = _fixed_width_strings(rng.randbytes(16 * n).hex(), 32, n)
    cuts = [(0, 8), (8, 12), (12, 16), (16, 20), (20, 32)]
    pieces = [pc.utf8_slice_codeunits(hexes, a, b) for a, b in cuts]
    return pc.binary_join_element_wise(*pieces, "-")


def _str(values: pa.Array) -> pa.Array:
    return pc.cast(values, pa.string())


def _partition_map(part_strings: pa.Array) -> pa.Array:
    n = len(part_strings)
    offsets = pa.array(range(n + 1), pa.int32())
    return pa.MapArray.from_arrays(offsets, pa.repeat("part", n), part_strings)


def _stats(index: pa.Array, num_records: pa.Array) -> pa.Array:
    """Stats JSON like delta-spark's: numRecords, minValues, maxValues, nullCount per column."""
    min_id = pc.multiply(index, 10_000)
    max_id = pc.subtract(pc.add(min_id, num_records), 1)
    min_value = pc.divide(pc.cast(index, pa.float64()), 7.0)
    max_value = pc.add(min_value, 1000.5)
    min_name = pc.utf8_lpad(_str(index), 9, "0")
    max_name = pc.binary_join_element_wise(min_name, "zz", "")
    nulls = _mod(index, 3)
    parts: list[Any] = [
        '{"numRecords":',
        _str(num_records),
        ',"minValues":{"id":',
        _str(min_id),
        ',"value":',
        _str(min_value),
        ',"name":"n',
        min_name,
        '"},"maxValues":{"id":',
        _str(max_id),
        ',"value":',
        _str(max_value),
        ',"name":"n',
        max_name,
        '"},"nullCount":{"id":0,"value":',
        _str(nulls),
        ',"name":0},"tightBounds":true}',
    ]
    return pc.binary_join_element_wise(*parts, "")


def _dv_pool(rng: random.Random, count: int) -> list[str]:
    """Relative-path DV ids ('u' storage): a 2-character folder prefix and a Z85 UUID."""
    return [rng.choice(["ab", "cd", "ef", ""]) + z85_encode(rng.randbytes(16)) for _ in range(count)]


def _checkpoint_adds(
    rng: random.Random, n: int, partitions: int, dv_every: int, dv_pool: list[str]
) -> tuple[pa.StructArray, pa.Array]:
    """The ``add`` struct of ``n`` files, and the boolean mask of those that carry a DV."""
    index = pa.array(range(n), pa.int64())
    part = _str(_mod(index, partitions))
    task = pc.utf8_lpad(_str(_mod(index, 200)), 5, "0")
    path = pc.binary_join_element_wise(
        "part=", part, "/part-", task, "-", _uuids(rng, n), ".c000.snappy.parquet", ""
    )
    num_records = pc.add(_mod(index, 5000), 1000)
    has_dv = pc.equal(_mod(index, dv_every), dv_every // 3)
    dv_index = pc.divide(index, dv_every)
    pool = pa.array(dv_pool, pa.string())
    dv = pa.StructArray.from_arrays(
        [
            pa.repeat("u", n),
            pc.take(pool, _mod(dv_index, len(dv_pool))),
            pc.cast(pc.add(pc.multiply(pc.divide(dv_index, len(dv_pool)), 40), 1), pa.int32()),
            pa.repeat(pa.scalar(34, pa.int32()), n),
            pc.add(_mod(index, 50), 1),
            pa.nulls(n, pa.int64()),
        ],
        fields=list(DV_TYPE),
        mask=pc.invert(has_dv),
    )
    adds = pa.StructArray.from_arrays(
        [
            path,
            _partition_map(part),
            pc.add(pc.multiply(_mod(index, 9973), 97), 100_000),
            pc.add(index, BASE_TIME_MS - 10_000_000),
            pa.repeat(False, n),
            pa.nulls(n, STRING_MAP),
            dv,
            pa.nulls(n, pa.int64()),
            pa.nulls(n, pa.int64()),
            _stats(index, num_records),
        ],
        fields=list(ADD_TYPE),
    )
    return adds, has_dv


def _small_rows(table_id: str, partitions: int) -> dict[str, pa.Array]:
    metadata = {
        "id": table_id,
        "name": None,
        "description": None,
        "format": {"provider": "parquet", "options": []},
        "schemaString": json.dumps(TABLE_SCHEMA, separators=(",", ":")),
        "partitionColumns": ["part"],
        "configuration": [("delta.enableDeletionVectors", "true")],
        "createdTime": BASE_TIME_MS - 20_000_000,
    }
    txn = {"appId": "synthetic-stream", "version": 41, "lastUpdated": BASE_TIME_MS - 1000}
    return {
        "protocol": pa.array([PROTOCOL], PROTOCOL_TYPE),
        "metaData": pa.array([metadata], METADATA_TYPE),
        "txn": pa.array([txn], TXN_TYPE),
    }


def _tombstones(count: int, partitions: int) -> pa.Array:
    rows = [
        {
            "path": f"part={i % partitions}/part-00000-removed-{i:06d}.c000.snappy.parquet",
            "deletionTimestamp": BASE_TIME_MS - 5_000_000 + i,
            "dataChange": True,
            "extendedFileMetadata": True,
            "partitionValues": [("part", str(i % partitions))],
            "size": 1000 + i,
        }
        for i in range(count)
    ]
    return pa.array(rows, REMOVE_TYPE)


def _checkpoint_table(small: dict[str, pa.Array], adds: pa.Array, removes: pa.Array) -> pa.Table:
    """One action per row: protocol, metaData, txn, then the adds, then the tombstones."""
    order = ["protocol", "metaData", "txn", "add", "remove"]
    pieces: dict[str, pa.Array] = {**small, "add": adds, "remove": removes}
    columns = {}
    for name in ["txn", "add", "remove", "metaData", "protocol"]:
        arrays = [
            pieces[name] if other == name else pa.nulls(len(pieces[other]), pieces[name].type)
            for other in order
        ]
        columns[name] = pa.chunked_array(arrays, type=pieces[name].type)
    return pa.table(columns)


# --- commits ---------------------------------------------------------------------------------------


def _add_action(
    path: str, part: str, t: int, i: int, dv: dict[str, Any] | None = None, stats: bool = True
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "path": path,
        "partitionValues": {"part": part},
        "size": 200_000 + i,
        "modificationTime": t,
        "dataChange": True,
    }
    if stats:
        body["stats"] = json.dumps(
            {
                "numRecords": 1000 + i % 7,
                "minValues": {"id": i, "value": 0.5, "name": "a"},
                "maxValues": {"id": i + 999, "value": 99.5, "name": "z"},
                "nullCount": {"id": 0, "value": 0, "name": 0},
            },
            separators=(",", ":"),
        )
    if dv is not None:
        body["deletionVector"] = dv
    return {"add": body}


def _remove_action(path: str, part: str, t: int, dv: dict[str, Any] | None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "path": path,
        "deletionTimestamp": t,
        "dataChange": True,
        "extendedFileMetadata": True,
        "partitionValues": {"part": part},
        "size": 1234,
    }
    if dv is not None:
        body["deletionVector"] = dv
    return {"remove": body}


def _key(path: str, dv: dict[str, Any] | None) -> tuple[str, str]:
    if dv is None:
        return path, ""
    return path, f"{dv['storageType']}{dv['pathOrInlineDv']}@{dv.get('offset')}"


def write_checkpoint_table(
    root: str | Path,
    n_files: int = 1_000_000,
    n_commits: int = 100,
    *,
    checkpoint_version: int = 1000,
    partitions: int = 100,
    tombstones: int = 50,
    dv_every: int = 100,
    removes_per_commit: int = 10,
    dv_rewrites_per_commit: int = 5,
    row_group_size: int = 262_144,
    seed: int = 0,
) -> SyntheticTable:
    """Write the table under ``root`` (created; must not hold a table yet) and describe it.

    ``n_files`` files are in the checkpoint; every commit removes as many files as it adds, so the
    latest version also has ``n_files`` active files (the returned ``active_files`` is counted from
    the generator's own bookkeeping, not assumed).
    """
    rng = random.Random(seed)
    root = Path(root)
    log_dir = root / "_delta_log"
    log_dir.mkdir(parents=True, exist_ok=False)

    dv_pool = _dv_pool(rng, 64)
    adds, has_dv = _checkpoint_adds(rng, n_files, partitions, dv_every, dv_pool)
    table_id = str(_uuids(rng, 1)[0])
    cp_table = _checkpoint_table(_small_rows(table_id, partitions), adds, _tombstones(tombstones, partitions))
    checkpoint = log_dir / f"{checkpoint_version:020d}.checkpoint.parquet"
    pq.write_table(cp_table, checkpoint, compression="snappy", row_group_size=row_group_size)
    files_with_dv = pc.sum(has_dv).as_py() or 0

    # state of every key a commit touches: True active, False removed. Keys not here keep their
    # checkpoint state (active).
    touched: dict[tuple[str, str], bool] = {}
    per_commit = removes_per_commit + dv_rewrites_per_commit
    victims = rng.sample(range(n_files), per_commit * n_commits)
    victim_rows = adds.take(pa.array(victims, pa.int64())).to_pylist()
    for row in victim_rows:  # a JSON action leaves absent fields out rather than writing null
        if row["deletionVector"] is not None:
            row["deletionVector"] = {k: v for k, v in row["deletionVector"].items() if v is not None}
    added_by_commits: list[tuple[str, str, dict[str, Any] | None]] = []
    removed_by_commits: list[tuple[str, str, dict[str, Any] | None]] = []
    new_dv_pool = _dv_pool(rng, n_commits)
    for c in range(1, n_commits + 1):
        version = checkpoint_version + c
        t = BASE_TIME_MS + c * 60_000
        actions: list[dict[str, Any]] = []
        rows = victim_rows[(c - 1) * per_commit : c * per_commit]
        for row in rows[:removes_per_commit]:
            part = str(row["partitionValues"][0][1])
            actions.append(_remove_action(row["path"], part, t, row["deletionVector"]))
            touched[_key(row["path"], row["deletionVector"])] = False
            removed_by_commits.append((row["path"], part, row["deletionVector"]))
        for j in range(removes_per_commit):
            part = str((c + j) % partitions)
            path = f"part={part}/part-{j:05d}-commit{version}-{j:04d}.c000.snappy.parquet"
            actions.append(_add_action(path, part, t, c * 100 + j))
            touched[_key(path, None)] = True
            added_by_commits.append((path, part, None))
        # DELETE with deletion vectors: the same file, removed with its old DV, added with a new one
        for j, row in enumerate(rows[removes_per_commit:]):
            part = str(row["partitionValues"][0][1])
            new_dv = {
                "storageType": "u",
                "pathOrInlineDv": new_dv_pool[c - 1],
                "offset": 1 + 40 * j,
                "sizeInBytes": 34,
                "cardinality": 3 + j,
            }
            actions.append(_remove_action(row["path"], part, t, row["deletionVector"]))
            actions.append(_add_action(row["path"], part, t, c * 100 + 50 + j, dv=new_dv))
            touched[_key(row["path"], row["deletionVector"])] = False
            touched[_key(row["path"], new_dv)] = True
        if c % 10 == 5 and len(added_by_commits) > removes_per_commit:
            # a later commit drops a file an earlier commit added, and adds a replacement
            path, part, dv = added_by_commits[c]
            actions.append(_remove_action(path, part, t, dv))
            touched[_key(path, dv)] = False
            new_path = f"part={part}/part-00000-replace{version}.c000.snappy.parquet"
            actions.append(_add_action(new_path, part, t, c, stats=False))
            touched[_key(new_path, None)] = True
        if c == n_commits // 2:
            # RESTORE-like: files removed by earlier commits come back; as many others go
            for path, part, dv in removed_by_commits[:3]:
                actions.append(_add_action(path, part, t, c, dv=dv))
                touched[_key(path, dv)] = True
            for path, part, dv in added_by_commits[:3]:
                actions.append(_remove_action(path, part, t, dv))
                touched[_key(path, dv)] = False
        if c % 25 == 0:
            actions.append({"txn": {"appId": "synthetic-stream", "version": 41 + c, "lastUpdated": t}})
        commit_info = {
            "commitInfo": {
                "timestamp": t,
                "operation": "DELETE" if dv_rewrites_per_commit else "WRITE",
                "operationParameters": {"predicate": f'["(id < {c})"]'},
                "readVersion": version - 1,
                "isolationLevel": "Serializable",
                "isBlindAppend": False,
                "engineInfo": "deltamirror-synthetic",
            }
        }
        lines = [json.dumps(a, separators=(",", ":")) for a in [commit_info, *actions]]
        (log_dir / f"{version:020d}.json").write_text("\n".join(lines) + "\n")

    latest = checkpoint_version + n_commits
    cp_rows = cp_table.num_rows
    (log_dir / "_last_checkpoint").write_text(
        json.dumps(
            {
                "version": checkpoint_version,
                "size": cp_rows,
                "sizeInBytes": checkpoint.stat().st_size,
                "numOfAddFiles": n_files,
            }
        )
    )
    active = n_files + _net_change(touched, victim_rows)
    return SyntheticTable(
        root=str(root),
        checkpoint=str(checkpoint),
        checkpoint_version=checkpoint_version,
        version=latest,
        checkpoint_files=n_files,
        commits=n_commits,
        active_files=active,
        tombstones_in_checkpoint=tombstones,
        files_with_dv=files_with_dv,
    )


def _net_change(touched: dict[tuple[str, str], bool], victim_rows: list[dict[str, Any]]) -> int:
    """Active files gained (negative: lost) against the checkpoint, over the touched keys only."""
    in_checkpoint = {_key(r["path"], r["deletionVector"]) for r in victim_rows}
    change = 0
    for key, active in touched.items():
        if key in in_checkpoint and not active:
            change -= 1
        elif key not in in_checkpoint and active:
            change += 1
    return change
