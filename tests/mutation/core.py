"""The mutation suite's vocabulary: cases, expectations, the class registry and the canary folder.

Every mutation class declares, per command, one EXPECTATION derived from the Delta protocol:

``refused``     exit 2, one line on stderr (a DeltaMirrorError in the library), no traceback, naming
                the file (and line, and field) where the case says so;
``unchanged``   the same output as the unmutated table (the mutation is harmless to that command,
                or that command never reads what was mutated);
``faithful``    exit 0 and the output carries the mutated value (log-level commands print the log as
                it is: a path outside the root is listed by ``snapshot`` but never opened);
``accepted``    exit 0 with well-formed output (an unknown field or action: allowed by the protocol,
                how it is shown is free);
``consistent``  exit 0, and every command gives a version the same timestamp (file-time classes);
``open``        exit 0 or a clean refusal. Only for non-structural classes where the protocol leaves
                the choice to the reader (never for missing or mistyped fields, null actions,
                NaN/Infinity or bad paths: ``check_expectations`` enforces it).

Which commands a mutation reaches follows the protocol: ``snapshot``/``read`` build the latest state
from the newest checkpoint and the commits after it, so a commit the checkpoint covers is not
theirs to judge; ``history`` and ``events`` read every commit of the log; ``changes`` reads the
commits of its range and the latest state. Every command resolves the latest protocol, metadata and
checkpoint (the protocol check happens at every entry), so a broken latest checkpoint or an
unreadable latest protocol is refused by all of them.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mutation import logs as ml
from mutation.logs import Facts, Line

CLI_COMMANDS = ("snapshot", "read", "history", "changes", "events")
EXPECTATIONS = ("refused", "unchanged", "faithful", "accepted", "consistent", "open")
STRUCTURAL_ALLOWED = {"refused", "unchanged", "faithful"}


@dataclass(frozen=True)
class TableSpec:
    id: str
    about: str
    ci: bool = False  # in the pool the bounded CI subset draws from
    share: float = 1.0  # in the full run, the share of classes applied (long logs cost more per case)


@dataclass
class Env:
    """A case's folder: the table copy and, beside it, the canaries path tricks point at."""

    case_dir: Path
    root: Path
    table: str
    canary: str  # a marker that only canary files contain

    @property
    def outside_files(self) -> Iterator[Path]:
        for p in self.case_dir.rglob("*"):
            if p.is_file() and not p.is_relative_to(self.root):
                yield p

    def plant(self, rel: str, data: bytes) -> Path:
        """A canary at ``rel`` under the case folder (outside the table root)."""
        p = self.case_dir / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        return p


@dataclass
class Mutation:
    expect: dict[str, str]
    apply: Callable[[Path, Env], None]
    detail: str
    file: str | None = None  # a refusal must name this file (basename)
    line: int | None = None  # ... and this line
    field_name: str | None = None  # ... and this field
    names_any: tuple[str, ...] = ()  # ... or, when set, at least one of these
    marker: str | None = None  # what a `faithful` output must contain (whitespace-insensitive)
    table_arg: str | None = None  # how commands name the table: None (absolute path) or a form
    secret: str | None = None  # must appear in no output, error or log record
    options: dict[str, str] = field(default_factory=dict)  # storage options given to every command
    #: the log as a cleanup leaves it: commits and checkpoints before the latest checkpoint deleted
    #: (in the unmutated baseline too), so that every command needs the latest checkpoint
    cleaned: bool = False
    #: fields of the snapshot's file records not compared (they depend on where the state was read
    #: from: a checkpoint stores dataChange=false and may drop stats)
    ignore_fields: tuple[str, ...] = ()


@dataclass
class Case(Mutation):
    id: str = ""
    cls: str = ""
    table: str = ""
    structural: bool = False


@dataclass(frozen=True)
class MutationClass:
    name: str
    structural: bool
    make: Callable[[Facts, random.Random], Mutation | None]
    applies: Callable[[Facts], bool]
    instances: int  # per table in the full run
    about: str


CLASSES: dict[str, MutationClass] = {}


def mutation(
    name: str, *, structural: bool, applies: Callable[[Facts], bool] = lambda f: True, instances: int = 1
) -> Callable[[Callable[[Facts, random.Random], Mutation | None]], Callable[..., Any]]:
    def register(fn: Callable[[Facts, random.Random], Mutation | None]) -> Callable[..., Any]:
        CLASSES[name] = MutationClass(name, structural, fn, applies, instances, (fn.__doc__ or "").strip())
        return fn

    return register


# --- expectations -----------------------------------------------------------------------------


def at_commit(
    f: Facts, version: int, hit: str = "refused", miss: str = "unchanged", kind: str | None = None
) -> dict[str, str]:
    reach = f.reaches_commit(version, kind)
    return {c: hit if reached else miss for c, reached in reach.items() if reached is not None}


def everywhere(f: Facts, value: str) -> dict[str, str]:
    return {c: value for c in CLI_COMMANDS if c != "changes" or f.has_cdf}


def line_level(
    f: Facts, ln: Line, apply: Callable[[Path, Env], None], detail: str, syntax: bool = False, **kw: Any
) -> Mutation:
    """A mutation of one line; ``syntax``: the line no longer parses (no reader can tell what it was)."""
    return Mutation(
        at_commit(f, ln.version, kind="syntax" if syntax else ln.kind),
        apply,
        f"v{ln.version}:l{ln.lineno}:{detail}",
        file=ml.commit_name(ln.version),
        line=ln.lineno,
        **kw,
    )


def replace_with(ln: Line, new: bytes | list[bytes]) -> Callable[[Path, Env], None]:
    return lambda root, env: ml.replace_line(root, ln.version, ln.lineno, new)


SENTINEL = "@@mutation-sentinel@@"


def dump_with_raw(obj: Any, raw: bytes) -> bytes:
    """JSON of ``obj`` where the value SENTINEL is replaced by ``raw`` bytes (NaN, bad UTF-8, ...)."""
    return ml.dumps(obj).replace(json.dumps(SENTINEL).encode(), raw, 1)


def nested(depth: int, rng: random.Random) -> bytes:
    if rng.random() < 0.5:
        return b"[" * depth + b"]" * depth
    return b'{"a":' * depth + b"1" + b"}" * depth
