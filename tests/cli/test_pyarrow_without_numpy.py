"""A command imports pyarrow with NumPy hidden from it, and ``pyarrow.compute`` (at its first kernel)
the same way (NumPy is optional to pyarrow, and deltamirror never hands it a NumPy array):
importing NumPy was 110-170 ms of the 150-220 ms that ``import pyarrow`` cost every command, most
of what a restart of ``consume-snapshot`` over its saved state spends before it reads a record.
Each test runs in a fresh interpreter: the test process itself has imported both long ago."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parents[1] / "data" / "tables"
TABLE = DATA / "golden__basic-with-inserts-deletes-checkpoint"


def _run(code: str) -> dict[str, object]:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


#: what a process holds of NumPy and pyarrow: printed as JSON by the code it is appended to
_HELD = (
    "import pyarrow.lib\n"
    "_compute = sys.modules.get('pyarrow._compute')\n"
    "held = {'numpy': 'numpy' in sys.modules, 'pyarrow': 'pyarrow' in sys.modules,\n"
    "        'compute': _compute is not None, 'lib_numpy': pyarrow.lib.np is not None,\n"
    "        'compute_numpy': _compute is not None and _compute.np is not None}\n"
)


@pytest.mark.parametrize(
    "argv",
    [
        ["snapshot", str(TABLE)],
        ["history", str(TABLE)],
        ["read", str(TABLE)],
        ["events", str(TABLE)],
        ["changes", str(DATA / "krs__cdf-table"), "--starting-version", "0"],
    ],
    ids=lambda argv: argv[0],
)
def test_a_command_runs_on_pyarrow_without_numpy_and_leaves_numpy_importable(argv: list[str]) -> None:
    """What each offline command runs through never imports NumPy (one that did would pay for it
    again, and would find pyarrow without its NumPy conversions)."""
    seen = _run(
        "import contextlib, io, json, sys\n"
        "from deltamirror.cli.main import main\n"
        "out = io.TextIOWrapper(io.BytesIO())\n"
        "with contextlib.redirect_stdout(out):\n"
        f"    code = main({argv!r})\n"
        "out.flush()\n" + _HELD + "import numpy\n"  # anything else in the process may still import it
        "print(json.dumps({'code': code, 'out': len(out.buffer.getvalue()), **held,\n"
        "                  'numpy_importable': numpy.__name__ == 'numpy'}))\n"
    )
    assert seen["code"] == 0 and seen["out"] > 0  # the command did its work without NumPy
    assert seen["pyarrow"] is True and seen["numpy"] is False
    assert seen["lib_numpy"] is False and seen["compute_numpy"] is False  # decided at their import
    assert seen["numpy_importable"] is True


def test_a_kernel_after_imports_pyarrow_compute_without_numpy_too() -> None:
    seen = _run(
        "import json, sys\n"
        "from deltamirror.core.compute import keep_numpy_out_of_pyarrow, pc\n"
        "keep_numpy_out_of_pyarrow()\n"
        "import pyarrow as pa\n"
        "assert pc.sum(pa.array([1, 2])).as_py() == 3\n" + _HELD + "print(json.dumps(held))\n"
    )
    assert seen["compute"] is True and seen["numpy"] is False and seen["compute_numpy"] is False


def test_local_commands_import_no_pyarrow() -> None:
    seen = _run(
        "import contextlib, io, json, sys\n"
        "from deltamirror.cli.main import main\n"
        "with contextlib.redirect_stdout(io.TextIOWrapper(io.BytesIO())):\n"
        "    code = main(['local', 'kafka', 'status', '--port', '1', '--data-dir', '/nonexistent/dm'])\n"
        "print(json.dumps({'code': code, 'pyarrow': 'pyarrow' in sys.modules}))\n"
    )
    assert seen == {"code": 3, "pyarrow": False}


def test_numpy_already_imported_is_left_as_it_is() -> None:
    """A library user (or a test process) that imported NumPy first keeps pyarrow's NumPy support."""
    seen = _run(
        "import json, sys, numpy\n"
        "from deltamirror.core.compute import keep_numpy_out_of_pyarrow, pc\n"
        "keep_numpy_out_of_pyarrow()\n"
        "pc.sum\n" + _HELD + "print(json.dumps(held))\n"
    )
    assert seen["lib_numpy"] is True and seen["compute_numpy"] is True
