"""What the change feed's path imports: only what its read runs.

``read_changes`` is measured against delta-rs's ``load_cdf`` on peak memory, and what a process has
imported is most of that peak: ``pyarrow.compute`` alone (its kernels registered, a wrapper built
per kernel) is ~10 MB of RSS and 60-120 ms of CPU. The modules of the path take ``pc`` from
:mod:`deltamirror.core.compute`, which imports it when a kernel is first used (a cast of a
``string_view`` column, a deletion vector); a table whose files need none never loads it.
Checked in a fresh interpreter (this process has imported everything already); no timing: the
module set is what regresses.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from support.tables import TABLES

#: what ``from deltamirror.core import open_table`` and the change feed's modules import
CHANGE_FEED_PATH = (
    "deltamirror.core.table",
    "deltamirror.core.changes",
    "deltamirror.core.changes.feed",
    "deltamirror.core.changes.rows",
    "deltamirror.core.changes.net",
    "deltamirror.core.read",
    "deltamirror.core.file_columns",
    "deltamirror.core.row_tracking",
    "deltamirror.core.deletion_vectors",
)

#: what that path must not import before it reads: kernels it may never run, the readers and the
#: object stores it does not use, the layers above core
NOT_ON_THE_PATH = (
    "pyarrow.compute",
    "pyarrow.dataset",
    "pyarrow.acero",
    "fsspec",
    "deltalake",
    "pyspark",
    "confluent_kafka",
    "deltamirror.mirror",
    "deltamirror.producer",
    "deltamirror.consumer",
    "deltamirror.cli",
)


def _imported_after(code: str) -> set[str]:
    probe = f"import sys\n{code}\nprint('\\n'.join(sorted(sys.modules)))\n"
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120
    )
    return set(out.stdout.split())


def test_the_change_feed_path_imports_nothing_its_read_does_not_run() -> None:
    imported = _imported_after(
        "from deltamirror.core import open_table\nfrom deltamirror.core.changes import read_changes\n"
        + "\n".join(f"import {m}" for m in CHANGE_FEED_PATH)
    )
    assert set(CHANGE_FEED_PATH) <= imported
    assert sorted(m for m in imported if m in NOT_ON_THE_PATH or m.startswith(NOT_ON_THE_PATH)) == []


@pytest.mark.parametrize(
    "name", ["krs__cdf-table-simple", "krs__cdf-table-update-ops", "drs__simple_table_with_cdc"]
)
def test_a_change_feed_that_needs_no_kernel_never_imports_pyarrow_compute(name: str) -> None:
    """Inserts and updates from files whose types are the table's (no cast, no deletion
    vector) are read without a kernel: the rows are there, ``pyarrow.compute`` is not."""
    # that table's writer spelled the update rows "update_pre" and "update_post"
    check = "'update_post' in kinds" if name == "krs__cdf-table-update-ops" else "kinds"
    imported = _imported_after(
        "from deltamirror.core import open_table\n"
        "from deltamirror.core.changes import read_changes\n"
        f"rows = read_changes(open_table({str(TABLES / name)!r}), starting_version=0).to_arrow()\n"
        "kinds = rows.column('_change_type').to_pylist()\n"
        f"assert {check}\n"
    )
    assert "pyarrow.compute" not in imported
