"""Mutation classes of what the log points at: data and cdc paths, the files
themselves, how the table is named, and secrets in storage options.

A path outside the table root is listed by the log-level commands as the log has it (a shallow
clone's absolute paths are a legitimate table) but is never opened: ``read`` and ``changes`` refuse
it before any byte is read. Each escaping path points at a canary planted outside the root, most
often a byte-for-byte copy of the real file, so that only the operating system can tell it was
opened (the runner watches with inotify).
"""

from __future__ import annotations

import random
import urllib.parse
from collections.abc import Callable
from pathlib import Path

from mutation import logs as ml
from mutation.core import Env, Mutation, everywhere, mutation, replace_with
from mutation.logs import Facts, Line

# --- data and cdc paths -----------------------------------------------------------------------

#: trick -> (path in the log, where a copy of the real file is planted relative to the case folder)
PATH_TRICKS: dict[str, Callable[[Env], tuple[str, str | None]]] = {
    "dotdot": lambda e: ("../canary.parquet", "canary.parquet"),
    "dotdot-deep": lambda e: ("sub/../../canary.parquet", "canary.parquet"),
    "pct-dotdot": lambda e: ("%2e%2e/canary.parquet", "canary.parquet"),
    "pct-slash": lambda e: ("..%2Fcanary.parquet", "canary.parquet"),
    "pct-all": lambda e: ("%2E%2E%2Fcanary.parquet", "canary.parquet"),
    "absolute": lambda e: (str(e.case_dir / "canary.parquet"), "canary.parquet"),
    "file-uri": lambda e: (f"file://{e.case_dir}/canary.parquet", "canary.parquet"),
    "file-uri-one-slash": lambda e: (f"file:{e.case_dir}/canary.parquet", "canary.parquet"),
    "file-uri-host": lambda e: (f"file://other-host{e.case_dir}/canary.parquet", "canary.parquet"),
    "s3-other-bucket": lambda e: ("s3://other-bucket/canary.parquet", "other-bucket/canary.parquet"),
    "sibling-prefix": lambda e: (f"../{e.table}2/canary.parquet", f"{e.table}2/canary.parquet"),
    "etc-passwd": lambda e: ("/etc/passwd", None),
    "file-etc-passwd": lambda e: ("file:///etc/passwd", None),
    "nul-byte": lambda e: ("x\u0000/../../canary.parquet", "canary.parquet"),
}
PATH_MARKERS = {
    "dotdot": "../canary",
    "dotdot-deep": "../../canary",
    "pct-dotdot": "%2e%2e/canary",
    "pct-slash": "..%2Fcanary",
    "pct-all": "%2E%2E%2Fcanary",
    "absolute": "canary.parquet",
    "file-uri": "canary.parquet",
    "file-uri-one-slash": "canary.parquet",
    "file-uri-host": "other-host",
    "s3-other-bucket": "other-bucket",
    "sibling-prefix": "2/canary.parquet",
    "etc-passwd": "/etc/passwd",
    "file-etc-passwd": "file:///etc/passwd",
    "nul-byte": "canary.parquet",
}
PATH_NAMES = ("canary", "other-host", "other-bucket", "passwd", "..")


def _adds_with_files(f: Facts) -> list[Line]:
    return [ln for ln in f.lines("add") if (f.src / ml.decode_path(ln.body["path"])).is_file()]


def _retarget(ln: Line, trick: str) -> Callable[[Path, Env], None]:
    def apply(root: Path, env: Env) -> None:
        path_in_log, plant = PATH_TRICKS[trick](env)
        if plant is not None:
            env.plant(plant, (root / ml.decode_path(ln.body["path"])).read_bytes())
        ml.replace_line(root, ln.version, ln.lineno, ml.dumps({ln.kind: {**ln.body, "path": path_in_log}}))

    return apply


@mutation("add-path-escape", structural=True, applies=lambda f: bool(_adds_with_files(f)), instances=3)
def _add_escape(f: Facts, rng: random.Random) -> Mutation:
    """An add path outside the table root (``../``, ``%2e%2e/``, ``..%2F``, absolute, ``file://``,
    ``file://other-host/``, ``s3://other-bucket/``, a sibling ``../<table>2/``, ``/etc/passwd``, a NUL)."""
    adds = _adds_with_files(f)
    recent = [ln for ln in adds if ln.version > f.cp]
    ln = rng.choice(recent if recent and rng.random() < 0.8 else adds)
    trick = rng.choice(sorted(PATH_TRICKS))
    held = ln.version > f.cp  # a new path is never removed later: the latest state holds it
    expect = {
        "snapshot": "faithful" if held else "unchanged",
        "read": "refused" if held else "unchanged",
        "history": "unchanged",
        "events": "faithful",
    }
    if f.has_cdf:
        expect["changes"] = "refused" if f.change_feed_reads(ln) else "unchanged"
    return Mutation(
        expect,
        _retarget(ln, trick),
        f"v{ln.version}:l{ln.lineno}:{trick}",
        marker=PATH_MARKERS[trick],
        names_any=PATH_NAMES,
    )


INSIDE_FORMS = {
    "dot-segment": lambda p: f"sub/../{p}",
    "dot-slash": lambda p: f"./{p}",
    "pct-dot-slash": lambda p: f"%2E/{p}",
    "double-slash": lambda p: p.replace("/", "//", 1) if "/" in p else f".//{p}",
}


def _only_mention(f: Facts, ln: Line) -> bool:
    """The only action naming this path (a respelt path must not stop matching a remove or a DV update)."""
    return sum(x.body.get("path") == ln.body["path"] for x in f.lines("add", "remove", "cdc")) == 1


@mutation(
    "add-path-inside",
    structural=False,
    applies=lambda f: any(f.is_active(x) and _only_mention(f, x) for x in _adds_with_files(f)),
)
def _add_inside(f: Facts, rng: random.Random) -> Mutation:
    """An add path spelled with ``./``, ``sub/../``, ``%2E/`` or ``//`` that normalises to the same file
    inside the root: allowed, the same rows."""
    ln = rng.choice([x for x in _adds_with_files(f) if f.is_active(x) and _only_mention(f, x)])
    form = rng.choice(sorted(INSIDE_FORMS))
    new_path = INSIDE_FORMS[form](ln.body["path"])
    expect = everywhere(f, "unchanged")
    expect.update({"snapshot": "faithful" if ln.version > f.cp else "unchanged", "events": "faithful"})
    raw = ml.dumps({"add": {**ln.body, "path": new_path}})
    return Mutation(expect, replace_with(ln, raw), f"v{ln.version}:{form}", marker=new_path[:6])


def _cdc_lines(f: Facts) -> list[Line]:
    return [ln for ln in f.lines("cdc") if (f.src / ml.decode_path(ln.body["path"])).is_file()]


@mutation(
    "cdc-path-escape", structural=True, applies=lambda f: f.has_cdf and bool(_cdc_lines(f)), instances=2
)
def _cdc_escape(f: Facts, rng: random.Random) -> Mutation:
    """A cdc path outside the table root: only the change feed opens cdc files, and it refuses."""
    ln = rng.choice(_cdc_lines(f))
    trick = rng.choice(sorted(PATH_TRICKS))
    expect = everywhere(f, "unchanged")
    expect["events"] = "faithful"
    assert f.cdf_start is not None
    expect["changes"] = "refused" if ln.version >= f.cdf_start else "unchanged"
    return Mutation(
        expect,
        _retarget(ln, trick),
        f"v{ln.version}:l{ln.lineno}:{trick}",
        marker=PATH_MARKERS[trick],
        names_any=PATH_NAMES,
    )


@mutation("data-symlink-out", structural=True, applies=lambda f: bool(f.active))
def _data_symlink(f: Facts, rng: random.Random) -> Mutation | None:
    """An active data file that is a symlink to a copy outside the root (or a cdc file, for changes)."""
    files = [ln for ln in _adds_with_files(f) if f.is_active(ln)] + (_cdc_lines(f) if f.has_cdf else [])
    if not files:
        return None
    ln = rng.choice(files)
    rel = ml.decode_path(ln.body["path"])

    def apply(root: Path, env: Env) -> None:
        path = root / rel
        target = env.plant(f"outside/{Path(rel).name}", path.read_bytes())
        path.unlink()
        path.symlink_to(target)

    expect = everywhere(f, "unchanged")
    if ln.kind == "add":
        expect["read"] = "refused"
        if f.has_cdf and ml.file_read_by_feed(f, ln.body["path"]):
            expect["changes"] = "refused"
    elif f.cdf_start is not None and ln.version >= f.cdf_start:
        expect["changes"] = "refused"
    return Mutation(expect, apply, f"{ln.kind}:{Path(rel).name[:30]}", names_any=(Path(rel).name,))


# --- the files themselves ---------------------------------------------------------------------

CORRUPTIONS = ("truncated", "garbage", "empty", "missing", "magic-only", "footer-flip")


def _corrupt(rel: str, variant: str, rng: random.Random) -> Callable[[Path, Env], None]:
    junk = rng.randbytes(rng.randrange(8, 2048))
    frac = rng.uniform(0.1, 0.9)

    def apply(root: Path, env: Env) -> None:
        path = root / rel
        if variant == "missing":
            path.unlink()
            return
        data = bytearray(path.read_bytes())
        if variant == "truncated":
            data = data[: int(len(data) * frac)]
        elif variant == "garbage":
            data = bytearray(junk)
        elif variant == "empty":
            data = bytearray()
        elif variant == "magic-only":
            data = bytearray(b"PAR1" + junk + b"PAR1")
        else:  # the footer length and magic at the end
            for i in range(1, 9):
                data[-i] ^= 0xA5
        ml.write_keeping_mtime(path, bytes(data))

    return apply


@mutation(
    "data-file-corrupt",
    structural=False,
    applies=lambda f: any(f.is_active(x) for x in _adds_with_files(f)),
    instances=2,
)
def _data_corrupt(f: Facts, rng: random.Random) -> Mutation:
    """An active data file truncated, replaced, emptied, deleted or with a broken footer: ``read`` (and
    ``changes`` where it reads the file) refuses with exit 2; the log-level commands are unchanged."""
    active = [x for x in _adds_with_files(f) if f.is_active(x)]
    plain = [x for x in active if not x.body.get("deletionVector")]
    ln = rng.choice(plain or active)
    variant = rng.choice(CORRUPTIONS)
    rel = ml.decode_path(ln.body["path"])
    expect = everywhere(f, "unchanged")
    expect["read"] = "refused"
    if f.has_cdf and ml.file_read_by_feed(f, ln.body["path"]):
        expect["changes"] = "refused"
    return Mutation(
        expect, _corrupt(rel, variant, rng), f"{Path(rel).name[:30]}:{variant}", names_any=(Path(rel).name,)
    )


def _inactive_files(f: Facts) -> list[Line]:
    live = {k[0] for k in f.active}
    return [x for x in _adds_with_files(f) if x.body["path"] not in live]


@mutation("data-file-corrupt-inactive", structural=False, applies=lambda f: bool(_inactive_files(f)))
def _data_corrupt_inactive(f: Facts, rng: random.Random) -> Mutation:
    """A removed data file corrupted: ``read`` never opens it; ``changes`` refuses where it reads it."""
    ln = rng.choice(_inactive_files(f))
    variant = rng.choice(CORRUPTIONS)
    rel = ml.decode_path(ln.body["path"])
    expect = everywhere(f, "unchanged")
    if f.has_cdf and ml.file_read_by_feed(f, ln.body["path"]):
        expect["changes"] = "refused"
    return Mutation(
        expect, _corrupt(rel, variant, rng), f"{Path(rel).name[:30]}:{variant}", names_any=(Path(rel).name,)
    )


@mutation(
    "cdc-file-corrupt", structural=False, applies=lambda f: f.has_cdf and bool(_cdc_lines(f)), instances=2
)
def _cdc_corrupt(f: Facts, rng: random.Random) -> Mutation:
    """A cdc file corrupted: only the change feed reads it."""
    ln = rng.choice(_cdc_lines(f))
    variant = rng.choice(CORRUPTIONS)
    rel = ml.decode_path(ln.body["path"])
    expect = everywhere(f, "unchanged")
    assert f.cdf_start is not None
    expect["changes"] = "refused" if ln.version >= f.cdf_start else "unchanged"
    return Mutation(
        expect, _corrupt(rel, variant, rng), f"{Path(rel).name[:30]}:{variant}", names_any=(Path(rel).name,)
    )


# --- naming the table, secrets ----------------------------------------------------------------

TABLE_ARG_FORMS = ("symlink", "relative", "dot-relative", "file-uri", "trailing-slash", "dot-segments")


@mutation("table-arg-forms", structural=False)
def _table_arg(f: Facts, rng: random.Random) -> Mutation:
    """The same table named another way (through a symlink to its root, relative, a file:// URI, a
    trailing slash, dot segments): the same answers, and no path inside it counts as outside."""
    form = rng.choice(TABLE_ARG_FORMS)
    return Mutation(everywhere(f, "unchanged"), lambda root, env: None, form, table_arg=form)


def _secret(rng: random.Random) -> str:
    return f"s3cr3t{rng.randrange(10**8):08d}"


def secret_options(secret: str) -> dict[str, str]:
    """Storage options with a secret in every credential-shaped place."""
    return {
        "password": secret,
        "aws_secret_access_key": secret,
        "endpoint_url": f"http://mirror:{secret}@127.0.0.1:9",
        "sas_token": f"sv=2024&sig={secret}",
    }


@mutation("secret-storage-options", structural=False)
def _secret_options(f: Facts, rng: random.Random) -> Mutation:
    """Credentials in storage options of a local table, which takes none: refused in one line naming
    them as storage options (they would be silently ignored), the secrets never printed."""
    m = Mutation(everywhere(f, "refused"), lambda root, env: None, "options", names_any=("storage options",))
    m.secret = _secret(rng)
    m.options = secret_options(m.secret)
    return m


@mutation("secret-table-uri", structural=False)
def _secret_uri(f: Facts, rng: random.Random) -> Mutation:
    """A table URI with userinfo (``file://user:pass@localhost/...``): accepted or refused, the password
    never appears in any output, error or log record."""
    m = Mutation(everywhere(f, "open"), lambda root, env: None, "userinfo", table_arg="userinfo")
    m.secret = _secret(rng)
    return m


def _respellable(f: Facts) -> list[Line]:
    return [
        x for x in _adds_with_files(f) if f.is_active(x) and _only_mention(f, x) and "%" not in x.body["path"]
    ]


@mutation("add-path-encoded", structural=False, applies=lambda f: bool(_respellable(f)))
def _add_encoded(f: Facts, rng: random.Random) -> Mutation:
    """A data file renamed to a name with spaces, non-ASCII, ``%``, ``#`` or ``+``, and its add path
    written as a URI (percent-encoded; a literal ``+`` is a plus, not a space): the same rows."""
    ln = rng.choice(_respellable(f))
    variant = rng.choice(["encoded", "raw-plus"])
    old = ml.decode_path(ln.body["path"])
    parent, _, name = old.rpartition("/")
    new_name = f"mut é 100%#1 {name}" if variant == "encoded" else f"mut+plus+{name}"
    new_rel = f"{parent}/{new_name}" if parent else new_name
    in_log = urllib.parse.quote(new_rel, safe="/") if variant == "encoded" else new_rel
    raw = ml.dumps({"add": {**ln.body, "path": in_log}})

    def apply(root: Path, env: Env) -> None:
        (root / old).rename(root / new_rel)
        ml.replace_line(root, ln.version, ln.lineno, raw)

    expect = everywhere(f, "unchanged")
    expect.update({"snapshot": "faithful" if ln.version > f.cp else "unchanged", "events": "faithful"})
    if ln.version <= f.cp:
        expect["read"] = "refused"  # the checkpoint still names the old file, which is gone
    return Mutation(expect, apply, f"v{ln.version}:{variant}", marker=in_log[:24])
