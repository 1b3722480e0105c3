"""A real single-node Apache Kafka (KRaft, broker+controller in one JVM) for laptops and tests.

Why not Docker: many developer machines and CI runners have a JDK but no container engine. Why not
a Kafka tarball: the jars are what matter, and Maven Central serves each one at a stable address
with a published checksum. ``kafka_artifacts.json`` (written by ``scripts/pin_kafka_artifacts.py``)
pins the broker's runtime classpath by SHA-256; jars are fetched once into
``${XDG_CACHE_HOME:-~/.cache}/deltamirror/kafka/<version>/`` and any other bytes are refused.

Layout of a data dir (default ``${XDG_CACHE_HOME:-~/.cache}/deltamirror/kafka-data/<port>``)::

    server.properties   the broker config; its ports bind the data dir for good (KRaft records them)
    log4j2.properties   sends the broker's log to server.log
    kafka-logs/         Kafka's log.dirs (topics, the __cluster_metadata quorum log)
    server.log          the broker's own log; stdout.log: JVM output (crashes, GC warnings)
    broker.pid          present while the broker runs

``auto.create.topics.enable`` is false on purpose: the watcher creates its topics with the partition
count and configs they need, and a typo in a consumer must not silently create an empty topic.

POSIX only (process groups, ``fcntl`` locks).
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from deltamirror.core.errors import ConfigError, EnvironmentMissingError, KafkaError

log = logging.getLogger(__name__)

MAVEN_CENTRAL = "https://repo1.maven.org/maven2"
MAVEN_REPO_ENV = "DELTAMIRROR_MAVEN_REPO"
MIN_JAVA = 17
HOST = "127.0.0.1"
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
DOWNLOAD_TIMEOUT_S = 60.0
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


# --- the pinned jars ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ArtifactPin:
    """One jar of the broker classpath, as Maven Central serves it."""

    group: str
    artifact: str
    version: str
    sha256: str
    size: int

    @property
    def file_name(self) -> str:
        return f"{self.artifact}-{self.version}.jar"

    @property
    def repo_path(self) -> str:
        return f"{self.group.replace('.', '/')}/{self.artifact}/{self.version}/{self.file_name}"


@dataclass(frozen=True)
class KafkaDistribution:
    kafka_version: str
    broker_main_class: str
    storage_tool_main_class: str
    artifacts: tuple[ArtifactPin, ...]


def load_distribution() -> KafkaDistribution:
    raw = resources.files("deltamirror.producer").joinpath("kafka_artifacts.json").read_text("utf-8")
    doc = json.loads(raw)
    return KafkaDistribution(
        kafka_version=doc["kafka_version"],
        broker_main_class=doc["broker_main_class"],
        storage_tool_main_class=doc["storage_tool_main_class"],
        artifacts=tuple(ArtifactPin(**a) for a in doc["artifacts"]),
    )


def _cache_root() -> Path:
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "deltamirror"


def jar_cache_dir(kafka_version: str) -> Path:
    return _cache_root() / "kafka" / kafka_version


def default_data_dir(port: int) -> Path:
    return _cache_root() / "kafka-data" / str(port)


def _sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def verify_jar(path: Path, pin: ArtifactPin) -> None:
    """Raise (and delete the file) unless ``path`` holds exactly the pinned bytes."""
    size = path.stat().st_size
    actual = _sha256_of(path) if size == pin.size else None
    if actual == pin.sha256:
        return
    path.unlink(missing_ok=True)
    raise KafkaError(
        f"checksum mismatch for {pin.group}:{pin.artifact}:{pin.version}; the file was deleted",
        file=str(path),
        expected_sha256=pin.sha256,
        actual_sha256=actual,
        expected_size=pin.size,
        actual_size=size,
    )


@contextlib.contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    """An exclusive advisory lock: other deltamirror processes wait, they do not race."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("a") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _download(url: str, dest: Path, pin: ArtifactPin) -> None:
    """Stream to a temp name in the cache dir, verify, then rename: a reader never sees half a jar."""
    fd, tmp_name = tempfile.mkstemp(dir=dest.parent, prefix=f".{pin.file_name}.", suffix=".part")
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out:
            try:
                with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as response:
                    shutil.copyfileobj(response, out, 1 << 20)
            except (urllib.error.URLError, OSError) as exc:
                raise KafkaError(f"cannot download {url}: {exc}", file=str(dest)) from exc
        verify_jar(tmp, pin)
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)


def missing_jars(
    artifacts: Sequence[ArtifactPin] | None = None, *, cache_dir: Path | None = None
) -> list[ArtifactPin]:
    """The pins not yet in the cache (by name and size; contents are checked by ensure_jars)."""
    dist = load_distribution()
    pins = dist.artifacts if artifacts is None else artifacts
    directory = cache_dir or jar_cache_dir(dist.kafka_version)
    missing = []
    for pin in pins:
        path = directory / pin.file_name
        if not path.is_file() or path.stat().st_size != pin.size:
            missing.append(pin)
    return missing


def ensure_jars(
    artifacts: Sequence[ArtifactPin] | None = None,
    *,
    cache_dir: Path | None = None,
    repo: str | None = None,
) -> list[Path]:
    """Return the verified classpath, downloading what the cache lacks.

    Every call re-hashes the cached jars (about 0.1 s for the broker): a truncated or tampered cache
    is replaced from the repository instead of crashing the JVM with a cryptic ZipException later.
    """
    dist = load_distribution()
    pins = dist.artifacts if artifacts is None else tuple(artifacts)
    directory = cache_dir or jar_cache_dir(dist.kafka_version)
    base = (repo or os.environ.get(MAVEN_REPO_ENV) or MAVEN_CENTRAL).rstrip("/")
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    with _locked(directory / ".lock"):
        for pin in pins:
            path = directory / pin.file_name
            if path.is_file():
                try:
                    verify_jar(path, pin)
                except KafkaError as exc:
                    log.warning("replacing a corrupt cached jar: %s", exc)
            if not path.is_file():
                log.info("downloading %s/%s", base, pin.repo_path)
                _download(f"{base}/{pin.repo_path}", path, pin)
            paths.append(path)
    return paths


# --- java -----------------------------------------------------------------------------------------


def _java_major(version_output: str) -> int | None:
    match = re.search(r'version "(\d+)(?:\.(\d+))?', version_output)
    if match is None:
        return None
    major = int(match.group(1))
    # Java 8 and older call themselves "1.8.0_x".
    return int(match.group(2) or 0) if major == 1 else major


def find_java() -> Path:
    """The java binary (JAVA_HOME first, then PATH), checked to be 17 or newer."""
    install_hint = (
        f"Java {MIN_JAVA}+ is required for `deltamirror local kafka`; install a JDK "
        "(e.g. `apt install openjdk-17-jre-headless`, `brew install openjdk@17`, or https://adoptium.net) "
        "and put java on PATH or set JAVA_HOME"
    )
    java_home = os.environ.get("JAVA_HOME")
    candidate = Path(java_home) / "bin" / "java" if java_home else None
    if candidate is None or not os.access(candidate, os.X_OK):
        found = shutil.which("java")
        if found is None:
            raise EnvironmentMissingError(install_hint)
        candidate = Path(found)
    try:
        probe = subprocess.run(
            [str(candidate), "-version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise EnvironmentMissingError(f"{install_hint} ({candidate} -version failed: {exc})") from exc
    major = _java_major(probe.stderr + probe.stdout)
    if major is None or major < MIN_JAVA:
        found_version = "unknown" if major is None else str(major)
        raise EnvironmentMissingError(f"{install_hint} (found Java {found_version} at {candidate})")
    return candidate


# --- processes and ports --------------------------------------------------------------------------


def _port_is_free(port: int) -> bool:
    # SO_REUSEADDR like the JVM's server sockets, so TIME_WAIT leftovers do not count as "in use".
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


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


def _process_alive(pid: int) -> bool:
    # If we are the parent (the broker was started by this process), reap it: a zombie is dead.
    with contextlib.suppress(ChildProcessError):
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie of another parent is dead too
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _command_line(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        pass
    try:
        out = subprocess.run(
            ["ps", "-o", "command=", "-p", str(pid)], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


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


class LocalKafka:
    """One single-node broker bound to a data dir; every method is safe to call twice."""

    def __init__(self, port: int = 9092, data_dir: Path | None = None) -> None:
        self.port = port
        self.data_dir = (data_dir or default_data_dir(port)).expanduser().resolve()
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def pid_file(self) -> Path:
        return self.data_dir / PID_FILE

    @property
    def log_file(self) -> Path:
        return self.data_dir / SERVER_LOG

    def ensure_jars(self) -> list[Path]:
        return ensure_jars()

    def status(self) -> dict[str, Any]:
        pid = self._running_pid()
        port = self._configured_port() or self.port
        return {
            "running": pid is not None,
            "pid": pid,
            "port": port,
            "bootstrap_servers": f"{HOST}:{port}",
            "data_dir": str(self.data_dir),
            "log_file": str(self.log_file),
            "kafka_version": load_distribution().kafka_version,
        }

    def start(self, timeout: float = READY_TIMEOUT_S) -> str:
        """Start (or find running) and return the bootstrap servers once the broker answers."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with _locked(self.data_dir / ".lock"):
            configured = self._configured_port()
            if configured is not None and configured != self.port:
                raise ConfigError(
                    f"data dir {self.data_dir} belongs to a broker on port {configured}; "
                    f"use --port {configured} or another --data-dir",
                    port=self.port,
                )
            if self._running_pid() is not None:
                _wait_until_ready(self.bootstrap_servers, timeout, None, self.data_dir)
                return self.bootstrap_servers
            self.pid_file.unlink(missing_ok=True)
            controller_port = self._controller_port()
            for port in (self.port, controller_port):
                if not _port_is_free(port):
                    raise ConfigError(
                        f"port {port} on {HOST} is already in use by another program; "
                        "stop it or choose another --port",
                        port=port,
                    )
            java = find_java()
            dist = load_distribution()
            classpath = os.pathsep.join(str(p) for p in ensure_jars())
            self._write_config(controller_port)
            if not (self.data_dir / KAFKA_LOG_DIRS / "meta.properties").is_file():
                self._format(java, classpath, dist)
            self._launch(java, classpath, dist)
            assert self._process is not None
            try:
                _wait_until_ready(self.bootstrap_servers, timeout, self._process, self.data_dir)
            except BaseException:
                self._terminate(self._process.pid)
                self.pid_file.unlink(missing_ok=True)
                raise
            return self.bootstrap_servers

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM (Kafka then flushes and closes its logs cleanly), SIGKILL after ``timeout``."""
        with _locked(self.data_dir / ".lock"):
            pid = self._running_pid()
            if pid is not None:
                self._terminate(pid, timeout)
            self.pid_file.unlink(missing_ok=True)
            self._process = None

    # -- internals --

    def _running_pid(self) -> int | None:
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        if self._process is not None and self._process.pid == pid:
            return pid if self._process.poll() is None else None
        if not _process_alive(pid):
            return None
        # A pid can be reused after a reboot; only a JVM running this data dir's config is ours.
        cmdline = _command_line(pid)
        if cmdline is not None and str(self.data_dir / SERVER_PROPERTIES) not in cmdline:
            return None
        return pid

    def _configured_port(self) -> int | None:
        path = self.data_dir / SERVER_PROPERTIES
        return _listener_port(_read_properties(path), "PLAINTEXT") if path.is_file() else None

    def _controller_port(self) -> int:
        """The existing one (the quorum's voter record names it), else port+1, else any free port."""
        path = self.data_dir / SERVER_PROPERTIES
        if path.is_file():
            existing = _listener_port(_read_properties(path), "CONTROLLER")
            if existing is not None:
                return existing
        return self.port + 1 if _port_is_free(self.port + 1) else _free_port()

    def _write_config(self, controller_port: int) -> None:
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.bootstrap.servers": f"{HOST}:{controller_port}",
            "listeners": f"PLAINTEXT://{HOST}:{self.port},CONTROLLER://{HOST}:{controller_port}",
            "advertised.listeners": f"PLAINTEXT://{HOST}:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
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
        }
        body = "".join(f"{k}={v}\n" for k, v in props.items())
        header = "# Written by deltamirror local kafka; regenerated on every start.\n"
        (self.data_dir / SERVER_PROPERTIES).write_text(header + body, encoding="utf-8")
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
        with (self.data_dir / STDOUT_LOG).open("ab") as out:
            # A new session: the broker outlives this Python process and ignores its Ctrl-C.
            self._process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.data_dir,
                start_new_session=True,
            )
        self.pid_file.write_text(f"{self._process.pid}\n", encoding="utf-8")

    def _terminate(self, pid: int, timeout: float = STOP_TIMEOUT_S) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        if self._wait_exit(pid, timeout):
            return
        log.warning("kafka (pid %d) ignored SIGTERM for %.0f s; killing it", pid, timeout)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        if not self._wait_exit(pid, 10.0):
            raise KafkaError(f"kafka (pid {pid}) survived SIGKILL", file=str(self.pid_file))

    def _wait_exit(self, pid: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process is not None and self._process.pid == pid:
                if self._process.poll() is not None:
                    return True
            elif not _process_alive(pid):
                return True
            time.sleep(0.1)
        return False


def _wait_until_ready(
    bootstrap: str, timeout: float, process: subprocess.Popen[bytes] | None, data_dir: Path
) -> None:
    """Poll until the broker serves metadata naming itself (it is then registered and unfenced)."""
    from confluent_kafka.admin import AdminClient  # heavy import, only needed here

    port = int(bootstrap.rsplit(":", 1)[1])
    deadline = time.monotonic() + timeout
    admin = None
    last_error = "no answer"
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
                admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
            try:
                metadata = admin.list_topics(timeout=2.0)
                if metadata.brokers:
                    return
                last_error = "no broker registered yet"
            except Exception as exc:  # librdkafka's KafkaException, timeouts
                last_error = str(exc)
        time.sleep(0.2)
    raise KafkaError(
        f"kafka did not answer on {bootstrap} within {timeout:.0f} s ({last_error}); "
        f"last complaint: {_last_complaint(data_dir / SERVER_LOG, data_dir / STDOUT_LOG)}",
        file=str(data_dir / SERVER_LOG),
    )
