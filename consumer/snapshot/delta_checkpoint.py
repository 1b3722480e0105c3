"""One table's state as the actions of a Delta checkpoint, and back: pure Arrow, no I/O.

:func:`checkpoint_parts` is a classic V1 checkpoint of the state with the checkpoint schema of
PROTOCOL.md ("Checkpoint Schema"), one action per row: ``protocol``, ``metaData``, ``txn``,
``domainMetadata``, then ``add`` (an all-null ``remove`` column: the state keeps no tombstones;
``checkpointMetadata`` when the table has the ``v2Checkpoint`` feature), feature lists null below
reader 3 / writer 7, written snappy (:func:`write_checkpoint`, a row group at a time: what a save
holds beyond the state is one row group's readable paths) as delta-spark and delta-rs write
theirs. :func:`marker_commit` is the commit file delta-spark needs beside it (:mod:`.table_folder`
says why). V2 checkpoints with sidecars are not written: a classic checkpoint is what every reader
reads, and the state is saved whole at each save anyway.

Paths. A relative ``add.path`` resolves against the folder holding ``_delta_log``, which is the
state's folder, not the table. So every relative path is written absolute: the table URI (its path
percent-encoded: the protocol's paths are URIs) joined with the path as the log has it (already
encoded). A ``u`` deletion vector (a file relative to the table root) is written as the ``p``
descriptor of the same file (its absolute URI). delta-spark then reads the original table's data
through the state folder; delta-rs lists the files (``get_add_actions``) but joins absolute paths
to the table root when it reads data (delta-io/delta-rs#865). The consumer wants the paths as the
table has them back (they are its replay keys): a top-level ``deltamirror`` column, which readers
do not project, holds each file's ``path`` and ``deletionVector`` as the table's log has them. A
state whose table URI is unknown keeps its paths relative.

A partial state (a stream that started after version 0, ``complete`` false) is not the table: its
checkpoint has no ``protocol`` and no ``metaData`` row, so every Delta reader refuses it rather
than list only some of the table's files.

Everything else the consumer needs (table id and URI, version, commit timestamp, ``complete``, the
small actions exactly as published) is the state's document (:meth:`IncrementalSnapshot.document`)
in the Parquet footer's key-value metadata (``deltamirror.state``): one file, one atomic write.
Loading (:data:`LOADED_COLUMNS`, :func:`files_from_rows`) reads the ``add`` fields but ``path``
and ``deletionVector``, the ``deltamirror`` column and the footer: no kernel over the files.
"""

from __future__ import annotations

import itertools
import json
import time
import urllib.parse
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from deltamirror.core import action_schema
from deltamirror.core.compute import pc
from deltamirror.core.deletion_vectors import z85_decode
from deltamirror.core.errors import ConfigError
from deltamirror.mirror.errors import EventStreamError

from .state import STATE_FORMAT, IncrementalSnapshot

#: the footer key of the state's document
FOOTER_KEY = b"deltamirror.state"
#: the top-level column readers ignore: each file's path and deletion vector as the table has them
EXTRA_COLUMN = "deltamirror"
#: rows per row group: a reader decodes groups in parallel and skips the null columns' groups; a
#: save holds one group's parts at a time (its stats, readable paths, encoded pages), so this
#: bounds what a save adds to the state's memory (16,384: about 45 MB less than 65,536 at 1M files)
ROW_GROUP_ROWS = 16_384

_UUID_Z85_CHARS = 20
_STRING_LIST = pa.list_(pa.string())


def _nullable(schema: pa.Schema, drop: tuple[str, ...] = ()) -> pa.StructType:
    """A struct of ``schema``'s fields, every one nullable (as delta-spark writes checkpoints)."""
    return pa.struct([f.with_nullable(True) for f in schema if f.name not in drop])


TXN = pa.struct(
    [pa.field("appId", pa.string()), pa.field("version", pa.int64()), pa.field("lastUpdated", pa.int64())]
)
METADATA = pa.struct(
    [
        pa.field("id", pa.string()),
        pa.field("name", pa.string()),
        pa.field("description", pa.string()),
        pa.field(
            "format",
            pa.struct([pa.field("provider", pa.string()), pa.field("options", action_schema.STRING_MAP)]),
        ),
        pa.field("schemaString", pa.string()),
        pa.field("partitionColumns", _STRING_LIST),
        pa.field("configuration", action_schema.STRING_MAP),
        pa.field("createdTime", pa.int64()),
    ]
)
PROTOCOL = pa.struct(
    [
        pa.field("minReaderVersion", pa.int32()),
        pa.field("minWriterVersion", pa.int32()),
        pa.field("readerFeatures", _STRING_LIST),
        pa.field("writerFeatures", _STRING_LIST),
    ]
)
DOMAIN_METADATA = pa.struct(
    [pa.field("domain", pa.string()), pa.field("configuration", pa.string()), pa.field("removed", pa.bool_())]
)
CHECKPOINT_METADATA = pa.struct([pa.field("version", pa.int64()), pa.field("tags", action_schema.STRING_MAP)])
ADD = _nullable(action_schema.ADD)
#: tombstones as delta-spark writes them in a checkpoint (no stats, no tags)
REMOVE = _nullable(action_schema.REMOVE, drop=("stats", "tags"))
EXTRA = pa.struct([pa.field("path", pa.string()), pa.field("deletionVector", action_schema.DELETION_VECTOR)])

#: the columns in the order delta-spark writes them; checkpointMetadata only for v2Checkpoint tables
COLUMNS: tuple[tuple[str, pa.StructType], ...] = (
    ("txn", TXN),
    ("add", ADD),
    ("remove", REMOVE),
    ("metaData", METADATA),
    ("protocol", PROTOCOL),
    ("domainMetadata", DOMAIN_METADATA),
    ("checkpointMetadata", CHECKPOINT_METADATA),
    (EXTRA_COLUMN, EXTRA),
)
#: long unique strings: no dictionary, no statistics (they cost time and help no reader)
_PLAIN = ("add.path", "add.stats", f"{EXTRA_COLUMN}.path", "metaData.schemaString")


# --- paths --------------------------------------------------------------------------------------


def path_prefix(table_uri: str | None) -> str | None:
    """What a relative path of the table is joined to: the root as a percent-encoded URI, and ``/``.

    The table URI is the watcher's normalized location (``file:///abs`` for a local table, the
    user's URL otherwise), not encoded: its path is encoded here, scheme and authority kept.
    """
    if not table_uri:
        return None
    scheme, sep, rest = table_uri.partition("://")
    if not sep:
        return None
    netloc, slash, path = rest.partition("/")
    return f"{scheme}://{netloc}{urllib.parse.quote(slash + path, safe='/')}/"


def _is_relative(paths: pa.Array) -> pa.Array:
    """Neither a URI (``scheme:``) nor ``/x``: relative to the table root, as PROTOCOL.md reads it."""
    return pc.invert(pc.match_substring_regex(paths, r"^(/|[A-Za-z][A-Za-z0-9+.\-]*:)"))


def _dv_uri(prefix: str, path_or_inline_dv: str, table_id: str) -> str:
    """The absolute URI of a ``u`` deletion vector's file (what its ``p`` descriptor holds)."""
    try:
        dv_uuid = uuid.UUID(bytes=z85_decode(path_or_inline_dv[-_UUID_Z85_CHARS:]))
    except ValueError as exc:
        raise EventStreamError(
            f"deletion vector {path_or_inline_dv!r} has no valid UUID: {exc}", table=table_id
        ) from None
    folder = path_or_inline_dv[:-_UUID_Z85_CHARS]
    name = f"deletion_vector_{dv_uuid}.bin"
    # a 'u' prefix is a folder name, joined as it is: encoded here like the rest of the URI
    return prefix + urllib.parse.quote(f"{folder}/{name}" if folder else name, safe="/")


def _absolute(files: pa.Table, prefix: str | None, table_id: str) -> pa.Table:
    """The files as readers of the state folder need them: absolute paths, ``p`` deletion vectors."""
    if prefix is None or files.num_rows == 0:
        return files
    paths = files["path"].combine_chunks()
    absolute = pc.if_else(
        pc.fill_null(_is_relative(paths), False), pc.binary_join_element_wise(prefix, paths, ""), paths
    )
    files = files.set_column(0, "path", absolute)
    dvs = files["deletionVector"].combine_chunks()
    storage = pc.struct_field(dvs, "storageType")
    rewrite = pc.fill_null(pc.equal(storage, "u"), False)
    if not pc.any(rewrite).as_py():
        return files
    ids = pc.struct_field(dvs, "pathOrInlineDv")
    distinct = pc.unique(ids.filter(rewrite))  # DV files are shared: one URI per file
    uris = pa.array([_dv_uri(prefix, s, table_id) for s in distinct.to_pylist()], pa.string())
    fields = [pc.struct_field(dvs, f.name) for f in action_schema.DELETION_VECTOR]
    fields[0] = pc.if_else(rewrite, pa.scalar("p"), storage)
    fields[1] = pc.if_else(rewrite, uris.take(pc.index_in(ids, value_set=distinct)), ids)
    rewritten = pa.StructArray.from_arrays(
        fields, fields=list(action_schema.DELETION_VECTOR), mask=pc.is_null(dvs)
    )
    return files.set_column(files.schema.get_field_index("deletionVector"), "deletionVector", rewritten)


# --- the small actions as rows --------------------------------------------------------------------


def _row(action: Mapping[str, Any], typ: pa.StructType) -> dict[str, Any]:
    """An action as published (JSON) in the columns of ``typ`` (maps as pairs); fields the type
    lacks are left out of the row (the footer keeps the action whole)."""
    out: dict[str, Any] = {}
    for f in typ:
        value = action.get(f.name)
        if value is not None and pa.types.is_map(f.type):
            value = [(str(k), None if v is None else str(v)) for k, v in dict(value).items()]
        elif value is not None and pa.types.is_struct(f.type):
            value = _row(value, f.type)
        out[f.name] = value
    return out


def _protocol_row(protocol: Mapping[str, Any]) -> dict[str, Any]:
    row = _row(protocol, PROTOCOL)
    # PROTOCOL.md: the feature lists are not null at reader 3 / writer 7, and null below
    if row["minReaderVersion"] != 3:
        row["readerFeatures"] = None
    elif row["readerFeatures"] is None:
        row["readerFeatures"] = []
    if row["minWriterVersion"] != 7:
        row["writerFeatures"] = None
    elif row["writerFeatures"] is None:
        row["writerFeatures"] = []
    return row


def _metadata_row(metadata: Mapping[str, Any]) -> dict[str, Any]:
    row = _row(metadata, METADATA)
    # delta-spark's readers take these as never null (its own checkpoints write them empty)
    row["format"] = row["format"] or {"provider": "parquet", "options": []}
    if row["format"]["options"] is None:
        row["format"]["options"] = []
    row["partitionColumns"] = row["partitionColumns"] or []
    row["configuration"] = row["configuration"] or []
    return row


def _small_rows(state: IncrementalSnapshot) -> list[tuple[str, list[dict[str, Any]]]]:
    """(column, rows) of the actions other than ``add``, in the order they are written."""
    out: list[tuple[str, list[dict[str, Any]]]] = []
    protocol, metadata = state.protocol, state.metadata
    if state.complete and protocol is not None and metadata is not None:
        out.append(("protocol", [_protocol_row(protocol)]))
        out.append(("metaData", [_metadata_row(metadata)]))
        if "v2Checkpoint" in (protocol.get("readerFeatures") or ()):
            out.append(("checkpointMetadata", [{"version": state.version, "tags": None}]))
    if state.txns:
        out.append(("txn", [_row(t, TXN) for _, t in sorted(state.txns.items())]))
    if state.domains:
        rows = [_row(d, DOMAIN_METADATA) for _, d in sorted(state.domains.items())]
        for row in rows:
            row["removed"] = bool(row["removed"])
        out.append(("domainMetadata", rows))
    return out


def _schema(present: set[str]) -> pa.Schema:
    return pa.schema([pa.field(n, t) for n, t in COLUMNS if n != "checkpointMetadata" or n in present])


def _files_part(files: pa.Table, schema: pa.Schema, prefix: str | None, table_id: str) -> pa.Table:
    """Rows of files in the checkpoint's columns: ``add`` with readable paths, ``deltamirror``
    with the table's own, the other actions null."""
    files = pa.Table.from_arrays(files.columns, schema=pa.schema(list(ADD)))
    readable = _absolute(files, prefix, table_id)
    columns: list[pa.ChunkedArray] = []
    for f in schema:
        if f.name == "add":
            columns.append(pa.chunked_array(readable.to_struct_array().chunks, f.type))
        elif f.name == EXTRA_COLUMN:
            original = files.select(["path", "deletionVector"]).to_struct_array().cast(EXTRA)
            columns.append(pa.chunked_array(original.chunks, f.type))
        else:
            columns.append(pa.chunked_array([pa.nulls(files.num_rows, f.type)], f.type))
    return pa.Table.from_arrays(columns, schema=schema)


def checkpoint_parts(state: IncrementalSnapshot) -> tuple[pa.Schema, list[pa.Table], Any]:
    """The checkpoint of ``state`` in parts: its schema (with the state's document in the
    footer's metadata), the small actions (one per row) as one table, and an iterator of the
    files, :data:`ROW_GROUP_ROWS` rows at a time (each part made when it is asked for: the
    readable paths of one row group at a time, never of every file at once)."""
    small = _small_rows(state)
    present = {name for name, _ in small}
    meta = {FOOTER_KEY: json.dumps(state.document(), separators=(",", ":")).encode()}
    schema = _schema(present).with_metadata(meta)
    head = pa.Table.from_arrays(
        [
            pa.chunked_array(
                [pa.array(r, f.type) if n == f.name else pa.nulls(len(r), f.type) for n, r in small], f.type
            )
            for f in schema
        ],
        schema=schema,
    )
    prefix = path_prefix(state.table_uri)

    def parts() -> Any:
        for files in state.file_batches(ROW_GROUP_ROWS):
            yield _files_part(files, schema, prefix, state.table_id)

    return schema, [head] if head.num_rows else [], parts()


def marker_commit(state: IncrementalSnapshot) -> bytes:
    """The commit file delta-spark needs beside the checkpoint: a ``commitInfo`` and nothing else.

    Its timestamp is the version's commit timestamp (the in-commit timestamp too, on a table that
    has them enabled: delta-spark reads it from the latest commit).
    """
    timestamp = state.commit_timestamp if state.commit_timestamp is not None else int(time.time() * 1000)
    info: dict[str, Any] = {"timestamp": timestamp}
    configuration = (state.metadata or {}).get("configuration") or {}
    if str(configuration.get("delta.enableInCommitTimestamps", "")).lower() == "true":
        info["inCommitTimestamp"] = timestamp
    info.update(
        {
            "operation": "SNAPSHOT",
            "operationParameters": {},
            "isBlindAppend": False,
            "engineInfo": "deltamirror snapshot consumer (a marker: the state at this version, not its commit)",
        }
    )
    return json.dumps({"commitInfo": info}, separators=(",", ":")).encode() + b"\n"


# --- writing ----------------------------------------------------------------------------------


def _leaves(typ: pa.DataType, prefix: str) -> list[str]:
    """Parquet column paths under a field (pyarrow's names for maps and lists)."""
    if pa.types.is_struct(typ):
        return [leaf for f in typ for leaf in _leaves(f.type, f"{prefix}.{f.name}")]
    if pa.types.is_map(typ):
        return [f"{prefix}.key_value.key", f"{prefix}.key_value.value"]
    if pa.types.is_list(typ):
        return _leaves(typ.value_type, f"{prefix}.list.element")
    return [prefix]


def write_checkpoint(state: IncrementalSnapshot, out: Any) -> int:
    """The checkpoint of ``state`` as a Parquet file (snappy, row groups a reader can skip),
    written a row group at a time; returns its rows."""
    schema, head, parts = checkpoint_parts(state)
    leaves = [leaf for f in schema for leaf in _leaves(f.type, f.name)]
    coded = [leaf for leaf in leaves if leaf not in _PLAIN]
    rows = 0
    with pq.ParquetWriter(
        out, schema, compression="snappy", use_dictionary=coded, write_statistics=coded
    ) as writer:
        for part in itertools.chain(head, parts):  # one part at a time
            writer.write_table(part, row_group_size=ROW_GROUP_ROWS)
            rows += part.num_rows
            del part
        if rows == 0:
            writer.write_table(schema.empty_table())
    return rows


# --- reading it back ------------------------------------------------------------------------------

#: what a load reads: the add fields but path and deletion vector (``deltamirror`` has them as the
#: table does)
LOADED_COLUMNS = [f"add.{f.name}" for f in ADD if f.name not in ("path", "deletionVector")] + [EXTRA_COLUMN]
#: the same without the stats (a state that keeps them on disk reads them from the checkpoint
#: when they are asked for: :mod:`.stats_spill`)
STATS_COLUMN = "add.stats"
LOADED_WITHOUT_STATS = [c for c in LOADED_COLUMNS if c != STATS_COLUMN]


def document(metadata: Mapping[bytes, bytes] | None, where: str) -> dict[str, Any]:
    """The state's document from a checkpoint's footer (ConfigError naming ``where`` otherwise)."""
    raw = (metadata or {}).get(FOOTER_KEY)
    if raw is None:
        raise ConfigError(f"{where} has no {FOOTER_KEY.decode()} document: not a state this consumer wrote")
    doc = json.loads(raw)
    found = doc.get("format") if isinstance(doc, dict) else None
    if found != STATE_FORMAT:
        raise ConfigError(
            f"{where} has snapshot state format {found!r}, this deltamirror reads {STATE_FORMAT}"
        )
    return dict(doc)


def files_from_rows(rows: Iterable[pa.RecordBatch], total: int, count: int, where: str) -> pa.Table:
    """The state's files from the :data:`LOADED_COLUMNS` of a checkpoint of ``total`` rows holding
    ``count`` files in its last rows (the small actions come first), with the table's paths and
    deletion vectors; ``rows`` come a row group at a time, each turned into files as it comes."""
    if not 0 <= count <= total:
        raise ConfigError(f"{where} has {total} rows, its document says {count} files")
    skip = total - count
    parts: list[pa.Table] = []
    for batch in rows:
        if skip >= batch.num_rows:
            skip -= batch.num_rows
            continue
        part = pa.Table.from_batches([batch.slice(skip)]) if skip else pa.Table.from_batches([batch])
        skip = 0
        parts.append(_files_of(part, count, where))
    if count == 0:
        return action_schema.ADD.empty_table()
    files = pa.concat_tables(parts)
    if files.num_rows != count:
        raise ConfigError(f"{where} has {files.num_rows} files, its document says {count}")
    return files


def _files_of(rows: pa.Table, count: int, where: str) -> pa.Table:
    if rows["add"].null_count or rows[EXTRA_COLUMN].null_count:
        raise ConfigError(f"{where} does not hold its {count} files in its last rows")
    adds = pa.Table.from_struct_array(rows["add"])
    original = pa.Table.from_struct_array(rows[EXTRA_COLUMN])
    columns = dict(zip(adds.column_names, adds.columns, strict=True))
    columns.update(path=original["path"], deletionVector=original["deletionVector"])
    if original["path"].null_count:
        raise ConfigError(f"{where} has a file without a path")
    return pa.table({f.name: columns[f.name] for f in action_schema.ADD if f.name in columns})


__all__ = [
    "EXTRA_COLUMN",
    "FOOTER_KEY",
    "LOADED_COLUMNS",
    "LOADED_WITHOUT_STATS",
    "STATS_COLUMN",
    "checkpoint_parts",
    "document",
    "files_from_rows",
    "marker_commit",
    "path_prefix",
    "write_checkpoint",
]
