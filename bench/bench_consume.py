"""``deltamirror consume-snapshot`` of a 1M-file table beside a raw confluent-kafka consumer of the same
records: contenders for ``bench/run.py`` (each runs in its own process, see harness.py).

The topic (made in ``setup``, not timed): the synthetic table of ``make_checkpoint_table`` (1M files
in a checkpoint at version C, then ``commits`` JSON commits) is mirrored by the watcher into fresh
topics: an initial snapshot at version C (the table's log holds only the checkpoint then: its
files are hard links), then the commits, linked in (in order) once the snapshot is published, so
the actions topic holds a 1M-file snapshot and then every later version, as a topic a consumer
meets in production does. A first, untimed ``consume-snapshot --state-dir`` reads it all (it warms
the broker's page cache and leaves the saved state the restart contender loads).

Contenders, each timed from process start (the parent stamps the wall clock just before it spawns
the process) to:

- ``deltamirror``: the line of the last version applied, as ``deltamirror consume-snapshot
  --bootstrap-servers B --topic T --once --state-dir <fresh dir>`` prints it (the command run
  in-process by its own ``main``; state persisted at the default intervals, the final save after
  the last version is not in the interval but in ``exit_s``);
- ``raw``: the last record decoded: a confluent-kafka ``Consumer`` with the fetch settings of
  deltamirror's ``MirrorConsumer`` (read_committed, fetch.wait.max.ms 10, partition EOF), the
  batched ``consume(num_messages=1000)``, ``orjson.loads`` of every value, until every partition
  reported its end;
- ``restart``: ``consume-snapshot --once`` over the state the setup's run saved: loading the
  1M-file state and reading the topic from the saved position to its end, to the process's exit.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
DATA = BENCH / ".data"
sys.path.insert(0, str(BENCH))


# --- setup ------------------------------------------------------------------------------------------


def _source_table(manifest: dict[str, Any], root: Path) -> tuple[Path, list[Path]]:
    """A table folder holding only the checkpoint (hard links); the later commits to link in."""
    source = Path(manifest["root"]) / "_delta_log"
    shutil.rmtree(root, ignore_errors=True)
    log = root / "_delta_log"
    log.mkdir(parents=True)
    os.link(manifest["checkpoint"], log / Path(manifest["checkpoint"]).name)
    commits = sorted(
        p for p in source.glob("*.json") if int(p.stem) > manifest["checkpoint_version"] and p.stem.isdigit()
    )
    return log, commits


def setup(clock: Any, params: dict[str, Any]) -> dict[str, Any]:
    """Mirror the table into fresh topics (snapshot, then every commit); one untimed full read."""
    from bench_producer import BenchMetrics
    from make_checkpoint_table import ensure_table

    from deltamirror.producer import WatchConfig
    from deltamirror.producer.service import WatchService

    clock.start()
    data_dir = Path(params.get("data_dir", DATA))
    manifest = ensure_table(params["files"], params["commits"], data_dir=data_dir)
    root = data_dir / f"consume-{params['files']}-{params['commits']}"
    log, commits = _source_table(manifest, root)
    name = f"dmbench-consume-{uuid.uuid4().hex[:8]}"
    topics = {"actions": f"{name}.actions", "commits": f"{name}.commits", "progress": f"{name}.progress"}
    cfg = WatchConfig.model_validate(
        {
            "kafka": {"bootstrap_servers": params["bootstrap"]},
            "tables": [
                {
                    "uri": str(root),
                    "snapshot_mode": "initial",
                    "actions_topic": topics["actions"],
                    "commits_topic": topics["commits"],
                    "poll_interval_s": 0.2,
                }
            ],
            "progress_topic": topics["progress"],
            "transactional_id_prefix": name,
        }
    )
    last = manifest["version"]
    metrics = BenchMetrics(target_version=last)
    service = WatchService(cfg, metrics=metrics)
    service.start()
    t0 = time.perf_counter()
    try:
        linked = False
        while not metrics.done.wait(0.2):
            if service._failure is not None:
                raise SystemExit(f"the watcher failed: {service._failure}")
            if time.perf_counter() - t0 > 900:
                raise SystemExit("the watcher did not publish the consume table within 900 s")
            if not linked and manifest["checkpoint_version"] in metrics.published_wall:
                for commit in commits:  # in order, once the snapshot is published
                    os.link(commit, log / commit.name)
                linked = True
    finally:
        service.request_stop()
        service.wait(60)
        service.close()
    published_s = time.perf_counter() - t0
    state_dir = data_dir / f"{name}-state"
    lines = _consume_snapshot(params["bootstrap"], topics["actions"], state_dir, None)
    if not lines or lines[-1].get("version") != last or lines[-1].get("files") != manifest["active_files"]:
        raise SystemExit(f"the setup's consume-snapshot ended at {lines[-1] if lines else None}")
    clock.stop()
    return {
        **params,
        "table": manifest,
        "topics": topics,
        "last_version": last,
        "active_files": manifest["active_files"],
        "versions_in_topic": len(lines),
        "publish_s": published_s,
        "state_dir": str(state_dir),
        "inputs": [],
        "cleanup": {"topics": list(topics.values()), "dirs": [str(state_dir), str(root)]},
    }


class _Lines(io.TextIOBase):
    """stdout of the command, parsed as JSON lines; ``on_line`` sees each when it is written."""

    def __init__(self, on_line: Any = None) -> None:
        self.lines: list[dict[str, Any]] = []
        self._partial = ""
        self._on_line = on_line

    def write(self, text: str) -> int:
        import json

        self._partial += text
        while "\n" in self._partial:
            line, self._partial = self._partial.split("\n", 1)
            if line.strip():
                parsed = json.loads(line)
                self.lines.append(parsed)
                if self._on_line is not None:
                    self._on_line(parsed)
        return len(text)


def _consume_snapshot(
    bootstrap: str, topic: str, state_dir: Path | None, on_line: Any, group: str | None = None
) -> list[dict[str, Any]]:
    from deltamirror.cli.main import main

    argv = ["consume-snapshot", "--bootstrap-servers", bootstrap, "--topic", topic, "--once"]
    if state_dir is not None:
        # a state directory records the group that filled it (a new one gets a group of its own)
        # and refuses another: a restart over it must name none, or the same
        argv += ["--state-dir", str(state_dir)]
        if group is not None:
            argv += ["--group-id", group]
    else:
        argv += ["--group-id", group or f"dmbench-{uuid.uuid4().hex[:10]}"]
    out = _Lines(on_line)
    with contextlib.redirect_stdout(out):
        code = main(argv)
    if code != 0:
        raise SystemExit(f"consume-snapshot exited with {code}")
    return out.lines


# --- contenders -------------------------------------------------------------------------------------


def _import_as_the_command_does() -> None:
    """The modules ``consume-snapshot`` runs on, imported as the command imports them (pyarrow with
    NumPy hidden: :func:`deltamirror.core.compute.keep_numpy_out_of_pyarrow`), so that the
    ``imported`` mark splits the timed interval without changing what the process imports."""
    from deltamirror.core.compute import keep_numpy_out_of_pyarrow

    keep_numpy_out_of_pyarrow()
    import deltamirror.consumer.snapshot  # noqa: F401


def consume_deltamirror(clock: Any, params: dict[str, Any]) -> dict[str, Any]:
    """Process start -> the line of the last version applied (``consume-snapshot --once --state-dir``)."""
    _import_as_the_command_does()
    clock.imported()
    clock.start()
    last = params["last_version"]

    def on_line(line: dict[str, Any]) -> None:
        if line.get("version") == last and "stop" not in clock.marks:
            clock.stop()

    state_dir = Path(tempfile.mkdtemp(prefix="dmbench-consume-state-", dir=params.get("data_dir", DATA)))
    try:
        lines = _consume_snapshot(params["bootstrap"], params["topics"]["actions"], state_dir, on_line)
    finally:
        shutil.rmtree(state_dir, ignore_errors=True)
    final = lines[-1] if lines else {}
    ok = final.get("version") == last and final.get("files") == params["active_files"]
    return {"versions": len(lines), "files": final.get("files"), "version": final.get("version"), "ok": ok}


def consume_raw(clock: Any, params: dict[str, Any]) -> dict[str, Any]:
    """Process start -> the last record decoded (confluent-kafka, MirrorConsumer's fetch settings)."""
    import orjson
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    clock.imported()
    clock.start()
    topic = params["topics"]["actions"]
    consumer = Consumer(
        {
            "bootstrap.servers": params["bootstrap"],
            "fetch.wait.max.ms": 10,
            "group.id": f"dmbench-raw-{uuid.uuid4().hex[:10]}",
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
        }
    )
    partitions = sorted(consumer.list_topics(topic, timeout=30).topics[topic].partitions)
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
    pending = set(partitions)
    records = size = 0
    loads = orjson.loads
    while pending:
        for msg in consumer.consume(num_messages=1000, timeout=0.05):
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    pending.discard(msg.partition())
                    continue
                raise SystemExit(f"consume failed: {err}")
            pending.add(msg.partition())
            value = msg.value() or b""
            loads(value)
            records += 1
            size += len(value)
    clock.stop()
    consumer.close()
    return {"records": records, "bytes": size, "ok": records > 0}


def consume_restart(clock: Any, params: dict[str, Any]) -> dict[str, Any]:
    """Process start -> exit of ``consume-snapshot --once`` over the saved 1M-file state (nothing new)."""
    _import_as_the_command_does()
    clock.imported()
    clock.start()
    lines = _consume_snapshot(
        params["bootstrap"], params["topics"]["actions"], Path(params["state_dir"]), None
    )
    clock.stop()
    final = lines[-1] if lines else {}
    # a restart prints again the versions since the last save (none here) or nothing at all
    ok = not lines or final.get("version") == params["last_version"]
    return {"versions": len(lines), "ok": ok}
