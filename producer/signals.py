"""Operators' signals to running watchers, through a Kafka topic every watcher reads.

``deltamirror signal snapshot TABLE`` writes one :class:`Signal` to the signal topic
(``signal_topic``, ``deltamirror.signals`` by default; one partition, kept a day), keyed by the
table's normalized URI. Every watcher instance runs a :class:`SignalListener` that reads the topic
from its beginning but acts only on signals written after the listener started (an older one was
meant for the watchers running then); the instance whose pipeline runs the table acts on it, the
others ignore it. A snapshot signal makes the table's watcher publish a fresh snapshot of the
table at the last version published (``snapshot: true`` events and summary, as an initial
snapshot), in order between two versions, without a restart: no version is skipped or published
twice, and the versions after it follow as usual.

Delivery is at most once: a signal that arrives while no instance runs the table (a shard moving,
every watcher stopped) is not acted on; the table's log says when one was (``signal: snapshot``),
and sending it again is harmless (a snapshot at a version a consumer has is skipped by it).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic.alias_generators import to_camel

from deltamirror.mirror.errors import KafkaError, StopRequested

log = logging.getLogger("deltamirror.signals")

SIGNAL_TOPIC = "deltamirror.signals"
#: a signal is a few hundred bytes (what the topic manager sizes topics by)
SIGNAL_MAX_BYTES = 1_000_000
#: a listener that failed (broker gone) starts again after this
RETRY_S = 5.0


class Signal(BaseModel):
    """One signal: what to do (``kind``), to which table, when it was asked for (epoch ms)."""

    model_config = ConfigDict(frozen=True, alias_generator=to_camel, populate_by_name=True, extra="allow")

    kind: Literal["snapshot"]
    table_uri: str
    id: str
    requested_at: int

    def to_json_bytes(self) -> bytes:
        return self.model_dump_json(by_alias=True).encode()


def send_signal(kafka: dict[str, Any], topic: str, table_uri: str, kind: Literal["snapshot"]) -> Signal:
    """Write one signal for ``table_uri`` (normalized) and wait until the broker has stored it."""
    from deltamirror.mirror.kafka_producer import RecordProducer
    from deltamirror.mirror.topics import TopicManager

    TopicManager(kafka, max_record_bytes=SIGNAL_MAX_BYTES).ensure_signal_topic(topic)
    signal = Signal(kind=kind, table_uri=table_uri, id=uuid.uuid4().hex, requested_at=int(time.time() * 1000))
    producer = RecordProducer(kafka)
    try:
        producer.send(topic, signal.to_json_bytes(), table_uri.encode())
    finally:
        producer.close()
    return signal


class SignalListener:
    """Reads the signal topic on its own thread and hands each new signal to ``on_signal``.

    ``on_signal`` returns whether this instance acted on it (for the log). Kafka failures are
    retried every :data:`RETRY_S`; a record that is not a signal is skipped with a warning (the
    topic is operators' input, not the mirror's).
    """

    def __init__(
        self,
        kafka: dict[str, Any],
        topic: str,
        on_signal: Callable[[Signal], bool],
        *,
        stop: threading.Event,
    ) -> None:
        self.kafka = kafka
        self.topic = topic
        self.on_signal = on_signal
        self.stop = stop
        self.started_ms = int(time.time() * 1000)
        #: set once the listener reads the topic (tests wait for it before sending)
        self.listening = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="watch-signals", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                self._listen()
            except StopRequested:
                return
            except KafkaError as exc:
                log.warning("signal topic %s: %s (retrying)", self.topic, exc)
                self.stop.wait(RETRY_S)

    def _listen(self) -> None:
        from deltamirror.mirror.kafka_consumer import MirrorConsumer
        from deltamirror.mirror.topics import TopicManager

        TopicManager(self.kafka, max_record_bytes=SIGNAL_MAX_BYTES).ensure_signal_topic(self.topic)
        with MirrorConsumer(self.kafka, purpose="signals", fetch_wait_max_ms=None) as consumer:
            partitions = consumer.partitions(self.topic, wait_for_topic=True, stop=self.stop)
            if partitions is None:
                return
            consumer.assign((self.topic, p, None) for p in partitions)
            self.listening.set()
            for batch in consumer.batches(until_end=False, stop=self.stop, poll_s=0.2):
                for record in batch:
                    self._take(record.value, record.offset)

    def _take(self, value: bytes | None, offset: int) -> None:
        try:
            signal = Signal.model_validate_json(value or b"")
        except ValidationError as exc:
            first = exc.errors()[0]
            log.warning(
                "signal topic %s: record at offset %d is not a signal (%s); skipped",
                self.topic,
                offset,
                first["msg"],
            )
            return
        if signal.requested_at < self.started_ms:
            return  # meant for the watchers that ran then
        acted = self.on_signal(signal)
        log.info(
            "signal %s for table %s: %s",
            signal.kind,
            signal.table_uri,
            "acting on it" if acted else "the table does not run here",
            extra={"table": signal.table_uri, "signalId": signal.id},
        )


__all__ = ["SIGNAL_TOPIC", "Signal", "SignalListener", "send_signal"]
