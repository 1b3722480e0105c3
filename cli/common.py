"""Arguments shared by subcommands: the table, its storage options, a version or a timestamp."""

from __future__ import annotations

import argparse
from typing import Any


def parse_storage_options(pairs: list[str] | None) -> dict[str, Any]:
    from deltamirror.core.errors import InvalidArgumentError

    options: dict[str, Any] = {}
    for position, pair in enumerate(pairs or [], start=1):
        key, sep, value = pair.partition("=")
        if not sep or not key:
            # not "NAME=VALUE": the text may be a bare secret, so it is not echoed; its position is
            raise InvalidArgumentError(
                f"--storage-option #{position} is not NAME=VALUE (an fsspec option such as -S anon=true)"
            )
        options[key] = value
    return options


def parse_columns(text: str | None, flag: str = "--columns") -> list[str] | None:
    """``--columns a,b``: the names (None when not given); an empty list or name is refused, and a
    name given twice (columns match case-insensitively: ``id,ID`` too), since one would be printed."""
    from deltamirror.core.errors import InvalidArgumentError

    if text is None:
        return None
    names = [c.strip() for c in text.split(",")]
    if not any(names):
        raise InvalidArgumentError(f"{flag} is empty: name at least one column")
    if not all(names):
        raise InvalidArgumentError(f"{flag} has an empty name (two commas in a row, or one at an end)")
    seen: set[str] = set()
    for name in names:
        if name.casefold() in seen:
            raise InvalidArgumentError(f"{flag} names the column {name} twice")
        seen.add(name.casefold())
    return names


def add_table_argument(parser: argparse.ArgumentParser, *, reads_named_files: bool = True) -> None:
    """The table and its storage options; ``--allow-path-prefix`` too for a command that reads
    files the log names (data files, deletion vectors, checkpoint sidecars): one that reads only
    commit files has nothing to allow, and refuses the flag as unknown."""
    parser.add_argument(
        "table", metavar="TABLE", help="table location: a path or an fsspec URL (s3://, gs://, abfs://)"
    )
    parser.add_argument(
        "-S",
        "--storage-option",
        action="append",
        metavar="KEY=VALUE",
        help="fsspec storage option of an object store (credentials, endpoint); repeatable; a local "
        "table takes none (refused)",
    )
    if not reads_named_files:
        return
    parser.add_argument(
        "--allow-path-prefix",
        action="append",
        metavar="URI",
        help="also read files the log names under URI, outside the table root (a shallow clone's "
        "source; same storage as the table); repeatable",
    )


def add_version_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--version", type=int, metavar="N", help="read the table as of version N")
    group.add_argument(
        "--timestamp",
        metavar="TS",
        help="read the latest version committed at or before TS (ISO-8601, e.g. 2026-01-01T00:00:05.500Z)",
    )


#: the help of every -o
OUTPUT_HELP = (
    "write to PATH instead of stdout; PATH appears only once complete (written under a temporary "
    "name beside it, then renamed)"
)


def add_output_arguments(parser: argparse.ArgumentParser, formats: list[str], default: str) -> None:
    parser.add_argument(
        "--format", choices=formats, default=default, help=f"output format (default {default})"
    )
    parser.add_argument("-o", "--output", metavar="PATH", help=OUTPUT_HELP)


def open_table_from_args(args: argparse.Namespace) -> Any:
    from deltamirror.core.table import open_table

    return open_table(
        args.table,
        parse_storage_options(args.storage_option),
        allowed_path_prefixes=getattr(args, "allow_path_prefix", None) or (),
    )


#: what ``--config`` says on every command that reads Kafka (``watch`` says the same of its file)
KAFKA_CONFIG_HELP = (
    "YAML or TOML configuration whose kafka: section (brokers, security_protocol, SASL, TLS) is "
    "used, as watch uses it; the watcher's other sections are ignored"
)


def add_kafka_arguments(parser: argparse.ArgumentParser) -> None:
    """``--bootstrap-servers`` and ``--config``: how every consumer command reaches the brokers.

    The same Kafka settings as ``watch`` (one model, one file): the flag replaces the file's broker
    list, the SASL/SSL settings come from the file (a password as ``${VAR}`` or in the file).
    """
    parser.add_argument(
        "--bootstrap-servers",
        metavar="HOSTS",
        help="Kafka brokers, host:port[,...] (required without --config; replaces the file's)",
    )
    parser.add_argument("--config", metavar="FILE", help=KAFKA_CONFIG_HELP)


def kafka_settings_from_args(args: argparse.Namespace) -> Any:
    """The :class:`~deltamirror.mirror.settings.KafkaSettings` of ``--config`` / ``--bootstrap-servers``."""
    from deltamirror.core.errors import ConfigError
    from deltamirror.mirror.settings import KafkaSettings

    if args.config:
        from deltamirror.producer.config_file import load_kafka_settings

        return load_kafka_settings(args.config, bootstrap_servers=args.bootstrap_servers)
    if not args.bootstrap_servers:
        raise ConfigError("--bootstrap-servers is required without --config")
    return KafkaSettings.from_flags(
        {"bootstrap_servers": args.bootstrap_servers}, {"bootstrap_servers": "--bootstrap-servers"}
    )
