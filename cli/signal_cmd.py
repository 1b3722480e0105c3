"""``deltamirror signal snapshot TABLE``: ask the running watchers for a fresh snapshot of a table.

Prints one JSON line (the signal written) and exits 0 once the broker has stored it; the watcher
that runs the table publishes the snapshot within a poll interval (docs/discovery.md).
"""

from __future__ import annotations

import argparse
import json
import sys

from .common import add_kafka_arguments, kafka_settings_from_args

#: ``deltamirror.producer.signals.SIGNAL_TOPIC``, spelled out so that --help imports nothing
SIGNAL_TOPIC = "deltamirror.signals"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "signal",
        help="send a signal to the running watchers (snapshot: publish a fresh snapshot of a table)",
        description="Write a signal to the signal topic every `deltamirror watch` reads. `snapshot TABLE`: "
        "the watcher running TABLE publishes a fresh snapshot of it at the last version it published, "
        "between two versions, without a restart. Only watchers running when the signal is written act "
        "on it; one where TABLE does not run yet keeps it for 10 minutes and acts if TABLE starts there.",
    )
    kinds = p.add_subparsers(dest="signal_kind", metavar="SIGNAL", required=True)
    snap = kinds.add_parser("snapshot", help="publish a fresh snapshot of TABLE")
    snap.add_argument("table", metavar="TABLE", help="the table's location, as the watcher was given it")
    add_kafka_arguments(snap)
    snap.add_argument(
        "--signal-topic",
        metavar="TOPIC",
        default=SIGNAL_TOPIC,
        help=f"the watchers' signal_topic (default {SIGNAL_TOPIC})",
    )
    snap.set_defaults(handler=cmd_signal)


def cmd_signal(args: argparse.Namespace) -> int:
    from deltamirror.core.errors import ConfigError, DeltaMirrorError
    from deltamirror.core.storage import normalize_table_uri
    from deltamirror.producer.signals import send_signal

    try:
        uri = normalize_table_uri(args.table)
    except DeltaMirrorError as exc:
        raise ConfigError(f"invalid table location: {exc.message}", table=args.table) from None
    kafka = kafka_settings_from_args(args).librdkafka_config()
    signal = send_signal(kafka, args.signal_topic, uri, "snapshot")
    line = {"signal": signal.kind, "tableUri": uri, "id": signal.id, "topic": args.signal_topic}
    sys.stdout.write(json.dumps(line) + "\n")
    return 0
