"""`deltamirror local kafka start|stop|status|abort-hanging`: a throwaway broker for trying deltamirror out.

Each handler prints one line on stdout (``abort-hanging``: one per transaction) and returns the
exit code; deltamirror errors propagate so that the main CLI reports them the same way as every
other command. ``status`` and ``abort-hanging`` exit 3 when no broker runs, like an LSB init
script, so shell scripts can test it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from .local_registry_cmd import register_service as register_registry

EXIT_NOT_RUNNING = 3


def _add_local(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    local = subparsers.add_parser("local", help="local services for development and tests")
    services = local.add_subparsers(dest="local_service", metavar="SERVICE", required=True)
    kafka = services.add_parser(
        "kafka",
        help="a single-node Apache Kafka broker (KRaft) run from Maven Central jars; needs Java 17+",
        description="Run a single-node Apache Kafka broker on 127.0.0.1 without Docker. The jars are "
        "downloaded once from Maven Central (or $DELTAMIRROR_MAVEN_REPO) and checked against pinned "
        "SHA-256. Topics are not auto-created.",
    )
    actions = kafka.add_subparsers(dest="local_kafka_action", metavar="ACTION", required=True)
    for name, handler, help_text in (
        ("start", _start, "start the broker (no-op if it already runs) and wait until it answers"),
        ("stop", _stop, "stop the broker cleanly (SIGTERM, then SIGKILL after 30 s)"),
        ("status", _status, "tell whether the broker runs (exit 3 if not)"),
        (
            "abort-hanging",
            _abort_hanging,
            "abort the transactions Kafka left hanging on the broker (kafka-transactions.sh find-hanging, "
            "then abort for each); a single broker killed mid-commit can leave one (exit 3 if no broker runs)",
        ),
    ):
        action = actions.add_parser(name, help=help_text)
        action.add_argument("--port", type=int, default=9092, help="client port (default 9092)")
        action.add_argument(
            "--data-dir",
            type=Path,
            default=None,
            help="broker state (default ${XDG_CACHE_HOME:-~/.cache}/deltamirror/kafka-data/<port>)",
        )
        if name == "start":
            action.add_argument(
                "--security",
                choices=("none", "scram-tls"),
                default="none",
                help="scram-tls: also a SASL_SSL listener (SCRAM-SHA-512 user 'deltamirror', TLS "
                "certificate of a CA made for the data dir) beside the PLAINTEXT one; prints the "
                "client settings and writes them to <data dir>/security/kafka-client.yaml for --config "
                "(default none)",
            )
            action.add_argument(
                "--secure-port",
                type=int,
                default=None,
                metavar="PORT",
                help="port of the SASL_SSL listener (default: the data dir's previous one, else port + 2)",
            )
        if name == "abort-hanging":
            action.add_argument(
                "--max-transaction-timeout",
                type=int,
                default=0,
                metavar="MINUTES",
                help="pass over transactions open for less than this many minutes (find-hanging's "
                "--max-transaction-timeout; default 0: every transaction whose producer the coordinator "
                "no longer has in a transaction)",
            )
            action.add_argument(
                "--dry-run", action="store_true", help="name the hanging transactions, abort none"
            )
        action.set_defaults(handler=handler)
    register_registry(services)


#: each command of this module and what adds its parser (build_parser takes the one that runs)
PARSERS = {
    "local": _add_local,
}


def _broker(args: argparse.Namespace) -> Any:
    from deltamirror.devkafka.broker import LocalKafka

    return LocalKafka(
        port=args.port,
        data_dir=args.data_dir,
        security=getattr(args, "security", "none"),
        secure_port=getattr(args, "secure_port", None),
    )


def _start(args: argparse.Namespace) -> int:
    from deltamirror.core.errors import ConfigError, InvalidArgumentError
    from deltamirror.devkafka.jars import load_distribution, missing_jars

    if args.secure_port is not None and args.security == "none":
        raise InvalidArgumentError("--secure-port goes with --security scram-tls")
    broker = _broker(args)
    running = broker.status()
    wanted = f"127.0.0.1:{args.secure_port}"
    if args.secure_port is not None and running["running"] and running["secure_bootstrap_servers"] != wanted:
        raise ConfigError(
            f"the broker of {running['data_dir']} runs with its SASL_SSL listener at "
            f"{running['secure_bootstrap_servers']}, not {wanted}: stop it (deltamirror local kafka stop) "
            "to start it with --secure-port"
        )
    missing = missing_jars()
    if missing and not broker.status()["running"]:
        size_mb = sum(pin.size for pin in missing) / 1e6
        print(
            f"fetching {len(missing)} Apache Kafka {load_distribution().kafka_version} jars "
            f"({size_mb:.0f} MB, once)...",
            file=sys.stderr,
        )
    bootstrap: str = broker.start()
    state = broker.status()
    print(f"kafka running at {bootstrap} (pid {state['pid']}, data {state['data_dir']})")
    secure = broker.secure_client_settings() if args.security != "none" else None
    if secure is not None:
        # the password by the file holding it: this output ends up in terminals, CI logs, tickets
        print(
            f"SASL_SSL listener at {secure.bootstrap_servers}; client settings (the kafka: section of --config):"
        )
        for line in secure.describe():
            print(f"  {line}")
        print(f"  whole section, password included (mode 0600): {secure.config_file}")
    return 0


def _stop(args: argparse.Namespace) -> int:
    broker = _broker(args)
    state = broker.status()
    broker.stop()
    if state["running"]:
        print(f"kafka stopped (pid {state['pid']}, data {state['data_dir']})")
    else:
        print(f"kafka was not running (data {state['data_dir']})")
    return 0


def _abort_hanging(args: argparse.Namespace) -> int:
    from deltamirror.core.errors import InvalidArgumentError
    from deltamirror.devkafka.tools import abort_hanging

    if args.max_transaction_timeout < 0:
        raise InvalidArgumentError("--max-transaction-timeout must be 0 or more (minutes)")
    state = _broker(args).status()
    if not state["running"]:
        print(f"kafka not running (port {state['port']}, data {state['data_dir']})")
        return EXIT_NOT_RUNNING
    bootstrap = state["bootstrap_servers"]
    found = abort_hanging(
        bootstrap, max_transaction_timeout_min=args.max_transaction_timeout, dry_run=args.dry_run
    )
    if not found:
        print(f"no hanging transaction on the broker at {bootstrap}")
    for txn in found:
        print(f"{'hanging (not aborted: --dry-run)' if args.dry_run else 'aborted'}: {txn}")
    return 0


def _status(args: argparse.Namespace) -> int:
    state = _broker(args).status()
    if state["running"]:
        secure = state["secure_bootstrap_servers"]
        print(
            f"kafka running at {state['bootstrap_servers']} (pid {state['pid']}, "
            f"Kafka {state['kafka_version']}, data {state['data_dir']}"
            + (f", SASL_SSL at {secure})" if secure else ")")
        )
        return 0
    print(f"kafka not running (port {state['port']}, data {state['data_dir']})")
    return EXIT_NOT_RUNNING
