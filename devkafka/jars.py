"""The pinned Apache Kafka broker classpath, its verified jar cache, and the java that runs it.

Why not Docker: many developer machines and CI runners have a JDK but no container engine. Why not
a Kafka tarball: the jars are what matter, and Maven Central serves each one at a stable address
with a published checksum. ``kafka_artifacts.json`` (written by ``scripts/pin_kafka_artifacts.py``)
pins the broker's runtime classpath by SHA-256 (and, as ``tool_artifacts``, the jar Kafka's admin
tools need on top of it, fetched only when a tool runs); jars are fetched once into
``${XDG_CACHE_HOME:-~/.cache}/deltamirror/kafka/<version>/`` and any other bytes are refused.

POSIX only (``fcntl`` locks).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from deltamirror.core.errors import EnvironmentMissingError
from deltamirror.mirror.errors import KafkaError

log = logging.getLogger(__name__)

MAVEN_CENTRAL = "https://repo1.maven.org/maven2"
MAVEN_REPO_ENV = "DELTAMIRROR_MAVEN_REPO"
MIN_JAVA = 17
DOWNLOAD_TIMEOUT_S = 60.0


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
    #: ``kafka-transactions.sh``'s class (in ``tool_artifacts``)
    transactions_tool_main_class: str
    artifacts: tuple[ArtifactPin, ...]
    #: what the admin tools need besides ``artifacts`` (not on the broker's classpath)
    tool_artifacts: tuple[ArtifactPin, ...]


def load_distribution() -> KafkaDistribution:
    raw = resources.files("deltamirror.devkafka").joinpath("kafka_artifacts.json").read_text("utf-8")
    doc = json.loads(raw)
    return KafkaDistribution(
        kafka_version=doc["kafka_version"],
        broker_main_class=doc["broker_main_class"],
        storage_tool_main_class=doc["storage_tool_main_class"],
        transactions_tool_main_class=doc["transactions_tool_main_class"],
        artifacts=tuple(ArtifactPin(**a) for a in doc["artifacts"]),
        tool_artifacts=tuple(ArtifactPin(**a) for a in doc["tool_artifacts"]),
    )


def cache_root() -> Path:
    """Shared by the jar cache and the brokers' data dirs (see broker.py)."""
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "deltamirror"


def jar_cache_dir(kafka_version: str) -> Path:
    return cache_root() / "kafka" / kafka_version


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def verify_jar(path: Path, pin: ArtifactPin) -> None:
    """Raise (and delete the file) unless ``path`` holds exactly the pinned bytes."""
    size = path.stat().st_size
    actual = sha256_of(path) if size == pin.size else None
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
def exclusive_lock(lock_path: Path) -> Iterator[None]:
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
    with exclusive_lock(directory / ".lock"):
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


def ensure_tool_jars() -> list[Path]:
    """The verified classpath of Kafka's admin tools: the broker's jars and the tools' own."""
    dist = load_distribution()
    return ensure_jars((*dist.artifacts, *dist.tool_artifacts))


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
