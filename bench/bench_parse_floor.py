"""What validating the producer's log must cost at least: JSON parsers beside deltamirror's boundary.

A group of ``bench/run.py`` (``python bench/run.py --only parse-floor``, or ``make bench
ONLY=parse-floor``): the producer bench's log (bench_producer.py's table: 200 commits of 1,000 add
actions, ~900 bytes a line, mostly the ``stats`` string; ~180 MB) read by each contender in its
own process, interleaved, the order turning each round. The subject is the producer's scan; the
floors are what any strict check of the same bytes has to do at least:

  read          every commit file's bytes (TableStorage.read_bytes): the I/O floor
  utf8          read, then decode as UTF-8 (one of the things strict JSON requires)
  arrow-json    read, then pyarrow.json.read_json (C++, types inferred, all cores)
  parse         read, then pydantic_core.from_json per line: parsing alone, no field checked
  boundary      read, then deltamirror.core.actions.read_actions: the log boundary itself

For a scan of a revision that did not validate, see bench/compare_revisions.py (workload ``scan``).
Every contender reports the bytes it read.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parent / ".data" / "producer"


def setup(clock: Any, params: dict[str, Any]) -> dict[str, Any]:
    """The producer bench's table (made once and cached), its commit files as the inputs."""
    from bench_producer import ensure_table

    from deltamirror.core.storage import TableStorage

    clock.start()
    root = str(
        ensure_table(params["actions"], params["versions"], Path(params.get("data_dir", DATA)))["root"]
    )
    storage = TableStorage(root)
    commits = [storage.log_file(f.name) for f in storage.list_log() if f.name.endswith(".json")]
    clock.stop()
    return {
        **params,
        "path": root,
        "commits": commits,
        "inputs": [c.removeprefix("file://") for c in commits],
    }


def _commits(params: dict[str, Any]) -> Any:
    """(path, bytes) of every commit file, read through the table's storage."""
    from deltamirror.core.storage import TableStorage

    storage = TableStorage(params["path"])
    for path in params["commits"]:
        yield path, storage.read_bytes(path)


def _timed(clock: Any, params: dict[str, Any], per_commit: Any) -> dict[str, Any]:
    clock.imported()
    clock.start()
    size = 0
    for path, data in _commits(params):
        per_commit(path, data)
        size += len(data)
    clock.stop()
    return {"bytes": size}


def floor_read(clock: Any, params: dict[str, Any]) -> dict[str, Any]:
    """Timed: reading every commit file (``TableStorage.read_bytes``)."""
    return _timed(clock, params, lambda path, data: None)


def floor_utf8(clock: Any, params: dict[str, Any]) -> dict[str, Any]:
    """Timed: reading every commit file and decoding it as UTF-8."""
    return _timed(clock, params, lambda path, data: data.decode("utf-8"))


def floor_arrow_json(clock: Any, params: dict[str, Any]) -> dict[str, Any]:
    """Timed: reading every commit file and ``pyarrow.json.read_json`` of it (types inferred, threads)."""
    import pyarrow.json as pj

    options = pj.ReadOptions(use_threads=True, block_size=1 << 20)
    return _timed(clock, params, lambda path, data: pj.read_json(io.BytesIO(data), read_options=options))


def floor_parse(clock: Any, params: dict[str, Any]) -> dict[str, Any]:
    """Timed: reading every commit file and ``pydantic_core.from_json`` of each line (no field checked)."""
    import pydantic_core

    return _timed(clock, params, lambda path, data: list(map(pydantic_core.from_json, data.splitlines())))


def boundary(clock: Any, params: dict[str, Any]) -> dict[str, Any]:
    """Timed: reading every commit file and ``read_actions`` over it (deltamirror's log boundary)."""
    from deltamirror.core.actions import read_actions

    return _timed(clock, params, lambda path, data: list(read_actions(data, table=params["path"], file=path)))


def scan_deltamirror(clock: Any, params: dict[str, Any]) -> dict[str, Any]:
    """Timed: ``iter_event_values`` over the whole log, every value consumed (the producer's work
    without Kafka: read, validate, summarize, encode)."""
    from deltamirror.producer.publishing.offline_events import iter_event_values

    clock.imported()
    clock.start()
    records = sum(1 for _ in iter_event_values(params["path"]))
    clock.stop()
    return {"records": records}
