"""Mutation classes of whole commits and of the log folder: emptied and missing commits, harmless
whitespace, unknown fields and actions, free-form commitInfo, statistics, partition values, a new
commit with a protocol or metadata nobody can read, in-commit timestamps, stray files, far-future
commits.
"""

from __future__ import annotations

import json
import random
import shutil
import uuid
from pathlib import Path
from typing import Any

from mutation import logs as ml
from mutation.core import (
    Env,
    Mutation,
    at_commit,
    everywhere,
    line_level,
    mutation,
    replace_with,
)
from mutation.logs import Facts, Line

# --- whole commits ----------------------------------------------------------------------------


@mutation("blank-lines", structural=False)
def _blank_lines(f: Facts, rng: random.Random) -> Mutation:
    """Blank or whitespace-only lines between actions, CRLF endings, no final newline: JSON whitespace."""
    v = rng.choice(sorted(f.commits))
    style = rng.choice(["blank", "spaces", "crlf", "no-final-newline", "extra-final-newlines"])
    at = rng.randrange(1, len(f.commits[v]) + 1)

    def apply(root: Path, env: Env) -> None:
        path = ml.commit_path(root, v)
        lines = path.read_bytes().rstrip(b"\n").split(b"\n")
        if style in ("blank", "spaces"):
            lines.insert(min(at, len(lines)), b"" if style == "blank" else b" \t  ")
            data = b"\n".join(lines) + b"\n"
        elif style == "crlf":
            data = b"\r\n".join(lines) + b"\r\n"
        elif style == "no-final-newline":
            data = b"\n".join(lines)
        else:
            data = b"\n".join(lines) + b"\n\n\n"
        ml.write_keeping_mtime(path, data)

    return Mutation(everywhere(f, "unchanged"), apply, f"v{v}:{style}")


@mutation("commit-emptied", structural=True, instances=2)
def _commit_emptied(f: Facts, rng: random.Random) -> Mutation:
    """A commit file truncated to 0 bytes, or holding only whitespace: no action, not a commit."""
    v = rng.choice(sorted(f.commits))
    content = rng.choice([b"", b"\n", b"  \n\t\n", b"\r\n"])

    def apply(root: Path, env: Env) -> None:
        ml.write_keeping_mtime(ml.commit_path(root, v), content)

    return Mutation(at_commit(f, v, kind="syntax"), apply, f"v{v}:{content!r}", file=ml.commit_name(v))


@mutation("commit-deleted", structural=True, applies=lambda f: f.latest >= 2, instances=2)
def _commit_deleted(f: Facts, rng: random.Random) -> Mutation:
    """A commit missing between the first and the latest one (a gap), covered by a checkpoint or not."""
    v = rng.randrange(1, f.latest)

    def apply(root: Path, env: Env) -> None:
        ml.commit_path(root, v).unlink()

    names = (ml.commit_name(v), f"version={v}", f"commit {v}", f"version {v}")
    return Mutation(at_commit(f, v, kind="syntax"), apply, f"v{v}", names_any=names)


@mutation("unknown-field", structural=False)
def _unknown_field(f: Facts, rng: random.Random) -> Mutation:
    """A field the protocol does not define, in an add/remove/cdc/metaData/protocol: ignored by readers."""
    ln = rng.choice(f.lines("add", "remove", "cdc", "metaData", "protocol"))
    value = rng.choice([1, "x", {"nested": [1, 2]}, None, [True]])
    body = {**ln.body, "mutationFutureField": value}
    expect = at_commit(f, ln.version, hit="accepted", miss="unchanged")
    expect.update({"read": "unchanged", "history": "unchanged", "events": "accepted"})
    if "changes" in expect:
        expect["changes"] = "unchanged"
    return Mutation(
        expect, replace_with(ln, ml.dumps({ln.kind: body})), f"v{ln.version}:l{ln.lineno}:{ln.kind}"
    )


@mutation("unknown-action", structural=False)
def _unknown_action(f: Facts, rng: random.Random) -> Mutation:
    """An action type the protocol does not define, on its own line: the table state is unchanged."""
    ln = rng.choice(f.lines())
    extra = ml.dumps({"mutationFutureAction": {"x": rng.randrange(100), "y": "z"}})
    expect = everywhere(f, "unchanged")
    expect.update({"history": "accepted", "events": "accepted"})
    return Mutation(expect, replace_with(ln, [ln.raw, extra]), f"v{ln.version}:after-l{ln.lineno}")


def _commit_info_lines(f: Facts) -> list[Line]:
    return f.lines("commitInfo")


@mutation("commitinfo-free-form", structural=False, applies=lambda f: bool(_commit_info_lines(f)))
def _commitinfo_free_form(f: Facts, rng: random.Random) -> Mutation:
    """commitInfo is free-form: any JSON in an extra key must pass through to history and events."""
    ln = rng.choice(_commit_info_lines(f))
    marker = f"mutation-marker-{rng.randrange(10**6):06d}"
    value = rng.choice(
        [
            {"note": marker, "n": [1, 2.5, -0.0, 1e308], "deep": {"a": {"b": [None, True]}}},
            {"note": marker, "emoji": "\U0001f600", "empty": "", "": "empty key"},
            [marker, {"k": "v"}, [], {}],
        ]
    )
    body = {**ln.body, "mutationInfo": value}
    expect = everywhere(f, "unchanged")
    expect.update({"history": "faithful", "events": "faithful"})
    return Mutation(
        expect, replace_with(ln, ml.dumps({"commitInfo": body})), f"v{ln.version}:l{ln.lineno}", marker=marker
    )


@mutation("commitinfo-huge-int", structural=False, applies=lambda f: bool(_commit_info_lines(f)))
def _commitinfo_huge_int(f: Facts, rng: random.Random) -> Mutation:
    """An integer beyond 64 bits in a free-form commitInfo key is valid JSON: printed, not refused."""
    ln = rng.choice(_commit_info_lines(f))
    value = rng.choice([10**30, 2**64 + rng.randrange(1000), -(10**25) - rng.randrange(1000)])
    body = {**ln.body, "mutationMetric": value}
    expect = everywhere(f, "unchanged")
    expect.update({"history": "faithful", "events": "faithful"})
    return Mutation(
        expect,
        replace_with(ln, ml.dumps({"commitInfo": body})),
        f"v{ln.version}:l{ln.lineno}:mutationMetric={value}",
        marker=str(value),
    )


@mutation("stats-garbage", structural=False, applies=lambda f: bool(f.lines("add")), instances=2)
def _stats_garbage(f: Facts, rng: random.Random) -> Mutation:
    """add.stats is a hint: a string that is not valid statistics never changes what is read."""
    ln = rng.choice(f.lines("add"))
    token = f"mutstats{rng.randrange(10**6):06d}"
    stats = rng.choice(
        [
            f"not json {{{token}",
            json.dumps({"numRecords": token}),
            json.dumps({"numRecords": -5, token: 1}),
            '{"numRecords":NaN,"' + token + '":1}',
            '{"x":' * 20_000 + f'"{token}"' + "}" * 20_000,
        ]
    )
    body = {**ln.body, "stats": stats}
    listed = f.is_active(ln) and ln.version > f.cp
    expect = everywhere(f, "unchanged")
    expect.update({"snapshot": "faithful" if listed else "unchanged", "events": "faithful"})
    return Mutation(
        expect,
        replace_with(ln, ml.dumps({"add": body})),
        f"v{ln.version}:l{ln.lineno}:{stats[:12]}",
        marker=token,
    )


# --- partition values -------------------------------------------------------------------------


def _partitioned_files(f: Facts) -> list[Line]:
    return [ln for ln in f.lines("add", "cdc") if ln.body.get("partitionValues")]


def _null_partitioned_files(f: Facts) -> list[Line]:
    return [ln for ln in _partitioned_files(f) if None in ln.body["partitionValues"].values()]


@mutation(
    "partition-null-left-out",
    structural=True,
    applies=lambda f: bool(_null_partitioned_files(f)),
    instances=2,
)
def _partition_null_left_out(f: Facts, rng: random.Random) -> Mutation:
    """partitionValues without a column whose value is null, as delta-spark writes a remove after
    ``DELETE ... WHERE p IS NULL``: PROTOCOL.md asks no key per column, and a key a map lacks is a
    null value (delta-spark reads it so). Every reader answers as for the unmutated table;
    ``snapshot`` and ``events`` print the map as the log has it."""
    ln = rng.choice(_null_partitioned_files(f))
    col = rng.choice(sorted(k for k, v in ln.body["partitionValues"].items() if v is None))
    values = {k: v for k, v in ln.body["partitionValues"].items() if k != col}
    body = {**ln.body, "partitionValues": values}
    m = line_level(f, ln, replace_with(ln, ml.dumps({ln.kind: body})), f"{ln.kind}:-{col}", field_name=col)
    m.expect = at_commit(f, ln.version, hit="unchanged", kind=ln.kind)
    for command in ("snapshot", "events"):
        if command in m.expect:
            m.expect[command] = "faithful"
    m.marker = json.dumps(ln.body["path"])  # the file is listed, its map as the log has it
    return m


@mutation("partition-value-wrong-type", structural=True, applies=lambda f: bool(_partitioned_files(f)))
def _partition_wrong_type(f: Facts, rng: random.Random) -> Mutation:
    """A partition value that is not a string or null."""
    ln = rng.choice(_partitioned_files(f))
    col = rng.choice(sorted(ln.body["partitionValues"]))
    value = rng.choice([5, True, [], {}, 1.5])
    body = {**ln.body, "partitionValues": {**ln.body["partitionValues"], col: value}}
    return line_level(
        f, ln, replace_with(ln, ml.dumps({ln.kind: body})), f"{ln.kind}:{col}={value!r}", field_name=col
    )


UNPARSEABLE = {
    "integer": ["12x", "1.5", "9" * 30],
    "long": ["12x", "9" * 30],
    "short": ["70000", "x"],
    "byte": ["300", "x"],
    "date": ["2021-13-45", "yesterday"],
    "timestamp": ["not-a-time", "2021-02-30 25:61:00"],
    "timestamp_ntz": ["not-a-time"],
    "boolean": ["maybe", "yes"],
    "double": ["1.2.3", "one"],
    "float": ["1.2.3", "one"],
}


def _typed_partition_adds(f: Facts) -> list[tuple[Line, str]]:
    return [
        (ln, col)
        for ln in f.lines("add")
        for col, v in (ln.body.get("partitionValues") or {}).items()
        if v is not None
        and (
            f.partition_types.get(col, "").split("(")[0] in UNPARSEABLE
            or "decimal" in f.partition_types.get(col, "")
        )
    ]


@mutation("partition-value-unparseable", structural=False, applies=lambda f: bool(_typed_partition_adds(f)))
def _partition_unparseable(f: Facts, rng: random.Random) -> Mutation:
    """A partition value string that does not parse as its column's type: reading it is refused."""
    ln, col = rng.choice(_typed_partition_adds(f))
    typ = f.partition_types[col]
    value = rng.choice(UNPARSEABLE.get(typ, ["1.2.3", "abc"]))
    body = {**ln.body, "partitionValues": {**ln.body["partitionValues"], col: value}}
    expect = {"snapshot": "open", "read": "unchanged", "history": "open", "events": "open"}
    if f.is_active(ln) and ln.version > f.cp:
        expect["read"] = "refused"
    if f.has_cdf:
        expect["changes"] = "refused" if f.change_feed_reads(ln) else "unchanged"
    return Mutation(
        expect,
        replace_with(ln, ml.dumps({"add": body})),
        f"v{ln.version}:{col}:{typ}={value[:8]}",
        names_any=(col,),
    )


# --- a new commit with a protocol or metadata nobody can read -------------------------------------


def _commit_info_for(f: Facts, version: int) -> dict[str, Any]:
    info: dict[str, Any] = {"timestamp": ml.log_mtime_ms(version), "operation": "MUTATION"}
    if f.ict_from is not None:
        last = [ln.body.get("inCommitTimestamp") for ln in f.commits[f.latest] if ln.kind == "commitInfo"]
        info["inCommitTimestamp"] = (last[0] if last and last[0] else ml.log_mtime_ms(version)) + 60_000
    return {"commitInfo": info}


@mutation("protocol-unsupported", structural=True, instances=2)
def _protocol_unsupported(f: Facts, rng: random.Random) -> Mutation:
    """A new commit whose protocol needs what deltamirror lacks: minReaderVersion 5 or 99, an unknown
    reader feature, catalogManaged. Every command refuses it, snapshot and history included."""
    reader = list(f.protocol.get("readerFeatures") or [])
    writer = list(f.protocol.get("writerFeatures") or [])
    variant = rng.choice(["reader-5", "reader-99", "unknown-reader-feature", "catalog-managed"])
    names: tuple[str, ...] = ()
    if variant == "reader-5":
        proto: dict[str, Any] = {"minReaderVersion": 5, "minWriterVersion": 5}
    elif variant == "reader-99":
        proto = {"minReaderVersion": 99, "minWriterVersion": 7, "readerFeatures": [], "writerFeatures": []}
    elif variant == "unknown-reader-feature":
        feature = f"mutationFeature{rng.randrange(1000)}"
        proto = {"minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": [*reader, feature]}
        proto["writerFeatures"] = [*writer, feature]
        names = (feature,)
    else:
        proto = {"minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": [*reader, "catalogManaged"]}
        proto["writerFeatures"] = [*writer, "catalogManaged", "inCommitTimestamp"]
        names = ("catalogManaged",)
    v = f.latest + 1

    def apply(root: Path, env: Env) -> None:
        ml.append_commit(root, v, [_commit_info_for(f, v), {"protocol": proto}])

    return Mutation(everywhere(f, "refused"), apply, variant, names_any=names)


def _latest_metadata(f: Facts) -> dict[str, Any]:
    return [ln.body for ln in f.lines("metaData")][-1]


def _deep_schema(depth: int) -> str:
    head = '{"type":"struct","fields":[{"name":"a","nullable":true,"metadata":{},"type":'
    return head * depth + '"integer"' + "}]}" * depth


@mutation("metadata-invalid", structural=True, instances=2)
def _metadata_invalid(f: Facts, rng: random.Random) -> Mutation:
    """A new commit whose metaData cannot describe a table: a schemaString that is not JSON, nested
    5,000 deep, with an unknown type, not a struct; a partition column the schema lacks; two
    columns of one name (exactly, or differing in case only)."""
    meta = dict(_latest_metadata(f))
    variant = rng.choice(
        ["not-json", "deep", "unknown-type", "not-struct", "partition-not-in-schema", "names-clash"]
    )
    if variant == "not-json":
        meta["schemaString"] = meta["schemaString"][: rng.randrange(1, len(meta["schemaString"]) - 1)]
    elif variant == "deep":
        meta["schemaString"] = _deep_schema(rng.choice([5_000, 20_000]))
    elif variant == "unknown-type":
        schema = json.loads(meta["schemaString"])
        rng.choice(schema["fields"])["type"] = "mutationType"
        meta["schemaString"] = json.dumps(schema)
    elif variant == "names-clash":
        schema = json.loads(meta["schemaString"])
        twin = dict(rng.choice(schema["fields"]))
        twin["name"] = rng.choice([twin["name"], twin["name"].swapcase(), twin["name"].upper()])
        schema["fields"].insert(rng.randrange(len(schema["fields"]) + 1), twin)
        meta["schemaString"] = json.dumps(schema)
    elif variant == "not-struct":
        meta["schemaString"] = rng.choice(['"integer"', "[]", '{"type":"struct","fields":7}'])
    else:
        meta["partitionColumns"] = [*meta["partitionColumns"], "mutation_no_such_column"]
    v = f.latest + 1

    def apply(root: Path, env: Env) -> None:
        ml.append_commit(root, v, [_commit_info_for(f, v), {"metaData": meta}])

    return Mutation(everywhere(f, "refused"), apply, variant, file=ml.commit_name(v))


@mutation("ict-invalid", structural=True, applies=lambda f: f.ict_from is not None, instances=2)
def _ict_invalid(f: Facts, rng: random.Random) -> Mutation:
    """With in-commit timestamps enabled, a commitInfo whose inCommitTimestamp is missing or mistyped."""
    assert f.ict_from is not None
    ln = rng.choice([x for x in f.lines("commitInfo") if x.version >= f.ict_from])
    variant = rng.choice(["missing", "null", "string", "float"])
    if variant == "missing":
        body = {k: v for k, v in ln.body.items() if k != "inCommitTimestamp"}
    else:
        body = {**ln.body, "inCommitTimestamp": {"null": None, "string": "x", "float": 1.5}[variant]}
    return line_level(
        f, ln, replace_with(ln, ml.dumps({"commitInfo": body})), variant, field_name="inCommitTimestamp"
    )


# --- other files in the log -------------------------------------------------------------------


@mutation("stray-log-files", structural=False)
def _stray_log_files(f: Facts, rng: random.Random) -> Mutation:
    """Files and folders in _delta_log that are not log files by the protocol's names: ignored."""
    v = f.latest + rng.randrange(1, 50)
    variant = rng.choice(["tmp", "hidden", "uppercase", "19-digits", "21-digits", "folder", "staged"])
    name = {
        "tmp": f"{f.latest:020d}.json.tmp",
        "hidden": f".{v:020d}.json",
        "uppercase": f"{v:020d}.JSON",
        "19-digits": f"{v:019d}.json",
        "21-digits": f"{v:021d}.json",
        "folder": f"{v:020d}.json",
        "staged": f"_staged_commits/{v:020d}.{uuid.UUID(int=rng.getrandbits(128))}.json",
    }[variant]

    def apply(root: Path, env: Env) -> None:
        path = root / "_delta_log" / name
        if variant == "folder":
            path.mkdir()
            (path / "x").write_bytes(b"not a commit")
            return
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(b'{"add":null}\nnot json\n')

    return Mutation(everywhere(f, "unchanged"), apply, variant)


@mutation("crc-garbage", structural=False)
def _crc_garbage(f: Facts, rng: random.Random) -> Mutation:
    """A version checksum file that is garbage: readers MAY validate with it, and must work without."""
    v = rng.choice(sorted(f.commits))
    content = rng.choice([b"{", b'{"tableSizeBytes":NaN}', b"\xff", b"[]"])

    def apply(root: Path, env: Env) -> None:
        (root / "_delta_log" / f"{v:020d}.crc").write_bytes(content)

    return Mutation(everywhere(f, "open"), apply, f"v{v}:{content!r}")


# --- the log folder and versions beyond the latest ----------------------------------------------


@mutation("commit-beyond-gap", structural=True)
def _commit_beyond_gap(f: Facts, rng: random.Random) -> Mutation:
    """A valid commit far after the latest one (L+2, L+1000, the largest Long): the versions between
    are missing, so the latest version cannot be rebuilt and the history has a gap."""
    v = rng.choice([f.latest + 2, f.latest + 1000, 2**63 - 1])

    def apply(root: Path, env: Env) -> None:
        path = root / "_delta_log" / f"{v:020d}.json"
        path.write_bytes(ml.dumps(_commit_info_for(f, f.latest + 1)) + b"\n")
        ml.set_mtime(path, ml.log_mtime_ms(f.latest + 1))

    missing = f.latest + 1
    names = (ml.commit_name(missing), f"version={missing}", str(missing), ml.commit_name(v), str(v))
    return Mutation(everywhere(f, "refused"), apply, f"v{v}", names_any=names)


@mutation("log-folder-broken", structural=True)
def _log_folder_broken(f: Facts, rng: random.Random) -> Mutation:
    """_delta_log replaced by a file, emptied, or holding only files that are not log files."""
    variant = rng.choice(["file", "empty", "only-strays"])

    def apply(root: Path, env: Env) -> None:
        log = root / "_delta_log"
        shutil.rmtree(log)
        if variant == "file":
            log.write_bytes(b'{"commitInfo":{}}\n')
            return
        log.mkdir()
        if variant == "only-strays":
            (log / "_last_checkpoint").write_bytes(ml.dumps({"version": f.latest}))
            (log / f"{f.latest:020d}.json.tmp").write_bytes(b"{}")

    return Mutation(everywhere(f, "refused"), apply, variant, names_any=("_delta_log", "Delta table", "log"))
