"""The writers' corpus (tests/data/corpus): small tables written by delta-spark and delta-rs, with
what each writer's own reader read from them when they were written (scripts/write_corpus.py).

Rows are compared in one normal form (:func:`normal_rows`): decimals as strings, timestamps as UTC
epoch microseconds, dates as ISO text, binary as ``0x`` hex, sorted. A shallow clone names its
source's files by absolute path under :data:`WRITE_ROOT`, where the corpus was written:
:func:`table_location` puts the source there (the same path on every machine) before it is read.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import math
import os
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from functools import cache
from pathlib import Path
from typing import Any

CORPUS = Path(__file__).resolve().parents[1] / "data" / "corpus"
#: where scripts/write_corpus.py writes the tables (a shallow clone's log names this path)
WRITE_ROOT = Path("/tmp/deltamirror-writers-corpus")


def _micros(value: dt.datetime) -> int:
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    delta = value - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def normal(value: Any) -> Any:
    """One cell as JSON that any reader's cell can be compared with."""
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, dt.datetime):
        return _micros(value)
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, bytes | bytearray):
        return "0x" + bytes(value).hex()
    if isinstance(value, float):
        return (value + 0.0) if math.isfinite(value) else str(value)  # -0.0 is 0.0
    if isinstance(value, Mapping):
        return {str(k): normal(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [normal(v) for v in value]
    return value


def normal_rows(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Rows in the normal form, without ``_commit_timestamp``, sorted."""
    out = [{k: normal(v) for k, v in row.items() if k != "_commit_timestamp"} for row in rows]
    out.sort(key=lambda r: json.dumps(r, sort_keys=True))
    return out


@dataclass(frozen=True)
class CorpusTable:
    id: str
    writer: str
    entry: dict[str, Any]

    @property
    def path(self) -> Path:
        return CORPUS / "tables" / self.id

    @property
    def expected(self) -> dict[str, Any]:
        return _expected(self.id)

    @property
    def absolute_paths(self) -> bool:
        """Its log names files by absolute path under :data:`WRITE_ROOT` (a shallow clone)."""
        return "SHALLOW CLONE" in " ".join(self.entry["covers"])


@cache
def index() -> dict[str, Any]:
    return dict(json.loads((CORPUS / "index.json").read_text()))


@cache
def _expected(table_id: str) -> dict[str, Any]:
    return dict(json.loads((CORPUS / "expected" / f"{table_id}.json").read_text()))


def corpus_tables() -> list[CorpusTable]:
    return [CorpusTable(t["id"], t["writer"], t) for t in index()["tables"]]


#: where a writer's own reader disagrees with the protocol (and the data files) on a table it wrote:
#: the expectation is corrected as the protocol reads it, and why is said here
WRITER_READER_FAULTS: dict[tuple[str, str], tuple[str, Any]] = {
    # its files hold the physical column names, as PROTOCOL.md's column mapping says; delta-rs
    # 1.6.6's to_pyarrow_table reads them as nulls. The rows are those the writer was given.
    ("delta-rs__column_mapping", "rows"): (
        "delta-rs 1.6.6 reads its own column-mapped table as nulls",
        {"0": [{"id": 1, "name": "a"}], "1": [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}]},
    ),
    # the add holds "p": "" and PROTOCOL.md says an empty string is a null partition value (delta-rs's
    # own to_pyarrow_table reads it null); its load_cdf returns the serialized ""
    ("delta-rs__null_partitions", "cdf"): ("delta-rs 1.6.6's load_cdf reads an empty partition as ''", None),
}


def expected_rows(table: CorpusTable, version: str, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    fault = WRITER_READER_FAULTS.get((table.id, "rows"))
    return rows if fault is None else list(fault[1][version])


def expected_cdf(table: CorpusTable, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if (table.id, "cdf") not in WRITER_READER_FAULTS:
        return rows
    partition = "p"  # the table's one partition column
    return [{k: (None if k == partition and v == "" else v) for k, v in row.items()} for row in rows]


def table_location(table: CorpusTable) -> tuple[str, list[str]]:
    """(where to read the table, the path prefixes it may name files under). A shallow clone's
    source is put at :data:`WRITE_ROOT` first, if it is not there (atomically: test sessions may
    run side by side)."""
    if not table.absolute_paths:
        return str(table.path), []
    source = "spark__dml"
    target = WRITE_ROOT / source
    if not (target / "_delta_log").is_dir():
        WRITE_ROOT.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=WRITE_ROOT))
        shutil.copytree(CORPUS / "tables" / source, staging / source)
        with contextlib.suppress(OSError):  # another session put it there first: the same files
            os.rename(staging / source, target)
        shutil.rmtree(staging, ignore_errors=True)
    return str(table.path), [f"file://{WRITE_ROOT}/"]
