"""A real S3-API server for the tests: s3proxy (Maven Central) on the installed Java, over HTTP.

Not a mock: s3fs signs and sends real requests to a server on 127.0.0.1 that stores objects in a
temp folder (its filesystem blobstore). The jar is fetched once into the same verified cache as the
broker's jars (:func:`deltamirror.devkafka.jars.ensure_jars`: pinned size and SHA-256, any
other bytes refused). The server logs every request it receives (``LOG_LEVEL=debug``), so a test
can count what a watcher really costs per poll (:meth:`S3Proxy.requests`).

Loaded by ``tests/conftest.py`` via ``pytest_plugins``; the ``s3`` fixture starts one server per
session on first use.
"""

from __future__ import annotations

import os
import re
import secrets
import socket
import subprocess
import time
import urllib.parse
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from deltamirror.devkafka.jars import ArtifactPin, cache_root, ensure_jars, find_java

S3PROXY_VERSION = "4.1.0"
START_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class ClassifiedPin(ArtifactPin):
    """A Maven artifact with a classifier (s3proxy's self-contained ``jar-with-dependencies``)."""

    classifier: str = ""

    @property
    def file_name(self) -> str:
        return f"{self.artifact}-{self.version}-{self.classifier}.jar"


S3PROXY_JAR = ClassifiedPin(
    group="org.gaul",
    artifact="s3proxy",
    version=S3PROXY_VERSION,
    sha256="a4d025969aaf796616ed4b1e2491d87d455ce84bb28cb9db086b2e6aaa68b48d",
    size=54955934,
    classifier="jar-with-dependencies",
)

#: one request line of s3proxy's debug log: "... request: ...{GET@1a2b http://host:port/b/k?q HTTP/1.1}"
_REQUEST_LINE = re.compile(r"request: .*\{(GET|HEAD|PUT|POST|DELETE)@[0-9a-f]+ (\S+) HTTP/")


@dataclass(frozen=True)
class S3Request:
    """One request the server received."""

    method: str
    bucket: str
    key: str
    query: dict[str, str]

    @property
    def kind(self) -> str:
        """LIST (a bucket listing), HEAD, GET (an object's bytes), or the method."""
        if self.method == "GET" and not self.key and ("list-type" in self.query or "prefix" in self.query):
            return "LIST"
        return self.method

    @property
    def listed_prefix(self) -> str:
        return self.query.get("prefix", "")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


class S3Proxy:
    """One s3proxy process: endpoint, generated credentials, one bucket, and its request log."""

    def __init__(self, workdir: Path, bucket: str = "lake") -> None:
        self.workdir = workdir
        self.bucket = bucket
        self.key = "AK" + secrets.token_hex(8).upper()
        self.secret = secrets.token_urlsafe(24)
        self.port = _free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.log_path = workdir / "s3proxy.log"
        self._process: subprocess.Popen[bytes] | None = None

    # --- the process --------------------------------------------------------------------------

    def start(self) -> None:
        jar = ensure_jars([S3PROXY_JAR], cache_dir=cache_root() / "s3proxy" / S3PROXY_VERSION)[0]
        blobs = self.workdir / "blobs"
        blobs.mkdir(parents=True, exist_ok=True)
        props = self.workdir / "s3proxy.properties"
        props.write_text(
            "\n".join(
                [
                    f"s3proxy.endpoint={self.endpoint}",
                    "s3proxy.authorization=aws-v2-or-v4",
                    f"s3proxy.identity={self.key}",
                    f"s3proxy.credential={self.secret}",
                    "jclouds.provider=filesystem",
                    f"jclouds.filesystem.basedir={blobs}",
                    "",
                ]
            )
        )
        env = {**os.environ, "LOG_LEVEL": "debug", "JETTY_LOG_LEVEL": "info"}
        with self.log_path.open("wb") as log:
            self._process = subprocess.Popen(
                [str(find_java()), "-Xmx256m", "-jar", str(jar), "--properties", str(props)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while b"Started ogsoejs.Server" not in self.log_path.read_bytes():
            if self._process.poll() is not None or time.monotonic() > deadline:
                tail = self.log_path.read_text(errors="replace")[-2000:]
                self.stop()
                raise RuntimeError(f"s3proxy did not start on {self.endpoint}:\n{tail}")
            time.sleep(0.1)
        self.filesystem().call_s3("create_bucket", Bucket=self.bucket)

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(10)
        self._process = None

    # --- clients ------------------------------------------------------------------------------

    @property
    def storage_options(self) -> dict[str, Any]:
        """What a table's ``storage_options`` hold to reach this server through s3fs."""
        return {"key": self.key, "secret": self.secret, "endpoint_url": self.endpoint}

    def filesystem(self) -> Any:
        """A separate s3fs client (no shared instance, no listings cache): another writer, as a
        table's own writer is to a watcher."""
        import s3fs

        return s3fs.S3FileSystem(**self.storage_options, skip_instance_cache=True, use_listings_cache=False)

    def url(self, key: str) -> str:
        return f"s3://{self.bucket}/{key.strip('/')}"

    def new_prefix(self, name: str) -> str:
        """A key prefix no other test uses."""
        return f"{name}-{uuid.uuid4().hex[:8]}"

    @staticmethod
    def files_of(local: Path) -> set[str]:
        """The files of a local table, as paths relative to it (Hadoop ``.crc`` files left out:
        nothing reads them)."""
        return {
            p.relative_to(local).as_posix()
            for p in local.rglob("*")
            if p.is_file() and not (p.name.startswith(".") and p.name.endswith(".crc"))
        }

    def upload_table(self, local: Path, key: str, *, skip: Iterable[str] = ()) -> str:
        """Copy the Delta table at ``local`` under ``key``, file by file, the log last (a reader
        never sees a commit before its data); ``skip`` names relative paths left out (those
        already uploaded, to add only a new commit). Returns the table's URL."""
        fs = self.filesystem()
        files = sorted(self.files_of(local) - set(skip))
        data = [f for f in files if not f.startswith("_delta_log/")]
        log = [f for f in files if f.startswith("_delta_log/")]
        for batch in (data, log):  # each batch concurrently, the log after the data
            if batch:
                fs.pipe({f"{self.bucket}/{key}/{f}": (local / f).read_bytes() for f in batch})
        return self.url(key)

    def put(self, key: str, data: bytes) -> None:
        self.filesystem().pipe_file(f"{self.bucket}/{key}", data)

    # --- what the server received ---------------------------------------------------------------

    def requests(self, since: int = 0) -> list[S3Request]:
        """Requests received since log offset ``since`` (see :meth:`mark`), in arrival order."""
        with self.log_path.open("rb") as f:
            f.seek(since)
            text = f.read().decode("utf-8", errors="replace")
        out = []
        for method, url in _REQUEST_LINE.findall(text):
            parts = urllib.parse.urlsplit(url)
            bucket, _, key = urllib.parse.unquote(parts.path).lstrip("/").partition("/")
            query = dict(urllib.parse.parse_qsl(parts.query, keep_blank_values=True))
            out.append(S3Request(method, bucket, key, query))
        return out

    def mark(self) -> int:
        """A point in the request log; :meth:`requests` counts from there."""
        return self.log_path.stat().st_size


@pytest.fixture(scope="session")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Proxy]:
    """The session's S3-API server (started on first use, stopped at the end)."""
    pytest.importorskip("s3fs", reason="the s3 extra is not installed (pip install -e '.[s3]')")
    server = S3Proxy(tmp_path_factory.mktemp("s3proxy"))
    try:
        server.start()
    except Exception as exc:
        reason = f"no S3 server: {exc}"
        if os.environ.get("DELTAMIRROR_REQUIRE_ALL"):
            pytest.fail(reason)
        pytest.skip(reason)
    try:
        yield server
    finally:
        server.stop()
