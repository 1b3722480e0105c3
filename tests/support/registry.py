"""A real Schema Registry for the tests: ``deltamirror local registry`` (Apicurio Registry, in memory).

Not a mock: confluent-kafka's own ``SchemaRegistryClient`` talks HTTP to Apicurio Registry's
Confluent-compatible API on 127.0.0.1. The first use on a machine builds the registry with Maven
(minutes, once: the build and Maven's download cache stay under ``$XDG_CACHE_HOME/deltamirror``);
later sessions only start the JVM. Without Java or Maven the tests that use it skip, and fail under
``DELTAMIRROR_REQUIRE_ALL`` (CI).

Loaded by ``tests/conftest.py`` via ``pytest_plugins``; the ``schema_registry`` fixture starts one
registry per session on first use, on a free port, with its pid file and log in a temp folder.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator

import pytest


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture(scope="session")
def schema_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The session's registry: its Confluent-compatible URL (``.../apis/ccompat/v7``)."""
    from deltamirror.devkafka.registry import LocalRegistry

    registry = LocalRegistry(port=_free_port(), data_dir=tmp_path_factory.mktemp("registry"))
    try:
        url = registry.start()
    except Exception as exc:
        registry.stop()
        reason = f"no Schema Registry: {exc}"
        if os.environ.get("DELTAMIRROR_REQUIRE_ALL"):  # CI: a missing registry is a failure, not a skip
            pytest.fail(reason)
        pytest.skip(reason)
    try:
        yield url
    finally:
        registry.stop()
