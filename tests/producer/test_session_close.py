"""The session's producer is closed whatever its abort raises: an abort that fails otherwise than
with a KafkaError (a closed shard generation's RuntimeError, a SystemError out of the client) once
left the publisher unclosed and a shard's lease held."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pytest

from deltamirror.producer.publishing.session import close_publisher


class _Publisher:
    """Stands for the session's publisher: what close_publisher calls on it, recorded."""

    def __init__(self, abort_raises: BaseException) -> None:
        self.in_transaction = True
        self.abort_raises = abort_raises
        self.closed_with: float | None = None

    def abort(self, timeout_s: float) -> None:
        raise self.abort_raises

    def close(self, timeout_s: float = 5.0) -> None:
        self.closed_with = timeout_s


@pytest.mark.parametrize("raised", [RuntimeError("the producer was closed"), SystemError("callback")])
def test_the_publisher_is_closed_when_its_abort_raises_anything(raised: BaseException) -> None:
    pub = _Publisher(raised)
    txns: Any = SimpleNamespace(pub=pub)
    with pytest.raises(type(raised)):
        close_publisher(txns, time_left=lambda: 10.0, stop=threading.Event(), say_abandoned=lambda: None)
    assert pub.closed_with is not None and txns.pub is None
