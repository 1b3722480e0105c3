"""A real Confluent-compatible Schema Registry for laptops and tests: Apicurio Registry, built once.

Maven Central serves Apicurio Registry's Quarkus application as a plain jar
(``io.apicurio:apicurio-registry-app``); Quarkus makes it runnable at build time. So the first
start writes ``registry_pom.xml`` (a pom depending on that jar, with ``quarkus-maven-plugin`` at the
Quarkus version the app was built with) into the cache and runs ``mvn -C package`` once (Maven and
Java 17+ needed; Maven checks every download against Central's checksums). The resulting runtime
classpath, ``lib/``, must match ``registry_artifacts.json`` (written by
``scripts/pin_registry_artifacts.py``) by name, size and SHA-256, on every start; any other bytes
are deleted and refused. Why 2.4.2.Final (the newest version whose artifacts Central serves whole)
and what the pom changes: ``docs/schema-registry.md``.

Storage is in memory (the app's H2 ``jdbc:h2:mem``): a stop forgets every schema. The
Confluent-compatible API (what ``confluent_kafka.schema_registry.SchemaRegistryClient`` talks to)
is at ``http://127.0.0.1:<port>/apis/ccompat/v7``.

With ``basic_auth=(user, password)`` the registry checks HTTP basic credentials: every API call
without them, or with others, is answered 401. The build holds Quarkus' embedded users realm
(``quarkus-elytron-security-properties-file``) with basic auth on; a launch without
``basic_auth`` lists no user and leaves Apicurio's authorization off, so nothing asks for
credentials (any sent anyway are checked where a call needs its caller, a write, and refused: no
user matches). With it, Apicurio's authorization is on (anonymous calls
refused), its OIDC parts off, and the one user is read from a file of the data dir (mode 0600,
the password as Quarkus' digest, never on the command line).

Layout::

    ${XDG_CACHE_HOME:-~/.cache}/deltamirror/m2/                      Maven's local repository (the download cache)
    ${XDG_CACHE_HOME:-~/.cache}/deltamirror/registry/<version>/app/  the runner jar and lib/ (the build)
    ${XDG_CACHE_HOME:-~/.cache}/deltamirror/registry/<version>/build.log  Maven's output of the last build
    <data dir> (default .../deltamirror/registry-data/<port>)       registry.pid, registry.log, port

POSIX only (process groups, ``fcntl`` locks).
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape

from pydantic import SecretStr

from deltamirror.core.errors import ConfigError, EnvironmentMissingError, InvalidArgumentError
from deltamirror.devkafka.jars import (
    MAVEN_CENTRAL,
    MAVEN_REPO_ENV,
    cache_root,
    exclusive_lock,
    find_java,
    sha256_of,
)
from deltamirror.devkafka.processes import LocalJvmService, command_line
from deltamirror.devkafka.processes import port_is_free as _port_is_free
from deltamirror.devkafka.security import read_or_create_secret, write_private
from deltamirror.mirror.errors import LocalRegistryError

log = logging.getLogger(__name__)

HOST = "127.0.0.1"
DEFAULT_PORT = 8081
CCOMPAT_PATH = "/apis/ccompat/v7"
READY_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 30.0
BUILD_TIMEOUT_S = 1800.0
#: a development registry: C1 only and the serial GC start it in about half the time, in less memory
JVM_OPTS = (
    "-Xms64m",
    "-Xmx256m",
    "-XX:TieredStopAtLevel=1",
    "-XX:+UseSerialGC",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.awt.headless=true",
)
PID_FILE = "registry.pid"
PORT_FILE = "port"
LOG_FILE = "registry.log"
#: on the JVM's command line: how a pid is recognised as this data dir's registry
DATA_DIR_PROPERTY = "deltamirror.registry.data-dir"
#: the basic-auth user of a registry started with one: ``quarkus.security.users.embedded.users.<user>``
#: (mode 0600, Quarkus' digest of the password); read at launch through ``quarkus.config.locations``
USERS_FILE = "registry-users.properties"
#: the password ``deltamirror local registry start --user`` makes when given no --password-file
PASSWORD_FILE = "registry-password"
#: the embedded realm's name (``quarkus.security.users.embedded.realm-name``, fixed at build time)
REALM = "Quarkus"
#: runtime properties of a launch with basic auth: Apicurio's authorization on (anonymous calls
#: refused), Quarkus' OIDC tenant off (Apicurio turns it on with its authorization; it would ask
#: an OIDC server), the users as digests
BASIC_AUTH_PROPERTIES = (
    "-Dregistry.auth.enabled=true",
    "-Dquarkus.oidc.tenant-enabled=false",
    "-Dquarkus.security.users.embedded.plain-text=false",
    "-Dquarkus.security.users.embedded.algorithm=digest-md5",
)
_USER_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


# --- the pinned build -----------------------------------------------------------------------------


@dataclass(frozen=True)
class BuiltJar:
    """One jar of the registry's runtime classpath (``lib/``), as Maven Central serves it."""

    file_name: str
    #: where it lives in a Maven repository (deleted there too when its bytes are wrong)
    repo_path: str
    sha256: str
    size: int


@dataclass(frozen=True)
class RegistryDistribution:
    apicurio_version: str
    quarkus_version: str
    runner_jar: str
    lib: tuple[BuiltJar, ...]


def load_registry_distribution() -> RegistryDistribution:
    raw = resources.files("deltamirror.devkafka").joinpath("registry_artifacts.json").read_text("utf-8")
    doc = json.loads(raw)
    return RegistryDistribution(
        apicurio_version=doc["apicurio_version"],
        quarkus_version=doc["quarkus_version"],
        runner_jar=doc["runner_jar"],
        lib=tuple(BuiltJar(**jar) for jar in doc["lib"]),
    )


def build_pom() -> str:
    return resources.files("deltamirror.devkafka").joinpath("registry_pom.xml").read_text("utf-8")


def maven_repo() -> Path:
    """Maven's local repository: kept between runs (CI keeps $XDG_CACHE_HOME), so only the first build downloads."""
    return cache_root() / "m2"


def registry_cache_dir(version: str) -> Path:
    return cache_root() / "registry" / version


def app_dir(version: str) -> Path:
    return registry_cache_dir(version) / "app"


def verify_build(directory: Path, dist: RegistryDistribution, *, repo: Path | None = None) -> None:
    """Raise unless ``directory/lib`` holds exactly the pinned jars; a jar with other bytes is deleted,
    here and in the Maven repository it was copied from, so that the next build fetches it anew."""
    lib = directory / "lib"
    if not (directory / dist.runner_jar).is_file():
        raise LocalRegistryError(
            "the registry build has no runner jar", file=str(directory / dist.runner_jar)
        )
    present = {p.name for p in lib.iterdir()} if lib.is_dir() else set()
    pinned = {jar.file_name for jar in dist.lib}
    unexpected = sorted(present - pinned)
    if unexpected:
        raise LocalRegistryError(
            f"the registry build holds {len(unexpected)} jar(s) that are not pinned, first {unexpected[0]}",
            file=str(lib),
        )
    for jar in dist.lib:
        path = lib / jar.file_name
        if not path.is_file():
            raise LocalRegistryError(
                f"the registry build lacks the pinned jar {jar.file_name}", file=str(lib)
            )
        size = path.stat().st_size
        actual = sha256_of(path) if size == jar.size else None
        if actual == jar.sha256:
            continue
        path.unlink(missing_ok=True)
        (repo or maven_repo()).joinpath(jar.repo_path).unlink(missing_ok=True)
        raise LocalRegistryError(
            f"checksum mismatch for {jar.file_name}; the file was deleted",
            file=str(path),
            expected_sha256=jar.sha256,
            actual_sha256=actual,
            expected_size=jar.size,
            actual_size=size,
        )


def is_built(dist: RegistryDistribution | None = None) -> bool:
    """Whether a build is cached (its bytes are checked by :func:`ensure_build`)."""
    dist = dist or load_registry_distribution()
    return (app_dir(dist.apicurio_version) / dist.runner_jar).is_file()


def find_maven() -> Path:
    found = shutil.which("mvn")
    if found is None:
        raise EnvironmentMissingError(
            "Maven (mvn) is required once, to build the local Schema Registry (Apicurio Registry) from "
            "Maven Central; install it (e.g. `apt install maven`, `brew install maven`) and put mvn on PATH"
        )
    return Path(found)


def _settings_xml(repo_url: str) -> str:
    # Every repository a pom names (Apicurio's parent lists jitpack and Confluent's) goes to one place.
    return (
        '<settings xmlns="http://maven.apache.org/SETTINGS/1.0.0">\n'
        "  <mirrors>\n"
        "    <mirror>\n"
        "      <id>deltamirror</id>\n"
        "      <mirrorOf>*</mirrorOf>\n"
        f"      <url>{escape(repo_url)}</url>\n"
        "    </mirror>\n"
        "  </mirrors>\n"
        "</settings>\n"
    )


def _maven_complaint(log_path: Path) -> str:
    """The first ERROR line of Maven's output: the failed artifact or build step."""
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except OSError:
        return "nothing logged"
    for line in lines:
        if "[ERROR]" in line:
            text = re.sub(r"\x1b\[[0-9;]*m", "", line).replace("[ERROR]", "").strip()
            if text:
                return text[:500]
    return lines[-1][:500] if lines else "nothing logged"


def build(*, verify: bool = True, timeout: float = BUILD_TIMEOUT_S) -> Path:
    """Run the Maven build into the cache (under its lock) and return the app dir.

    ``verify=False`` is for ``scripts/pin_registry_artifacts.py``, which writes the pins from it.
    """
    dist = load_registry_distribution()
    cache = registry_cache_dir(dist.apicurio_version)
    cache.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(cache / ".lock"):
        return _build_locked(dist, cache, verify=verify, timeout=timeout)


def _build_locked(dist: RegistryDistribution, cache: Path, *, verify: bool, timeout: float) -> Path:
    mvn = find_maven()
    java = find_java()
    work = cache / "build"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    (work / "pom.xml").write_text(build_pom(), encoding="utf-8")
    repo_url = (os.environ.get(MAVEN_REPO_ENV) or MAVEN_CENTRAL).rstrip("/")
    (work / "settings.xml").write_text(_settings_xml(repo_url), encoding="utf-8")
    command = [
        str(mvn),
        "--batch-mode",
        "--strict-checksums",
        "--settings",
        str(work / "settings.xml"),
        f"-Dmaven.repo.local={maven_repo()}",
        "package",
    ]
    env = {**os.environ, "JAVA_HOME": str(java.resolve().parent.parent)}
    log_path = cache / "build.log"
    log.info("building Apicurio Registry %s with Maven (log: %s)", dist.apicurio_version, log_path)
    with log_path.open("wb") as out:
        try:
            done = subprocess.run(
                command, cwd=work, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                env=env, timeout=timeout, check=False,
            )  # fmt: skip
        except subprocess.TimeoutExpired as exc:
            raise LocalRegistryError(
                f"building Apicurio Registry {dist.apicurio_version} with Maven took over {timeout:.0f} s",
                file=str(log_path),
            ) from exc
    if done.returncode != 0:
        raise LocalRegistryError(
            f"building Apicurio Registry {dist.apicurio_version} with Maven failed: {_maven_complaint(log_path)}",
            file=str(log_path),
        )
    target = app_dir(dist.apicurio_version)
    staged = cache / "app.new"
    shutil.rmtree(staged, ignore_errors=True)
    staged.mkdir()
    os.replace(work / "target" / "lib", staged / "lib")
    os.replace(work / "target" / dist.runner_jar, staged / dist.runner_jar)
    if verify:
        try:
            verify_build(staged, dist)
        except LocalRegistryError:
            shutil.rmtree(staged, ignore_errors=True)
            raise
    shutil.rmtree(target, ignore_errors=True)
    os.replace(staged, target)
    shutil.rmtree(work, ignore_errors=True)
    return target


def ensure_build() -> Path:
    """The runner jar of a verified build: the cached one, else a new Maven build (minutes, once)."""
    dist = load_registry_distribution()
    cache = registry_cache_dir(dist.apicurio_version)
    cache.mkdir(parents=True, exist_ok=True)
    target = app_dir(dist.apicurio_version)
    with exclusive_lock(cache / ".lock"):
        if (target / dist.runner_jar).is_file():
            try:
                verify_build(target, dist)
                return target / dist.runner_jar
            except LocalRegistryError as exc:
                log.warning("rebuilding the registry: %s", exc)
                shutil.rmtree(target, ignore_errors=True)
        return _build_locked(dist, cache, verify=True, timeout=BUILD_TIMEOUT_S) / dist.runner_jar


# --- the registry process -------------------------------------------------------------------------


def default_data_dir(port: int) -> Path:
    return cache_root() / "registry-data" / str(port)


def basic_auth_header(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode("ascii")


def _probe(url: str, authorization: str | None = None) -> int | None:
    """The HTTP status of listing the ccompat API's subjects (200 with a list: the storage is up),
    None when nothing answers."""
    request = urllib.request.Request(f"{url}/subjects")
    if authorization is not None:
        request.add_header("Authorization", authorization)
    try:
        with urllib.request.urlopen(request, timeout=5.0) as response:
            return 200 if response.status == 200 and isinstance(json.loads(response.read()), list) else None
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, OSError, ValueError):
        return None


def made_password_file(data_dir: Path) -> Path:
    """``<data dir>/registry-password``: a random password made once (mode 0600), then reused."""
    data_dir.mkdir(parents=True, exist_ok=True)
    read_or_create_secret(data_dir / PASSWORD_FILE)
    return data_dir / PASSWORD_FILE


def users_file_text(user: str, password: str) -> str:
    """The embedded realm's one user, the password as its digest: HEX(MD5(user:realm:password))."""
    # the format Quarkus' digest-md5 realm stores (the registry only compares digests with it)
    digest = hashlib.md5(f"{user}:{REALM}:{password}".encode(), usedforsecurity=False).hexdigest()
    return f"quarkus.security.users.embedded.users.{user}={digest}\n"


def _last_complaint(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return "nothing logged"
    for line in reversed(lines):
        if re.search(r"\b(ERROR|FATAL)\b|Exception|Error:", line):
            return line.strip()[:500]
    return lines[-1].strip()[:500] if lines else "nothing logged"


class LocalRegistry(LocalJvmService):
    """One in-memory Apicurio Registry bound to a data dir (pid, log); every method is safe to call twice."""

    PID_FILE = PID_FILE
    SERVICE_NAME = "the registry"
    ERROR = LocalRegistryError
    STOP_TIMEOUT_S = STOP_TIMEOUT_S

    def __init__(
        self,
        port: int = DEFAULT_PORT,
        data_dir: Path | None = None,
        *,
        basic_auth: tuple[str, SecretStr | str] | None = None,
    ) -> None:
        """``basic_auth=(user, password)``: the registry refuses (401) every API call without these
        credentials; None (the default): it asks for none."""
        super().__init__(data_dir or default_data_dir(port))
        self.port = port
        self._basic_auth: tuple[str, SecretStr] | None = None
        if basic_auth is not None:
            user, password = basic_auth
            secret = password if isinstance(password, SecretStr) else SecretStr(password)
            if not _USER_NAME.fullmatch(user):
                raise InvalidArgumentError(
                    f"the registry's user name {user!r} must be 1-64 letters, digits, '_' or '-'"
                )
            value = secret.get_secret_value()
            if not value or "\n" in value or "\r" in value:
                raise InvalidArgumentError("the registry's password must be one non-empty line")
            self._basic_auth = (user, secret)

    @property
    def basic_auth_user(self) -> str | None:
        return self._basic_auth[0] if self._basic_auth is not None else None

    def _authorization(self) -> str | None:
        if self._basic_auth is None:
            return None
        user, password = self._basic_auth
        return basic_auth_header(user, password.get_secret_value())

    @property
    def users_file(self) -> Path:
        return self.data_dir / USERS_FILE

    @property
    def url(self) -> str:
        """The Confluent-compatible API: ``SchemaRegistryClient({"url": ...})``."""
        return f"http://{HOST}:{self._configured_port() or self.port}{CCOMPAT_PATH}"

    @property
    def log_file(self) -> Path:
        return self.data_dir / LOG_FILE

    def status(self) -> dict[str, Any]:
        pid = self._running_pid()
        return {
            "running": pid is not None,
            "pid": pid,
            "port": self._configured_port() or self.port,
            "url": self.url,
            "data_dir": str(self.data_dir),
            "log_file": str(self.log_file),
            "registry_version": load_registry_distribution().apicurio_version,
            "basic_auth": pid is not None and self._checks_credentials(pid),
        }

    def _checks_credentials(self, pid: int) -> bool:
        cmdline = command_line(pid) or ""
        return BASIC_AUTH_PROPERTIES[0] in cmdline

    def start(self, timeout: float = READY_TIMEOUT_S) -> str:
        """Start (or find running) and return the ccompat URL once it answers; builds first if needed."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with exclusive_lock(self.data_dir / ".lock"):
            configured = self._configured_port()
            running = self._running_pid()
            if running is not None:
                if configured is not None and configured != self.port:
                    raise ConfigError(
                        f"the registry of data dir {self.data_dir} runs on port {configured}; "
                        f"use --port {configured} or another --data-dir",
                        port=self.port,
                    )
                if self._checks_credentials(running) != (self._basic_auth is not None):
                    runs = "with" if self._basic_auth is None else "without"
                    raise ConfigError(
                        f"the registry of data dir {self.data_dir} runs {runs} basic auth; stop it "
                        "(deltamirror local registry stop) to start it otherwise, or use another --data-dir",
                        port=self.port,
                    )
                self._wait_until_ready(timeout, None)
                return self.url
            self.pid_file.unlink(missing_ok=True)
            if not _port_is_free(self.port):
                raise ConfigError(
                    f"port {self.port} on {HOST} is already in use by another program; "
                    "stop it or choose another --port",
                    port=self.port,
                )
            java = find_java()
            runner = ensure_build()
            (self.data_dir / PORT_FILE).write_text(f"{self.port}\n", encoding="utf-8")
            self._launch(java, runner)
            assert self._process is not None
            try:
                self._wait_until_ready(timeout, self._process)
            except BaseException:
                self._terminate(self._process.pid)
                self.pid_file.unlink(missing_ok=True)
                raise
            return self.url

    # -- internals --

    def _configured_port(self) -> int | None:
        try:
            return int((self.data_dir / PORT_FILE).read_text().strip())
        except (OSError, ValueError):
            return None

    def _owns(self, cmdline: str) -> bool:
        return f"-D{DATA_DIR_PROPERTY}={self.data_dir}" in cmdline

    def _launch(self, java: Path, runner: Path) -> None:
        auth: list[str] = []
        if self._basic_auth is not None:
            user, password = self._basic_auth
            write_private(self.users_file, users_file_text(user, password.get_secret_value()))
            auth = [*BASIC_AUTH_PROPERTIES, f"-Dquarkus.config.locations={self.users_file}"]
        else:
            self.users_file.unlink(missing_ok=True)
        command = [
            str(java),
            *JVM_OPTS,
            f"-D{DATA_DIR_PROPERTY}={self.data_dir}",
            f"-Dquarkus.http.host={HOST}",
            f"-Dquarkus.http.port={self.port}",
            *auth,
            "-jar",
            str(runner),
        ]
        self._spawn(command, self.log_file)

    def _wait_until_ready(self, timeout: float, process: subprocess.Popen[bytes] | None) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if process is not None and process.poll() is not None:
                raise LocalRegistryError(
                    f"the registry exited with code {process.returncode} during startup: "
                    f"{_last_complaint(self.log_file)}",
                    file=str(self.log_file),
                )
            status = _probe(self.url, self._authorization())
            if status == 200:
                return
            if status in (401, 403):
                raise ConfigError(
                    f"the registry at {self.url} refuses "
                    + ("these credentials" if self._basic_auth is not None else "calls without credentials")
                    + f" (HTTP {status}): it runs with another user or password; stop it "
                    "(deltamirror local registry stop) to start it with these",
                    port=self.port,
                )
            time.sleep(0.2)
        raise LocalRegistryError(
            f"the registry did not answer at {self.url} within {timeout:.0f} s: {_last_complaint(self.log_file)}",
            file=str(self.log_file),
        )
