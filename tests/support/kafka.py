"""The session's Kafka broker, from the cheapest source available.

1. ``KAFKA_BOOTSTRAP_SERVERS`` if set (CI services, a broker you already run);
2. a testcontainers ``KafkaContainer`` when a Docker engine answers;
3. :class:`deltamirror.devkafka.broker.LocalKafka` on a free port in a temp dir (needs Java 17+).

Loaded by ``tests/conftest.py`` via ``pytest_plugins = ["support.kafka"]``.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

# Confluent Platform 7.9 = Apache Kafka 3.9, the newest image testcontainers' KafkaContainer configures.
CONTAINER_IMAGE = os.environ.get("DELTAMIRROR_TEST_KAFKA_IMAGE", "confluentinc/cp-kafka:7.9.0")


def _docker_answers() -> bool:
    try:
        import docker  # type: ignore[import-untyped]

        client = docker.from_env(timeout=5)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:  # no SDK, no socket, daemon down: all mean "no Docker"
        return False


def free_port_pair() -> int:
    """A port whose successor is free too (LocalKafka puts its controller on port + 1)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port: int = s.getsockname()[1]
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise RuntimeError("no two consecutive free ports on 127.0.0.1")


#: the test running now (its nodeid), stamped on each Kafka client made while it runs
_current_test = "(no test: a session fixture)"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    global _current_test
    _current_test = item.nodeid
    try:
        yield
    finally:
        _current_test = "(no test: a session fixture)"


def _stamp_clients() -> None:
    """Make confluent-kafka's clients remember the test that opened them (``opened_by``), so that the
    check at the session's end names it. Done when this plugin loads, before deltamirror imports them:
    the C types Producer and Consumer are replaced by subclasses (their module's names rebound), the
    Python class AdminClient (which names itself in its ``super`` call) gets a wrapped ``__init__``."""
    import confluent_kafka
    import confluent_kafka.admin

    def stamping(init: Any) -> Any:
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            self.opened_by = _current_test
            init(self, *args, **kwargs)

        return __init__

    for name in ("Producer", "Consumer"):
        base = getattr(confluent_kafka, name)
        attrs = {"__init__": stamping(base.__init__), "__module__": base.__module__}
        setattr(confluent_kafka, name, type(name, (base,), attrs))
    admin = confluent_kafka.admin.AdminClient
    admin.__init__ = stamping(admin.__init__)  # type: ignore[method-assign]


_stamp_clients()


def live_clients(opened_by: str | None = None) -> list[Any]:
    """Kafka clients neither closed nor destroyed (of the test ``opened_by`` names, if given).

    A Producer or Consumer says it is closed by raising on use; one its owner dropped is destroyed
    when collected. An AdminClient has no close: one still alive once garbage is collected is
    still held somewhere.
    """
    import gc

    from confluent_kafka import Consumer, KafkaException, Producer
    from confluent_kafka.admin import AdminClient

    gc.collect()
    found = []
    for obj in gc.get_objects():
        try:
            if isinstance(obj, Producer):
                obj.poll(0)
            elif isinstance(obj, Consumer):
                obj.assignment()
            elif not isinstance(obj, AdminClient):
                continue
        except RuntimeError:  # closed
            continue
        except KafkaException:  # open, with a fatal error (fenced): still a client left open
            pass
        if opened_by is None or getattr(obj, "opened_by", None) == opened_by:
            found.append(obj)
    return found


def _close_within_bounds(client: Any) -> None:
    """Close a client left open, never waiting on a broker without a bound: a producer still in a
    transaction whose abort the broker does not answer is left to the process's end (its close
    would abort again and wait for the broker without a bound)."""
    import contextlib
    import warnings

    from confluent_kafka import Consumer, KafkaException, Producer

    if isinstance(client, Consumer):
        client.close()
    elif isinstance(client, Producer):
        with contextlib.suppress(KafkaException):  # a fatal (fenced) client raises its error on use
            client.purge(True, True)
            client.flush(0)
        try:
            client.abort_transaction(1.0)  # fails at once for one outside a transaction
        except KafkaException as exc:
            if exc.args and exc.args[0].code() == exc.args[0]._TIMED_OUT:
                return
        with warnings.catch_warnings(), contextlib.suppress(KafkaException):
            warnings.simplefilter("ignore", RuntimeWarning)
            client.close()


def open_clients(opened_by: str | None = None) -> list[str]:
    """Kafka clients still open (see :func:`live_clients`; of the test ``opened_by`` names, if
    given), each described with the test that opened it and what holds it; closed here.

    A client left open when the broker stops retries it and prints librdkafka's raw ``FAIL``
    lines after the run's summary.
    """
    import gc

    found: list[str] = []
    for client in live_clients(opened_by):
        referrers = [type(r).__name__ for r in gc.get_referrers(client) if not isinstance(r, list | type(gc))]
        opened_by = getattr(client, "opened_by", "(made before the check was loaded)")
        found.append(
            f"{type(client).__module__}.{type(client).__name__} opened by {opened_by} "
            f"(held by {', '.join(referrers[:3])})"
        )
        _close_within_bounds(client)
    return found


def _no_client_left_open() -> None:
    """Every test closes the clients it opened (the session's end must be quiet): checked before the
    session's broker stops."""
    left = open_clients()
    if left:
        pytest.fail(f"{len(left)} Kafka client(s) left open by the tests: {'; '.join(left)}", pytrace=False)


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    bootstrap_servers = _kafka_bootstrap(tmp_path_factory)
    yield next(bootstrap_servers)
    try:
        _no_client_left_open()
    finally:
        next(bootstrap_servers, None)


def _kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    configured = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if configured:
        yield configured
        return
    if _docker_answers():
        from testcontainers.community.kafka import KafkaContainer

        container = (
            KafkaContainer(CONTAINER_IMAGE)
            .with_kraft()
            .with_env("KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR", "1")
            .with_env("KAFKA_TRANSACTION_STATE_LOG_MIN_ISR", "1")
            .with_env("KAFKA_AUTO_CREATE_TOPICS_ENABLE", "false")
        )
        with container:
            yield container.get_bootstrap_server()
        return
    from deltamirror.core.errors import EnvironmentMissingError
    from deltamirror.devkafka.broker import LocalKafka

    broker = LocalKafka(port=free_port_pair(), data_dir=tmp_path_factory.mktemp("kafka"))
    try:
        bootstrap = broker.start()
    except EnvironmentMissingError as exc:
        reason = f"no Kafka: KAFKA_BOOTSTRAP_SERVERS unset, no Docker, and {exc}"
        if os.environ.get("DELTAMIRROR_REQUIRE_ALL"):  # CI: a missing broker is a failure, not a skip
            pytest.fail(reason)
        pytest.skip(reason)
    try:
        yield bootstrap
    finally:
        broker.stop()


#: what a test topic keeps: every record, whatever its timestamp (as the watcher's own topics do)
TEST_TOPIC_CONFIG = {"retention.ms": "-1", "retention.bytes": "-1"}


def new_topic(bootstrap: str, name: str, partitions: int = 1, config: Mapping[str, str] | None = None) -> str:
    """Create ``name`` and wait until its partitions have a leader, so the first produce succeeds.

    The topic keeps its records forever unless ``config`` says otherwise: tests write records
    stamped with made-up commit times (1970), and under the broker's default 7-day retention its
    retention check (every 5 minutes) deleted them while a test read them back: an empty read,
    once in a few hundred runs.
    """
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    spec = NewTopic(
        name, num_partitions=partitions, replication_factor=1, config={**TEST_TOPIC_CONFIG, **(config or {})}
    )
    admin.create_topics([spec], operation_timeout=30)[name].result(timeout=30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        topic = admin.list_topics(topic=name, timeout=10).topics.get(name)
        if (
            topic is not None
            and topic.error is None
            and len(topic.partitions) == partitions
            and all(p.leader >= 0 for p in topic.partitions.values())
        ):
            return name
        time.sleep(0.1)
    raise TimeoutError(f"topic {name} has no leader after 30 s")


class TransactionProbe:
    """How many records of a partition sit in a transaction still open: high watermark minus LSO.

    A read_committed client's high watermark is the last stable offset (where the first open
    transaction begins), so the difference is what a kill now would leave for the broker to abort.
    Two clients kept open, so that probing many times (the fault campaign) costs one round trip each.
    """

    def __init__(self, bootstrap: str) -> None:
        from confluent_kafka import Consumer

        self.clients = [
            Consumer(
                {
                    "bootstrap.servers": bootstrap,
                    "group.id": f"wm-{uuid.uuid4().hex[:10]}",
                    "isolation.level": isolation,
                    "log_level": 0,  # a broker away (the fault campaign) is no news
                }
            )
            for isolation in ("read_uncommitted", "read_committed")
        ]

    def offsets(self, topic: str, partition: int = 0) -> tuple[int, int]:
        """(high watermark, last stable offset) of ``topic``'s ``partition``."""
        from confluent_kafka import TopicPartition

        high, stable = (
            c.get_watermark_offsets(TopicPartition(topic, partition), timeout=10, cached=False)[1]
            for c in self.clients
        )
        return int(high), int(stable)

    def open_records(self, topic: str, partition: int = 0) -> int:
        high, stable = self.offsets(topic, partition)
        return high - stable

    def close(self) -> None:
        for c in self.clients:
            c.close()


def uncommitted_records(bootstrap: str, topic: str) -> int:
    """Records of ``topic``'s partition 0 in a transaction still open (see :class:`TransactionProbe`)."""
    probe = TransactionProbe(bootstrap)
    try:
        return probe.open_records(topic)
    finally:
        probe.close()


def wait_settled(bootstrap: str, topic: str, partition: int = 0, timeout_s: float = 60.0) -> None:
    """Until no transaction is open on ``topic``'s ``partition`` (its last stable offset is its high
    watermark): ``commit_transaction`` returns once the transaction is decided, its markers are
    written after, and a read_committed reader that starts before them finds the end before the
    records (Kafka's rules; seen once under a load of 15 with readers that connect in ~10 ms)."""
    probe = TransactionProbe(bootstrap)
    deadline = time.monotonic() + timeout_s
    try:
        while probe.open_records(topic, partition):
            assert time.monotonic() < deadline, f"{topic} [{partition}]: a transaction's markers never came"
    finally:
        probe.close()


class SecureBroker:
    """The session's broker with a SASL_SSL listener (SCRAM-SHA-512, its own CA), started by the CLI."""

    def __init__(self, port: int, data_dir: Path, start_output: str) -> None:
        import yaml

        self.port = port
        self.data_dir = data_dir
        #: what `deltamirror local kafka start --security scram-tls` printed
        self.start_output = start_output
        self.plaintext = f"127.0.0.1:{port}"
        self.client_file = data_dir / "security" / "kafka-client.yaml"
        #: the kafka: section the start wrote (password included)
        self.kafka: dict[str, Any] = yaml.safe_load(self.client_file.read_text())["kafka"]
        self.password: str = (data_dir / "security" / "scram-password").read_text().strip()
        self.secrets = [self.password, (data_dir / "security" / "keystore-password").read_text().strip()]

    @property
    def bootstrap(self) -> str:
        return str(self.kafka["bootstrap_servers"])


@pytest.fixture(scope="session")
def secure_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureBroker]:
    """Always a LocalKafka of its own (Java 17+): neither KAFKA_BOOTSTRAP_SERVERS nor Docker has its listener."""
    import shutil
    import subprocess
    import sys

    from deltamirror.core.errors import EnvironmentMissingError
    from deltamirror.devkafka.broker import LocalKafka
    from deltamirror.devkafka.jars import find_java

    try:
        find_java()
        if shutil.which("openssl") is None:
            raise EnvironmentMissingError("no openssl command")
    except EnvironmentMissingError as exc:
        reason = f"no secured local Kafka: {exc}"
        if os.environ.get("DELTAMIRROR_REQUIRE_ALL"):
            pytest.fail(reason)
        pytest.skip(reason)
    port = free_port_pair()
    data_dir = tmp_path_factory.mktemp("secure-kafka")
    command = [sys.executable, "-m", "deltamirror.cli.main", "local", "kafka", "start"]
    command += ["--port", str(port), "--data-dir", str(data_dir), "--security", "scram-tls"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=180, check=False)
    try:
        assert done.returncode == 0, done.stderr[-2000:]
        yield SecureBroker(port, data_dir, done.stdout + done.stderr)
    finally:
        LocalKafka(port=port, data_dir=data_dir).stop()
