"""The log boundary's two compiled forms give one answer: the pydantic-core validators and the
msgspec Structs of the file actions (core/action_rules.py writes each field's rule once and
compiles it to both; the watcher reads add, remove and cdc lines through the Structs).

What must hold, line by line, over every commit and JSON checkpoint of the real writers' tables
(tests/data/corpus, tests/data/tables) and of the mutation corpus (tests/mutation: the CI subset
here; ``make fuzz`` runs this file over the full campaign, DELTAMIRROR_MUTATION_SIZE=full):

* a body the Struct decoder accepts, the validator accepts, with the same value of every field;
* ``read_actions`` with ``structs`` and without accept and refuse the same files, with the same
  message (table, version, file, line, field), the same runs and bytes, and equal values;
* on the real writers' logs the Structs refuse no file action the validator accepts (else the
  watcher would pay for both).
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from pydantic_core import ValidationError

from deltamirror.core.action_rules import FILE_ACTIONS, STRUCT_DECODERS, VALIDATORS
from deltamirror.core.actions import read_actions, split_line
from deltamirror.core.errors import CorruptLogError

DATA = Path(__file__).resolve().parents[1] / "data"


def _same(struct: msgspec.Struct, value: Any) -> bool:
    """A Struct holds what the validator's dict holds in each of its fields (absent reads as null;
    the dict's fields this version does not know are not the Struct's; a field the watcher
    forwards, read raw, holds the JSON text of that value)."""
    if not isinstance(value, dict):
        return False
    for name in struct.__struct_fields__:
        a, b = getattr(struct, name), value.get(name)
        if isinstance(a, msgspec.Raw):
            a = msgspec.json.decode(a)
        if isinstance(a, msgspec.Struct):
            if not _same(a, b):
                return False
        elif type(a) is not type(b) or a != b:
            return False
    return True


def _has_unknown_field(kind: Any, value: dict[str, Any]) -> bool:
    """Whether ``value`` holds a field the Struct ``kind`` does not (there, or in a nested one)."""
    if set(value) - set(kind.__struct_fields__):
        return True
    return any(
        isinstance(value.get(f.name), dict) and _has_unknown_field(f.type.types[0].cls, value[f.name])
        for f in msgspec.inspect.type_info(kind).fields
        if isinstance(f.type, msgspec.inspect.UnionType)
        and isinstance(f.type.types[0], msgspec.inspect.StructType)
    )


def _lines(data: bytes) -> Iterator[bytes]:
    yield from data.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")


def _check_bodies(data: bytes, tally: dict[str, int]) -> list[str]:
    """Every file-action body of ``data``: accepted by the Struct => accepted by the validator, alike."""
    problems = []
    for raw in _lines(data):
        split = split_line(raw)
        if split is None or split[0] not in FILE_ACTIONS:
            continue
        name, body = split
        try:
            fast: Any = STRUCT_DECODERS[name].decode(body)
        except ValueError:  # msgspec.DecodeError, UnicodeDecodeError
            fast = None
        try:
            slow: Any = VALIDATORS[name].validate_json(body)
        except ValidationError:
            slow = None
        tally["lines"] += 1
        if fast is None:
            tally["left to the validator"] += 1
            if slow is not None and not _has_unknown_field(STRUCT_DECODERS[name].type, slow):
                tally["struct refused, validator accepted"] += 1
            continue
        if slow is None:
            problems.append(f"the Struct accepts, the validator refuses: {body[:200]!r}")
        elif not _same(fast, slow):
            problems.append(f"values differ: {fast} != {slow}")
    return problems


def _read(data: bytes, structs: bool) -> Any:
    try:
        runs = list(read_actions(data, table="t", file="f.json", version=3, structs=structs))
    except CorruptLogError as exc:
        return ("refused", str(exc), exc.line)
    return [(run.name, run.line, run.bodies, run.values) for run in runs]


def _check_readers(data: bytes) -> list[str]:
    """``read_actions`` with Structs and without: one verdict, one message, the same values."""
    fast, slow = _read(data, True), _read(data, False)
    if isinstance(fast, tuple) or isinstance(slow, tuple):
        return [] if fast == slow else [f"verdicts differ: {fast!r:.300} != {slow!r:.300}"]
    problems = []
    if [r[:3] for r in fast] != [r[:3] for r in slow]:
        problems.append("runs differ")
    for (name, line, _, values), (_, _, _, checked) in zip(fast, slow, strict=False):
        for i, (a, b) in enumerate(zip(values, checked, strict=True)):
            if not (_same(a, b) if name in FILE_ACTIONS else a == b):
                problems.append(f"line {line + i}: values differ: {a} != {b}")
    return problems


def _log_files(root: Path) -> Iterator[Path]:
    for path in root.rglob("*.json"):
        if "_delta_log" in path.parts and path.is_file():
            yield path


def _real_writers_files() -> list[Path]:
    return sorted(p for base in (DATA / "corpus", DATA / "tables") for p in _log_files(base))


def test_the_real_writers_logs_read_alike_and_take_the_fast_path() -> None:
    files = _real_writers_files()
    assert len(files) > 500
    tally = dict.fromkeys(("lines", "left to the validator", "struct refused, validator accepted"), 0)
    problems: list[str] = []
    for path in files:
        data = path.read_bytes()
        problems += [f"{path}: {p}" for p in _check_bodies(data, tally) + _check_readers(data)]
    assert not problems, "\n".join(problems[:20])
    assert tally["lines"] > 1000
    # every add, remove and cdc a writer wrote is decoded by the Structs alone, unless it holds a
    # field this version does not know (delta-rs's stats_parsed, a test's new column)
    assert tally["struct refused, validator accepted"] == 0, tally


def _mutated_files(tmp: Path) -> Iterator[tuple[str, bytes]]:
    """(case, bytes) of every distinct log file of the mutation corpus."""
    from mutation.cases import generate
    from mutation.runner import Runner

    size = os.environ.get("DELTAMIRROR_MUTATION_SIZE", "ci")
    cases = generate(int(os.environ.get("DELTAMIRROR_MUTATION_SEED", "11")), size)
    runner = Runner(tmp, timeout_s=60.0)
    seen: set[bytes] = set()
    for case in cases:
        env, _ = runner.prepare(case)
        for path in _log_files(env.root):
            try:
                data = path.read_bytes()
            except OSError:  # made unreadable, or a loop of links: no line to compare
                continue
            digest = hashlib.sha256(data).digest()
            if digest not in seen:
                seen.add(digest)
                yield case.id, data
        shutil.rmtree(env.case_dir, ignore_errors=True)


def test_the_mutation_corpus_reads_alike(tmp_path: Path) -> None:
    tally = dict.fromkeys(("lines", "left to the validator", "struct refused, validator accepted"), 0)
    problems: list[str] = []
    files = 0
    for case, data in _mutated_files(tmp_path):
        files += 1
        problems += [f"{case}: {p}" for p in _check_bodies(data, tally) + _check_readers(data)]
    assert not problems, "\n".join(problems[:20])
    assert files > 100 and tally["left to the validator"] > 0, tally


_ADD = (
    b'{"path":"a.parquet","partitionValues":{"p":"1"},"size":1,"modificationTime":2,"dataChange":true,'
    b'"stats":"{}"'
)
_DV = b'"deletionVector":{"storageType":"u","pathOrInlineDv":"ab","sizeInBytes":3,"cardinality":4'


@pytest.mark.parametrize(
    "body",
    [
        _ADD + b"}",
        _ADD + b',"tags":null,"baseRowId":null}',
        _ADD + b"," + _DV + b"}}",
        _ADD + b"," + _DV + b',"offset":1,"maxRowIndex":9}}',
        _ADD + b"," + _DV + b',"extra":1e999}}',  # an unknown field of the descriptor: NaN-like
        _ADD + b"," + _DV + b',"extra":[1,{"a":null}]}}',
        _ADD + b"," + _DV + b',"storageType":"x"}}',
        _ADD + b',"future":{"a":[1.5,true]}}',  # an unknown field: kept by the validator, checked
        _ADD + b',"future":1e999}',
        _ADD + b',"future":123456789012345678901234567890}',
        _ADD + b',"size":"1"}',
        _ADD + b',"size":1.0}',
        _ADD + b',"size":-1}',
        _ADD + b',"size":9223372036854775808}',
        _ADD + b',"modificationTime":-9223372036854775809}',
        _ADD + b',"dataChange":1}',
        _ADD + b',"path":""}',
        _ADD + b',"path":null}',
        _ADD + b',"size":"x","size":5}',  # names twice: the last wins, for both
        _ADD + b',"size":5,"size":"x"}',
        _ADD + b',"stats":"\\ud800"}',  # a lone surrogate
        _ADD + b',"stats":"\\udc00x"}',
        _ADD + b',"stats":"\xff"}',  # invalid UTF-8
        _ADD + b',"stats":"\xed\xa0\x80"}',
        _ADD + b',"stats":"\xc0\x80"}',
        _ADD + b',"stats":"a\tb"}',  # a control character
        _ADD + b',"tags":{"\xff":"x"}}',
        _ADD + b',"tags":{"a":1}}',
        _ADD + b',"tags":{"a":NaN}}',
        _ADD + b',"partitionValues":{"p":["x"]}}',
        _ADD + b',"partitionValues":null}',
        # the fields the watcher reads raw (stats, tags, partitionValues), checked after the parse
        _ADD + b',"stats":5}',
        _ADD + b',"stats":true}',
        _ADD + b',"stats":null}',
        _ADD + b',"stats":{"numRecords":1}}',
        _ADD + b',"stats":["{}"]}',
        _ADD + b',"stats":"\\u00e9\\"\\n"}',
        _ADD + b',"stats":"\xc3\xa9"}',  # valid UTF-8, not ASCII
        _ADD + b',"tags":"x"}',
        _ADD + b',"tags":[]}',
        _ADD + b',"tags":{"a":{"b":"c"}}}',
        _ADD + b',"tags":{"a":null,"b":"\xc3\xa9"}}',
        _ADD + b',"partitionValues":"p=1"}',
        _ADD + b',"partitionValues":{"p":1}}',
        _ADD + b',"partitionValues":{"p":null,"q":"x"}}',
        _ADD + b',"partitionValues":{"p":"1","p":2}}',
        _ADD + b"} trailing",
        _ADD + b",}",
        _ADD + b',"size":01}',
        _ADD + b',"size":+1}',
        _ADD + b',"size":Infinity}',
        b'{"path":"a","partitionValues":{},"size":1,"modificationTime":2}',  # dataChange missing
        b'{"path":"a","partitionValues":' + b'{"a":' * 300 + b"1" + b"}" * 301,
        b"[]",
        b"null",
        b'"add"',
    ],
)
@pytest.mark.parametrize("name", sorted(FILE_ACTIONS))
def test_one_answer_for_hand_made_lines(name: str, body: bytes) -> None:
    """Lines at the edges of the rules (the cases where JSON parsers and validators differ)."""
    tally = dict.fromkeys(("lines", "left to the validator", "struct refused, validator accepted"), 0)
    data = b'{"' + name.encode() + b'":' + body + b"}\n"
    assert _check_bodies(data, tally) == []
    assert _check_readers(data) == []
    assert _check_readers(data * 100) == []  # a run of lines, decoded together


def test_plain_file_actions_are_read_with_their_forwarded_fields_raw() -> None:
    """The watcher's fast path: a run of add lines is parsed with stats and partitionValues left
    as JSON text (checked, not built), each distinct partitionValues text checked once; a
    buffer that is not valid UTF-8 (which msgspec does not check of raw text) takes the Structs,
    which refuse the line."""
    lines = b"".join(b'{"add":' + _ADD + b',"tags":{"t":"' + str(i).encode() + b'"}}}\n' for i in range(100))
    runs = list(read_actions(lines, table="t", file="f.json", version=3, structs=True))
    assert {r.name for r in runs} == {"add"} and sum(map(len, runs)) == 100
    assert all(r.partitions == {b'{"p":"1"}': {"p": "1"}} for r in runs)
    first = runs[0].values[0]
    assert isinstance(first.stats, msgspec.Raw) and bytes(first.stats) == b'"{}"'
    assert first.tags == {"t": "0"}
    assert _check_readers(lines) == []
    not_utf8 = lines.replace(b'"t":"7"', b'"t":"\xff"')
    with pytest.raises(CorruptLogError, match=r"line=8"):
        list(read_actions(not_utf8, table="t", file="f.json", version=3, structs=True))
    accented = lines.replace(b'"t":"7"', b'"t":"\xc3\xa9"')
    runs = list(read_actions(accented, table="t", file="f.json", version=3, structs=True))
    assert [v for r in runs for v in r.values][7].tags == {"t": "\u00e9"}
    assert all(r.partitions is not None for r in runs)  # valid UTF-8: the fast path too
    assert _check_readers(accented) == []
