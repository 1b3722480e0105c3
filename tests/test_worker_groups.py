"""``make test``'s workers: every test that needs a session service runs on one worker, an
``isolated`` one beside it, and an ``isolated`` test using a session fixture fails before the fixture starts.

Runs a small suite of its own under ``pytest -n 2 --dist loadgroup`` with the plugin
``support.worker_groups``; each test writes down the worker that ran it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).parent
WORKERS = ("-n", "2", "--dist", "loadgroup")

INI = """
[pytest]
markers =
    kafka: a broker
    spark: Spark
    s3: S3
    registry: a registry
    isolated: its own services
"""

SUITE = """
import os
import pytest

@pytest.fixture(scope="session")
def kafka_bootstrap():
    return "here"

def _ran(name):
    with open(os.path.join(os.environ["WHERE"], name), "w") as f:
        f.write(os.environ["PYTEST_XDIST_WORKER"])

@pytest.mark.kafka
@pytest.mark.parametrize("n", range(6))
def test_marked(n):
    _ran(f"marked-{n}")

@pytest.mark.parametrize("n", range(6))
def test_by_fixture(kafka_bootstrap, n):
    _ran(f"fixture-{n}")

@pytest.mark.isolated
@pytest.mark.kafka
@pytest.mark.parametrize("n", range(3))
def test_own_broker(n):
    _ran(f"isolated-{n}")

@pytest.mark.parametrize("n", range(40))
def test_free(n):
    _ran(f"free-{n}")
"""


def _run(folder: Path, where: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(TESTS), "WHERE": str(where)}
    env.pop("PYTEST_XDIST_WORKER", None)
    plugins = ("-p", "no:cacheprovider", "-p", "support.worker_groups")
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", *plugins, *WORKERS, str(folder)],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_the_services_tests_share_one_worker_and_the_isolated_ones_another_group(tmp_path: Path) -> None:
    pytest.importorskip("xdist")
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "pytest.ini").write_text(INI)
    (suite / "test_suite.py").write_text(SUITE)
    where = tmp_path / "where"
    where.mkdir()
    done = _run(suite, where)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ran = {p.name: p.read_text() for p in where.iterdir()}
    assert len(ran) == 6 + 6 + 3 + 40
    services = {w for name, w in ran.items() if name.startswith(("marked-", "fixture-"))}
    isolated = {w for name, w in ran.items() if name.startswith("isolated-")}
    assert len(services) == 1, ran  # one worker: the session's services start once
    assert len(isolated) == 1, ran
    assert len(set(ran.values())) == 2  # the free tests ran too, beside the services


def test_an_isolated_test_using_a_session_service_fails(tmp_path: Path) -> None:
    pytest.importorskip("xdist")
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "pytest.ini").write_text(INI)
    (suite / "test_suite.py").write_text(
        SUITE + "\n@pytest.mark.isolated\ndef test_wrong(kafka_bootstrap):\n    pass\n"
    )
    done = _run(suite, tmp_path)
    assert done.returncode == 1
    assert "55 passed, 1 error" in done.stdout  # the others ran
    assert "test_wrong is marked isolated but uses ['kafka_bootstrap']" in done.stdout + done.stderr
