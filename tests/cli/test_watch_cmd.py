"""``deltamirror watch``: the configuration its flags (alone or over a file) hand to the service."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from deltamirror.cli.main import main
from deltamirror.producer import WatchConfig, service


@pytest.fixture
def handed(monkeypatch: pytest.MonkeyPatch) -> list[WatchConfig]:
    """The configurations ``watch`` passes to ``run_watch`` (which is not started)."""
    seen: list[WatchConfig] = []

    def fake_run_watch(cfg: WatchConfig) -> int:
        seen.append(cfg)
        return 0

    monkeypatch.setattr(service, "run_watch", fake_run_watch)
    return seen


def watch(*argv: str) -> int:
    return main(["watch", *argv])


def table_starts(cfg: WatchConfig) -> list[tuple[str, str, int | None, str | None]]:
    return [(Path(t.uri).name, t.snapshot_mode, t.from_version, t.from_timestamp) for t in cfg.tables]


def test_flags_alone_default_to_an_initial_snapshot(tmp_path: Path, handed: list[WatchConfig]) -> None:
    assert watch("--bootstrap-servers", "k:9092", str(tmp_path / "a"), str(tmp_path / "b")) == 0
    (cfg,) = handed
    assert cfg.kafka.bootstrap_servers == "k:9092"
    assert table_starts(cfg) == [("a", "initial", None, None), ("b", "initial", None, None)]
    assert [t.poll_interval_s for t in cfg.tables] == [
        None,
        None,
    ]  # not set: 1 s, or 30 s watched by notifications
    assert cfg.metrics_port is None


@pytest.mark.parametrize(
    ("flags", "start"),
    [
        (["--from-version", "7"], ("a", "from-version", 7, None)),
        (["--from-timestamp", "2026-01-01T00:00:00Z"], ("a", "from-timestamp", None, "2026-01-01T00:00:00Z")),
        (["--snapshot-mode", "latest"], ("a", "latest", None, None)),
        (["--snapshot-mode", "from-version", "--from-version", "0"], ("a", "from-version", 0, None)),
    ],
)
def test_flags_alone_start_where_they_say(
    tmp_path: Path, handed: list[WatchConfig], flags: list[str], start: tuple[Any, ...]
) -> None:
    assert watch("--bootstrap-servers", "k:9092", str(tmp_path / "a"), *flags) == 0
    assert table_starts(handed[0]) == [start]


def test_flags_alone_set_every_option(tmp_path: Path, handed: list[WatchConfig]) -> None:
    argv = [
        "--bootstrap-servers",
        "k1:9092,k2:9092",
        "s3://bucket/a",  # storage options are for object stores
        "--poll-interval",
        "0.5",
        "--progress-topic",
        "my-progress",
        "--transactional-id-prefix",
        "tx-",
        "--heartbeat-interval",
        "30",
        "--metrics-port",
        "9100",
        "--metrics-host",
        "0.0.0.0",
        "-S",
        "region=eu-west-1",
        "-S",
        "anon=true",
    ]
    assert watch(*argv) == 0
    (cfg,) = handed
    (table,) = cfg.tables
    assert cfg.kafka.bootstrap_servers == "k1:9092,k2:9092"
    assert (cfg.progress_topic, cfg.transactional_id_prefix, cfg.heartbeat_interval_s) == (
        "my-progress",
        "tx-",
        30,
    )
    assert (cfg.metrics_host, cfg.metrics_port) == ("0.0.0.0", 9100)
    assert table.poll_interval_s == 0.5
    assert set(table.storage_options_plain()) == {"region", "anon"}


def test_flags_alone_need_a_broker_and_a_table(
    tmp_path: Path, handed: list[WatchConfig], capsys: pytest.CaptureFixture[str]
) -> None:
    assert watch(str(tmp_path / "a")) != 0
    assert "--bootstrap-servers is required" in capsys.readouterr().err
    assert watch("--bootstrap-servers", "k:9092") != 0
    assert "no table to watch" in capsys.readouterr().err
    assert handed == []


def write_config(tmp_path: Path) -> Path:
    path = tmp_path / "watch.yaml"
    path.write_text(
        "kafka:\n"
        "  bootstrap_servers: file:9092\n"
        "progress_topic: file-progress\n"
        "tables:\n"
        "  - uri: s3://bucket/a\n"  # storage options are for object stores
        "    snapshot_mode: latest\n"
        "    poll_interval_s: 3\n"
        "    storage_options: {region: from-file, endpoint: http://x}\n"
        "  - uri: s3://bucket/b\n"
        "    snapshot_mode: from-version\n"
        "    from_version: 4\n"
    )
    return path


def test_a_config_file_alone_is_taken_as_written(tmp_path: Path, handed: list[WatchConfig]) -> None:
    assert watch("--config", str(write_config(tmp_path))) == 0
    (cfg,) = handed
    assert cfg.kafka.bootstrap_servers == "file:9092" and cfg.progress_topic == "file-progress"
    assert table_starts(cfg) == [("a", "latest", None, None), ("b", "from-version", 4, None)]
    assert [t.poll_interval_s for t in cfg.tables] == [3, None]


def test_flags_override_the_config_file(tmp_path: Path, handed: list[WatchConfig]) -> None:
    argv = [
        "--config",
        str(write_config(tmp_path)),
        "s3://bucket/a",  # already in the file: keeps its settings
        "s3://bucket/c",
        "--bootstrap-servers",
        "flag:9092",
        "--from-timestamp",
        "1700000000000",
        "--poll-interval",
        "0.25",
        "-S",
        "region=from-flag",
        "--metrics-port",
        "9200",
    ]
    assert watch(*argv) == 0
    (cfg,) = handed
    assert cfg.kafka.bootstrap_servers == "flag:9092" and cfg.progress_topic == "file-progress"
    assert table_starts(cfg) == [
        ("a", "from-timestamp", None, "1700000000000"),
        ("b", "from-timestamp", None, "1700000000000"),
        ("c", "from-timestamp", None, "1700000000000"),
    ]
    assert [t.poll_interval_s for t in cfg.tables] == [0.25, 0.25, 0.25]
    assert cfg.tables[0].storage_options_plain() == {"region": "from-flag", "endpoint": "http://x"}
    assert cfg.metrics_port == 9200


def test_watch_help_names_every_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        watch("--help")
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    assert "Flags override the configuration file" in text
    for flag in (
        "--bootstrap-servers",
        "--config",
        "--snapshot-mode",
        "--from-version",
        "--from-timestamp",
        "--poll-interval",
        "--progress-topic",
        "--transactional-id-prefix",
        "--heartbeat-interval",
        "--metrics-port",
        "--metrics-host",
        "--storage-option",
    ):
        assert flag in text


def test_every_watch_flag_names_a_setting_of_the_model() -> None:
    """The flag table and the model cannot drift apart: each flag is an override, each choice a mode."""
    from typing import get_args

    from deltamirror.cli.producer_cmds import CONFIG, SNAPSHOT_MODES, WATCH_FLAGS
    from deltamirror.producer.settings import OVERRIDES, SnapshotMode

    settings = [flag.setting for flag in WATCH_FLAGS if flag.setting != CONFIG]
    assert len(settings) == len(set(settings))
    assert set(settings) <= OVERRIDES
    assert get_args(SnapshotMode) == SNAPSHOT_MODES


def test_a_flag_given_as_an_empty_list_leaves_the_file(tmp_path: Path, handed: list[WatchConfig]) -> None:
    """No TABLE and no -S: the file's tables and storage options, untouched."""
    assert watch("--config", str(write_config(tmp_path)), "--progress-topic", "flag-progress") == 0
    (cfg,) = handed
    assert [Path(t.uri).name for t in cfg.tables] == ["a", "b"]
    assert cfg.tables[0].storage_options_plain() == {"region": "from-file", "endpoint": "http://x"}
    assert cfg.progress_topic == "flag-progress"


# --- discovery: every per-table setting reaches the discovered tables, or is refused by name ---------


def discovered(cfg: WatchConfig, relative: str = "t") -> Any:
    """The settings a table found under the first prefix is mirrored with."""
    from deltamirror.producer.discovery.scan import DiscoveredTable, discovered_config

    prefix = cfg.discover[0]
    return discovered_config(
        DiscoveredTable(f"{prefix.uri.rstrip('/')}/{relative}", relative, relative), prefix
    )


def test_discover_with_row_changes_publishes_the_discovered_tables_rows(
    tmp_path: Path, handed: list[WatchConfig]
) -> None:
    assert watch("--bootstrap-servers", "k:9092", "--discover", str(tmp_path), "--row-changes") == 0
    (cfg,) = handed
    assert discovered(cfg).row_changes_on


def test_discover_takes_every_flag_that_applies_to_each_table(
    tmp_path: Path, handed: list[WatchConfig]
) -> None:
    argv = [
        "--bootstrap-servers",
        "k:9092",
        "--discover",
        "s3://lake/",
        "--row-changes",
        "--poll-interval",
        "0.5",
    ]
    argv += ["-S", "region=x", "--from-timestamp", "2026-01-01T00:00:00Z"]
    assert watch(*argv) == 0
    table = discovered(handed[0])
    assert table.row_changes_on and table.poll_interval_s == 0.5
    assert table.storage_options_plain() == {"region": "x"}
    assert (table.snapshot_mode, table.from_timestamp) == ("from-timestamp", "2026-01-01T00:00:00Z")


@pytest.mark.parametrize(
    "flags",
    [["--from-version", "3"], ["--snapshot-mode", "from-version", "--from-version", "3"]],
)
def test_discover_with_from_version_is_refused_naming_both(
    tmp_path: Path, handed: list[WatchConfig], capsys: pytest.CaptureFixture[str], flags: list[str]
) -> None:
    assert watch("--bootstrap-servers", "k:9092", "--discover", str(tmp_path), *flags) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert "--from-version" in err and "--discover" in err
    assert handed == []


def test_a_config_file_without_kafka_takes_the_broker_from_the_flag(
    tmp_path: Path, handed: list[WatchConfig]
) -> None:
    """File and flags are merged first, then validated once: the file need not be whole alone."""
    path = tmp_path / "watch.yaml"
    path.write_text(f"progress_topic: file-progress\ntables:\n  - uri: {tmp_path / 'a'}\n")
    assert watch("--config", str(path), "--bootstrap-servers", "flag:9092") == 0
    (cfg,) = handed
    assert (cfg.kafka.bootstrap_servers, cfg.progress_topic) == ("flag:9092", "file-progress")


def test_a_config_file_without_tables_takes_them_from_the_command_line(
    tmp_path: Path, handed: list[WatchConfig]
) -> None:
    path = tmp_path / "watch.toml"
    path.write_text('[kafka]\nbootstrap_servers = "file:9092"\n')
    assert watch("--config", str(path), str(tmp_path / "a")) == 0
    assert [Path(t.uri).name for t in handed[0].tables] == ["a"]
    path.write_text('[kafka]\nbootstrap_servers = "file:9092"\n\n[[discover]]\nuri = "/lake"\n')
    assert watch("--config", str(path), "--row-changes") == 0
    assert discovered(handed[1]).row_changes_on


def test_a_config_file_still_says_what_is_wrong_in_it(
    tmp_path: Path, handed: list[WatchConfig], capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "watch.yaml"
    path.write_text(f"progress_topic: 7 7\ntables: [{tmp_path / 'a'}]\nsnapshotmode: latest\n")
    assert watch("--config", str(path), "--bootstrap-servers", "flag:9092") == 2
    err = capsys.readouterr().err
    assert str(path) in err and "snapshotmode: unknown key" in err
    assert watch("--config", str(path)) == 2
    assert "kafka: required key is missing" in capsys.readouterr().err


# --- a location that holds no table -------------------------------------------------------------------


def test_a_table_that_does_not_exist_is_refused_at_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Refused in one line before any broker is asked (the broker here answers nothing)."""
    missing = tmp_path / "no-such-table"
    assert watch("--bootstrap-servers", "127.0.0.1:1", str(missing)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"no Delta table at file://{missing}" in err
    assert "--wait-for-table" in err


def test_wait_for_table_waits_for_a_table_that_does_not_exist(
    tmp_path: Path, handed: list[WatchConfig], caplog: pytest.LogCaptureFixture
) -> None:
    from deltamirror.producer.discovery.table_check import check_tables_exist

    missing = tmp_path / "later"
    assert watch("--bootstrap-servers", "k:9092", str(missing), "--wait-for-table") == 0
    (cfg,) = handed
    assert cfg.tables[0].wait_for_table
    with caplog.at_level("INFO", logger="deltamirror.watch"):
        check_tables_exist(list(cfg.tables))  # not refused: said once
    assert [r.getMessage() for r in caplog.records] == ["waiting for the table to be created"]


def test_a_library_caller_gets_the_same_refusal_from_watch_service_start(tmp_path: Path) -> None:
    """``WatchService(cfg).start()`` refuses what ``watch`` refuses at start (it once went on and
    retried the table forever): a library caller is not given less than the command."""
    from deltamirror.core.errors import ConfigError
    from deltamirror.producer.service import WatchService

    missing = tmp_path / "no-such-table"
    cfg = WatchConfig.model_validate(
        {"kafka": {"bootstrap_servers": "127.0.0.1:1"}, "tables": [str(missing)]}
    )
    service = WatchService(cfg)
    try:
        with pytest.raises(ConfigError, match=f"no Delta table at file://{missing}"):
            service.start()
    finally:
        service.close()


def test_a_row_filter_naming_a_column_the_table_lacks_is_refused_at_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Refused in one line naming the setting before any broker is asked (the broker here answers
    nothing), from the table's schema at its latest version."""
    table = Path(__file__).resolve().parents[1] / "data" / "tables" / "krs__cdf-table"
    config = tmp_path / "watch.yaml"
    config.write_text(
        "kafka: {bootstrap_servers: '127.0.0.1:1'}\n"
        f"tables:\n  - uri: '{table}'\n"
        "    row_changes: {where: [{column: nope, op: '=', value: 1}]}\n"
    )
    assert watch("--config", str(config)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "tables[0].row_changes.where names 'nope'" in err, err
    config.write_text(
        config.read_text().replace("where: [{column: nope, op: '=', value: 1}]", "key_columns: [nope]")
    )
    assert watch("--config", str(config)) == 2
    assert "tables[0].row_changes.key_columns names 'nope'" in capsys.readouterr().err


def test_net_catch_up_from_the_flag_or_the_file_reaches_each_table(
    tmp_path: Path, handed: list[WatchConfig]
) -> None:
    flags = ["--bootstrap-servers", "k:9092", str(tmp_path / "a"), "--from-version", "3"]
    assert watch(*flags, "--row-changes", "--net-catch-up") == 0
    config = tmp_path / "w.yaml"
    config.write_text(
        "kafka: {bootstrap_servers: 'k:9092'}\ntables:\n  - uri: " + str(tmp_path / "b") + "\n"
        "    snapshot_mode: from-timestamp\n    from_timestamp: '2026-01-01T00:00:00Z'\n"
        "    row_changes: {key_columns: [id], net_catch_up: true}\n"
    )
    assert watch("--config", str(config)) == 0
    assert watch("--config", str(config), "--row-changes") == 0  # the file's key stays
    rows = [t.row_changes for cfg in handed for t in cfg.tables]
    assert [(r.net_catch_up, r.key_columns) for r in rows if r is not None] == [
        (True, []),
        (True, ["id"]),
        (True, ["id"]),
    ]


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--from-version", "3", "--net-catch-up"], "--net-catch-up"),  # no row changes to net
        (["--row-changes", "--net-catch-up"], "net_catch_up"),  # initial: no range of versions
        (["--row-changes", "--net-catch-up", "--snapshot-mode", "latest"], "net_catch_up"),
        (["--row-changes", "--net-catch-up", "--snapshot-mode", "when-needed"], "net_catch_up"),
    ],
)
def test_net_catch_up_where_it_cannot_apply_is_refused_in_one_line(
    tmp_path: Path,
    handed: list[WatchConfig],
    capsys: pytest.CaptureFixture[str],
    flags: list[str],
    named: str,
) -> None:
    assert watch("--bootstrap-servers", "k:9092", str(tmp_path / "a"), *flags) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert named in err
    assert handed == []


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--row-changes", "--row-format", "avro"], "format avro needs a Schema Registry"),
        (["--row-changes", "--row-format", "protobuf"], "format protobuf needs a Schema Registry"),
        (
            ["--row-format", "avro", "--schema-registry-url", "http://r:8081"],
            "--row-format",
        ),  # no row changes
        (["--row-changes", "--schema-registry-url", "http://r:8081"], "registry is given but format json"),
        (["--row-changes", "--row-format", "avro", "--schema-registry-url", "r:8081"], "http:// or https://"),
        (
            ["--row-changes", "--row-format", "avro", "--schema-registry-url", "http://u:p@r:8081"],
            "credentials",
        ),
    ],
)
def test_avro_without_a_registry_or_with_a_bad_one_is_refused_in_one_line(
    tmp_path: Path,
    handed: list[WatchConfig],
    capsys: pytest.CaptureFixture[str],
    flags: list[str],
    named: str,
) -> None:
    assert watch("--bootstrap-servers", "k:9092", str(tmp_path / "a"), *flags) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and named in err, err
    assert "u:p" not in err  # a URL's credentials are never echoed
    assert handed == []


def test_the_registry_reaches_each_table_and_its_password_stays_secret(
    tmp_path: Path, handed: list[WatchConfig], capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "w.yaml"
    config.write_text(
        "kafka: {bootstrap_servers: 'k:9092'}\ntables:\n  - uri: " + str(tmp_path / "b") + "\n"
        "    row_changes: {format: avro, registry: {url: 'http://r:8081', username: mirror, "
        "password: hunter2-secret}}\n"
    )
    assert watch("--config", str(config), "--subject-name-strategy", "topic-record") == 0
    registry = handed[0].tables[0].row_changes.registry  # type: ignore[union-attr]
    assert registry is not None
    assert (registry.url, registry.username, registry.subject_name_strategy) == (
        "http://r:8081",
        "mirror",
        "topic-record",
    )
    assert registry.password is not None and registry.password.get_secret_value() == "hunter2-secret"
    assert "hunter2" not in repr(handed[0]) and "hunter2" not in str(handed[0].model_dump())
    from deltamirror.mirror.records.row_formats import RegistrySettings
    from deltamirror.producer.publishing.row_events import _registry_settings

    settings = _registry_settings(handed[0].tables[0].row_changes)  # type: ignore[arg-type]
    assert isinstance(settings, RegistrySettings) and "hunter2" not in repr(settings)
    # the configuration the watcher logs at start ("starting"): the password masked, the rest there
    from deltamirror.producer import redacted

    logged = json.dumps(redacted(handed[0]), default=str)
    assert "hunter2" not in logged and '"password": "***"' in logged and '"username": "mirror"' in logged
    # a configuration error beside the password does not echo it (one line, naming the key)
    config.write_text(config.read_text().replace("username: mirror,", "username: mirror, bogus: 1,"))
    capsys.readouterr()
    assert watch("--config", str(config)) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "registry.bogus" in err and "hunter2" not in err, err


@pytest.mark.parametrize("how", ["flag", "environment", "file"])
def test_a_metrics_host_without_a_port_is_refused_in_one_line(
    tmp_path: Path,
    handed: list[WatchConfig],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    how: str,
) -> None:
    """Audit F9: ``--metrics-host`` (its variable, ``metrics_host:``) without a port started no
    server and said nothing; consume-snapshot refuses it, and so does watch now."""
    config = tmp_path / "w.yaml"
    config.write_text(
        f"kafka: {{bootstrap_servers: 'k:9092'}}\ntables: [{tmp_path / 'a'}]\n"
        + ("metrics_host: 0.0.0.0\n" if how == "file" else "")
    )
    argv = ["--config", str(config)]
    if how == "flag":
        argv += ["--metrics-host", "0.0.0.0"]
    if how == "environment":
        monkeypatch.setenv("DELTAMIRROR_METRICS_HOST", "0.0.0.0")
    assert watch(*argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    # named as the user gave it: the flag, its variable, the file's key
    given_as = {"flag": "--metrics-host", "environment": "DELTAMIRROR_METRICS_HOST", "file": "metrics_host"}
    assert f" {given_as[how]}: goes with metrics_port (--metrics-port)" in err, err
    assert handed == []
    assert watch(*argv, "--metrics-port", "9464") == 0
    assert (handed[0].metrics_host, handed[0].metrics_port) == ("0.0.0.0", 9464)


def test_a_switch_variable_set_to_false_turns_off_what_the_file_turns_on(
    tmp_path: Path, handed: list[WatchConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Audit F10: a variable wins over the file (--help), but ``DELTAMIRROR_ROW_CHANGES=false`` was
    read as "not given" and the file's row changes (and wait_for_table, net_catch_up) stayed on."""
    config = tmp_path / "w.yaml"
    config.write_text(
        "kafka: {bootstrap_servers: 'k:9092'}\n"
        f"tables:\n  - uri: {tmp_path / 'a'}\n    wait_for_table: true\n"
        "    snapshot_mode: from-version\n    from_version: 0\n"
        "    row_changes: {key_columns: [id], net_catch_up: true}\n"
    )
    assert watch("--config", str(config)) == 0
    (table,) = handed[-1].tables
    assert table.row_changes_on and table.wait_for_table and table.row_changes is not None
    assert table.row_changes.net_catch_up

    monkeypatch.setenv("DELTAMIRROR_NET_CATCH_UP", "false")
    assert watch("--config", str(config)) == 0
    (table,) = handed[-1].tables
    assert table.row_changes is not None and table.row_changes_on and not table.row_changes.net_catch_up

    monkeypatch.setenv("DELTAMIRROR_ROW_CHANGES", "false")
    monkeypatch.setenv("DELTAMIRROR_WAIT_FOR_TABLE", "off")
    assert watch("--config", str(config)) == 0
    (table,) = handed[-1].tables
    assert not table.row_changes_on and not table.wait_for_table

    # a flag given still wins over its variable
    assert watch("--config", str(config), "--row-changes", "--wait-for-table") == 0
    (table,) = handed[-1].tables
    assert table.row_changes_on and table.wait_for_table


@pytest.mark.parametrize("inner_first", [False, True])
def test_nested_discover_prefixes_are_refused_naming_both(
    tmp_path: Path, handed: list[WatchConfig], capsys: pytest.CaptureFixture[str], inner_first: bool
) -> None:
    """Audit F1: a table under two prefixes was found by the first listed alone; the other's
    settings (its row changes, its name) were dropped without a word."""
    outer = "{uri: lake, name: outer}"
    inner = "{uri: lake/cdc, name: inner, row_changes: {key_columns: [id]}}"
    prefixes = [inner, outer] if inner_first else [outer, inner]
    config = tmp_path / "w.yaml"
    config.write_text(f"kafka: {{bootstrap_servers: 'k:9092'}}\ndiscover: [{', '.join(prefixes)}]\n")
    assert watch("--config", str(config)) == 2
    err = capsys.readouterr().err
    (line,) = err.strip().splitlines()
    assert (
        "discover[1].uri: " in line
        and ("lies inside discover[0]" if not inner_first else "holds discover[0]") in line
    )
    assert str(tmp_path / "lake") in line and str(tmp_path / "lake" / "cdc") in line
    assert handed == []
    # the same prefix twice, once from the file and once spelled otherwise on the command line,
    # is one prefix (the file's keeps its settings); two siblings are fine
    config.write_text(f"kafka: {{bootstrap_servers: 'k:9092'}}\ndiscover: [{inner}, lake/simple]\n")
    assert watch("--config", str(config), "--discover", str(tmp_path / "lake" / "cdc") + "/") == 0
    assert [d.name for d in handed[-1].discover] == ["inner", None]
    # an outer prefix that leaves the inner one's folder out (exclude, max_depth): no table under both
    for leaves_out in ("exclude: [cdc]", "exclude: ['c*']", "max_depth: 1"):
        deep = inner.replace("lake/cdc", "lake/x/cdc") if "max_depth" in leaves_out else inner
        outer_out = outer.replace("}", f", {leaves_out}}}")
        prefixes = [deep, outer_out] if inner_first else [outer_out, deep]
        config.write_text(f"kafka: {{bootstrap_servers: 'k:9092'}}\ndiscover: [{', '.join(prefixes)}]\n")
        assert watch("--config", str(config)) == 0, leaves_out
    # one that does not (its glob names another folder, or its depth reaches the inner one)
    for keeps_in in ("exclude: [cdc2]", "max_depth: 2"):
        deep = inner.replace("lake/cdc", "lake/x/cdc") if "max_depth" in keeps_in else inner
        outer_in = outer.replace("}", f", {keeps_in}}}")
        config.write_text(f"kafka: {{bootstrap_servers: 'k:9092'}}\ndiscover: [{outer_in}, {deep}]\n")
        assert watch("--config", str(config)) == 2, keeps_in


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--poll-interval", "inf"], "poll_interval_s: Input should be a finite number"),
        (["--heartbeat-interval", "inf"], "--heartbeat-interval: Input should be a finite number"),
        (["--heartbeat-interval", "nan"], "--heartbeat-interval: Input should be a finite number"),
    ],
)
def test_an_interval_that_never_ends_is_refused(
    tmp_path: Path, handed: list[WatchConfig], capsys: pytest.CaptureFixture[str], flags: list[str], said: str
) -> None:
    """Audit: ``--poll-interval inf`` was accepted (a table never polled); the consumers refuse it."""
    assert watch("--bootstrap-servers", "k:9092", str(tmp_path / "a"), *flags) == 2
    err = capsys.readouterr().err
    assert said in err and len(err.strip().splitlines()) == 1, err
    assert handed == []


def test_snapshot_mode_from_version_keeps_the_files_from_version(
    tmp_path: Path, handed: list[WatchConfig], capsys: pytest.CaptureFixture[str]
) -> None:
    """Audit: ``--snapshot-mode from-version`` over a table whose file gives ``from_version: 1`` was
    refused as "from_version: required" (the flag's mode cleared the file's start)."""
    config = tmp_path / "w.yaml"
    config.write_text(
        "kafka: {bootstrap_servers: 'k:9092'}\n"
        f"tables: [{{uri: {tmp_path / 'a'}, snapshot_mode: from-version, from_version: 1}},"
        f" {{uri: {tmp_path / 'b'}, snapshot_mode: from-timestamp, from_timestamp: '2026-01-01T00:00:00Z'}}]\n"
    )
    assert watch("--config", str(config), "--snapshot-mode", "from-version") == 2  # b has no version
    assert "tables[1].from_version: required" in capsys.readouterr().err
    assert watch("--config", str(config), "--snapshot-mode", "from-version", "--from-version", "3") == 0
    assert [t.from_version for t in handed[-1].tables] == [3, 3]
    config.write_text(
        "kafka: {bootstrap_servers: 'k:9092'}\n"
        f"tables: [{{uri: {tmp_path / 'a'}, snapshot_mode: from-version, from_version: 1}}]\n"
    )
    assert watch("--config", str(config), "--snapshot-mode", "from-version") == 0
    assert table_starts(handed[-1]) == [("a", "from-version", 1, None)]
    assert watch("--config", str(config), "--snapshot-mode", "latest") == 0  # another mode: no version
    assert table_starts(handed[-1]) == [("a", "latest", None, None)]


@pytest.mark.parametrize(
    ("setting", "value", "extra"),
    [
        ("from_version", "3", ["--discover", "{tmp}/lake"]),
        ("net_catch_up", "true", ["{tmp}/a"]),
        ("row_format", "avro", ["{tmp}/a"]),
    ],
)
@pytest.mark.parametrize("how", ["flag", "environment"])
def test_a_refused_override_is_named_as_the_user_gave_it(
    tmp_path: Path,
    handed: list[WatchConfig],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    setting: str,
    value: str,
    extra: list[str],
    how: str,
) -> None:
    """A refusal named ``--from-version`` when ``DELTAMIRROR_FROM_VERSION`` gave the value: the
    user was told to change a flag they never wrote."""
    flag = "--" + setting.replace("_", "-")
    argv = ["--bootstrap-servers", "k:9092", *(a.format(tmp=tmp_path) for a in extra)]
    if how == "flag":
        argv += [flag] if value == "true" else [flag, value]
    else:
        monkeypatch.setenv("DELTAMIRROR_" + setting.upper(), value)
    assert watch(*argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    named = flag if how == "flag" else "DELTAMIRROR_" + setting.upper()
    assert f"{setting} ({named})" in err, err
    assert handed == []
