"""The consumer's state on disk: each table as a Delta checkpoint folder, and the offsets beside them.

Layout of a state directory (format 3)::

    offsets.json                       topic, consumer group, next offset per partition (actions
                                       and commits topics), retired table ids, and an index of
                                       the tables
    tables/<key>/_delta_log/           one Delta table folder per table (``<key>`` = the first 16
        <version>.checkpoint.parquet   hex digits of sha1(tableId)): a classic V1 checkpoint of
        <version>.json                 the table at ``version``, a marker commit, and
        _last_checkpoint               ``_last_checkpoint`` (see :mod:`.table_folder`)

Any Delta reader opens ``tables/<key>`` as the table at the state's version (delta-spark reads its
data; ``offsets.json`` names each table's folder under ``tables``).

A save (:meth:`StateStore.save`), in this order:

1. each table whose state changed: its checkpoint, marker commit and then ``_last_checkpoint``,
   each written to a temp file, fsynced and renamed (:func:`~.table_folder.write_folder`);
2. ``offsets.json``: where a restart reads from, the retired ids and the index (same atomic write);
3. the checkpoints of those tables older than the previous one are deleted (the previous one
   stays for a reader that has just read the previous hint), and the folders of dropped tables.

A crash between two steps only makes the restart re-read, never lose, records: a table whose new
checkpoint is in force before ``offsets.json`` moves is merely ahead of the offsets, and a restart
skips the versions it already has. :meth:`StateStore.load` deletes what an interrupted save left
(checkpoints newer than a folder's ``_last_checkpoint``, folders without one, temp files, the
folders of tables ``offsets.json`` lists as retired).

A state directory belongs to one consumer group (``groupId`` in ``offsets.json``): the group
whose committed offsets go with this state. :meth:`StateStore.claim_group` records it when the
directory is new (a group of the directory's own unless one is named: a new state never inherits
what another consumer's group acknowledged), takes it from there afterwards, and refuses another
group by name (a :class:`~deltamirror.core.errors.ConfigError`). A directory written before groups
were recorded takes the group it is next used with. The command line records which command made
the directory (``command``) and refuses the other one (see :meth:`StateStore.claim_group`); the
saves keep the record.

Older formats are read and migrated when the store is loaded: format 2 (``tables/<key>.json``, a
sidecar, beside ``tables/<key>-v<version>-<token>.parquet``, the files) and format 1 (one JSON
file per table, every ``add`` inline). Each migrated table is written as a checkpoint folder, then
``offsets.json`` is rewritten, then the old files go; a crash in between migrates again (a table
that has both a folder and an old file is read from its folder). A newer format is refused with a
:class:`~deltamirror.core.errors.ConfigError`. Going back to a deltamirror that wrote format 2 is
not supported: it does not see the folders (delete the state directory to rebuild from the topic).

A directory that cannot be one (a file, or under one; ``tables`` not a directory) and an
``offsets.json`` that cannot be read, is not a JSON object or lacks the topic or the offsets are
a :class:`~deltamirror.core.errors.ConfigError` naming the path, never a traceback.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from deltamirror.core.errors import ConfigError

from .state import STATE_FORMAT, STATE_FORMAT_JSON, STATE_FORMAT_PARQUET, IncrementalSnapshot
from .table_folder import fsync_dir, prune, read_folder, remove_folder, write_folder, write_json

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

    def __init__(
        self,
        directory: str | Path,
        topic: str,
        commits_topic: str | None = None,
        *,
        group_id: str | None = None,
    ) -> None:
        self.root = Path(directory)
        self.topic = topic
        self.commits_topic = commits_topic
        #: the consumer group of this state (see the module docstring); None: the one recorded
        self.group_id = group_id
        #: the command whose state this is (``command`` in offsets.json; None: not recorded),
        #: kept by every save (see :meth:`claim_group`)
        self.command: str | None = None
        self.tables_dir = self.root / "tables"
        try:
            self.tables_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # a file given as the directory, or in its way; no permission
            in_way = next(
                (
                    p
                    for p in (self.tables_dir, self.root, *self.root.parents)
                    if p.exists() and not p.is_dir()
                ),
                None,
            )
            reason = f"{in_way} is not a directory" if in_way else f"{exc.filename}: {exc.strerror}"
            raise ConfigError(f"state directory {self.root} cannot be used: {reason}") from None
        self.offsets_path = self.root / "offsets.json"
        #: table id -> what offsets.json lists of it (folder, version, table URI)
        self._index: dict[str, dict[str, Any]] = {}
        #: folders written by the save in progress: pruned once the offsets are saved
        self._written: list[Path] = []

    @classmethod
    def claim_group(
        cls,
        directory: str | Path,
        topic: str,
        commits_topic: str | None = None,
        *,
        requested: str | None,
        default: str,
        command: str | None = None,
        command_groups: Mapping[str, str] | None = None,
    ) -> str:
        """The consumer group of the state in ``directory``, recorded there if it was not yet.

        A new directory records ``requested``, else a group of its own (``<default>-<12 hex>``),
        before anything is read, so that a crash before the first save does not lose it. A
        directory that records a group returns it; ``requested`` naming another is a ConfigError.
        One written before groups were recorded takes ``requested``, else ``default`` (the group
        it was used with then).

        With ``command`` (the command line's, e.g. ``invalidate``) the directory records which
        command made it, and another command's directory is a ConfigError: its position and
        group are what that command handed over, not this one (``invalidate`` over
        ``consume-snapshot``'s state would skip every version that command had read). One written
        before commands were recorded is told by its group: a default group of a command in
        ``command_groups`` (command -> its default group) is that command's; any other group
        takes ``command``.
        """
        store = cls(directory, topic, commits_topic)
        data = store._read_offsets_file()
        store.command = command
        if data is None:
            store.group_id = requested or f"{default}-{uuid.uuid4().hex[:12]}"
            store._write_position({}, {}, {})
            return store.group_id
        recorded = data.get("groupId")
        if command is not None:
            store._check_command(data, command, command_groups or {})
        if recorded is not None:
            store._check_group(str(recorded), requested)
            if command is None or "command" in data:
                return str(recorded)
        group = str(recorded) if recorded is not None else requested or default
        recorded_command = {"command": command} if command is not None else {}
        write_json(store.offsets_path, {**data, "groupId": group, **recorded_command})
        fsync_dir(store.root)
        return group

    def _check_command(
        self, data: Mapping[str, Any], command: str, command_groups: Mapping[str, str]
    ) -> None:
        """A ConfigError if ``data`` (offsets.json) is the state of another command than ``command``."""
        recorded = data.get("command")
        group = data.get("groupId")
        if recorded is not None:
            made_by, why = str(recorded), "it records"
        else:
            made_by = next(
                (
                    name
                    for name, default in command_groups.items()
                    if group == default or re.fullmatch(rf"{re.escape(default)}-[0-9a-f]{{12}}", str(group))
                ),
                command,
            )
            why = f"its consumer group {group} is that command's own"
        if made_by != command:
            raise ConfigError(
                f"state directory {self.root} is the state of {made_by}, not {command} ({why}; its "
                f"position and group are what {made_by} read): give {command} a state directory of its own"
            )

    def _check_group(self, recorded: str, requested: str | None) -> None:
        if requested is not None and requested != recorded:
            raise ConfigError(
                f"state directory {self.root} holds what consumer group {recorded} consumed, not group "
                f"{requested}: name {recorded} (or no group), or give group {requested} a state "
                "directory of its own"
            )

    def _read_offsets_file(self) -> dict[str, Any] | None:
        """``offsets.json`` as written (None if there is none), checked to be of this topic."""
        if not self.offsets_path.exists():
            return None
        try:
            data = json.loads(self.offsets_path.read_text())
        except OSError as exc:
            raise ConfigError(f"{self.offsets_path} cannot be read ({exc.strerror})") from None
        except ValueError as exc:  # not JSON, or not UTF-8
            raise self._malformed(f"not JSON: {exc}") from None
        if not isinstance(data, dict):
            raise self._malformed(f"a JSON {type(data).__name__}, not an object")
        if not isinstance(data.get("topic"), str):
            raise self._malformed("no topic")
        if data["topic"] != self.topic:
            raise ConfigError(
                f"state directory {self.root} holds the state of topic {data.get('topic')!r}, not {self.topic!r}"
            )
        if data.get("format") in (None, STATE_FORMAT):  # a newer format is refused as such (load)
            self._offsets_of(data)  # before a claim writes to it
        return data

    def _offsets_of(self, data: Mapping[str, Any]) -> tuple[dict[int, int], dict[int, int], dict[str, int]]:
        """The actions and commits offsets and the retired ids ``offsets.json`` holds."""
        try:
            return (
                {int(p): int(o) for p, o in data["partitions"].items()},
                {int(p): int(o) for p, o in data.get("commitsPartitions", {}).items()},
                {str(t): int(v) for t, v in data.get("retired", {}).items()},
            )
        except KeyError:
            raise self._malformed("no partitions") from None
        except (AttributeError, TypeError, ValueError) as exc:
            raise self._malformed(f"partitions, commitsPartitions or retired: {exc}") from None

    def _malformed(self, what: str) -> ConfigError:
        return ConfigError(
            f"{self.offsets_path} is not the offsets of a deltamirror consumer state ({what}): delete "
            f"{self.root} to rebuild the state from the topic"
        )

    def key(self, table_id: str) -> str:
        return hashlib.sha1(table_id.encode(), usedforsecurity=False).hexdigest()[:16]

    def folder(self, table_id: str) -> Path:
        """The Delta table folder of a table's state (what a Delta reader opens)."""
        return self.tables_dir / self.key(table_id)

    # --- loading -------------------------------------------------------------------------------

    def load(self) -> tuple[dict[str, IncrementalSnapshot], dict[int, int]]:
        """The tables and the actions-topic offsets (see :meth:`load_all` for the rest)."""
        tables, position = self.load_all()
        return tables, position.offsets

    def load_all(self, *, spill_stats: bool = False) -> tuple[dict[str, IncrementalSnapshot], Position]:
        """The tables and the position; with ``spill_stats`` the files' stats are not read (each
        state reads them from its checkpoint when asked: :meth:`IncrementalSnapshot.spill_stats`)."""
        position, stored_format = self._read_position()
        tables: dict[str, IncrementalSnapshot] = {}
        for folder in sorted(p for p in self.tables_dir.iterdir() if p.is_dir()):
            try:
                state = read_folder(folder, self.root if spill_stats else None)
            except ConfigError as exc:
                raise ConfigError(
                    f"{exc.message}: delete {self.root} to rebuild the state from the topic"
                ) from None
            if state is None:  # a first save that never wrote its hint
                remove_folder(folder)
                continue
            if folder.name != self.key(state.table_id):
                raise ConfigError(
                    f"{folder} holds the state of table {state.table_id}, whose folder is "
                    f"{self.key(state.table_id)}: delete {self.root} to rebuild the state from the topic"
                )
            tables[state.table_id] = state
        legacy = self._read_legacy(set(tables))
        for table_id in [t for t in (*tables, *legacy) if t in position.retired]:
            # dropped, but a crash came before its files went
            tables.pop(table_id, None)
            legacy.pop(table_id, None)
            remove_folder(self.folder(table_id))
        for state in tables.values():
            prune(self.folder(state.table_id))
            self._index[state.table_id] = self._entry(state)
        if legacy or stored_format != STATE_FORMAT or any(self.tables_dir.glob("*.json")):
            self._migrate(legacy, tables, position)
        self._delete_leftovers()
        return tables, position

    def _read_position(self) -> tuple[Position, int | None]:
        position = Position()
        data = self._read_offsets_file()
        if data is None:
            return position, STATE_FORMAT
        recorded = data.get("groupId")
        if recorded is not None:
            self._check_group(str(recorded), self.group_id)
            self.group_id = str(recorded)
        if data.get("command") is not None:  # kept by the saves
            self.command = str(data["command"])
        stored_format = data.get("format")
        if stored_format is not None and stored_format != STATE_FORMAT:
            raise ConfigError(
                f"{self.offsets_path} has snapshot state format {stored_format!r}, this deltamirror reads "
                f"{STATE_FORMAT_JSON} to {STATE_FORMAT}: run the version that wrote it, or delete "
                f"{self.root} to rebuild the state from the topic"
            )
        position.offsets, commits_offsets, position.retired = self._offsets_of(data)
        stored_commits = data.get("commitsTopic")
        if self.commits_topic is not None and stored_commits not in (None, self.commits_topic):
            raise ConfigError(
                f"state directory {self.root} followed commits topic {stored_commits!r}, not "
                f"{self.commits_topic!r}"
            )
        if self.commits_topic is not None and stored_commits == self.commits_topic:
            position.commits_offsets = commits_offsets
        return position, stored_format

    # --- formats 1 and 2 -------------------------------------------------------------------------

    def _read_legacy(self, have: set[str]) -> dict[str, IncrementalSnapshot]:
        """The tables of format-1 and format-2 files that have no folder yet."""
        out: dict[str, IncrementalSnapshot] = {}
        for path in sorted(self.tables_dir.glob("*.json")):
            data = json.loads(path.read_text())
            fmt = data.get("format") if isinstance(data, dict) else None
            if fmt not in (STATE_FORMAT_JSON, STATE_FORMAT_PARQUET):
                raise ConfigError(
                    f"{path} has snapshot state format {fmt!r}, this deltamirror reads {STATE_FORMAT_JSON} "
                    f"to {STATE_FORMAT}: run the version that wrote it, or delete {self.root} to rebuild "
                    "the state from the topic"
                )
            if str(data.get("tableId")) in have:  # migrated before a crash: the folder is in force
                continue
            if fmt == STATE_FORMAT_JSON:
                state = IncrementalSnapshot.from_json(data)
            else:
                state = IncrementalSnapshot.from_sidecar(data, self._read_legacy_files(path, data))
            out[state.table_id] = state
        return out

    def _read_legacy_files(self, sidecar: Path, data: Mapping[str, Any]) -> pa.Table:
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

    def _migrate(
        self,
        legacy: Mapping[str, IncrementalSnapshot],
        tables: dict[str, IncrementalSnapshot],
        position: Position,
    ) -> None:
        """Folders for the old tables, then offsets.json in format 3; the old files go after."""
        for state in legacy.values():
            log.info(
                "migrating the state of table %s to format %d (a Delta checkpoint)",
                state.table_id,
                STATE_FORMAT,
            )
            tables[state.table_id] = state
        self.write_tables(legacy.values())
        self._write_position(position.offsets, position.commits_offsets, position.retired)
        self._finish()
        for path in self.tables_dir.glob("*.json"):
            path.unlink(missing_ok=True)

    def _delete_leftovers(self) -> None:
        """Old Parquet files no sidecar names any more and temp files: what a save or migration left."""
        (self.root / f".{self.offsets_path.name}.tmp").unlink(missing_ok=True)
        for path in self.tables_dir.iterdir():
            stale_tmp = path.name.startswith(".") and path.name.endswith(".tmp")
            if stale_tmp or (path.is_file() and path.suffix == ".parquet" and not self._legacy_named(path)):
                path.unlink(missing_ok=True)

    def _legacy_named(self, path: Path) -> bool:
        return any(path.name.startswith(f"{p.stem}-") for p in self.tables_dir.glob("*.json"))

    # --- saving --------------------------------------------------------------------------------

    def _entry(self, state: IncrementalSnapshot) -> dict[str, Any]:
        return {
            "folder": f"tables/{self.key(state.table_id)}",
            "version": state.version,
            "tableUri": state.table_uri,
        }

    def write_tables(self, tables: Iterable[IncrementalSnapshot]) -> None:
        """Step 1 of a save: each table's checkpoint folder (a new folder made durable in ``tables``)."""
        created_any = False
        for state in tables:
            folder = self.folder(state.table_id)
            created = not folder.exists()
            write_folder(state, folder)
            if created:
                fsync_dir(folder)  # its _delta_log entry
                created_any = True
            self._index[state.table_id] = self._entry(state)
            self._written.append(folder)
        if created_any:
            fsync_dir(self.tables_dir)

    def delete_table(self, table_id: str) -> None:
        """A table's folder (its hint first, so no reader is sent to a deleted checkpoint)."""
        self._index.pop(table_id, None)
        remove_folder(self.folder(table_id))

    def save(
        self,
        tables: Iterable[IncrementalSnapshot],
        offsets: Mapping[int, int],
        *,
        commits_offsets: Mapping[int, int] | None = None,
        retired: Mapping[str, int] | None = None,
        dropped: Iterable[str] = (),
    ) -> None:
        """Steps 1 to 3 of the module docstring: tables, then the position, then what is superseded."""
        self.write_tables(tables)  # a crash before the offsets only means a re-read
        dropped = list(dropped)
        for table_id in dropped:
            self._index.pop(table_id, None)
        self._write_position(offsets, commits_offsets or {}, retired or {})
        self._finish()
        for table_id in dropped:  # retired in offsets.json now: a crash here is cleaned by load
            self.delete_table(table_id)

    def _write_position(
        self, offsets: Mapping[int, int], commits_offsets: Mapping[int, int], retired: Mapping[str, int]
    ) -> None:
        data: dict[str, Any] = {
            "format": STATE_FORMAT,
            "topic": self.topic,
            "partitions": {str(p): o for p, o in sorted(offsets.items())},
        }
        if self.group_id is not None:
            data["groupId"] = self.group_id
        if self.command is not None:
            data["command"] = self.command
        if self.commits_topic is not None:
            data["commitsTopic"] = self.commits_topic
            data["commitsPartitions"] = {str(p): o for p, o in sorted(commits_offsets.items())}
        data["retired"] = dict(sorted(retired.items()))
        data["tables"] = dict(sorted(self._index.items()))
        write_json(self.offsets_path, data)
        fsync_dir(self.root)

    def _finish(self) -> None:
        """Step 3 for the folders this save wrote: what their new checkpoint superseded goes."""
        for folder in self._written:
            prune(folder)
        self._written.clear()


__all__ = ["Position", "StateStore"]
