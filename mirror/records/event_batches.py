"""The batch form of :func:`~deltamirror.mirror.records.events.decode_action_event`: many action-event
values into Arrow columns at once, under the same contract.

:func:`decode_action_events` accepts exactly the values the per-record decoder accepts and refuses
the others with its error (the first refused value's, ``where`` naming it). What it returns is
what a reader makes of those events, in columns: the ``add`` and ``remove`` bodies as Arrow rows
in the columns of a checkpoint's (what :class:`~deltamirror.core.accumulator.ActionAccumulator`
turns a body into, ``__order`` being the event's index), the other actions as the per-record
decoder's values, and the envelope once per run of events that share it (:class:`Segment`).

The fast path costs no Python object per file. The watcher writes every event of a version with
one shared prefix (:class:`~.events.EnvelopeEncoder`: the envelope up to ``"index":``), so one
event per prefix is decoded whole by the model and every other value starting with the same
bytes shares its envelope. What follows the prefix is split at the first ``"action":`` into a
head (the index, then the other members, read once per distinct text by the model's own JSON
parser) and the action. ``add`` and ``remove`` bodies are parsed by ``pyarrow.json`` with an
explicit schema and no field left unread (a field it does not know, however nested, is a refusal
of the fast path); the ``partitionValues`` and ``tags`` maps, which ``pyarrow.json`` cannot read,
are cut out of the bodies and decoded once per distinct text; other actions are decoded by the
model, one by one. Anything the fast path cannot prove it reads as the model would (another
envelope layout, a key given twice, text that is not UTF-8, a value pyarrow reads
differently...) sends the whole batch to the per-record decoder: slower, never different. tests/mirror/test_event_batches.py holds both to that.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise, repeat
from typing import Any

import pyarrow as pa
import pyarrow.json as pj
from pydantic_core import from_json

from deltamirror.core.accumulator import FILE_ROWS, ORDER
from deltamirror.core.compute import pc

from ..errors import EventStreamError
from .boundary import DEFAULT_RULES, BadRecordError, RecordRules
from .events import SCHEMA_VERSION, ActionEvent, EnvelopeEncoder, decode_action_event

__all__ = ["ActionEventBatch", "Envelope", "Segment", "decode_action_events"]

FILE_TYPES = ("add", "remove")


@dataclass(frozen=True, slots=True)
class Envelope:
    """The fields every event of one version (or snapshot) shares."""

    schema_version: int
    table_id: str
    table_uri: str
    version: int
    commit_timestamp: int
    commit_timestamp_source: str
    count: int
    snapshot: bool


@dataclass(slots=True)
class Segment:
    """Consecutive events of one version: values ``start`` to ``stop`` (positions in the batch),
    indexes ``first_index`` on, one each, ending at the version's last event at the latest.

    ``adds`` / ``removes`` are their file actions in :data:`~deltamirror.core.accumulator.FILE_ROWS`
    columns (``__order``: the index), or None when the bodies were not read into Arrow; then (and
    for every other action type) ``others`` holds (index, type, action) as the per-record decoder
    gives them, in order. ``snapshot_end`` is the last event's.
    """

    envelope: Envelope
    start: int
    stop: int
    first_index: int
    snapshot_end: bool | None
    adds: pa.Table | None = None
    removes: pa.Table | None = None
    others: list[tuple[int, str, Any]] = field(default_factory=list)

    @property
    def last_index(self) -> int:
        return self.first_index + self.stop - self.start - 1


@dataclass(slots=True)
class ActionEventBatch:
    """Decoded values, as consecutive :class:`Segment` s covering them all in order (or, with
    ``refused``, those before the first refused value)."""

    size: int
    segments: list[Segment]
    #: True when every value went through the fast path
    columnar: bool
    #: (position, error) of the first value the boundary refused, when the caller asked for the
    #: values before it (``partial``); the segments end before it
    refused: tuple[int, BadRecordError] | None = None


def _envelope(event: ActionEvent) -> Envelope:
    return Envelope(
        event.schema_version,
        event.table_id,
        event.table_uri,
        event.version,
        event.commit_timestamp,
        event.commit_timestamp_source,
        event.count,
        event.snapshot,
    )


# --- the per-record path ---------------------------------------------------------------------------


def _per_record(
    values: Sequence[bytes | str],
    where: Callable[[int], Mapping[str, Any]] | None,
    rules: RecordRules,
    partial: bool,
) -> ActionEventBatch:
    segments: list[Segment] = []
    last: Segment | None = None
    for i, value in enumerate(values):
        try:
            event = decode_action_event(value, rules=rules, **(where(i) if where is not None else {}))
        except BadRecordError as exc:
            if not partial:
                raise
            return ActionEventBatch(i, segments, columnar=False, refused=(i, exc))
        env = _envelope(event)
        if (
            last is not None
            and last.envelope == env
            and event.index == last.last_index + 1
            and last.last_index + 1 < env.count
        ):
            last.stop = i + 1
            last.snapshot_end = event.snapshot_end
        else:
            last = Segment(env, i, i + 1, event.index, event.snapshot_end)
            segments.append(last)
        last.others.append((event.index, event.type, event.action))
    return ActionEventBatch(len(values), segments, columnar=False)


# --- the fast path ---------------------------------------------------------------------------------


class _NotColumnar(Exception):
    """The fast path cannot prove it reads these values as the model does."""


_ACTION_KEY = b'"action":'
#: envelope keys that must not come again after the shared prefix (the model takes the last of a
#: key given twice, and a field's Python name when its alias is absent)
_GUARDED = (
    *tuple(
        dict.fromkeys(
            f'"{name}"'.encode()
            for f_name, f in ActionEvent.model_fields.items()
            if f_name not in ("type", "snapshot_end", "action")
            for name in (f.alias or f_name, f_name)
        )
    ),
    b'"snapshot_end"',
    b'"action"',
)
#: a head longer than this is not the encoder's (index, snapshotEnd and type): no fast path
_MAX_HEAD = 96
#: the smallest block pyarrow.json parses on its own thread
_BLOCK = 1 << 20
_INDEX = r"^(0|[1-9][0-9]{0,17})$"
_MAPS = {name: re.compile(rb'"' + name.encode() + rb'":(\{[^}]*\})') for name in ("partitionValues", "tags")}


def _read_lines(text: bytes, rows: int, schema: pa.Schema) -> pa.Table:
    """Newline-delimited objects with exactly the fields of ``schema`` (any other field is an
    error: nothing is skipped unread, so nothing can hide what the model refuses, such as nesting
    deeper than its parser goes, or text that is not UTF-8)."""
    offsets = pa.array([0, len(text)], pa.int32()).buffers()[1]
    try:
        pa.StringArray.from_buffers(1, offsets, pa.py_buffer(text)).validate(full=True)
        table = pj.read_json(
            pa.BufferReader(text),
            # large batches parsed in two blocks at once (the thread pool's cores), small ones whole
            read_options=pj.ReadOptions(use_threads=True, block_size=max(len(text) // 2 + 1, _BLOCK)),
            parse_options=pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="error"),
        )
    except (pa.ArrowException, ValueError) as exc:
        raise _NotColumnar(str(exc)) from None
    if table.num_rows != rows:  # a line break inside a value
        raise _NotColumnar("line count")
    return table


def _maps(text: bytes, name: str) -> tuple[pa.DictionaryArray | None, pa.DataType]:
    """The ``name`` objects of the bodies (``text``: one a line), each text once, and the struct
    pyarrow.json checks them against (their keys, as strings).

    Parsed with no field unread, the quoted key can only open a body's own ``name`` object: the
    n-th one found is that of the n-th body that has one. An object runs to its first ``}``; one
    that does not decode then (a ``}`` in a string, a nested object) is left to the model.
    """
    if f'"{name}"'.encode() not in text:
        return None, pa.struct([])
    coded = pa.array(_MAPS[name].findall(text), pa.binary()).dictionary_encode()
    keys: dict[str, None] = {}
    entries: list[list[tuple[str, str | None]]] = []
    for raw in coded.dictionary.to_pylist():
        try:
            value = from_json(raw)
        except ValueError:
            raise _NotColumnar(f"{name} text") from None
        if not isinstance(value, dict) or not all(v is None or type(v) is str for v in value.values()):
            raise _NotColumnar(f"{name} values")
        entries.append(list(value.items()))
        keys.update(dict.fromkeys(value))
    typ = FILE_ROWS["add"].field(name).type
    maps = pa.DictionaryArray.from_arrays(coded.indices, pa.array(entries, typ))
    return maps, pa.struct([pa.field(k, pa.string()) for k in keys])


def _map_column(found: pa.DictionaryArray | None, present: pa.Array, typ: pa.DataType) -> pa.Array:
    """The maps of the bodies: the found objects, in order, where pyarrow read one."""
    present_rows = len(present) - present.null_count
    if present_rows != (0 if found is None else len(found)):
        raise _NotColumnar("a map not found")
    if found is None:
        return pa.nulls(len(present), typ)
    maps = found.dictionary.take(found.indices)
    if present_rows == len(present):
        return maps
    positions = pc.subtract(pc.cumulative_sum(pc.cast(present.is_valid(), pa.int64())), 1)
    return maps.take(pc.if_else(present.is_valid(), positions, None))


def _bodies_table(bodies: list[bytes], orders: pa.Array, name: str) -> pa.Table:
    """``add`` or ``remove`` bodies in the columns the accumulator gives them."""
    if not all(map(bytes.startswith, bodies, repeat(b"{"))):
        raise _NotColumnar("a body that is not an object")
    text = b"\n".join(bodies)
    schema = FILE_ROWS[name]
    found = {}
    fields = []
    for f in schema:
        if f.name == ORDER:
            continue
        if pa.types.is_map(f.type):
            found[f.name], struct = _maps(text, f.name)
            fields.append(pa.field(f.name, struct))
        else:
            fields.append(f.with_nullable(True))
    read = _read_lines(text, len(bodies), pa.schema(fields))
    if read["path"].null_count:
        raise _NotColumnar("a body without a path")
    columns = []
    for f in schema:
        if f.name == ORDER:
            columns.append(orders)
        elif f.name in found:
            columns.append(_map_column(found[f.name], read[f.name].combine_chunks(), f.type))
        else:
            columns.append(read[f.name].combine_chunks())
    return pa.Table.from_arrays(columns, schema=schema)


def _heads(heads: list[bytes]) -> tuple[pa.Array, pa.DictionaryArray, pa.Array]:
    """(index, type, snapshotEnd) of each head: ``<index>,`` then the other members before the
    action, the latter read once per distinct text (the model's reading: the same parser)."""
    if max(map(len, heads)) > _MAX_HEAD:
        raise _NotColumnar("long head")
    split = pc.split_pattern(pa.array(heads, pa.binary()), ",", max_splits=1)
    if pc.min(pc.list_value_length(split)).as_py() != 2:
        raise _NotColumnar("head layout")
    digits, rests = pc.list_element(split, 0), pc.list_element(split, 1)
    if not pc.all(pc.match_substring_regex(digits, _INDEX)).as_py():
        raise _NotColumnar("index")
    index = pc.cast(pc.cast(digits, pa.string()), pa.int64())
    coded = rests.dictionary_encode()
    types: list[str] = []
    ends: list[bool | None] = []
    for rest in coded.dictionary.to_pylist():
        if any(key in rest for key in _GUARDED):
            raise _NotColumnar("an envelope key after the prefix")
        try:
            members = from_json(b"{" + rest + b'"action":0}')
        except ValueError:
            raise _NotColumnar("head text") from None
        kind, end = members.get("type"), members.get("snapshotEnd")
        if type(kind) is not str or not (end is None or type(end) is bool):
            raise _NotColumnar("type or snapshotEnd")
        types.append(kind)
        ends.append(end)
    kinds = pa.DictionaryArray.from_arrays(coded.indices, pa.array(types, pa.string()))
    return index, kinds, pa.array(ends, pa.bool_()).take(coded.indices)


def _prefix_of(value: bytes, rules: RecordRules) -> tuple[bytes, Envelope] | None:
    """The encoder's prefix of this value and its envelope, when the value has the encoder's layout.

    The value is decoded whole, so the envelope every value with its prefix shares is held to the
    boundary once (its location, bounds and schema version)."""
    event = decode_action_event(value, rules=rules)  # a refused value sends the batch to the per-record path
    if event.schema_version != SCHEMA_VERSION:
        return None
    env = _envelope(event)
    prefix = EnvelopeEncoder(
        table_id=env.table_id,
        table_uri=env.table_uri,
        version=env.version,
        commit_timestamp=env.commit_timestamp,
        commit_timestamp_source=env.commit_timestamp_source,
        count=env.count,
        snapshot=env.snapshot,
    ).prefix
    return (prefix, env) if value.startswith(prefix) else None


def _groups(values: Sequence[bytes], rules: RecordRules) -> list[tuple[int, int, bytes, Envelope]]:
    """Runs of values sharing one encoder prefix."""
    out = []
    i, n = 0, len(values)
    while i < n:
        found = _prefix_of(values[i], rules)
        if found is None:
            raise _NotColumnar("not the encoder's layout")
        prefix, env = found
        if values[-1].startswith(prefix) and all(map(bytes.startswith, values[i:], repeat(prefix))):
            j = n
        else:
            j = i + 1
            while j < n and values[j].startswith(prefix):
                j += 1
        out.append((i, j, prefix, env))
        i = j
    return out


def _columnar(values: Sequence[bytes], rules: RecordRules) -> ActionEventBatch:
    if not all(type(v) is bytes for v in values):
        raise _NotColumnar("text values")
    limit = rules.limits.max_record_bytes
    if max(map(len, values)) > limit:
        raise _NotColumnar("a value too large")
    segments: list[Segment] = []
    for start, stop, prefix, env in _groups(values, rules):
        segments.extend(_group_segments(values[start:stop], start, len(prefix), env, rules))
    return ActionEventBatch(len(values), segments, columnar=True)


def _group_segments(
    values: Sequence[bytes], start: int, skip: int, env: Envelope, rules: RecordRules
) -> list[Segment]:
    cuts = list(map(bytes.find, values, repeat(_ACTION_KEY), repeat(skip)))
    if min(cuts) < 0 or not all(map(bytes.endswith, values, repeat(b"}"))):
        raise _NotColumnar("no action")
    index, types, ends = _heads([v[skip:c] for v, c in zip(values, cuts, strict=True)])
    if pc.max(index).as_py() >= env.count:
        raise _NotColumnar("an index not below count")
    tables: dict[str, pa.Table] = {}
    kinds: dict[str, pa.Array] = {}
    for name in FILE_TYPES:
        kinds[name] = mask = pc.fill_null(pc.equal(types, name), False)
        if not pc.any(mask).as_py():
            continue
        if pc.all(mask).as_py():
            picked, orders = values, index
        else:
            rows = pc.indices_nonzero(mask)
            picked, orders = [values[r] for r in rows.to_pylist()], index.take(rows)
            cuts_of = [cuts[r] for r in rows.to_pylist()]
        offset = len(_ACTION_KEY)
        if picked is values:
            bodies = [v[c + offset : -1] for v, c in zip(values, cuts, strict=True)]
        else:
            bodies = [v[c + offset : -1] for v, c in zip(picked, cuts_of, strict=True)]
        tables[name] = _bodies_table(bodies, orders, name)
        # core's rules for file rows, and its path rules: a refusal is named by the per-record path
        if rules.file_rows_problem(env.table_uri, name, tables[name]) is not None:
            raise _NotColumnar(f"an {name} the boundary refuses")
    other = pc.invert(pc.or_(kinds["add"], kinds["remove"]))
    others = {r: decode_action_event(values[r], rules=rules) for r in pc.indices_nonzero(other).to_pylist()}
    return _split(env, start, index, ends, tables, kinds, others)


def _split(
    env: Envelope,
    start: int,
    index: pa.Array,
    ends: pa.Array,
    tables: dict[str, pa.Table],
    kinds: dict[str, pa.Array],
    others: dict[int, ActionEvent],
) -> list[Segment]:
    """Segments of one group: a new one where the index does not follow, and after a version's end."""
    n = len(index)
    breaks = {0}
    if n > 1:
        gap = pc.not_equal(pc.subtract(index.slice(1), index.slice(0, n - 1)), 1)
        breaks.update(i + 1 for i in pc.indices_nonzero(gap).to_pylist())
    done = pc.indices_nonzero(pc.greater_equal(index, env.count - 1)).to_pylist()
    breaks.update(i + 1 for i in done if i + 1 < n)
    bounds = [*sorted(breaks), n]
    cums = {name: pc.cumulative_sum(pc.cast(kinds[name], pa.int64())) for name in tables}
    other_rows = sorted(others)
    at = 0
    segments = []
    for lo, hi in pairwise(bounds):
        seg = Segment(env, start + lo, start + hi, index[lo].as_py(), ends[hi - 1].as_py())
        for name, cum in cums.items():
            first = cum[lo - 1].as_py() if lo else 0
            taken = cum[hi - 1].as_py() - first
            if taken:
                setattr(seg, name + "s", tables[name].slice(first, taken))
        while at < len(other_rows) and other_rows[at] < hi:
            event = others[other_rows[at]]
            seg.others.append((event.index, event.type, event.action))
            at += 1
        segments.append(seg)
    return segments


def decode_action_events(
    values: Sequence[bytes | str],
    where: Callable[[int], Mapping[str, Any]] | None = None,
    *,
    rules: RecordRules | None = None,
    partial: bool = False,
) -> ActionEventBatch:
    """Actions-topic values as consecutive :class:`Segment` s, held to the consumers' boundary
    (``rules``, :mod:`.boundary`); a value it refuses is a :class:`~.boundary.BadRecordError`
    (the first one's, with ``where(position)`` in it), exactly as
    :func:`~.events.decode_action_event` refuses it. With ``partial``, the values before the first
    refused one are returned instead, the refusal in :attr:`ActionEventBatch.refused`."""
    rules = DEFAULT_RULES if rules is None else rules
    if not values:
        return ActionEventBatch(0, [], columnar=True)
    try:
        return _columnar(values, rules)  # type: ignore[arg-type]  # checked: bytes only
    except (_NotColumnar, EventStreamError):
        return _per_record(values, where, rules, partial)
