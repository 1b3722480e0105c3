"""`deltamirror local registry start|stop|status`: a throwaway Confluent-compatible Schema Registry.

Apicurio Registry (in-memory storage) built once from Maven Central with Maven, then run on the
user's Java; see :mod:`deltamirror.devkafka.registry`. Like ``local kafka``: each handler prints one
line on stdout and returns the exit code, ``status`` exits 3 when no registry runs, and deltamirror
errors propagate to the main CLI (one line on stderr; exit 2 for a missing tool or a bad option,
1 when the build or the registry failed).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

EXIT_NOT_RUNNING = 3


def register_service(services: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``registry`` beside ``kafka`` under ``deltamirror local``."""
    registry = services.add_parser(
        "registry",
        help="a Confluent-compatible Schema Registry (Apicurio Registry, in memory) built once from "
        "Maven Central; needs Java 17+ and, for the first start, Maven",
        description="Run Apicurio Registry 2.4.2.Final with in-memory storage on 127.0.0.1 without "
        "Docker. Its Confluent-compatible API (for confluent_kafka.schema_registry and Kafka's Avro "
        "serializers) is at http://127.0.0.1:PORT/apis/ccompat/v7. The first start builds it with "
        "Maven (mvn) from Maven Central (or $DELTAMIRROR_MAVEN_REPO) into "
        "${XDG_CACHE_HOME:-~/.cache}/deltamirror (a few minutes and about 250 MB of downloads, "
        "once); every start checks the built classpath against pinned SHA-256. A stop forgets "
        "every schema.",
    )
    actions = registry.add_subparsers(dest="local_registry_action", metavar="ACTION", required=True)
    for name, handler, help_text in (
        ("start", _start, "start the registry (no-op if it already runs; builds it first if needed) "
         "and wait until it answers"),
        ("stop", _stop, "stop the registry (SIGTERM, then SIGKILL after 30 s)"),
        ("status", _status, "tell whether the registry runs (exit 3 if not)"),
    ):  # fmt: skip
        action = actions.add_parser(name, help=help_text)
        action.add_argument("--port", type=int, default=8081, help="HTTP port (default 8081)")
        action.add_argument(
            "--data-dir",
            type=Path,
            default=None,
            help="pid file and log (default ${XDG_CACHE_HOME:-~/.cache}/deltamirror/registry-data/<port>)",
        )
        if name == "start":
            action.add_argument(
                "--user",
                default=None,
                metavar="NAME",
                help="check HTTP basic auth: every API call needs this user and its password, others are "
                "answered 401 (default: no credentials asked)",
            )
            action.add_argument(
                "--password-file",
                type=Path,
                default=None,
                metavar="FILE",
                help="the --user's password, the file's first line (default: one made once into "
                "<data dir>/registry-password, mode 0600); never on the command line",
            )
        action.set_defaults(handler=handler)


def _registry(args: argparse.Namespace, basic_auth: tuple[str, Any] | None = None) -> Any:
    from deltamirror.core.errors import InvalidArgumentError
    from deltamirror.devkafka.registry import LocalRegistry

    if not 0 < args.port < 65536:
        raise InvalidArgumentError(f"--port must be 1-65535, not {args.port}")
    return LocalRegistry(port=args.port, data_dir=args.data_dir, basic_auth=basic_auth)


def _password_file(args: argparse.Namespace) -> Path | None:
    """The file holding the --user's password: --password-file, else one made once in the data dir."""
    from deltamirror.core.errors import InvalidArgumentError
    from deltamirror.devkafka.registry import default_data_dir, made_password_file

    if args.user is None:
        if args.password_file is not None:
            raise InvalidArgumentError("--password-file goes with --user")
        return None
    if args.password_file is not None:
        return Path(args.password_file).expanduser()
    return made_password_file((args.data_dir or default_data_dir(args.port)).expanduser().resolve())


def _read_password(path: Path) -> Any:
    from pydantic import SecretStr

    from deltamirror.core.errors import InvalidArgumentError

    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidArgumentError(f"--password-file {path} cannot be read: {type(exc).__name__}") from exc
    if not lines or not lines[0]:
        raise InvalidArgumentError(f"--password-file {path} holds no password on its first line")
    return SecretStr(lines[0])


def _start(args: argparse.Namespace) -> int:
    from deltamirror.devkafka.registry import is_built, load_registry_distribution, maven_repo

    password_file = _password_file(args)
    basic_auth = (args.user, _read_password(password_file)) if password_file is not None else None
    registry = _registry(args, basic_auth)
    if not is_built() and not registry.status()["running"]:
        print(
            f"building Apicurio Registry {load_registry_distribution().apicurio_version} with Maven "
            f"(once; downloads into {maven_repo()})...",
            file=sys.stderr,
        )
    url: str = registry.start()
    state = registry.status()
    print(f"registry running at {url} (pid {state['pid']}, data {state['data_dir']})")
    if password_file is not None:
        # the password by the file holding it: this output ends up in terminals, CI logs, tickets
        print(f"  basic auth: user {args.user}, password in {password_file}")
    return 0


def _stop(args: argparse.Namespace) -> int:
    registry = _registry(args)
    state = registry.status()
    registry.stop()
    if state["running"]:
        print(f"registry stopped (pid {state['pid']}, data {state['data_dir']})")
    else:
        print(f"registry was not running (data {state['data_dir']})")
    return 0


def _status(args: argparse.Namespace) -> int:
    state = _registry(args).status()
    if state["running"]:
        auth = ", basic auth" if state["basic_auth"] else ""
        print(
            f"registry running at {state['url']} (pid {state['pid']}, Apicurio Registry "
            f"{state['registry_version']}{auth}, data {state['data_dir']})"
        )
        return 0
    print(f"registry not running (port {state['port']}, data {state['data_dir']})")
    return EXIT_NOT_RUNNING
