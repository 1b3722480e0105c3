"""What a consumer command's start imports: only what its start runs.

A ``consume-snapshot`` restart over a saved state (caught up, nothing new to apply) runs no
``pyarrow.compute`` kernel, yet importing that module (a wrapper built per kernel, ~60-120 ms of
CPU) was a tenth of the restart: the modules of the path take it from
:mod:`deltamirror.core.compute`, which imports it on first use. Checked in a fresh interpreter
(this process has imported everything already); no timing: the module set is what regresses.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

#: the modules ``deltamirror consume-snapshot`` imports before it reads (cli, settings, the loop,
#: its state and store, the reader and the login check)
COMMAND_PATH = (
    "deltamirror.cli.main",
    "deltamirror.cli.consumer_cmds",
    "deltamirror.consumer.settings",
    "deltamirror.consumer.snapshot",
    "deltamirror.mirror.kafka.consumer",
    "deltamirror.mirror.kafka.login_check",
)

#: what that path must not import: kernels and readers it does not run at start, the other
#: consumers, the producer, the Spark source, the registry formats, the object stores, the
#: metrics server (started only with --metrics-port)
NOT_AT_START = (
    "pyarrow.compute",
    "pyarrow.dataset",
    "fsspec",
    "pyspark",
    "deltalake",
    "confluent_kafka.schema_registry",
    "confluent_kafka.avro",
    "fastavro",
    "google.protobuf",
    "prometheus_client",
    "yaml",
    "deltamirror.producer",
    "deltamirror.consumer.spark",
    "deltamirror.consumer.invalidate",
    "deltamirror.ops.server",
)


def _imported_after(code: str) -> set[str]:
    probe = f"import sys\n{code}\nprint('\\n'.join(sorted(sys.modules)))\n"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def test_the_consume_snapshot_path_imports_nothing_its_start_does_not_run() -> None:
    imported = _imported_after("\n".join(f"import {m}" for m in COMMAND_PATH))
    assert set(COMMAND_PATH) <= imported
    assert sorted(imported & set(NOT_AT_START)) == []


@pytest.mark.parametrize("name", ["equal", "array_sort_indices"])
def test_a_kernel_asked_for_imports_pyarrow_compute_and_is_its_own(name: str) -> None:
    """The stand-in gives pyarrow.compute's own function (no wrapper in between)."""
    code = (
        "from deltamirror.core.compute import pc\n"
        "assert 'pyarrow.compute' not in sys.modules\n"
        f"found = pc.{name}\n"
        "import pyarrow.compute\n"
        f"assert found is pyarrow.compute.{name} and pc.{name} is found\n"
    )
    assert "pyarrow.compute" in _imported_after(code)


def test_after_the_command_lines_first_step_the_path_imports_neither_numpy_nor_pyarrow_compute() -> None:
    """The command line imports pyarrow with NumPy hidden first (deltamirror.core.compute): the
    path then holds no NumPy (110-170 ms of CPU) and still no ``pyarrow.compute``."""
    code = (
        "from deltamirror.core.compute import keep_numpy_out_of_pyarrow\n"
        "keep_numpy_out_of_pyarrow()\n" + "\n".join(f"import {m}" for m in COMMAND_PATH)
    )
    imported = _imported_after(code)
    assert set(COMMAND_PATH) <= imported and "pyarrow" in imported
    assert sorted(imported & {"numpy", "pyarrow.compute", "pyarrow._compute"}) == []
