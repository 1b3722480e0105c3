"""Mutation classes of checkpoints, sidecars, ``_last_checkpoint`` and commit file times."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from mutation import logs as ml
from mutation.core import (
    SENTINEL,
    Env,
    Mutation,
    dump_with_raw,
    everywhere,
    mutation,
)
from mutation.logs import Facts, Line

# --- checkpoints and sidecars -----------------------------------------------------------------


def _has_cp(f: Facts) -> bool:
    return f.cp >= 0


def _cp_paths(f: Facts) -> list[str]:
    """The files of the latest checkpoint, relative to _delta_log (sidecars included)."""
    return [*f.checkpoints.get(f.cp, []), *(f"_sidecars/{s}" for s in f.sidecars.get(f.cp, []))]


def _files_with(f: Facts, column: str) -> list[tuple[str, int]]:
    """(file, rows) for the latest checkpoint's parquet files that hold rows of ``column``."""
    out = []
    for rel in _cp_paths(f):
        if not rel.endswith(".parquet"):
            continue
        t = pq.read_table(f.src / "_delta_log" / rel)
        if column in t.column_names:
            rows = list(ml.struct_rows(t, column))
            if rows:
                out.append((rel, rows[0] if len(rows) == 1 else rows[len(rows) // 2]))
    return out


@mutation("checkpoint-corrupt", structural=True, applies=_has_cp, instances=2)
def _checkpoint_corrupt(f: Facts, rng: random.Random) -> Mutation:
    """The latest checkpoint (a classic one, a part of a multi-part one, a V2 top-level file) truncated,
    emptied or replaced by bytes that are not parquet / JSON, on a log cleaned up to it: every
    command needs its protocol and metadata, and refuses it."""
    rel = rng.choice(f.checkpoints[f.cp])
    variant = rng.choice(["truncated", "empty", "random-bytes", "parquet-magic-only", "json-text"])
    frac = rng.uniform(0.05, 0.95)
    junk = rng.randbytes(rng.randrange(16, 4096))

    v2_hint = ml.UUID_CP_RE.match(Path(rel).name) is not None

    def apply(root: Path, env: Env) -> None:
        path = root / "_delta_log" / rel
        if v2_hint:  # the hint may carry the V2 checkpoint's content: make the file the only source
            (root / "_delta_log" / "_last_checkpoint").unlink(missing_ok=True)
        data = path.read_bytes()
        new = {
            "truncated": data[: int(len(data) * frac)],
            "empty": b"",
            "random-bytes": junk,
            "parquet-magic-only": b"PAR1" + junk + b"PAR1",
            "json-text": b'{"add":{"path":"x"}}\n',
        }[variant]
        ml.write_keeping_mtime(path, new)

    m = Mutation(everywhere(f, "refused"), apply, f"{Path(rel).name[:28]}:{variant}", file=Path(rel).name)
    m.cleaned = True
    return m


def _needs_files(f: Facts) -> dict[str, str]:
    """A defect in a checkpoint's file actions (add rows, sidecars): snapshot and read need them and
    refuse; history, events and changes need only the protocol and metadata, which are intact, and
    give the unmutated answers (as delta-spark, whose state reconstruction projects those columns)."""
    expect = everywhere(f, "unchanged")
    expect.update({"snapshot": "refused", "read": "refused"})
    return expect


@mutation("checkpoint-bad-rows", structural=True, applies=lambda f: bool(_files_with(f, "add")), instances=3)
def _checkpoint_bad_rows(f: Facts, rng: random.Random) -> Mutation:
    """Checkpoint add rows broken as parquet allows: a null path, a required column gone, a column of
    the wrong type (not castable), a negative size."""
    rel, row = rng.choice(_files_with(f, "add"))
    variant = rng.choice(["null-path", "drop-column", "wrong-type", "negative-size"])
    dropped = rng.choice(["path", "size", "partitionValues", "modificationTime", "dataChange"])
    retyped = rng.choice(["size", "partitionValues", "dataChange", "path"])

    def apply(root: Path, env: Env) -> None:
        path = root / "_delta_log" / rel
        t = pq.read_table(path)
        add = t.column("add").combine_chunks()
        if variant == "null-path":
            values = add.field("path").to_pylist()
            values[row] = None
            t = ml.replace_struct_child(t, "add", "path", pa.array(values, pa.string()))
        elif variant == "drop-column":
            t = ml.replace_struct_child(t, "add", dropped, None)
        elif variant == "wrong-type":
            old = add.field(retyped).to_pylist()
            new = pa.array([[1, 2] if v is not None else None for v in old], pa.list_(pa.int64()))
            t = ml.replace_struct_child(t, "add", retyped, new)
        else:
            values = add.field("size").to_pylist()
            values[row] = -1
            t = ml.replace_struct_child(t, "add", "size", pa.array(values, pa.int64()))
        ml.rewrite_parquet(path, t)

    detail = {"drop-column": f"drop-{dropped}", "wrong-type": f"list-{retyped}"}.get(variant, variant)
    return Mutation(_needs_files(f), apply, f"{Path(rel).name[:28]}:{detail}", file=Path(rel).name)


def _state_only_in_cp(f: Facts, kind: str) -> bool:
    return _has_cp(f) and not any(ln.kind == kind for v in f.commits if v > f.cp for ln in f.commits[v])


@mutation(
    "checkpoint-without-protocol-or-metadata",
    structural=True,
    applies=lambda f: _state_only_in_cp(f, "protocol") and _state_only_in_cp(f, "metaData"),
)
def _checkpoint_without(f: Facts, rng: random.Random) -> Mutation:
    """The latest checkpoint lacks its protocol or metaData rows (nothing after it has them), on a log
    cleaned up to it: the table state is incomplete for every command."""
    kind = rng.choice(["protocol", "metaData"])
    files = [rel for rel in f.checkpoints[f.cp]]

    def apply(root: Path, env: Env) -> None:
        for rel in files:
            path = root / "_delta_log" / rel
            if rel.endswith(".json"):
                kept = [x for x in path.read_bytes().split(b"\n") if not x.startswith(b'{"' + kind.encode())]
                ml.write_keeping_mtime(path, b"\n".join(kept))
                continue
            t = pq.read_table(path)
            if kind in t.column_names:
                ml.rewrite_parquet(path, t.drop_columns([kind]))
        (root / "_delta_log" / "_last_checkpoint").unlink(missing_ok=True)

    m = Mutation(everywhere(f, "refused"), apply, kind)
    m.cleaned = True
    return m


@mutation("checkpoint-older-corrupt", structural=False, applies=lambda f: len(f.checkpoints) >= 2)
def _checkpoint_older_corrupt(f: Facts, rng: random.Random) -> Mutation:
    """A checkpoint older than the latest one corrupted: no command needs it."""
    v = rng.choice([x for x in f.checkpoints if x != f.cp])
    rel = rng.choice(f.checkpoints[v])

    def apply(root: Path, env: Env) -> None:
        path = root / "_delta_log" / rel
        ml.write_keeping_mtime(path, path.read_bytes()[:100])

    return Mutation(everywhere(f, "unchanged"), apply, f"cp{v}")


@mutation("checkpoint-incomplete-or-gone", structural=False, applies=_has_cp)
def _checkpoint_gone(f: Facts, rng: random.Random) -> Mutation:
    """The latest checkpoint deleted, or a part of a multi-part one missing (readers must ignore an
    incomplete checkpoint): the state is rebuilt from the commits, identical."""
    files = f.checkpoints[f.cp]
    variant = rng.choice(["part-missing", "deleted"]) if len(files) > 1 else "deleted"
    victim = rng.choice(files)
    keep_hint = rng.random() < 0.5

    def apply(root: Path, env: Env) -> None:
        log = root / "_delta_log"
        if variant == "part-missing":
            (log / victim).unlink()
            return
        for rel in _cp_paths(f):
            (log / rel).unlink()
        if not keep_hint:
            (log / "_last_checkpoint").unlink(missing_ok=True)

    m = Mutation(everywhere(f, "unchanged"), apply, f"cp{f.cp}:{variant}:hint={keep_hint}")
    m.ignore_fields = ("dataChange", "stats", "tags")
    return m


@mutation("sidecar-broken", structural=True, applies=lambda f: bool(f.sidecars.get(f.cp)), instances=2)
def _sidecar_broken(f: Facts, rng: random.Random) -> Mutation:
    """A sidecar of the latest V2 checkpoint missing or corrupt."""
    name = rng.choice(f.sidecars[f.cp])
    variant = rng.choice(["missing", "truncated", "garbage"])

    def apply(root: Path, env: Env) -> None:
        path = root / "_delta_log" / "_sidecars" / name
        if variant == "missing":
            path.unlink()
        else:
            data = path.read_bytes()
            ml.write_keeping_mtime(path, data[: len(data) // 2] if variant == "truncated" else b"not parquet")

    return Mutation(_needs_files(f), apply, f"{name[:30]}:{variant}", file=name)


SIDECAR_TRICKS = (
    "../../../sidecar-canary.parquet",
    "%2e%2e/%2e%2e/%2e%2e/sidecar-canary.parquet",
    "abs",
    "file-uri",
)


@mutation("sidecar-path-escape", structural=True, applies=lambda f: bool(f.sidecars.get(f.cp)), instances=2)
def _sidecar_escape(f: Facts, rng: random.Random) -> Mutation:
    """A V2 checkpoint's sidecar path pointing outside _delta_log/_sidecars (a copy of the real sidecar
    waits there: only the operating system sees it opened). Sidecars hold file actions only."""
    name = rng.choice(f.sidecars[f.cp])
    trick = rng.choice(SIDECAR_TRICKS)
    top = f.checkpoints[f.cp][0]

    def apply(root: Path, env: Env) -> None:
        log = root / "_delta_log"
        canary = env.plant("sidecar-canary.parquet", (log / "_sidecars" / name).read_bytes())
        target = {"abs": str(canary), "file-uri": f"file://{canary}"}.get(trick, trick)
        path = log / top
        if top.endswith(".json"):
            lines = path.read_bytes().split(b"\n")
            for i, raw in enumerate(lines):
                if raw.startswith(b'{"sidecar"') and json.loads(raw)["sidecar"]["path"] == name:
                    obj = json.loads(raw)
                    obj["sidecar"]["path"] = target
                    lines[i] = ml.dumps(obj)
            ml.write_keeping_mtime(path, b"\n".join(lines))
        else:
            t = pq.read_table(path)
            paths = t.column("sidecar").combine_chunks().field("path").to_pylist()
            paths = [target if p == name else p for p in paths]
            ml.rewrite_parquet(
                path, ml.replace_struct_child(t, "sidecar", "path", pa.array(paths, pa.string()))
            )
        (log / "_last_checkpoint").unlink(missing_ok=True)  # it may list the sidecars too

    return Mutation(_needs_files(f), apply, f"{trick[:20]}", names_any=("sidecar-canary",))


def _v2_json_lines(f: Facts) -> list[Line]:
    top = f.checkpoints.get(f.cp, [""])[0]
    if not top.endswith(".json"):
        return []
    data = (f.src / "_delta_log" / top).read_bytes()
    out = []
    for i, raw in enumerate(data.split(b"\n"), start=1):
        if raw.strip():
            ((kind, body),) = json.loads(raw).items()
            out.append(Line(f.cp, i, raw, kind, body))
    return out


@mutation("v2-checkpoint-line", structural=True, applies=lambda f: bool(_v2_json_lines(f)), instances=2)
def _v2_checkpoint_line(f: Facts, rng: random.Random) -> Mutation:
    """A broken protocol, metaData or checkpointMetadata line in a V2 JSON checkpoint (truncated, null,
    a required field missing, NaN), on a log cleaned up to it: every command needs those lines."""
    ln = rng.choice(
        [x for x in _v2_json_lines(f) if x.kind in ("protocol", "metaData", "checkpointMetadata")]
    )
    top = f.checkpoints[f.cp][0]
    variant = rng.choice(["truncated", "null", "missing-field", "nan"])
    body = ln.body
    if variant == "truncated":
        new = ln.raw[: rng.randrange(1, len(ln.raw) - 1)]
    elif variant == "null":
        new = ml.dumps({ln.kind: None})
    elif variant == "missing-field" and isinstance(body, dict) and body:
        new = ml.dumps({ln.kind: {k: v for k, v in body.items() if k != next(iter(body))}})
    else:
        new = dump_with_raw({ln.kind: {**body, "sizeInBytes": SENTINEL}}, b"NaN")

    def apply(root: Path, env: Env) -> None:
        path = root / "_delta_log" / top
        lines = path.read_bytes().split(b"\n")
        lines[ln.lineno - 1] = new
        ml.write_keeping_mtime(path, b"\n".join(lines))
        (root / "_delta_log" / "_last_checkpoint").unlink(missing_ok=True)

    m = Mutation(
        everywhere(f, "refused"), apply, f"l{ln.lineno}:{ln.kind}:{variant}", file=top, line=ln.lineno
    )
    m.cleaned = True
    return m


@mutation("last-checkpoint-bad", structural=False, instances=2)
def _last_checkpoint_bad(f: Facts, rng: random.Random) -> Mutation:
    """_last_checkpoint is only a hint: garbage, a version that does not exist, wrong types, NaN, deep
    nesting, a stale version; the listing decides and nothing changes."""
    variant = rng.choice(
        ["garbage", "empty-object", "nowhere", "huge", "negative", "string", "nan", "deep", "stale", "parts"]
    )
    content = {
        "garbage": rng.randbytes(64),
        "empty-object": b"{}",
        "nowhere": ml.dumps({"version": f.latest + rng.randrange(1, 1000), "size": 3}),
        "huge": ml.dumps({"version": 10**30}),
        "negative": ml.dumps({"version": -1}),
        "string": ml.dumps({"version": "x", "size": []}),
        "nan": b'{"version":NaN}',
        "deep": b'{"version":' + b"[" * 50_000 + b"]" * 50_000 + b"}",
        "stale": ml.dumps({"version": 0, "size": 1}),
        "parts": ml.dumps({"version": max(f.cp, 0), "parts": 7, "size": 3}),
    }[variant]

    def apply(root: Path, env: Env) -> None:
        (root / "_delta_log" / "_last_checkpoint").write_bytes(content)

    return Mutation(everywhere(f, "unchanged"), apply, variant)


# --- file times -------------------------------------------------------------------------------


def _skew(f: Facts, rng: random.Random) -> tuple[str, Callable[[Path], None]]:
    variant = rng.choice(["reverse", "all-equal", "one-back", "epoch-zero", "far-future"])
    pick = rng.randrange(1, f.latest + 1) if f.latest >= 1 else 0

    def times(v: int) -> int | None:
        if variant == "reverse":
            return ml.log_mtime_ms(f.latest - v)
        if variant == "all-equal":
            return ml.BASE_MTIME_MS
        if v != pick:
            return None
        return {"one-back": ml.log_mtime_ms(v - 2) + 7, "epoch-zero": 0, "far-future": 7_258_118_400_000}[
            variant
        ]

    def apply(root: Path) -> None:
        for p in (root / "_delta_log").iterdir():
            head = p.name.split(".", 1)[0]
            if head.isdigit() and len(head) == 20 and p.is_file():
                t = times(int(head))
                if t is not None:
                    ml.set_mtime(p, t)

    return f"{variant}@v{pick}", apply


@mutation("mtime-skew", structural=False, applies=lambda f: f.ict_from is None and f.latest >= 1, instances=2)
def _mtime_skew(f: Facts, rng: random.Random) -> Mutation:
    """Commit file times out of order (reversed, equal, one stepping back, 0, year 2200): every command
    gives each version the same timestamp, strictly increasing, and the same rows."""
    detail, skew = _skew(f, rng)
    return Mutation(everywhere(f, "consistent"), lambda root, env: skew(root), detail)


@mutation("mtime-skew-no-checkpoint", structural=False, applies=lambda f: f.ict_from is None and _has_cp(f))
def _mtime_skew_no_cp(f: Facts, rng: random.Random) -> Mutation:
    """As mtime-skew, with the latest checkpoint deleted: a version's timestamp does not depend on
    whether a checkpoint exists."""
    detail, skew = _skew(f, rng)

    def apply(root: Path, env: Env) -> None:
        skew(root)
        for rel in _cp_paths(f):
            (root / "_delta_log" / rel).unlink()
        (root / "_delta_log" / "_last_checkpoint").unlink(missing_ok=True)

    m = Mutation(everywhere(f, "consistent"), apply, detail)
    m.ignore_fields = ("dataChange", "stats", "tags")
    return m
