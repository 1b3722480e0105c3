"""Mutation classes of deletion vectors: descriptors the protocol forbids, descriptors that do not
match their bytes, DV files corrupted or symlinked out, DV paths escaping the table root.
"""

from __future__ import annotations

import random
import uuid
from pathlib import Path
from typing import Any

from mutation import logs as ml
from mutation.core import Env, Mutation, everywhere, line_level, mutation, replace_with
from mutation.logs import Facts, Line

# --- deletion vectors: descriptors --------------------------------------------------------------


def _dv_lines(f: Facts, *types: str) -> list[Line]:
    return [
        ln
        for ln in f.lines("add")
        if ln.body.get("deletionVector") and (not types or ln.body["deletionVector"]["storageType"] in types)
    ]


def _pick_dv(f: Facts, rng: random.Random, *types: str) -> Line:
    lines = _dv_lines(f, *types)
    active = [ln for ln in lines if f.is_active(ln) and ln.version > f.cp]
    return rng.choice(active if active and rng.random() < 0.7 else lines)


def _with_dv(ln: Line, **changes: Any) -> bytes:
    dv = {**ln.body["deletionVector"], **changes}
    dv = {k: v for k, v in dv.items() if v is not _DROP}
    return ml.dumps({ln.kind: {**ln.body, "deletionVector": dv}})


_DROP = object()


def _dv_read_expectations(
    f: Facts, ln: Line, *, key_changes: bool, listed: str, marker: str | None = None
) -> dict[str, str]:
    """Expectations for a DV descriptor that is well-formed but wrong for the file it points at.

    ``read`` refuses it when the latest state holds it: a descriptor whose unique id changed is never
    removed later; one whose id is the same is held only if its add was still active.
    """
    held = ln.version > f.cp and (key_changes or f.is_active(ln))
    expect = {
        "snapshot": listed if held else "unchanged",
        "read": "refused" if held else "unchanged",
        "history": "open" if listed == "open" else "unchanged",
        "events": listed,
    }
    if f.has_cdf:
        expect["changes"] = "refused" if f.change_feed_reads(ln) else "unchanged"
    return expect


@mutation("dv-descriptor-invalid", structural=True, applies=lambda f: bool(_dv_lines(f)), instances=2)
def _dv_invalid(f: Facts, rng: random.Random) -> Mutation:
    """A DV descriptor the protocol does not allow: storageType not u/i/p, sizeInBytes beyond an Int,
    negative size, cardinality or offset."""
    ln = _pick_dv(f, rng)
    variant = rng.choice(["storage-type", "size-beyond-int", "negative"])
    value: str | int
    if variant == "storage-type":
        key, value = "storageType", rng.choice(["x", "U", "", "uu", "P"])
    elif variant == "size-beyond-int":
        key, value = "sizeInBytes", rng.choice([2**31, 10**12, 2**40])
    else:
        key = rng.choice(
            ["sizeInBytes", "cardinality"] + (["offset"] if "offset" in ln.body["deletionVector"] else [])
        )
        value = -1
    return line_level(
        f, ln, replace_with(ln, _with_dv(ln, **{key: value})), f"{key}={value!r}", field_name=key
    )


@mutation("dv-descriptor-mismatch", structural=False, applies=lambda f: bool(_dv_lines(f)), instances=3)
def _dv_mismatch(f: Facts, rng: random.Random) -> Mutation:
    """A well-formed DV descriptor that does not match its bytes: sizeInBytes off, offset past the end
    of the file or absent (read as 0), Z85 that does not decode. Read-time errors: read refuses."""
    file_dvs = _dv_lines(f, "u", "p")
    variants = ["size"] + (["offset-past-end", "offset-absent"] if file_dvs else []) + ["z85"]
    variant = rng.choice(variants)
    ln = _pick_dv(f, rng, "u", "p") if variant.startswith("offset") else _pick_dv(f, rng)
    dv = ln.body["deletionVector"]
    if variant == "size":
        value = dv["sizeInBytes"] + rng.choice([1, 7, 1000, 54321])
        new, marker, key_changes, listed = (
            _with_dv(ln, sizeInBytes=value),
            f'"sizeInBytes":{value}',
            False,
            "faithful",
        )
    elif variant == "offset-past-end":
        path = ml.dv_file(f.src, dv)
        size = path.stat().st_size if path and path.exists() else 10_000
        value = size + rng.randrange(1, 100_000)
        new, marker, key_changes, listed = _with_dv(ln, offset=value), f'"offset":{value}', True, "faithful"
    elif variant == "offset-absent":
        new, marker, key_changes, listed = _with_dv(ln, offset=_DROP), None, True, "accepted"
    else:
        text = dv["pathOrInlineDv"]
        at = rng.randrange(max(0, len(text) - 20), len(text))
        bad = text[:at] + rng.choice(ml.NOT_Z85) + text[at + 1 :]
        if dv["storageType"] == "i" and rng.random() < 0.5:
            bad = text[:-1]  # not a multiple of 5 characters
        new, marker, key_changes, listed = _with_dv(ln, pathOrInlineDv=bad), None, True, "open"
    expect = _dv_read_expectations(f, ln, key_changes=key_changes, listed=listed)
    return Mutation(
        expect,
        replace_with(ln, new),
        f"v{ln.version}:l{ln.lineno}:{dv['storageType']}:{variant}",
        marker=marker,
    )


# --- deletion vectors: files ------------------------------------------------------------------


def _dv_refs(f: Facts) -> list[tuple[Line, Path, int, int]]:
    """(line, DV file relative to the root, offset, size) for every 'u' descriptor in the log."""
    out = []
    for ln in f.lines("add", "remove"):
        dv = ln.body.get("deletionVector")
        path = ml.dv_file(f.src, dv) if dv else None
        if path is not None and path.exists():
            out.append((ln, path.relative_to(f.src), int(dv.get("offset") or 0), int(dv["sizeInBytes"])))
    return out


def _file_expectations(f: Facts, affected: list[Line], names: tuple[str, ...]) -> Mutation:
    expect = everywhere(f, "unchanged")
    if any(ln.kind == "add" and f.is_active(ln) for ln in affected):
        expect["read"] = "refused"
    if f.has_cdf and any(f.change_feed_reads(ln) for ln in affected):
        expect["changes"] = "refused"
    return Mutation(expect, lambda root, env: None, "", names_any=names)


@mutation("dv-file-corrupt", structural=False, applies=lambda f: bool(_dv_refs(f)), instances=3)
def _dv_file_corrupt(f: Facts, rng: random.Random) -> Mutation:
    """A DV file missing, truncated, with a bad version byte, magic, size field, checksum or bitmap."""
    refs = _dv_refs(f)
    active = [r for r in refs if r[0].kind == "add" and f.is_active(r[0])]
    _, rel, offset, size = rng.choice(active if active and rng.random() < 0.8 else refs)
    variant = rng.choice(["missing", "truncated", "version", "size-field", "magic", "checksum", "bitmap"])
    cut = offset + 4 + size // 2
    same_file = [r for r in refs if r[1] == rel]
    if variant in ("missing", "version"):
        affected = [r[0] for r in same_file]
    elif variant == "truncated":
        affected = [r[0] for r in same_file if r[2] + 4 + r[3] + 4 > cut]
    else:
        affected = [r[0] for r in same_file if r[2] == offset]
    at = {
        "version": 0,
        "size-field": offset,
        "magic": offset + 4,
        "checksum": offset + 4 + size,
        "bitmap": offset + 8 + rng.randrange(max(1, size - 4)),
    }.get(variant, 0)

    def apply(root: Path, env: Env) -> None:
        path = root / rel
        if variant == "missing":
            path.unlink()
            return
        data = bytearray(path.read_bytes())
        if variant == "truncated":
            data = data[:cut]
        else:
            data[at] ^= 0x5A
        ml.write_keeping_mtime(path, bytes(data))

    names = (rel.name, *(Path(ml.decode_path(x.body["path"])).name for x in affected))
    m = _file_expectations(f, affected, names)
    m.apply, m.detail = apply, f"{rel.name[:28]}@{offset}:{variant}"
    return m


@mutation("dv-file-symlink-out", structural=True, applies=lambda f: bool(_dv_refs(f)))
def _dv_symlink(f: Facts, rng: random.Random) -> Mutation:
    """A DV file inside the root that is a symlink to a copy outside it: refused by its real path."""
    _, rel, _, _ = rng.choice(_dv_refs(f))
    affected = [r[0] for r in _dv_refs(f) if r[1] == rel]

    def apply(root: Path, env: Env) -> None:
        path = root / rel
        target = env.plant("outside/dv-link-target.bin", path.read_bytes())
        path.unlink()
        path.symlink_to(target)

    m = _file_expectations(f, affected, (rel.name, "dv-link-target"))
    m.apply, m.detail = apply, rel.name[:32]
    return m


DV_TRICKS = (
    "abs",
    "file-uri",
    "file-uri-host",
    "s3-other-bucket",
    "etc-passwd",
    "u-dotdot",
    "u-pct-slash",
    "u-pct-dots",
)


@mutation("dv-path-escape", structural=True, applies=lambda f: bool(_dv_lines(f, "u", "p")), instances=3)
def _dv_escape(f: Facts, rng: random.Random) -> Mutation:
    """A DV pointing outside the table root: an absolute 'p' path (file path, file:// URI, another host,
    another bucket, /etc/passwd) or a 'u' prefix climbing out (``../``, ``..%2F``, ``%2e%2e/``)."""
    ln = _pick_dv(f, rng, "u", "p")
    dv = ln.body["deletionVector"]
    trick = rng.choice(DV_TRICKS)
    encoded = dv["pathOrInlineDv"][-20:]
    dv_name = f"deletion_vector_{uuid.UUID(bytes=ml.z85_decode(encoded))}.bin"
    source = ml.dv_file(f.src, dv)
    marker = {
        "abs": "canary-dv.bin",
        "file-uri": "canary-dv.bin",
        "file-uri-host": "other-host",
        "s3-other-bucket": "other-bucket",
        "etc-passwd": "/etc/passwd",
        "u-dotdot": "../",
        "u-pct-slash": "..%2F",
        "u-pct-dots": "%2e%2e/",
    }[trick]

    def apply(root: Path, env: Env) -> None:
        real = source.read_bytes() if source and source.exists() else b"\x01" + env.canary.encode()
        canary = env.plant("canary-dv.bin", real)
        env.plant("other-bucket/canary-dv.bin", real)
        env.plant(dv_name, real)
        if trick.startswith("u-"):
            prefix = {"u-dotdot": "../", "u-pct-slash": "..%2F", "u-pct-dots": "%2e%2e/"}[trick]
            new = _with_dv(ln, storageType="u", pathOrInlineDv=prefix + encoded)
        else:
            target = {
                "abs": str(canary),
                "file-uri": f"file://{canary}",
                "file-uri-host": f"file://other-host{canary}",
                "s3-other-bucket": "s3://other-bucket/canary-dv.bin",
                "etc-passwd": "/etc/passwd",
            }[trick]
            new = _with_dv(ln, storageType="p", pathOrInlineDv=target)
        ml.replace_line(root, ln.version, ln.lineno, new)

    expect = _dv_read_expectations(f, ln, key_changes=True, listed="faithful")
    names = ("canary-dv", "other-host", "other-bucket", "passwd", "deletion_vector", "..")
    return Mutation(expect, apply, f"v{ln.version}:l{ln.lineno}:{trick}", marker=marker, names_any=names)
