"""The writers' corpus regenerates from scripts/write_corpus.py (slow: runs delta-spark and delta-rs).

Only the delta-rs half runs without Spark; both halves write the tables the index lists, with the
same coverage (file names and timestamps differ run to run, so the comparison is of what is covered).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from support.corpus import index

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_delta_rs_half_of_the_corpus_regenerates(tmp_path: Path) -> None:
    out = tmp_path / "corpus"
    subprocess.run(
        [sys.executable, str(REPO / "scripts" / "write_corpus.py"), str(out), "--writer", "delta-rs"],
        check=True,
        timeout=600,
        capture_output=True,
    )
    fresh = json.loads((out / "index.json").read_text())
    committed = {t["id"]: t for t in index()["tables"] if t["writer"] == "delta-rs"}
    assert {t["id"] for t in fresh["tables"]} == set(committed)
    for table in fresh["tables"]:
        assert table["covers"] == committed[table["id"]]["covers"]
        assert table["operations"] == committed[table["id"]]["operations"]
