"""CI's allow-list of skips: what it accepts, and that every entry still names a skip that happens."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent


def _conftest() -> ModuleType:
    spec = importlib.util.spec_from_file_location("_ci_conftest", Path(__file__).with_name("conftest.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_allowed_skip_says_why() -> None:
    entries = _conftest()._allowed_skips()
    assert entries
    for entry in entries:
        assert entry["test"].startswith("tests/") and "::" in entry["test"]
        assert len(entry["why"]) > 20


def test_a_skip_is_allowed_only_by_test_and_reason() -> None:
    conftest = _conftest()
    allowed = [{"test": "tests/a.py::t[*]", "reason": "delta-rs cannot open", "why": "-"}]
    assert conftest.is_allowed_skip("tests/a.py::t[x-1]", "delta-rs cannot open this table", allowed)
    assert not conftest.is_allowed_skip("tests/a.py::t[x-1]", "no Kafka: no broker", allowed)
    assert not conftest.is_allowed_skip("tests/a.py::u[x-1]", "delta-rs cannot open this table", allowed)
    exact = [{"test": "tests/a.py::t[x-1]", "reason": "r", "why": "-"}]
    assert conftest.is_allowed_skip("tests/a.py::t[x-1]", "r", exact)  # brackets are literal
    assert not conftest.is_allowed_skip("tests/a.py::t[x]", "r", exact)


def test_a_skip_off_the_list_fails_the_run_when_everything_is_required(tmp_path: Path) -> None:
    """A real pytest run, with the project's conftest, of one test that skips for a missing tool."""
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "conftest.py").write_text(Path(__file__).with_name("conftest.py").read_text())
    (tests / "allowed_skips.toml").write_text(
        '[[skip]]\ntest = "tests/test_x.py::test_allowed"\nreason = "fine here"\nwhy = "a reason for the test"\n'
    )
    (tests / "support").mkdir()
    (tests / "support" / "kafka.py").write_text("")
    (tests / "support" / "spark.py").write_text("")
    (tests / "support" / "s3proxy.py").write_text("")
    (tests / "support" / "registry.py").write_text("")
    (tests / "support" / "worker_groups.py").write_text("")
    (tests / "test_x.py").write_text(
        "import pytest\n"
        "def test_allowed():\n    pytest.skip('fine here')\n"
        "def test_missing_tool():\n    pytest.skip('no broker on this machine')\n"
    )

    def run(require_all: bool) -> subprocess.CompletedProcess[str]:
        env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
        if require_all:
            env["DELTAMIRROR_REQUIRE_ALL"] = "1"
        return subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path),
             "-o", "pythonpath=tests", "tests"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip

    relaxed = run(require_all=False)
    assert relaxed.returncode == 0, relaxed.stdout
    assert "2 skipped" in relaxed.stdout
    strict = run(require_all=True)
    assert strict.returncode == 1, strict.stdout
    assert "1 failed" in strict.stdout and "1 skipped" in strict.stdout
    assert "no broker on this machine" in strict.stdout
