"""A real single-node Apache Kafka (KRaft, broker+controller in one JVM) for laptops and tests.

The broker runs from the pinned, checksum-verified jars of :mod:`deltamirror.devkafka.jars`
on the user's own Java 17+; no Docker, no Kafka tarball.

Layout of a data dir (default ``${XDG_CACHE_HOME:-~/.cache}/deltamirror/kafka-data/<port>``)::

    server.properties   the broker config; its ports bind the data dir for good (KRaft records them)
    log4j2.properties   sends the broker's log to server.log
    kafka-logs/         Kafka's log.dirs (topics, the __cluster_metadata quorum log)
    server.log          the broker's own log; stdout.log: JVM output (crashes, GC warnings)
    broker.pid          present while the broker runs
    security/           with ``security="scram-tls"``: the SASL_SSL listener's CA, keystore and
                        SCRAM password (see :mod:`deltamirror.devkafka.security`)

``auto.create.topics.enable`` is false on purpose: the watcher creates its topics with the partition
count and configs they need, and a typo in a consumer must not silently create an empty topic.

POSIX only (process groups, ``fcntl`` locks).
"""

from __future__ import annotations

import base64
import logging
import os
import re
import socket
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

from deltamirror.core.errors import ConfigError
from deltamirror.devkafka.jars import (
    KafkaDistribution,
    cache_root,
    ensure_jars,
    exclusive_lock,
    find_java,
    load_distribution,
)
from deltamirror.devkafka.processes import LocalJvmService
from deltamirror.devkafka.processes import port_is_free as _port_is_free
from deltamirror.devkafka.security import (
    LISTENER,
    SecureClientSettings,
    check_mode,
    client_settings,
    ensure_tls_material,
    listener_properties,
    upsert_scram_user,
    write_private,
)
from deltamirror.mirror.errors import KafkaError

log = logging.getLogger(__name__)

HOST = "127.0.0.1"
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
JVM_OPTS = (
    "-Xms128m",
    "-Xmx512m",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.awt.headless=true",
)

PID_FILE = "broker.pid"
SERVER_PROPERTIES = "server.properties"
LOG4J_PROPERTIES = "log4j2.properties"
KAFKA_LOG_DIRS = "kafka-logs"
SERVER_LOG = "server.log"
STDOUT_LOG = "stdout.log"


def default_data_dir(port: int) -> Path:
    return cache_root() / "kafka-data" / str(port)


# --- processes and ports --------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        port: int = s.getsockname()[1]
        return port


def _accepts_connections(port: int) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=1.0):
            return True
    except OSError:
        return False


def _random_cluster_id() -> str:
    # Kafka's Uuid.randomUuid(): base64url without padding, never starting with '-' (a CLI flag).
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


def _last_complaint(*logs: Path) -> str:
    """The last ERROR/exception line of the broker's logs: enough for a one-line error message."""
    for path in logs:
        try:
            lines = path.read_text(errors="replace").splitlines()
        except OSError:
            continue
        for line in reversed(lines):
            if re.search(r"\b(ERROR|FATAL)\b|Exception|Error:", line):
                return line.strip()[:500]
    return "nothing logged"


def _read_properties(path: Path) -> dict[str, str]:
    props = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line and not line.startswith(("#", "!")) and "=" in line:
            key, value = line.split("=", 1)
            props[key.strip()] = value.strip()
    return props


def _listener_port(props: dict[str, str], name: str) -> int | None:
    match = re.search(rf"(?:^|,)\s*{name}://[^,]*:(\d+)", props.get("listeners", ""))
    return int(match.group(1)) if match else None


# --- the broker -----------------------------------------------------------------------------------


class LocalKafka(LocalJvmService):
    """One single-node broker bound to a data dir; every method is safe to call twice.

    ``security="scram-tls"`` adds a SASL_SSL listener (SCRAM-SHA-512, a certificate of a CA made
    for the data dir) on ``secure_port`` (default: the one the data dir used before, else port + 2
    when free, else any free port) beside the unchanged PLAINTEXT one; :meth:`secure_client_settings`
    says how a client reaches it.
    """

    PID_FILE = PID_FILE
    SERVICE_NAME = "kafka"
    ERROR = KafkaError
    STOP_TIMEOUT_S = STOP_TIMEOUT_S

    def __init__(
        self,
        port: int = 9092,
        data_dir: Path | None = None,
        *,
        security: str = "none",
        secure_port: int | None = None,
    ) -> None:
        super().__init__(data_dir or default_data_dir(port))
        self.port = port
        self.security = check_mode(security)
        self._secure_port_wanted = secure_port

    @property
    def bootstrap_servers(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def log_file(self) -> Path:
        return self.data_dir / SERVER_LOG

    def ensure_jars(self) -> list[Path]:
        return ensure_jars()

    def status(self) -> dict[str, Any]:
        pid = self._running_pid()
        port = self._configured_port() or self.port
        secure = self._configured_secure_port()
        return {
            "running": pid is not None,
            "pid": pid,
            "port": port,
            "bootstrap_servers": f"{HOST}:{port}",
            "secure_bootstrap_servers": f"{HOST}:{secure}" if secure is not None else None,
            "data_dir": str(self.data_dir),
            "log_file": str(self.log_file),
            "kafka_version": load_distribution().kafka_version,
        }

    def secure_client_settings(self) -> SecureClientSettings | None:
        """How a client reaches the SASL_SSL listener; None when the config has none."""
        secure = self._configured_secure_port()
        return client_settings(self.data_dir, f"{HOST}:{secure}") if secure is not None else None

    def start(self, timeout: float = READY_TIMEOUT_S) -> str:
        """Start (or find running) and return the bootstrap servers once the broker answers."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with exclusive_lock(self.data_dir / ".lock"):
            configured = self._configured_port()
            if configured is not None and configured != self.port:
                raise ConfigError(
                    f"data dir {self.data_dir} belongs to a broker on port {configured}; "
                    f"use --port {configured} or another --data-dir",
                    port=self.port,
                )
            secured = self.security != "none"
            if self._running_pid() is not None:
                if secured and self._configured_secure_port() is None:
                    raise ConfigError(
                        f"the broker of {self.data_dir} runs without the {LISTENER} listener; "
                        "stop it (deltamirror local kafka stop) and start it again with --security",
                        port=self.port,
                    )
                _wait_until_ready(self.bootstrap_servers, timeout, None, self.data_dir)
                return self.bootstrap_servers
            self.pid_file.unlink(missing_ok=True)
            controller_port = self._controller_port()
            secure_port = self._secure_port(controller_port) if secured else None
            for port in (self.port, controller_port, *([secure_port] if secure_port is not None else [])):
                if not _port_is_free(port):
                    raise ConfigError(
                        f"port {port} on {HOST} is already in use by another program; "
                        "stop it or choose another --port",
                        port=port,
                    )
            java = find_java()
            dist = load_distribution()
            classpath = os.pathsep.join(str(p) for p in ensure_jars())
            self._write_config(controller_port, secure_port)
            if not (self.data_dir / KAFKA_LOG_DIRS / "meta.properties").is_file():
                self._format(java, classpath, dist)
            self._launch(java, classpath, dist)
            assert self._process is not None
            try:
                _wait_until_ready(self.bootstrap_servers, timeout, self._process, self.data_dir)
                if secure_port is not None:
                    upsert_scram_user(
                        self.bootstrap_servers, client_settings(self.data_dir, f"{HOST}:{secure_port}")
                    )
            except BaseException:
                self._terminate(self._process.pid)
                self.pid_file.unlink(missing_ok=True)
                raise
            return self.bootstrap_servers

    # -- internals --

    def _owns(self, cmdline: str) -> bool:
        return str(self.data_dir / SERVER_PROPERTIES) in cmdline

    def _configured_port(self, listener: str = "PLAINTEXT") -> int | None:
        path = self.data_dir / SERVER_PROPERTIES
        return _listener_port(_read_properties(path), listener) if path.is_file() else None

    def _configured_secure_port(self) -> int | None:
        return self._configured_port(LISTENER)

    def _secure_port(self, controller_port: int) -> int:
        """The one asked for, else the data dir's previous one (clients know it), else port+2, else any."""
        if self._secure_port_wanted is not None:
            if self._secure_port_wanted in (self.port, controller_port):
                raise ConfigError(
                    f"--secure-port {self._secure_port_wanted} is taken by the broker's own listeners",
                    port=self._secure_port_wanted,
                )
            return self._secure_port_wanted
        existing = self._configured_secure_port()
        if existing is not None:
            return existing
        candidate = self.port + 2
        if candidate != controller_port and _port_is_free(candidate):
            return candidate
        return _free_port()

    def _controller_port(self) -> int:
        """The existing one (the quorum's voter record names it), else port+1, else any free port."""
        existing = self._configured_port("CONTROLLER")
        if existing is not None:
            return existing
        return self.port + 1 if _port_is_free(self.port + 1) else _free_port()

    def _write_config(self, controller_port: int, secure_port: int | None = None) -> None:
        listeners = f"PLAINTEXT://{HOST}:{self.port},CONTROLLER://{HOST}:{controller_port}"
        advertised = f"PLAINTEXT://{HOST}:{self.port}"
        protocols = "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT"
        secured: dict[str, str] = {}
        if secure_port is not None:
            listeners += f",{LISTENER}://{HOST}:{secure_port}"
            advertised += f",{LISTENER}://{HOST}:{secure_port}"
            protocols += f",{LISTENER}:{LISTENER}"
            _, keystore, store_password = ensure_tls_material(self.data_dir)
            secured = listener_properties(keystore, store_password)
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.bootstrap.servers": f"{HOST}:{controller_port}",
            "listeners": listeners,
            "advertised.listeners": advertised,
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": protocols,
            "log.dirs": str(self.data_dir / KAFKA_LOG_DIRS),
            "auto.create.topics.enable": "false",
            "num.partitions": "1",
            # One broker: every internal topic must accept a single replica.
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "4",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "4",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            **secured,
        }
        body = "".join(f"{k}={v}\n" for k, v in props.items())
        header = "# Written by deltamirror local kafka; regenerated on every start.\n"
        # 0600: with the secured listener it holds the keystore's password
        write_private(self.data_dir / SERVER_PROPERTIES, header + body)
        log4j = (
            "status = warn\n"
            "shutdownHook = disable\n"
            "appender.file.type = File\n"
            "appender.file.name = FILE\n"
            f"appender.file.fileName = {self.log_file}\n"
            "appender.file.layout.type = PatternLayout\n"
            "appender.file.layout.pattern = [%d] %p %m (%c)%n\n"
            "rootLogger.level = INFO\n"
            "rootLogger.appenderRef.file.ref = FILE\n"
            "logger.kafka_request.name = kafka.request.logger\n"
            "logger.kafka_request.level = WARN\n"
        )
        (self.data_dir / LOG4J_PROPERTIES).write_text(log4j, encoding="utf-8")

    def _java_command(self, java: Path, classpath: str, main_class: str, heap: str) -> list[str]:
        return [
            str(java),
            *JVM_OPTS,
            heap,
            f"-Dlog4j2.configurationFile={self.data_dir / LOG4J_PROPERTIES}",
            f"-Dkafka.logs.dir={self.data_dir}",
            "-cp",
            classpath,
            main_class,
        ]

    def _format(self, java: Path, classpath: str, dist: KafkaDistribution) -> None:
        command = [
            *self._java_command(java, classpath, dist.storage_tool_main_class, "-Xmx256m"),
            "format",
            "--standalone",
            "--cluster-id",
            _random_cluster_id(),
            "--config",
            str(self.data_dir / SERVER_PROPERTIES),
        ]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
        if done.returncode != 0:
            raise KafkaError(
                f"formatting the KRaft storage failed: {(done.stderr or done.stdout).strip()[-2000:]}",
                file=str(self.data_dir / KAFKA_LOG_DIRS),
            )

    def _launch(self, java: Path, classpath: str, dist: KafkaDistribution) -> None:
        command = [
            *self._java_command(java, classpath, dist.broker_main_class, "-Xmx512m"),
            str(self.data_dir / SERVER_PROPERTIES),
        ]
        self._spawn(command, self.data_dir / STDOUT_LOG)


def _wait_until_ready(
    bootstrap: str, timeout: float, process: subprocess.Popen[bytes] | None, data_dir: Path
) -> None:
    """Poll until the broker serves metadata naming itself (it is then registered and unfenced)."""
    from deltamirror.mirror.kafka import clients  # heavy import, only needed here

    port = int(bootstrap.rsplit(":", 1)[1])
    deadline = time.monotonic() + timeout
    admin = None
    last_error = "no answer"
    # the cluster this data dir was formatted for: another broker that took the port between the
    # check that it was free and this broker's bind answers too, and must not pass for this one
    meta = data_dir / KAFKA_LOG_DIRS / "meta.properties"
    ours = _read_properties(meta).get("cluster.id") if meta.is_file() else None
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise KafkaError(
                f"kafka exited with code {process.returncode} during startup: "
                f"{_last_complaint(data_dir / STDOUT_LOG, data_dir / SERVER_LOG)}",
                file=str(data_dir / SERVER_LOG),
            )
        # Probe TCP first: librdkafka would print a line per refused connection.
        if _accepts_connections(port):
            if admin is None:
                admin = clients.admin({"bootstrap.servers": bootstrap, "log_level": 0})
            try:
                metadata = admin.list_topics(timeout=2.0)
                answering = metadata.cluster_id
                if metadata.brokers and ours is not None and answering and answering != ours:
                    last_error = f"another broker (cluster {answering}) answers on port {port}"
                elif metadata.brokers:
                    return
                else:
                    last_error = "no broker registered yet"
            except Exception as exc:  # librdkafka's KafkaException, timeouts
                last_error = str(exc)
        time.sleep(0.2)
    raise KafkaError(
        f"kafka did not answer on {bootstrap} within {timeout:.0f} s ({last_error}); "
        f"last complaint: {_last_complaint(data_dir / SERVER_LOG, data_dir / STDOUT_LOG)}",
        file=str(data_dir / SERVER_LOG),
    )
