"""Can Spark's Python workers import what the source's tasks import? Asked once, before any query.

A worker that cannot import deltamirror fails every micro-batch deep inside a task, with a worker
traceback that names neither the interpreter nor the setting to change. :func:`check_workers`
runs a one-task job instead and turns its answer into one line: which interpreter the workers run,
what it cannot import, and ``PYSPARK_PYTHON`` set to the driver's.

No pyspark import here (source.py is the one module that imports it): the session is used
only through its own methods, and the Spark Connect fallback, which needs ``pyspark.sql.functions``,
is handed in by the caller.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from typing import Any

from deltamirror.core.errors import EnvironmentMissingError

#: the modules a task imports to read the mirror, in the order that makes the first failure say most
WORKER_MODULES = ("deltamirror.core", "pyarrow", "confluent_kafka", "deltamirror.consumer.spark.source")
#: the job group of the check's job: a test (or an operator) can count the checks in the Spark UI
JOB_GROUP = "deltamirror-worker-check"
_workers_ok: set[str] = set()

#: (the worker's interpreter, the module it could not import or None, why or None)
ProbeResult = tuple[str, str | None, str | None]
Probe = Callable[[Any], ProbeResult]
#: runs a probe in a UDF and returns its result (Spark Connect, where no SparkContext is at hand)
UdfRunner = Callable[[Any, Probe], ProbeResult]


def check_workers(spark: Any, run_in_udf: UdfRunner) -> None:
    """Fail with one line unless Spark's Python workers can import what the source's tasks import.

    The check runs a one-task job, so it sees the interpreter Spark really starts for tasks (in local
    mode, ``PYSPARK_PYTHON`` as it was when the SparkContext started, else the ``python3`` on PATH),
    not the driver's. It runs once per SparkContext: a context keeps its worker interpreter.
    """
    key = _context_key(spark)
    if key in _workers_ok:
        return
    try:
        interpreter, module, error = _probe_a_worker(spark, run_in_udf)
    except Exception as exc:  # the worker did not start at all: a wrong path, another Python version
        reason = one_line_reason(exc)
        raise EnvironmentMissingError(
            f"Spark's Python workers could not run ({reason or type(exc).__name__}); {_advice()}"
        ) from (None if reason else exc)
    if error is not None:
        raise EnvironmentMissingError(
            f"Spark's Python workers run {interpreter}, which cannot import {module} ({error}); {_advice()}"
        )
    _workers_ok.add(key)


def _advice() -> str:
    exe = sys.executable
    return (
        f"set PYSPARK_PYTHON={exe} in the environment before the SparkSession starts "
        f"(os.environ, or spark.pyspark.python={exe} with spark-submit)"
    )


def _context_key(spark: Any) -> str:
    try:
        sc = spark.sparkContext
    except Exception:  # Spark Connect: no SparkContext on the client; the server's is per session id
        return f"session:{getattr(spark, 'session_id', id(spark))}"
    return f"context:{sc.applicationId}:{sc.startTime}"


def _worker_probe() -> Probe:
    """A local function: cloudpickle sends it by value, so a worker runs it without deltamirror."""

    def probe(_: Any, modules: tuple[str, ...] = WORKER_MODULES) -> ProbeResult:
        import importlib
        import sys

        for name in modules:
            try:
                importlib.import_module(name)
            except Exception as exc:
                return sys.executable, name, " ".join(f"{type(exc).__name__}: {exc}".split())
        return sys.executable, None, None

    return probe


def _probe_a_worker(spark: Any, run_in_udf: UdfRunner) -> ProbeResult:
    probe = _worker_probe()
    try:
        sc = spark.sparkContext
    except Exception:  # Spark Connect: only the DataFrame API reaches the workers
        return run_in_udf(spark, probe)
    properties = ("spark.jobGroup.id", "spark.job.description", "spark.job.interruptOnCancel")
    previous = {k: sc.getLocalProperty(k) for k in properties}
    sc.setJobGroup(JOB_GROUP, "deltamirror: can Spark's Python workers import deltamirror?")
    try:
        result: ProbeResult = sc.parallelize([0], 1).map(probe).collect()[0]
    finally:
        for k, v in previous.items():
            sc.setLocalProperty(k, v)  # None removes the property
    return result


def one_line_reason(exc: BaseException) -> str | None:
    """The line of a job failure that says why the worker did not start, if it is a known one."""
    text = str(exc)
    for pattern in (
        r'Cannot run program "[^"]*"[^\n]*',  # no such interpreter
        r"\[PYTHON_[A-Z_]+\][^\n]*",  # e.g. [PYTHON_VERSION_MISMATCH]
        r"most recent failure: Lost task [^\n]*?\): ([^\n]*)",  # the task's own error, any other
    ):
        found = re.search(pattern, text)
        if found:
            return found.group(found.lastindex or 0).strip()[:300]
    return None


__all__ = [
    "JOB_GROUP",
    "WORKER_MODULES",
    "Probe",
    "ProbeResult",
    "UdfRunner",
    "check_workers",
    "one_line_reason",
]
