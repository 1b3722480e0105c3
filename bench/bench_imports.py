"""``import deltamirror.core`` beside ``import deltalake`` (and ``import pyarrow``, what both load):
contenders for ``bench/run.py``.

The harness's child process has already imported part of the standard library (json, pathlib,
subprocess...), which would hide their cost; so each contender starts one more, bare interpreter
(``sys.executable -c``: the site packages, nothing else) that times the one import statement with
``perf_counter`` and reports its peak RSS. Timed (``work_s``): that interpreter's whole life, start
to exit; ``import_s`` (the goal's figure): the import statement alone.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

_PROGRAM = """
import time
t0 = time.perf_counter()
import {module}
t1 = time.perf_counter()
with open("/proc/self/status") as fh:
    peak = next(int(line.split()[1]) / 1024 for line in fh if line.startswith("VmHWM:"))
print({{"import_s": t1 - t0, "peak_rss_mb": peak}})
"""


def _bare_import(clock: Any, module: str) -> dict[str, Any]:
    clock.imported()
    clock.start()
    done = subprocess.run(
        [sys.executable, "-c", _PROGRAM.format(module=module)], capture_output=True, text=True, check=True
    )
    clock.stop()
    facts: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1].replace("'", '"'))
    return facts | {"module": module, "ok": True}


def import_deltamirror_core(clock: Any, params: dict[str, Any]) -> dict[str, Any]:
    """``import deltamirror.core`` in a bare interpreter."""
    return _bare_import(clock, "deltamirror.core")


def import_deltalake(clock: Any, params: dict[str, Any]) -> dict[str, Any]:
    """``import deltalake`` in a bare interpreter."""
    return _bare_import(clock, "deltalake")


def import_pyarrow(clock: Any, params: dict[str, Any]) -> dict[str, Any]:
    """``import pyarrow`` in a bare interpreter: what both of the others load."""
    return _bare_import(clock, "pyarrow")
