"""Shared fixtures: one Kafka broker and one SparkSession per test session (started only if used).

``make test`` runs the suite on two pytest-xdist workers; the tests that use a session service run
on one of them, so a run still starts each service once (``support/worker_groups.py``).

With ``DELTAMIRROR_REQUIRE_ALL=1`` (as ``.ci/run`` sets it) a skipped test fails unless
``tests/allowed_skips.toml`` lists it with its reason: a machine that lacks a tool (a broker, Spark,
a checker) must not pass by skipping the tests that need it.
"""

from __future__ import annotations

import fnmatch
import os
import tomllib
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings as hypothesis_settings

# no property test may fail by how long an example took: hypothesis's default 200 ms deadline
# failed one whose first example imported a module, on a loaded machine (tests never depend on
# timing; the suite's own per-test timeout still bounds a hung one)
hypothesis_settings.register_profile("deltamirror", deadline=None)
hypothesis_settings.load_profile("deltamirror")

pytest_plugins = [
    "support.kafka",
    "support.spark",
    "support.s3proxy",
    "support.registry",
    "support.worker_groups",
]

ALLOWED_SKIPS = Path(__file__).with_name("allowed_skips.toml")


def _allowed_skips() -> list[dict[str, str]]:
    entries: list[dict[str, str]] = tomllib.loads(ALLOWED_SKIPS.read_text())["skip"]
    for entry in entries:
        missing = {"test", "reason", "why"} - set(entry)
        if missing:
            raise pytest.UsageError(f"{ALLOWED_SKIPS.name}: an entry lacks {sorted(missing)}: {entry}")
    return entries


def _skip_reason(report: pytest.TestReport) -> str:
    longrepr: Any = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def is_allowed_skip(nodeid: str, reason: str, allowed: list[dict[str, str]]) -> bool:
    """Whether a skip of ``nodeid`` for ``reason`` is on the allow-list (test glob and reason text).

    Only ``*`` and ``?`` are wildcards: the brackets of a parametrized id are literal.
    """
    return any(
        fnmatch.fnmatchcase(nodeid, e["test"].replace("[", "[[]")) and e["reason"] in reason for e in allowed
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if not (report.skipped and os.environ.get("DELTAMIRROR_REQUIRE_ALL")) or hasattr(report, "wasxfail"):
        return
    reason = _skip_reason(report)
    if not is_allowed_skip(report.nodeid, reason, _allowed_skips()):
        report.outcome = "failed"
        report.longrepr = (
            f"skipped, and the skip is not in tests/{ALLOWED_SKIPS.name} "
            f"(DELTAMIRROR_REQUIRE_ALL is set): {reason}"
        )


@pytest.fixture(autouse=True)
def _deltamirror_logging_restored() -> Iterator[None]:
    """A command run in-process sets up the ``deltamirror`` loggers (JSON lines on stderr, no
    propagation): the next test gets them as they were, so that caplog sees their records."""
    import logging

    logger = logging.getLogger("deltamirror")
    saved = (list(logger.handlers), logger.level, logger.propagate)
    yield
    logger.handlers[:], logger.level, logger.propagate = saved[0], saved[1], saved[2]
