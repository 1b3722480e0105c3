"""No setting silently ignored: every flag and every configuration key has an observer that runs the
command with it and sees something else than without it (an output, a record, a log line or a
refusal naming it).

The settings are enumerated from where they are defined (``support.settings_walk``: the parser,
every subcommand included, and the pydantic settings models walked field by field), never from a
list kept here: a setting added to the code without an observer below fails
``test_every_setting_has_an_observer`` the day it is added.

An observer is registered for one or more settings (``@observes``). Most run here, in process
(``deltamirror.cli.main.main``) or as a process where one is needed; the cheap ones need no broker,
the others share the session's broker and one mirrored table. A few settings are observed by a test
elsewhere that already runs what they need (a broker of their own, a secured listener, a group of
processes): ``ELSEWHERE`` names that test, and ``test_settings_observed_elsewhere_are_observed_there``
checks that it exists and speaks of the setting.

A ``watch`` flag is observed in two halves: the flag gives the model's field (the configuration the
command hands to the service differs in that field, and only there), and the field has an observer
of its own (``FLAG_FIELDS`` is checked against the registry).
"""

from __future__ import annotations

import ast
import json
import os
import pty
import select
import shutil
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from deltamirror.cli.main import main
from support.settings_walk import settings

ROOT = Path(__file__).resolve().parents[2]
TABLES = ROOT / "tests" / "data" / "tables"


# --- the registry ---------------------------------------------------------------------------------


@dataclass
class Observer:
    fn: Callable[[Ctx], None]
    keys: tuple[str, ...]
    marks: tuple[Any, ...]


OBSERVERS: dict[str, Observer] = {}


def observes(*keys: str, kafka: bool = False, s3: bool = False) -> Callable[[Callable[[Ctx], None]], Any]:
    def register(fn: Callable[[Ctx], None]) -> Callable[[Ctx], None]:
        marks = (*((pytest.mark.kafka,) if kafka else ()), *((pytest.mark.s3,) if s3 else ()))
        observer = Observer(fn, keys, marks)
        for key in keys:
            assert key not in OBSERVERS, f"{key} has two observers"
            OBSERVERS[key] = observer
        return fn

    return register


class Ctx:
    """What an observer gets: a folder, captured output, and the session's services on demand."""

    def __init__(self, request: pytest.FixtureRequest, tmp_path: Path, capsys: pytest.CaptureFixture[str]):
        self.request = request
        self.tmp = tmp_path
        self.capsys = capsys

    def fixture(self, name: str) -> Any:
        return self.request.getfixturevalue(name)

    def cli(self, *argv: str) -> tuple[int, str, str]:
        """``deltamirror ARGV`` in this process: (exit status, stdout, stderr); argparse's exits too."""
        self.capsys.readouterr()
        try:
            code = main(list(argv))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 2
        out, err = self.capsys.readouterr()
        return code, out, err

    def ok(self, *argv: str) -> str:
        code, out, err = self.cli(*argv)
        assert code == 0, f"{argv}: exit {code}: {err}"
        return out

    def refused(self, *argv: str, naming: str) -> str:
        code, _, err = self.cli(*argv)
        assert code == 2, f"{argv}: exit {code} where a refusal naming {naming!r} is due: {err}"
        lines = err.strip().splitlines()
        assert len(lines) == 1 and naming in lines[0], err
        return lines[0]

    def unique(self, prefix: str) -> str:
        return f"{prefix}-{uuid.uuid4().hex[:8]}"


# --- tables ---------------------------------------------------------------------------------------


def make_table(path: Path, versions: int = 3) -> Path:
    """``versions`` appends of one row each (``id``, ``name``), change data feed on."""
    for v in range(versions):
        write_deltalake(
            str(path),
            pa.table({"id": [v], "name": [f"n{v}"]}),
            mode="append",
            configuration={"delta.enableChangeDataFeed": "true"} if v == 0 else None,
        )
    return path


def data_file_outside(root: Path, outside: Path) -> Path:
    """A table whose version 1 adds a file outside its root, named by an absolute URI."""
    make_table(root, 2)
    outside.mkdir(parents=True, exist_ok=True)
    log = root / "_delta_log" / "00000000000000000001.json"
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    for line in lines:
        if "add" in line:
            name = line["add"]["path"]
            shutil.move(root / name, outside / name)
            line["add"]["path"] = (outside / name).as_uri()
    log.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return root


def sidecar_outside(root: Path, outside: Path) -> Path:
    """A table read from a V2 checkpoint (its commits cleaned up) one of whose sidecars lies outside."""
    shutil.copytree(TABLES / "golden__v2-checkpoint-json", root)
    log = root / "_delta_log"
    for crc in [*log.glob(".*.crc"), *log.glob("_sidecars/.*.crc")]:
        crc.unlink()
    outside.mkdir(parents=True, exist_ok=True)
    sidecar = sorted((log / "_sidecars").iterdir())[0]
    shutil.move(sidecar, outside / sidecar.name)
    (checkpoint,) = log.glob("*.checkpoint.*.json")
    text = checkpoint.read_text().replace(
        f'"path":"{sidecar.name}"', f'"path":"{(outside / sidecar.name).as_uri()}"'
    )
    assert (outside / sidecar.name).as_uri() in text
    checkpoint.write_text(text)
    return root


def history(ctx: Ctx, table: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in ctx.ok("history", str(table), "--format", "jsonl").splitlines()]


def run_on_terminal(argv: list[str]) -> tuple[int, bytes]:
    """``deltamirror ARGV`` as a process whose stderr is a pseudo-terminal: (exit status, stderr)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "deltamirror.cli.main", *argv],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=slave,
    )
    os.close(slave)
    seen = b""
    while True:
        ready, _, _ = select.select([master], [], [], 60)
        assert ready, f"no end of {argv}"
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the process closed the terminal
            break
        if not chunk:
            break
        seen += chunk
    os.close(master)
    return proc.wait(60), seen


# --- the top level --------------------------------------------------------------------------------


@observes(" version")
def _version(ctx: Ctx) -> None:
    code, out, _ = ctx.cli("--version")
    assert code == 0 and out.startswith("deltamirror ")
    code, out, err = ctx.cli()
    assert code == 2 and out == "" and "COMMAND" in err


# --- table commands -------------------------------------------------------------------------------

TABLE_COMMANDS = {
    "snapshot": [],
    "read": [],
    "history": [],
    "changes": ["--starting-version", "0"],
    "events": [],
}


@observes(*(f"{c} table" for c in TABLE_COMMANDS))
def _table(ctx: Ctx) -> None:
    a, b = make_table(ctx.tmp / "a", 2), make_table(ctx.tmp / "b", 3)
    for command, extra in TABLE_COMMANDS.items():
        out_a, out_b = ctx.ok(command, str(a), *extra), ctx.ok(command, str(b), *extra)
        assert out_a != out_b and len(out_a.splitlines()) < len(out_b.splitlines()), command


@observes(*(f"{c} storage_option" for c in TABLE_COMMANDS), "watch storage_options", s3=True)
def _storage_options(ctx: Ctx) -> None:
    """Refused on a local table (it takes none); on an object store, they are how it is reached."""
    local = make_table(ctx.tmp / "t", 2)
    for command, extra in TABLE_COMMANDS.items():
        ctx.refused(command, str(local), *extra, "-S", "region=eu", naming="storage options (-S")
    ctx.refused(
        "watch", "--bootstrap-servers", "k:9092", str(local), "-S", "region=eu", naming="storage options"
    )
    s3 = ctx.fixture("s3")
    uri = s3.upload_table(local, s3.new_prefix("every-setting") + "/t")
    options = [f"-S{k}={v}" for k, v in s3.storage_options.items()]
    for command, extra in TABLE_COMMANDS.items():
        with_options = ctx.ok(command, uri, *extra, *options)
        assert with_options.strip(), command
        wrong = [o if not o.startswith("-Ssecret=") else "-Ssecret=not-the-secret" for o in options]
        code, _, err = ctx.cli(command, uri, *extra, *wrong)
        assert code != 0 and err, command  # the options are how it is reached: a wrong secret is refused


@observes("snapshot allow_path_prefix")
def _snapshot_allow_path_prefix(ctx: Ctx) -> None:
    table = sidecar_outside(ctx.tmp / "t", ctx.tmp / "outside")
    ctx.refused("snapshot", str(table), naming="sidecar")
    assert ctx.ok("snapshot", str(table), "--allow-path-prefix", str(ctx.tmp / "outside"))


@observes("read allow_path_prefix", "changes allow_path_prefix")
def _data_allow_path_prefix(ctx: Ctx) -> None:
    table = data_file_outside(ctx.tmp / "t", ctx.tmp / "outside")
    for command, extra in (("read", []), ("changes", ["--starting-version", "0"])):
        ctx.refused(command, str(table), *extra, naming="lies outside the table root")
        rows = ctx.ok(command, str(table), *extra, "--allow-path-prefix", str(ctx.tmp / "outside"))
        assert len(rows.splitlines()) == 2


def test_commands_that_read_only_commit_files_refuse_allow_path_prefix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], request: pytest.FixtureRequest
) -> None:
    """``history`` and ``events`` read no file the log names: the flag would do nothing (it did)."""
    from deltamirror.core.errors import InvalidArgumentError
    from deltamirror.producer.publishing.offline_events import iter_event_values

    ctx = Ctx(request, tmp_path, capsys)
    table = data_file_outside(tmp_path / "t", tmp_path / "outside")
    for command in ("history", "events"):
        assert ctx.ok(command, str(table))  # no file outside is read: nothing to allow
        ctx.refused(command, str(table), "--allow-path-prefix", str(tmp_path), naming="--allow-path-prefix")
    with pytest.raises(InvalidArgumentError, match="allowed_path_prefixes"):
        list(iter_event_values(str(table), allowed_path_prefixes=[str(tmp_path)]))


@observes("snapshot version", "read version", "snapshot timestamp", "read timestamp")
def _version_and_timestamp(ctx: Ctx) -> None:
    table = make_table(ctx.tmp / "t", 3)
    first = history(ctx, table)[0]
    for command in ("snapshot", "read"):
        latest = ctx.ok(command, str(table))
        at_0 = ctx.ok(command, str(table), "--version", "0")
        assert at_0 != latest and len(at_0.splitlines()) < len(latest.splitlines()), command
        assert ctx.ok(command, str(table), "--timestamp", first["timestamp"]) == at_0, command


@observes("snapshot format", "read format", "history format", "changes format")
def _format(ctx: Ctx) -> None:
    table = make_table(ctx.tmp / "t", 2)
    cases = {
        "snapshot": ([], ["parquet"]),
        "read": ([], ["parquet", "csv"]),
        "history": ([], ["jsonl"]),
        "changes": (["--starting-version", "0"], ["parquet", "csv"]),
    }
    for command, (extra, formats) in cases.items():
        default = ctx.tmp / f"{command}.default"
        ctx.ok(command, str(table), *extra, "-o", str(default))
        for fmt in formats:
            given = ctx.tmp / f"{command}.{fmt}"
            ctx.ok(command, str(table), *extra, "--format", fmt, "-o", str(given))
            assert given.read_bytes() != default.read_bytes(), (command, fmt)
            if fmt == "parquet":
                assert given.read_bytes()[:4] == b"PAR1"


@observes(*(f"{c} output" for c in TABLE_COMMANDS))
def _output(ctx: Ctx) -> None:
    table = make_table(ctx.tmp / "t", 2)
    for command, extra in TABLE_COMMANDS.items():
        printed = ctx.ok(command, str(table), *extra)
        target = ctx.tmp / f"{command}.out"
        assert ctx.ok(command, str(table), *extra, "-o", str(target)) == ""
        assert target.read_text() == printed, command


@observes("snapshot no_progress", "read no_progress", "changes no_progress")
def _no_progress(ctx: Ctx) -> None:
    table = make_table(ctx.tmp / "t", 2)
    for command, extra in (("snapshot", []), ("read", []), ("changes", ["--starting-version", "0"])):
        argv = [command, str(table), *extra, "-o", str(ctx.tmp / f"{command}.out")]
        code, shown = run_on_terminal(argv)
        assert code == 0 and b"\r" in shown and b"/" in shown, (command, shown)
        code, shown = run_on_terminal([*argv, "--no-progress"])
        assert code == 0 and shown == b"", (command, shown)


@observes("read columns", "changes columns")
def _columns(ctx: Ctx) -> None:
    table = make_table(ctx.tmp / "t", 2)
    for command, extra in (("read", []), ("changes", ["--starting-version", "0"])):
        every = json.loads(ctx.ok(command, str(table), *extra).splitlines()[0])
        chosen = json.loads(ctx.ok(command, str(table), *extra, "--columns", "name").splitlines()[0])
        assert "id" in every and "id" not in chosen and "name" in chosen, command


@observes("changes row_ids")
def _row_ids(ctx: Ctx) -> None:
    """delta-spark's row ids (tests/data/corpus, written with row tracking) as columns, or refused."""
    from support.corpus import CORPUS

    table = CORPUS / "tables" / "spark__row_ids"
    rows = [
        json.loads(line)
        for line in ctx.ok(
            "changes", str(table), "--starting-version", "3", "--ending-version", "3", "--row-ids"
        ).splitlines()
    ]
    assert {(r["_change_type"], r["_row_id"]) for r in rows} == {
        ("update_preimage", 1),
        ("update_postimage", 1),
    }
    plain = ctx.ok("changes", str(table), "--starting-version", "3", "--ending-version", "3")
    assert "_row_id" not in plain
    ctx.refused(
        "changes",
        str(make_table(ctx.tmp / "t", 2)),
        "--starting-version",
        "0",
        "--row-ids",
        naming="row tracking",
    )


@observes("changes net", "changes key")
def _net_changes(ctx: Ctx) -> None:
    """A real change feed with updates, deletes and a key used twice (krs__cdf-table-non-partitioned)."""
    table = ctx.tmp / "cdf"
    shutil.copytree(TABLES / "krs__cdf-table-non-partitioned", table)

    def kinds(start: int, *argv: str) -> list[str]:
        out = ctx.ok("changes", str(table), "--starting-version", str(start), *argv)
        return [json.loads(line)["_change_type"] for line in out.splitlines()]

    every, net = kinds(0), kinds(0, "--net")
    assert "update_preimage" in every and len(net) < len(every)
    assert set(net) <= {"insert", "delete"}  # without a key a row is its values: no pairs
    # versions 1-3 update rows written at version 0, and delete one: pairs and a delete, once per id
    keyed = kinds(1, "--ending-version", "3", "--net", "--key", "id")
    assert {"update_preimage", "update_postimage", "delete"} <= set(keyed)
    assert len(keyed) < len(kinds(1, "--ending-version", "3"))
    ctx.refused("changes", str(table), "--starting-version", "0", "--net", "--key", "id", naming="not unique")
    ctx.refused("changes", str(table), "--starting-version", "0", "--key", "id", naming="--net")


@observes(
    "changes starting_version",
    "changes ending_version",
    "changes starting_timestamp",
    "changes ending_timestamp",
)
def _change_range(ctx: Ctx) -> None:
    table = make_table(ctx.tmp / "t", 3)
    times = [h["timestamp"] for h in history(ctx, table)]

    def versions(*argv: str) -> list[int]:
        out = ctx.ok("changes", str(table), *argv)
        return sorted({json.loads(line)["_commit_version"] for line in out.splitlines()})

    assert versions("--starting-version", "0") == [0, 1, 2]
    assert versions("--starting-version", "1") == [1, 2]
    assert versions("--starting-version", "0", "--ending-version", "1") == [0, 1]
    assert versions("--starting-timestamp", times[1]) == [1, 2]
    assert versions("--starting-version", "0", "--ending-timestamp", times[1]) == [0, 1]
    ctx.refused("changes", str(table), naming="--starting-version")


@observes("events starting_version", "events ending_version")
def _event_range(ctx: Ctx) -> None:
    table = make_table(ctx.tmp / "t", 3)

    def versions(*argv: str) -> list[int]:
        return sorted(
            {json.loads(line)["version"] for line in ctx.ok("events", str(table), *argv).splitlines()}
        )

    assert versions() == [0, 1, 2]
    assert versions("--starting-version", "1") == [1, 2]
    assert versions("--ending-version", "1") == [0, 1]


# --- watch: each flag gives its field of the configuration, and the field has its own observer -----

#: a watch flag -> the model field(s) it sets (each observed on its own below or elsewhere)
FLAG_FIELDS: dict[str, tuple[str, ...]] = {
    "tables": ("WatchConfig.tables[].uri",),
    "discover": ("WatchConfig.discover[].uri",),
    "bootstrap_servers": ("WatchConfig.kafka.bootstrap_servers",),
    "snapshot_mode": ("WatchConfig.tables[].snapshot_mode",),
    "from_version": ("WatchConfig.tables[].from_version",),
    "from_timestamp": ("WatchConfig.tables[].from_timestamp",),
    "poll_interval_s": ("WatchConfig.tables[].poll_interval_s",),
    "progress_topic": ("WatchConfig.progress_topic",),
    "transactional_id_prefix": ("WatchConfig.transactional_id_prefix",),
    "heartbeat_interval_s": ("WatchConfig.heartbeat_interval_s",),
    "group": ("WatchConfig.group.name",),
    "row_changes": ("WatchConfig.tables[].row_changes.enabled",),
    "net_catch_up": ("WatchConfig.tables[].row_changes.net_catch_up",),
    "row_format": ("WatchConfig.tables[].row_changes.format",),
    "schema_registry_url": ("WatchConfig.tables[].row_changes.registry.url",),
    "subject_name_strategy": ("WatchConfig.tables[].row_changes.registry.subject_name_strategy",),
    "wait_for_table": ("WatchConfig.tables[].wait_for_table",),
    "metrics_port": ("WatchConfig.metrics_port",),
    "metrics_host": ("WatchConfig.metrics_host",),
    "workers": ("WatchConfig.workers",),
}


@pytest.fixture
def handed(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    from deltamirror.producer import service

    seen: list[Any] = []
    monkeypatch.setattr(service, "run_watch", lambda cfg: seen.append(cfg) or 0)
    return seen


def _field(cfg: Any, path: str) -> Any:
    """The value at a model path (``tables[].uri``: the list of every table's)."""
    value: Any = cfg
    for part in path.split("."):
        many = part.endswith("[]")
        name = part.removesuffix("[]")
        if isinstance(value, list):
            value = [getattr(v, name) if v is not None else None for v in value]
        else:
            value = getattr(value, name) if value is not None else None
        if many and not isinstance(value, list):
            value = [value]
    return value


@observes(*(f"watch {dest}" for dest in FLAG_FIELDS))
def _watch_flags(ctx: Ctx) -> None:
    from deltamirror.producer import WatchConfig

    handed = ctx.fixture("handed")
    table = make_table(ctx.tmp / "t", 1)
    other = make_table(ctx.tmp / "u", 1)
    base = ["--bootstrap-servers", "k:9092", str(table)]
    avro = [*base, "--row-changes", "--row-format", "avro"]
    given = {
        "tables": ["--bootstrap-servers", "k:9092", str(other)],
        "discover": [*base, "--discover", str(ctx.tmp)],
        "bootstrap_servers": ["--bootstrap-servers", "other:9092", str(table)],
        "snapshot_mode": [*base, "--snapshot-mode", "latest"],
        "from_version": [*base, "--from-version", "0"],
        "from_timestamp": [*base, "--from-timestamp", "2026-01-01T00:00:00Z"],
        "poll_interval_s": [*base, "--poll-interval", "0.25"],
        "progress_topic": [*base, "--progress-topic", "other.progress"],
        "transactional_id_prefix": [*base, "--transactional-id-prefix", "other"],
        "heartbeat_interval_s": [*base, "--heartbeat-interval", "5"],
        "group": [*base, "--group", "g1"],
        "row_changes": [*base, "--row-changes"],
        "net_catch_up": [*base, "--from-version", "0", "--row-changes", "--net-catch-up"],
        "row_format": [*base, "--row-changes", "--row-format", "json-schema"],
        "schema_registry_url": [*avro, "--schema-registry-url", "http://registry:8081"],
        "subject_name_strategy": [
            *avro,
            "--schema-registry-url",
            "http://r:1",
            "--subject-name-strategy",
            "record",
        ],
        "wait_for_table": [*base, "--wait-for-table"],
        "metrics_port": [*base, "--metrics-port", "9464"],
        "metrics_host": [*base, "--metrics-port", "9464", "--metrics-host", "0.0.0.0"],
        "workers": [*base, "--workers", "3"],
    }
    assert set(given) == set(FLAG_FIELDS)
    ctx.ok("watch", *base, "--metrics-port", "9464")
    ctx.ok("watch", *base)
    with_port, plain = handed[0], handed[1]
    dumped = plain.model_dump()
    for dest, argv in given.items():
        ctx.ok("watch", *argv)
        cfg: WatchConfig = handed[-1]
        reference = with_port if dest == "metrics_host" else plain
        for key in FLAG_FIELDS[dest]:
            path = key.removeprefix("WatchConfig.")
            assert _field(cfg, path) != _field(reference, path), (dest, path)
        # nothing else changed but what the flag sets (and what its mode implies)
        changed = {k for k in dumped if cfg.model_dump()[k] != reference.model_dump()[k]}
        assert changed <= {
            k.removeprefix("WatchConfig.").split(".")[0].removesuffix("[]") for k in FLAG_FIELDS[dest]
        }, (
            dest,
            changed,
        )


@observes("watch config")
def _watch_config(ctx: Ctx) -> None:
    handed = ctx.fixture("handed")
    table = make_table(ctx.tmp / "t", 1)
    path = ctx.tmp / "w.yaml"
    path.write_text(
        f"kafka: {{bootstrap_servers: 'file:9092'}}\ntables: ['{table}']\nprogress_topic: from.file\n"
    )
    ctx.refused("watch", str(table), naming="--bootstrap-servers is required without --config")
    ctx.ok("watch", "--config", str(path))
    assert handed[-1].progress_topic == "from.file" and handed[-1].kafka.bootstrap_servers == "file:9092"


@observes("watch no_progress")
def _watch_no_progress(ctx: Ctx) -> None:
    from deltamirror.producer import service
    from deltamirror.producer.tailing.snapshot_events import ProgressBar

    monkeypatch = ctx.fixture("monkeypatch")
    seen: list[bool] = []
    monkeypatch.setattr(service, "run_watch", lambda cfg: seen.append(ProgressBar.shown) or 0)
    monkeypatch.setattr(ProgressBar, "shown", True)
    table = make_table(ctx.tmp / "t", 1)
    ctx.ok("watch", "--bootstrap-servers", "k:9092", str(table))
    ctx.ok("watch", "--bootstrap-servers", "k:9092", str(table), "--no-progress")
    assert seen == [True, False]


# --- the consumer commands: one table mirrored once, then dropped ------------------------------------


@dataclass
class Mirrored:
    bootstrap: str
    actions: str
    commits: str
    table: Path

    def source(self, *extra: str) -> list[str]:
        return ["--topic", self.actions, "--bootstrap-servers", self.bootstrap, *extra]


def _kinds(bootstrap: str, topic: str) -> list[str]:
    from support.records import read_topic

    return [str(r.json.get("kind")) for r in read_topic(bootstrap, topic) if r.value]


@pytest.fixture(scope="module")
def mirrored(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Mirrored:
    """Versions 0-2 of a table on its topics, then its ``tableDropped`` (``when_deleted: drop``)."""
    from support.records import run_watcher

    table = make_table(tmp_path_factory.mktemp("mirrored") / "t", 3)
    name = f"dmset-{uuid.uuid4().hex[:8]}"
    m = Mirrored(kafka_bootstrap, f"{name}.actions", f"{name}.commits", table)
    cfg = {
        "kafka": {"bootstrap_servers": kafka_bootstrap},
        "tables": [
            {
                "uri": str(table),
                "snapshot_mode": "from-version",
                "from_version": 0,
                "actions_topic": m.actions,
                "commits_topic": m.commits,
                "poll_interval_s": 0.2,
                "when_deleted": "drop",
            }
        ],
        "progress_topic": f"{name}.progress",
        "transactional_id_prefix": name,
        "signal_topic": None,
    }

    def dropped() -> bool:
        kinds = _kinds(kafka_bootstrap, m.commits)
        if kinds.count("commit") == 3 and (table / "_delta_log").exists():
            shutil.rmtree(table / "_delta_log")
        return "tableDropped" in kinds

    run_watcher(cfg, dropped, "versions 0-2, then the table dropped")
    return m


def _versions(out: str) -> list[int]:
    return [
        json.loads(line)["version"]
        for line in out.splitlines()
        if ('"version"' in line and "kind" not in line) or '"kind":"version"' in line
    ]


CONSUMERS = {"consume-snapshot": [], "invalidate": ["--exec", "true"]}


@observes(
    *(f"{c} {d}" for c in CONSUMERS for d in ("bootstrap_servers", "config", "topic", "once")), kafka=True
)
def _consumer_source(ctx: Ctx) -> None:
    m: Mirrored = ctx.fixture("mirrored")
    config = ctx.tmp / "kafka.yaml"
    config.write_text(f"kafka: {{bootstrap_servers: '{m.bootstrap}'}}\ntables: []\n")
    for command, extra in CONSUMERS.items():
        group = ["--group-id", ctx.unique("g")]
        flags = ctx.ok(command, *m.source("--once", *extra, *group))
        assert len(flags.splitlines()) == 3, (command, flags)
        ctx.refused(command, "--topic", m.actions, "--once", *extra, naming="--bootstrap-servers")
        from_file = ctx.ok(
            command,
            "--config",
            str(config),
            "--topic",
            m.actions,
            "--once",
            *extra,
            "--group-id",
            ctx.unique("g"),
        )
        assert from_file == flags, command
        ctx.refused(
            command,
            "--bootstrap-servers",
            m.bootstrap,
            "--topic",
            "absent.actions",
            "--once",
            *extra,
            naming="absent.actions",
        )
        # without --once it keeps reading: still running once everything was printed; a SIGTERM stops it
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "deltamirror.cli.main",
                command,
                *m.source(*extra, "--group-id", ctx.unique("g")),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        try:
            assert proc.stdout is not None
            lines = [proc.stdout.readline() for _ in range(3)]
            assert all(lines), lines
            assert proc.poll() is None
            proc.send_signal(subprocess.signal.SIGTERM)  # type: ignore[attr-defined]
            assert proc.wait(30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _committed(bootstrap: str, group: str, topic: str) -> list[int]:
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    future = admin.list_consumer_group_offsets(
        [ConsumerGroupTopicPartitions(group, [TopicPartition(topic, 0)])]
    )
    result = future[group].result(timeout=30)
    return [tp.offset for tp in result.topic_partitions if tp.offset >= 0]


@observes("consume-snapshot group_id", "invalidate group_id", kafka=True)
def _group_id(ctx: Ctx) -> None:
    m: Mirrored = ctx.fixture("mirrored")
    group = ctx.unique("g")
    ctx.ok("consume-snapshot", *m.source("--once", "--group-id", group))
    assert _committed(m.bootstrap, group, m.actions)  # the reader's position, under that group
    acknowledged = ctx.unique("g")
    assert (
        len(
            ctx.ok(
                "invalidate", *m.source("--once", "--exec", "true", "--group-id", acknowledged)
            ).splitlines()
        )
        == 3
    )
    assert ctx.ok("invalidate", *m.source("--once", "--exec", "true", "--group-id", acknowledged)) == ""
    assert (
        len(
            ctx.ok(
                "invalidate", *m.source("--once", "--exec", "true", "--group-id", ctx.unique("g"))
            ).splitlines()
        )
        == 3
    )


def _saved_version(state: Path) -> int | None:
    """The version of the table state last saved under ``state`` (None: none saved)."""
    for last in state.rglob("_last_checkpoint"):
        return int(json.loads(last.read_text())["version"])
    return None


@observes(
    "consume-snapshot state_dir",
    "invalidate state_dir",
    kafka=True,
)
def _state_dir(ctx: Ctx) -> None:
    m: Mirrored = ctx.fixture("mirrored")
    for command, extra in CONSUMERS.items():
        state = ctx.tmp / f"{command}-state"
        first = ctx.ok(command, *m.source("--once", *extra, "--state-dir", str(state)))
        assert len(first.splitlines()) == 3 and _saved_version(state) == 2
        assert ctx.ok(command, *m.source("--once", *extra, "--state-dir", str(state))) == ""  # continues
        assert len(ctx.ok(command, *m.source("--once", *extra)).splitlines()) == 3  # without: from the start


@observes(*(f"{c} {d}" for c in CONSUMERS for d in ("metrics_port", "metrics_host")), kafka=True)
def _consumer_metrics(ctx: Ctx) -> None:
    import socket
    import urllib.request

    m: Mirrored = ctx.fixture("mirrored")
    for command, extra in CONSUMERS.items():
        with socket.socket() as sock:
            sock.bind(("127.0.0.2", 0))
            port = sock.getsockname()[1]
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "deltamirror.cli.main",
                command,
                *m.source(*extra, "--metrics-port", str(port), "--metrics-host", "127.0.0.2"),
                *("--group-id", ctx.unique("g")),  # the default group has acknowledged everything
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        bound = threading.Timer(60, proc.kill)  # a reader that prints nothing must not hang the test
        bound.start()
        try:
            assert proc.stdout is not None
            assert all(proc.stdout.readline() for _ in range(3)), command
            with urllib.request.urlopen(f"http://127.0.0.2:{port}/metrics", timeout=10) as resp:
                assert b"deltamirror_consumer_versions_applied_total" in resp.read()
            with pytest.raises(OSError):  # on the host given, not on the default one
                urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5)
        finally:
            proc.send_signal(subprocess.signal.SIGTERM)  # type: ignore[attr-defined]
            proc.wait(30)
            bound.cancel()


@observes("consume-snapshot format", "consume-snapshot max_items", "invalidate max_items", kafka=True)
def _documents(ctx: Ctx) -> None:
    m: Mirrored = ctx.fixture("mirrored")
    counts = [json.loads(line) for line in ctx.ok("consume-snapshot", *m.source("--once")).splitlines()]
    docs = [
        json.loads(line)
        for line in ctx.ok("consume-snapshot", *m.source("--once", "--format", "jsonl")).splitlines()
    ]
    assert "added" in docs[2] and isinstance(docs[2]["added"], list) and isinstance(counts[2]["added"], int)
    assert docs[2]["added"] and not docs[2].get("addedTruncated")
    cut = [
        json.loads(line)
        for line in ctx.ok(
            "consume-snapshot", *m.source("--once", "--format", "jsonl", "--max-items", "0")
        ).splitlines()
    ]
    assert cut[2]["added"] == [] and cut[2]["addedTruncated"]
    delivered = ctx.tmp / "delivered.jsonl"
    for max_items, name in ((None, "all"), ("0", "cut")):
        target = ctx.tmp / f"{name}.jsonl"
        command = f"sh -c 'cat >> {target}; echo >> {target}'"
        argv = [*m.source("--once", "--exec", command, "--group-id", ctx.unique("g"))]
        ctx.ok("invalidate", *argv, *(["--max-items", max_items] if max_items else []))
    whole = [json.loads(x) for x in (ctx.tmp / "all.jsonl").read_text().splitlines() if x]
    short = [json.loads(x) for x in (ctx.tmp / "cut.jsonl").read_text().splitlines() if x]
    assert whole[2]["added"] and short[2]["added"] == [] and short[2]["addedTruncated"]
    del delivered


@observes(
    "consume-snapshot commits_topic",
    "invalidate commits_topic",
    "WatchConfig.tables[].when_deleted",
    kafka=True,
)
def _commits_topic(ctx: Ctx) -> None:
    """The table was dropped (``when_deleted: drop`` published ``tableDropped``): read with the
    commits topic, the consumers say so; without it, they cannot know."""
    m: Mirrored = ctx.fixture("mirrored")
    assert "tableDropped" in _kinds(m.bootstrap, m.commits)
    without = ctx.ok("consume-snapshot", *m.source("--once"))
    with_commits = ctx.ok("consume-snapshot", *m.source("--once", "--commits-topic", m.commits))
    assert "tableDropped" not in without and "tableDropped" in with_commits
    target = ctx.tmp / "docs"
    command = f"sh -c 'cat >> {target}; echo >> {target}'"
    ctx.ok("invalidate", *m.source("--once", "--exec", command, "--group-id", ctx.unique("g")))
    assert "tableDropped" not in target.read_text()
    ctx.ok(
        "invalidate",
        *m.source("--once", "--exec", command, "--group-id", ctx.unique("g"), "--commits-topic", m.commits),
    )
    assert "tableDropped" in target.read_text()
    # the other setting, wait: the table deleted is waited for, nothing published
    from support.records import run_watcher

    table = make_table(ctx.tmp / "waited", 1)
    name = ctx.unique("dmwait")
    commits = f"{name}.commits"

    def deleted_and_seen() -> bool:
        kinds = _kinds(m.bootstrap, commits)
        if kinds.count("commit") == 1 and (table / "_delta_log").exists():
            shutil.rmtree(table / "_delta_log")
            make_table(ctx.tmp / "after", 1)  # something to wait on: a marker that time went by
            return False
        return not (table / "_delta_log").exists()

    cfg = {
        "kafka": {"bootstrap_servers": m.bootstrap},
        "tables": [
            {
                "uri": str(table),
                "actions_topic": f"{name}.actions",
                "commits_topic": commits,
                "poll_interval_s": 0.2,
            }
        ],
        "progress_topic": f"{name}.progress",
        "transactional_id_prefix": name,
        "signal_topic": None,
    }
    run_watcher(cfg, deleted_and_seen, "the table mirrored, then deleted")
    assert "tableDropped" not in _kinds(m.bootstrap, commits)


# --- the consumers' record rules, retries and saves ------------------------------------------------


@pytest.fixture(scope="module")
def forged_base(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A table mirrored by the real watcher: the base that forged records are written after."""
    from support.forge import mirror_base

    return mirror_base(kafka_bootstrap, "krs__cdf-table-with-dv", tmp_path_factory.mktemp("forged"))


def _consumer_file(ctx: Ctx, bootstrap: str, **consumer: Any) -> Path:
    """A configuration file with its ``kafka:`` section and these ``consumer:`` keys."""
    path = ctx.tmp / f"{ctx.unique('consumer')}.yaml"
    path.write_text(
        json.dumps({"kafka": {"bootstrap_servers": bootstrap}, "consumer": consumer})
    )  # JSON is YAML
    return path


@observes(
    "invalidate on_bad_record",
    "invalidate bad_record_topic",
    "ConsumerSection.consumer.bad_record_topic",
    kafka=True,
)
def _bad_records(ctx: Ctx) -> None:
    """A forged record after the good versions: stop (exit 2), skip, or copied to a topic."""
    from support.forge import action_rec, event, write_case
    from support.kafka import new_topic
    from support.records import read_topic

    base = ctx.fixture("forged_base")
    bootstrap = ctx.fixture("kafka_bootstrap")
    bad = action_rec(event(base, schemaVersion=999))
    topics = write_case(bootstrap, base, actions=[bad])
    good = len(base.versions)

    def invalidate(*extra: str) -> tuple[int, str, str]:
        argv = ["--bootstrap-servers", bootstrap, "--topic", topics.actions, "--once", "--exec", "true"]
        return ctx.cli("invalidate", *argv, "--group-id", ctx.unique("g"), *extra)

    code, out, err = invalidate()
    assert code == 2 and "schemaVersion 999" in err and len(out.splitlines()) == good, (code, err)
    code, out, err = invalidate("--on-bad-record", "skip")
    assert code == 0 and len(out.splitlines()) == good, err
    letters = new_topic(bootstrap, f"{topics.actions}.refused")
    code, out, err = invalidate("--on-bad-record", "dead-letter", "--bad-record-topic", letters)
    assert code == 0 and len(out.splitlines()) == good, err
    assert [r.value for r in read_topic(bootstrap, letters)] == [bad.value]
    # the file's key, with the file's on_bad_record
    from_file = new_topic(bootstrap, f"{topics.actions}.refused-by-file")
    config = _consumer_file(ctx, bootstrap, on_bad_record="dead-letter", bad_record_topic=from_file)
    out = ctx.ok("consume-snapshot", "--config", str(config), "--topic", topics.actions, "--once")
    assert len(out.splitlines()) == good
    assert [r.value for r in read_topic(bootstrap, from_file)] == [bad.value]


@observes("invalidate allow_table_location", "ConsumerSection.consumer.allow_table_locations", kafka=True)
def _allow_table_locations(ctx: Ctx) -> None:
    """Tables only under the locations allowed: the mirrored one is refused elsewhere, taken under
    its folder (by the flag, and by the file's key)."""
    m: Mirrored = ctx.fixture("mirrored")
    elsewhere = str(ctx.tmp / "elsewhere")
    invalidate = ["invalidate", *m.source("--once", "--exec", "true")]
    ctx.refused(
        *invalidate,
        "--group-id",
        ctx.unique("g"),
        "--allow-table-location",
        elsewhere,
        naming="--allow-table-location",
    )
    allowed = ctx.ok(
        *invalidate, "--group-id", ctx.unique("g"), "--allow-table-location", str(m.table.parent)
    )
    assert len(allowed.splitlines()) == 3
    for locations, lines in (([elsewhere], 0), ([str(m.table.parent)], 3)):
        config = _consumer_file(ctx, m.bootstrap, allow_table_locations=locations)
        code, out, err = ctx.cli("consume-snapshot", "--config", str(config), "--topic", m.actions, "--once")
        assert (code, len(out.splitlines())) == ((2, 0) if not lines else (0, lines)), err


@observes(
    "consume-snapshot allow_path_prefix",
    "invalidate allow_path_prefix",
    "ConsumerSection.consumer.allow_path_prefixes",
    kafka=True,
)
def _allow_path_prefixes(ctx: Ctx) -> None:
    """A version adding a file outside the table root (a shallow clone's source): refused, unless
    its folder is allowed (by the flag of each command, or the file's key)."""
    from support.forge import action_rec, add_action, event, write_case

    base = ctx.fixture("forged_base")
    bootstrap = ctx.fixture("kafka_bootstrap")
    outside = ctx.tmp / "source"
    outside.mkdir()
    clone = action_rec(event(base, action=add_action((outside / "part-0.parquet").as_uri())))
    topics = write_case(bootstrap, base, actions=[clone])
    source = ["--bootstrap-servers", bootstrap, "--topic", topics.actions, "--once"]
    for command, extra in CONSUMERS.items():
        code, out, err = ctx.cli(command, *source, *extra, "--group-id", ctx.unique("g"))
        assert code == 2 and "outside the table root" in err, (command, code, err)
        assert _versions(out) == base.versions, command
        allowed = ctx.ok(
            command, *source, *extra, "--group-id", ctx.unique("g"), "--allow-path-prefix", str(outside)
        )
        assert _versions(allowed) == [*base.versions, base.last_version + 1], command
    config = _consumer_file(ctx, bootstrap, allow_path_prefixes=[str(outside)])
    out = ctx.ok("consume-snapshot", "--config", str(config), "--topic", topics.actions, "--once")
    assert _versions(out) == [*base.versions, base.last_version + 1]


@observes("invalidate backoff", "invalidate max_backoff", kafka=True)
def _backoff(ctx: Ctx) -> None:
    """Each version accepted at its third attempt: the waits between are the backoff, doubling up to
    the longest one (0.2 then 0.3 s; the defaults would wait 0.5 then 1 s). Each wait is said in
    the warning of the failed attempt, and the waits are what the invalidator sleeps."""
    m: Mirrored = ctx.fixture("mirrored")
    caplog = ctx.fixture("caplog")
    third = "sh -c 'test \"$DELTAMIRROR_ATTEMPT\" -ge 3'"
    out = ctx.ok(
        "invalidate",
        *m.source("--once", "--exec", third, "--group-id", ctx.unique("g")),
        "--backoff",
        "0.2",
        "--max-backoff",
        "0.3",
    )
    assert [json.loads(line)["attempts"] for line in out.splitlines()] == [3, 3, 3]
    waits = [
        r.getMessage().split("again in ")[1].split(" s")[0]
        for r in caplog.records
        if "again in" in r.getMessage()
    ]
    assert waits == ["0.2", "0.3"] * 3, waits


@observes("invalidate timeout", kafka=True)
def _timeout(ctx: Ctx) -> None:
    """A command that takes a second: delivered within the default deadline (30 s), killed and
    failed past a deadline of 0.3 s (one attempt, no dead-letter topic: exit 1 naming the version)."""
    m: Mirrored = ctx.fixture("mirrored")
    slow = "sleep 1"
    argv = [*m.source("--once", "--exec", slow, "--max-attempts", "1")]
    assert len(ctx.ok("invalidate", *argv, "--group-id", ctx.unique("g")).splitlines()) == 3
    code, out, err = ctx.cli("invalidate", *argv, "--group-id", ctx.unique("g"), "--timeout", "0.3")
    assert code == 1 and out == "" and "version 0" in err, (code, err)


def _saved_while_running(command: str, argv: list[str], state: Path) -> int | None:
    """``deltamirror COMMAND ARGV`` (no --once) as a process: the version its state directory holds
    once it printed the three versions and saved (waited for up to 30 s, less than the default
    60 s interval), read while it still runs; then it is stopped."""
    import time

    proc = subprocess.Popen(
        [sys.executable, "-m", "deltamirror.cli.main", command, *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert all(proc.stdout.readline() for _ in range(3)), command
        deadline = time.monotonic() + 30
        saved = _saved_version(state)
        while saved != 2 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)  # polling a condition, with a bound
            saved = _saved_version(state)
        assert proc.poll() is None, "it stopped by itself"
        return saved
    finally:
        proc.send_signal(subprocess.signal.SIGTERM)  # type: ignore[attr-defined]
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@observes(
    *(f"{c} {d}" for c in CONSUMERS for d in ("checkpoint_interval_versions", "checkpoint_interval_s")),
    kafka=True,
)
def _checkpoint_intervals(ctx: Ctx) -> None:
    """A reader that keeps running saves its state on a count of versions, or a time after the
    first change: the state directory holds version 2 while it runs (by default it would after
    100 versions or 60 s, longer than the 30 s waited; the end's save is observed with state_dir)."""
    m: Mirrored = ctx.fixture("mirrored")
    for command, extra in CONSUMERS.items():
        for interval in (
            ["--checkpoint-interval-versions", "1"],
            ["--checkpoint-interval-versions", "0", "--checkpoint-interval-s", "0.2"],
        ):
            state = ctx.tmp / ctx.unique("state")
            argv = [*m.source(*extra, "--state-dir", str(state)), *interval]
            assert _saved_while_running(command, argv, state) == 2, (command, interval)


@observes("WatchConfig.heartbeat_interval_s", kafka=True)
def _heartbeat_interval(ctx: Ctx) -> None:
    """An idle table watched with a heartbeat interval: heartbeats come on its commits topic (the
    default is none at all, as the table mirrored without one shows)."""
    from support.records import run_watcher

    m: Mirrored = ctx.fixture("mirrored")
    assert "heartbeat" not in _kinds(m.bootstrap, m.commits)  # the default: none
    table = make_table(ctx.tmp / "t", 1)
    name = ctx.unique("dmidle")
    cfg = {
        "kafka": {"bootstrap_servers": m.bootstrap},
        "tables": [
            {"uri": str(table), "actions_topic": f"{name}.actions", "commits_topic": f"{name}.commits"}
        ],
        "progress_topic": f"{name}.progress",
        "transactional_id_prefix": name,
        "signal_topic": None,
        "heartbeat_interval_s": 0.3,
    }

    def kinds() -> list[str]:
        return _kinds(m.bootstrap, f"{name}.commits")

    run_watcher(cfg, lambda: kinds().count("heartbeat") >= 2, "two heartbeats of the idle table")
    assert kinds()[0] == "commit"  # the table's version first, then heartbeats while it is idle


@observes("WatchConfig.tables[].allowed_path_prefixes", kafka=True)
def _watch_allowed_path_prefixes(ctx: Ctx) -> None:
    """A table read from a V2 checkpoint one of whose sidecars lies outside its root (a shallow
    clone's source): the watcher refuses the sidecar (an error naming it, nothing published),
    unless its folder is allowed; then the snapshot is published."""
    from deltamirror.core.errors import DeltaMirrorError
    from deltamirror.producer import WatchConfig
    from deltamirror.producer.service import WatchService
    from support.records import run_watcher, wait_for

    bootstrap = ctx.fixture("kafka_bootstrap")
    outside = ctx.tmp / "outside"
    table = sidecar_outside(ctx.tmp / "t", outside)
    name = ctx.unique("dmclone")

    def cfg(**table_settings: Any) -> WatchConfig:
        return WatchConfig.model_validate(
            {
                "kafka": {"bootstrap_servers": bootstrap},
                "tables": [
                    {
                        "uri": str(table),
                        "actions_topic": f"{name}.actions",
                        "commits_topic": f"{name}.commits",
                        **table_settings,
                    }
                ],
                "progress_topic": f"{name}.progress",
                "transactional_id_prefix": name,
                "signal_topic": None,
            }
        )

    caplog = ctx.fixture("caplog")
    service = WatchService(cfg(), stop_budget_s=5.0)
    try:
        service.start()
        wait_for(lambda: "lies outside the table root" in caplog.text, "the sidecar refused", 60)
    except DeltaMirrorError as exc:  # refused at start
        assert "outside the table root" in str(exc), exc
    finally:
        service.request_stop()
        service.wait(30)
        service.close()
    assert "sidecar" in caplog.text
    assert not _kinds(bootstrap, f"{name}.commits")
    run_watcher(
        cfg(allowed_path_prefixes=[str(outside)]),
        lambda: "commit" in _kinds(bootstrap, f"{name}.commits"),
        "the snapshot of the clone published",
    )


# --- the watcher's table settings, on the session's broker -------------------------------------------


def _commits(bootstrap: str, topic: str) -> list[tuple[int, bool]]:
    from support.records import read_topic

    return [
        (r.json["version"], r.json["snapshot"])
        for r in read_topic(bootstrap, topic)
        if r.value and r.json.get("kind") == "commit"
    ]


@observes(
    "WatchConfig.tables[].uri",
    "WatchConfig.tables[].snapshot_mode",
    "WatchConfig.tables[].from_version",
    "WatchConfig.tables[].from_timestamp",
    "WatchConfig.tables[].actions_topic",
    "WatchConfig.tables[].commits_topic",
    "WatchConfig.tables[].topic_name",
    "WatchConfig.progress_topic",
    kafka=True,
)
def _watch_table_start(ctx: Ctx) -> None:
    """Versions 0-2: the snapshot mode and its start choose what is published, on the topics named."""
    from support.records import read_topic, run_watcher

    bootstrap = ctx.fixture("kafka_bootstrap")
    table = make_table(ctx.tmp / "t", 3)
    times = [h["timestamp"] for h in history(ctx, table)]

    def run(**table_settings: Any) -> tuple[str, str, str]:
        name = ctx.unique("dmstart")
        explicit = "topic_name" not in table_settings
        topics = {"actions_topic": f"{name}.actions", "commits_topic": f"{name}.commits"} if explicit else {}
        commits = f"{name}.commits" if explicit else f"deltamirror.{table_settings['topic_name']}.commits"
        cfg = {
            "kafka": {"bootstrap_servers": bootstrap},
            "tables": [{"uri": str(table), "poll_interval_s": 0.2, **topics, **table_settings}],
            "progress_topic": f"{name}.progress",
            "transactional_id_prefix": name,
            "signal_topic": None,
        }
        run_watcher(cfg, lambda: any(v == 2 for v, _ in _commits(bootstrap, commits)), f"{table_settings}")
        return (
            commits,
            f"{name}.actions" if explicit else commits.replace(".commits", ".actions"),
            f"{name}.progress",
        )

    commits, actions, progress = run()  # the default: a snapshot of the latest version
    assert _commits(bootstrap, commits) == [(2, True)]
    uris = {r.json.get("tableUri") for r in read_topic(bootstrap, actions) if r.value}
    assert uris == {table.as_uri()}, uris  # the table's location, as given
    assert read_topic(bootstrap, progress)  # the positions, on the progress topic given
    commits, _, _ = run(snapshot_mode="from-version", from_version=0)
    assert _commits(bootstrap, commits) == [(0, False), (1, False), (2, False)]
    commits, _, _ = run(snapshot_mode="from-version", from_version=1)
    assert _commits(bootstrap, commits) == [(1, False), (2, False)]
    commits, _, _ = run(snapshot_mode="from-timestamp", from_timestamp=times[1])
    assert _commits(bootstrap, commits) == [(1, False), (2, False)]
    named = ctx.unique("named")
    commits, actions, _ = run(topic_name=named)
    assert commits == f"deltamirror.{named}.commits" and _commits(bootstrap, commits) == [(2, True)]
    assert read_topic(bootstrap, actions)


# --- the registry's own checks --------------------------------------------------------------------

#: settings observed by a test elsewhere that runs what they need (a broker of its own, a secured
#: listener, a group of processes, a receiver): setting -> "path::test"
ELSEWHERE: dict[str, str] = {
    "ConsumerSection.consumer.on_bad_record": "tests/consumer/test_forged_records.py::test_the_consumer_section_of_the_config_file_is_read_and_checked",
    "consume-snapshot on_bad_record": "tests/consumer/test_forged_records.py::test_skip_passes_over_a_forged_record_between_good_versions",
    "consume-snapshot bad_record_topic": "tests/consumer/test_forged_records.py::test_dead_letter_copies_the_refused_record_with_where_and_why",
    "consume-snapshot allow_table_location": "tests/consumer/test_forged_records.py::test_a_table_location_outside_the_allowed_ones_is_refused",
    "invalidate webhook": "tests/cli/test_invalidate_cli.py::test_a_webhook_failing_twice_gets_every_version_in_order_and_a_rerun_nothing",
    "invalidate exec": "tests/cli/test_invalidate_cli.py::test_a_command_exiting_1_then_0_gets_each_version_on_stdin_in_order",
    "invalidate max_attempts": "tests/cli/test_invalidate_cli.py::test_given_up_without_a_dead_letter_topic_exits_1_and_a_restart_resumes_at_that_version",
    "invalidate dead_letter_topic": "tests/cli/test_invalidate_cli.py::test_given_up_with_a_dead_letter_topic_each_version_is_a_record_there_and_secrets_stay_hidden",
    "invalidate header": "tests/cli/test_invalidate_cli.py::test_given_up_with_a_dead_letter_topic_each_version_is_a_record_there_and_secrets_stay_hidden",
    "local kafka start data_dir": "tests/devkafka/test_local_kafka.py::test_local_kafka_lifecycle_through_the_cli",
    "local kafka start port": "tests/devkafka/test_local_kafka.py::test_local_kafka_lifecycle_through_the_cli",
    "local kafka abort-hanging data_dir": "tests/devkafka/test_local_kafka.py::test_local_kafka_lifecycle_through_the_cli",
    "local kafka abort-hanging port": "tests/devkafka/test_local_kafka.py::test_local_kafka_lifecycle_through_the_cli",
    "local kafka abort-hanging dry_run": "tests/devkafka/test_local_kafka_tools.py::test_abort_hanging_dry_run_and_max_transaction_timeout_on_transactions_the_coordinator_lost",
    "local kafka abort-hanging max_transaction_timeout": "tests/devkafka/test_local_kafka_tools.py::test_abort_hanging_dry_run_and_max_transaction_timeout_on_transactions_the_coordinator_lost",
    "local kafka status data_dir": "tests/devkafka/test_local_kafka.py::test_local_kafka_lifecycle_through_the_cli",
    "local kafka status port": "tests/devkafka/test_local_kafka.py::test_local_kafka_lifecycle_through_the_cli",
    "local kafka stop data_dir": "tests/devkafka/test_local_kafka.py::test_local_kafka_lifecycle_through_the_cli",
    "local kafka stop port": "tests/devkafka/test_local_kafka.py::test_local_kafka_lifecycle_through_the_cli",
    "local registry start data_dir": "tests/devkafka/test_local_registry.py::test_the_cli_starts_reports_and_stops_a_registry",
    "local registry start port": "tests/devkafka/test_local_registry.py::test_the_cli_starts_reports_and_stops_a_registry",
    "local registry status data_dir": "tests/devkafka/test_local_registry.py::test_the_cli_starts_reports_and_stops_a_registry",
    "local registry status port": "tests/devkafka/test_local_registry.py::test_the_cli_starts_reports_and_stops_a_registry",
    "local registry stop data_dir": "tests/devkafka/test_local_registry.py::test_the_cli_starts_reports_and_stops_a_registry",
    "local registry stop port": "tests/devkafka/test_local_registry.py::test_the_cli_starts_reports_and_stops_a_registry",
    "local registry start user": "tests/producer/test_avro_registry_auth.py::test_the_registry_credentials_are_checked_used_and_a_refusal_named",
    "local registry start password_file": "tests/producer/test_avro_registry_auth.py::test_the_registry_credentials_are_checked_used_and_a_refusal_named",
    "WatchConfig.tables[].row_changes.registry.username": "tests/producer/test_avro_registry_auth.py::test_the_registry_credentials_are_checked_used_and_a_refusal_named",
    "WatchConfig.tables[].row_changes.registry.password": "tests/producer/test_avro_registry_auth.py::test_the_registry_credentials_are_checked_used_and_a_refusal_named",
    "local kafka start security": "tests/producer/test_secure_kafka.py::test_start_prints_the_client_settings_but_not_the_password",
    "local kafka start secure_port": "tests/devkafka/test_local_kafka_security.py::test_bad_security_settings_are_refused",
    "demo dir": "tests/cli/test_demo_output.py::test_the_demo_ends_with_commands_that_run_on_its_table",
    "demo port": "tests/cli/test_consumer_flags.py::test_demo_flags_for_its_own_broker_are_refused_when_it_uses_another",
    "demo keep_broker": "tests/cli/test_consumer_flags.py::test_demo_flags_for_its_own_broker_are_refused_when_it_uses_another",
    "signal snapshot signal_topic": "tests/producer/test_signal_cli.py::test_a_signal_topic_flag_other_than_the_files_is_refused",
    "signal snapshot config": "tests/producer/test_signal_cli.py::test_the_signal_goes_to_the_signal_topic_of_the_file",
    "signal snapshot table": "tests/producer/test_signal_cli.py::test_a_table_no_watcher_of_the_file_runs_is_refused",
    "signal snapshot timeout": "tests/producer/test_signal_cli.py::test_a_dead_broker_is_one_line_with_its_reason_within_the_timeout",
    "signal snapshot wait": "tests/producer/test_signal_cli.py::test_wait_returns_once_the_watcher_running_the_table_took_the_signal",
    "signal net-changes signal_topic": "tests/producer/test_net_changes_signal.py::test_signal_net_changes_publishes_one_marked_block_equal_to_the_net_changes_then_tails_on",
    "signal net-changes table": "tests/producer/test_net_changes_signal.py::test_signal_net_changes_publishes_one_marked_block_equal_to_the_net_changes_then_tails_on",
    "signal net-changes timeout": "tests/producer/test_net_changes_signal.py::test_signal_net_changes_publishes_one_marked_block_equal_to_the_net_changes_then_tails_on",
    "signal net-changes wait": "tests/producer/test_net_changes_signal.py::test_signal_net_changes_publishes_one_marked_block_equal_to_the_net_changes_then_tails_on",
    "signal net-changes bootstrap_servers": "tests/producer/test_net_changes_signal.py::test_signal_net_changes_publishes_one_marked_block_equal_to_the_net_changes_then_tails_on",
    "signal net-changes from_version": "tests/producer/test_net_changes_signal.py::test_signal_net_changes_publishes_one_marked_block_equal_to_the_net_changes_then_tails_on",
    "signal net-changes config": "tests/producer/test_signal_cli.py::test_net_changes_takes_its_config_file_and_refuses_a_version_that_is_not_one",
    "signal snapshot bootstrap_servers": "tests/producer/test_signals.py::test_signal_snapshot_republishes_the_table_between_two_versions",
    "WatchConfig.signal_topic": "tests/producer/test_signals.py::test_signal_snapshot_republishes_the_table_between_two_versions",
    "WatchConfig.kafka.security_protocol": "tests/producer/test_secure_kafka.py::test_watch_and_consume_snapshot_over_sasl_ssl_with_one_config_file",
    "WatchConfig.kafka.ssl_ca_location": "tests/producer/test_secure_kafka.py::test_a_client_without_the_ca_is_refused_as_a_tls_failure",
    "KafkaSection.kafka.security_protocol": "tests/producer/test_secure_kafka.py::test_watch_and_consume_snapshot_over_sasl_ssl_with_one_config_file",
    "KafkaSection.kafka.ssl_ca_location": "tests/producer/test_secure_kafka.py::test_a_client_without_the_ca_is_refused_as_a_tls_failure",
    "KafkaSection.kafka.bootstrap_servers": "tests/cli/test_kafka_config.py::test_bootstrap_servers_flag_replaces_the_files_list",
    "WatchConfig.kafka.bootstrap_servers": "tests/cli/test_kafka_config.py::test_bootstrap_servers_flag_replaces_the_files_list",
    "WatchConfig.group.name": "tests/producer/test_group.py::test_a_group_moves_tables_exactly_once_through_kill_term_pause_and_join",
    "WatchConfig.group.shards": "tests/producer/test_group.py::test_an_assignment_topic_with_another_shard_count_is_a_config_error",
    "WatchConfig.tables[].row_changes.enabled": "tests/producer/test_row_events.py::test_row_changes_flag_turns_them_on_for_every_table_keeping_their_own_settings",
    "WatchConfig.tables[].row_changes.format": "tests/producer/test_row_changes_kafka.py::test_without_a_key_updates_are_a_delete_and_an_insert_and_the_key_is_the_row",
    "WatchConfig.tables[].row_changes.tombstones": "tests/producer/test_row_changes_kafka.py::test_without_a_key_updates_are_a_delete_and_an_insert_and_the_key_is_the_row",
    "WatchConfig.tables[].row_changes.key_columns": "tests/producer/test_row_changes_kafka.py::test_records_equal_delta_spark_change_feed_keys_and_partitions",
    "WatchConfig.tables[].row_changes.columns": "tests/producer/test_row_transform.py::test_a_setting_the_table_cannot_take_stops_it_naming_the_setting",
    "WatchConfig.tables[].row_changes.mask": "tests/producer/test_row_transform.py::test_a_setting_the_table_cannot_take_stops_it_naming_the_setting",
    "WatchConfig.tables[].row_changes.where[].column": "tests/producer/test_row_transform.py::test_a_setting_the_table_cannot_take_stops_it_naming_the_setting",
    "WatchConfig.tables[].row_changes.where[].op": "tests/producer/test_row_transform.py::test_a_setting_the_table_cannot_take_stops_it_naming_the_setting",
    "WatchConfig.tables[].row_changes.where[].value": "tests/producer/test_row_transform.py::test_a_setting_the_table_cannot_take_stops_it_naming_the_setting",
    "WatchConfig.tables[].row_changes.mask_key": "tests/producer/test_row_transform.py::test_an_hmac_is_keyed_equal_values_stay_equal_and_nulls_stay_null",
    "WatchConfig.tables[].drop_file_stats": "tests/producer/test_file_stats.py::test_drop_file_stats_publishes_every_file_without_its_stats",
    "WatchConfig.tables[].row_changes.registry.url": "tests/producer/test_avro_kafka.py::test_watch_publishes_avro_row_changes_equal_to_the_change_feed",
    "WatchConfig.tables[].row_changes.registry.subject_name_strategy": "tests/mirror/test_avro_registry.py::test_records_are_the_confluent_wire_format_under_each_subject_strategy_and_read_back",
    "WatchConfig.tables[].row_changes.registry.auto_register": "tests/mirror/test_avro_registry.py::test_records_are_the_confluent_wire_format_under_each_subject_strategy_and_read_back",
    "WatchConfig.tables[].row_changes.net_catch_up": "tests/producer/test_net_catch_up.py::test_a_net_catch_up_is_one_transaction_equal_to_the_state_difference_then_tailing_goes_on",
    "WatchConfig.tables[].row_changes.pairing_memory_mb": "tests/producer/test_row_changes_kafka.py::test_kill_9_while_updates_are_paired_through_spill_buckets_leaves_each_row_once",
    "WatchConfig.tables[].changes_topic": "tests/producer/test_row_changes_kafka.py::test_records_equal_delta_spark_change_feed_keys_and_partitions",
    "WatchConfig.tables[].transaction_topic": "tests/producer/test_row_changes_kafka.py::test_records_equal_delta_spark_change_feed_keys_and_partitions",
    "WatchConfig.discover[].uri": "tests/producer/test_discovery_settings.py::test_discover_with_row_changes_publishes_the_rows_of_the_tables_found",
    "WatchConfig.tables[].wait_for_table": "tests/cli/test_watch_cmd.py::test_wait_for_table_waits_for_a_table_that_does_not_exist",
    "WatchConfig.discover[].include": "tests/producer/test_discovery.py::test_include_and_exclude_globs",
    "WatchConfig.discover[].exclude": "tests/producer/test_discovery.py::test_include_and_exclude_globs",
    "WatchConfig.discover[].max_depth": "tests/producer/test_discovery.py::test_finds_tables_in_a_local_tree",
    "WatchConfig.txn_max_records": "tests/producer/test_setting_effects.py::test_each_transaction_bound_cuts_a_large_version_into_more_transactions",
    "WatchConfig.txn_max_bytes": "tests/producer/test_setting_effects.py::test_each_transaction_bound_cuts_a_large_version_into_more_transactions",
    "WatchConfig.txn_max_ms": "tests/producer/test_setting_effects.py::test_each_transaction_bound_cuts_a_large_version_into_more_transactions",
    "WatchConfig.max_record_bytes": "tests/producer/test_kafka_watch.py::test_a_record_over_the_size_limit_is_split_never_dropped",
    "WatchConfig.oversize_policy": "tests/producer/test_setting_effects.py::test_oversize_policy_fail_stops_the_table_naming_the_version_where_split_publishes_fragments",
    "WatchConfig.status_interval_s": "tests/producer/test_setting_effects.py::test_status_interval_s_is_how_often_the_status_line_comes",
    "WatchConfig.workers": "tests/producer/test_pool.py::test_many_tables_run_on_the_pool_not_on_a_thread_each",
    "WatchConfig.metrics_port": "tests/producer/test_setting_effects.py::test_metrics_port_and_host_serve_metrics_there_and_only_there",
    "WatchConfig.metrics_host": "tests/producer/test_setting_effects.py::test_metrics_port_and_host_serve_metrics_there_and_only_there",
    "WatchConfig.broker_timeout_s": "tests/producer/test_setting_effects.py::test_broker_timeout_s_is_how_long_a_silent_broker_takes_to_make_healthz_unhealthy",
    "WatchConfig.transactional_id_prefix": "tests/producer/test_setting_effects.py::test_transactional_id_prefix_names_the_producer_that_wrote_the_progress",
    "WatchConfig.kafka.extra": "tests/producer/test_setting_effects.py::test_kafka_extra_and_the_session_timeout_reach_the_group_members_clients",
    "KafkaSection.kafka.extra": "tests/producer/test_setting_effects.py::test_a_property_librdkafka_refuses_in_kafka_extra_is_refused_at_start_naming_it",
    "WatchConfig.group.session_timeout_ms": "tests/producer/test_setting_effects.py::test_kafka_extra_and_the_session_timeout_reach_the_group_members_clients",
    "WatchConfig.use_notifications": "tests/producer/test_setting_effects.py::test_use_notifications_wakes_a_table_whose_poll_is_an_hour_away",
    "WatchConfig.tables[].poll_interval_s": "tests/producer/test_setting_effects.py::test_poll_interval_s_is_how_long_an_idle_table_waits_between_looks",
    "WatchConfig.discover[].interval_s": "tests/producer/test_setting_effects.py::test_discover_interval_s_is_how_soon_a_table_created_under_the_prefix_is_found",
    "WatchConfig.tables[].storage_options": "tests/producer/test_setting_effects.py::test_storage_options_are_how_the_watcher_reaches_a_table_on_an_object_store",
    "WatchConfig.discover[].name": "tests/producer/test_discovery_settings.py::test_discover_with_row_changes_publishes_the_rows_of_the_tables_found",
    "WatchConfig.discover[].topics": "tests/producer/test_shared_topics.py::test_shared_topics_are_named_by_the_prefix_and_refused_with_row_changes",
    "WatchConfig.kafka.sasl_mechanism": "tests/producer/test_secure_settings.py::test_each_sasl_setting_is_the_login_the_broker_checks",
    "WatchConfig.kafka.sasl_username": "tests/producer/test_secure_settings.py::test_each_sasl_setting_is_the_login_the_broker_checks",
    "WatchConfig.kafka.sasl_password": "tests/producer/test_secure_settings.py::test_each_sasl_setting_is_the_login_the_broker_checks",
    "WatchConfig.kafka.ssl_certificate_location": "tests/producer/test_secure_settings.py::test_each_client_certificate_setting_is_loaded_by_the_client",
    "WatchConfig.kafka.ssl_key_location": "tests/producer/test_secure_settings.py::test_each_client_certificate_setting_is_loaded_by_the_client",
    "WatchConfig.kafka.ssl_key_password": "tests/producer/test_secure_settings.py::test_each_client_certificate_setting_is_loaded_by_the_client",
    "KafkaSection.kafka.sasl_mechanism": "tests/producer/test_secure_settings.py::test_each_sasl_setting_is_the_login_the_broker_checks",
    "KafkaSection.kafka.sasl_username": "tests/producer/test_secure_settings.py::test_each_sasl_setting_is_the_login_the_broker_checks",
    "KafkaSection.kafka.sasl_password": "tests/producer/test_secure_settings.py::test_each_sasl_setting_is_the_login_the_broker_checks",
    "KafkaSection.kafka.ssl_certificate_location": "tests/producer/test_secure_settings.py::test_each_client_certificate_setting_is_loaded_by_the_client",
    "KafkaSection.kafka.ssl_key_location": "tests/producer/test_secure_settings.py::test_each_client_certificate_setting_is_loaded_by_the_client",
    "KafkaSection.kafka.ssl_key_password": "tests/producer/test_secure_settings.py::test_each_client_certificate_setting_is_loaded_by_the_client",
}


#: the settings that have no observer yet, each a debt (not a pass): a setting added to the code fails
#: ``test_every_setting_has_an_observer`` unless it has an observer; one of these that gets one must be
#: struck from here (the same test fails until it is)
NOT_YET_OBSERVED: dict[str, str] = {}


def _inherited(key: str) -> str | None:
    """The table setting a discover prefix's ``key`` is handed down as, if it is one: a table found
    takes it as a configured table does (``test_every_setting_of_a_table_is_inherited_from_its_prefix_or_refused_on_one``
    in tests/producer/test_config.py), so it is observed where the table's is."""
    from deltamirror.producer.discovery.scan import INHERITED

    prefix = "WatchConfig.discover[]."
    if not key.startswith(prefix) or key.removeprefix(prefix).split(".")[0] not in INHERITED:
        return None
    return "WatchConfig.tables[]." + key.removeprefix(prefix)


def _observed(key: str) -> bool:
    table = _inherited(key)
    return key in OBSERVERS or key in ELSEWHERE or (table is not None and _observed(table))


def test_every_setting_has_an_observer() -> None:
    """A new setting fails here until it has an observer; one of the settings not yet observed
    fails here once it has one (strike it from the list)."""
    enumerated = settings()
    assert len(enumerated) == len(set(enumerated))
    missing = {key for key in enumerated if not _observed(key)}
    new = sorted(missing - set(NOT_YET_OBSERVED))
    assert not new, f"{len(new)} settings without an observer (add one): {new}"
    struck = sorted(set(NOT_YET_OBSERVED) - missing)
    assert not struck, f"observed now, strike them from NOT_YET_OBSERVED: {struck}"
    stale = sorted((set(OBSERVERS) | set(ELSEWHERE)) - set(enumerated))
    assert not stale, f"observers of settings that do not exist: {stale}"
    assert not set(OBSERVERS) & set(ELSEWHERE)


def test_every_watch_flag_is_a_field_observed_on_its_own() -> None:
    from support.settings_walk import flags

    watch = {f.split(" ", 1)[1] for f in flags() if f.startswith("watch ")}
    # config (a file), no_progress (the terminal) and storage_options (refused locally, observed
    # on S3) are observed directly above
    assert watch == set(FLAG_FIELDS) | {"config", "no_progress", "storage_options"}
    for keys in FLAG_FIELDS.values():
        for key in keys:
            assert key in OBSERVERS or key in ELSEWHERE or key in NOT_YET_OBSERVED, key


def _test_source(node_id: str) -> str:
    path, name = node_id.split("::")
    tree = ast.parse((ROOT / path).read_text())
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return ast.unparse(node)
    raise AssertionError(f"{node_id} does not exist")


def test_settings_observed_elsewhere_are_observed_there() -> None:
    silent = []
    for key, node_id in ELSEWHERE.items():
        source = _test_source(node_id)
        name = (
            key.rsplit(".", 1)[-1].removesuffix("[]")
            if "Config." in key or "Section." in key
            else key.split()[-1]
        )
        spelled = {name, name.replace("_", "-"), "--" + name.replace("_", "-")}
        if not any(s in source for s in spelled):
            silent.append(f"{node_id} does not speak of {key}")
    assert not silent, "\n".join(silent)


def _params() -> Iterator[Any]:
    seen: set[int] = set()
    for observer in OBSERVERS.values():
        if id(observer) in seen:
            continue
        seen.add(id(observer))
        yield pytest.param(observer, id=observer.fn.__name__.strip("_"), marks=observer.marks)


@pytest.mark.parametrize("observer", list(_params()))
def test_the_setting_is_observed(
    observer: Observer, request: pytest.FixtureRequest, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    observer.fn(Ctx(request, tmp_path, capsys))
