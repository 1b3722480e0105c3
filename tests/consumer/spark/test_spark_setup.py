"""Spark's Python workers on a fresh machine: the README's Spark program as written, and register()'s check.

A fresh machine has no venv on PATH and nothing exported, so the ``python3`` PySpark would start for
its workers is not the one with deltamirror. Both tests run Spark in a new process (one SparkContext
per process is shared by the rest of the suite) with an environment like that one:

- no ``PYSPARK_PYTHON``, ``PYSPARK_DRIVER_PYTHON``, ``VIRTUAL_ENV`` or ``PYTHONPATH``;
- a PATH whose first ``python3`` is a bare venv of the same Python version (so PySpark accepts it as
  a worker) that cannot import deltamirror or pyarrow, followed by PATH's entries that are no venv.

The README test substitutes two placeholders of the README's Spark section, and nothing else:
``/data/events`` (the table location) and ``127.0.0.1:9092`` (the brokers).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pytest

from support.spark import PYTHON_ENV, require_pyspark
from support.watching import published_version

REPO = Path(__file__).resolve().parents[3]
README = REPO / "README.md"
#: the README's placeholders this test replaces, and only these
README_TABLE = "/data/events"
README_BROKERS = "127.0.0.1:9092"
VENV_BIN = Path(sys.executable).parent

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture
def wrong_python(tmp_path: Path) -> Path:
    """A ``python3`` of this Python version that cannot import deltamirror (nor pyarrow)."""
    require_pyspark()
    venv = tmp_path / "not-deltamirror-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python3 = venv / "bin" / "python3"
    for module in ("deltamirror", "pyarrow"):
        probe = subprocess.run(
            [str(python3), "-c", f"import {module}"], capture_output=True, env=_fresh_env(python3)
        )
        assert probe.returncode != 0, f"{python3} imports {module}: the test would prove nothing"
    return python3


def _fresh_env(first_python3: Path) -> dict[str, str]:
    """This process's environment as a fresh machine has it, with ``first_python3`` first on PATH."""
    env = {k: v for k, v in os.environ.items() if k not in (*PYTHON_ENV, "VIRTUAL_ENV", "PYTHONPATH")}
    kept = [
        p
        for p in os.environ.get("PATH", "").split(os.pathsep)
        if p and not (Path(p).parent / "pyvenv.cfg").exists() and Path(p) != VENV_BIN
    ]
    env["PATH"] = os.pathsep.join([str(first_python3.parent), *kept])
    assert shutil.which("python3", path=env["PATH"]) == str(first_python3)
    return env


def _readme_block(lang: str, must_contain: str) -> str:
    """The one fenced ``lang`` block of README.md that contains ``must_contain``."""
    blocks = re.findall(r"^```(\w*)\n(.*?)^```", README.read_text(), flags=re.M | re.S)
    found = [body for kind, body in blocks if kind == lang and must_contain in body]
    assert len(found) == 1, f"README.md has {len(found)} ```{lang} blocks with {must_contain!r}"
    return str(found[0])


def _substituted(text: str, table: str, brokers: str) -> str:
    for placeholder in (README_TABLE, README_BROKERS):
        assert placeholder in text, f"the README's Spark section no longer uses {placeholder!r}"
    return text.replace(README_TABLE, table).replace(README_BROKERS, brokers)


def _watch_command(table: str, brokers: str) -> list[str]:
    """The README's ``deltamirror watch ...`` line, run with this venv's ``deltamirror``."""
    shell = _readme_block("bash", "deltamirror watch").replace("\\\n", " ")
    lines = [line for line in shell.splitlines() if line.strip().startswith("deltamirror watch")]
    assert len(lines) == 1, lines
    argv = shlex.split(_substituted(lines[0], table, brokers), comments=True)
    assert argv[-1] != "&" and "--snapshot-mode" in argv and "--from-version" in argv, argv
    return [str(VENV_BIN / "deltamirror"), *argv[1:]]


def _console_rows(stdout: str) -> list[dict[str, str]]:
    """The rows of every batch Spark's console sink printed (``|a |b |`` tables, header first)."""
    rows: list[dict[str, str]] = []
    header: list[str] | None = None
    for line in stdout.splitlines():
        if line.startswith("Batch: "):
            header = None
        elif line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if header is None:
                header = cells
            else:
                rows.append(dict(zip(header, cells, strict=True)))
    return rows


def _make_table(path: Path) -> None:
    """Versions 0-2: three inserts, two inserts, one delete (delta-rs writes its cdc file)."""
    from deltalake import DeltaTable, write_deltalake

    def rows(ids: list[int], names: list[str]) -> pa.Table:
        return pa.table({"id": pa.array(ids, pa.int64()), "name": names})

    write_deltalake(
        path, rows([1, 2, 3], ["a", "b", "c"]), configuration={"delta.enableChangeDataFeed": "true"}
    )
    write_deltalake(path, rows([4, 5], ["d", "e"]), mode="append")
    DeltaTable(str(path)).delete("id = 2")


@pytest.mark.kafka
def test_the_readme_spark_program_runs_as_written_on_a_fresh_machine(
    kafka_bootstrap: str, wrong_python: Path, tmp_path: Path
) -> None:
    from deltamirror.mirror.topic_names import default_topics

    env = _fresh_env(wrong_python)
    table = tmp_path / f"events_{uuid.uuid4().hex[:10]}"  # topics are named after the directory
    _make_table(table)
    program = tmp_path / "readme_spark.py"
    program.write_text(
        _substituted(_readme_block("python", 'format("deltamirror")'), str(table), kafka_bootstrap)
    )

    watch_log = (tmp_path / "watch.log").open("w")
    watcher = subprocess.Popen(
        _watch_command(str(table), kafka_bootstrap), env=env, cwd=tmp_path, stdout=watch_log, stderr=watch_log
    )
    try:
        commits = default_topics(str(table)).commits
        deadline = time.monotonic() + 90
        while published_version(kafka_bootstrap, commits) < 2:
            assert watcher.poll() is None, (tmp_path / "watch.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the README's watcher did not mirror version 2 in 90 s"
            time.sleep(0.5)
        run = subprocess.run(
            [sys.executable, str(program)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=240
        )
    finally:
        watcher.send_signal(signal.SIGTERM)
        watcher.wait(30)
        watch_log.close()
    assert run.returncode == 0, run.stderr[-4000:]
    rows = _console_rows(run.stdout)
    got = sorted((r["id"], r["name"], r["_change_type"], r["_commit_version"]) for r in rows)
    assert got == sorted(
        [
            ("1", "a", "insert", "0"),
            ("2", "b", "insert", "0"),
            ("3", "c", "insert", "0"),
            ("4", "d", "insert", "1"),
            ("5", "e", "insert", "1"),
            ("2", "b", "delete", "2"),
        ]
    ), run.stdout[-4000:]
    assert all(r["_commit_timestamp"].startswith("20") for r in rows)


# Runs in a fresh process: four SparkContexts one after the other in one JVM, each reading the
# worker interpreter from the environment as it is when the context starts.
REGISTER_SCRIPT = r"""
import json, os, sys
from pyspark.sql import SparkSession
from deltamirror.consumer.spark.source import register
from deltamirror.core.errors import DeltaMirrorError

wrong_python, missing_python = sys.argv[1], sys.argv[2]
out = {"driver": sys.executable}

def attempt(name, **conf):
    builder = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("OFF")
    try:
        register(spark)
        register(spark)  # once per context: the second call runs no job
        jobs = spark.sparkContext.statusTracker().getJobIdsForGroup("deltamirror-worker-check")
        out[name] = {"ok": True, "check_jobs": len(jobs)}
    except DeltaMirrorError as exc:
        out[name] = {"ok": False, "type": type(exc).__name__, "exit_code": exc.exit_code, "message": str(exc)}
    spark.stop()

attempt("nothing_set")  # a fresh machine: the python3 on PATH
os.environ["PYSPARK_PYTHON"] = wrong_python
attempt("wrong_python", **{"spark.pyspark.python": wrong_python})
os.environ["PYSPARK_PYTHON"] = missing_python
attempt("missing_python")
os.environ["PYSPARK_PYTHON"] = sys.executable  # what the message says to do
attempt("fixed")
print("RESULT " + json.dumps(out))
"""


@pytest.mark.isolated  # its own Spark in a child process: none of the session's
def test_register_fails_in_one_line_naming_the_setting_when_workers_cannot_import_deltamirror(
    wrong_python: Path, tmp_path: Path
) -> None:
    script = tmp_path / "register_check.py"
    script.write_text(REGISTER_SCRIPT)
    missing = tmp_path / "no-such-dir" / "python3"
    run = subprocess.run(
        [sys.executable, str(script), str(wrong_python), str(missing)],
        env=_fresh_env(wrong_python),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    [line] = [x for x in run.stdout.splitlines() if x.startswith("RESULT ")]
    out = json.loads(line[len("RESULT ") :])
    driver = out["driver"]
    assert driver == sys.executable and driver != str(wrong_python)

    for name in ("nothing_set", "wrong_python"):
        failed = out[name]
        assert failed["ok"] is False, (name, failed)
        assert (failed["type"], failed["exit_code"]) == ("EnvironmentMissingError", 2)
        message = failed["message"]
        assert "\n" not in message
        # the interpreter the WORKER ran (sys.executable there), not the driver's
        assert message.startswith(
            f"Spark's Python workers run {wrong_python}, which cannot import deltamirror"
        )
        assert "No module named 'deltamirror'" in message
        assert f"PYSPARK_PYTHON={driver}" in message and f"spark.pyspark.python={driver}" in message

    missing_run = out["missing_python"]
    assert (missing_run["ok"], missing_run["exit_code"]) == (False, 2)
    assert "\n" not in missing_run["message"]
    assert f'Cannot run program "{missing}"' in missing_run["message"]
    assert f"PYSPARK_PYTHON={driver}" in missing_run["message"]

    # as the message says: PYSPARK_PYTHON before the session starts; checked once per context
    assert out["fixed"] == {"ok": True, "check_jobs": 1}
