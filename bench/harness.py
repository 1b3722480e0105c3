"""The measuring side of ``bench/run.py``: one contender per process, clocks, page cache, statistics.

Only the standard library at import time: a child process imports this module before the
contender's own imports, so that "after imports" means after the contender's imports only.

A contender is a function ``fn(clock, params) -> facts`` in a bench script. It calls
``clock.imported()`` after its imports, ``clock.start()`` and ``clock.stop()`` around the interval
its docstring defines, and returns what it saw (rows, files, ...) as a JSON-able dict. The parent
stamps the wall clock just before it spawns the child (``DMBENCH_SPAWNED_AT``), so that "from
process start" includes the interpreter's start, and reads the child's CPU time and peak RSS from
``wait4`` as well as from the child's own report.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
DATA = BENCH / ".data"
RESULTS = BENCH / "results"
SPAWNED_AT = "DMBENCH_SPAWNED_AT"


# --- a watcher in this process ----------------------------------------------------------------------


def committed_reader(bootstrap: str, topic: str, partition: int = 0) -> Any:
    """A read_committed confluent-kafka consumer of one partition from its beginning (its group
    keeps no offsets): how the benches see what a downstream reader would."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"dmbench-{uuid.uuid4().hex}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    consumer.assign([TopicPartition(topic, partition, -2)])
    return consumer


def run_watch_until(service: Any, done: Any, *, timeout_s: float, each: Any = None) -> bool:
    """Start ``service`` (a WatchService), wait until ``done`` (an Event) is set, then stop it.

    A watcher failure or ``timeout_s`` ends the bench in one line; ``each`` is called every 0.2 s
    meanwhile. Returns whether the watcher stopped within 60 s.
    """
    t0 = time.perf_counter()
    service.start()
    try:
        while not done.wait(0.2):
            if service._failure is not None:
                raise SystemExit(f"the watcher failed: {service._failure}")
            if time.perf_counter() - t0 > timeout_s:
                raise SystemExit(f"the watcher did not publish the table within {timeout_s:.0f} s")
            if each is not None:
                each()
    finally:
        service.request_stop()
        stopped = bool(service.wait(60))
        service.close()
    return stopped


# --- child side ------------------------------------------------------------------------------------


def cpu_s() -> float:
    """CPU seconds of this process, all threads (steadier than wall time on a shared machine)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def peak_rss_mb(pid: int | str = "self") -> float:
    """Peak RSS (``VmHWM``) in MiB: ru_maxrss survives fork+exec on Linux, VmHWM does not."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


class Clock:
    """The moments a contender reports: after its imports, start and stop of its timed interval."""

    def __init__(self) -> None:
        self.marks: dict[str, dict[str, float]] = {}

    def mark(self, name: str, *, perf: float | None = None, cpu: float | None = None) -> None:
        """Record ``name`` now, or at an earlier ``perf_counter`` reading (and CPU reading) given."""
        now_perf, now_wall = time.perf_counter(), time.time()
        at = now_perf if perf is None else perf
        self.marks[name] = {
            "perf": at,
            "wall": now_wall - (now_perf - at),
            "cpu": cpu_s() if cpu is None else cpu,
            "rss_mb": peak_rss_mb(),
        }

    def imported(self) -> None:
        self.mark("imported")

    def start(self) -> None:
        self.mark("start")

    def stop(self) -> None:
        self.mark("stop")


def _run_one(module: str, function: str, params: dict[str, Any]) -> dict[str, Any]:
    clock = Clock()
    fn = getattr(importlib.import_module(module), function)
    facts = fn(clock, params)
    for name in ("start", "stop"):
        if name not in clock.marks:
            raise SystemExit(f"{module}.{function} did not call clock.{name}()")
    clock.marks.setdefault("imported", clock.marks["start"])
    return {"facts": facts or {}, "marks": clock.marks, "peak_rss_mb": peak_rss_mb()}


def child_main(module: str, function: str, params_file: str, result_file: str) -> int:
    """Run one contender in this (fresh) process and write what it measured to ``result_file``."""
    sys.path.insert(0, str(BENCH))
    params = json.loads(Path(params_file).read_text())
    Path(result_file).write_text(json.dumps(_run_one(module, function, params)))
    return 0


def child_groups(specs: dict[str, tuple[str, dict[str, str]]], params_file: str, result_file: str) -> int:
    """Run the contenders of several groups one after the other in this process (``--quick`` smoke
    runs only: one JVM start for every Spark contender). ``specs``: group -> (module, {contender:
    function}); the parameters file holds each group's parameters; results by group and contender."""
    sys.path.insert(0, str(BENCH))
    params = json.loads(Path(params_file).read_text())
    results = {
        group: {name: _run_one(module, fn, params[group]) for name, fn in functions.items()}
        for group, (module, functions) in specs.items()
    }
    Path(result_file).write_text(json.dumps({"groups": results}))
    return 0


# --- parent side: bytecode ----------------------------------------------------------------------------


def compile_bytecode() -> str:
    """deltamirror's modules compiled to bytecode (``__pycache__`` beside them), as pip does when it
    installs the wheel: a user's ``deltamirror`` starts from bytecode. The editable install of a
    work tree has none when ``PYTHONDONTWRITEBYTECODE`` is set (as on the development machines and
    CI), and every contender process would compile deltamirror's sources again (about 0.3 s of CPU
    at the start of each run). Done in the parent, before any contender; the interpreter reads
    bytecode whatever that variable says. What was done, for the report."""
    import compileall
    import importlib.util

    spec = importlib.util.find_spec("deltamirror")  # finds the package, runs none of it
    where = list(spec.submodule_search_locations or []) if spec is not None else []
    ok = bool(where) and all(compileall.compile_dir(d, quiet=1, workers=1) for d in where)
    return (
        f"deltamirror compiled to bytecode before the runs ({', '.join(where)}), as pip installs it"
        if ok
        else f"deltamirror's bytecode could not be written ({', '.join(where) or 'package not found'})"
    )


# --- parent side: spawning ---------------------------------------------------------------------------


class ChildFailed(RuntimeError):
    pass


def spawn(
    argv: Sequence[str], params: dict[str, Any], *, timeout_s: float, label: str, log_dir: Path
) -> dict[str, Any]:
    """Run ``run.py --child ...`` (or ``--setup``) in a fresh process; its result with the parent's view.

    The child's stdout and stderr go to a log file under ``log_dir`` (the last lines are raised
    on failure). Returned: the child's result plus ``spawned_at``, ``exited_at`` and the child's
    ``rusage`` (CPU of the process and the children it waited for; ru_maxrss).
    """
    log_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="dmbench-") as tmp:
        params_file, result_file = Path(tmp) / "params.json", Path(tmp) / "result.json"
        params_file.write_text(json.dumps(params))
        log_file = log_dir / f"{label}.log"
        with open(log_file, "w") as log:
            env = dict(os.environ)
            spawned_at = time.time()
            env[SPAWNED_AT] = repr(spawned_at)
            proc = subprocess.Popen(
                [sys.executable, str(BENCH / "run.py"), *argv, str(params_file), str(result_file)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=str(REPO),
            )
            status, usage = _wait4(proc, timeout_s)
            exited_at = time.time()
        if status != 0 or not result_file.is_file():
            tail = log_file.read_text(errors="replace").strip().splitlines()[-8:]
            raise ChildFailed(f"{label} exited with {status}: " + " | ".join(tail))
        result: dict[str, Any] = json.loads(result_file.read_text())
    stamps = {
        "spawned_at": spawned_at,
        "exited_at": exited_at,
        "rusage_cpu_s": usage.ru_utime + usage.ru_stime,
        "rusage_maxrss_mb": usage.ru_maxrss / 1024,
    }
    for by_contender in result.get("groups", {}).values():
        for one in by_contender.values():
            one.update(stamps)
    result.update(stamps)
    return result


def _wait4(proc: subprocess.Popen[bytes], timeout_s: float) -> tuple[int, Any]:
    """Wait for ``proc`` (only it) with a time limit; its exit status and resource usage."""
    deadline = time.monotonic() + timeout_s
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid == proc.pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return proc.returncode, usage
        if time.monotonic() > deadline:
            proc.kill()
            _, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = -9
            return -9, usage
        time.sleep(0.005)


def measures(result: dict[str, Any]) -> dict[str, Any]:
    """The figures of one run from the child's marks and the parent's stamps."""
    marks = result["marks"]
    start, stop, imported = marks["start"], marks["stop"], marks["imported"]
    facts = result.get("facts", {})
    out = {
        "work_s": stop["perf"] - start["perf"],
        "from_start_s": stop["wall"] - result["spawned_at"],
        "after_imports_s": stop["wall"] - imported["wall"],
        "imports_s": imported["wall"] - result["spawned_at"],
        "work_cpu_s": stop["cpu"] - start["cpu"],
        "cpu_s": stop["cpu"],  # this process's CPU from its start to the end of the interval
        "process_cpu_s": result["rusage_cpu_s"],
        "exit_s": result["exited_at"] - result["spawned_at"],
        "peak_rss_mb": facts.get("peak_rss_mb", result["peak_rss_mb"]),
        "rss_after_imports_mb": imported["rss_mb"],
    }
    return out


# --- page cache ----------------------------------------------------------------------------------------


def files_under(paths: Iterable[str | Path]) -> list[Path]:
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            out.extend(f for f in sorted(p.rglob("*")) if f.is_file())
        elif p.is_file():
            out.append(p)
    return out


def evict(paths: Iterable[str | Path]) -> dict[str, Any]:
    """Drop these files from the page cache (``posix_fadvise(DONTNEED)``, file by file).

    Only the inputs: the libraries stay cached, and so do other people's files on a shared machine
    (``--drop-caches`` drops everything instead, where the kernel lets us). Returns how many bytes
    were evicted and, when ``fincore`` exists, how many stayed resident.
    """
    files = files_under(paths)
    size = 0
    for f in files:
        try:
            fd = os.open(f, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            size += os.fstat(fd).st_size
        finally:
            os.close(fd)
    return {"files": len(files), "bytes": size, "resident_after_bytes": resident_bytes(files)}


def resident_bytes(files: Sequence[Path]) -> int | None:
    """Bytes of ``files`` in the page cache (util-linux ``fincore``), or None without it."""
    tool = shutil.which("fincore")
    if tool is None or not files:
        return None
    total = 0
    for i in range(0, len(files), 500):
        done = subprocess.run(
            [tool, "--bytes", "--noheadings", "--raw", "--output", "RES", *map(str, files[i : i + 500])],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            return None
        total += sum(int(x) for x in done.stdout.split() if x.isdigit())
    return total


def prewarm(paths: Iterable[str | Path]) -> int:
    """Read these files once so that they are in the page cache (the warm case)."""
    size = 0
    for f in files_under(paths):
        with open(f, "rb") as fh:
            while chunk := fh.read(1 << 22):
                size += len(chunk)
    return size


def drop_all_caches() -> str | None:
    """``sync; echo 3 > /proc/sys/vm/drop_caches``; None when done, else why it could not be."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as fh:
            fh.write("3\n")
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


# --- statistics -----------------------------------------------------------------------------------------


def spread(values: Sequence[float]) -> dict[str, Any]:
    """Median, quartiles (inclusive method), min and max of ``values``."""
    xs = sorted(v for v in values if v is not None and not math.isnan(v))
    if not xs:
        return {"n": 0}
    if len(xs) >= 2:
        q1, _, q3 = statistics.quantiles(xs, n=4, method="inclusive")
    else:
        q1 = q3 = xs[0]
    return {"n": len(xs), "median": statistics.median(xs), "q1": q1, "q3": q3, "min": xs[0], "max": xs[-1]}


# --- machine and versions ---------------------------------------------------------------------------------


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def machine() -> dict[str, Any]:
    cpu_model = ""
    mem_gb = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_gb = round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    return {
        "cpus": os.cpu_count(),
        "cpu_model": cpu_model,
        "memory_gb": mem_gb,
        "platform": platform.platform(),
    }


def versions(kafka_version: str | None = None) -> dict[str, str | None]:
    """The versions every figure depends on (packages from their metadata, not imported)."""
    from importlib.metadata import PackageNotFoundError, version

    def of(name: str) -> str | None:
        try:
            return version(name)
        except PackageNotFoundError:
            return None

    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in ("deltamirror", "pyarrow", "deltalake", "pyspark", "confluent-kafka", "orjson", "matplotlib"):
        out[name] = of(name)
    out["delta-spark"] = of("delta-spark") or _delta_spark_jar()
    try:
        import confluent_kafka

        out["librdkafka"] = confluent_kafka.libversion()[0]
    except ImportError:
        out["librdkafka"] = None
    out["kafka"] = kafka_version
    out["git"] = _git_describe()
    return out


def _delta_spark_jar() -> str | None:
    """The delta-spark jar the Spark contenders load (Maven coordinates; there is no pip package)."""
    sys.path.insert(0, str(REPO / "tests"))
    try:
        from support.spark import DELTA_SPARK_PACKAGE

        return str(DELTA_SPARK_PACKAGE.rsplit(":", 1)[-1]) + f" ({DELTA_SPARK_PACKAGE}, jar)"
    except Exception:
        return None
    finally:
        sys.path.remove(str(REPO / "tests"))


def _git_describe() -> str | None:
    try:
        head = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
    except OSError:
        return None
    return f"{head}{' + uncommitted changes' if dirty else ''}" if head else None
