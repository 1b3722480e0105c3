"""Log replay: a checkpoint plus the commits after it reconciled into one table state, in Arrow.

A file is identified by (canonical path, deletion vector id). The newest action on a key wins: an
``add`` makes it active, a ``remove`` makes it a tombstone. Checkpoint rows are already reconciled,
so they only need to be dropped when a later commit touches their key; that is one vectorized
``is_in`` over the checkpoint, whatever its size.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from . import action_schema
from .checkpoint import CheckpointState, read_checkpoint, read_checkpoint_config
from .deletion_vectors import dv_unique_ids
from .errors import IncompleteTableStateError
from .log import LogSegment, commit_name, iter_json_actions, open_commit, read_commit
from .models import CommitInfo, DomainMetadata, Metadata, Protocol, Txn, parse_action
from .storage import TableStorage

ORDER = "__order"
KNOWN_ACTIONS = frozenset(
    {
        "add",
        "remove",
        "metaData",
        "protocol",
        "txn",
        "domainMetadata",
        "commitInfo",
        "cdc",
        "checkpointMetadata",
        "sidecar",
    }
)
log = logging.getLogger(__name__)


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
    named = rows.take(pc.indices_nonzero(candidate))
    hit = pc.is_in(file_keys(named["path"], named["deletionVector"]), value_set=touched_keys)
    dropped = pc.replace_with_mask(candidate, candidate, hit)
    return action_schema.keep_rows(rows, pc.invert(dropped))


@dataclass
class TableState:
    """The reconciled state at one version."""

    version: int
    metadata: Metadata
    protocol: Protocol
    files: pa.Table
    tombstones: pa.Table
    txns: dict[str, Txn] = field(default_factory=dict)
    domains: dict[str, DomainMetadata] = field(default_factory=dict)
    commit_infos: dict[int, CommitInfo] = field(default_factory=dict)
    #: action types this version of deltamirror does not know, with how often they occur
    unknown_actions: dict[str, int] = field(default_factory=dict)


@dataclass
class _Pending:
    """Non-file actions of the commits after the checkpoint, newest last."""

    metadata: Metadata | None = None
    protocol: Protocol | None = None
    txns: dict[str, Txn] = field(default_factory=dict)
    domains: dict[str, DomainMetadata | None] = field(default_factory=dict)
    commit_infos: dict[int, CommitInfo] = field(default_factory=dict)
    adds: list[dict[str, Any]] = field(default_factory=list)
    removes: list[dict[str, Any]] = field(default_factory=list)
    unknown: dict[str, int] = field(default_factory=dict)


def _collect(storage: TableStorage, versions: Iterable[int]) -> _Pending:
    pending = _Pending()
    order = 0
    for version in versions:
        file = storage.log_file(commit_name(version))
        for lineno, wrapped in enumerate(read_commit(storage, version), start=1):
            name = next(iter(wrapped))
            body = wrapped[name]
            order += 1
            if name == "add":
                pending.adds.append({**body, ORDER: order})
            elif name == "remove":
                pending.removes.append({**body, ORDER: order})
            elif name in ("metaData", "protocol", "txn", "domainMetadata", "commitInfo"):
                action = parse_action(wrapped, file=file, line=lineno, table=storage.uri)
                if isinstance(action, Metadata):
                    pending.metadata = action
                elif isinstance(action, Protocol):
                    pending.protocol = action
                elif isinstance(action, Txn):
                    pending.txns[action.app_id] = action
                elif isinstance(action, DomainMetadata):
                    pending.domains[action.domain] = None if action.removed else action
                elif isinstance(action, CommitInfo):
                    pending.commit_infos[version] = action
            elif name not in KNOWN_ACTIONS:
                if name not in pending.unknown:
                    log.warning("unknown action type %r in %s line %d: kept, not applied", name, file, lineno)
                pending.unknown[name] = pending.unknown.get(name, 0) + 1
    return pending


def _with_order(rows: list[dict[str, Any]], schema: pa.Schema) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=schema.append(pa.field(ORDER, pa.int64())))


def reconcile(
    cp_adds: pa.Table, cp_removes: pa.Table, adds: pa.Table, removes: pa.Table
) -> tuple[pa.Table, pa.Table]:
    """(active files, tombstones) from checkpoint rows and ordered commit rows (with ``__order``)."""
    if adds.num_rows == 0 and removes.num_rows == 0:
        return cp_adds, cp_removes
    add_keys = file_keys(adds["path"], adds["deletionVector"])
    if removes.num_rows == 0 and pc.count_distinct(add_keys).as_py() == adds.num_rows:
        # every key named once, nothing removed (an append): every add stands, nothing to order
        live_adds = adds.drop_columns([ORDER])
        live_removes = removes.drop_columns([ORDER])
        touched = add_keys
    else:
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
    touched_paths = pc.unique(
        canonical_paths(pa.chunked_array(adds["path"].chunks + removes["path"].chunks, type=pa.string()))
    )
    files = pa.concat_tables([_untouched(cp_adds, touched_paths, touched), live_adds])
    tombstones = pa.concat_tables([_untouched(cp_removes, touched_paths, touched), live_removes])
    return files, tombstones


def replay(storage: TableStorage, segment: LogSegment) -> TableState:
    """The table state at ``segment.version``."""
    cp: CheckpointState | None = None
    if segment.checkpoint is not None:
        cp = read_checkpoint(storage, segment.checkpoint)
    pending = _collect(storage, segment.commit_versions)
    metadata, protocol = _required(
        storage,
        segment,
        pending.metadata or (cp.metadata if cp else None),
        pending.protocol or (cp.protocol if cp else None),
    )
    txns = dict(cp.txns) if cp else {}
    txns.update(pending.txns)
    domains = dict(cp.domains) if cp else {}
    for name, dm in pending.domains.items():
        if dm is None:
            domains.pop(name, None)
        else:
            domains[name] = dm
    files, tombstones = reconcile(
        cp.adds if cp else action_schema.ADD.empty_table(),
        cp.removes if cp else action_schema.REMOVE.empty_table(),
        _with_order(pending.adds, action_schema.ADD),
        _with_order(pending.removes, action_schema.REMOVE),
    )
    return TableState(
        segment.version,
        metadata,
        protocol,
        files,
        tombstones,
        txns,
        domains,
        pending.commit_infos,
        pending.unknown,
    )


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
        file = storage.log_file(commit_name(version))
        in_commit: dict[type, Any] = {}  # the last of each in the commit wins, as in a replay
        with open_commit(storage, version) as fh:
            for lineno, wrapped in iter_json_actions(fh, table=storage.uri, file=file, only=_CONFIG_KEYS):
                if "metaData" in wrapped or "protocol" in wrapped:
                    action = parse_action(wrapped, file=file, line=lineno, table=storage.uri)
                    in_commit[type(action)] = action
        metadata = metadata or in_commit.get(Metadata)
        protocol = protocol or in_commit.get(Protocol)
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
    """Every table state has a metaData and a protocol; a segment without one is incomplete."""
    if protocol is None:
        raise IncompleteTableStateError(
            "no protocol action in the log segment", table=storage.uri, version=segment.version
        )
    if metadata is None:
        raise IncompleteTableStateError(
            "no metaData action in the log segment", table=storage.uri, version=segment.version
        )
    return metadata, protocol
