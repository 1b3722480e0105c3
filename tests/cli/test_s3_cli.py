"""The reading commands on an ``s3://`` table, as a user runs them, against a real S3-API server.

Each command's output for the uploaded table must equal its output for the local copy, but for
what the upload changes: commit timestamps come from the objects' times (the tables have no
in-commit timestamps). Credentials go in with ``-S`` and must never come out, not even on error.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from support.s3proxy import S3Proxy

pytestmark = [pytest.mark.s3]

TABLE = Path(__file__).resolve().parents[1] / "data" / "tables" / "krs__cdf-table"
#: output fields that hold a commit's time (the object's time on S3, the file's locally)
TIME_FIELDS = {"timestamp", "timestampSource", "_commit_timestamp"}


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "deltamirror.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def _options(options: dict[str, Any]) -> list[str]:
    return [arg for key, value in options.items() for arg in ("-S", f"{key}={value}")]


def _lines(text: str) -> list[Any]:
    out = []
    for line in text.splitlines():
        value = json.loads(line)
        if isinstance(value, dict):
            value = {k: v for k, v in value.items() if k not in TIME_FIELDS}
        out.append(value)
    return out


@pytest.fixture(scope="module")
def remote(s3: S3Proxy) -> str:
    return s3.upload_table(TABLE, f"{s3.new_prefix('cli')}/cdf")


@pytest.mark.parametrize(
    "args",
    [
        ["snapshot"],
        ["read"],
        ["changes", "--starting-version", "0"],
    ],
    ids=["snapshot", "read", "changes"],
)
def test_a_command_on_s3_prints_what_it_prints_for_the_local_copy(
    s3: S3Proxy, remote: str, args: list[str]
) -> None:
    command, *rest = args
    got = cli(command, remote, *_options(s3.storage_options), *rest)
    assert got.returncode == 0, got.stderr
    want = cli(command, str(TABLE), *rest)
    assert want.returncode == 0, want.stderr
    assert got.stdout.strip(), "nothing printed"
    assert sorted(map(json.dumps, _lines(got.stdout))) == sorted(map(json.dumps, _lines(want.stdout)))


def test_a_wrong_secret_is_one_line_without_any_secret(s3: S3Proxy, remote: str) -> None:
    wrong = f"wrong-{s3.secret[::-1]}"
    done = cli("snapshot", remote, *_options({**s3.storage_options, "secret": wrong}))
    assert done.returncode in (1, 2), done.stderr
    assert wrong not in done.stdout + done.stderr
    assert s3.secret not in done.stdout + done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert remote in done.stderr
