"""The session's Kafka broker, from the cheapest source available.

1. ``KAFKA_BOOTSTRAP_SERVERS`` if set (CI services, a broker you already run);
2. a testcontainers ``KafkaContainer`` when a Docker engine answers;
3. :class:`deltamirror.producer.local_kafka.LocalKafka` on a free port in a temp dir (needs Java 17+).

Loaded by ``tests/conftest.py`` via ``pytest_plugins = ["support.kafka"]``.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator, Mapping

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


def _free_port_pair() -> int:
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


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
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
    from deltamirror.producer.local_kafka import LocalKafka

    broker = LocalKafka(port=_free_port_pair(), data_dir=tmp_path_factory.mktemp("kafka"))
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


def new_topic(bootstrap: str, name: str, partitions: int = 1, config: Mapping[str, str] | None = None) -> str:
    """Create ``name`` and wait until its partitions have a leader, so the first produce succeeds."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    spec = NewTopic(name, num_partitions=partitions, replication_factor=1, config=dict(config or {}))
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
