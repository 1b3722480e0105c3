"""``deltamirror signal snapshot TABLE``: ask the running watchers for a fresh snapshot of a table;
``deltamirror signal net-changes TABLE --from-version N``: for the net row changes of versions N to
the last one published, as one block.

Prints one JSON line (the signal written, the topic and brokers it went to) and exits 0 once the
broker has stored it; the watcher that runs the table publishes the snapshot within a poll
interval (docs/discovery.md). With ``--wait`` it exits 0 only once a watcher running the table
took the signal (its ``done`` record on the topic: for ``net-changes``, written once the block is
committed, so ``--timeout`` must cover publishing it); a watcher that refused it (a ``done``
saying why) is one line, exit 2. Everything is bounded by ``--timeout``: a
broker that does not answer is one line naming the reason (exit 1), and librdkafka's own lines go
to the ``deltamirror.librdkafka`` logger, never to stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from .common import add_kafka_arguments

#: ``deltamirror.mirror.topic_names.SIGNAL_TOPIC``, spelled out so that --help imports nothing
SIGNAL_TOPIC = "deltamirror.signals"
DEFAULT_TIMEOUT_S = 15.0


def _add_signal(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "signal",
        help="send a signal to the running watchers (snapshot: a fresh snapshot of a table; net-changes: "
        "its net row changes from a version)",
        description="Write a signal to the signal topic every `deltamirror watch` reads. `snapshot TABLE`: "
        "the watcher running TABLE publishes a fresh snapshot of it at the last version it published, "
        "between two versions, without a restart. `net-changes TABLE --from-version N`: it publishes the "
        "net row changes of versions N to the last one it published, as one block. Only watchers running when the signal is written act "
        "on it; one where TABLE does not run yet keeps it for 10 minutes and acts if TABLE starts there.",
    )
    kinds = p.add_subparsers(dest="signal_kind", metavar="SIGNAL", required=True)
    snap = kinds.add_parser(
        "snapshot",
        help="publish a fresh snapshot of TABLE",
        description="Ask the watcher running TABLE for a fresh snapshot of it. With --config FILE, the "
        "watchers' own configuration file: its kafka section, its signal_topic (a file whose "
        "signal_topic is null is refused: its watchers read no signals) and, when it names tables or "
        "discover prefixes, a check that TABLE is one of them (else refused: no watcher of FILE runs "
        "it). Prints one JSON line: the signal, the topic and the brokers it was written to.",
    )
    _common_arguments(snap)
    net = kinds.add_parser(
        "net-changes",
        help="publish the net row changes of TABLE from a version (a consumer re-seeding itself)",
        description="Ask the watcher running TABLE (with row changes) for the net row changes of versions "
        "--from-version N to the last version it published: per key one c, u or d event, in one "
        "BEGIN/END block marked as a backfill (source.snapshot true, last on its last event), in one "
        "Kafka transaction of its own; tailing goes on after it with no gap and no duplicate. The "
        "watcher refuses it (said with --wait: one line, exit 2) for a table without row changes, N "
        "beyond the last version published, or a range without the change data feed. --config FILE "
        "as for snapshot; a TABLE it gives no row changes is refused at once (exit 2).",
    )
    net.add_argument(
        "--from-version",
        type=_version,
        required=True,
        metavar="N",
        help="the range's first version (as watch --from-version names the first version of a catch-up)",
    )
    _common_arguments(net)


#: each command of this module and what adds its parser (build_parser takes the one that runs)
PARSERS = {
    "signal": _add_signal,
}


def _version(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a version: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"a version is 0 or more, not {value}")
    return value


def _common_arguments(snap: argparse.ArgumentParser) -> None:
    snap.add_argument("table", metavar="TABLE", help="the table's location, as the watcher was given it")
    add_kafka_arguments(snap)
    snap.add_argument(
        "--signal-topic",
        metavar="TOPIC",
        help=f"the watchers' signal_topic (default: the --config file's, else {SIGNAL_TOPIC}); one that "
        "differs from the file's is refused",
    )
    snap.add_argument(
        "--wait",
        action="store_true",
        help="exit 0 only once a watcher running TABLE took the signal (exit 1 if none did within "
        "--timeout, exit 2 if it refused it); for net-changes, once the block is committed: give a "
        "--timeout that covers publishing it",
    )
    snap.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        metavar="S",
        help=f"deadline of the whole command (default {DEFAULT_TIMEOUT_S:g} s): reaching the brokers, "
        "writing the signal and, with --wait, a watcher taking it",
    )
    snap.set_defaults(handler=cmd_signal)


def cmd_signal(args: argparse.Namespace) -> int:
    import time

    from deltamirror.core.errors import ConfigError, DeltaMirrorError
    from deltamirror.core.storage import normalize_table_uri

    deadline = time.monotonic() + _check_timeout(args.timeout)
    try:
        uri = normalize_table_uri(args.table)
    except DeltaMirrorError as exc:
        raise ConfigError(f"invalid table location: {exc.message}", table=args.table) from None
    kafka, topic = _settings(args, uri)
    from deltamirror.mirror.errors import KafkaError
    from deltamirror.mirror.kafka.connection import KafkaConnectionReporter
    from deltamirror.mirror.kafka.login_check import check_login

    # one line at the end says what went wrong: nothing is logged on the way (no librdkafka line)
    reporter = KafkaConnectionReporter(kafka.bootstrap_servers, quiet=True)
    config: dict[str, Any] = {**kafka.librdkafka_config(), **reporter.client_config()}
    if not check_login(config, reporter, timeout_s=_left(deadline, args)):  # a refused login: exit 2
        raise KafkaError(
            f"Kafka at {kafka.bootstrap_servers} did not answer within {args.timeout:g} s "
            f"({reporter.last_reason or 'no broker answered'}): the signal was not sent"
        )
    sender = _Sender(config, topic, reporter, deadline, args)
    signal = sender.send(uri)
    line: dict[str, Any] = {
        "signal": signal.kind,
        "tableUri": uri,
        "id": signal.id,
        **({"fromVersion": signal.from_version} if signal.from_version is not None else {}),
        "topic": topic,
        "bootstrapServers": kafka.bootstrap_servers,
    }
    if args.wait:
        refused = sender.wait_for_done(signal)
        if refused is not None:
            raise ConfigError(f"the watcher running {uri} refused the signal: {refused}")
        line["taken"] = True
    sys.stdout.write(json.dumps(line) + "\n")
    return 0


def _check_timeout(value: float) -> float:
    import math

    from deltamirror.core.errors import InvalidArgumentError

    if not (value > 0 and math.isfinite(value)):
        raise InvalidArgumentError("--timeout must be more than 0 s")
    return value


def _left(deadline: float, args: argparse.Namespace) -> float:
    import time

    from deltamirror.mirror.errors import KafkaError

    left = deadline - time.monotonic()
    if left <= 0:
        raise KafkaError(f"the signal could not be completed within --timeout {args.timeout:g} s")
    return left


def _settings(args: argparse.Namespace, uri: str) -> tuple[Any, str]:
    """The Kafka settings and the signal topic, from the flags and the ``--config`` file."""
    from deltamirror.core.errors import ConfigError
    from deltamirror.producer.settings import check_topic_name

    from .common import kafka_settings_from_args

    check_topic_name(args.signal_topic, "--signal-topic")
    if not args.config:
        return kafka_settings_from_args(args), args.signal_topic or SIGNAL_TOPIC
    from deltamirror.producer.config_file import load_signal_config

    loaded = load_signal_config(args.config, bootstrap_servers=args.bootstrap_servers)
    if loaded.signal_topic is None:
        raise ConfigError(
            "signal_topic is null: the watchers of this configuration read no signals", file=args.config
        )
    if args.signal_topic is not None and args.signal_topic != loaded.signal_topic:
        raise ConfigError(
            f"--signal-topic {args.signal_topic} differs from the file's signal_topic "
            f"{loaded.signal_topic}: the watchers of this configuration read {loaded.signal_topic}",
            file=args.config,
        )
    if loaded.watch is not None:
        settings = _runs(loaded.watch, uri)
        if settings is None:
            raise ConfigError(
                f"{uri} is neither a table of this configuration nor under one of its discover prefixes "
                "(with their include/exclude and max_depth): no watcher of it runs the table",
                file=args.config,
            )
        if args.signal_kind == "net-changes" and not settings.row_changes_on:
            raise ConfigError(
                f"{uri} publishes no row changes in this configuration (no row_changes: on its table or "
                "discover prefix): its watcher would refuse net-changes",
                file=args.config,
            )
    return loaded.kafka, loaded.signal_topic


def _runs(cfg: Any, uri: str) -> Any:
    """The settings under which a watcher of ``cfg`` runs the table at ``uri`` (normalized): one of
    its tables, or the discover prefix under which its discovery would find it; None: neither."""
    from deltamirror.producer.discovery.scan import selected

    for table in cfg.tables:
        if table.normalized_uri == uri:
            return table
    for source in cfg.discover:
        prefix = source.normalized_uri.rstrip("/")
        if uri == prefix:
            return source
        if uri.startswith(prefix + "/"):
            relative = uri[len(prefix) + 1 :].rstrip("/")
            if not source.leaves_out(relative) and selected(relative, source):  # the scan's rule
                return source
    return None


def _new_signal(uri: str, args: argparse.Namespace) -> Any:
    from deltamirror.mirror.records.signals import new_signal

    if args.signal_kind == "net-changes":
        return new_signal("net-changes", uri, from_version=args.from_version)
    return new_signal("snapshot", uri)


def _done(value: bytes, signal: Any) -> Any:
    """The watcher's ``done`` for ``signal`` a record of the signal topic is, else None (other
    records, whatever they are, are not)."""
    from deltamirror.mirror.records.boundary import BadRecordError
    from deltamirror.mirror.records.signals import decode_signal

    try:
        seen = decode_signal(value)
    except BadRecordError:
        return None
    return seen if seen.kind == "done" and seen.id == signal.id else None


class _Sender:
    """Writes the signal and, with ``--wait``, reads the topic for its ``done`` record."""

    def __init__(
        self, config: dict[str, Any], topic: str, reporter: Any, deadline: float, args: argparse.Namespace
    ) -> None:
        self.config = config
        self.topic = topic
        self.reporter = reporter
        self.deadline = deadline
        self.args = args
        self.ends: dict[int, int] = {}

    def _failed(self, exc: Exception, doing: str) -> Exception:
        """One line with the reason, whatever part failed (never an empty one)."""
        from deltamirror.mirror.errors import KafkaError

        self.reporter.check()  # a refused login is said as such (exit 2)
        reason = getattr(exc, "message", None) or str(exc) or type(exc).__name__
        if self.reporter.last_reason and self.reporter.last_reason not in reason:
            reason = f"{reason} ({self.reporter.last_reason})"
        return KafkaError(f"{doing}: {reason}", topic=self.topic)

    def send(self, uri: str) -> Any:
        from deltamirror.mirror.errors import KafkaError
        from deltamirror.mirror.kafka.producer import RecordProducer
        from deltamirror.mirror.records.signals import encode_signal
        from deltamirror.mirror.topics import TopicManager
        from deltamirror.producer.discovery.signals import SIGNAL_MAX_BYTES

        try:
            topics = TopicManager(
                self.config, max_record_bytes=SIGNAL_MAX_BYTES, timeout_s=_left(self.deadline, self.args)
            )
            topics.ensure_signal_topic(self.topic)
            if self.args.wait:  # where the watchers' answer will be: after what is there now
                self.ends = topics.end_offsets(self.topic, committed=False)
            signal = _new_signal(uri, self.args)
            # a producer's delivery timeout is at least 1 s: the deadline may pass by that much
            producer = RecordProducer(
                self.config, delivery_timeout_s=max(1.0, _left(self.deadline, self.args))
            )
            record = encode_signal(signal)
            assert record.value is not None  # a signal is never a tombstone
            try:
                producer.send(self.topic, record.value, record.key, record.headers)
            finally:
                producer.close(timeout_s=1.0)
        except KafkaError as exc:
            raise self._failed(exc, f"the signal was not sent to {self.topic}") from None
        return signal

    def wait_for_done(self, signal: Any) -> str | None:
        """Once a watcher's ``done`` record for ``signal`` is on the topic: None, or why the watcher
        refused it; else a KafkaError."""
        import threading

        from deltamirror.mirror.errors import KafkaError, StopRequested
        from deltamirror.mirror.kafka.consumer import MirrorConsumer

        stop = threading.Event()
        timer = threading.Timer(_left(self.deadline, self.args), stop.set)
        timer.start()
        try:
            with MirrorConsumer(self.config, purpose="signal", fetch_wait_max_ms=None) as consumer:
                consumer.assign((self.topic, p, o) for p, o in sorted(self.ends.items()))
                for batch in consumer.batches(until_end=False, stop=stop, poll_s=0.2):
                    for record in batch:
                        done = _done(record.value, signal)
                        if done is not None:
                            refused: str | None = done.refused
                            return refused
        except StopRequested:
            pass
        except KafkaError as exc:
            raise self._failed(
                exc, f"the signal was sent to {self.topic}, but its answer cannot be read"
            ) from None
        finally:
            timer.cancel()
        block = (
            ", or its block was not committed within that time (a large range takes longer: raise --timeout)"
            if signal.kind == "net-changes"
            else ""
        )
        raise KafkaError(
            f"the signal was sent to {self.topic}, but no watcher running {signal.table_uri} took it within "
            f"{self.args.timeout:g} s{block} (is one running that table, and reading {self.topic}? a "
            "watcher where the table starts within 10 minutes still acts on it)",
            topic=self.topic,
        )
