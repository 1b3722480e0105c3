"""Following one table's log: what to publish next, from where the last publish stopped.

The watcher knows nothing of Kafka. Given the last published :class:`Position` (from the progress
topic) or a snapshot mode, it hands out units of work in order: a snapshot, a commit, the
announcement that the location holds a new table, or a bare start position. The publisher turns
them into records; after any failure the service calls :meth:`TableWatcher.start` again with the
last *committed* position, so a version is never skipped and never published twice.

Finding new versions costs one ``stat`` of ``<next>.json`` per poll whatever the log's length; a
listing runs only every ``check_interval_s`` to notice what probing cannot see: a gap (versions
cleaned before they were published), the latest version going backwards, or a table deleted.
Version 0 is ``stat``-ed whenever new versions appear: a new ``0.json`` with another ``metaData.id``
means the table was re-created at the same path.

Every action of a commit is counted and summarized, and every line checked, before the first
record goes out (events carry ``index``/``count``; the summary and timestamp must be known; a
corrupt line must stop the version before any of it is published). Actions go out as the log's own
JSON bytes. A small commit is read and split once, its actions kept until they are published. A
large one is read twice, streaming (count and check, then hand out in batches): memory is bounded
by the batch size, whatever the size of the commit.
"""

from __future__ import annotations

import bisect
import itertools
import json
import logging
import operator
import threading
import time
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import repeat
from typing import IO, Annotated, Any, Literal

import msgspec
import orjson

from deltamirror.core import features
from deltamirror.core.commits import TimestampTracker, probe_next_versions
from deltamirror.core.errors import (
    CorruptLogError,
    LogGapError,
    VersionNotFoundError,
)
from deltamirror.core.events import SCHEMA_VERSION, CommitSummary
from deltamirror.core.log import commit_name, open_commit
from deltamirror.core.models import Metadata, Protocol
from deltamirror.core.replay import replay_config
from deltamirror.core.storage import FileInfo, TableStorage
from deltamirror.core.table import DeltaTable, open_table
from deltamirror.core.timestamps import (
    CommitTimestamp,
    IctConfig,
    TimestampSource,
    parse_timestamp,
    version_at_or_after,
)
from deltamirror.producer.snapshot_events import ActionBatch, Body, SnapshotWork

log = logging.getLogger(__name__)

SnapshotMode = Literal["initial", "latest", "from-version", "from-timestamp", "when-needed"]
SNAPSHOT_MODES: tuple[str, ...] = ("initial", "latest", "from-version", "from-timestamp", "when-needed")

#: commit files up to this size are read once and kept for the second pass
SMALL_COMMIT_BYTES = 16 * 1024 * 1024
#: distinct partitions listed in a commit summary
MAX_PARTITIONS_LISTED = 1000
#: versions probed ahead in one go while catching up
PROBE_AHEAD = 100


# --- positions and units of work --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Position:
    """The last published action of a table: ``index`` of ``version`` (of its snapshot).

    ``index + 1 == count`` means the version is complete. ``index == -1, count == 0`` is a start
    position with nothing published for ``version`` (``latest`` mode begins after it).
    """

    table_id: str
    version: int
    index: int
    count: int
    timestamp: CommitTimestamp
    snapshot: bool = False

    @property
    def complete(self) -> bool:
        return self.index + 1 >= self.count


@dataclass(frozen=True)
class TableReplacedWork:
    """The location holds another table than the one published so far."""

    previous_table_id: str
    previous_version: int
    table_id: str
    reason: str


@dataclass(frozen=True)
class PositionWork:
    """Nothing to publish, but a position to record (``latest`` mode's starting point)."""

    position: Position


@dataclass
class _Summary:
    """Counters of one version, filled while scanning it."""

    adds: int = 0
    removes: int = 0
    cdc: int = 0
    bytes_added: int = 0
    bytes_removed: int = 0
    partitions: dict[tuple[tuple[str, Any], ...], dict[str, Any]] = field(default_factory=dict)
    truncated: bool = False
    #: the partitions above in the key order they were met in (skips the sorting for a repeat)
    _seen: dict[tuple[tuple[str, Any], ...], None] = field(default_factory=dict, repr=False)

    _last: Any = field(default=None, repr=False)

    def count_file(self, name: str, size: Any, partition_values: Any) -> None:
        """One add, remove or cdc action: its count, its bytes (cdc has none) and its partition."""
        counted = type(size) is int and size >= 0  # not a bool, not nonsense
        if name == "add":
            self.adds += 1
            if counted:
                self.bytes_added += size
        elif name == "remove":
            self.removes += 1
            if counted:
                self.bytes_removed += size
        else:
            self.cdc += 1
        if partition_values:
            self.touch(partition_values)

    def count_plain(self, name: str, sizes: list[int | None], partitions: list[msgspec.Raw]) -> None:
        """Many adds (or removes) at once: their sizes, and their partition values in file order
        as JSON text (:class:`_FileFields`)."""
        if name == "add":
            self.adds += len(sizes)
            self.bytes_added += sum(filter(None, sizes))
        else:
            self.removes += len(sizes)
            self.bytes_removed += sum(filter(None, sizes))
        if self.truncated:
            return
        for text in dict.fromkeys(map(bytes, partitions)):  # the distinct ones, in the order met
            if text != b"null":
                self.touch(msgspec.json.decode(text))

    def touch(self, values: Any) -> None:
        if values == self._last:  # files of a commit come in runs of one partition
            return
        self._last = values
        if self.truncated or type(values) is not dict or not values:
            return
        if not all(v is None or type(v) is str for v in values.values()):
            # not the string map the protocol says: listed with its other values as JSON text
            values = {
                k: v if v is None or type(v) is str else orjson.dumps(v).decode() for k, v in values.items()
            }
        seen = tuple(values.items())  # as written: most files of a commit repeat a few of these
        if seen in self._seen:
            return
        key = tuple(sorted(seen))
        if key not in self.partitions:
            if len(self.partitions) >= MAX_PARTITIONS_LISTED:
                self.truncated = True
                return
            self.partitions[key] = values
        if len(self._seen) < 4 * MAX_PARTITIONS_LISTED:
            self._seen[seen] = None


class CommitWork:
    """One version to publish, from action ``start`` on."""

    snapshot = False

    def __init__(
        self,
        storage: TableStorage,
        table_id: str,
        version: int,
        timestamp: CommitTimestamp,
        scan: VersionScan,
        start: int = 0,
    ) -> None:
        self._storage = storage
        self.table_id = table_id
        self.table_uri = storage.uri
        self.version = version
        self.timestamp = timestamp
        self.scan = scan
        self.count = scan.count
        self.start = start

    def __repr__(self) -> str:
        return f"CommitWork(version={self.version}, count={self.count}, start={self.start})"

    def batches(self, size: int) -> Iterator[ActionBatch]:
        actions = self.scan.actions
        if actions is not None:  # a small commit, split already
            for i in range(self.start, len(actions), size):
                yield actions[i : i + size]
            return
        actions_left = iter_raw_actions(self._storage, self.version, self.scan)
        index = sum(1 for _ in itertools.islice(actions_left, self.start))  # published already
        while batch := list(itertools.islice(actions_left, size)):
            index += len(batch)
            yield batch
        if index != self.count:
            raise CorruptLogError(
                f"commit changed while it was read ({self.count} actions, then {index})",
                table=self.table_uri,
                version=self.version,
                file=self._storage.log_file(commit_name(self.version)),
            )

    def summary(self) -> CommitSummary:
        s = self.scan.summary
        ci = self.scan.commit_info or {}
        read_version = ci.get("readVersion")
        blind = ci.get("isBlindAppend")
        return CommitSummary(
            schema_version=SCHEMA_VERSION,
            table_id=self.table_id,
            table_uri=self.table_uri,
            version=self.version,
            commit_timestamp=self.timestamp.timestamp,
            commit_timestamp_source=str(self.timestamp.source),  # type: ignore[arg-type]
            snapshot=False,
            action_count=self.count,
            operation=ci.get("operation") if isinstance(ci.get("operation"), str) else None,
            read_version=read_version if isinstance(read_version, int) else None,
            is_blind_append=blind if isinstance(blind, bool) else None,
            adds=s.adds,
            removes=s.removes,
            cdc_files=s.cdc,
            bytes_added=s.bytes_added,
            bytes_removed=s.bytes_removed,
            partitions_touched=list(s.partitions.values()),
            partitions_touched_truncated=s.truncated,
            metadata_changed=self.scan.metadata is not None,
            protocol_changed=self.scan.protocol is not None,
        )


PublishUnit = CommitWork | SnapshotWork
Work = CommitWork | SnapshotWork | TableReplacedWork | PositionWork


def position_after(unit: PublishUnit, index: int) -> Position:
    """The position once action ``index`` of ``unit`` is published."""
    return Position(unit.table_id, unit.version, index, unit.count, unit.timestamp, unit.snapshot)


# --- reading a commit -------------------------------------------------------------------------


@dataclass
class VersionScan:
    """What the first pass over a commit learned."""

    version: int
    file: FileInfo
    count: int = 0
    commit_info: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    protocol: dict[str, Any] | None = None
    summary: _Summary = field(default_factory=_Summary)
    #: line numbers that must be decoded and re-encoded (several actions on a line, NaN, escapes)
    slow_lines: set[int] = field(default_factory=set)
    #: every action of a small commit as it is published (the file was read and split once)
    actions: list[tuple[str, Body]] | None = None

    def observe(self, name: str, body: Any) -> None:
        """Count one action into the summary; keep commitInfo, metaData and protocol."""
        self.count += 1
        if name in _FILE_ACTIONS:
            if type(body) is dict:
                self.summary.count_file(name, body.get("size"), body.get("partitionValues"))
            else:
                self.summary.count_file(name, None, None)
        elif name == "commitInfo" and self.commit_info is None and isinstance(body, dict):
            self.commit_info = body
        elif name == "metaData" and isinstance(body, dict):
            self.metadata = body
        elif name == "protocol" and isinstance(body, dict):
            self.protocol = body


_FILE_ACTIONS = frozenset({"add", "remove", "cdc"})


def _corrupt(storage: TableStorage, version: int, line: int, message: str) -> CorruptLogError:
    return CorruptLogError(
        message, table=storage.uri, version=version, file=storage.log_file(commit_name(version)), line=line
    )


def scan_version(
    storage: TableStorage, version: int, info: FileInfo, data: bytes | None = None
) -> VersionScan:
    """First pass: validate every line, count actions, keep commitInfo/metaData/protocol, summarize.

    A small commit is read whole (unless ``data``, its bytes read already, is given) and each line
    split (and its body decoded) once: its actions are kept for :func:`iter_raw_actions`. A large
    one is streamed, keeping nothing but the summary.
    """
    scan = VersionScan(version, info)
    if info.size <= SMALL_COMMIT_BYTES:
        try:
            if data is None:
                data = storage.read_bytes(storage.log_file(commit_name(version)))
        except FileNotFoundError:
            raise VersionNotFoundError(
                f"commit {version} disappeared while it was read",
                table=storage.uri,
                version=version,
                file=storage.log_file(commit_name(version)),
            ) from None
        if b"\r" in data:  # a lone CR ends a line too here (bytes.splitlines), as it always did
            data = b"\n".join(data.splitlines())
        scan.actions = []
        _scan_buffer(storage, scan, data, len(data), 0, scan.actions)
        return _not_empty(storage, scan)
    with open_commit(storage, version) as fh:  # listed: if it is gone now, the log was cleaned under us
        lineno = 0
        for data, end in _line_buffers(fh):
            lineno = _scan_buffer(storage, scan, data, end, lineno, None)
    return _not_empty(storage, scan)


def _not_empty(storage: TableStorage, scan: VersionScan) -> VersionScan:
    """A commit always holds at least one action: an empty file is one still being written (a
    writer without atomic put) or a broken one. Publishing it as a version of 0 actions would lose
    whatever it ends up holding, so the table stops and retries until the file has actions."""
    if scan.count == 0:
        raise CorruptLogError(
            f"commit {scan.version} has no actions (empty, or still being written)",
            table=storage.uri,
            version=scan.version,
            file=storage.log_file(commit_name(scan.version)),
        )
    return scan


#: the lines most commits are made of, as writers write them: (prefix, action type, where its body starts)
_FILE_LINE_PREFIXES = ((b'{"add":{', "add", 7), (b'{"remove":{', "remove", 10))


def _buffer_lines(data: bytes, end: int) -> list[bytes]:
    """The lines of ``data[:end]``, newlines left out (a final newline ends a line, it starts none)."""
    lines = (data if end == len(data) else data[:end]).split(b"\n")
    if end and data[end - 1] == 0x0A:
        lines.pop()
    return lines


class _FileFields(msgspec.Struct, gc=False):
    """What the summary needs of an add/remove body; the rest of the body is checked, not built.

    ``size`` is strict (``true``, ``1.0`` or ``-1`` is refused: such a body is decoded by orjson
    and summarized the general way). Partition values stay JSON text: a commit repeats a few of them,
    so only the distinct texts are decoded.
    """

    size: Annotated[int, msgspec.Meta(ge=0)] | None = None
    partitionValues: msgspec.Raw = msgspec.Raw(b"null")  # Delta's field name


_decode_file_fields = msgspec.json.Decoder(_FileFields).decode


def _utf8(data: bytes) -> bool:
    """Whether ``data`` is valid UTF-8. msgspec does not check the strings it skips: a buffer
    that fails this is decoded the general way, by orjson, line by line."""
    if data.isascii():
        return True
    try:
        str(data, "utf-8")
    except UnicodeDecodeError:
        return False
    return True


#: per line, whether it is a plain add (1) or remove (2) line, as writers write them
_STARTS_ADD = operator.methodcaller("startswith", _FILE_LINE_PREFIXES[0][0])
_STARTS_REMOVE = operator.methodcaller("startswith", _FILE_LINE_PREFIXES[1][0])
_ENDS_ACTION = operator.methodcaller("endswith", b"}}")
#: plain kind -> (action type, the body of such a line)
_PLAIN_BODY = {
    1: ("add", operator.itemgetter(slice(_FILE_LINE_PREFIXES[0][2], -1))),
    2: ("remove", operator.itemgetter(slice(_FILE_LINE_PREFIXES[1][2], -1))),
}
_SIZE = operator.attrgetter("size")
_PARTITION_VALUES = operator.attrgetter("partitionValues")


def _plain_kinds(data: bytes, lines: list[bytes]) -> list[int]:
    """Per line: 1 for a plain add line, 2 for a plain remove line, 0 for any other.

    Computed by C-level maps, without a Python step per line.
    """
    kinds = map(_STARTS_ADD, lines)
    if _FILE_LINE_PREFIXES[1][0] in data:
        kinds = map(operator.add, kinds, map(operator.lshift, map(_STARTS_REMOVE, lines), repeat(1)))
    return list(map(operator.mul, kinds, map(_ENDS_ACTION, lines)))


#: where a line ending in ``}`` meets an add line: splitting a buffer here gives nearly every
#: add body whole, in one copy and one C call, without a Python step per line
_ADD_BOUNDARY = b'}\n{"add":'


def _scan_buffer(
    storage: TableStorage,
    scan: VersionScan,
    data: bytes,
    end: int,
    lineno: int,
    keep: list[tuple[str, Body]] | None,
) -> int:
    """Validate and summarize the lines of ``data[:end]``, the first being line ``lineno + 1``.

    With ``keep``, each action is appended as it will be published. Returns the number of the
    last line.

    The buffer is split at :data:`_ADD_BOUNDARY`. A piece between two boundaries without a
    newline is exactly the body of an add line (``{"add":`` before it, ``}`` after it); runs of
    those are checked together by :func:`_scan_bodies`. Any other piece (the first, the last, one
    holding other lines) is turned back into its lines for :func:`_scan_line_run`, as is a run
    whose bodies are refused.
    """
    text = data if end == len(data) else data[:end]
    kept: list[tuple[str, Body]] = []
    if not _utf8(text):
        lineno = _scan_lines(storage, scan, _buffer_lines(text, len(text)), lineno, kept)
    else:
        pieces = text.split(_ADD_BOUNDARY)
        first = 0
        for is_body, n in _piece_runs(pieces):
            if is_body and _scan_bodies(scan, "add", _bodies(pieces, first, n), kept):
                lineno += n
            else:
                lineno = _scan_line_run(storage, scan, _piece_text(pieces, first, n), lineno, kept)
            first += n
    if keep is not None:
        keep.extend(kept)
    return lineno


def _bodies(pieces: list[bytes], first: int, n: int) -> list[bytes]:
    """A run of add-body pieces as published: JSON whitespace around them left out, as
    :func:`_split_line` leaves it out (``{"add": {...} }`` is valid too)."""
    return list(map(bytes.strip, pieces[first : first + n], repeat(_JSON_WS)))


def _piece_text(pieces: list[bytes], first: int, n: int) -> bytes:
    """The log's own text of ``n`` pieces from ``first`` (the boundaries between them put back)."""
    prefix = b"" if first == 0 else _ADD_BOUNDARY[2:]
    suffix = b"" if first + n == len(pieces) else b"}"
    return b"".join((prefix, _ADD_BOUNDARY.join(pieces[first : first + n]), suffix))


def _piece_runs(pieces: list[bytes]) -> list[tuple[bool, int]]:
    """Runs of ``pieces`` (a buffer split at add-line boundaries): (whether they are add bodies, how many).

    A piece between two boundaries is an add body unless it holds a newline (it spans other
    lines); the first and the last never are. Usually no middle piece holds one.
    """
    last = len(pieces) - 1
    if last >= 2 and max(map(bytes.find, pieces[1:last], repeat(b"\n"))) < 0:
        return [(False, 1), (True, last - 1), (False, 1)]
    flags = [0 < i < last and piece.find(b"\n") < 0 for i, piece in enumerate(pieces)]
    return [(is_body, len(list(run))) for is_body, run in itertools.groupby(flags)]


def _scan_line_run(
    storage: TableStorage, scan: VersionScan, text: bytes, lineno: int, kept: list[tuple[str, Body]]
) -> int:
    """The lines of ``text``: runs of plain add or remove lines by :func:`_scan_bodies`, the rest
    (and a run it refuses) one by one by :func:`_scan_lines`. Returns the number of the last line."""
    lines = _buffer_lines(text, len(text))
    first = 0
    for kind, run in itertools.groupby(_plain_kinds(text, lines)):
        n = len(list(run))
        chunk = lines[first : first + n] if n < len(lines) else lines
        if kind:
            name, body_of = _PLAIN_BODY[kind]
            if _scan_bodies(scan, name, list(map(body_of, chunk)), kept):
                first += n
                continue
        _scan_lines(storage, scan, chunk, lineno + first, kept)
        first += n
    return lineno + len(lines)


def _scan_bodies(scan: VersionScan, name: str, bodies: list[bytes], kept: list[tuple[str, Body]]) -> bool:
    """The bodies of a run of plain add (or remove) lines, checked by msgspec, which builds only
    what the summary reads. False (nothing counted) if any is refused: then the run is scanned
    line by line and orjson decides, as for every other line."""
    try:
        fields = list(map(_decode_file_fields, bodies))
    except msgspec.DecodeError:
        return False
    kept.extend(zip(repeat(name), bodies, strict=False))  # repeat() is endless
    scan.count += len(fields)
    scan.summary.count_plain(name, list(map(_SIZE, fields)), list(map(_PARTITION_VALUES, fields)))
    return True


def _scan_lines(
    storage: TableStorage, scan: VersionScan, lines: list[bytes], lineno: int, kept: list[tuple[str, Body]]
) -> int:
    """Lines one by one, the first being line ``lineno + 1``. A ``{"type": body}`` line is valid
    JSON exactly when its body is (the split checks the rest), so only the body is decoded; any
    other line is decoded whole and marked slow. Returns the number of the last line."""
    loads = orjson.loads
    decode_error = orjson.JSONDecodeError
    observe = scan.observe
    for line in lines:
        lineno += 1
        split = _split_line(line)
        if split is not None:
            try:
                body = loads(split[1])
            except decode_error:
                pass  # NaN, a duplicate key, a second action on the line...: decoded whole below
            else:
                kept.append(split)
                observe(split[0], body)
                continue
        if not line.strip():
            continue
        scan.slow_lines.add(lineno)
        for name, value in _decode_line(storage, scan.version, lineno, line):
            kept.append((name, value))
            observe(name, value)
    return lineno


#: a streamed commit is read this much at a time
_STREAM_CHUNK = 1024 * 1024


def _line_buffers(fh: IO[bytes]) -> Iterator[tuple[bytes, int]]:
    """A file as (buffer, end): whole lines in ``buffer[:end]``, cut at newlines as iterating it would."""
    pieces: list[bytes] = []  # a line longer than a chunk waits here for its end
    while block := fh.read(_STREAM_CHUNK):
        last = block.rfind(b"\n")
        if last < 0:
            pieces.append(block)
            continue
        data = b"".join((*pieces, block)) if pieces else block
        yield data, len(data) - len(block) + last + 1
        pieces = [block[last + 1 :]] if last + 1 < len(block) else []
    if pieces:
        data = b"".join(pieces)
        yield data, len(data)


def _decode_line(storage: TableStorage, version: int, lineno: int, raw: bytes) -> list[tuple[str, Any]]:
    """The actions of a line that is not a plain ``{"type": body}``, decoded; CorruptLogError if invalid."""
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        try:  # Python's parser accepts NaN/Infinity, as core's reader does
            obj = json.loads(raw)
        except ValueError as exc:
            raise _corrupt(storage, version, lineno, f"invalid JSON: {exc}") from exc
    if not isinstance(obj, dict) or not obj:
        raise _corrupt(storage, version, lineno, "a log line must be a JSON object holding an action")
    return list(obj.items())


#: JSON's whitespace: a line is split only where a JSON parser would have accepted it
_JSON_WS = b" \t\r\n"
#: action type names as raw key bytes -> the decoded name (checked once, then the same str each time)
_ACTION_KEYS: dict[bytes, str] = {}


def _action_key(raw: bytes) -> str | None:
    """The action type of the key bytes between the quotes; None unless a plain, valid JSON string."""
    if b"\\" in raw:
        return None
    try:  # control characters and invalid UTF-8 are refused here, as a whole-line parse would
        key = orjson.loads(b'"' + raw + b'"')
    except orjson.JSONDecodeError:
        return None
    assert isinstance(key, str)
    if len(_ACTION_KEYS) < 1024:
        _ACTION_KEYS[raw] = key
    return key


def _split_line(line: bytes) -> tuple[str, bytes] | None:
    """(action type, raw body) of the ``{"type": body}`` line; None if unusual.

    The body is the log's own bytes, JSON whitespace around it left out, not decoded: whether the
    line is valid JSON is then the body's question (what the split accepted around it is).
    """
    if not (line.startswith(b'{"') and line.endswith(b"}")):
        line = line.strip(_JSON_WS)
        if not (line.startswith(b'{"') and line.endswith(b"}")):
            return None
    end = line.find(b'"', 2)
    if end < 0:
        return None
    colon = end + 1
    if line[colon] != 0x3A:  # ':' (the closing brace is after the quote: end + 1 is in bounds)
        colon = line.find(b":", colon)
        if colon < 0 or line[end + 1 : colon].strip(_JSON_WS):
            return None
    raw_key = line[2:end]
    key = _ACTION_KEYS.get(raw_key)
    if key is None:
        key = _action_key(raw_key)
        if key is None:
            return None
    body = line[colon + 1 : -1].strip(_JSON_WS)  # strip() returns the same bytes if there is none
    if not body:
        return None
    return key, body


def iter_raw_actions(storage: TableStorage, version: int, scan: VersionScan) -> Iterator[tuple[str, Body]]:
    """Second pass: (type, body) per action in file order; bodies are the log's own bytes.

    A large commit is read again in the same buffers and split the same way as by the first pass,
    so the same bytes come out; only the lines the first pass marked slow are decoded again.
    """
    if scan.actions is not None:
        yield from scan.actions
        return
    slow = sorted(scan.slow_lines)
    with open_commit(storage, version) as fh:
        lineno = 0
        for data, end in _line_buffers(fh):
            text = data if end == len(data) else data[:end]
            if not _utf8(text):  # taken line by line by the first pass too
                lineno = yield from _raw_lines(storage, version, scan, _buffer_lines(text, len(text)), lineno)
                continue
            pieces = text.split(_ADD_BOUNDARY)
            first = 0
            for is_body, n in _piece_runs(pieces):
                i = bisect.bisect_right(slow, lineno)
                if is_body and (i == len(slow) or slow[i] > lineno + n):  # no slow line among them
                    yield from zip(
                        repeat("add"), _bodies(pieces, first, n), strict=False
                    )  # repeat() is endless
                    lineno += n
                else:
                    span = _piece_text(pieces, first, n)
                    lineno = yield from _raw_lines(
                        storage, version, scan, _buffer_lines(span, len(span)), lineno
                    )
                first += n


def _raw_lines(
    storage: TableStorage, version: int, scan: VersionScan, lines: list[bytes], lineno: int
) -> Generator[tuple[str, Body], None, int]:
    """Second pass over lines one by one (see :func:`_scan_lines`); returns the number of the last line."""
    for raw in lines:
        lineno += 1
        if lineno in scan.slow_lines:
            if raw.strip():
                yield from _decode_line(storage, version, lineno, raw)
            continue
        split = _split_line(raw)
        if split is None:
            if not raw.strip():
                continue
            raise _corrupt(storage, version, lineno, "commit changed while it was read")
        yield split
    return lineno


# --- finding the table's start and timestamps ------------------------------------------------


def timestamp_of(table: DeltaTable, version: int, ict: IctConfig) -> CommitTimestamp:
    """The resolved timestamp of ``version`` exactly as ``DeltaTable.commit_timestamps()`` gives it."""
    found = previous_timestamp(table, version, ict)
    if found is None or found.version != version:
        # a checkpoint whose commit file is gone: the snapshot's own resolution is all there is
        return table.snapshot(version, check_features=False).timestamp
    return found


def previous_timestamp(table: DeltaTable, version: int, ict: IctConfig) -> CommitTimestamp | None:
    """The resolved timestamp of the last commit at or before ``version`` (None if none is listed).

    It seeds the monotonic adjustment of the versions after it. ICT versions need only their own
    commitInfo; file-time versions only the listing (the adjustment chains from the first listed
    commit, as in ``commit_timestamps``).
    """
    if ict.applies_to(version) and version in table.listing(version).commits:
        value = table.commit_info(version).in_commit_timestamp
        if value is None:
            raise CorruptLogError(
                "In-Commit Timestamps are enabled for this version but its commitInfo has no inCommitTimestamp",
                table=table.uri,
                version=version,
            )
        return CommitTimestamp(version, value, TimestampSource.ICT)
    resolved = table.commit_timestamps(0, version, ict=ict)
    return resolved[-1] if resolved else None


def _v0_table_id(storage: TableStorage) -> str | None:
    """metaData.id of version 0, reading no further than its metaData line."""
    path = storage.log_file(commit_name(0))
    with storage.open(path) as fh:
        for raw in fh:
            if b'"metaData"' not in raw:
                continue
            try:
                obj = orjson.loads(raw)
            except orjson.JSONDecodeError:
                continue
            meta = obj.get("metaData") if isinstance(obj, dict) else None
            if isinstance(meta, dict) and isinstance(meta.get("id"), str):
                return str(meta["id"])
    return None


@dataclass(frozen=True)
class TableHead:
    """The metaData and protocol in force at a version: all the watcher needs to start there."""

    version: int
    metadata: Metadata
    protocol: Protocol

    @property
    def ict(self) -> IctConfig:
        return IctConfig.from_configuration(self.metadata.configuration)


def read_head(table: DeltaTable, version: int) -> TableHead:
    """metaData and protocol at ``version`` without replaying the table's files (core's
    :func:`~deltamirror.core.replay.replay_config`: commits streamed newest first, then the checkpoint)."""
    segment = table.segment(version)
    metadata, protocol = replay_config(table.storage, segment)
    return TableHead(segment.version, metadata, protocol)


# --- reading ahead ----------------------------------------------------------------------------

#: small commits read ahead of the one being published
PREFETCH_DEPTH = 2


class CommitPrefetch:
    """Reads the next commits in a helper thread while the current one is published.

    Catching up a long log costs a read per version: on an object store a request of tens of
    milliseconds, on a local disk a copy of the file. Either runs while the watcher's thread scans,
    encodes and produces (the read releases the GIL). Only small commits are read ahead, at most
    :data:`PREFETCH_DEPTH` of them; a read that failed, or a file that changed since it was listed,
    is simply read again by the scan, which reports what it meets.
    """

    def __init__(self, storage: TableStorage) -> None:
        self._storage = storage
        self._pool: ThreadPoolExecutor | None = None
        self._reads: dict[int, tuple[FileInfo, Future[bytes]]] = {}

    def want(self, ahead: Iterable[tuple[int, FileInfo]]) -> None:
        """Start reading these versions (the next ones to publish, in order)."""
        for version, info in itertools.islice(ahead, PREFETCH_DEPTH):
            if version in self._reads or info.size > SMALL_COMMIT_BYTES:
                continue
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="deltamirror-prefetch")
            path = self._storage.log_file(commit_name(version))
            self._reads[version] = (info, self._pool.submit(self._storage.read_bytes, path))

    def take(self, version: int, info: FileInfo) -> bytes | None:
        """The bytes of ``version`` if they were read ahead and still match its listing, else None."""
        entry = self._reads.pop(version, None)
        if entry is None:
            return None
        known, future = entry
        if known != info:
            future.cancel()
            return None
        try:
            data = future.result()
        except Exception:  # the scan reads it again and reports what it meets
            return None
        return data if len(data) == info.size else None

    def clear(self) -> None:
        for _, future in self._reads.values():
            future.cancel()
        self._reads.clear()

    def close(self) -> None:
        self.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


# --- the watcher ------------------------------------------------------------------------------


class TableWatcher:
    """Hands out what to publish next for one table, in order, from a position or a snapshot mode."""

    def __init__(
        self,
        uri: str,
        storage_options: dict[str, Any] | None = None,
        *,
        mode: SnapshotMode = "initial",
        from_version: int | None = None,
        from_timestamp: str | int | None = None,
        check_interval_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if mode not in SNAPSHOT_MODES:
            raise ValueError(f"unknown snapshot mode {mode!r}")
        self.table = open_table(uri, storage_options)
        self.storage = self.table.storage
        self.uri = self.table.uri
        self.mode = mode
        self.from_version = from_version
        self.from_timestamp = from_timestamp
        self.check_interval_s = check_interval_s
        self._clock = clock
        self._pending: deque[Work] = deque()
        self._ahead: deque[tuple[int, FileInfo]] = deque()
        self._table_id: str | None = None
        self._cursor = -1
        self._tracker = TimestampTracker(IctConfig())
        self._v0: FileInfo | None = None
        self._next_check = 0.0
        self._idle = True
        self._prefetch = CommitPrefetch(self.storage)

    def __repr__(self) -> str:
        return f"TableWatcher({self.uri!r}, cursor={self._cursor})"

    def close(self) -> None:
        """Stop reading ahead (the watcher can be started again)."""
        self._prefetch.close()

    @property
    def table_id(self) -> str | None:
        return self._table_id

    @property
    def cursor(self) -> int:
        """The last version handed out (or the version a start position is at)."""
        return self._cursor

    def next_commit_size(self) -> int:
        """Size in bytes of the next commit already found (0 if none is known yet)."""
        return self._ahead[0][1].size if self._ahead and not self._pending else 0

    @property
    def versions_ahead(self) -> int:
        """Versions known to exist after the cursor (a lower bound while catching up)."""
        return len(self._ahead)

    # --- starting ------------------------------------------------------------------------------

    def start(self, position: Position | None) -> None:
        """(Re)start right after ``position``; without one, where the snapshot mode says.

        Called again after any failure with the last committed position: everything handed out
        since is forgotten and will be handed out again.
        """
        self._pending.clear()
        self._ahead.clear()
        self._prefetch.clear()
        self._v0 = self._stat_version0()
        self._idle = True
        self._next_check = self._clock() + self.check_interval_s
        if position is None:
            self._start_fresh(self.mode)
        else:
            self._resume(position)

    def _start_fresh(self, mode: str, *, replaced: bool = False) -> None:
        latest = self.table.latest_version()
        if mode in ("initial", "when-needed"):
            self._begin_snapshot(latest)
            return
        if mode == "latest" and not replaced:
            head = self._checked_head(latest)
            ts = timestamp_of(self.table, latest, head.ict)
            self._set_cursor(head.metadata.id, latest, head.ict, ts)
            self._pending.append(PositionWork(Position(head.metadata.id, latest, -1, 0, ts)))
            return
        if replaced or mode == "latest":
            first = min(self.table.listing(0).commits, default=None)
            if first is None or first != 0:
                self._begin_snapshot(latest)  # the new table's start is gone: its state will do
                return
            start = 0
        elif mode == "from-version":
            assert self.from_version is not None, "from-version needs from_version"
            start = self.from_version
        else:
            assert self.from_timestamp is not None, "from-timestamp needs from_timestamp"
            ts_ms = (
                parse_timestamp(self.from_timestamp)
                if isinstance(self.from_timestamp, str)
                else int(self.from_timestamp)
            )
            ict = read_head(self.table, latest).ict
            found = version_at_or_after(self.table.commit_timestamps(ict=ict), ts_ms, ict, table=self.uri)
            start = latest + 1 if found is None else found
        self._begin_at(start, latest)

    def _checked_head(self, version: int) -> TableHead:
        head = read_head(self.table, version)
        features.check_readable(head.protocol, table=self.uri, version=head.version)
        return head

    def _begin_at(self, start: int, latest: int) -> None:
        """Publish from version ``start`` on (it may not exist yet)."""
        if start <= latest:
            listing = self.table.listing(start)
            if start not in listing.commits:
                raise VersionNotFoundError(
                    f"version {start} is not in the log (cleaned up, or never written)",
                    table=self.uri,
                    version=start,
                )
        try:
            head = self._checked_head(min(start, latest))
        except VersionNotFoundError:  # cleaned up before any checkpoint: the latest state names the table
            head = self._checked_head(latest)
        previous = previous_timestamp(self.table, min(start - 1, latest), head.ict) if start > 0 else None
        self._set_cursor(head.metadata.id, start - 1, head.ict, previous)

    def _begin_snapshot(self, version: int) -> None:
        snap = self.table.snapshot(version)
        ict = IctConfig.from_configuration(snap.metadata.configuration)
        ts = timestamp_of(self.table, version, ict)
        self._set_cursor(snap.metadata.id, version, ict, ts)
        self._pending.append(SnapshotWork(snap, self.uri, ts))

    def _set_cursor(
        self, table_id: str, version: int, ict: IctConfig, previous: CommitTimestamp | None
    ) -> None:
        self._table_id = table_id
        self._cursor = version
        self._tracker = TimestampTracker(ict, previous)

    def _resume(self, position: Position) -> None:
        latest = self.table.latest_version()
        if latest < position.version:
            self._replaced(position, f"the latest version went backwards ({position.version} -> {latest})")
            return
        try:
            head: TableHead | None = read_head(self.table, position.version)
        except VersionNotFoundError:
            head = None
        if head is not None and head.metadata.id != position.table_id:
            self._replaced(position, f"version {position.version} now belongs to table {head.metadata.id}")
            return
        if head is None:
            # the published version cannot be rebuilt any more (log cleaned): fine if what follows is there
            needed = position.version + (1 if position.complete else 0)
            if needed not in self.table.listing(needed).commits:
                self._gap(position.version, latest, position)
                return
            head = read_head(self.table, latest)
        features.check_readable(head.protocol, table=self.uri, version=head.version)
        self._set_cursor(position.table_id, position.version, head.ict, position.timestamp)
        if position.complete:
            return
        start = position.index + 1
        if position.snapshot:
            if head.version != position.version:
                self._gap(position.version, latest, position)
                return
            snap = self.table.snapshot(position.version)
            self._pending.append(SnapshotWork(snap, self.uri, position.timestamp, start))
            return
        info = self.table.listing(position.version).commits.get(position.version)
        if info is None:
            self._gap(position.version, latest, position)
            return
        scan = scan_version(self.storage, position.version, info)
        self._pending.append(
            CommitWork(self.storage, position.table_id, position.version, position.timestamp, scan, start)
        )

    def _gap(self, missing_after: int, latest: int, position: Position | None) -> None:
        if self.mode == "when-needed":
            log.warning(
                "versions after %d were cleaned from the log before they were published: new snapshot",
                missing_after,
                extra={"table": self.uri, "version": latest},
            )
            self._begin_snapshot(latest)
            return
        raise LogGapError(
            f"version {missing_after + 1} is no longer in the log but was never published "
            "(snapshot mode when-needed would publish a new snapshot)",
            table=self.uri,
            version=missing_after + 1,
        )

    def _replaced(self, position: Position, reason: str) -> None:
        self._pending.clear()
        self._ahead.clear()
        self._prefetch.clear()
        self._start_fresh(self.mode, replaced=True)
        assert self._table_id is not None
        log.warning("table re-created at the same location: %s", reason, extra={"table": self.uri})
        self._pending.appendleft(
            TableReplacedWork(position.table_id, position.version, self._table_id, reason)
        )

    # --- tailing -------------------------------------------------------------------------------

    def next_work(self) -> Work | None:
        """The next unit to publish, or None when the table has nothing new right now."""
        if self._pending:
            return self._pending.popleft()
        if not self._ahead:
            found = probe_next_versions(self.storage, self._cursor, limit=PROBE_AHEAD)
            if not found:
                self._idle = True
                if self._clock() >= self._next_check:
                    self._next_check = self._clock() + self.check_interval_s
                    self._check_log()
                    if self._pending:
                        return self._pending.popleft()
                return None
            self._ahead.extend(found)
        if self._idle:
            self._idle = False
            if self._check_version0():
                return self._pending.popleft()
        version, info = self._ahead[0]
        data = self._prefetch.take(version, info)
        self._prefetch.want(itertools.islice(self._ahead, 1, None))
        scan = scan_version(self.storage, version, info, data)
        if scan.protocol is not None:
            protocol = Protocol.model_validate(scan.protocol)
            features.check_readable(protocol, table=self.uri, version=version)
        if scan.metadata is not None:
            metadata = Metadata.model_validate(scan.metadata)
            self._tracker.observe_metadata(metadata)
            if metadata.id != self._table_id:
                log.warning(
                    "metaData.id changed within the log (%s -> %s)",
                    self._table_id,
                    metadata.id,
                    extra={"table": self.uri, "version": version},
                )
                self._table_id = metadata.id
        ict_value = (scan.commit_info or {}).get("inCommitTimestamp")
        ts = self._tracker.resolve(
            version, info.modification_time, ict_value if isinstance(ict_value, int) else None
        )
        self._ahead.popleft()
        self._cursor = version
        assert self._table_id is not None
        return CommitWork(self.storage, self._table_id, version, ts, scan)

    def _current_position(self) -> Position:
        assert self._table_id is not None
        ts = self._tracker.previous or CommitTimestamp(self._cursor, 0, TimestampSource.FILE_TIME)
        return Position(self._table_id, self._cursor, 0, 1, ts)

    def _stat_version0(self) -> FileInfo | None:
        try:
            return self.storage.info(self.storage.log_file(commit_name(0)))
        except FileNotFoundError:
            return None

    def _check_version0(self) -> bool:
        """True (and work queued) when ``0.json`` was written again, for another table.

        Log cleanup deletes ``0.json`` and never writes it back: a new one means a new table.
        """
        info = self._stat_version0()
        known, self._v0 = self._v0, info
        if info is None or info == known:
            return False
        new_id = _v0_table_id(self.storage)
        if new_id is None or new_id == self._table_id:
            return False
        self._replaced(self._current_position(), f"version 0 was written again with metaData.id {new_id}")
        return True

    def _check_log(self) -> None:
        """The slow checks (a listing): the table deleted, re-created, or versions cleaned unpublished."""
        latest = self.table.latest_version()
        if latest < self._cursor:
            self._replaced(
                self._current_position(), f"the latest version went backwards ({self._cursor} -> {latest})"
            )
            return
        if self._check_version0():
            return
        if latest > self._cursor and self._cursor + 1 not in self.table.listing(self._cursor + 1).commits:
            self._gap(self._cursor, latest, None)


# --- waking up early on a local file system -------------------------------------------------


class LogWaker:
    """Waits for the next poll, or less when a file appears in a local ``_delta_log``.

    Notifications come from watchdog (inotify, FSEvents, ReadDirectoryChangesW). They only shorten
    the wait: the listing stays the source of truth, so a lost or spurious notification costs at
    most one poll interval. Object stores have no notifications here: there it simply waits.
    """

    def __init__(self, storage: TableStorage, enabled: bool = True) -> None:
        self._changed = threading.Event()
        self._observer: Any = None
        if not enabled or not storage.uri.startswith("file://"):
            return
        from watchdog.events import FileSystemEvent, FileSystemEventHandler
        from watchdog.observers import Observer

        changed = self._changed

        class _OnLogFile(FileSystemEventHandler):
            def on_any_event(self, event: FileSystemEvent) -> None:
                if event.event_type in ("created", "moved", "closed") and not event.is_directory:
                    changed.set()

        observer = Observer()
        try:
            observer.schedule(_OnLogFile(), storage.log_path, recursive=False)
            observer.daemon = True
            observer.start()
        except OSError as exc:  # no _delta_log yet, or the inotify watch limit reached: just poll
            log.info("no file notifications for %s (%s); polling", storage.log_path, exc)
            return
        self._observer = observer

    @property
    def notifying(self) -> bool:
        return self._observer is not None

    def wait(self, timeout: float, stop: threading.Event | None = None) -> None:
        """Return after ``timeout`` seconds, on a log file event, or when ``stop`` is set."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or (stop is not None and stop.is_set()):
                return
            if self._changed.wait(min(left, 0.1)):
                self._changed.clear()
                return

    def close(self) -> None:
        if self._observer is not None:
            self._observer.stop()
            self._observer.join(timeout=5)
            self._observer = None


__all__ = [
    "SNAPSHOT_MODES",
    "CommitWork",
    "LogWaker",
    "Position",
    "PositionWork",
    "PublishUnit",
    "SnapshotWork",
    "TableReplacedWork",
    "TableWatcher",
    "Work",
    "position_after",
    "scan_version",
    "timestamp_of",
]
