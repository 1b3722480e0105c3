"""Log replay: a checkpoint plus the commits after it reconciled into one table state, in Arrow.

A file is identified by (canonical path, deletion vector id). The newest action on a key wins: an
``add`` makes it active, a ``remove`` makes it a tombstone. Checkpoint rows are already reconciled,
so they only need to be dropped when a later commit touches their key; that is one vectorized
``is_in`` over the checkpoint, whatever its size.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from deltamirror.core.compute import pc

from . import action_schema, features
from .accumulator import APPLIED_ACTIONS, ORDER, ActionAccumulator
from .actions import (
    KNOWN_ACTIONS,
    ActionRun,
    Where,
    iter_values,
)
from .checkpoint import CheckpointState, read_checkpoint, read_checkpoint_config
from .deletion_vectors import dv_unique_ids
from .errors import CorruptLogError, IncompleteTableStateError, UnsupportedFeatureError, VersionNotFoundError
from .file_table import CHECKPOINT_ROW, CHECKPOINT_ROW_TYPE, FileTable, with_deferred
from .log import (
    Compaction,
    LogSegment,
    check_commit,
    commit_name,
    compaction_runs,
    stream_commit,
    timestamp_problem,
)
from .models import CommitInfo, DomainMetadata, Metadata, Protocol, Txn
from .storage import TableStorage

__all__ = [
    "ORDER",
    "ActionAccumulator",
    "TableState",
    "canonical_paths",
    "file_keys",
    "reconcile",
    "replay",
    "replay_config",
]

log = logging.getLogger(__name__)

#: file actions become Arrow rows every this many: a commit of a million files is never a
#: million Python objects at once (a streamed commit's runs come a buffer of lines at a time)
_BATCH_ROWS = 4_096


def canonical_paths(paths: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """``file:/x``, ``file:///x`` and ``/x`` name the same file (delta-spark canonicalizes paths).

    Almost no log has ``file:`` paths; a scan for the prefix is far cheaper than the regex.
    """
    if not pc.any(pc.starts_with(paths, "file:")).as_py():
        return paths
    return pc.replace_substring_regex(paths, pattern=r"^file:/+", replacement="/")


def file_keys(paths: pa.Array | pa.ChunkedArray, dvs: pa.Array | pa.ChunkedArray) -> pa.Array:
    """The replay key of each file action: canonical path + NUL + deletion vector id."""
    if isinstance(paths, pa.ChunkedArray):
        paths = paths.combine_chunks()
    if isinstance(dvs, pa.ChunkedArray):
        dvs = dvs.combine_chunks()
    dv_ids = pc.fill_null(dv_unique_ids(dvs), "")
    return pc.binary_join_element_wise(canonical_paths(paths), dv_ids, "\x00")


def _untouched(rows: pa.Table, touched_paths: pa.Array, touched_keys: pa.Array) -> pa.Table:
    """The checkpoint rows whose key no commit touched.

    Keys are built only for rows whose path a commit names: a checkpoint of a million files
    gets one hash lookup per path instead of a million key strings.
    """
    if rows.num_rows == 0:
        return rows
    candidate = pc.is_in(canonical_paths(rows["path"]), value_set=touched_paths)
    if not pc.any(candidate).as_py():
        return rows
    if isinstance(candidate, pa.ChunkedArray):
        candidate = candidate.combine_chunks()
    # filtered chunk by chunk: a take would first concatenate every chunk of the million paths
    named = rows.select(["path", "deletionVector"]).filter(candidate)
    hit = pc.is_in(file_keys(named["path"], named["deletionVector"]), value_set=touched_keys)
    dropped = pc.replace_with_mask(candidate, candidate, hit)
    return action_schema.keep_rows(rows, pc.invert(dropped))


@dataclass
class TableState:
    """The reconciled state at one version."""

    version: int
    metadata: Metadata
    protocol: Protocol
    #: active files; the checkpoint's stats are read when first used
    files: FileTable
    tombstones: pa.Table
    txns: dict[str, Txn] = field(default_factory=dict)
    domains: dict[str, DomainMetadata] = field(default_factory=dict)
    #: the commitInfo of each commit replay read (none of those a compaction file stood in for)
    commit_infos: dict[int, CommitInfo] = field(default_factory=dict)
    #: action types this version of deltamirror does not know, with how often they occur
    unknown_actions: dict[str, int] = field(default_factory=dict)


@dataclass
class _Read:
    """One file replay read after the checkpoint: a commit, or a compaction in place of its commits
    (whose file actions took places ``orders`` in the log order)."""

    where: Where
    actions: int
    commit_info: dict[str, Any] | None = None
    commit_info_line: int | None = None
    orders: range | None = None


def _collect(
    storage: TableStorage, files: Iterable[int | Compaction], metadata: Metadata | None
) -> tuple[ActionAccumulator, list[CorruptLogError]]:
    """The actions of the commits and compaction files, validated, each file checked as a whole
    (:func:`check_commit`) against the metaData in force there (``metadata``, the checkpoint's,
    until one replaces it; a commit before any metaData is checked once the first one is known).

    With the actions: the commits In-Commit Timestamps require a timestamp of and that lack one
    (raised once the protocol is known readable: a table refused by feature name is refused by
    that name). A compaction file that is not a reconciled state (:func:`_usable_compaction`) is
    passed over with a warning and its commits read; only if one of them is missing is the table
    refused."""
    pending = ActionAccumulator(table=storage.uri, batch_rows=_BATCH_ROWS)
    timestamp_problems: list[CorruptLogError] = []
    order = 0
    unchecked: list[_Read] = []
    for item in files:
        passed_over: str | None = None
        if isinstance(item, Compaction):
            runs, passed_over = _usable_compaction(storage, item)
            if runs is not None:
                read, order = _take_compaction(storage, pending, item, runs, order)
                unchecked.append(read)
            versions: Iterable[int] = item.versions if runs is None else ()
        else:
            versions = (item,)
        for version in versions:
            try:
                read, order = _take_commit(storage, pending, version, order)
            except VersionNotFoundError as exc:
                if passed_over is None:
                    raise
                assert isinstance(item, Compaction)
                raise CorruptLogError(
                    f"log compaction file {item.file.name} is not usable ({passed_over}) and commit "
                    f"{version}, which it covers, is missing",
                    table=storage.uri,
                    version=version,
                    file=storage.log_file(item.file.name),
                ) from exc
            unchecked.append(read)
        in_force = pending.metadata or metadata
        if in_force is not None:
            for done in unchecked:
                check_commit(
                    done.where,
                    actions=done.actions,
                    metadata=in_force,
                    commit_info=done.commit_info,
                    commit_info_line=done.commit_info_line,
                    timestamps=False,
                )
                if done.orders is None:  # a compaction holds no commitInfo: its commits are not read
                    problem = timestamp_problem(done.where, in_force, done.commit_info, done.commit_info_line)
                    if problem is not None:
                        timestamp_problems.append(problem)
            unchecked.clear()
    for done in unchecked:  # no metaData at all: the segment is refused for that
        if done.actions == 0:
            raise done.where.refuse(f"commit {done.where.version} has no actions (an empty commit file)")
    return pending, timestamp_problems


def _take_commit(
    storage: TableStorage, pending: ActionAccumulator, version: int, order: int
) -> tuple[_Read, int]:
    """One commit's actions into ``pending``; file actions take places from ``order`` on."""
    file = storage.log_file(commit_name(version))
    read = _Read(Where(storage.uri, file, version), 0)
    first = order
    for run in stream_commit(storage, version):  # a large commit is never held whole as objects
        name, n = run.name, len(run)
        if name == "add" or name == "remove":
            pending.take_files(name, run.values, first_order=order + 1)
        elif name in APPLIED_ACTIONS:
            if name == "commitInfo" and read.commit_info is None:
                read.commit_info, read.commit_info_line = run.values[0], run.line
            for value in run.values:
                pending.take(version, name, value)
            if name == "metaData" and pending.metadata is not None:  # the last of the run wins
                pending.metadata.located(read.where, run.line + n - 1)
        elif name not in KNOWN_ACTIONS:
            _take_unknown(pending, version, run, file)
        order += n
    read.actions = order - first
    return read, order


def _take_compaction(
    storage: TableStorage,
    pending: ActionAccumulator,
    compaction: Compaction,
    runs: Iterable[ActionRun],
    order: int,
) -> tuple[_Read, int]:
    """A compaction file's actions into ``pending``, as one commit at the end of its range.

    Its runs are a reconciled state (:func:`_usable_compaction` checked them). A ``commitInfo`` is
    no state and is not taken (its version would be a guess)."""
    file = storage.log_file(compaction.file.name)
    read = _Read(Where(storage.uri, file), 0, orders=range(0))
    first = order
    for run in runs:
        name, n = run.name, len(run)
        if name == "add" or name == "remove":
            pending.take_files(name, run.values, first_order=order + 1)
        elif name in _ONCE_PER_STATE:
            for value in run.values:
                pending.take(compaction.end, name, value)
            if name == "metaData" and pending.metadata is not None:
                pending.metadata.located(read.where, run.line + n - 1)
        elif name not in KNOWN_ACTIONS:
            _take_unknown(pending, compaction.end, run, file)
        order += n
    read.actions = order - first
    read.orders = range(first + 1, order + 1)
    return read, order


#: the non-file actions a reconciled state holds once per id
_ONCE_PER_STATE: dict[str, Callable[[dict[str, Any]], str]] = {
    "metaData": lambda _: "",
    "protocol": lambda _: "",
    "txn": lambda value: str(value["appId"]),
    "domainMetadata": lambda value: str(value["domain"]),
}


def _named(key: str) -> str:
    return f" of {key!r}" if key else ""


def _take_unknown(pending: ActionAccumulator, version: int, run: ActionRun, file: str) -> None:
    if run.name not in pending.unknown:
        log.warning("unknown action type %r in %s line %d: kept, not applied", run.name, file, run.line)
    for value in run.values:
        pending.take(version, run.name, value)  # counted


def _usable_compaction(
    storage: TableStorage, compaction: Compaction
) -> tuple[list[ActionRun] | None, str | None]:
    """(the runs of a compaction file, None) when it is a reconciled state, else (None, why not).

    A compaction file is an optimisation: the commits it covers say the same. One that cannot be
    read, does not hold valid actions, or is not reconciled (a file, app id or domain named twice, a
    second metaData or protocol: the order of its lines would decide what it says, and the
    protocol gives them none) is passed over with a warning, as delta-rs and delta-kernel-rs pass
    it over, and the commits are read instead."""
    path = storage.log_file(compaction.file.name)
    problem: str | None
    try:
        found = compaction_runs(storage, compaction)
        if found is None:  # unreadable or empty: compaction_runs said so
            return None, "it cannot be read"
        runs = list(found)
        problem = _not_reconciled(runs)
    except CorruptLogError as exc:
        runs, problem = [], f"line {exc.line}: {exc.message}" if exc.line else exc.message
    if problem is None:
        return runs, None
    log.warning(
        "log compaction file %s is passed over (%s): reading commits %d-%d instead",
        path,
        problem,
        compaction.start,
        compaction.end,
    )
    return None, problem


def _not_reconciled(runs: Sequence[ActionRun]) -> str | None:
    """Why a compaction file's actions are not one reconciled state, or None if they are."""
    seen: dict[tuple[str, str], int] = {}  # (action type, its id) -> line
    paths: list[pa.Array] = []
    dvs: list[pa.Array] = []
    for run in runs:
        if run.name in ("add", "remove"):
            table = pa.Table.from_pylist(run.values, schema=_KEY_COLUMNS)
            paths.append(table["path"].combine_chunks())
            dvs.append(table["deletionVector"].combine_chunks())
        elif run.name in _ONCE_PER_STATE:
            for i, value in enumerate(run.values):
                key = (run.name, _ONCE_PER_STATE[run.name](value))
                if key in seen:
                    return f"a second {run.name}{_named(key[1])} on line {run.line + i}, the first on line {seen[key]}"
                seen[key] = run.line + i
    if not paths:
        return None
    keys = file_keys(pa.concat_arrays(paths), pa.concat_arrays(dvs))
    if pc.count_distinct(keys).as_py() == len(keys):
        return None
    counts = pc.value_counts(keys)
    twice = counts.filter(pc.greater(counts.field("counts"), 1))[0]["values"].as_py()
    path, _, dv = twice.partition("\x00")
    return f"file {path!r}{f' (deletion vector {dv})' if dv else ''} is named by more than one add or remove"


#: what names a file action's file (path and deletion vector)
_KEY_COLUMNS = pa.schema([action_schema.ADD.field("path"), action_schema.ADD.field("deletionVector")])


#: sorted values are compared this many at a time
_WINDOW = 65_536


def _all_distinct(values: pa.Array | pa.ChunkedArray) -> bool:
    """Whether no value is there twice: sorted (indices only), then neighbours compared a window
    at a time. A hash table of a million paths (``unique``, ``count_distinct``) takes three times
    their size; this takes the indices and one window."""
    order = pc.sort_indices(values)
    for start in range(0, len(order) - 1, _WINDOW):
        window = values.take(order.slice(start, _WINDOW + 1))
        if pc.any(pc.equal(window.slice(1), window.slice(0, len(window) - 1))).as_py():
            return False
    return True


def _distinct_files(adds: pa.Table) -> bool:
    """Whether every add names another file (key). Distinct paths make distinct keys, and without
    deletion vectors a key is its path: keys are built only when paths repeat and a row has one."""
    paths = adds["path"]
    if paths.null_count == 0 and _all_distinct(canonical_paths(paths)):
        return True
    dvs = adds["deletionVector"]
    if dvs.null_count == len(dvs):
        return False
    return bool(pc.count_distinct(file_keys(adds["path"], dvs)).as_py() == adds.num_rows)


def reconcile(
    cp_adds: pa.Table,
    cp_removes: pa.Table,
    adds: pa.Table,
    removes: pa.Table,
    *,
    distinct_paths: bool = False,
) -> tuple[pa.Table, pa.Table]:
    """(active files, tombstones) from checkpoint rows and ordered commit rows (with ``__order``).

    ``distinct_paths``: the caller has checked that no two adds have the same canonical path (a
    consumer that sorted them for its own index), so that is not checked again.
    """
    if adds.num_rows == 0 and removes.num_rows == 0:
        return cp_adds, cp_removes
    touched: pa.Array | None
    if removes.num_rows == 0 and (distinct_paths or _distinct_files(adds)):
        # every key named once, nothing removed (an append): every add stands, nothing to order
        live_adds = adds.drop_columns([ORDER])
        live_removes = removes.drop_columns([ORDER])
        touched = None  # the add keys, built only when checkpoint rows must be matched with them
    else:
        add_keys = file_keys(adds["path"], adds["deletionVector"])
        rm_keys = file_keys(removes["path"], removes["deletionVector"])
        actions = pa.table(
            {
                "key": pa.concat_arrays([add_keys, rm_keys]),
                "order": pa.concat_arrays([adds[ORDER].combine_chunks(), removes[ORDER].combine_chunks()]),
            }
        ).sort_by([("key", "ascending"), ("order", "descending")])
        keys = actions["key"].combine_chunks()
        first = pc.not_equal(keys.slice(1), keys.slice(0, len(keys) - 1))
        is_first = pa.concat_arrays(
            [pa.array([True]), first.combine_chunks() if isinstance(first, pa.ChunkedArray) else first]
        )
        winners = actions["order"].combine_chunks().filter(is_first)
        live_adds = adds.filter(pc.is_in(adds[ORDER], winners)).drop_columns([ORDER])
        live_removes = removes.filter(pc.is_in(removes[ORDER], winners)).drop_columns([ORDER])
        touched = pc.unique(keys)
    if cp_adds.num_rows == 0 and cp_removes.num_rows == 0:
        return pa.concat_tables([cp_adds, live_adds]), pa.concat_tables([cp_removes, live_removes])
    if touched is None:
        touched = file_keys(adds["path"], adds["deletionVector"])
    touched_paths = pc.unique(
        canonical_paths(pa.chunked_array(adds["path"].chunks + removes["path"].chunks, type=pa.string()))
    )
    files = pa.concat_tables([_untouched(cp_adds, touched_paths, touched), live_adds])
    tombstones = pa.concat_tables([_untouched(cp_removes, touched_paths, touched), live_removes])
    return files, tombstones


def replay(
    storage: TableStorage, segment: LogSegment, progress: Callable[[int, int], None] | None = None
) -> TableState:
    """The table state at ``segment.version``.

    ``progress(done, total)`` counts log files read (checkpoint parts and sidecars, then commits),
    for a caller that shows a long replay advancing; it is never called without one.
    """
    cp: CheckpointState | None = None
    files = segment.replay_files()
    read = 0
    if segment.checkpoint is not None:
        cp_progress = None if progress is None else (lambda done, total: progress(done, total + len(files)))
        cp = read_checkpoint(storage, segment.checkpoint, cp_progress)
        read = len(segment.checkpoint.files) + len(cp.sidecars)
    pending, timestamp_problems = _collect(
        storage,
        files if progress is None else _counted(files, read, progress),
        cp.metadata if cp else None,
    )
    metadata, protocol = _required(
        storage,
        segment,
        pending.metadata or (cp.metadata if cp else None),
        pending.protocol or (cp.protocol if cp else None),
    )
    if timestamp_problems:
        try:
            features.check_readable(protocol, table=storage.uri, version=segment.version)
        except UnsupportedFeatureError:
            pass  # the caller refuses the table by that feature's name (or reads the log anyway)
        else:
            raise timestamp_problems[0]
    txns = pending.txns_over(cp.actions.txns if cp else {})
    domains = pending.domains_over(cp.actions.domains if cp else {})
    adds, removes = pending.file_actions()
    if cp is not None:  # the checkpoint's rows carry their place, a commit's none (see with_deferred)
        adds = adds.append_column(
            pa.field(CHECKPOINT_ROW, CHECKPOINT_ROW_TYPE), pa.nulls(adds.num_rows, CHECKPOINT_ROW_TYPE)
        )
    active, tombstones = reconcile(
        cp.adds if cp else action_schema.ADD.empty_table(),
        cp.removes if cp else action_schema.REMOVE.empty_table(),
        adds,
        removes,
    )
    deferred = {"stats": cp.add_stats.read} if cp is not None and cp.add_stats is not None else {}
    return TableState(
        segment.version,
        metadata,
        protocol,
        with_deferred(active, deferred),
        tombstones,
        txns,
        domains,
        pending.commit_infos,
        pending.unknown,
    )


def _counted(
    files: Sequence[int | Compaction], before: int, progress: Callable[[int, int], None]
) -> Iterator[int | Compaction]:
    """``files`` in order, telling ``progress`` how many log files are read before each one."""
    total = before + len(files)
    for done, item in enumerate(files, start=before):
        progress(done, total)
        yield item
    progress(total, total)


_CONFIG_KEYS = (b'"metaData"', b'"protocol"')


def replay_config(storage: TableStorage, segment: LogSegment) -> tuple[Metadata, Protocol]:
    """The metaData and protocol in force at ``segment.version``, without reconciling any file.

    Commits are streamed newest first and only their metaData/protocol lines are decoded; the
    checkpoint is read only when the commits after it did not replace both. A change feed plan and
    a watcher's start need this, never the files: a full replay would read every file action, and
    a huge commit costs reading time here, never memory.
    """
    metadata: Metadata | None = None
    protocol: Protocol | None = None
    for version in reversed(segment.commit_versions):
        in_commit = ActionAccumulator(table=storage.uri)  # the last of each in the commit wins
        for line, name, value in iter_values(stream_commit(storage, version, only=_CONFIG_KEYS)):
            if name in ("metaData", "protocol"):
                action = in_commit.take(version, name, value)
                if isinstance(action, Metadata):
                    action.located(Where(storage.uri, storage.log_file(commit_name(version)), version), line)
        metadata = metadata or in_commit.metadata
        protocol = protocol or in_commit.protocol
        if metadata is not None and protocol is not None:
            return metadata, protocol
    if segment.checkpoint is not None:
        cp = read_checkpoint_config(storage, segment.checkpoint)
        metadata = metadata or cp.metadata
        protocol = protocol or cp.protocol
    return _required(storage, segment, metadata, protocol)


def _required(
    storage: TableStorage, segment: LogSegment, metadata: Metadata | None, protocol: Protocol | None
) -> tuple[Metadata, Protocol]:
    """Every table state has a metaData and a protocol; a segment without one is incomplete (or
    holds an empty commit file, which is named then: it is the likelier cause)."""
    if protocol is None or metadata is None:
        for version, info in segment.commits:
            if info.size == 0 or not storage.read_bytes(storage.log_file(commit_name(version))).strip():
                raise IncompleteTableStateError(
                    f"commit {version} has no actions (an empty commit file)",
                    table=storage.uri,
                    version=version,
                    file=storage.log_file(commit_name(version)),
                )
    if protocol is None:
        raise IncompleteTableStateError(
            "no protocol action in the log segment", table=storage.uri, version=segment.version
        )
    if metadata is None:
        raise IncompleteTableStateError(
            "no metaData action in the log segment", table=storage.uri, version=segment.version
        )
    return metadata, protocol
