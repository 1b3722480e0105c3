"""``consume-snapshot`` and ``invalidate``: the consumer side of the command line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from .common import add_kafka_arguments, kafka_settings_from_args

INVALIDATE_HELP = """\
Keep each table's active files from an actions topic, as consume-snapshot does,
and hand every committed version, in order, to a command or an HTTP endpoint:

  --exec CMD     runs CMD (split like a shell would, run without one) with the
                 version's JSON document on stdin and DELTAMIRROR_TABLE (the
                 table URI), DELTAMIRROR_TABLE_ID, DELTAMIRROR_VERSION,
                 DELTAMIRROR_OPERATION, DELTAMIRROR_TRUNCATED (1: lists cut),
                 DELTAMIRROR_KIND, DELTAMIRROR_DELIVERY_ID, DELTAMIRROR_ATTEMPT
                 in its environment; exit status 0 accepts the version.
  --webhook URL  POSTs the document (application/json, Idempotency-Key header);
                 a whole 2xx answer accepts it; a redirect, or an answer cut
                 short or not HTTP, does not.

--timeout S is the deadline of one attempt, all of it: a webhook whose host
name is still being looked up, or still answering then (however steadily),
fails it; a command still running is killed with every process it
started.

A failed attempt is tried again after 0.5, 1, 2, 4 s... (--backoff, doubling up
to --max-backoff), --max-attempts times in all (default 5); then the version goes
to --dead-letter-topic as {"payload","error","attempts","target"} and the next
follows, or without that topic the command exits 1 naming the version.

At least once, in order, none skipped: the group's offsets are committed only
after a version was accepted (or dead-lettered), and a start rebuilds the state
(from --state-dir, saved only after the versions in it were handed over, or from
the topic's beginning) and hands over every version not acknowledged yet. A
receiver may see a version twice (DELTAMIRROR_DELIVERY_ID / Idempotency-Key name
it), never misses one. Prints one JSON line per version handled. Secrets in the URL
(userinfo, path, query) are never printed. SIGTERM/SIGINT stop cleanly (exit 0)
within 10 s; with the broker gone, a warning says the last offsets may not be
committed (those versions are delivered again by the next start).

The document (also what consume-snapshot --format jsonl prints):
  {"kind":"version", "tableId", "tableUri", "version", "snapshot",
   "commitTimestamp" (epoch ms), "operation" (commitInfo.operation; SNAPSHOT),
   "files" (active files after it), "partitions" (partitionValues of the files
   added or removed), "added", "removed" (paths as in the log), "partitionsCount",
   "addedCount", "removedCount" (full lengths), "partitionsTruncated",
   "addedTruncated", "removedTruncated", "truncated"}
  A list longer than --max-items (1000) is cut and flagged: drop everything
  cached for the table then. With --commits-topic, a re-created table gives
  {"kind":"tableReplaced", "tableId", "tableUri", "previousTableId",
   "previousVersion", "reason", "droppedVersion", "droppedFiles"}, and a table
  deleted for good {"kind":"tableDropped", "tableId", "tableUri", "lastVersion",
   "reason", "droppedVersion", "droppedFiles"}: drop everything of the table.
"""

INVALIDATE_EXAMPLE = """\
example: drop the cached results of the partitions each version touched
  CACHE=/var/cache/sales deltamirror invalidate --bootstrap-servers kafka:9092 \\
      --topic deltamirror.sales.actions --exec ./drop-cached.sh
  where drop-cached.sh reads the document on stdin (python3 -c, no jq), removes
  $CACHE/<key>=<value>/ for each partition touched, or all of $CACHE when the
  lists were cut, the table is not partitioned or was re-created, and exits 0
  (the script: README, "Invalidating a cache").
"""


#: the defaults of the flags whose absence is told apart from their default (refused combinations)
CHECKPOINT_VERSIONS = 100
CHECKPOINT_S = 60.0
MAX_ITEMS = 1000
BACKOFF_S = 0.5
MAX_BACKOFF_S = 30.0


def _add_source_arguments(p: argparse.ArgumentParser, group_default: str) -> None:
    add_kafka_arguments(p)
    p.add_argument("--topic", required=True, metavar="ACTIONS_TOPIC", help="the actions topic to read")
    p.add_argument(
        "--commits-topic",
        nargs="?",
        const="",
        metavar="COMMITS_TOPIC",
        help="also read this commits topic and drop the state of re-created tables; without a name, "
        "the watcher's default pair of the actions topic (deltamirror.<name>.actions -> .commits)",
    )
    p.add_argument(
        "--group-id",
        metavar="G",
        help=f"consumer group for committed offsets (default: with --state-dir, the directory's own "
        f"group, recorded in it; without, {group_default}); a --state-dir that records another group "
        "is refused",
    )
    p.add_argument("--once", action="store_true", help="exit once every partition is read to its end")
    p.add_argument(
        "--state-dir",
        metavar="DIR",
        help="where to save each table's state (a Delta checkpoint), the position and the consumer "
        "group; a start continues from there instead of the topic's beginning",
    )
    p.add_argument(
        "--checkpoint-interval-versions",
        type=int,
        metavar="N",
        help=f"with --state-dir (refused without): save after N applied versions (default "
        f"{CHECKPOINT_VERSIONS}; 0: not on this count)",
    )
    p.add_argument(
        "--checkpoint-interval-s",
        type=float,
        metavar="S",
        help=f"with --state-dir (refused without): save S seconds after the first change since the last "
        f"save (default {CHECKPOINT_S:g}; 0: not on this count); the end of a run always saves",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        metavar="PORT",
        help="serve /metrics (Prometheus: versions applied, lag in versions, records and ms, "
        "applied actions) and /healthz on PORT (0: any free port)",
    )
    p.add_argument("--metrics-host", metavar="HOST", help="address of the metrics server (default 127.0.0.1)")
    p.add_argument(
        "--max-items",
        type=int,
        metavar="N",
        help=f"longest list of paths or partitions in a document (default {MAX_ITEMS}; consume-snapshot: "
        "with --format jsonl, the documents it prints)",
    )
    _add_record_arguments(p)


#: what a consumer does with a record it refuses (deltamirror.mirror.records.boundary.BAD_RECORD_CHOICES)
ON_BAD_RECORD = ("stop", "skip", "dead-letter")


def _add_record_arguments(p: argparse.ArgumentParser) -> None:
    """Which records a consumer takes: the topics are checked like the log (docs/events.md)."""
    p.add_argument(
        "--allow-table-location",
        action="append",
        metavar="URI",
        help="take tables only at or under URI (a table location or a folder of them, e.g. s3://lake/sales); "
        "repeatable; replaces the config's allow_table_locations. Without it any location is taken, each "
        "table held to the location it was first seen at",
    )
    p.add_argument(
        "--allow-path-prefix",
        action="append",
        metavar="URI",
        help="also take files named outside a table's root under URI (a shallow clone's source, as given "
        "to the watcher); repeatable; replaces the config's allow_path_prefixes",
    )
    p.add_argument(
        "--on-bad-record",
        choices=ON_BAD_RECORD,
        help="a record that breaks the contract or the log's rules (forged, corrupt): stop (default: "
        "everything before it is delivered and saved, then exit 2 naming topic, partition and offset), "
        "skip (a log line and a metric, then on), dead-letter (skip, and copy it to --bad-record-topic)",
    )
    p.add_argument(
        "--bad-record-topic",
        metavar="T",
        help="with --on-bad-record dead-letter: the topic refused records are copied to (must exist)",
    )


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "consume-snapshot",
        help="keep the active files of every mirrored table, printing each applied version",
        description="Read an actions topic (read_committed) and keep each table's active files, "
        "applying a version when its last action arrives and replacing the state on a snapshot. "
        'With --format counts (the default) prints one JSON line per applied version: {"tableId",'
        '"version","files","added","removed","snapshot"} (counts of active, added and removed files); '
        "with --format jsonl the document `deltamirror invalidate` delivers for it. With --state-dir "
        "each table's state is saved as a Delta checkpoint, with the position, every "
        "--checkpoint-interval-versions versions or --checkpoint-interval-s seconds once it has caught "
        "up with what the topics held when it started (while catching up: at 10x the seconds only), "
        "and at the end; the files' stats stay in a temporary file there, not in memory, "
        "and a restart continues from there (the versions since the last save are printed again); "
        "without it the topic is read from its beginning. With --commits-topic the commits topic is "
        "read too: on a tableReplaced record (a table deleted and re-created at its location) the "
        'previous table\'s state is dropped and one line {"kind":"tableReplaced","tableId",'
        '"previousTableId","previousVersion","droppedVersion","droppedFiles","tableUri"} is printed '
        "(with --format jsonl, the tableReplaced document); a tableDropped record (a table deleted "
        'for good) drops its state the same way and prints {"kind":"tableDropped",...}. '
        "Stops cleanly on SIGTERM/SIGINT (exit 0) within 10 s, the broker gone or not (the state is saved "
        "first; a warning says when the group's last offsets may not be committed). "
        "The jsonl document is described in `deltamirror invalidate --help`.",
    )
    _add_source_arguments(p, "deltamirror-snapshot-consumer")
    p.add_argument(
        "--format",
        choices=["counts", "jsonl"],
        default="counts",
        help="counts: file counts per version (default); jsonl: the invalidation document per version",
    )
    p.set_defaults(handler=cmd_consume_snapshot, long_running=True)

    p = sub.add_parser(
        "invalidate",
        help="run a command or call a webhook for every committed version (cache invalidation)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=INVALIDATE_HELP,
        epilog=INVALIDATE_EXAMPLE,
    )
    _add_source_arguments(p, "deltamirror-invalidate")
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument(
        "--exec",
        metavar="CMD",
        help="command to run per version, split like a shell would but run without one (use "
        "'sh -c ...' for pipes); its standard output is discarded, the last line of its stderr is "
        "logged on failure",
    )
    target.add_argument(
        "--webhook", metavar="URL", help="http(s) endpoint to POST each version to (userinfo: basic auth)"
    )
    p.add_argument(
        "--header",
        action="append",
        metavar="'NAME: VALUE'",
        help="with --webhook: a header sent with every request (e.g. Authorization); repeatable",
    )
    p.add_argument(
        "--dead-letter-topic",
        metavar="T",
        help="topic for versions given up (must exist; not with --max-attempts 0, which never gives up)",
    )
    p.add_argument(
        "--max-attempts",
        type=int,
        default=5,
        metavar="N",
        help="attempts per version before it is given up (default 5; 0: retry until stopped)",
    )
    p.add_argument(
        "--backoff",
        type=float,
        metavar="S",
        help=f"wait after the first failure (default {BACKOFF_S:g} s; refused with --max-attempts 1)",
    )
    p.add_argument(
        "--max-backoff",
        type=float,
        metavar="S",
        help=f"longest wait between attempts, each wait doubling the one before (default {MAX_BACKOFF_S:g} s; "
        "not less than --backoff)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=30.0,
        metavar="S",
        help="deadline of one attempt, all of it (default 30 s): a webhook's host name looked up and "
        "its whole answer must have "
        "come by then (a complete HTTP response: one cut short fails the attempt), a command must "
        "have exited (else it is killed, with every process it started)",
    )
    p.set_defaults(handler=cmd_invalidate, long_running=True)


# --- shared -------------------------------------------------------------------------------------------


def _check_flags(args: argparse.Namespace) -> None:
    """Every refusal that needs no broker, before anything is done: a flag that cannot take effect
    in this combination is named with the one that stops it (exit 2)."""
    import math

    from deltamirror.core.errors import InvalidArgumentError
    from deltamirror.producer.settings import check_topic_name

    check_topic_name(args.topic, "--topic")
    if args.commits_topic:
        check_topic_name(args.commits_topic.strip(), "--commits-topic")
    for flag, value in (("--group-id", args.group_id), ("--state-dir", args.state_dir)):
        if value is not None and not value.strip():
            raise InvalidArgumentError(f"{flag} is empty")
    if args.max_items is not None and args.max_items < 0:
        raise InvalidArgumentError("--max-items must be 0 or more")
    if args.max_items is not None and getattr(args, "format", "jsonl") == "counts":
        raise InvalidArgumentError(
            "--max-items goes with --format jsonl: --format counts prints counts, not lists"
        )
    if args.metrics_host is not None and args.metrics_port is None:
        raise InvalidArgumentError("--metrics-host goes with --metrics-port")
    if args.metrics_port is not None and not 0 <= args.metrics_port <= 65535:
        raise InvalidArgumentError("--metrics-port must be 0-65535")
    for flag, value in (
        ("--checkpoint-interval-versions", args.checkpoint_interval_versions),
        ("--checkpoint-interval-s", args.checkpoint_interval_s),
    ):
        if value is None:
            continue
        if args.state_dir is None:
            raise InvalidArgumentError(f"{flag} goes with --state-dir: without one nothing is saved")
        if not (value >= 0 and math.isfinite(value)):
            raise InvalidArgumentError(f"{flag} must be 0 or more")
    if not hasattr(args, "max_attempts"):  # consume-snapshot
        return
    if args.header and args.webhook is None:
        raise InvalidArgumentError("--header goes with --webhook")
    if not (args.timeout > 0 and math.isfinite(args.timeout)):
        raise InvalidArgumentError("--timeout must be more than 0 s")
    if args.max_attempts < 0:
        raise InvalidArgumentError("--max-attempts must be 0 (no limit) or more")
    for flag, value in (("--backoff", args.backoff), ("--max-backoff", args.max_backoff)):
        if value is None:
            continue
        if not (value >= 0 and math.isfinite(value)):
            raise InvalidArgumentError(f"{flag} must be 0 s or more")
        if args.max_attempts == 1:
            raise InvalidArgumentError(
                f"{flag} goes with a --max-attempts above 1: with 1 nothing is retried"
            )
    backoff = BACKOFF_S if args.backoff is None else args.backoff
    max_backoff = MAX_BACKOFF_S if args.max_backoff is None else args.max_backoff
    if max_backoff < backoff:
        raise InvalidArgumentError(
            f"--max-backoff {max_backoff:g} is less than --backoff {backoff:g}: the first wait would be cut to it"
        )
    if args.dead_letter_topic is not None:
        check_topic_name(args.dead_letter_topic, "--dead-letter-topic")
        if args.max_attempts == 0:
            raise InvalidArgumentError(
                "--dead-letter-topic goes with a --max-attempts above 0: with 0 a version is retried "
                "until it is delivered, never given up"
            )
        if args.dead_letter_topic in (args.topic, args.commits_topic):
            raise InvalidArgumentError(
                f"--dead-letter-topic {args.dead_letter_topic} is a topic this command reads"
            )


class _Source:
    """The Kafka side both commands share: the broker list, its checks, the reporter of its failures."""

    def __init__(self, args: argparse.Namespace) -> None:
        import logging

        from deltamirror.core.redact import install_redaction
        from deltamirror.mirror.kafka.connection import KafkaConnectionReporter
        from deltamirror.mirror.topics import default_commits_topic

        # the watcher's Kafka model and file: the same broker-list rule, SASL/SSL checks and secrets
        kafka = kafka_settings_from_args(args)
        self.servers = kafka.bootstrap_servers
        self.topic: str = args.topic
        self.commits_topic: str | None = args.commits_topic
        if self.commits_topic is not None:
            self.commits_topic = self.commits_topic.strip() or default_commits_topic(args.topic.strip())
        logging.basicConfig(
            level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s"
        )
        install_redaction(logging.getLogger())
        self.consumer: Any = None  # the SnapshotConsumer, once built
        self.producer: Any = None  # the RecordProducer of --bad-record-topic, if any
        # librdkafka's lines go to logging (DEBUG), its errors become one warning now and then;
        # wrong credentials stop the consumer
        self.reporter = KafkaConnectionReporter(self.servers, on_fatal=self._fatal)
        self.kafka: dict[str, Any] = {**kafka.librdkafka_config(), **self.reporter.client_config()}
        from deltamirror.mirror.kafka.login_check import check_login, needs_login_check

        if needs_login_check(self.kafka):
            # a wrong password or CA: one line and exit 2 in a second, not a timeout as "unreachable"
            check_login(self.kafka, self.reporter)
        self.metrics_port: int | None = args.metrics_port
        self.metrics_host: str = args.metrics_host or "127.0.0.1"
        self.metrics: Any = None  # a ConsumerMetrics with --metrics-port
        if self.metrics_port is not None:
            from deltamirror.consumer.metrics import ConsumerMetrics

            self.metrics = ConsumerMetrics()
        #: the SnapshotConsumer options both commands pass alike
        versions = (
            CHECKPOINT_VERSIONS
            if args.checkpoint_interval_versions is None
            else args.checkpoint_interval_versions
        )
        seconds = CHECKPOINT_S if args.checkpoint_interval_s is None else args.checkpoint_interval_s
        self.state_options: dict[str, Any] = {
            "state_dir": args.state_dir,
            "checkpoint_interval_versions": versions or None,
            "checkpoint_interval_s": seconds or None,
            "metrics": self.metrics,
            **self._record_options(args),
        }

    def group_id(self, args: argparse.Namespace, default: str) -> str:
        """The consumer group: ``--group-id``, else the state directory's own, else ``default``.

        A state directory records its group when it is new (a group of its own unless one is
        named), so that a new state never starts from what another consumer's group acknowledged;
        a ``--group-id`` other than the one it records is refused (see consumer/snapshot/store.py).
        """
        if args.state_dir is None:
            return str(args.group_id or default)
        from deltamirror.consumer.snapshot import StateStore

        return StateStore.claim_group(
            args.state_dir, self.topic, self.commits_topic, requested=args.group_id, default=default
        )

    def with_reason(self, exc: Exception) -> Exception:
        """A broker error with why the brokers cannot be reached, when the reporter knows (one line,
        never librdkafka's raw error object)."""
        from deltamirror.mirror.errors import KafkaError, TopicNotFoundError

        self.reporter.check()  # a refused login is the reason: said as such (exit 2)
        if isinstance(exc, TopicNotFoundError) or not isinstance(exc, KafkaError):
            return exc
        reason = self.reporter.last_reason
        message = exc.message
        if "KafkaError{" in message:  # librdkafka's repr: its words only
            message = message.split(": KafkaError{", 1)[0]
        if reason and reason not in message:
            message = f"{message}: Kafka at {self.servers} unreachable ({reason})"
        return KafkaError(message, **({"topic": exc.context["topic"]} if "topic" in exc.context else {}))

    def _record_options(self, args: argparse.Namespace) -> dict[str, Any]:
        """Which records the consumer takes (flags over the config's ``consumer:`` section)."""
        from deltamirror.consumer.settings import consumer_settings
        from deltamirror.mirror.records.boundary import RecordRules

        section = None
        if args.config:
            from deltamirror.producer.config_file import load_section

            section = load_section(args.config, "consumer")
        flags = {
            "allow_table_locations": args.allow_table_location,
            "allow_path_prefixes": args.allow_path_prefix,
            "on_bad_record": args.on_bad_record,
            "bad_record_topic": args.bad_record_topic,
        }
        settings = consumer_settings(section, flags, args.config)
        rules = RecordRules(
            table_locations=settings.allow_table_locations, allowed_path_prefixes=settings.allow_path_prefixes
        )
        options: dict[str, Any] = {"rules": rules, "on_bad_record": settings.on_bad_record}
        if settings.bad_record_topic is not None:
            from deltamirror.consumer.bad_records import BadRecordTopic
            from deltamirror.mirror.kafka.producer import RecordProducer

            self.producer = RecordProducer(self.kafka)
            self.producer.check_topic(settings.bad_record_topic)  # now, not at the first refusal
            options["dead_letters"] = BadRecordTopic(self.producer, settings.bad_record_topic)
        return options

    def _fatal(self, error: Exception) -> None:
        if self.consumer is not None:
            self.consumer.request_stop()

    @contextmanager
    def running(self, consumer: Any) -> Iterator[None]:
        """SIGTERM/SIGINT stop ``consumer`` cleanly while it runs; then the reporter's fatal error.

        The signals were taken when the command started (``deltamirror.ops.stopping``): one that
        came while starting ended it at once; from here on they stop the consumer."""
        from deltamirror.mirror.errors import KafkaError
        from deltamirror.ops.stopping import installed

        self.consumer = consumer
        server = None
        if self.metrics is not None:
            from deltamirror.consumer.metrics import serve

            # a port that cannot be bound fails now, not after an hour unobserved
            server = serve(self.metrics, self.metrics_host, self.metrics_port or 0)
        stops = installed()
        if stops is not None:
            stops.on_stop(lambda now: consumer.request_stop())
        try:
            yield
        except KafkaError as exc:  # said with the reason the brokers gave, when there is one
            raise self.with_reason(exc) from None
        finally:
            if server is not None:
                server.stop()
            if self.producer is not None:
                self.producer.close()
        self.reporter.check()


def _write(line: dict[str, Any]) -> None:
    import json

    sys.stdout.write(json.dumps(line, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def _run(consumer: Any, once: bool) -> None:
    import contextlib

    from deltamirror.mirror.errors import StopRequested

    # a stop while the last reports were being handed over: exit cleanly too
    with contextlib.suppress(StopRequested):
        consumer.run(once=once)


# --- consume-snapshot ---------------------------------------------------------------------------------


def cmd_consume_snapshot(args: argparse.Namespace) -> int:
    from deltamirror.consumer.snapshot import (
        DEFAULT_GROUP_ID,
        IncrementalSnapshot,
        Invalidation,
        SnapshotConsumer,
        TableReplacement,
    )

    _check_flags(args)
    source = _Source(args)
    options: dict[str, Any] = {
        "kafka": source.kafka,
        "group_id": source.group_id(args, DEFAULT_GROUP_ID),
        "commits_topic": source.commits_topic,
        **source.state_options,
    }
    consumer: SnapshotConsumer
    if args.format == "jsonl":
        from deltamirror.consumer.invalidate import InvalidationConsumer

        consumer = InvalidationConsumer(
            source.servers,
            source.topic,
            on_payload=_write,
            max_items=MAX_ITEMS if args.max_items is None else args.max_items,
            skip_acknowledged=False,  # the position is the state's, as for counts
            **options,
        )
    else:

        def report(invalidation: Invalidation, state: IncrementalSnapshot) -> None:
            _write(
                {
                    "tableId": invalidation.table_id,
                    "version": invalidation.version,
                    "files": invalidation.files,
                    "added": len(invalidation.added),
                    "removed": len(invalidation.removed),
                    "snapshot": invalidation.snapshot,
                }
            )

        def report_replaced(notice: TableReplacement) -> None:
            _write(
                {
                    "kind": "tableDropped" if notice.dropped else "tableReplaced",
                    "tableId": notice.table_id,
                    "previousTableId": notice.previous_table_id,
                    "previousVersion": notice.previous_version,
                    "droppedVersion": notice.dropped_version,
                    "droppedFiles": notice.dropped_files,
                    "tableUri": notice.table_uri,
                }
            )

        consumer = SnapshotConsumer(
            source.servers, source.topic, on_applied=report, on_replaced=report_replaced, **options
        )
    with source.running(consumer):
        _run(consumer, args.once)
    return 0


# --- invalidate ---------------------------------------------------------------------------------------


def _headers(pairs: list[str] | None) -> dict[str, str]:
    from deltamirror.core.errors import InvalidArgumentError

    headers: dict[str, str] = {}
    for position, pair in enumerate(pairs or [], start=1):
        name, sep, value = pair.partition(":")
        if not sep or not name.strip() or any(c.isspace() for c in name.strip()):
            # the text may be a bare token: named by its position, never echoed
            raise InvalidArgumentError(f"--header #{position} is not 'NAME: VALUE'")
        headers[name.strip()] = value.strip()
    return headers


def _print_outcome(outcome: Any) -> None:
    _write(_outcome_line(outcome))


def _outcome_line(outcome: Any) -> dict[str, Any]:
    payload = outcome.payload
    line: dict[str, Any] = {"kind": payload["kind"], "tableId": payload["tableId"]}
    if payload["kind"] == "version":
        line.update(version=payload["version"], snapshot=payload["snapshot"])
    elif payload["kind"] == "tableReplaced":
        line["previousTableId"] = payload["previousTableId"]
    else:  # tableDropped: the table is tableId
        line["lastVersion"] = payload.get("lastVersion")
    line.update(attempts=outcome.attempts, outcome="deadLettered" if outcome.dead_lettered else "delivered")
    return line


def cmd_invalidate(args: argparse.Namespace) -> int:
    import threading

    from deltamirror.consumer.invalidate import (
        DEFAULT_GROUP_ID,
        DeadLetterTopic,
        DeliveryCounters,
        ExecTarget,
        InvalidationConsumer,
        Invalidator,
        RetryPolicy,
        Target,
        WebhookTarget,
    )
    from deltamirror.mirror.errors import KafkaError

    _check_flags(args)
    source = _Source(args)
    policy = RetryPolicy(
        max_attempts=args.max_attempts,
        initial_backoff_s=BACKOFF_S if args.backoff is None else args.backoff,
        max_backoff_s=MAX_BACKOFF_S if args.max_backoff is None else args.max_backoff,
    )
    target: Target
    stop = threading.Event()  # a stop also ends an attempt in progress (its version is offered again)
    if args.exec is not None:
        target = ExecTarget.from_command_line(args.exec, timeout_s=args.timeout, stop=stop)
    else:
        target = WebhookTarget(args.webhook, headers=_headers(args.header), timeout_s=args.timeout, stop=stop)
    producer = None
    dead_letters = None
    if args.dead_letter_topic is not None:
        from deltamirror.mirror.kafka.producer import RecordProducer

        producer = RecordProducer(source.kafka, delivery_timeout_s=max(30.0, args.timeout))
        try:
            producer.check_topic(args.dead_letter_topic)  # now, not when the first version fails
        except KafkaError as exc:
            producer.close()
            raise source.with_reason(exc) from None
        dead_letters = DeadLetterTopic(producer, args.dead_letter_topic)
    invalidator = Invalidator(
        target,
        policy=policy,
        dead_letters=dead_letters,
        stop=stop,
        on_outcome=_print_outcome,
        metrics=DeliveryCounters(source.metrics.registry) if source.metrics is not None else None,
    )
    consumer = InvalidationConsumer(
        source.servers,
        source.topic,
        on_payload=invalidator,
        max_items=MAX_ITEMS if args.max_items is None else args.max_items,
        group_id=source.group_id(args, DEFAULT_GROUP_ID),
        kafka=source.kafka,
        commits_topic=source.commits_topic,
        stop=stop,
        **source.state_options,
    )
    try:
        with source.running(consumer):
            _run(consumer, args.once)
    finally:
        if producer is not None:
            producer.close()
    return 0
