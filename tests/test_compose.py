"""The Docker demo without a Docker engine: docker-compose.yml against the Compose Specification, its
services against the real CLI and scripts, and the Dockerfile's essentials."""

from __future__ import annotations

import argparse
import json
import re
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from deltamirror.producer.config_file import load_config
from deltamirror.producer.settings import merge_overrides

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return data


def _services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    services: dict[str, dict[str, Any]] = compose["services"]
    return services


def _option(command: list[str], flag: str) -> str:
    assert flag in command, f"{flag} missing from {command}"
    return command[command.index(flag) + 1]


# --- the Compose Specification ----------------------------------------------------------------


def _check_jsonschema(path: Path) -> subprocess.CompletedProcess[str]:
    # the venv's own tool, beside the interpreter running the tests: a fresh machine's PATH has no venv
    exe = shutil.which("check-jsonschema", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.skip("check-jsonschema is not installed (pip install -e '.[dev]')")
    return subprocess.run(
        [exe, "--builtin-schema", "vendor.compose-spec", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_compose_file_follows_the_compose_specification() -> None:
    result = _check_jsonschema(COMPOSE)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_validation_catches_a_broken_file(tmp_path: Path, compose: dict[str, Any]) -> None:
    """Proves the check above can fail: the same file with one invalid key is refused."""
    broken = json.loads(json.dumps(compose))
    broken["services"]["watcher"]["depends_on"]["kafka"]["condition"] = "when_ready"
    path = tmp_path / "docker-compose.yml"
    path.write_text(yaml.safe_dump(broken))
    result = _check_jsonschema(path)
    assert result.returncode != 0


# --- the services -----------------------------------------------------------------------------


def test_services(compose: dict[str, Any]) -> None:
    assert set(_services(compose)) == {"kafka", "demo-table", "watcher", "snapshot-consumer"}
    declared = set(compose["volumes"])
    for service in _services(compose).values():
        for mount in service.get("volumes", []):
            assert mount.split(":")[0] in declared, mount


def test_kafka_is_apache_kafka_in_kraft_mode_at_the_pinned_version(compose: dict[str, Any]) -> None:
    kafka = _services(compose)["kafka"]
    pinned = json.loads((ROOT / "devkafka" / "kafka_artifacts.json").read_text())["kafka_version"]
    assert kafka["image"] == f"apache/kafka:{pinned}"
    env = kafka["environment"]
    assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    assert "KAFKA_ZOOKEEPER_CONNECT" not in env
    listeners = dict(item.split("://") for item in env["KAFKA_ADVERTISED_LISTENERS"].split(","))
    assert listeners["INTERNAL"] == "kafka:9092"  # what the other services use
    assert listeners["EXTERNAL"] == "localhost:9092"  # what the host uses
    assert kafka["ports"] == ["127.0.0.1:9092:9094"]  # host port = advertised EXTERNAL port, loopback only
    for key in (
        "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR",
        "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR",
        "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR",
    ):
        assert env[key] == 1, key
    assert "kafka-data:/var/lib/kafka/data" in kafka["volumes"]
    assert env["KAFKA_LOG_DIRS"] == "/var/lib/kafka/data"
    assert "healthcheck" in kafka


def _cli_parser_with(subcommand: str) -> argparse.ArgumentParser:
    from deltamirror.cli.main import build_parser

    parser = build_parser()
    choices = next(a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert isinstance(choices, dict)
    if subcommand not in choices:
        pytest.skip(f"`deltamirror {subcommand}` is not registered yet (deltamirror.cli.producer_cmds)")
    return parser


def test_watcher_runs_a_real_watch_command(compose: dict[str, Any]) -> None:
    watcher = _services(compose)["watcher"]
    command = watcher["command"]
    assert command[0] == "watch"
    assert _option(command, "--bootstrap-servers") == "kafka:9092"
    parser = _cli_parser_with("watch")
    try:
        parser.parse_args(command)
    except SystemExit as exc:  # argparse refuses an unknown flag or a bad value
        pytest.fail(f"`deltamirror {shlex.join(command)}` is refused by the CLI (exit {exc.code})")


def test_watcher_waits_for_its_inputs_and_reports_health(compose: dict[str, Any]) -> None:
    watcher = _services(compose)["watcher"]
    assert watcher["depends_on"] == {
        "kafka": {"condition": "service_healthy"},
        "demo-table": {"condition": "service_completed_successfully"},
    }
    port = _option(watcher["command"], "--metrics-port")
    probe = " ".join(watcher["healthcheck"]["test"])
    assert f"http://127.0.0.1:{port}/healthz" in probe
    assert "table-data:/data:ro" in watcher["volumes"]


def test_watcher_config_is_valid_and_names_the_subscribed_topic(
    compose: dict[str, Any], tmp_path: Path
) -> None:
    watcher = _services(compose)["watcher"]
    (mount,) = watcher["configs"]
    assert mount["target"] == _option(watcher["command"], "--config")
    path = tmp_path / "watch.yaml"
    path.write_text(compose["configs"][mount["source"]]["content"])
    cfg = merge_overrides(
        load_config(path, environ={}),
        {
            "tables": [watcher["command"][1]],
            "bootstrap_servers": _option(watcher["command"], "--bootstrap-servers"),
            "metrics_port": int(_option(watcher["command"], "--metrics-port")),
        },
    )
    (table,) = cfg.tables  # the positional TABLE is the config's table, not a second one
    assert table.normalized_uri == "file:///data/demo"
    consumer = _services(compose)["snapshot-consumer"]["command"]
    assert _option(consumer, "--topic") == table.actions_topic
    assert _option(consumer, "--bootstrap-servers") == cfg.kafka.bootstrap_servers


def test_snapshot_consumer_runs_a_real_consume_snapshot_command(compose: dict[str, Any]) -> None:
    services = _services(compose)
    consumer = services["snapshot-consumer"]
    assert consumer["image"] == services["watcher"]["image"]
    command = consumer["command"]
    assert command[0] == "consume-snapshot"
    assert "--once" not in command  # the demo keeps following the table
    parser = _cli_parser_with("consume-snapshot")
    try:
        args = parser.parse_args(command)
    except SystemExit as exc:
        pytest.fail(f"`deltamirror {shlex.join(command)}` is refused by the CLI (exit {exc.code})")
    assert consumer["depends_on"] == {"watcher": {"condition": "service_healthy"}}
    # the state survives restarts: it lives on a declared volume
    mounts = dict(m.split(":")[:2] for m in consumer["volumes"])
    assert any(args.state_dir.startswith(target.rstrip("/") + "/") for target in mounts.values())


def test_demo_table_service_runs_the_script_the_image_ships(compose: dict[str, Any]) -> None:
    service = _services(compose)["demo-table"]
    script = service["entrypoint"][-1]
    copies = {dest: src for src, dest in _copies(_instructions(DOCKERFILE))}
    assert script in copies, f"{script} is not copied into the image"
    assert (ROOT / copies[script]).is_file()
    assert service["command"] == ["/data/demo"]
    assert "table-data:/data" in service["volumes"]


def test_demo_table_script_makes_a_table_deltamirror_reads(tmp_path: Path) -> None:
    pytest.importorskip("deltalake")
    from deltamirror.core import open_table

    target = tmp_path / "demo"
    script = ROOT / "scripts" / "make_demo_table.py"
    run = [sys.executable, str(script), str(target)]
    first = subprocess.run(run, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    history = list(open_table(str(target)).history())
    assert [h.operation for h in history] == ["WRITE", "WRITE", "UPDATE", "DELETE"]
    rows = open_table(str(target)).snapshot().to_arrow().to_pylist()
    assert sorted(r["order_id"] for r in rows) == [1, 3, 4, 5]

    second = subprocess.run(run, capture_output=True, text=True, timeout=120)
    assert second.returncode == 0, second.stderr
    assert "already exists" in second.stdout
    assert len(list(open_table(str(target)).history())) == 4  # untouched


# --- the Dockerfile ---------------------------------------------------------------------------


def _instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        keyword, _, args = line.partition(" ")
        assert keyword.isupper(), f"not an instruction: {line!r}"
        out.append((keyword, args.strip()))
    assert not pending, "the Dockerfile ends inside a continued line"
    return out


def _copies(instructions: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """(source in the build context, destination) of every COPY from the context."""
    out: list[tuple[str, str]] = []
    for keyword, args in instructions:
        if keyword != "COPY" or args.startswith("--from"):
            continue
        *sources, dest = shlex.split(args)
        out.extend((source.rstrip("/"), dest) for source in sources)
    return out


def _final_stage(instructions: list[tuple[str, str]]) -> list[tuple[str, str]]:
    last_from = max(i for i, (k, _) in enumerate(instructions) if k == "FROM")
    return instructions[last_from:]


def test_dockerfile_parses_and_pins_its_base_images() -> None:
    instructions = _instructions(DOCKERFILE)
    froms = [args.split()[0] for keyword, args in instructions if keyword == "FROM"]
    assert froms, "no FROM"
    for image in froms:
        _, _, tag = image.partition(":")
        assert tag and tag != "latest", f"{image} is not pinned by tag"
    assert froms[-1] == "python:3.11-slim"


def test_dockerfile_installs_the_package() -> None:
    instructions = _instructions(DOCKERFILE)
    runs = " && ".join(args for keyword, args in instructions if keyword == "RUN")
    assert re.search(r"pip wheel .*--wheel-dir /wheels \.", runs), "the project is not built"
    final_runs = [args for keyword, args in _final_stage(instructions) if keyword == "RUN"]
    assert any(re.search(r"pip install .*/wheels/deltamirror-\*\.whl", args) for args in final_runs)
    entrypoint = next(json.loads(args) for keyword, args in instructions if keyword == "ENTRYPOINT")
    assert entrypoint == ["deltamirror"]  # the console script of [project.scripts]


def test_dockerfile_runs_as_an_unprivileged_user() -> None:
    final = _final_stage(_instructions(DOCKERFILE))
    users = [i for i, (keyword, _) in enumerate(final) if keyword == "USER"]
    assert users, "the image runs as root"
    user = final[users[-1]][1].split(":")[0]
    assert user not in ("root", "0")
    assert not any(keyword == "RUN" for keyword, _ in final[users[-1] :]), "RUN after USER: as whom?"


def test_dockerfile_copies_exist_and_pass_the_dockerignore() -> None:
    copies = _copies(_instructions(DOCKERFILE))
    allowed = {line[1:].rstrip("/") for line in DOCKERIGNORE.read_text().splitlines() if line.startswith("!")}
    for source, _ in copies:
        assert (ROOT / source).exists(), f"COPY {source}: no such file in the repository"
        assert source in allowed, f"COPY {source}: excluded by .dockerignore"
    # every folder that pyproject.toml maps to a deltamirror package is copied into the build stage
    import tomllib

    package_dirs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    assert set(package_dirs.values()) <= {source for source, _ in copies}


def _skip_unless_build_requirements_installed() -> None:
    """The build runs offline (no build isolation), so [build-system] requires must be met here."""
    import tomllib
    from importlib.metadata import PackageNotFoundError, version

    from packaging.requirements import Requirement

    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    for requirement in map(Requirement, requires):
        try:
            installed = version(requirement.name)
        except PackageNotFoundError:
            pytest.skip(f"build requirement {requirement} is not installed")
        if not requirement.specifier.contains(installed, prereleases=True):
            pytest.skip(f"build requirement {requirement} is not met (installed {installed})")


def test_the_copied_files_are_enough_to_build_the_wheel(tmp_path: Path) -> None:
    """What the build stage does, without Docker: a wheel from exactly the COPY'd files."""
    _skip_unless_build_requirements_installed()
    context = tmp_path / "context"
    context.mkdir()
    for source, _ in _copies(_instructions(DOCKERFILE)):
        if source.startswith("scripts/"):
            continue  # copied into the final stage, not part of the build
        src = ROOT / source
        if src.is_dir():
            shutil.copytree(src, context / source, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(src, context / source)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "--wheel-dir",
            str(tmp_path / "wheels"),
            str(context),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    (wheel,) = (tmp_path / "wheels").glob("deltamirror-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "deltamirror/devkafka/kafka_artifacts.json" in names
    assert "deltamirror/__init__.py" in names  # the distribution root: __version__
    # every module of every package folder, sub-packages included (pyproject lists packages by name)
    import tomllib

    package_dirs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    for package, folder in package_dirs.items():
        for path in (ROOT / folder).rglob("*.py"):
            module = "/".join([*package.split("."), *path.relative_to(ROOT / folder).parts])
            assert module in names, f"{module} is missing from the wheel: add its package to pyproject.toml"
