"""The classes of hostile records of the forged-record suite, and what each consumer must make of them.

A case appends records to a copy of a real mirror (:mod:`support.forge`): forged versions, paths,
locations, schema versions, fragments, garbage, truncated and oversize records, and floods. Each
class says, per consumer, which outcomes are right:

- ``refused``: the consumer stops with one line naming topic, partition and offset (exit 2), after
  delivering every version before the record; nothing of it applied;
- ``skipped``: read and passed over as the contract says (a kind a newer watcher may write);
  outputs as without it;
- ``accepted``: a record the contract allows (an action type a newer Delta may add), applied;
- ``unchanged``: the consumer never had to read it (the change feed reads only the versions the
  commits topic announces), outputs as without it.

Any other outcome (exit 0 with the forged record applied, a traceback, a hang, a second line...)
is a failure.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from support.forge import Base, Rec, action_rec, add_action, commits_rec, event, fragments, padded, summary

#: the consumers every case runs through (spark only for the cases that name it)
CONSUMERS = ("consume-snapshot", "invalidate", "mirror-feed", "spark")
Build = Callable[[Base], tuple[list[Rec], list[Rec]]]


@dataclass
class Case:
    cls: str
    name: str
    build: Build
    #: acceptable outcomes per consumer (a consumer not named does not run the case)
    expect: dict[str, frozenset[str]]
    #: the versions a consumer delivers beyond the base's when the case is accepted
    adds_versions: int = 0
    size: str = "ci"
    tags: set[str] = field(default_factory=set)

    @property
    def id(self) -> str:
        return f"{self.cls}/{self.name}"


REFUSED = frozenset({"refused"})
REFUSED_OR_UNREAD = frozenset({"refused", "unchanged"})
SKIPPED = frozenset({"skipped"})


def _expect(
    feed: frozenset[str] = REFUSED, *, spark: frozenset[str] | None = None
) -> dict[str, frozenset[str]]:
    out = {"consume-snapshot": REFUSED, "invalidate": REFUSED, "mirror-feed": feed}
    if spark is not None:
        out["spark"] = spark
    return out


def _next_version(base: Base, ev: dict[str, Any], *, announce: bool = True) -> tuple[list[Rec], list[Rec]]:
    """A forged next version: its action, and (``announce``) a consistent commit summary, so that
    a change feed plans the version and reads the record."""
    commits = [commits_rec(summary(base))] if announce else []
    return [action_rec(ev)], commits


def _action(path: str | None = None, **fields: Any) -> Build:
    def build(base: Base) -> tuple[list[Rec], list[Rec]]:
        body = add_action(path if path is not None else "part-00000-forged.snappy.parquet", **fields)
        return _next_version(base, event(base, action=body))

    return build


def _typed(action_type: str, body: Any) -> Build:
    def build(base: Base) -> tuple[list[Rec], list[Rec]]:
        return _next_version(base, event(base, type=action_type, action=body))

    return build


def _envelope(**overrides: Any) -> Build:
    def build(base: Base) -> tuple[list[Rec], list[Rec]]:
        return _next_version(base, event(base, **overrides))

    return build


def _raw(value: bytes | Callable[[Base], bytes], *, on: str = "actions", kind: str | None = None) -> Build:
    def build(base: Base) -> tuple[list[Rec], list[Rec]]:
        raw = value(base) if callable(value) else value
        rec = Rec(raw, base.table_id.encode(), [("kind", kind.encode())] if kind else [])
        return ([rec], []) if on == "actions" else ([], [rec])

    return build


def _commits(record: Callable[[Base], dict[str, Any]], kind: str | None = None) -> Build:
    def build(base: Base) -> tuple[list[Rec], list[Rec]]:
        return [], [commits_rec(record(base), kind=kind)]

    return build


def _frags(parts: Callable[[Base], list[Rec]], *, on: str = "actions") -> Build:
    def build(base: Base) -> tuple[list[Rec], list[Rec]]:
        recs = parts(base)
        return (recs, []) if on == "actions" else ([], recs)

    return build


def _replaced(base: Base, **overrides: Any) -> dict[str, Any]:
    return {
        "kind": "tableReplaced",
        "schemaVersion": 1,
        "tableUri": base.uri,
        "tableId": "forged-new-id",
        "previousTableId": base.table_id,
        "previousVersion": base.last_version,
        "reason": "forged",
        "detectedAt": 1,
        **overrides,
    }


def _dv(storage_type: str, path: str) -> dict[str, Any]:
    return {
        "storageType": storage_type,
        "pathOrInlineDv": path,
        "offset": 1,
        "sizeInBytes": 36,
        "cardinality": 2,
    }


_Z85_UUID = "^-aqEH.-t@S}K{vb[*k^"  # 20 characters: a UUID in Z85


def _good_event_cut(base: Base, at: float) -> bytes:
    value = json.dumps(event(base), separators=(",", ":")).encode()
    return value[: int(len(value) * at)]


def generate(size: str, seed: int = 11) -> list[Case]:
    """Every case of ``size`` (``ci``: a quick subset; ``full``: the whole campaign). ``seed``
    varies the values within each class (lengths, numbers, where a record is cut)."""
    rnd = random.Random(seed)
    cases: list[Case] = []

    def add(cls: str, name: str, build: Build, expect: dict[str, frozenset[str]], **kw: Any) -> None:
        cases.append(Case(cls, name, build, expect, **kw))

    # --- paths --------------------------------------------------------------------------------
    for name, path in [
        ("etc-passwd", "/etc/passwd"),
        ("climbing", "../../../../etc/passwd"),
        ("file-uri", "file:///etc/passwd"),
        ("encoded-climb", "%2E%2E/%2E%2E/%2E%2E/etc/passwd"),
        ("other-store", "s3://other-bucket/data.parquet"),
        ("other-host", "file://host/etc/passwd"),
        ("nul", "a\x00/../../etc/passwd"),
        ("sibling", f"../{'x' * rnd.randint(1, 8)}/part.parquet"),
    ]:
        spark = name == "etc-passwd"
        add(
            "path",
            name,
            _action(path),
            _expect(spark=REFUSED if spark else None),
            tags={"spark"} if spark else set(),
        )
    add("path", "remove-outside", _typed("remove", {"path": "/etc/shadow", "dataChange": True}), _expect())
    add(
        "path",
        "cdc-outside",
        _typed("cdc", {"path": "../../etc/passwd", "partitionValues": {}, "size": 1, "dataChange": False}),
        _expect(),
    )
    add("path", "dv-absolute", _action(deletionVector=_dv("p", "file:///etc/passwd")), _expect())
    add("path", "dv-relative-climb", _action(deletionVector=_dv("u", "../../etc" + _Z85_UUID)), _expect())
    add(
        "path",
        "sidecar-outside",
        _typed("sidecar", {"path": "../../../etc/passwd", "sizeInBytes": 1, "modificationTime": 0}),
        _expect(),
    )
    # --- locations ----------------------------------------------------------------------------
    for name, uri in [
        ("moved", "file:///etc"),
        ("moved-under", "{uri}/nested"),
        ("climbing", "{uri}/../../etc"),
        ("relative", "etc"),
        ("trailing-slash", "{uri}/"),
        ("password", "s3://key:secret@bucket/t"),
        ("unknown-store", "nope://bucket/t"),
    ]:
        add(
            "uri",
            name,
            lambda b, u=uri: _next_version(
                b, event(b, tableUri=u.format(uri=b.uri), action=add_action("passwd"))
            ),
            _expect(),
        )
    add(
        "uri",
        "replaced-elsewhere",
        _commits(lambda b: _replaced(b, tableUri="file:///etc")),
        _expect(REFUSED_OR_UNREAD),
        tags={"cross-topic"},
    )
    add(
        "uri",
        "dropped-elsewhere",
        _commits(
            lambda b: {
                "kind": "tableDropped",
                "schemaVersion": 1,
                "tableUri": "file:///etc",
                "tableId": b.table_id,
                "lastVersion": b.last_version,
                "reason": "forged",
                "detectedAt": 1,
            }
        ),
        _expect(REFUSED_OR_UNREAD),
        tags={"cross-topic"},
    )
    add(
        "uri",
        "summary-moved",
        _commits(lambda b: summary(b, tableUri="file:///etc")),
        # read before or after the table's events (Kafka orders nothing across topics): refused,
        # or read for nothing (a summary changes no state)
        {
            "consume-snapshot": REFUSED_OR_UNREAD,
            "invalidate": REFUSED_OR_UNREAD,
            "mirror-feed": REFUSED_OR_UNREAD,
        },
        tags={"cross-topic"},
    )
    # --- schema versions ----------------------------------------------------------------------
    for value in (999, 2, 0, -1, "1", None, 2**64):
        add("schema-version", f"actions-{value}", _envelope(schemaVersion=value), _expect())
    add(
        "schema-version",
        "summary-999",
        _commits(lambda b: summary(b, schemaVersion=999)),
        _expect(spark=REFUSED),
        tags={"spark"},
    )
    add("schema-version", "replaced-999", _commits(lambda b: _replaced(b, schemaVersion=999)), _expect())
    # --- forged versions ----------------------------------------------------------------------
    gap = rnd.randint(2, 50)
    add(
        "version",
        "gap",
        lambda b: _next_version(b, event(b, version=b.last_version + gap)),
        _expect(REFUSED_OR_UNREAD),
    )
    add("version", "index-at-count", _envelope(index=1, count=1), _expect())
    add("version", "index-without-start", _envelope(index=1, count=3), _expect())
    add("version", "count-zero", _envelope(count=0), _expect())
    add("version", "count-2^31", _envelope(count=2**31), _expect())
    add("version", "negative", _envelope(version=-1), _expect())
    add("version", "beyond-64-bits", _envelope(version=2**64 + rnd.randint(0, 9)), _expect())
    add("version", "float", _envelope(version=1.5), _expect())
    add("version", "timestamp-beyond-64-bits", _envelope(commitTimestamp=10**30), _expect())
    add(
        "version",
        "snapshot-without-end",
        _envelope(snapshot=True, count=1),
        _expect(REFUSED_OR_UNREAD),
    )
    add(
        "version",
        "key-of-another-table",
        lambda b: ([action_rec(event(b), key=b"another-table")], [commits_rec(summary(b))]),
        _expect(),
    )
    add(
        "version",
        "id-under-the-tables-key",
        lambda b: (
            [action_rec(event(b, tableId="forged-id"), key=b.table_id.encode())],
            [commits_rec(summary(b))],
        ),
        _expect(),
    )
    # --- core's rules for the action ----------------------------------------------------------
    for name, fields in [
        ("size-negative", {"size": -1}),
        ("size-text", {"size": "1"}),
        ("size-float", {"size": 1.5}),
        ("size-huge", {"size": 2**64}),
        ("datachange-number", {"dataChange": 1}),
        ("partition-value-number", {"partitionValues": {"p": 1}}),
        ("stats-object", {"stats": {"numRecords": 1}}),
        ("dv-storage-type", {"deletionVector": _dv("x", "abc")}),
        ("dv-size-negative", {"deletionVector": {**_dv("i", "abc"), "sizeInBytes": -4}}),
    ]:
        add("action", name, _action(**fields), _expect())
    add("action", "empty-path", _action(""), _expect())
    add("action", "path-null", _typed("add", {**add_action("x"), "path": None}), _expect())
    add(
        "action",
        "missing-size",
        _typed("add", {k: v for k, v in add_action("x").items() if k != "size"}),
        _expect(),
    )
    add("action", "not-an-object", _typed("add", ["a", "b"]), _expect())
    add(
        "action",
        "protocol-zero",
        _typed("protocol", {"minReaderVersion": 0, "minWriterVersion": 2}),
        _expect(),
    )
    add("action", "metadata-without-id", _typed("metaData", {"format": {"provider": "parquet"}}), _expect())
    add(
        "action",
        "nan-in-unknown",
        _raw(
            lambda b: json.dumps(event(b, type="x", action={"v": 1})).encode().replace(b'"v": 1', b'"v": NaN')
        ),
        _expect(REFUSED_OR_UNREAD),
    )
    add(
        "action",
        "unknown-type",
        _typed("aNewAction", {"anything": [1, "two", None]}),
        {
            "consume-snapshot": frozenset({"accepted"}),
            "invalidate": frozenset({"accepted"}),
            "mirror-feed": frozenset({"accepted"}),
        },
        adds_versions=1,
    )
    # --- bounds -------------------------------------------------------------------------------
    add("oversize", "table-id", _envelope(tableId="i" * rnd.randint(1025, 20_000)), _expect())
    add("oversize", "table-uri", _envelope(tableUri="file:///" + "u" * rnd.randint(8200, 60_000)), _expect())
    add("oversize", "type", _envelope(type="t" * rnd.randint(257, 5000)), _expect())
    add(
        "oversize",
        "reason",
        _commits(lambda b: _replaced(b, reason="r" * 70_000)),
        _expect(REFUSED_OR_UNREAD),
    )
    add(
        "oversize",
        "partitions-listed",
        _commits(lambda b: summary(b, partitionsTouched=[{"p": str(i)} for i in range(1001)])),
        _expect(),
    )
    add(
        "oversize",
        "deep-nesting",
        _typed("aNewAction", {"x": json.loads("[" * 300 + "]" * 300)}),
        _expect(REFUSED_OR_UNREAD),
    )
    # --- garbage and truncation ---------------------------------------------------------------
    for name, raw in [
        ("not-json", b"\xff\xfe garbage"),
        ("empty", b""),
        ("list", b"[1,2,3]"),
        ("null", b"null"),
        ("byte-order-mark", lambda b: b"\xef\xbb\xbf" + json.dumps(event(b)).encode()),
        (
            "lone-surrogate",
            lambda b: (
                json.dumps(event(b, action=add_action("\\ud800"))).encode().replace(b"\\\\ud800", b"\\ud800")
            ),
        ),
        ("deep", b"[" * 100_000 + b"]" * 100_000),
    ]:
        add("garbage", name, _raw(raw), _expect(REFUSED_OR_UNREAD))
    add("garbage", "commits-not-json", _raw(b"{{{", on="commits", kind="commit"), _expect())
    add("garbage", "commits-no-header", _raw(b"\x00\x01", on="commits"), _expect())
    for at in (0.1, 0.5, round(rnd.uniform(0.6, 0.99), 2)):
        add(
            "truncation",
            f"cut-at-{at}",
            _raw(lambda b, at=at: _good_event_cut(b, at)),
            _expect(REFUSED_OR_UNREAD),
        )
    # --- kinds a newer watcher may write ------------------------------------------------------
    add(
        "unknown-kind",
        "with-header",
        _commits(lambda b: {"kind": "aNewKind", "schemaVersion": 1, "anything": True}),
        {"consume-snapshot": SKIPPED, "invalidate": SKIPPED, "mirror-feed": SKIPPED, "spark": SKIPPED},
        tags={"spark"},
    )
    add(
        "unknown-kind",
        "without-header",
        _commits(lambda b: {"kind": "aNewKind", "schemaVersion": 1}, kind=""),
        {"consume-snapshot": SKIPPED, "invalidate": SKIPPED, "mirror-feed": SKIPPED},
    )
    # --- fragments ----------------------------------------------------------------------------
    total = rnd.choice([999_999, 70_000, 10**9 - 1])
    add(
        "fragments",
        f"too-many-{total}",
        _frags(lambda b, t=total: [fragments(b"x" * 1024, i, t, key=b.table_id.encode()) for i in range(3)]),
        _expect(REFUSED_OR_UNREAD),
    )
    add(
        "fragments",
        "cut-short-at-end",
        _frags(
            lambda b: [fragments(padded(json.dumps(event(b)).encode()[:30]), 0, 2, key=b.table_id.encode())]
        ),
        _expect(REFUSED_OR_UNREAD),
    )
    add(
        "fragments",
        "out-of-order",
        _frags(
            lambda b: [fragments(padded(b"{"), 0, 3), fragments(padded(b"}"), 2, 3), action_rec(event(b))]
        ),
        _expect(REFUSED_OR_UNREAD),
    )
    add(
        "fragments",
        "stray",
        _frags(lambda b: [fragments(padded(b'{"x":1}'), 1, 2)]),
        _expect(REFUSED_OR_UNREAD),
    )
    add(
        "fragments",
        "malformed-header",
        _frags(lambda b: [Rec(padded(b"{}"), None, [("fragment", b"\xff/../2")])]),
        _expect(REFUSED_OR_UNREAD),
    )
    add(
        "fragments",
        "commits-cut-short",
        _frags(
            lambda b: [Rec(padded(b'{"kind":"commit"'), None, [("kind", b"commit"), ("fragment", b"0/2")])],
            on="commits",
        ),
        _expect(),
    )
    # --- floods (full campaign: measured) -------------------------------------------------------
    add(
        "flood",
        "fragments-600x1MB",
        _frags(
            lambda b: [fragments(b"x" * 1_000_000, i, 999_999, key=b.table_id.encode()) for i in range(600)]
        ),
        {"consume-snapshot": REFUSED},
        size="full",
        tags={"rss"},
    )
    add(
        "flood",
        "fragments-within-count-80x1MB",
        _frags(lambda b: [fragments(b"y" * 1_000_000, i, 70, key=b.table_id.encode()) for i in range(69)]),
        {"consume-snapshot": REFUSED},
        size="full",
        tags={"rss"},
    )
    add(
        "flood",
        "tables-12000",
        lambda b: (
            [
                action_rec(
                    event(b, tableId=f"forged-{i}", version=0, index=0, count=1, tableUri=f"{b.uri}-forged")
                )
                for i in range(12_000)
            ],
            [],
        ),
        {"consume-snapshot": REFUSED},
        size="full",
        tags={"rss"},
    )
    # the Spark source, in the full campaign: a few more classes than the quick subset's three
    spark_too = {
        "uri/moved": REFUSED,
        "version/gap": REFUSED_OR_UNREAD,
        "garbage/not-json": REFUSED_OR_UNREAD,
        "fragments/commits-cut-short": REFUSED,
        "oversize/table-uri": REFUSED,
    }
    for c in cases:
        if c.id in spark_too:
            c.expect = {**c.expect, "spark": spark_too[c.id]}
    if size == "ci":
        cases = [c for c in cases if c.size == "ci"]
        # every class, each with at most its first few cases: the quick subset
        per_class: dict[str, int] = {}
        picked = []
        for c in cases:
            per_class[c.cls] = per_class.get(c.cls, 0) + 1
            if per_class[c.cls] <= 3 or c.tags & {"spark"}:
                picked.append(c)
        cases = picked
    return cases


def check_expectations(cases: list[Case]) -> list[str]:
    """The suite's own consistency: ids unique, every expectation a known outcome and consumer."""
    problems = []
    seen: set[str] = set()
    known = {"refused", "skipped", "accepted", "unchanged"}
    for c in cases:
        if c.id in seen:
            problems.append(f"{c.id}: id given twice")
        seen.add(c.id)
        for consumer, outcomes in c.expect.items():
            if consumer not in CONSUMERS or not outcomes <= known:
                problems.append(f"{c.id}: unknown expectation {consumer}: {sorted(outcomes)}")
    return problems


__all__ = ["CONSUMERS", "Case", "check_expectations", "generate"]
