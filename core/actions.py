"""The boundary where the log's text becomes actions: every reader takes its actions from here.

A commit line is checked once, on its raw bytes, before anything is read from it:

* strict JSON: valid UTF-8, no lone surrogate, no NaN/Infinity (nor a number too large for a
  double), at most 200 levels of nesting (a clean error, never a RecursionError);
* one action per line: a line naming two known actions (``{"add":..,"remove":..}``), or one twice,
  is refused (delta-spark would keep one of them silently). A newer writer's *unknown* action
  beside a known one is kept, as both are actions of the commit;
* the fields the protocol requires, present and typed: paths non-empty strings, sizes and times
  64-bit integers (sizes non-negative), ``partitionValues``/``tags`` maps of string to string or
  null, the deletion vector descriptor's shape and ranges, ``protocol``/``metaData`` fields
  (:mod:`.action_rules`); fields this version does not know are kept and only need numbers any
  reader can hold (finite, integers within 64 bits).

Duplicate names inside an action are left to JSON's usual reading, the last one wins: that is how
delta-spark (Jackson) and every parser on the mirror's way (jiter, orjson, Python's json) read
them, so the value checked is the value every reader uses. Telling them apart would cost a second
parse of every line.

A line that fails raises :class:`CorruptLogError` naming table, version, file, line and field
(``add.size: expected a non-negative 64-bit integer``). Validation runs in pydantic-core on the
raw bytes: the ``{"add":{...}}`` lines writers write are cut out of a buffer by one ``split`` and
their bodies validated one C call each, with no Python step per line; any other line is decoded
on its own. What comes out are runs of actions of one type from consecutive lines, each with its
validated value and the log's own bytes (which the watcher publishes as they are).

The watcher (``structs``) reads file actions through msgspec Structs compiled from the same
rules (:data:`~.action_rules.STRUCTS`): no dict per action, about half the cost. A body the
Structs refuse, or one holding a field this version does not know, goes to the validators, whose
verdict (and message) stands. A run of plain file-action lines of a buffer that is valid UTF-8 is
first decoded with ``stats`` and ``partitionValues`` left as raw JSON (:data:`~.action_rules.
FORWARD_DECODERS`: parsed strictly, not built): ``stats`` is then checked to be a string or null by
its first byte, each distinct ``partitionValues`` text decoded once by its field's own type; any
refusal there sends the run to the Structs, so the verdicts are theirs.
tests/core/test_boundary_agreement.py holds all three to one answer over the real writers' logs
and the mutation corpus.
"""

from __future__ import annotations

import itertools
import json
import operator
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import IO, Any

import msgspec
import pydantic_core
from pydantic_core import PydanticCustomError, ValidationError

from .action_rules import (
    FILE_ACTIONS,
    FORWARD_CHECKS,
    FORWARD_DECODERS,
    KNOWN_ACTIONS,
    STRUCT_DECODERS,
    VALIDATORS,
    field_problem,
    finite,
    no_line,
    to_struct,
    validator_for,
)
from .errors import CorruptLogError

__all__ = [
    "FILE_ACTIONS",
    "KNOWN_ACTIONS",
    "VALIDATORS",
    "ActionRun",
    "PartitionKeySets",
    "PartitionKeys",
    "Where",
    "check_actions",
    "decode_line",
    "field_problem",
    "iter_values",
    "line_buffers",
    "parse_json",
    "read_actions",
    "validator_for",
]


# --- refusals ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Where:
    """What a refusal names: the table, the version (if known) and the file."""

    table: str | None
    file: str | None
    version: int | None = None

    def refuse(self, message: str, line: int | None = None, **context: Any) -> CorruptLogError:
        return CorruptLogError(
            message, table=self.table, version=self.version, file=self.file, line=line, **context
        )


# --- one line -------------------------------------------------------------------------------------

#: JSON's whitespace around a line's tokens
_WS = b" \t\r\n"
#: raw key bytes -> action type, for keys met before (checked once as JSON strings)
_KEYS: dict[bytes, str] = {}


def _action_key(raw: bytes) -> str | None:
    key = _KEYS.get(raw)
    if key is not None:
        return key
    if b"\\" in raw:  # an escaped name: the whole line is decoded, so that it is read as JSON reads it
        return None
    try:
        key = pydantic_core.from_json(b'"' + raw + b'"')
    except ValueError:
        return None
    if len(_KEYS) < 1024:
        _KEYS[raw] = key
    return str(key)


def split_line(line: bytes) -> tuple[str, bytes] | None:
    """(action type, body bytes) of a ``{"type": body}`` line, or None if it has another shape.

    The body is not decoded here: the line is valid exactly when its body is one JSON value,
    which the body's validation decides.
    """
    if not (line.startswith(b'{"') and line.endswith(b"}")):
        line = line.strip(_WS)
        if not (line.startswith(b'{"') and line.endswith(b"}")):
            return None
    end = line.find(b'"', 2)
    if end < 0:
        return None
    colon = end + 1
    if line[colon] != 0x3A:  # ':' (the closing brace is after the quote: colon is in bounds)
        colon = line.find(b":", colon)
        if colon < 0 or line[end + 1 : colon].strip(_WS):
            return None
    raw_key = line[2:end]
    key = _KEYS.get(raw_key) or _action_key(raw_key)
    body = line[colon + 1 : -1].strip(_WS)
    if key is None or not body:
        return None
    return key, body


def _top_level_names(raw: bytes) -> list[str]:
    """The names of a line's object as written, duplicates included (the line is valid JSON)."""
    names: list[str] = []

    def pairs(items: list[tuple[str, Any]]) -> None:
        names[:] = [k for k, _ in items]  # the outermost object is closed last

    json.loads(raw, object_pairs_hook=pairs)
    return names


def decode_line(
    raw: bytes, line: int, where: Where, structs: Mapping[str, msgspec.json.Decoder[Any]] | None = None
) -> list[tuple[str, bytes, Any]]:
    """(type, body bytes, validated value) of each action of one line; [] for a blank line.

    With ``structs`` (:data:`STRUCT_DECODERS`), the values of those actions are Structs."""
    structs = structs or {}
    split = split_line(raw)
    if split is not None:
        name, body = split
        decoder = structs.get(name)
        if decoder is not None:
            try:
                return [(name, body, decoder.decode(body))]
            except ValueError:  # msgspec.DecodeError, or UnicodeDecodeError for a string that is not UTF-8
                pass  # left to the validators, whose verdict stands
        try:
            value = validator_for(name).validate_json(body)
            return [(name, body, value if decoder is None else to_struct(name, value))]
        except ValidationError as exc:
            if exc.errors(include_url=False)[0]["type"] != "json_invalid":
                raise where.refuse(field_problem(name, exc), line) from None
            # not one JSON value: a second action on the line, or broken JSON; decoded whole below
    if not raw.strip(_WS):
        return []
    try:
        obj = pydantic_core.from_json(raw, allow_inf_nan=False)
    except ValueError as exc:
        raise where.refuse(f"invalid JSON: {no_line(str(exc))}", line) from None
    if not isinstance(obj, dict) or not obj:
        raise where.refuse("a log line must be a JSON object holding an action", line)
    names = _top_level_names(raw)
    if len(names) != len(obj):
        raise where.refuse(f"a line names an action twice ({', '.join(names)})", line)
    known = [n for n in names if n in KNOWN_ACTIONS]
    if len(known) > 1:
        raise where.refuse(f"a line holds one action, this one holds {', '.join(known)}", line)
    out = []
    for name, value in obj.items():
        try:
            checked = validator_for(name).validate_python(value)
        except ValidationError as exc:
            raise where.refuse(field_problem(name, exc), line) from None
        if name in structs:
            checked = to_struct(name, checked)
        out.append((name, pydantic_core.to_json(value), checked))
    return out


# --- runs of lines --------------------------------------------------------------------------------


@dataclass(slots=True)
class ActionRun:
    """Actions of one type from consecutive lines of a file (action ``i`` is on line ``line + i``)."""

    name: str
    line: int
    bodies: list[bytes]
    values: list[Any]
    #: for a run decoded with its forwarded fields raw (:data:`~.action_rules.FORWARD_DECODERS`):
    #: its distinct ``partitionValues`` texts, each with its checked value (None: no map)
    partitions: dict[bytes, dict[str, str | None] | None] | None = None

    def __len__(self) -> int:
        return len(self.values)


#: where an add line follows a line that ends in ``}``: splitting a buffer here cuts out every add
#: body whole, in one copy and one C call, without a Python step per line
_ADD_BOUNDARY = b'}\n{"add":'
#: the two lines most commits are made of, as writers write them: (prefix, type)
_PLAIN = ((b'{"add":{', "add"), (b'{"remove":{', "remove"))
_STARTS = tuple(operator.methodcaller("startswith", prefix) for prefix, _ in _PLAIN)
_ENDS_ACTION = operator.methodcaller("endswith", b"}}")
#: a buffer of fewer lines than this (within its first bytes) is read line by line: the split into
#: runs only pays for itself over many lines
_FEW_LINES, _FEW_LINES_BYTES = 64, 64 * 1024


class _Scanner:
    """Turns buffers of whole lines into validated runs (the first line of a buffer is numbered
    from where the previous one stopped)."""

    def __init__(self, where: Where, only: Sequence[bytes] = (), structs: bool = False) -> None:
        self.where = where
        self.only = tuple(only)
        self.structs: Mapping[str, msgspec.json.Decoder[Any]] = STRUCT_DECODERS if structs else {}
        #: the buffer being scanned is valid UTF-8 (what msgspec does not check of a raw field)
        self._utf8 = False

    def buffer(self, text: bytes, lineno: int) -> tuple[list[ActionRun], int]:
        """The runs of ``text`` (whole lines, its first being line ``lineno + 1``) and the number
        of its last line.

        The buffer is split at :data:`_ADD_BOUNDARY`: a piece between two boundaries without a
        newline is exactly the body of an add line. Any other piece (the first, the last, one
        holding other lines) is turned back into its lines, as is a run of bodies one is refused.
        """
        if b"\r" in text:  # CRLF and a lone CR end a line too, as delta-spark's line reader has it
            text = text.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        out: list[ActionRun] = []
        if self.only:
            return out, self._some_lines(_lines_of(text), lineno, out)
        self._utf8 = bool(self.structs) and _is_utf8(text)
        if text.count(b"\n", 0, _FEW_LINES_BYTES) < _FEW_LINES:  # few lines: one by one
            return out, self._lines(_lines_of(text), lineno, out)
        pieces = text.split(_ADD_BOUNDARY)
        first = 0
        for is_body, n in _piece_runs(pieces):
            if is_body and self._bodies("add", _bodies(pieces, first, n), lineno + 1, out):
                lineno += n
            else:
                lineno = self._line_runs(_piece_text(pieces, first, n), lineno, out)
            first += n
        return out, lineno

    def _bodies(self, name: str, bodies: list[bytes], line: int, out: list[ActionRun]) -> bool:
        """Bodies of consecutive plain lines, validated one C call each; False if one is refused
        (then the lines are taken one by one, which names the first refused).

        With Structs, the bodies are decoded by msgspec first: a body it refuses (or one holding a
        field this version does not know) is left to the validators, whose verdict stands."""
        decoder = self.structs.get(name)
        if decoder is not None:
            if self._utf8:
                forwarded = _forwarded(name, bodies, line)
                if forwarded is not None:
                    out.append(forwarded)
                    return True
            try:
                out.append(ActionRun(name, line, bodies, list(map(decoder.decode, bodies))))
                return True
            except ValueError:  # as in decode_line
                pass
        try:
            values = list(map(VALIDATORS[name].validate_json, bodies))
        except ValidationError:
            return False
        if decoder is not None:
            values = [to_struct(name, value) for value in values]
        out.append(ActionRun(name, line, bodies, values))
        return True

    def _line_runs(self, text: bytes, lineno: int, out: list[ActionRun]) -> int:
        """Runs of plain add/remove lines validated together, any other line on its own."""
        lines = _lines_of(text)
        first = 0
        for kind, group in itertools.groupby(_plain_kinds(text, lines)):
            n = len(list(group))
            chunk = lines[first : first + n] if n < len(lines) else lines
            if kind:
                prefix, name = _PLAIN[kind - 1]
                bodies = list(
                    map(bytes.strip, map(operator.itemgetter(slice(len(prefix) - 1, -1)), chunk), repeat(_WS))
                )
                if self._bodies(name, bodies, lineno + first + 1, out):
                    first += n
                    continue
            self._lines(chunk, lineno + first, out)
            first += n
        return lineno + len(lines)

    def _some_lines(self, lines: list[bytes], lineno: int, out: list[ActionRun]) -> int:
        """With ``only``: the lines naming one of those actions, decoded; every other line only
        checked to be a line of one action by its shape (:func:`split_line`; its body is left to
        the readers of that action), any line that is not (truncated, not an object, a name
        written with an escape) decoded, and judged. Plain lines are passed over by C-level tests
        (:func:`_examined`), without a Python step each."""
        only = self.only
        for i in _examined(lines, only):
            raw = lines[i]
            if any(map(raw.__contains__, only)) or split_line(raw) is None:
                self._lines((raw,), lineno + i, out)
        return lineno + len(lines)

    def _lines(self, lines: Iterable[bytes], lineno: int, out: list[ActionRun]) -> int:
        """Lines one by one; consecutive actions of one type join one run."""
        for raw in lines:
            lineno += 1
            for name, body, value in decode_line(raw, lineno, self.where, self.structs):
                last = out[-1] if out else None
                if last is not None and last.name == name and last.line + len(last.values) == lineno:
                    last.bodies.append(body)
                    last.values.append(value)
                else:
                    out.append(ActionRun(name, lineno, [body], [value]))
        return lineno


def _is_utf8(text: bytes) -> bool:
    if text.isascii():
        return True
    try:
        text.decode()  # strict: no surrogate, no overlong form (as msgspec decodes a string)
    except UnicodeDecodeError:
        return False
    return True


#: the first byte of a valid JSON text that is a string or null (``"`` and ``n``), as
#: :data:`_FIRST_BYTE` gives it: read from the raw text's buffer without a copy, one tuple per text
#: (a memoryview per text cost half as much again)
_STRING_OR_NULL = frozenset({(ord('"'),), (ord("n"),)})
_FIRST_BYTE: Callable[[Any], tuple[int, ...]] = struct.Struct("B").unpack_from
#: joins raw JSON texts so that one split gives them back as bytes: a NUL byte is in no valid JSON
#: text (outside strings only whitespace may separate tokens; inside, control characters are
#: escaped), which msgspec has checked of every raw field
_SEPARATOR = b"\x00"


def _forwarded(name: str, bodies: list[bytes], line: int) -> ActionRun | None:
    """Bodies of file actions (valid UTF-8) decoded with their forwarded fields raw, then those
    fields checked as the Struct checks them: ``stats`` by its first byte, ``partitionValues``
    once per distinct text. None when any of this refuses a body (the Structs, then the validators, judge
    them and name what is wrong), so nothing is accepted that the Struct would refuse."""
    decoder = FORWARD_DECODERS.get(name)
    if decoder is None:
        return None
    try:
        values = list(map(decoder.decode, bodies))
        partitions = None
        for field, check in FORWARD_CHECKS[name].items():
            raws = map(operator.attrgetter(field), values)
            if check is None:  # a string or null: by its first byte (no copy of the text)
                if not _STRING_OR_NULL.issuperset(map(_FIRST_BYTE, raws)):
                    return None
                continue
            # the texts as bytes in two C calls (a bytes() per text cost 40% more)
            distinct = dict.fromkeys(_SEPARATOR.join(raws).split(_SEPARATOR))
            checked = dict(zip(distinct, map(check.decode, distinct), strict=True))
            if field == "partitionValues":
                partitions = checked
    except (ValueError, struct.error):  # msgspec.DecodeError (a ValidationError too); an empty text
        return None
    return ActionRun(name, line, bodies, values, partitions)


#: how a line of one known action with an object body starts: one that also ends with ``}}`` is
#: plainly a line of one action (the body between is left to the readers of that action)
_OBJECT_PREFIXES = tuple(b'{"' + name.encode() + b'":{' for name in sorted(KNOWN_ACTIONS))
_STARTS_OBJECT = operator.methodcaller("startswith", _OBJECT_PREFIXES)


def _examined(lines: list[bytes], only: tuple[bytes, ...]) -> Iterator[int]:
    """Indices of the lines a reader looking for ``only`` must look at: those naming one of them,
    and those that are not plainly a line of one known action (C-level maps over the lines)."""
    wanted: Iterator[bool] = map(operator.contains, lines, repeat(only[0]))
    for name in only[1:]:
        wanted = map(operator.or_, wanted, map(operator.contains, lines, repeat(name)))
    plain = map(operator.and_, map(_STARTS_OBJECT, lines), map(_ENDS_ACTION, lines))
    return itertools.compress(itertools.count(), map(operator.or_, wanted, map(operator.not_, plain)))


def _lines_of(text: bytes) -> list[bytes]:
    """The lines of ``text``; a final newline ends a line, it starts none."""
    lines = text.split(b"\n")
    if text.endswith(b"\n"):
        lines.pop()
    return lines


def _plain_kinds(text: bytes, lines: list[bytes]) -> list[int]:
    """Per line: 1 for a plain add line, 2 for a plain remove line, 0 for any other (C-level maps)."""
    kinds: Iterator[int] = map(_STARTS[0], lines)
    if _PLAIN[1][0] in text:
        kinds = map(operator.add, kinds, map(operator.lshift, map(_STARTS[1], lines), repeat(1)))
    return list(map(operator.mul, kinds, map(_ENDS_ACTION, lines)))


def _bodies(pieces: list[bytes], first: int, n: int) -> list[bytes]:
    return list(map(bytes.strip, pieces[first : first + n], repeat(_WS)))


def _piece_text(pieces: list[bytes], first: int, n: int) -> bytes:
    """The log's own text of ``n`` pieces from ``first`` (the boundaries between them put back)."""
    prefix = b"" if first == 0 else _ADD_BOUNDARY[2:]
    suffix = b"" if first + n == len(pieces) else b"}"
    return b"".join((prefix, _ADD_BOUNDARY.join(pieces[first : first + n]), suffix))


def _piece_runs(pieces: list[bytes]) -> list[tuple[bool, int]]:
    """Runs of pieces: (whether they are add bodies, how many pieces).

    A piece between two boundaries is an add body unless it holds a newline; the first and the
    last never are. Usually no middle piece holds one.
    """
    last = len(pieces) - 1
    if last >= 2 and max(map(bytes.find, pieces[1:last], repeat(b"\n"))) < 0:
        return [(False, 1), (True, last - 1), (False, 1)]
    flags = [0 < i < last and piece.find(b"\n") < 0 for i, piece in enumerate(pieces)]
    return [(is_body, len(list(run))) for is_body, run in itertools.groupby(flags)]


# --- the readers' entry points -----------------------------------------------------------------------

#: a streamed file is read this much at a time
STREAM_CHUNK = 1024 * 1024


def line_buffers(fh: IO[bytes], chunk: int | None = None) -> Iterator[bytes]:
    """A file as buffers of whole lines, cut after a newline (the last may lack one)."""
    size = chunk or STREAM_CHUNK
    pending: list[bytes] = []  # a line longer than a chunk waits here for its end
    while block := fh.read(size):
        cut = block.rfind(b"\n") + 1
        if not cut:
            pending.append(block)
            continue
        yield b"".join((*pending, block[:cut])) if pending else block[:cut]
        pending = [block[cut:]] if cut < len(block) else []
    if pending:
        yield b"".join(pending)


def read_actions(
    data: bytes | Iterable[bytes],
    *,
    table: str | None,
    file: str | None,
    version: int | None = None,
    only: Sequence[bytes] = (),
    structs: bool = False,
) -> Iterator[ActionRun]:
    """The validated actions of a JSON-lines log file (a commit, a V2 checkpoint, a compaction),
    as runs, from its bytes or from buffers of whole lines (:func:`line_buffers`).

    With ``only`` (quoted names such as ``b'"metaData"'``), lines naming none of them are not
    decoded at all: a reader that needs a few actions of a commit of thousands skips the cost of
    the others (which the readers that use them validate).

    With ``structs``, the values of file actions (add, remove, cdc) are msgspec Structs of their
    fields (:data:`~.action_rules.STRUCTS`, read as attributes; fields unknown to this version are
    checked, not kept; in runs of plain lines ``stats`` and ``partitionValues`` are
    :class:`msgspec.Raw` text, checked, with the run's distinct maps in :attr:`ActionRun.partitions`)
    instead of dicts: for a reader that publishes the actions' own bytes and
    reads a few fields (the watcher), decoded in C at about half the cost. The same lines are
    accepted and refused, with the same messages.
    """
    scanner = _Scanner(Where(table, file, version), only, structs)
    lineno = 0
    for text in [data] if isinstance(data, bytes) else data:
        runs, lineno = scanner.buffer(text, lineno)
        yield from runs


def iter_values(runs: Iterable[ActionRun]) -> Iterator[tuple[int, str, Any]]:
    """(line, type, validated value) of every action of ``runs``, in file order."""
    for run in runs:
        yield from zip(itertools.count(run.line), repeat(run.name), run.values)


def check_actions(actions: Iterable[tuple[str, Any]], where: Where) -> Iterator[tuple[str, Any]]:
    """Actions decoded elsewhere (records of a mirror, say) get the checks a log line gets."""
    for index, (name, body) in enumerate(actions):
        try:
            yield name, validator_for(name).validate_python(body)
        except ValidationError as exc:
            raise where.refuse(field_problem(name, exc), None, index=index) from None


def parse_json(text: str | bytes, *, what: str, where: Where | None = None) -> Any:
    """Any other JSON text the log holds (``_last_checkpoint``, a ``schemaString``): strictly."""
    try:
        value = pydantic_core.from_json(text, allow_inf_nan=False)
        return finite(value)
    except (ValueError, PydanticCustomError) as exc:
        message = f"{what} is not valid JSON: {no_line(str(exc))}"
        raise (where or Where(None, None)).refuse(message) from None


# --- partition values ------------------------------------------------------------------------------

#: (physical name, logical name) of each partition column; either may key ``partitionValues``
PartitionKeys = tuple[tuple[str, str], ...]


class PartitionKeySets:
    """The distinct ``partitionValues`` of a commit's file actions, without a Python step per file.

    No key set is refused: PROTOCOL.md's ``partitionValues`` is "a map from partition column to
    value" (required on ``add`` and ``cdc``, optional on ``remove``) and does not require a key per
    partition column; delta-spark reads a missing key as null (``TahoeFileIndex``:
    ``partitionValues.get(colName).orNull``) and writes such maps itself (a ``remove`` after
    ``DELETE ... WHERE p IS NULL`` holds ``{}``), and so does every reader here."""

    def add(self, run: ActionRun) -> dict[tuple[tuple[str, Any], ...], None]:
        """Returns the distinct ``partitionValues`` of a run of file actions read as Structs
        (``read_actions(structs=True)``), as entry tuples, in the order met (none for an action
        without the map), which a caller summarizing partitions uses."""
        if run.name not in FILE_ACTIONS:
            return {}
        if run.partitions is not None:  # forwarded: each distinct text checked once already
            return dict.fromkeys(tuple(m.items()) for m in run.partitions.values() if m is not None)
        if len(run.values) == 1:  # small commits interleave removes and adds: runs of one
            one = run.values[0].partitionValues
            return {} if one is None else {tuple(one.items()): None}
        maps = list(map(_GET_PARTITION_VALUES, run.values))
        if None in maps:  # optional on a remove
            entries: list[Any] = [None if m is None else tuple(m.items()) for m in maps]
        else:
            entries = list(map(tuple, map(dict.items, maps)))
        distinct = dict.fromkeys(entries)
        distinct.pop(None, None)
        return distinct


_GET_PARTITION_VALUES = operator.attrgetter("partitionValues")
