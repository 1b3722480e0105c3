"""The consumer's state on disk, so that a restart continues where it stopped.

A save (:meth:`StateStore.save`), after the records of a poll batch are handled, in this order:

1. every table whose state changed: ``tables/<hash>-v<version>-<token>.parquet`` (the files) and
   then ``tables/<hash>.json`` (version, metaData, protocol, txns, domains and the name of that
   Parquet file), each written to a temp file, fsynced and renamed; the directory is fsynced, then
   the Parquet file the sidecar named before is deleted;
2. ``offsets.json``: the next offset to read per partition of the actions (and commits) topic and
   the table ids retired by ``tableReplaced`` (same atomic write);
3. the files of the retired tables are deleted. (The consumer then stores the offsets for the
   group commit and reports the applied versions and replacements.)

A crash between two steps only makes the restart re-read, never lose, records; :meth:`StateStore.load`
deletes what an interrupted save left behind (Parquet files no sidecar names, the files of a table
``offsets.json`` lists as retired).

State format 2 is the above, like a Delta checkpoint (Parquet) with its sidecar. Format 1 (before
the files moved to Parquet: one JSON file per table with every ``add`` inline) is still read, and
rewritten as format 2 when the store is loaded; a newer format is refused with a
:class:`~deltamirror.core.errors.ConfigError`.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import secrets
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from deltamirror.core.errors import ConfigError

from .state import STATE_FORMAT, STATE_FORMAT_JSON, IncrementalSnapshot

log = logging.getLogger(__name__)


@dataclass
class Position:
    """Where the consumer stands besides its tables: what ``offsets.json`` holds."""

    #: actions topic: partition -> next offset to read
    offsets: dict[int, int] = field(default_factory=dict)
    #: commits topic: partition -> next offset to read
    commits_offsets: dict[int, int] = field(default_factory=dict)
    #: table ids dropped on ``tableReplaced`` -> the last version published for them
    retired: dict[str, int] = field(default_factory=dict)


class StateStore:
    """Tables and offsets of one consumer in a directory (see the module docstring)."""

    def __init__(self, directory: str | Path, topic: str, commits_topic: str | None = None) -> None:
        self.root = Path(directory)
        self.topic = topic
        self.commits_topic = commits_topic
        self.tables_dir = self.root / "tables"
        self.tables_dir.mkdir(parents=True, exist_ok=True)
        self.offsets_path = self.root / "offsets.json"
        #: table id -> the Parquet file its sidecar names
        self._parquet: dict[str, str] = {}

    def _stem(self, table_id: str) -> str:
        return hashlib.sha1(table_id.encode()).hexdigest()[:16]

    def _sidecar_path(self, table_id: str) -> Path:
        return self.tables_dir / f"{self._stem(table_id)}.json"

    # --- loading -------------------------------------------------------------------------------

    def load(self) -> tuple[dict[str, IncrementalSnapshot], dict[int, int]]:
        """The tables and the actions-topic offsets (see :meth:`load_all` for the rest)."""
        tables, position = self.load_all()
        return tables, position.offsets

    def load_all(self) -> tuple[dict[str, IncrementalSnapshot], Position]:
        position = self._read_position()
        tables: dict[str, IncrementalSnapshot] = {}
        migrate: list[tuple[IncrementalSnapshot, Path]] = []
        for path in sorted(self.tables_dir.glob("*.json")):
            data = json.loads(path.read_text())
            fmt = data.get("format") if isinstance(data, dict) else None
            if fmt == STATE_FORMAT_JSON:
                state = IncrementalSnapshot.from_json(data)
                migrate.append((state, path))
            elif fmt == STATE_FORMAT:
                state = IncrementalSnapshot.from_sidecar(data, self._read_files(path, data))
                self._parquet[state.table_id] = str(data["files"])
            else:
                raise ConfigError(
                    f"{path} has snapshot state format {fmt!r}, this deltamirror reads {STATE_FORMAT_JSON} "
                    f"and {STATE_FORMAT}: run the version that wrote it, or delete {self.root} to rebuild "
                    "the state from the topic"
                )
            if state.table_id in position.retired:  # dropped, but a crash came before its files went
                self.delete_table(state.table_id)
                continue
            tables[state.table_id] = state
        self._delete_leftovers()
        for state, legacy in migrate:
            if state.table_id not in tables:
                continue
            log.info("migrating the state of table %s to format %d (Parquet)", state.table_id, STATE_FORMAT)
            self.write_tables([state])  # replaces the legacy file when it has the sidecar's name
            if legacy != self._sidecar_path(state.table_id):
                legacy.unlink(missing_ok=True)
        return tables, position

    def _read_position(self) -> Position:
        position = Position()
        if not self.offsets_path.exists():
            return position
        data = json.loads(self.offsets_path.read_text())
        if data.get("topic") != self.topic:
            raise ConfigError(
                f"state directory {self.root} holds the state of topic {data.get('topic')!r}, not {self.topic!r}"
            )
        position.offsets = {int(p): int(o) for p, o in data["partitions"].items()}
        stored_commits = data.get("commitsTopic")
        if self.commits_topic is not None and stored_commits not in (None, self.commits_topic):
            raise ConfigError(
                f"state directory {self.root} followed commits topic {stored_commits!r}, not "
                f"{self.commits_topic!r}"
            )
        if self.commits_topic is not None and stored_commits == self.commits_topic:
            position.commits_offsets = {int(p): int(o) for p, o in data.get("commitsPartitions", {}).items()}
        position.retired = {str(t): int(v) for t, v in data.get("retired", {}).items()}
        return position

    def _read_files(self, sidecar: Path, data: Mapping[str, Any]) -> pa.Table:
        path = self.tables_dir / str(data["files"])
        try:
            files = pq.read_table(path)
        except (OSError, pa.ArrowException) as exc:
            raise ConfigError(
                f"{sidecar} names {path.name}, which cannot be read ({exc}): delete {self.root} to rebuild "
                "the state from the topic"
            ) from None
        if files.num_rows != data.get("fileCount"):
            raise ConfigError(
                f"{path} has {files.num_rows} files, its sidecar {sidecar.name} says {data.get('fileCount')}: "
                f"delete {self.root} to rebuild the state from the topic"
            )
        return files

    def _delete_leftovers(self) -> None:
        """Parquet files no sidecar names and temp files: what an interrupted save left."""
        named = set(self._parquet.values())
        for path in self.tables_dir.iterdir():
            stale_tmp = path.name.startswith(".") and path.name.endswith(".tmp")
            if stale_tmp or (path.suffix == ".parquet" and path.name not in named):
                path.unlink(missing_ok=True)

    # --- saving --------------------------------------------------------------------------------

    def write_tables(self, tables: Iterable[IncrementalSnapshot]) -> None:
        """Step 1 of a save: each table's files, then its sidecar; then the files they replace go."""
        superseded = []
        wrote = False
        for state in tables:
            name = f"{self._stem(state.table_id)}-v{state.version}-{secrets.token_hex(4)}.parquet"
            _write_atomically(self.tables_dir / name, functools.partial(_write_parquet, state.files))
            _write_json(self._sidecar_path(state.table_id), state.sidecar(name))
            previous = self._parquet.get(state.table_id)
            if previous is not None:
                superseded.append(previous)
            self._parquet[state.table_id] = name
            wrote = True
        if wrote:
            _fsync_dir(self.tables_dir)
        for name in superseded:
            (self.tables_dir / name).unlink(missing_ok=True)

    def delete_table(self, table_id: str) -> None:
        """The sidecar first (so none names a missing file), then the Parquet file."""
        self._sidecar_path(table_id).unlink(missing_ok=True)
        name = self._parquet.pop(table_id, None)
        if name is not None:
            (self.tables_dir / name).unlink(missing_ok=True)

    def save(
        self,
        tables: Iterable[IncrementalSnapshot],
        offsets: Mapping[int, int],
        *,
        commits_offsets: Mapping[int, int] | None = None,
        retired: Mapping[str, int] | None = None,
        dropped: Iterable[str] = (),
    ) -> None:
        """Steps 1 to 3 of the module docstring: tables, then the position, then dropped tables."""
        self.write_tables(tables)  # a crash before the offsets only means a re-read
        data: dict[str, Any] = {
            "topic": self.topic,
            "partitions": {str(p): o for p, o in sorted(offsets.items())},
        }
        if self.commits_topic is not None:
            data["commitsTopic"] = self.commits_topic
            data["commitsPartitions"] = {str(p): o for p, o in sorted((commits_offsets or {}).items())}
        data["retired"] = dict(sorted((retired or {}).items()))
        _write_json(self.offsets_path, data)
        _fsync_dir(self.root)
        for table_id in dropped:  # retired in offsets.json now: a crash here is cleaned by load
            self.delete_table(table_id)


def _write_atomically(path: Path, write: Callable[[Any], None]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as out:
        write(out)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)


def _write_json(path: Path, data: Any) -> None:
    _write_atomically(path, lambda out: out.write(json.dumps(data, separators=(",", ":")).encode()))


def _write_parquet(files: pa.Table, out: Any) -> None:
    pq.write_table(files, out)


def _fsync_dir(path: Path) -> None:
    """Make the renames in ``path`` durable before the next step relies on them."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


__all__ = ["Position", "StateStore"]
