"""What a mutation needs to know about a real table, read with the standard library and pyarrow only.

The expectations of the mutation suite must not come from the code under test, so the facts they
are derived from (which commit holds which action, what the latest checkpoint covers, which files
are active, which files the change feed reads) are worked out here from the log itself, following
the Delta protocol. The file-editing helpers keep modification times, because a version's
timestamp comes from its commit file's modification time and a mutation must change only what it
says it changes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from support.tables import TABLES

COMMIT_RE = re.compile(r"^(\d{20})\.json$")
CLASSIC_CP_RE = re.compile(r"^(\d{20})\.checkpoint\.parquet$")
MULTIPART_CP_RE = re.compile(r"^(\d{20})\.checkpoint\.(\d{10})\.(\d{10})\.parquet$")
UUID_CP_RE = re.compile(r"^(\d{20})\.checkpoint\.[0-9a-fA-F-]{36}\.(json|parquet)$")

#: every log file of version v gets this modification time (ms), so that file times are strictly
#: increasing and far apart: the monotonic adjustment of commit timestamps is then a no-op, and a
#: mutation that deletes or rewrites a commit cannot shift another version's timestamp.
BASE_MTIME_MS = 1_700_000_000_000
MTIME_STEP_MS = 60_000


def log_mtime_ms(version: int) -> int:
    return BASE_MTIME_MS + version * MTIME_STEP_MS


@dataclass(frozen=True)
class Line:
    """One line of a commit: where it is and what it holds (already decoded with ``json``)."""

    version: int
    lineno: int  # 1-based, physical
    raw: bytes
    kind: str  # the action name, e.g. "add"
    body: Any


@dataclass
class Facts:
    """A table's log as the protocol defines it; every table used here has all commits from 0."""

    id: str
    commits: dict[int, list[Line]]
    latest: int
    checkpoints: dict[int, list[str]]  # version -> the files of one complete checkpoint
    sidecars: dict[int, list[str]]  # checkpoint version -> sidecar file names
    has_last_checkpoint: bool
    partition_columns: list[str]
    partition_types: dict[str, str]
    schema_fields: list[str]
    cdf_start: int | None  # first version from which the change data feed is enabled to the latest
    ict_from: int | None  # first version with in-commit timestamps
    protocol: dict[str, Any]
    active: dict[tuple[str, str | None], Line] = field(default_factory=dict)

    @property
    def src(self) -> Path:
        return TABLES / self.id

    @property
    def cp(self) -> int:
        """The version of the checkpoint the latest snapshot is built from (-1: none)."""
        return max(self.checkpoints, default=-1)

    @property
    def has_cdf(self) -> bool:
        return self.cdf_start is not None

    def lines(self, *kinds: str) -> list[Line]:
        return [ln for v in sorted(self.commits) for ln in self.commits[v] if not kinds or ln.kind in kinds]

    def has_cdc(self, version: int) -> bool:
        return any(ln.kind == "cdc" for ln in self.commits.get(version, []))

    def reaches_commit(self, version: int, kind: str | None = None) -> dict[str, bool | None]:
        """Which commands read every line of commit ``version`` (None: the protocol leaves it open).

        ``snapshot``/``read`` build the latest state from the newest checkpoint and every line of the
        commits after it; ``history`` and ``events`` read every commit in the log; ``changes`` reads
        every line of the commits of its range. Before its range, ``changes`` needs only the latest
        protocol and metadata: it must read those lines (and a commit holding them cannot be torn), and may
        or may not look at the others (None: not judged).
        """
        latest_state = version > self.cp
        reach: dict[str, bool | None] = {
            "snapshot": latest_state,
            "read": latest_state,
            "history": True,
            "events": True,
        }
        if self.cdf_start is not None:
            if version >= self.cdf_start:
                reach["changes"] = True
            elif not latest_state:
                reach["changes"] = False
            elif (kind == "protocol" and version == self.last_protocol_version) or (
                kind == "metaData" and version == self.last_metadata_version
            ):
                reach["changes"] = True  # the latest protocol or metadata: it must be read
            elif kind == "syntax" and version in (self.last_protocol_version, self.last_metadata_version):
                reach["changes"] = True  # a line that does not parse could be the one it needs
            else:
                reach["changes"] = None
        return reach

    def changes_start(self, cleaned: bool = False) -> int | None:
        """Where ``changes`` starts: the first CDF version (on a cleaned log, not before the checkpoint)."""
        if self.cdf_start is None:
            return None
        return max(self.cdf_start, self.cp) if cleaned else self.cdf_start

    @property
    def last_protocol_version(self) -> int:
        return max(ln.version for ln in self.lines("protocol"))

    @property
    def last_metadata_version(self) -> int:
        return max(ln.version for ln in self.lines("metaData"))

    def change_feed_reads(self, line: Line) -> bool:
        """Whether the change feed opens the file of this add/remove (no cdc in its commit, data change)."""
        return (
            self.cdf_start is not None
            and line.version >= self.cdf_start
            and line.kind in ("add", "remove")
            and not self.has_cdc(line.version)
            and line.body.get("dataChange", True) is not False
        )

    def is_active(self, line: Line) -> bool:
        return self.active.get(file_key(line.body)) is line

    def data_files(self) -> list[Path]:
        return [self.src / decode_path(k[0]) for k in {k[0]: k for k in self.active}.values()]


def file_key(body: dict[str, Any]) -> tuple[str, str | None]:
    """The protocol's key of a logical file: (path, DV unique id)."""
    dv = body.get("deletionVector")
    if not dv:
        return (body["path"], None)
    uid = f"{dv['storageType']}{dv['pathOrInlineDv']}"
    if dv.get("offset") is not None:
        uid += f"@{dv['offset']}"
    return (body["path"], uid)


def decode_path(path_in_log: str) -> str:
    return urllib.parse.unquote(path_in_log)


def _commit_lines(version: int, data: bytes) -> list[Line]:
    out = []
    for i, raw in enumerate(data.split(b"\n"), start=1):
        if not raw.strip():
            continue
        obj = json.loads(raw)
        ((kind, body),) = obj.items()
        out.append(Line(version, i, raw, kind, body))
    return out


def _schema_types(schema_string: str) -> dict[str, str]:
    types = {}
    for f in json.loads(schema_string)["fields"]:
        physical = f.get("metadata", {}).get("delta.columnMapping.physicalName", f["name"])
        t = f["type"] if isinstance(f["type"], str) else f["type"].get("type", "complex")
        types[f["name"]] = t
        types[physical] = t
    return types


@cache
def facts(table_id: str) -> Facts:
    log = TABLES / table_id / "_delta_log"
    commits: dict[int, list[Line]] = {}
    classic: dict[int, list[str]] = {}
    parts: dict[tuple[int, int], list[str]] = {}
    uuid_cps: dict[int, list[str]] = {}
    for p in sorted(log.iterdir()):
        if m := COMMIT_RE.match(p.name):
            commits[int(m[1])] = _commit_lines(int(m[1]), p.read_bytes())
        elif m := CLASSIC_CP_RE.match(p.name):
            classic[int(m[1])] = [p.name]
        elif m := MULTIPART_CP_RE.match(p.name):
            parts.setdefault((int(m[1]), int(m[3])), []).append(p.name)
        elif m := UUID_CP_RE.match(p.name):
            uuid_cps.setdefault(int(m[1]), []).append(p.name)
    checkpoints: dict[int, list[str]] = dict(classic)
    for (v, n), names in parts.items():
        if len(names) == n:
            checkpoints[v] = sorted(names)
    for v, names in uuid_cps.items():
        checkpoints[v] = [sorted(names)[0]]
    sidecars = {v: _sidecars_of(log / names[0]) for v, names in uuid_cps.items()}
    latest = max(commits)
    assert sorted(commits) == list(range(latest + 1)), f"{table_id}: the suite needs every commit from 0"

    metadata: dict[str, Any] = {}
    protocol: dict[str, Any] = {}
    cdf_on: dict[int, bool] = {}
    ict_from = None
    active: dict[tuple[str, str | None], Line] = {}
    for v in range(latest + 1):
        for ln in commits[v]:
            if ln.kind == "metaData":
                metadata = ln.body
            elif ln.kind == "protocol":
                protocol = ln.body
            elif ln.kind == "add":
                active[file_key(ln.body)] = ln
            elif ln.kind == "remove":
                active.pop(file_key(ln.body), None)
        conf = metadata.get("configuration") or {}
        cdf_on[v] = conf.get("delta.enableChangeDataFeed") == "true"
        if ict_from is None and conf.get("delta.enableInCommitTimestamps") == "true":
            ict_from = int(conf.get("delta.inCommitTimestampEnablementVersion", v))
    cdf_start = None
    for v in range(latest, -1, -1):
        if not cdf_on[v]:
            break
        cdf_start = v
    types = _schema_types(metadata["schemaString"])
    return Facts(
        id=table_id,
        commits=commits,
        latest=latest,
        checkpoints=checkpoints,
        sidecars=sidecars,
        has_last_checkpoint=(log / "_last_checkpoint").exists(),
        partition_columns=list(metadata.get("partitionColumns") or []),
        partition_types={c: types.get(c, "string") for c in metadata.get("partitionColumns") or []},
        schema_fields=[f["name"] for f in json.loads(metadata["schemaString"])["fields"]],
        cdf_start=cdf_start,
        ict_from=ict_from,
        protocol=protocol,
        active=active,
    )


def _sidecars_of(checkpoint: Path) -> list[str]:
    if checkpoint.suffix == ".json":
        names = []
        for raw in checkpoint.read_bytes().splitlines():
            obj = json.loads(raw) if raw.strip() else {}
            if "sidecar" in obj:
                names.append(obj["sidecar"]["path"])
        return names
    col = pq.read_table(checkpoint, columns=["sidecar"]).column("sidecar")
    return [r["path"] for r in col.to_pylist() if r]


# --- deletion vectors -------------------------------------------------------------------------

_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
Z85_INDEX = {c: i for i, c in enumerate(_Z85)}
#: printable characters that are not in the Z85 alphabet (and need no JSON escaping)
NOT_Z85 = "',;_`|~ "


def z85_decode(text: str) -> bytes:
    out = bytearray()
    for i in range(0, len(text), 5):
        n = 0
        for c in text[i : i + 5]:
            n = n * 85 + Z85_INDEX[c]
        out += n.to_bytes(4, "big")
    return bytes(out)


def dv_file(root: Path, dv: dict[str, Any]) -> Path | None:
    """Where a 'u' deletion vector lives under ``root`` (None for inline and absolute ones)."""
    if dv.get("storageType") != "u":
        return None
    text = dv["pathOrInlineDv"]
    prefix, encoded = text[:-20], text[-20:]
    import uuid as _uuid

    name = f"deletion_vector_{_uuid.UUID(bytes=z85_decode(encoded))}.bin"
    return root / prefix / name if prefix else root / name


# --- editing a copy ---------------------------------------------------------------------------


def copy_table(table_id: str, dest: Path, cleaned: bool = False) -> Path:
    """A copy of a table whose log files get the normalised modification times (see BASE_MTIME_MS)."""
    root = dest / table_id
    shutil.copytree(TABLES / table_id, root, symlinks=True)
    normalise_log_times(root)
    if cleaned:
        clean_log(root, facts(table_id))
    return root


def clean_log(root: Path, f: Facts) -> None:
    """Delete what a log cleanup at the latest checkpoint deletes: older commits and checkpoints."""
    log = root / "_delta_log"
    for v in range(f.cp):
        commit_path(root, v).unlink(missing_ok=True)
    for v, names in f.checkpoints.items():
        if v < f.cp:
            for name in names:
                (log / name).unlink(missing_ok=True)
            for side in f.sidecars.get(v, []):
                (log / "_sidecars" / side).unlink(missing_ok=True)


def normalise_log_times(root: Path) -> None:
    log = root / "_delta_log"
    for p in [*log.iterdir(), *((log / "_sidecars").iterdir() if (log / "_sidecars").is_dir() else [])]:
        m = re.match(r"^(\d{20})\.", p.name)
        if m and p.is_file():
            set_mtime(p, log_mtime_ms(int(m[1])))


def set_mtime(path: Path, ms: int) -> None:
    os.utime(path, ns=(ms * 1_000_000, ms * 1_000_000))


def mtime_ms(path: Path) -> int:
    return path.stat().st_mtime_ns // 1_000_000


def write_keeping_mtime(path: Path, data: bytes) -> None:
    """Rewrite a file's bytes and keep its modification time (only the content is the mutation)."""
    st = path.stat()
    path.write_bytes(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def commit_path(root: Path, version: int) -> Path:
    return root / "_delta_log" / f"{version:020d}.json"


def commit_name(version: int) -> str:
    return f"{version:020d}.json"


def replace_line(root: Path, version: int, lineno: int, new: bytes | list[bytes]) -> None:
    """Replace physical line ``lineno`` of a commit (a list replaces it by several lines)."""
    path = commit_path(root, version)
    lines = path.read_bytes().split(b"\n")
    lines[lineno - 1 : lineno] = new if isinstance(new, list) else [new]
    write_keeping_mtime(path, b"\n".join(lines))


def dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def append_commit(root: Path, version: int, actions: list[dict[str, Any]]) -> None:
    path = commit_path(root, version)
    path.write_bytes(b"\n".join(dumps(a) for a in actions) + b"\n")
    set_mtime(path, log_mtime_ms(version))


def rewrite_parquet(path: Path, table: pa.Table) -> None:
    st = path.stat()
    pq.write_table(table, path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def replace_struct_child(table: pa.Table, column: str, child: str, values: pa.Array | None) -> pa.Table:
    """``table`` with one child of a struct column replaced (``values``) or dropped (None)."""
    col = table.column(column).combine_chunks()
    names = [f.name for f in col.type]
    arrays = [col.field(i) for i in range(len(names))]
    if values is None:
        keep = [i for i, n in enumerate(names) if n != child]
        names, arrays = [names[i] for i in keep], [arrays[i] for i in keep]
    else:
        arrays[names.index(child)] = values
    mask = col.is_null()
    new = pa.StructArray.from_arrays(arrays, names=names, mask=mask)
    return table.set_column(table.schema.get_field_index(column), column, new)


def struct_rows(table: pa.Table, column: str) -> Iterator[int]:
    """Indexes of the rows where a struct column is set."""
    for i, v in enumerate(table.column(column).is_valid().to_pylist()):
        if v:
            yield i


def file_read_by_feed(f: Facts, path_in_log: str) -> bool:
    """Whether the change feed opens this data file (an add or remove of it in a commit it reads)."""
    return any(
        f.change_feed_reads(ln) for ln in f.lines("add", "remove") if ln.body.get("path") == path_in_log
    )


def dv_file_read_by_feed(f: Facts, root: Path, target: Path) -> bool:
    return any(
        f.change_feed_reads(ln)
        and ln.body.get("deletionVector")
        and dv_file(root, ln.body["deletionVector"]) == target
        for ln in f.lines("add", "remove")
    )
