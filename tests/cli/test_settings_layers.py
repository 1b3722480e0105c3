"""The settings of a command come from four layers merged once: flags > ``DELTAMIRROR_*`` environment
variables > the ``--config`` file > the model's defaults.

Every flag declared once (``deltamirror.cli.flags.Flag``) has its variable, read by the same rules
as the flag (enumerated here from the declarations, so a flag added tomorrow is covered); a value
a flag would refuse is refused naming the variable; a combination refused names each setting as
it was given. No broker is asked: the broker here (127.0.0.1:1) refuses every connection.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from deltamirror.cli.flags import Flag, environment_layer, flag_layer
from deltamirror.cli.main import build_parser, main

DEAD = "127.0.0.1:1"


def _declared() -> dict[str, tuple[Flag, ...]]:
    from deltamirror.cli.consumer_cmds import INVALIDATE_FLAGS, SNAPSHOT_FLAGS
    from deltamirror.cli.producer_cmds import WATCH_FLAGS

    return {"watch": WATCH_FLAGS, "consume-snapshot": SNAPSHOT_FLAGS, "invalidate": INVALIDATE_FLAGS}


def _sample(flag: Flag) -> list[str]:
    """Texts the flag takes (two for a repeatable one)."""
    if flag.choices is not None:
        return [flag.choices[-1]]
    if flag.type is int:
        return ["7"]
    if flag.type is float:
        return ["2.5"]
    if flag.setting == "storage_options":
        return ["a=1", "b=2"]
    if flag.setting == "headers":
        return ["X-A: 1", "X-B: 2"]
    return ["one", "two"] if flag.repeatable else ["text"]


def _parsed(command: str, argv: list[str]) -> argparse.Namespace:
    return build_parser().parse_args([command, *argv])


@pytest.mark.parametrize("command", ["watch", "consume-snapshot", "invalidate"])
def test_every_declared_flag_has_a_variable_read_as_the_flag_is(command: str) -> None:
    flags = _declared()[command]
    parser_flags = {
        a.dest
        for a in _parsed_actions(command)
        if a.option_strings and a.dest not in ("help", "no_progress", "commits_topic")
    }
    assert parser_flags == {f.dest for f in flags if f.names} - {"commits_topic"}  # every option declared
    for flag in flags:
        if flag.env is None:  # the positional TABLE
            continue
        assert flag.env == "DELTAMIRROR_" + flag.flag.lstrip("-").upper().replace("-", "_")
        texts = _sample(flag)
        if flag.switch:
            argv, environ = [flag.names[-1]], {flag.env: "true"}
        elif flag.repeatable:
            argv = [x for t in texts for x in (flag.names[-1], t)]
            environ = {flag.env: "\n".join(texts)}
        else:
            argv, environ = [flag.names[-1], texts[0]], {flag.env: texts[0]}
        from_flags, flag_names = flag_layer([flag], _parsed(command, argv))
        from_env, env_names = environment_layer([flag], environ)
        assert from_env == from_flags and from_env, (command, flag.env)
        assert env_names == {flag.setting: flag.env} and flag_names == {flag.setting: flag.flag}
        assert environment_layer([flag], {flag.env: "  "}) == ({}, {})  # empty: not given


def _parsed_actions(command: str) -> list[argparse.Action]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return list(sub.choices[command]._actions)


def _settings(command: str, argv: list[str], environ: dict[str, str]) -> Any:
    from deltamirror.cli.consumer_cmds import command_settings

    return command_settings(_parsed(command, argv), environ)


def test_flags_win_over_variables_which_win_over_the_file_which_wins_over_defaults(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(f"kafka: {{bootstrap_servers: '{DEAD}'}}\nconsumer:\n  on_bad_record: skip\n")
    base = ["--topic", "t.actions"]
    assert (
        _settings("consume-snapshot", base, {"DELTAMIRROR_BOOTSTRAP_SERVERS": DEAD}).on_bad_record == "stop"
    )
    with_file = {"DELTAMIRROR_CONFIG": str(config)}
    assert _settings("consume-snapshot", base, with_file).on_bad_record == "skip"
    with_env = {**with_file, "DELTAMIRROR_ON_BAD_RECORD": "stop"}
    assert _settings("consume-snapshot", base, with_env).on_bad_record == "stop"
    flagged = _settings("consume-snapshot", [*base, "--on-bad-record", "skip"], with_env)
    assert flagged.on_bad_record == "skip"
    # the broker list: the flag over the variable over the file
    assert _settings("consume-snapshot", base, with_file).kafka.bootstrap_servers == DEAD
    env_servers = {**with_file, "DELTAMIRROR_BOOTSTRAP_SERVERS": "env:9092"}
    assert _settings("consume-snapshot", base, env_servers).kafka.bootstrap_servers == "env:9092"
    flag_servers = _settings("consume-snapshot", [*base, "--bootstrap-servers", "flag:9092"], env_servers)
    assert flag_servers.kafka.bootstrap_servers == "flag:9092"


def test_the_variables_alone_make_a_whole_invalidate_command() -> None:
    environ = {
        "DELTAMIRROR_BOOTSTRAP_SERVERS": DEAD,
        "DELTAMIRROR_TOPIC": "t.actions",
        "DELTAMIRROR_WEBHOOK": "http://h/",
        "DELTAMIRROR_HEADER": "Authorization: Bearer x\nX-B: 2",
        "DELTAMIRROR_MAX_ATTEMPTS": "3",
        "DELTAMIRROR_BACKOFF": "0.25",
        "DELTAMIRROR_ONCE": "yes",
        # what invalidate sets for its --exec command: none of them is a setting
        "DELTAMIRROR_VERSION": "3",
        "DELTAMIRROR_TABLE": "file:///x",
        "DELTAMIRROR_KIND": "version",
    }
    settings = _settings("invalidate", [], environ)
    assert settings.actions_topic == "t.actions" and settings.webhook == "http://h/" and settings.once
    assert settings.header_map == {"Authorization": "Bearer x", "X-B": "2"}
    assert "Bearer" not in repr(settings) and "Bearer" not in str(settings.model_dump())  # a secret
    assert (settings.max_attempts, settings.backoff_s, settings.max_backoff_s) == (3, 0.25, 30.0)
    frozen = settings.model_copy()
    with pytest.raises(Exception, match="frozen"):
        frozen.timeout = 1.0


REFUSED = [
    # (command, argv, environment, the one line names)
    ("consume-snapshot", ["--topic", "t"], {"DELTAMIRROR_CHECKPOINT_INTERVAL_S": "5"}, "DELTAMIRROR_CHECKPOINT_INTERVAL_S goes with --state-dir"),
    ("consume-snapshot", ["--topic", "t", "--checkpoint-interval-s", "5"], {"DELTAMIRROR_STATE_DIR": " "}, "--checkpoint-interval-s goes with --state-dir"),
    ("consume-snapshot", ["--topic", "t"], {"DELTAMIRROR_MAX_ITEMS": "3"}, "DELTAMIRROR_MAX_ITEMS goes with --format jsonl"),
    ("consume-snapshot", ["--topic", "t", "--max-items", "3"], {"DELTAMIRROR_FORMAT": "counts"}, "--max-items goes with DELTAMIRROR_FORMAT jsonl"),
    ("consume-snapshot", ["--topic", "t"], {"DELTAMIRROR_MAX_ITEMS": "three"}, "DELTAMIRROR_MAX_ITEMS must be an integer"),
    ("consume-snapshot", ["--topic", "t"], {"DELTAMIRROR_FORMAT": "csv"}, "DELTAMIRROR_FORMAT must be one of counts, jsonl"),
    ("consume-snapshot", ["--topic", "t"], {"DELTAMIRROR_ONCE": "maybe"}, "DELTAMIRROR_ONCE must be true or false"),
    ("consume-snapshot", [], {}, "the following arguments are required: --topic"),
    ("consume-snapshot", ["--topic", "t"], {"DELTAMIRROR_BAD_RECORD_TOPIC": "x"}, "DELTAMIRROR_BAD_RECORD_TOPIC goes with --on-bad-record dead-letter, not stop"),
    ("invalidate", ["--topic", "t"], {}, "one of the arguments --exec --webhook is required"),
    ("invalidate", ["--topic", "t", "--exec", "true"], {"DELTAMIRROR_WEBHOOK": "http://h/"}, "--exec and DELTAMIRROR_WEBHOOK: give one target, not both"),
    ("invalidate", ["--topic", "t", "--exec", "true", "--max-attempts", "1"], {"DELTAMIRROR_BACKOFF": "2"}, "DELTAMIRROR_BACKOFF goes with a --max-attempts above 1"),
    ("invalidate", ["--topic", "t", "--exec", "true"], {"DELTAMIRROR_TIMEOUT": "0"}, "DELTAMIRROR_TIMEOUT must be more than 0 s"),
    ("invalidate", ["--topic", "t", "--webhook", "http://h/"], {"DELTAMIRROR_HEADER": "X-A: 1\nsecret-token"}, "DELTAMIRROR_HEADER #2 is not 'NAME: VALUE'"),
]  # fmt: skip


@pytest.mark.parametrize(("command", "argv", "environ", "said"), REFUSED, ids=[r[3][:40] for r in REFUSED])
def test_a_combination_is_refused_naming_each_setting_as_it_was_given(
    command: str,
    argv: list[str],
    environ: dict[str, str],
    said: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("DELTAMIRROR_BOOTSTRAP_SERVERS", DEAD)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    assert main([command, *argv]) == 2
    err = capsys.readouterr().err
    assert said in err and len(err.splitlines()) == 1, err
    assert "secret-token" not in err


def test_a_key_of_the_file_is_named_as_the_file_spells_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(f"kafka: {{bootstrap_servers: '{DEAD}'}}\nconsumer:\n  on_bad_record: dead-letter\n")
    assert main(["consume-snapshot", "--config", str(config), "--topic", "t"]) == 2
    err = capsys.readouterr().err
    assert "consumer.on_bad_record dead-letter needs --bad-record-topic" in err and str(config) in err, err


@pytest.mark.parametrize("command", ["consume-snapshot", "invalidate"])
def test_a_key_no_command_knows_at_the_top_of_a_consumers_file_is_refused(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """F8 of the 2026-11-30 audit: `consumr:` beside `kafka:` was ignored by the consumers (its
    settings silently not taken); watch refuses it. The watcher's own keys stay allowed: the two
    share the file (docs/configuration.md)."""
    from deltamirror.cli.consumer_cmds import command_settings

    target = ["--exec", "true"] if command == "invalidate" else []
    config = tmp_path / "c.yaml"
    config.write_text(f"kafka: {{bootstrap_servers: '{DEAD}'}}\nconsumr: {{on_bad_record: skip}}\n")
    assert main([command, "--config", str(config), "--topic", "t", *target, "--once"]) == 2
    err = capsys.readouterr().err
    assert "invalid configuration: consumr: unknown key" in err and str(config) in err, err
    assert len(err.splitlines()) == 1, err

    shared = tmp_path / "shared.yaml"
    shared.write_text(
        f"kafka: {{bootstrap_servers: '{DEAD}'}}\ntables: ['{tmp_path}']\nprogress_topic: p\n"
        "signal_topic: null\nworkers: 2\nconsumer: {on_bad_record: skip}\n"
    )
    args = build_parser().parse_args([command, "--config", str(shared), "--topic", "t", *target])
    assert command_settings(args).on_bad_record == "skip"


def test_watch_takes_its_flags_from_the_environment_under_the_flags(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from deltamirror.producer import service

    handed: list[Any] = []
    monkeypatch.setattr(service, "run_watch", lambda cfg: handed.append(cfg) or 0)
    table = tmp_path / "t"
    config = tmp_path / "w.yaml"
    config.write_text(
        f"kafka: {{bootstrap_servers: 'file:9092'}}\ntables: ['{table}']\nprogress_topic: from.file\n"
    )
    monkeypatch.setenv("DELTAMIRROR_CONFIG", str(config))
    monkeypatch.setenv("DELTAMIRROR_WAIT_FOR_TABLE", "true")
    assert main(["watch"]) == 0
    assert handed[-1].progress_topic == "from.file" and handed[-1].tables[0].wait_for_table
    monkeypatch.setenv("DELTAMIRROR_PROGRESS_TOPIC", "from.env")
    monkeypatch.setenv("DELTAMIRROR_BOOTSTRAP_SERVERS", "env:9092")
    monkeypatch.setenv("DELTAMIRROR_POLL_INTERVAL", "0.25")
    assert main(["watch"]) == 0
    cfg = handed[-1]
    assert (cfg.progress_topic, cfg.kafka.bootstrap_servers, cfg.tables[0].poll_interval_s) == (
        "from.env",
        "env:9092",
        0.25,
    )
    assert main(["watch", "--progress-topic", "from.flag"]) == 0
    assert handed[-1].progress_topic == "from.flag"


def test_the_help_of_each_command_says_how_the_environment_is_read(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for command in ("watch", "consume-snapshot", "invalidate"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert "DELTAMIRROR_BOOTSTRAP_SERVERS" in text and "A flag given wins over its variable" in text, (
            command
        )


def test_the_defaults_spelled_for_help_are_the_models() -> None:
    from deltamirror.cli import consumer_cmds
    from deltamirror.consumer import settings

    for name in (
        "CHECKPOINT_VERSIONS",
        "CHECKPOINT_S",
        "MAX_ITEMS",
        "BACKOFF_S",
        "MAX_BACKOFF_S",
        "MAX_ATTEMPTS",
        "TIMEOUT_S",
    ):
        assert getattr(consumer_cmds, name) == getattr(settings, name), name
    from deltamirror.consumer.invalidate import DEFAULT_TIMEOUT_S, RetryPolicy

    assert RetryPolicy().max_attempts == settings.MAX_ATTEMPTS and DEFAULT_TIMEOUT_S == settings.TIMEOUT_S


def test_relative_allowed_locations_in_a_consumers_file_are_the_files_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A relative path in the ``consumer:`` section means the same whatever the working directory,
    as the watcher's table locations in the same file do (the 2026-11-30 audit: resolved against
    the working directory, the same file allowed other tables from another folder)."""
    config = tmp_path / "conf" / "c.yaml"
    config.parent.mkdir()
    config.write_text(
        f"kafka: {{bootstrap_servers: '{DEAD}'}}\nconsumer:\n"
        "  allow_table_locations: [lake/cdc, 's3://bucket/t', /abs/t]\n  allow_path_prefixes: [../data]\n"
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    settings = _settings("consume-snapshot", ["--topic", "t.actions"], {"DELTAMIRROR_CONFIG": str(config)})
    conf = config.parent.resolve()
    assert settings.allow_table_locations == [str(conf / "lake/cdc"), "s3://bucket/t", "/abs/t"]
    assert settings.allow_path_prefixes == [str(conf / "../data")]


@pytest.mark.parametrize("command", ["consume-snapshot", "invalidate"])
def test_a_consumers_file_is_parsed_once_and_interpolated_from_the_commands_environment(
    command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file was parsed three times (its keys, ``kafka:``, ``consumer:``), and its ``${VAR}``
    read from the process's environment whatever environment the settings were given."""
    from deltamirror.producer import config_file

    parsed: list[Path] = []
    real = config_file._parse_file

    def counting(path: Path) -> Any:
        parsed.append(path)
        return real(path)

    monkeypatch.setattr(config_file, "_parse_file", counting)
    config = tmp_path / "c.yaml"
    config.write_text("kafka: {bootstrap_servers: '${BROKERS}'}\nconsumer: {on_bad_record: skip}\n")
    target = ["--exec", "true"] if command == "invalidate" else []
    monkeypatch.delenv("BROKERS", raising=False)
    settings = _settings(
        command, ["--topic", "t", *target], {"DELTAMIRROR_CONFIG": str(config), "BROKERS": DEAD}
    )
    assert parsed == [config]
    assert settings.kafka.bootstrap_servers == DEAD and settings.on_bad_record == "skip"
