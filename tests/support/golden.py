"""Golden records: real tables placed where their bytes are fixed, the records the watcher published
read back as subscribers read them, the normalisation rules, and a readable difference.

Used by ``tests/producer/test_golden_records.py`` (its docstring says what is compared and why).
"""

from __future__ import annotations

import base64
import contextlib
import errno
import fcntl
import json
import os
import re
import shutil
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from support.tables import TABLES

#: Where the tables are copied: their location is inside every value (``tableUri``), the progress
#: key and the ``transactionalId`` (a hash of it), and a value's length decides where an oversize
#: record is cut into fragments. A fixed path keeps all of those byte-identical on every machine.
ROOT = Path("/tmp/deltamirror-golden")
#: Held while the tables under ROOT are in use, so two test runs on one machine take turns.
LOCK = Path("/tmp/deltamirror-golden.lock")

#: git does not keep file times, and a commit's time is its file's mtime when it has no
#: inCommitTimestamp: every file gets one from a fixed schedule. Two versions share each minute, so
#: the odd ones are made monotonic (``adjusted-file-time``) and the even ones keep ``file-time``.
MTIME_BASE_S = 1_700_000_000
MTIME_STEP_S = 60

WALL_CLOCK = "<wall-clock>"
_UPDATED_AT = re.compile(rb'"updatedAt":-?[0-9]+(?=[,}])')
_VERSION_FILE = re.compile(r"^(\d{20})\.")


def version_mtime_s(version: int) -> int:
    return MTIME_BASE_S + MTIME_STEP_S * (version // 2)


def latest_commit(table: Path) -> int:
    """The highest ``NNN.json`` in the log, read without the code under test."""
    names = (p.name for p in (table / "_delta_log").iterdir())
    return max(int(n[:20]) for n in names if re.fullmatch(r"\d{20}\.json", n))


@contextlib.contextmanager
def golden_lock(timeout_s: float = 600.0) -> Iterator[None]:
    with open(LOCK, "a") as fh:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES) or time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def place_table(table_id: str) -> Path:
    """A fresh copy of ``tests/data/tables/<id>`` at ``ROOT/<id>`` with its file times pinned."""
    target = ROOT / table_id
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(TABLES / table_id, target)
    latest_s = version_mtime_s(latest_commit(target))
    for path in sorted(target.rglob("*")):
        if not path.is_file():
            continue
        match = _VERSION_FILE.match(path.name) if path.parent.name == "_delta_log" else None
        seconds = version_mtime_s(int(match.group(1))) if match else latest_s
        os.utime(path, ns=(seconds * 1_000_000_000, seconds * 1_000_000_000))
    return target


def table_uri(table_id: str) -> str:
    return f"file://{ROOT / table_id}"


# --- records -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GoldenRecord:
    """One record as a read_committed subscriber receives it (``timestamp`` None: wall clock)."""

    role: str  # actions | commits | progress
    partition: int
    timestamp: int | None
    key: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    value: bytes | None

    def header(self, name: str) -> str | None:
        return next((v.decode(errors="replace") for k, v in self.headers if k == name), None)


def normalise(records: Iterable[GoldenRecord]) -> list[GoldenRecord]:
    """The only differences allowed between runs, each by an exact rule; nothing is dropped.

    1. A progress record's Kafka timestamp and its ``updatedAt`` field are wall-clock time by
       contract (docs/events.md): the timestamp becomes None, the digits of ``updatedAt`` (which
       must be there exactly once) become ``"<wall-clock>"``.
    2. An idle table re-writes its progress record about every 15 s (liveness): a progress record
       equal, after rule 1, to the one before it with the same key is that re-write and is counted
       once. Every other repetition stays.
    """
    out: list[GoldenRecord] = []
    last_progress: dict[bytes | None, GoldenRecord] = {}
    for record in records:
        if record.role == "progress":
            value, n = _UPDATED_AT.subn(f'"updatedAt":"{WALL_CLOCK}"'.encode(), record.value or b"")
            if n != 1:
                raise AssertionError(f"progress record without exactly one updatedAt: {record.value!r}")
            record = replace(record, timestamp=None, value=value)
            if last_progress.get(record.key) == record:
                continue
            last_progress[record.key] = record
        out.append(record)
    return out


def _text(data: bytes | None, name: str) -> dict[str, Any]:
    if data is None:
        return {name: None}
    try:
        return {name: data.decode("utf-8")}
    except UnicodeDecodeError:  # a fragment may end inside a multi-byte character
        return {f"{name}_b64": base64.b64encode(data).decode()}


def _bytes(obj: Mapping[str, Any], name: str) -> bytes | None:
    if f"{name}_b64" in obj:
        return base64.b64decode(obj[f"{name}_b64"])
    text = obj[name]
    return None if text is None else str(text).encode("utf-8")


def to_line(record: GoldenRecord) -> str:
    obj: dict[str, Any] = {
        "topic": record.role,
        "partition": record.partition,
        "timestamp": WALL_CLOCK if record.timestamp is None else record.timestamp,
        **_text(record.key, "key"),
        "headers": [[k, v.decode("ascii")] for k, v in record.headers],  # ASCII by contract
        **_text(record.value, "value"),
    }
    return json.dumps(obj, ensure_ascii=False)


def from_line(line: str) -> GoldenRecord:
    obj = json.loads(line)
    ts = obj["timestamp"]
    return GoldenRecord(
        obj["topic"],
        obj["partition"],
        None if ts == WALL_CLOCK else ts,
        _bytes(obj, "key"),
        tuple((k, v.encode("utf-8")) for k, v in obj["headers"]),
        _bytes(obj, "value"),
    )


def write_golden(path: Path, records: Iterable[GoldenRecord]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(to_line(r) + "\n" for r in records), encoding="utf-8")


def read_golden(path: Path) -> list[GoldenRecord]:
    return [from_line(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


# --- reading topics back ---------------------------------------------------------------------------


def read_to_end(
    bootstrap: str, topics: Mapping[str, str], timeout_s: float = 30.0
) -> dict[str, list[GoldenRecord]]:
    """Every committed record of ``topics`` (name -> role), by topic, per partition in offset order.

    Reads with ``isolation.level=read_committed`` until each partition reports its end (for
    read_committed, the last stable offset). A topic that does not exist yet reads as empty.
    """
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"golden-{os.getpid()}-{time.monotonic_ns()}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    try:
        metadata = consumer.list_topics(timeout=10).topics
        parts = [
            TopicPartition(name, p, -2)
            for name in topics
            if name in metadata and metadata[name].error is None
            for p in sorted(metadata[name].partitions)
        ]
        out: dict[str, list[GoldenRecord]] = {name: [] for name in topics}
        if not parts:
            return out
        consumer.assign(parts)
        pending = {(tp.topic, tp.partition) for tp in parts}
        got: dict[tuple[str, int], list[GoldenRecord]] = {key: [] for key in pending}
        deadline = time.monotonic() + timeout_s
        while pending:
            if time.monotonic() > deadline:
                raise AssertionError(f"topics not read to their end in {timeout_s} s: {sorted(pending)}")
            for m in consumer.consume(1000, timeout=0.5):
                where = (m.topic() or "", m.partition() or 0)
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        pending.discard(where)
                        continue
                    raise AssertionError(f"consumer error on {where}: {err}")
                got[where].append(
                    GoldenRecord(
                        topics[where[0]],
                        where[1],
                        m.timestamp()[1],
                        m.key(),
                        _headers(m.headers()),
                        m.value(),
                    )
                )
        for (name, _), records in sorted(got.items()):
            out[name].extend(records)
        return out
    finally:
        consumer.close()


def _headers(raw: Any) -> tuple[tuple[str, bytes], ...]:
    out = []
    for name, value in raw or []:
        if not isinstance(value, bytes):  # the watcher never sends a null or text header value
            raise AssertionError(f"header {name!r} has the value {value!r}, not bytes")
        out.append((str(name), value))
    return tuple(out)


# --- differences -----------------------------------------------------------------------------------


def _short(value: Any, limit: int = 160) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _json_differences(want: Any, got: Any, path: str = "") -> list[str]:
    if isinstance(want, dict) and isinstance(got, dict):
        out: list[str] = []
        if list(want) != list(got) and set(want) == set(got):
            out.append(f"{path or '(top)'}: key order {list(want)} -> {list(got)}")
        for key in dict.fromkeys([*want, *got]):
            if key not in got:
                out.append(f"{path}.{key}: missing (expected {_short(want[key])})")
            elif key not in want:
                out.append(f"{path}.{key}: unexpected {_short(got[key])}")
            else:
                out.extend(_json_differences(want[key], got[key], f"{path}.{key}"))
        return out
    if isinstance(want, list) and isinstance(got, list) and len(want) == len(got):
        return [
            d
            for i, (w, g) in enumerate(zip(want, got, strict=True))
            for d in _json_differences(w, g, f"{path}[{i}]")
        ]
    if want != got or type(want) is not type(got):
        return [f"{path or '(value)'}: {_short(want)} -> {_short(got)}"]
    return []


def describe_record_difference(want: GoldenRecord, got: GoldenRecord) -> list[str]:
    out: list[str] = []
    for field in ("role", "partition", "timestamp", "key", "headers"):
        if getattr(want, field) != getattr(got, field):
            out.append(f"{field}: {getattr(want, field)!r} -> {getattr(got, field)!r}")
    if want.value != got.value:
        try:
            parsed = (json.loads(want.value or b"null"), json.loads(got.value or b"null"))
        except ValueError:  # fragments are not JSON on their own
            parsed = None
        details = _json_differences(*parsed) if parsed is not None else []
        if parsed is not None and not details:
            details = ["same JSON, different bytes (spacing, escaping or number format)"]
        out.append("value: " + ("; ".join(details) if details else f"{want.value!r} -> {got.value!r}"))
    return out


def describe_difference(want: list[GoldenRecord], got: list[GoldenRecord]) -> str | None:
    """None when equal; otherwise per topic: counts, and the first differing records, field by field."""
    if want == got:
        return None
    lines: list[str] = []
    for role in dict.fromkeys([r.role for r in want] + [r.role for r in got]):
        w = [r for r in want if r.role == role]
        g = [r for r in got if r.role == role]
        if w == g:
            continue
        lines.append(f"  {role} topic: {len(w)} records expected, {len(g)} published")
        shown = 0
        for i, (a, b) in enumerate(zip(w, g, strict=False)):
            if a == b:
                continue
            where = (
                f"v{a.header('version')}#{a.header('index')}" if role == "actions" else a.header("kind") or ""
            )
            lines.append(f"    record {i} ({where}): " + " | ".join(describe_record_difference(a, b)))
            shown += 1
            if shown == 3:
                lines.append("    ...")
                break
        if len(w) != len(g):
            extra = g[len(w) :] if len(g) > len(w) else w[len(g) :]
            label = "unexpected" if len(g) > len(w) else "missing"
            for r in extra[:2]:
                lines.append(f"    {label}: {_short((r.value or b'').decode(errors='replace'))}")
    return "\n".join(lines)
