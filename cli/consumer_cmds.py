"""``consume-snapshot`` and ``invalidate``: the consumer side of the command line."""

from __future__ import annotations

import argparse
import sys
import textwrap
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from .common import KAFKA_CONFIG_HELP
from .flags import ENVIRONMENT_HELP, Flag, environment_layer, flag_layer

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
(from --state-dir, saved only after the versions in it were handed over, at
--checkpoint-interval-versions/-s from the start, catching up included; or from
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
  A version that changed the table's schema also gives {"kind":"schemaChanged",
   "tableId", "tableUri", "version", "commitTimestamp", "changeClass" (additive,
   widening, rename, drop, incompatible), "changes", "changesCount",
   "changesTruncated", "previousPartitionColumns", "partitionColumns"}.
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


#: what --help says of the environment variables and the file
ENVIRONMENT_NOTE = (
    ENVIRONMENT_HELP + " DELTAMIRROR_COMMITS_TOPIC names the topic (the default pair takes the flag "
    "without a name). The --config file gives the kafka: and consumer: sections (the watcher's "
    "other keys are allowed, a key no command knows is refused)."
)

#: the defaults of the settings whose absence is told apart from their default (refused combinations);
#: deltamirror.consumer.settings holds the same (spelled here so that --help imports no pydantic)
CHECKPOINT_VERSIONS = 100
CHECKPOINT_S = 60.0
MAX_ITEMS = 1000
BACKOFF_S = 0.5
MAX_BACKOFF_S = 30.0
MAX_ATTEMPTS = 5
TIMEOUT_S = 30.0

#: each command's default consumer group (deltamirror.consumer.snapshot and .invalidate's
#: DEFAULT_GROUP_ID, spelled here so that consume-snapshot does not import invalidate's modules):
#: how a state directory written before it recorded its command tells which made it
DEFAULT_GROUPS = {"consume-snapshot": "deltamirror-snapshot-consumer", "invalidate": "deltamirror-invalidate"}

#: what a consumer does with a record it refuses (deltamirror.mirror.records.boundary.BAD_RECORD_CHOICES)
ON_BAD_RECORD = ("stop", "skip", "dead-letter")

#: ``--config FILE`` and ``--bootstrap-servers``: the Kafka settings (and the file's ``consumer:``)
KAFKA_FLAGS: tuple[Flag, ...] = (
    Flag(
        "bootstrap_servers",
        ("--bootstrap-servers",),
        "Kafka brokers, host:port[,...] (required without --config; replaces the file's)",
        "HOSTS",
    ),
    Flag("config", ("--config",), KAFKA_CONFIG_HELP + "; its consumer: section is read too", "FILE"),
)


def _source_flags(group_default: str) -> tuple[Flag, ...]:
    """The flags both commands take, but ``--commits-topic`` (an optional value: added by hand)."""
    return (
        Flag("topic", ("--topic",), "the actions topic to read (required)", "ACTIONS_TOPIC"),
        Flag(
            "group_id",
            ("--group-id",),
            f"consumer group for committed offsets (default: with --state-dir, the directory's own "
            f"group, recorded in it; without, {group_default}); a --state-dir that records another "
            "group is refused",
            "G",
        ),
        Flag("once", ("--once",), "exit once every partition is read to its end", switch=True),
        Flag(
            "state_dir",
            ("--state-dir",),
            "where to save each table's state (a Delta checkpoint), the position and the consumer "
            "group; a start continues from there instead of the topic's beginning (a file, a "
            "directory whose offsets.json deltamirror did not write, or the other consumer "
            "command's directory, is refused)",
            "DIR",
        ),
        Flag(
            "checkpoint_interval_versions",
            ("--checkpoint-interval-versions",),
            f"with --state-dir (refused without): save after N applied versions (default "
            f"{CHECKPOINT_VERSIONS}; 0: not on this count)",
            "N",
            int,
        ),
        Flag(
            "checkpoint_interval_s",
            ("--checkpoint-interval-s",),
            f"with --state-dir (refused without): save S seconds after the first change since the "
            f"last save (default {CHECKPOINT_S:g}; 0: not on this count); the end of a run always saves",
            "S",
            float,
        ),
        Flag(
            "metrics_port",
            ("--metrics-port",),
            "serve /metrics (Prometheus: versions applied, lag in versions, records and ms, "
            "applied actions) and /healthz on PORT (0: any free port)",
            "PORT",
            int,
        ),
        Flag(
            "metrics_host", ("--metrics-host",), "address of the metrics server (default 127.0.0.1)", "HOST"
        ),
        Flag(
            "max_items",
            ("--max-items",),
            f"longest list of paths or partitions in a document (default {MAX_ITEMS}; consume-snapshot: "
            "with --format jsonl, the documents it prints)",
            "N",
            int,
        ),
        # which records a consumer takes: the topics are checked like the log (docs/events.md)
        Flag(
            "allow_table_locations",
            ("--allow-table-location",),
            "take tables only at or under URI (a table location or a folder of them, e.g. "
            "s3://lake/sales); repeatable; replaces the config's allow_table_locations. Without it any "
            "location is taken, each table held to the location it was first seen at",
            "URI",
            repeatable=True,
            dest_name="allow_table_location",
        ),
        Flag(
            "allow_path_prefixes",
            ("--allow-path-prefix",),
            "also take files named outside a table's root under URI (a shallow clone's source, as "
            "given to the watcher); repeatable; replaces the config's allow_path_prefixes",
            "URI",
            repeatable=True,
            dest_name="allow_path_prefix",
        ),
        Flag(
            "on_bad_record",
            ("--on-bad-record",),
            "a record that breaks the contract or the log's rules (forged, corrupt): stop (default: "
            "everything before it is delivered and saved, then exit 2 naming topic, partition and "
            "offset), skip (a log line and a metric, then on), dead-letter (skip, and copy it to "
            "--bad-record-topic)",
            choices=ON_BAD_RECORD,
        ),
        Flag(
            "bad_record_topic",
            ("--bad-record-topic",),
            "with --on-bad-record dead-letter: the topic refused records are copied to (must exist; not a "
            "topic this command reads)",
            "T",
        ),
    )


#: ``--commits-topic [COMMITS_TOPIC]``: its variable names the topic (the default pair needs the flag)
COMMITS_TOPIC = Flag(
    "commits_topic",
    ("--commits-topic",),
    "also read this commits topic and drop the state of re-created tables; without a name, the "
    "watcher's default pair of the actions topic (deltamirror.<name>.actions -> .commits)",
    "COMMITS_TOPIC",
)

SNAPSHOT_FLAGS: tuple[Flag, ...] = (
    *KAFKA_FLAGS,
    *_source_flags("deltamirror-snapshot-consumer"),
    COMMITS_TOPIC,
    Flag(
        "format",
        ("--format",),
        "counts: file counts per version (default); jsonl: the invalidation document per version",
        choices=("counts", "jsonl"),
    ),
)

#: --exec and --webhook: one of them (a mutually exclusive group)
TARGET_FLAGS: tuple[Flag, ...] = (
    Flag(
        "exec",
        ("--exec",),
        "command to run per version, split like a shell would but run without one (use "
        "'sh -c ...' for pipes); its standard output is discarded, the last line of its stderr is "
        "logged on failure",
        "CMD",
    ),
    Flag("webhook", ("--webhook",), "http(s) endpoint to POST each version to (userinfo: basic auth)", "URL"),
)

INVALIDATE_FLAGS: tuple[Flag, ...] = (
    *KAFKA_FLAGS,
    *_source_flags("deltamirror-invalidate"),
    COMMITS_TOPIC,
    *TARGET_FLAGS,
    Flag(
        "headers",
        ("--header",),
        "with --webhook: a header sent with every request (e.g. Authorization); repeatable",
        "'NAME: VALUE'",
        repeatable=True,
        dest_name="header",
    ),
    Flag(
        "dead_letter_topic",
        ("--dead-letter-topic",),
        "topic for versions given up (must exist; not with --max-attempts 0, which never gives up)",
        "T",
    ),
    Flag(
        "max_attempts",
        ("--max-attempts",),
        f"attempts per version before it is given up (default {MAX_ATTEMPTS}; 0: retry until stopped)",
        "N",
        int,
    ),
    Flag(
        "backoff",
        ("--backoff",),
        f"wait after the first failure (default {BACKOFF_S:g} s; refused with --max-attempts 1)",
        "S",
        float,
    ),
    Flag(
        "max_backoff",
        ("--max-backoff",),
        f"longest wait between attempts, each wait doubling the one before (default {MAX_BACKOFF_S:g} "
        "s; not less than --backoff)",
        "S",
        float,
    ),
    Flag(
        "timeout",
        ("--timeout",),
        f"deadline of one attempt, all of it (default {TIMEOUT_S:g} s): a webhook's host name looked "
        "up and its whole answer must have come by then (a complete HTTP response: one cut short "
        "fails the attempt), a command must have exited (else it is killed, with every process it "
        "started)",
        "S",
        float,
    ),
)


def _add_flags(p: argparse.ArgumentParser, flags: tuple[Flag, ...]) -> None:
    target = None
    for flag in flags:
        if flag is COMMITS_TOPIC:
            p.add_argument(
                *flag.names, dest=flag.dest, nargs="?", const="", metavar=flag.metavar, help=flag.help
            )
        elif flag in TARGET_FLAGS:
            # one of them: refused by argparse when both are given, by the settings when none is
            # (the environment may give it)
            target = target or p.add_mutually_exclusive_group()
            flag.add_to(target)
        else:
            flag.add_to(p)


def _add_consume_snapshot(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
        'for good) drops its state the same way and prints {"kind":"tableDropped",...}; a schemaChanged '
        'record prints {"kind":"schemaChanged","tableId","version","changeClass","changes"} (with '
        "--format jsonl, the schemaChanged document). "
        "Stops cleanly on SIGTERM/SIGINT (exit 0) within 10 s, the broker gone or not (the state is saved "
        "first; a warning says when the group's last offsets may not be committed). "
        "The jsonl document is described in `deltamirror invalidate --help`.",
        epilog=ENVIRONMENT_NOTE,
    )
    _add_flags(p, SNAPSHOT_FLAGS)
    p.set_defaults(handler=cmd_consume_snapshot, long_running=True)


def _add_invalidate(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "invalidate",
        help="run a command or call a webhook for every committed version (cache invalidation)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=INVALIDATE_HELP,
        epilog=INVALIDATE_EXAMPLE + "\n" + textwrap.fill(ENVIRONMENT_NOTE, 80) + "\n",
    )
    _add_flags(p, INVALIDATE_FLAGS)
    p.set_defaults(handler=cmd_invalidate, long_running=True)


#: each command of this module and what adds its parser (build_parser takes the one that runs)
PARSERS = {
    "consume-snapshot": _add_consume_snapshot,
    "invalidate": _add_invalidate,
}


# --- shared -------------------------------------------------------------------------------------------


def command_settings(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> Any:
    """The command's settings model, its flags, ``DELTAMIRROR_*`` variables and ``--config`` file
    merged once (flags > environment > file > defaults) and checked as a whole, before anything is
    done: a setting that cannot take effect in this combination is named, as it was given, with
    the one that stops it (exit 2). No broker is asked."""
    from deltamirror.consumer.settings import InvalidateSettings, SnapshotSettings, file_section
    from deltamirror.core.errors import ConfigError
    from deltamirror.mirror.settings import KafkaSettings, Layer, merge_layers

    flags, model = (
        (INVALIDATE_FLAGS, InvalidateSettings)
        if args.command == "invalidate"
        else (SNAPSHOT_FLAGS, SnapshotSettings)
    )
    env, env_names = environment_layer(flags, environ)
    given, flag_names = flag_layer(flags, args)
    layers = {**env, **given}
    names = {**env_names, **flag_names}
    config = layers.get("config")
    servers = layers.get("bootstrap_servers")
    if config:  # the watcher's Kafka model and file: the same broker-list rule, SASL/SSL checks, secrets
        from deltamirror.producer.config_file import ConfigFile

        file = ConfigFile.read(config, environ)  # parsed once, each section read from it
        # the file may be the watcher's too: its keys are known, a key no command knows is a typo
        unknown = file.unknown_top_level_keys()
        if unknown:
            raise ConfigError(f"invalid configuration: {unknown[0]}: unknown key", file=config)
        kafka = file.kafka_settings(bootstrap_servers=servers)
        in_file = file_section(file.section("consumer"), config)
    elif not servers:
        raise ConfigError("--bootstrap-servers is required without --config")
    else:
        kafka = KafkaSettings.from_flags(
            {"bootstrap_servers": servers}, {"bootstrap_servers": names["bootstrap_servers"]}
        )
        in_file = {}
    kafka_flags = ("config", "bootstrap_servers")
    return merge_layers(
        model,
        [
            Layer(in_file, {key: f"consumer.{key}" for key in in_file}),
            Layer({k: v for k, v in env.items() if k not in kafka_flags}, env_names),
            Layer({k: v for k, v in given.items() if k not in kafka_flags}, flag_names),
        ],
        fixed={"kafka": kafka},
        names={flag.setting: flag.flag for flag in flags},
        source=config if in_file else None,
    )


#: the flags checked alone (no broker is asked): what the flag tests call
_check_flags = command_settings


class _Source:
    """The Kafka side both commands share: the broker list, its checks, the reporter of its failures."""

    def __init__(self, settings: Any) -> None:
        import logging

        from deltamirror.core.redact import install_redaction
        from deltamirror.mirror.kafka.connection import KafkaConnectionReporter

        self.settings = settings
        self.servers = settings.kafka.bootstrap_servers
        self.topic: str = settings.actions_topic
        self.commits_topic: str | None = settings.commits_topic_name
        logging.basicConfig(
            level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s"
        )
        install_redaction(logging.getLogger())
        self.consumer: Any = None  # the SnapshotConsumer, once built
        self.producer: Any = None  # the RecordProducer of --bad-record-topic, if any
        # librdkafka's lines go to logging (DEBUG), its errors become one warning now and then;
        # wrong credentials stop the consumer
        self.reporter = KafkaConnectionReporter(self.servers, on_fatal=self._fatal)
        self.kafka: dict[str, Any] = {**settings.kafka.librdkafka_config(), **self.reporter.client_config()}
        from deltamirror.mirror.kafka.login_check import check_login, needs_login_check

        if needs_login_check(self.kafka):
            # a wrong password or CA: one line and exit 2 in a second, not a timeout as "unreachable"
            check_login(self.kafka, self.reporter)
        self.metrics_port: int | None = settings.metrics_port
        self.metrics_host: str = settings.metrics_host or "127.0.0.1"
        self.metrics: Any = None  # a ConsumerMetrics with --metrics-port
        if self.metrics_port is not None:
            from deltamirror.consumer.metrics import ConsumerMetrics

            self.metrics = ConsumerMetrics()
        #: the SnapshotConsumer options both commands pass alike
        self.state_options: dict[str, Any] = {
            "state_dir": settings.state_dir,
            "checkpoint_interval_versions": settings.checkpoint_every_versions,
            "checkpoint_interval_s": settings.checkpoint_every_s,
            "metrics": self.metrics,
            **self._record_options(settings),
        }

    def group_id(self, command: str) -> str:
        """The consumer group: ``--group-id``, else the state directory's own, else the command's
        default group.

        A state directory records its group when it is new (a group of its own unless one is
        named), so that a new state never starts from what another consumer's group acknowledged;
        a ``--group-id`` other than the one it records is refused, and so is the directory of the
        other command (see consumer/snapshot/store.py).
        """
        groups = DEFAULT_GROUPS
        settings = self.settings
        if settings.state_dir is None:
            return str(settings.group_id or groups[command])
        from deltamirror.consumer.snapshot import StateStore

        return StateStore.claim_group(
            settings.state_dir,
            self.topic,
            self.commits_topic,
            requested=settings.group_id,
            default=groups[command],
            command=command,
            command_groups=groups,
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

    def _record_options(self, settings: Any) -> dict[str, Any]:
        """Which records the consumer takes, and where the refused ones go."""
        from deltamirror.mirror.records.boundary import RecordRules

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

    from deltamirror.consumer.snapshot import use_returning_pool
    from deltamirror.mirror.errors import StopRequested

    # this process is the command's own: freed Arrow memory leaves it at once (a backlog of a
    # large table frees far more than the state keeps; the user's ARROW_DEFAULT_MEMORY_POOL stands)
    use_returning_pool()
    # a stop while the last reports were being handed over: exit cleanly too
    with contextlib.suppress(StopRequested):
        consumer.run(once=once)


# --- consume-snapshot ---------------------------------------------------------------------------------


def cmd_consume_snapshot(args: argparse.Namespace) -> int:
    from deltamirror.consumer.snapshot import (
        IncrementalSnapshot,
        Invalidation,
        SnapshotConsumer,
        TableReplacement,
    )
    from deltamirror.mirror.records.events import SchemaChanged

    settings = command_settings(args)
    source = _Source(settings)
    options: dict[str, Any] = {
        "kafka": source.kafka,
        "group_id": source.group_id("consume-snapshot"),
        "commits_topic": source.commits_topic,
        **source.state_options,
    }
    consumer: SnapshotConsumer
    if settings.format == "jsonl":
        from deltamirror.consumer.invalidate import InvalidationConsumer

        consumer = InvalidationConsumer(
            source.servers,
            source.topic,
            on_payload=_write,
            max_items=settings.items,
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

        def report_schema(record: SchemaChanged) -> None:
            _write(
                {
                    "kind": "schemaChanged",
                    "tableId": record.table_id,
                    "version": record.version,
                    "changeClass": record.change_class,
                    "changes": len(record.changes),
                }
            )

        consumer = SnapshotConsumer(
            source.servers,
            source.topic,
            on_applied=report,
            on_replaced=report_replaced,
            on_schema_changed=report_schema,
            **options,
        )
    with source.running(consumer):
        _run(consumer, settings.once)
    return 0


# --- invalidate ---------------------------------------------------------------------------------------


def _print_outcome(outcome: Any) -> None:
    _write(_outcome_line(outcome))


def _outcome_line(outcome: Any) -> dict[str, Any]:
    payload = outcome.payload
    line: dict[str, Any] = {"kind": payload["kind"], "tableId": payload["tableId"]}
    if payload["kind"] == "version":
        line.update(version=payload["version"], snapshot=payload["snapshot"])
    elif payload["kind"] == "tableReplaced":
        line["previousTableId"] = payload["previousTableId"]
    elif payload["kind"] == "schemaChanged":
        line.update(version=payload["version"], changeClass=payload["changeClass"])
    else:  # tableDropped: the table is tableId
        line["lastVersion"] = payload.get("lastVersion")
    line.update(attempts=outcome.attempts, outcome="deadLettered" if outcome.dead_lettered else "delivered")
    return line


def cmd_invalidate(args: argparse.Namespace) -> int:
    import threading

    from deltamirror.consumer.invalidate import (
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

    settings = command_settings(args)
    source = _Source(settings)
    policy = RetryPolicy(
        max_attempts=settings.max_attempts,
        initial_backoff_s=settings.backoff_s,
        max_backoff_s=settings.max_backoff_s,
    )
    target: Target
    stop = threading.Event()  # a stop also ends an attempt in progress (its version is offered again)
    if settings.exec is not None:
        target = ExecTarget.from_command_line(settings.exec, timeout_s=settings.timeout, stop=stop)
    else:
        target = WebhookTarget(
            settings.webhook, headers=settings.header_map, timeout_s=settings.timeout, stop=stop
        )
    producer = None
    dead_letters = None
    if settings.dead_letter_topic is not None:
        from deltamirror.mirror.kafka.producer import RecordProducer

        producer = RecordProducer(source.kafka, delivery_timeout_s=max(30.0, settings.timeout))
        try:
            producer.check_topic(settings.dead_letter_topic)  # now, not when the first version fails
        except KafkaError as exc:
            producer.close()
            raise source.with_reason(exc) from None
        dead_letters = DeadLetterTopic(producer, settings.dead_letter_topic)
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
        max_items=settings.items,
        group_id=source.group_id("invalidate"),
        kafka=source.kafka,
        commits_topic=source.commits_topic,
        stop=stop,
        **source.state_options,
    )
    try:
        with source.running(consumer):
            _run(consumer, settings.once)
    finally:
        if producer is not None:
            producer.close()
    return 0
