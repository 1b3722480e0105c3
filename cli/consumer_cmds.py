"""``consume-snapshot``: the consumer side of the command line."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "consume-snapshot",
        help="keep the active files of every mirrored table, printing each applied version",
        description="Read an actions topic (read_committed) and keep each table's active files, "
        "applying a version when its last action arrives and replacing the state on a snapshot. "
        'Prints one JSON line per applied version: {"tableId","version","files","added","removed",'
        '"snapshot"} (counts of active, added and removed files). With --state-dir the state and '
        "the position are saved after every batch and a restart continues from there; without it "
        "the topic is read from its beginning. With --commits-topic the commits topic is read too: on "
        "a tableReplaced record (a table deleted and re-created at its location) the previous "
        'table\'s state is dropped and one line {"kind":"tableReplaced","tableId","previousTableId",'
        '"previousVersion","droppedVersion","droppedFiles","tableUri"} is printed. Stops cleanly on '
        "SIGTERM/SIGINT (exit 0).",
    )
    p.add_argument(
        "--bootstrap-servers", required=True, metavar="HOSTS", help="Kafka brokers, host:port[,...]"
    )
    p.add_argument("--topic", required=True, metavar="ACTIONS_TOPIC", help="the actions topic to read")
    p.add_argument(
        "--commits-topic",
        nargs="?",
        const="",
        metavar="COMMITS_TOPIC",
        help="also read this commits topic and drop the state of re-created tables; without a name, "
        "the watcher's default pair of the actions topic (deltamirror.<name>.actions -> .commits)",
    )
    p.add_argument("--group-id", metavar="G", help="consumer group for committed offsets (lag monitoring)")
    p.add_argument("--state-dir", metavar="DIR", help="where to persist the state and the position")
    p.add_argument("--once", action="store_true", help="exit once every partition is read to its end")
    p.set_defaults(handler=cmd_consume_snapshot)


def cmd_consume_snapshot(args: argparse.Namespace) -> int:
    import json
    import logging
    import signal
    from types import FrameType

    from deltamirror.consumer.snapshot import (
        DEFAULT_GROUP_ID,
        IncrementalSnapshot,
        Invalidation,
        SnapshotConsumer,
        TableReplacement,
    )
    from deltamirror.core.errors import InvalidArgumentError
    from deltamirror.core.redact import install_redaction
    from deltamirror.mirror.connection import KafkaConnectionReporter
    from deltamirror.mirror.settings import KafkaSettings
    from deltamirror.mirror.topics import default_commits_topic

    # the watcher's Kafka model: the same broker-list rule, SASL/SSL checks and secret handling
    kafka = KafkaSettings.from_flags(
        {"bootstrap_servers": args.bootstrap_servers}, {"bootstrap_servers": "--bootstrap-servers"}
    )
    servers = kafka.bootstrap_servers
    if not args.topic.strip():
        raise InvalidArgumentError("--topic is empty")
    commits_topic = args.commits_topic
    if commits_topic is not None:
        commits_topic = commits_topic.strip() or default_commits_topic(args.topic.strip())
    logging.basicConfig(
        level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s"
    )
    install_redaction(logging.getLogger())
    # librdkafka's lines go to logging (DEBUG), its errors become one warning now and then; wrong
    # credentials stop the consumer
    reporter = KafkaConnectionReporter(servers, on_fatal=lambda error: consumer.request_stop())

    def report(invalidation: Invalidation, state: IncrementalSnapshot) -> None:
        line: dict[str, Any] = {
            "tableId": invalidation.table_id,
            "version": invalidation.version,
            "files": invalidation.files,
            "added": len(invalidation.added),
            "removed": len(invalidation.removed),
            "snapshot": invalidation.snapshot,
        }
        write(line)

    def report_replaced(notice: TableReplacement) -> None:
        write(
            {
                "kind": "tableReplaced",
                "tableId": notice.table_id,
                "previousTableId": notice.previous_table_id,
                "previousVersion": notice.previous_version,
                "droppedVersion": notice.dropped_version,
                "droppedFiles": notice.dropped_files,
                "tableUri": notice.table_uri,
            }
        )

    def write(line: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(line, separators=(",", ":")) + "\n")
        sys.stdout.flush()

    consumer = SnapshotConsumer(
        servers,
        args.topic,
        kafka={**kafka.librdkafka_config(), **reporter.client_config()},
        group_id=args.group_id or DEFAULT_GROUP_ID,
        state_dir=args.state_dir,
        on_applied=report,
        commits_topic=commits_topic,
        on_replaced=report_replaced,
    )

    def on_signal(signum: int, frame: FrameType | None) -> None:
        consumer.request_stop()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        consumer.run(once=args.once)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    reporter.check()
    return 0
