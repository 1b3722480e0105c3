"""How deltamirror reaches its brokers: the broker list it accepts, and what it says when they fail.

Shared by the watcher and every consumer command, so it lives in core; it never imports the Kafka
client (core may not): librdkafka's error objects are used through their methods only.

The broker list. ``host:port[,host:port...]`` with host names, IPv4 addresses or bracketed IPv6
addresses, and nothing else: librdkafka accepts more (a ``proto://`` prefix, no port), and a
``user:pass@host`` entry was accepted too, then printed by librdkafka many times a second. A
refusal names the entry by its position, never its text (it may hold a password).

The broker's failures. Left alone, librdkafka writes a raw line to stderr for every failed
connection attempt (tens a second with the broker gone). :class:`KafkaConnectionReporter` is given
to every client instead (``logger`` and ``error_cb`` in its configuration): librdkafka's log lines
go to the ``deltamirror.librdkafka`` logger at DEBUG (quiet unless asked for), and its errors
become one deltamirror warning, at most every ``interval_s`` seconds, with the reason::

    Kafka at 127.0.0.1:1 unreachable: Connection refused; retrying

An authentication or TLS failure is not retried: it is latched as a :class:`ConfigError` (the
caller raises it with :meth:`~KafkaConnectionReporter.check`) and ``on_fatal`` is called.

A command that does one thing and exits (``signal``) makes its reporter ``quiet``: nothing is
logged, the reason is kept (:attr:`~KafkaConnectionReporter.last_reason`) and said once, in the
command's error line, instead.
"""

from __future__ import annotations

import ipaddress
import logging
import re
import threading
import time
from collections.abc import Callable
from typing import Any

from deltamirror.core.errors import ConfigError
from deltamirror.core.redact import redact

# --- the broker list ------------------------------------------------------------------------------

_HOST_LABEL = re.compile(r"^[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?$")
_PORT = re.compile(r"^[0-9]{1,5}$")


def _entry_problem(entry: str) -> str | None:
    if not entry:
        return "is empty"
    if "@" in entry:
        return "holds credentials (an '@'): give them in the SASL settings, not in the broker list"
    if "://" in entry:
        return "has a scheme (proto://): give host:port, and the protocol in security_protocol"
    if any(c.isspace() for c in entry):
        return "contains a space"
    if entry.startswith("["):
        host, sep, port = entry[1:].partition("]:")
        if not sep:
            return "is not [IPv6 address]:port"
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            return "has an invalid IPv6 address"
    else:
        host, sep, port = entry.rpartition(":")
        if not sep:
            return "has no port (host:port)"
        if ":" in host:
            return "is an IPv6 address without brackets: write [address]:port"
        if not _valid_host(host):
            return "has an invalid host name"
    if not _PORT.match(port) or not 0 < int(port) < 65536:
        return "has an invalid port (1 to 65535)"
    return None


def _valid_host(host: str) -> bool:
    name = host[:-1] if host.endswith(".") else host
    if not name or len(name) > 253:
        return False
    labels = name.split(".")
    if all(label.isdigit() for label in labels):  # looks like IPv4: must be one
        try:
            ipaddress.IPv4Address(name)
        except ValueError:
            return False
        return True
    return all(_HOST_LABEL.match(label) for label in labels)


def bootstrap_servers_problem(value: str) -> str | None:
    """Why ``value`` is not ``host:port[,host:port...]``, without quoting it; None when it is."""
    if not isinstance(value, str) or not value.strip():
        return "is empty"
    entries = [e.strip() for e in value.split(",")]
    for i, entry in enumerate(entries, 1):
        problem = _entry_problem(entry)
        if problem is not None:
            where = f"entry {i} of {len(entries)}" if len(entries) > 1 else "the entry"
            return f"{where} {problem}"
    return None


def check_bootstrap_servers(value: str, what: str = "bootstrap servers") -> str:
    """``value`` with blanks around entries removed; a ConfigError (exit 2) naming ``what`` otherwise."""
    problem = bootstrap_servers_problem(value)
    if problem is not None:
        raise ConfigError(f"{what}: {problem}; expected host:port[,host:port...]")
    return ",".join(e.strip() for e in value.split(","))


# --- librdkafka's logs and errors -----------------------------------------------------------------

#: errors that say the brokers cannot be reached (yet): retried, reported now and then
UNREACHABLE = frozenset({"_TRANSPORT", "_ALL_BROKERS_DOWN", "_RESOLVE", "_TIMED_OUT", "_MSG_TIMED_OUT"})
#: errors retrying cannot fix: wrong credentials, wrong TLS setup, no permission
REFUSED = {
    "_AUTHENTICATION": "authentication failed",
    "SASL_AUTHENTICATION_FAILED": "authentication failed",
    "_SSL": "TLS failed",
    "CLUSTER_AUTHORIZATION_FAILED": "not authorized",
    "TRANSACTIONAL_ID_AUTHORIZATION_FAILED": "not authorized",
    "TOPIC_AUTHORIZATION_FAILED": "not authorized",
    "GROUP_AUTHORIZATION_FAILED": "not authorized",
}
DEFAULT_INTERVAL_S = 30.0

# "127.0.0.1:1/bootstrap: Connect to ipv4#127.0.0.1:1 failed: Connection refused (after 0ms in state CONNECT)"
_BROKER_PREFIX = re.compile(r"^(?:[A-Za-z_]+://)?(?P<address>[^\s/]+)/[^\s:]+: (?P<rest>.*)$", re.DOTALL)
_AFTER = re.compile(r"\s*\(after \d+ms in state \w+(?:, \d+ identical error\(s\) suppressed)?\)\s*$")
_RESOLVE = re.compile(r"Failed to resolve '[^']*': (?P<why>.*)$")


def describe_error(text: str) -> tuple[str | None, str]:
    """(broker address or None, the reason) from one of librdkafka's error strings."""
    address = None
    rest = text.strip()
    match = _BROKER_PREFIX.match(rest)
    if match is not None:
        address, rest = match["address"], match["rest"]
    rest = _AFTER.sub("", rest)
    resolve = _RESOLVE.search(rest)
    if resolve is not None:
        rest = f"cannot resolve the host name ({resolve['why']})"
    elif "failed: " in rest:
        rest = rest.rsplit("failed: ", 1)[1]
    return address, redact(" ".join(rest.split()))


class KafkaConnectionReporter:
    """librdkafka's logs and errors, said once in deltamirror's words; see the module docstring.

    One reporter may serve many clients and threads (the watcher shares one between its tables),
    so one broken cluster gives one warning per interval, not one per client.
    """

    def __init__(
        self,
        servers: str,
        *,
        logger: logging.Logger | None = None,
        interval_s: float = DEFAULT_INTERVAL_S,
        on_fatal: Callable[[ConfigError], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        quiet: bool = False,
    ) -> None:
        self.servers = servers
        #: log nothing: the caller says the reason (``last_reason``, ``fatal``) in its own error
        self.quiet = quiet
        self.logger = logger or logging.getLogger("deltamirror.kafka")
        self.rdkafka_log = logging.getLogger("deltamirror.librdkafka")
        self.interval_s = interval_s
        self.on_fatal = on_fatal
        self._clock = clock
        self._lock = threading.Lock()
        self._last_warning: float | None = None
        self._suppressed = 0
        self._unreachable = False
        self.fatal: ConfigError | None = None
        #: the last reason the brokers could not be reached (None once they answer)
        self.last_reason: str | None = None

    def client_config(self) -> dict[str, Any]:
        """The settings that route a client's logs and errors here: merge them into its config."""
        return {"logger": self, "error_cb": self.on_error}

    def log(self, level: int, msg: str, *args: Any) -> None:
        """confluent-kafka's ``logger`` interface: called for every librdkafka log line."""
        if self.rdkafka_log.isEnabledFor(logging.DEBUG):
            self.rdkafka_log.debug(msg, *args, extra={"rdkafkaLevel": logging.getLevelName(level)})

    def on_error(self, err: Any) -> None:
        """confluent-kafka's ``error_cb``: ``err`` is a ``confluent_kafka.KafkaError``."""
        name = str(err.name())
        address, reason = describe_error(str(err.str()))
        if name in REFUSED:
            self._refused(address, f"{REFUSED[name]}: {reason}")
        elif name in UNREACHABLE and "certificate verify failed" in reason:
            # librdkafka may say it as a transport error before its _SSL one: the same refusal
            self._refused(address, f"{REFUSED['_SSL']}: {reason}")
        elif name in UNREACHABLE:
            self.unreachable(reason, address)
        elif err.fatal():
            self.last_reason = reason
            if not self.quiet:
                self.logger.error("Kafka client failed: %s", reason, extra={"kafkaError": name})
        else:
            self._warn(f"Kafka client error: {reason}", name)

    def unreachable(self, reason: str, address: str | None = None) -> None:
        """The brokers could not be reached: warn now if none was said for ``interval_s``."""
        if self.fatal is not None:
            return  # the login was refused: that is why they are "down", and it was said once
        where = address or self.servers
        if "brokers are down" in reason:
            if self.last_reason is not None:
                return  # the per-broker reason already said more
            reason = "all brokers are down"
        self.last_reason = reason
        self._unreachable = True
        self._warn(f"Kafka at {where} unreachable: {reason}; retrying", "unreachable")

    def reachable(self) -> None:
        """The brokers answered: say so if they had been reported unreachable."""
        with self._lock:
            was, self._unreachable = self._unreachable, False
            self._last_warning = None
            self._suppressed = 0
        self.last_reason = None
        if was:
            self.logger.info("Kafka at %s reachable again", self.servers)

    def check(self) -> None:
        """Raise the latched authentication/TLS failure, if any."""
        if self.fatal is not None:
            raise self.fatal

    def _refused(self, address: str | None, reason: str) -> None:
        error = ConfigError(f"Kafka at {address or self.servers} refused the connection: {reason}")
        with self._lock:
            first = self.fatal is None
            if first:
                self.fatal = error
        if first:
            if self.on_fatal is not None:
                self.on_fatal(error)
            elif not self.quiet:
                self.logger.error("%s", error)

    def _warn(self, message: str, kind: str) -> None:
        if self.quiet:
            return
        now = self._clock()
        with self._lock:
            last = self._last_warning
            if last is not None and now - last < self.interval_s:
                self._suppressed += 1
                return
            self._last_warning = now
            suppressed, self._suppressed = self._suppressed, 0
        extra: dict[str, Any] = {"kafkaError": kind}
        if suppressed:
            extra["repeated"] = suppressed
        self.logger.warning("%s", message, extra=extra)


__all__ = [
    "REFUSED",
    "UNREACHABLE",
    "KafkaConnectionReporter",
    "bootstrap_servers_problem",
    "check_bootstrap_servers",
    "describe_error",
]
