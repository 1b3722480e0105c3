"""A table whose unpublished versions get as old as its log retention loses them to log cleanup.

Delta deletes log files older than ``delta.logRetentionDuration`` (default ``interval 30 days``,
PROTOCOL.md and delta-spark's DeltaConfigs) at checkpoints. A watcher that is behind by about that
much will find the next versions gone (a gap: the table stops, or with snapshot mode
``when-needed`` a new snapshot is published). :class:`RetentionWatch` measures, for a table that
is behind, how much of its retention is left: the retention minus the age of the last version
published (the next one is younger, so this errs early). Below :data:`WARN_FRACTION` of the
retention it warns once (again only after the table caught up) and the metric
``deltamirror_log_retention_headroom_seconds`` says it all the time.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Mapping

log = logging.getLogger("deltamirror.watch")

#: Delta's default ``delta.logRetentionDuration``
DEFAULT_RETENTION_S = 30 * 86400.0
#: warn once the headroom is below this fraction of the retention (the lag is above 80 % of it)
WARN_FRACTION = 0.2

_UNITS = {
    "nanosecond": 1e-9,
    "microsecond": 1e-6,
    "millisecond": 1e-3,
    "second": 1.0,
    "minute": 60.0,
    "hour": 3600.0,
    "day": 86400.0,
    "week": 7 * 86400.0,
}
_PART = re.compile(r"(-?\d+)\s*([a-z]+?)s?\b")


def parse_interval(text: str) -> float | None:
    """Seconds of a Delta interval (``interval 30 days``, ``1 week``, ``interval 2 days 12 hours``);
    None when it is not one (months and years are not: Delta refuses them for this property)."""
    body = text.strip().lower().removeprefix("interval").strip()
    if not body:
        return None
    total, end = 0.0, 0
    for match in _PART.finditer(body):
        if body[end : match.start()].strip():
            return None
        unit = _UNITS.get(match.group(2))
        if unit is None:
            return None
        total += int(match.group(1)) * unit
        end = match.end()
    if end == 0 or body[end:].strip():
        return None
    return total


def retention_of(configuration: Mapping[str, str] | None) -> float:
    """The table's log retention in seconds (the default when unset or not an interval)."""
    value = (configuration or {}).get("delta.logRetentionDuration")
    parsed = parse_interval(value) if isinstance(value, str) else None
    return parsed if parsed is not None and parsed > 0 else DEFAULT_RETENTION_S


class RetentionWatch:
    """One table's headroom against its log retention; see the module docstring."""

    def __init__(
        self,
        table: str,
        report: Callable[[str, float], None],
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.table = table
        self.report = report
        self._clock = clock
        self.warned = False

    def published(self, commit_ts_ms: int, behind: int, configuration: Mapping[str, str] | None) -> float:
        """After a publish: the headroom in seconds (the whole retention when caught up)."""
        retention = retention_of(configuration)
        if behind <= 0:
            headroom = retention
            self.warned = False
        else:
            headroom = retention - max(0.0, self._clock() - commit_ts_ms / 1000)
            if headroom < WARN_FRACTION * retention and not self.warned:
                self.warned = True
                log.warning(
                    "the table is %d versions behind and its oldest unpublished version is close to its "
                    "log retention (%.1f of %.1f days left): log cleanup may delete versions before "
                    "they are published",
                    behind,
                    max(0.0, headroom) / 86400,
                    retention / 86400,
                    extra={"table": self.table},
                )
        self.report(self.table, headroom)
        return headroom


__all__ = ["DEFAULT_RETENTION_S", "WARN_FRACTION", "RetentionWatch", "parse_interval", "retention_of"]
