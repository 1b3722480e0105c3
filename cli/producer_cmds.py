"""``watch``, ``events``, ``schema`` and ``demo``: the producer side of the command line."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from .common import OUTPUT_HELP, add_table_argument, parse_storage_options
from .flags import ENVIRONMENT_HELP, Flag, given_settings
from .progress import add_progress_argument

#: ``SnapshotMode`` of deltamirror.producer.settings, spelled out so that --help imports no pydantic
SNAPSHOT_MODES = ("initial", "latest", "from-version", "from-timestamp", "when-needed")


#: ``--config FILE`` is no setting: it is the file the others go over
CONFIG = "config"

#: every argument of ``watch`` but --no-progress, in --help order
WATCH_FLAGS: tuple[Flag, ...] = (
    Flag("tables", (), "table locations (paths or fsspec URLs)", "TABLE"),
    Flag(
        "discover",
        ("--discover",),
        "mirror every Delta table under this prefix, as tables come and go; repeatable",
        "URI",
        repeatable=True,
    ),
    Flag("bootstrap_servers", ("--bootstrap-servers",), "Kafka brokers, host:port[,host:port]", "HOSTS"),
    Flag(CONFIG, ("--config",), "YAML or TOML configuration (tables, credentials, Kafka)", "FILE"),
    Flag(
        "snapshot_mode",
        ("--snapshot-mode",),
        "where to start a table without progress",
        choices=SNAPSHOT_MODES,
    ),
    Flag(
        "from_version",
        ("--from-version",),
        "with from-version: the first version (not with --discover: a version names a point in "
        "one table's log; refused)",
        "N",
        int,
    ),
    Flag(
        "from_timestamp",
        ("--from-timestamp",),
        "with from-timestamp: ISO-8601 or epoch ms (with --discover: every table found publishes "
        "its commits from then on)",
        "TS",
    ),
    Flag(
        "poll_interval_s",
        ("--poll-interval",),
        "seconds between log polls (default 1; 30 for a local log that file notifications watch)",
        "S",
        float,
    ),
    Flag("progress_topic", ("--progress-topic",), "compacted progress topic", "TOPIC"),
    Flag(
        "transactional_id_prefix",
        ("--transactional-id-prefix",),
        "prefix of the transactional.id",
        "PREFIX",
    ),
    Flag("heartbeat_interval_s", ("--heartbeat-interval",), "heartbeat an idle table every S s", "S", float),
    Flag(
        "group",
        ("--group",),
        "share the tables with every watcher started with this group name: each table runs on "
        "one live instance and moves when one stops or joins (config group: {name, shards, "
        "session_timeout_ms})",
        "NAME",
    ),
    Flag(
        "row_changes",
        ("--row-changes",),
        "also publish one Debezium-style record per changed row on deltamirror.<name>.changes, for "
        "every table, discovered ones included (config row_changes: {key_columns, format, "
        "tombstones} per table or discover prefix)",
        switch=True,
    ),
    Flag(
        "row_format",
        ("--row-format",),
        "with row changes: the records' format on every table: json (default), json-schema (Kafka "
        "Connect's JsonConverter with schemas), avro or protobuf (Confluent wire format through a "
        "Schema Registry: needs --schema-registry-url; docs/avro.md, docs/protobuf.md; config "
        "row_changes: {format})",
        choices=("json", "json-schema", "avro", "protobuf"),
    ),
    Flag(
        "schema_registry_url",
        ("--schema-registry-url",),
        "with --row-format avro or protobuf: the Schema Registry's URL (credentials in the configuration: "
        "row_changes: {registry: {url, username, password}})",
        "URL",
    ),
    Flag(
        "subject_name_strategy",
        ("--subject-name-strategy",),
        "with --row-format avro or protobuf: the subjects schemas are registered under: topic "
        "(<topic>-key, <topic>-value; default), record (the record's or message's full name) or "
        "topic-record",
        choices=("topic", "record", "topic-record"),
    ),
    Flag(
        "net_catch_up",
        ("--net-catch-up",),
        "with --snapshot-mode from-version or from-timestamp and row changes: publish the versions up "
        "to the table's current one as net row changes (one event per changed row, in one "
        "transaction with their actions), then every later version as usual (config "
        "row_changes: {net_catch_up: true})",
        switch=True,
    ),
    Flag(
        "wait_for_table",
        ("--wait-for-table",),
        "wait for a TABLE that does not exist yet (no _delta_log with a commit) instead of refusing it "
        "at start (config wait_for_table per table)",
        switch=True,
    ),
    Flag(
        "workers",
        ("--workers",),
        "threads serving every table: a table runs on one at a time, in order; an idle table costs "
        "none (default 4 per CPU, at least 4; config workers)",
        "N",
        int,
    ),
    Flag("metrics_port", ("--metrics-port",), "serve /metrics and /healthz", "PORT", int),
    Flag(
        "metrics_host",
        ("--metrics-host",),
        "address of the metrics server (127.0.0.1); with --metrics-port",
        "HOST",
    ),
    Flag(
        "storage_options",
        ("-S", "--storage-option"),
        "fsspec storage option for every table (credentials, endpoint); repeatable; refused with a "
        "local table or prefix (it takes none)",
        "KEY=VALUE",
        repeatable=True,
        convert=parse_storage_options,
    ),
)


def _add_watch(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "watch",
        help="mirror tables into Kafka (exactly once, in order)",
        description="Mirror one or many Delta tables into Kafka: one record per action on the actions "
        "topic, one summary per version on the commits topic, progress on a compacted topic. Flags "
        "override the configuration file. Stops cleanly on SIGTERM/SIGINT (exit 0); exits 1 when "
        "another watcher takes over a table (fenced) or the broker fails for good; with --group, "
        "a fenced table is only released here (the group moved it). Logs are JSON "
        "lines on stderr; on a terminal, an initial snapshot also shows the actions published.",
        epilog=ENVIRONMENT_HELP + " (The positional TABLE and --no-progress have no variable.)",
    )
    for flag in WATCH_FLAGS:
        flag.add_to(p)
    add_progress_argument(p)
    p.set_defaults(handler=cmd_watch, long_running=True)


def _add_events(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "events",
        help="print the action events the watcher would publish, without Kafka",
        description="Print, as JSON lines, exactly the action envelopes `deltamirror watch` publishes "
        "for the versions in range (no snapshot, no summaries, no heartbeats).",
    )
    add_table_argument(p, reads_named_files=False)  # commit files only: nothing outside to allow
    p.add_argument("--starting-version", type=int, metavar="N", help="first version (default: the earliest)")
    p.add_argument("--ending-version", type=int, metavar="M", help="last version (default: the latest)")
    p.add_argument("-o", "--output", metavar="PATH", help=OUTPUT_HELP)
    p.set_defaults(handler=cmd_events)


def _add_schema(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "schema",
        help="print the JSON Schema of the events",
        description="Print the JSON Schema of the records deltamirror publishes (an action event at the "
        "root; commit summaries, heartbeats, table-replaced announcements and progress records under "
        "$defs).",
    )
    p.set_defaults(handler=cmd_schema)


def _add_demo(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "demo",
        help="start a local Kafka, mirror a small demo table, commit to it and print what a subscriber sees",
        description="Start the local broker (or use KAFKA_BOOTSTRAP_SERVERS), create a demo Delta table, "
        "mirror it with the watcher, make an append, an update and a delete, and print the events a "
        "read_committed subscriber receives; the table is left in place, and the last lines say "
        "where and how to look at it. Needs Java 17+ (for the broker) and the deltalake package.",
    )
    p.add_argument("--dir", metavar="DIR", help="where to create the demo table (default: a temp dir)")
    p.add_argument(
        "--port",
        type=int,
        help="port of the local broker (default 9092; refused with KAFKA_BOOTSTRAP_SERVERS, which names the broker)",
    )
    p.add_argument(
        "--keep-broker",
        action="store_true",
        help="leave the local broker running afterwards (refused with KAFKA_BOOTSTRAP_SERVERS: no local broker)",
    )
    p.set_defaults(handler=cmd_demo, long_running=True)


#: each command of this module and what adds its parser (build_parser takes the one that runs)
PARSERS = {
    "watch": _add_watch,
    "events": _add_events,
    "schema": _add_schema,
    "demo": _add_demo,
}


def cmd_schema(args: argparse.Namespace) -> int:
    from deltamirror.mirror.records.events import json_schema_text

    sys.stdout.write(json_schema_text())
    return 0


def cmd_events(args: argparse.Namespace) -> int:
    from deltamirror.producer.publishing.offline_events import iter_event_values

    from .output import open_output

    with open_output(args.output) as out:
        for value in iter_event_values(
            args.table,
            parse_storage_options(args.storage_option),
            starting_version=args.starting_version,
            ending_version=args.ending_version,
        ):
            out.write(value)
            out.write(b"\n")
    return 0


def cmd_watch(args: argparse.Namespace) -> int:
    from deltamirror.core.errors import ConfigError
    from deltamirror.producer.config_file import load_config_data
    from deltamirror.producer.service import run_watch
    from deltamirror.producer.settings import merge_overrides
    from deltamirror.producer.tailing.snapshot_events import ProgressBar

    ProgressBar.shown = not args.no_progress

    # The same flags, by the same rules, over a configuration file or over nothing: a flag given
    # wins over its DELTAMIRROR_* variable, and either over the file; an unset one (no table) leaves
    # the file's setting, or the default (see merge_overrides).
    overrides, names = given_settings(WATCH_FLAGS, args)
    config = overrides.pop(CONFIG, None)
    if config:  # the file and the flags merged first, then validated once
        cfg = merge_overrides(load_config_data(config), overrides, source=config, names=names)
    elif not overrides.get("bootstrap_servers"):
        raise ConfigError("--bootstrap-servers is required without --config")
    else:
        cfg = merge_overrides(None, overrides, names=names)
    return run_watch(cfg)


def cmd_demo(args: argparse.Namespace) -> int:
    import os

    from deltamirror.core.errors import EnvironmentMissingError

    try:
        import deltalake  # noqa: F401
    except ImportError:
        raise EnvironmentMissingError(
            "the demo writes its table with the deltalake package: pip install deltalake"
        ) from None
    import threading

    from deltamirror.ops.stopping import installed

    # SIGTERM/SIGINT end the demo as Ctrl-C always did: its broker and watcher are stopped first
    stop = threading.Event()
    stops = installed()
    if stops is not None:
        stops.on_stop(lambda now: stop.set())
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    broker = None
    started_here = False
    if bootstrap:
        from deltamirror.core.errors import InvalidArgumentError

        for flag, given in (("--port", args.port is not None), ("--keep-broker", args.keep_broker)):
            if given:
                raise InvalidArgumentError(
                    f"{flag} is for the local broker the demo starts; KAFKA_BOOTSTRAP_SERVERS names "
                    "another, which the demo uses instead"
                )
    else:
        from deltamirror.devkafka.broker import LocalKafka

        args.port = 9092 if args.port is None else args.port
        broker = LocalKafka(port=args.port)
        started_here = not broker.status()["running"]
        _say(f"starting a local Kafka broker on 127.0.0.1:{args.port} (the first run downloads its jars)...")
        bootstrap = broker.start()
    try:
        return _demo(bootstrap, args.dir, stop)
    finally:
        if broker is not None and started_here and not args.keep_broker:
            _say("stopping the local Kafka broker")
            broker.stop()


def _say(text: str) -> None:
    print(f"# {text}", file=sys.stderr, flush=True)


def _demo(bootstrap: str, directory: str | None, stop: Any) -> int:
    import logging
    import tempfile
    import uuid

    from deltamirror.producer.log_format import configure_logging

    configure_logging(logging.WARNING)
    root = Path(directory) if directory else Path(tempfile.mkdtemp(prefix="deltamirror-demo-"))
    path = root / f"orders_{uuid.uuid4().hex[:6]}"
    _say(f"creating the demo table {path} (version 0: three orders; change data feed on)")
    try:
        return _run_demo(bootstrap, path, stop)
    finally:
        if (path / "_delta_log").is_dir():
            print(demo_epilogue(str(path)), flush=True)


def demo_epilogue(path: str) -> str:
    """Where the demo left its table, with commands that run as printed (the table outlives the demo).

    The program is named as this shell can run it: ``deltamirror`` when that is on PATH and is this
    installation, else its path (``.venv/bin/deltamirror`` after ``make``).
    """
    import shlex

    quoted = shlex.quote(path)
    program = demo_program()
    lines = [
        f"the demo table is left at {path}; look at it with:",
        f"  {program} history {quoted}",
        f"  {program} changes {quoted} --starting-version 0 --format csv",
        f"  {program} events {quoted}",
    ]
    if program != "deltamirror":
        lines.append(
            f"(or put deltamirror on your PATH: source {shlex.quote(str(_venv_bin().parent))}/bin/activate)"
        )
    return "\n".join(lines)


def _venv_bin() -> Path:
    """The folder of this interpreter: where its ``deltamirror`` script is (not resolved: a venv's
    python is a link to the interpreter it was made from)."""
    return Path(sys.executable).parent


def demo_program() -> str:
    """How to run this deltamirror from the current directory, as a shell word (or two)."""
    import os
    import shlex
    import shutil

    script = _venv_bin() / "deltamirror"
    if not (script.is_file() and os.access(script, os.X_OK)):  # a bare checkout: no entry point
        return f"{shlex.quote(sys.executable)} -m deltamirror.cli.main"
    found = shutil.which("deltamirror")
    if found is not None and Path(found).resolve() == script.resolve():
        return "deltamirror"
    try:
        return shlex.quote(str(script.relative_to(Path.cwd())))
    except ValueError:
        return shlex.quote(str(script))


def _orders(rows: list[tuple[int, str, str, str, Any]]) -> Any:
    """Rows of the demo table as Arrow."""
    from decimal import Decimal

    import pyarrow as pa

    schema = pa.schema(
        [
            pa.field("order_id", pa.int64()),
            pa.field("customer", pa.string()),
            pa.field("amount", pa.decimal128(10, 2)),
            pa.field("status", pa.string()),
            pa.field("order_date", pa.date32()),
        ]
    )
    cols = list(zip(*rows, strict=True))
    return pa.table(
        [
            pa.array(cols[0], pa.int64()),
            pa.array(cols[1], pa.string()),
            pa.array([Decimal(a) for a in cols[2]], pa.decimal128(10, 2)),
            pa.array(cols[3], pa.string()),
            pa.array(cols[4], pa.date32()),
        ],
        schema=schema,
    )


def write_demo_table(path: Path) -> None:
    """Version 0 of the demo table: three orders, with the change data feed on."""
    from datetime import date

    from deltalake import write_deltalake

    write_deltalake(
        str(path),
        _orders(
            [
                (1, "ada", "19.99", "placed", date(2026, 1, 5)),
                (2, "grace", "5.00", "placed", date(2026, 1, 5)),
                (3, "linus", "42.50", "placed", date(2026, 1, 6)),
            ]
        ),
        configuration={"delta.enableChangeDataFeed": "true"},
    )


def commit_demo_changes(path: Path) -> None:
    """Versions 1 to 3 of the demo table: an append, an update, a delete."""
    from datetime import date

    from deltalake import DeltaTable, write_deltalake

    _say("version 1: append two orders")
    write_deltalake(
        str(path),
        _orders(
            [
                (4, "barbara", "12.00", "placed", date(2026, 1, 7)),
                (5, "edsger", "7.25", "placed", date(2026, 1, 7)),
            ]
        ),
        mode="append",
    )
    _say("version 2: update order 1 to shipped")
    DeltaTable(str(path)).update(updates={"status": "'shipped'"}, predicate="order_id = 1")
    _say("version 3: delete order 2")
    DeltaTable(str(path)).delete("order_id = 2")


def _run_demo(bootstrap: str, path: Path, stop: Any) -> int:
    import json
    import time

    from deltamirror.mirror.kafka.connection import KafkaConnectionReporter
    from deltamirror.mirror.kafka.consumer import MirrorConsumer
    from deltamirror.producer.service import WatchService
    from deltamirror.producer.settings import WatchConfig

    write_demo_table(path)
    cfg = WatchConfig.model_validate(
        {
            "kafka": {"bootstrap_servers": bootstrap},
            "tables": [{"uri": str(path), "snapshot_mode": "initial", "poll_interval_s": 0.2}],
        }
    )
    topics = cfg.tables[0].topics()
    service = WatchService(cfg)
    _say(f"mirroring it into {topics.actions} and {topics.commits} (snapshot first, then every commit)")
    service.start()
    reporter = KafkaConnectionReporter(cfg.kafka.bootstrap_servers)  # librdkafka's lines: logged, not printed
    consumer = MirrorConsumer({**cfg.kafka.librdkafka_config(), **reporter.client_config()}, purpose="demo")
    try:
        ready = time.monotonic() + 60
        while not service.pipelines[0].ready.wait(0.2):
            if stop.is_set():
                raise KeyboardInterrupt
            if time.monotonic() >= ready:
                raise RuntimeError("the watcher did not start within 60 s")
        consumer.assign([(topics.actions, 0, None)])
        print("a read_committed subscriber of", topics.actions, "receives:")
        commit_demo_changes(path)
        deadline = time.monotonic() + 60
        done = False
        for batch in consumer.batches(until_end=False, poll_s=0.5, stop=stop):
            for record in batch:
                event = json.loads(record.value or b"{}")
                print(_describe_event(event), flush=True)
                done = event["version"] == 3 and event["index"] + 1 == event["count"]
                if done:
                    break
            if done or time.monotonic() >= deadline:
                break
        if stop.is_set():
            raise KeyboardInterrupt
        if not done:
            raise RuntimeError("the demo did not receive every event within 60 s")
    finally:
        consumer.close()
        service.request_stop()
        service.wait(30)
        service.close()
    _say("done: the watcher stopped cleanly")
    return 0


def _describe_event(event: dict[str, Any]) -> str:
    """One compact line per event: version, position, type and what the action says."""
    import json

    from deltamirror.core.timestamps import format_iso

    action = event.get("action") or {}
    kind = event["type"]
    detail = ""
    if kind in ("add", "remove", "cdc"):
        detail = str(action.get("path", ""))[:48]
        stats = action.get("stats")
        if isinstance(stats, str):
            rows = json.loads(stats).get("numRecords")
            if rows is not None:
                detail += f"  {rows} rows"
        if action.get("size") is not None:
            detail += f"  {action['size']} B"
    elif kind == "commitInfo":
        detail = str(action.get("operation", ""))
        params = action.get("operationParameters") or {}
        if "predicate" in params:
            detail += f" {params['predicate']}"
    elif kind == "metaData":
        fields = json.loads(action.get("schemaString") or "{}").get("fields", [])
        detail = "columns " + ", ".join(f["name"] for f in fields)
    elif kind == "protocol":
        detail = f"reader {action.get('minReaderVersion')} writer {action.get('minWriterVersion')}"
    where = "snapshot" if event.get("snapshot") else "commit  "
    end = "  (snapshot complete)" if event.get("snapshotEnd") else ""
    return (
        f"v{event['version']} {where} {event['index'] + 1}/{event['count']}  {kind:<10} {detail}{end}"
        f"  @{format_iso(event['commitTimestamp'])}"
    )
