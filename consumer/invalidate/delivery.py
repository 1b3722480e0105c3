"""Delivery: retries with exponential backoff, then a dead-letter topic or a stop.

:class:`Invalidator` offers one document at a time to a :class:`~.targets.Target` and returns only
when it was accepted or dead-lettered, so that the caller (the consumer) can acknowledge it then:
the order of the documents is the order of delivery, and nothing is skipped silently. A document
given up without a dead-letter topic raises :class:`InvalidationDeliveryError` (exit code 1: the
environment failed, a later run delivers it again).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter

from deltamirror.core.errors import ConfigError, DeltaMirrorError
from deltamirror.core.redact import redact
from deltamirror.mirror.errors import StopRequested
from deltamirror.mirror.records.dead_letters import encode_dead_letter

from .payload import Payload, describe
from .targets import DeliveryAttemptError, Target

log = logging.getLogger("deltamirror.consumer.invalidate")


class InvalidationDeliveryError(DeltaMirrorError):
    """A version could not be delivered and there is no dead-letter topic: retry later (exit 1)."""

    exit_code = 1


@dataclass(frozen=True)
class RetryPolicy:
    """How often, and how patiently, a document is offered before it is given up.

    Attempt n+1 follows attempt n after ``initial_backoff_s * multiplier**(n-1)`` seconds, at most
    ``max_backoff_s``: by default 5 attempts, 0.5 + 1 + 2 + 4 s apart. ``max_attempts`` 0 retries
    until stopped (a receiver that must not be bypassed).
    """

    max_attempts: int = 5
    initial_backoff_s: float = 0.5
    max_backoff_s: float = 30.0
    multiplier: float = 2.0

    def __post_init__(self) -> None:
        if self.max_attempts < 0:
            raise ConfigError(f"max attempts must be 0 (no limit) or more, not {self.max_attempts}")
        if self.initial_backoff_s < 0 or self.max_backoff_s < 0 or self.multiplier < 1:
            raise ConfigError("backoff times must be 0 or more and the multiplier at least 1")

    def backoff_s(self, attempt: int) -> float:
        """The wait after failed attempt ``attempt`` (1-based)."""
        return float(min(self.max_backoff_s, self.initial_backoff_s * self.multiplier ** (attempt - 1)))

    def gives_up_after(self, attempt: int) -> bool:
        return self.max_attempts > 0 and attempt >= self.max_attempts


class RecordSender(Protocol):
    """A producer that returns once the broker stored the record (mirror's RecordProducer)."""

    def send(
        self,
        topic: str,
        value: bytes,
        key: bytes | None = None,
        headers: list[tuple[str, str | bytes | None]] | None = None,
    ) -> None: ...


class DeadLetterTopic:
    """Documents given up, one JSON record each: ``{"payload", "error", "attempts", "target"}``.

    Keyed by ``tableId``, with the ``kind`` header ``deadLetter`` and the ``version`` header.
    """

    def __init__(self, producer: RecordSender, topic: str) -> None:
        self.producer = producer
        self.topic = topic

    def send(self, payload: Payload, error: str, attempts: int, target: str) -> None:
        record = encode_dead_letter(payload, error, attempts, target)
        assert record.value is not None  # a dead letter is never a tombstone
        self.producer.send(self.topic, record.value, record.key, record.headers)


@dataclass(frozen=True)
class Outcome:
    """What became of one document: accepted after ``attempts``, or dead-lettered with ``error``."""

    payload: Payload
    attempts: int
    dead_lettered: bool = False
    error: str | None = None


class DeliveryMetrics(Protocol):
    """What delivery reports to operators (:class:`DeliveryCounters`)."""

    def attempt_failed(self) -> None: ...

    def handled(self, outcome: Outcome) -> None: ...


class DeliveryCounters:
    """Prometheus counters of the deliveries, on a consumer's registry (``ConsumerMetrics.registry``).

    ``deltamirror_consumer_deliveries_total{outcome="delivered"|"deadLettered"}`` and
    ``deltamirror_consumer_delivery_failed_attempts_total`` (a rising rate: the receiver is failing).
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self._handled = Counter(
            "deltamirror_consumer_deliveries",
            "Documents handed over: delivered, or dead-lettered after the last attempt.",
            ("outcome",),
            registry=registry,
        )
        for outcome in ("delivered", "deadLettered"):
            self._handled.labels(outcome)
        self._failed = Counter(
            "deltamirror_consumer_delivery_failed_attempts",
            "Attempts the receiver did not accept (each retried or, the last, given up).",
            registry=registry,
        )

    def attempt_failed(self) -> None:
        self._failed.inc()

    def handled(self, outcome: Outcome) -> None:
        self._handled.labels("deadLettered" if outcome.dead_lettered else "delivered").inc()


class Invalidator:
    """Hands each document to ``target``, retrying per ``policy``; then a dead letter, or raises.

    Called synchronously with one document at a time: the next is not offered until this one was
    accepted or dead-lettered. A set ``stop`` ends the waits between attempts (StopRequested).
    Without ``dead_letters`` a document given up raises :class:`InvalidationDeliveryError`.
    ``on_outcome`` hears of each document handled (the command prints a line), ``metrics`` counts.
    """

    def __init__(
        self,
        target: Target,
        *,
        policy: RetryPolicy | None = None,
        dead_letters: DeadLetterTopic | None = None,
        stop: threading.Event | None = None,
        on_outcome: Callable[[Outcome], None] | None = None,
        metrics: DeliveryMetrics | None = None,
    ) -> None:
        self.target = target
        self.policy = policy or RetryPolicy()
        self.dead_letters = dead_letters
        self.stop = stop or threading.Event()
        self.on_outcome = on_outcome
        self.metrics = metrics

    def __call__(self, payload: Payload) -> Outcome:
        body = json.dumps(payload, separators=(",", ":")).encode()
        attempt = 0
        while True:
            if self.stop.is_set():
                raise StopRequested("stop requested")
            attempt += 1
            try:
                self.target.send(payload, body, attempt)
            except DeliveryAttemptError as exc:
                error = redact(str(exc))
                if self.metrics is not None:
                    self.metrics.attempt_failed()
            else:
                return self._report(Outcome(payload, attempt))
            if self.policy.gives_up_after(attempt):
                return self._report(self._give_up(payload, error, attempt))
            wait_s = self.policy.backoff_s(attempt)
            log.warning(
                "%s to %s failed (attempt %d), again in %.1f s: %s",
                describe(payload),
                self.target.describe(),
                attempt,
                wait_s,
                error,
            )
            if self.stop.wait(wait_s):
                raise StopRequested("stop requested")

    def _give_up(self, payload: Payload, error: str, attempts: int) -> Outcome:
        where = f"{describe(payload)} could not be delivered to {self.target.describe()}"
        if self.dead_letters is None:
            raise InvalidationDeliveryError(
                f"{where} after {attempts} attempts: {error}; it is delivered again at the next start",
                table=str(payload.get("tableId")),
                version=payload.get("version"),
            )
        self.dead_letters.send(payload, error, attempts, self.target.describe())
        log.error("%s after %d attempts (%s): sent to %s", where, attempts, error, self.dead_letters.topic)
        return Outcome(payload, attempts, dead_lettered=True, error=error)

    def _report(self, outcome: Outcome) -> Outcome:
        if self.metrics is not None:
            self.metrics.handled(outcome)
        if self.on_outcome is not None:
            self.on_outcome(outcome)
        return outcome


__all__ = [
    "DeadLetterTopic",
    "DeliveryCounters",
    "DeliveryMetrics",
    "InvalidationDeliveryError",
    "Invalidator",
    "Outcome",
    "RecordSender",
    "RetryPolicy",
]
