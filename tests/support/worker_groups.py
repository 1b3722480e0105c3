"""``make test``'s two workers: the tests that use a session service run on one of them.

Under ``pytest -n N --dist loadgroup`` every test that uses the session's broker, Spark, s3proxy or
registry (by fixture, or by its ``kafka``/``spark``/``s3``/``registry`` marker) is in the group
``services``, one unit of work for one worker, so a run starts each service once; a test marked
``isolated`` starts what it needs itself (its own broker, to kill or freeze) and uses none of the
session's: its group ``isolated`` runs beside the services, and so do all the other tests, one by one.

pytest-xdist's own ``xdist_group`` marker cannot carry this here: its workers tell the scheduler a
test's group by renaming the test (``item._nodeid``), which pytest 9 no longer reads, so every test
would be scheduled alone and each worker would start every service. The workers therefore write the
groups they collected to a file, and the scheduler (a pytest-xdist ``LoadScopeScheduling`` whose
scope is that group) reads it once every worker has collected, through pytest-xdist's public hooks.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

#: the session fixtures that start a service, and the markers of the tests that need one
SERVICE_FIXTURES = frozenset(
    {"kafka_bootstrap", "secure_kafka", "spark", "spark_scenarios", "s3", "schema_registry"}
)
SERVICE_MARKERS = ("kafka", "spark", "s3", "registry")
SERVICES_GROUP = "services"
ISOLATED_GROUP = "isolated"
_WORKER_KEY = "deltamirror_groups_dir"
_DIR_KEY = pytest.StashKey[Path]()


def _services_used(item: pytest.Item) -> list[str]:
    return sorted(SERVICE_FIXTURES.intersection(getattr(item, "fixturenames", ())))


def group_of(item: pytest.Item) -> str | None:
    """The group a test runs in (None: alone)."""
    if item.get_closest_marker("isolated") is not None:
        return ISOLATED_GROUP
    if _services_used(item) or any(item.get_closest_marker(m) is not None for m in SERVICE_MARKERS):
        return SERVICES_GROUP
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """An ``isolated`` test that uses a session service fails before the service starts: on the
    isolated group's worker it would start a second one."""
    if item.get_closest_marker("isolated") is not None and (uses := _services_used(item)):
        pytest.fail(f"{item.nodeid} is marked isolated but uses {uses}", pytrace=False)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    groups = {item.nodeid: group for item in items if (group := group_of(item)) is not None}
    workerinput: dict[str, Any] | None = getattr(config, "workerinput", None)
    if workerinput is None or _WORKER_KEY not in workerinput:
        return
    folder = Path(workerinput[_WORKER_KEY])
    tmp = folder / f".{workerinput['workerid']}.json"
    tmp.write_text(json.dumps(groups))
    os.replace(tmp, folder / f"{workerinput['workerid']}.json")  # whole, or not there


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """The controller, for each worker it starts: where to write the groups it collects."""
    config: pytest.Config = node.config
    if config.getvalue("dist") != "loadgroup":
        return
    if _DIR_KEY not in config.stash:
        config.stash[_DIR_KEY] = Path(tempfile.mkdtemp(prefix="deltamirror-groups-"))
    node.workerinput[_WORKER_KEY] = str(config.stash[_DIR_KEY])


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):  # type: ignore[misc]
        """Scopes are the groups the workers collected; a test without one is its own scope."""

        _groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self._groups is None:
                folder = config.stash[_DIR_KEY]
                written = sorted(folder.glob("*.json"))
                # none when the workers' collection failed: they report why, and nothing runs
                self._groups = json.loads(written[0].read_text()) if written else {}
            return self._groups.get(nodeid, nodeid)

    return GroupScheduling(config, log)


def pytest_unconfigure(config: pytest.Config) -> None:
    folder = config.stash.get(_DIR_KEY, None)
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)
