"""One table's state as a Delta table folder on disk, that any Delta reader opens at its version.

The folder holds ``_delta_log/`` with:

- ``<version, 20 digits>.checkpoint.parquet``: the checkpoint of the state (:mod:`.delta_checkpoint`);
- ``<version>.json``: one ``commitInfo`` action and nothing else. delta-spark refuses a log
  without a commit file at or below its checkpoint ("Could not find any delta files for version
  N", pinned by its own tests), though it never reads that commit when the checkpoint covers its
  version; delta-rs and core open the folder without it. It is a marker, not the table's commit:
  the folder has the table's state at that version, not its history;
- ``_last_checkpoint``: ``version``, ``size`` (rows), ``sizeInBytes``, ``numOfAddFiles``.

Each is written to a temp file, fsynced and renamed, the hint last (:func:`write_folder`); the
previous checkpoint stays until :func:`prune` (for a reader that has just read the previous hint).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from deltamirror.core.errors import ConfigError

from .delta_checkpoint import (
    LOADED_COLUMNS,
    LOADED_WITHOUT_STATS,
    ROW_GROUP_ROWS,
    STATS_COLUMN,
    document,
    files_from_rows,
    marker_commit,
    write_checkpoint,
)
from .state import IncrementalSnapshot
from .stats_spill import StatsSpill

LOG_DIR = "_delta_log"
LAST_CHECKPOINT = "_last_checkpoint"
_FILE_NAME = re.compile(r"^(\d{20})\.(checkpoint\.parquet|json)$")


def checkpoint_name(version: int) -> str:
    return f"{version:020d}.checkpoint.parquet"


def commit_name(version: int) -> str:
    return f"{version:020d}.json"


# --- writing ------------------------------------------------------------------------------------


def write_atomically(path: Path, write: Callable[[Any], None]) -> None:
    """``write`` to a temp file beside ``path``, fsync it, rename it over ``path``."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as out:
        write(out)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)


def write_json(path: Path, data: Any) -> None:
    write_atomically(path, lambda out: out.write(json.dumps(data, separators=(",", ":")).encode()))


def fsync_dir(path: Path) -> None:
    """Make the renames in ``path`` durable before the next step relies on them."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_folder(state: IncrementalSnapshot, folder: Path) -> Path:
    """The checkpoint of ``state``, its marker commit, then ``_last_checkpoint`` naming them.

    Each file is written atomically and made durable before the next: a crash before the hint is
    renamed leaves the previous checkpoint in force (the new files are leftovers :func:`prune`
    deletes). Older checkpoints are not deleted here (:func:`prune`, once the offsets are saved).
    Returns the checkpoint's path.
    """
    if state.version is None:
        raise ValueError(f"the state of table {state.table_id} has no version yet")
    log_dir = folder / LOG_DIR
    log_dir.mkdir(parents=True, exist_ok=True)
    path = log_dir / checkpoint_name(state.version)
    rows: list[int] = []
    write_atomically(path, lambda out: rows.append(write_checkpoint(state, out)))
    marker = marker_commit(state)
    write_atomically(log_dir / commit_name(state.version), lambda out: out.write(marker))
    fsync_dir(log_dir)
    hint = {
        "version": state.version,
        "size": rows[0],
        "sizeInBytes": path.stat().st_size,
        "numOfAddFiles": state.file_count,
    }
    write_json(log_dir / LAST_CHECKPOINT, hint)
    fsync_dir(log_dir)
    return path


# --- reading ------------------------------------------------------------------------------------


def last_checkpoint_version(folder: Path) -> int | None:
    """The version ``_last_checkpoint`` names; None when the folder has none (a save that never
    got that far)."""
    path = folder / LOG_DIR / LAST_CHECKPOINT
    try:
        data = json.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path} cannot be read ({exc})") from None
    version = data.get("version") if isinstance(data, dict) else None
    if type(version) is not int or version < 0:
        raise ConfigError(f"{path} names no checkpoint version")
    return version


def read_folder(folder: Path, spill_dir: Path | None = None) -> IncrementalSnapshot | None:
    """The state the folder's ``_last_checkpoint`` names; None for a folder without one.

    With ``spill_dir`` the files' ``stats`` are not read: the state reads them from the
    checkpoint when they are asked for (:mod:`.stats_spill`, its temporary file in ``spill_dir``).

    Raises ConfigError (naming the file) for a checkpoint that is not the consumer's or does not
    read.
    """
    version = last_checkpoint_version(folder)
    if version is None:
        return None
    path = folder / LOG_DIR / checkpoint_name(version)
    try:
        pf = pq.ParquetFile(path)
        doc = document(pf.schema_arrow.metadata, str(path))
        if doc.get("version") != version:
            raise ConfigError(f"{path} holds version {doc.get('version')}, its name says {version}")
        count = doc.get("fileCount")
        if type(count) is not int:
            raise ConfigError(f"{path}: its document has no file count")
        columns = LOADED_COLUMNS if spill_dir is None else LOADED_WITHOUT_STATS
        total = pf.metadata.num_rows
        if not 0 <= count <= total:
            raise ConfigError(f"{path} has {total} rows, its document says {count} files")
        missing = [c for c in columns if c.split(".")[0] not in pf.schema_arrow.names]
        if missing:
            raise ConfigError(f"{path} has no column {missing[0]}: not a state this consumer wrote")
        spill = None
        if spill_dir is not None:
            spill = StatsSpill.with_base(spill_dir, pf, STATS_COLUMN, total - count, count)
    except (OSError, pa.ArrowException, ValueError) as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"{path} cannot be read ({' '.join(str(exc).split())})") from None

    def read_files() -> pa.Table:
        """The files, read when the state first needs them (the file stays open until then)."""
        try:
            rows = pf.iter_batches(batch_size=ROW_GROUP_ROWS, columns=columns)
            files = files_from_rows(rows, total, count, str(path))
            if spill is not None:
                files = files.append_column("stats", pa.chunked_array([StatsSpill.base_refs(count)]))
        except (OSError, pa.ArrowException, ValueError) as exc:
            if isinstance(exc, ConfigError):
                raise
            raise ConfigError(f"{path} cannot be read ({' '.join(str(exc).split())})") from None
        if spill is None:
            pf.close()
        return files

    # the files are read when first needed: a restart with nothing new to apply reads none
    return IncrementalSnapshot.from_document(doc, read_files, spill, file_count=count)


# --- cleaning -----------------------------------------------------------------------------------


def prune(folder: Path) -> None:
    """Delete what is no longer in force.

    Files of versions newer than ``_last_checkpoint`` (a save that did not finish) and temp files
    go; of the older checkpoints only the newest stays (with its marker), for a reader that read
    the previous hint a moment ago. A folder without a hint goes whole.
    """
    log_dir = folder / LOG_DIR
    version = last_checkpoint_version(folder)
    if version is None:
        remove_folder(folder)
        return
    older: set[int] = set()
    for path in log_dir.iterdir():
        m = _FILE_NAME.match(path.name)
        if m is not None:
            v = int(m.group(1))
            if v > version:
                path.unlink(missing_ok=True)
            elif v < version:
                older.add(v)
        elif path.name.startswith(".") and path.name.endswith(".tmp"):
            path.unlink(missing_ok=True)
    for v in sorted(older)[:-1]:
        (log_dir / checkpoint_name(v)).unlink(missing_ok=True)
        (log_dir / commit_name(v)).unlink(missing_ok=True)


def remove_folder(folder: Path) -> None:
    """A table's folder: the hint first (no reader is sent to a deleted file), then the rest."""
    (folder / LOG_DIR / LAST_CHECKPOINT).unlink(missing_ok=True)
    shutil.rmtree(folder, ignore_errors=True)


__all__ = [
    "LAST_CHECKPOINT",
    "LOG_DIR",
    "checkpoint_name",
    "commit_name",
    "fsync_dir",
    "last_checkpoint_version",
    "prune",
    "read_folder",
    "remove_folder",
    "write_atomically",
    "write_folder",
    "write_json",
]
