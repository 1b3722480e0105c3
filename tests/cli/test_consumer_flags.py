"""Each flag of the consumer-side commands takes effect or, where it cannot, is refused at start.

A refusal is one line naming the flag (and what stops it), exit 2, before any broker is asked:
the broker here (127.0.0.1:1) refuses every connection, so a command that went on to it would
exit 1 after its timeout instead.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from deltamirror.cli.main import build_parser, main

DEAD = ["--bootstrap-servers", "127.0.0.1:1"]
SOURCE = ["--topic", "t.actions", *DEAD]

REFUSED = [
    # consume-snapshot
    (["consume-snapshot", *SOURCE, "--max-items", "3"], "--max-items goes with --format jsonl"),
    (
        ["consume-snapshot", *SOURCE, "--checkpoint-interval-versions", "5"],
        "--checkpoint-interval-versions goes with --state-dir",
    ),
    (
        ["consume-snapshot", *SOURCE, "--checkpoint-interval-s", "5"],
        "--checkpoint-interval-s goes with --state-dir",
    ),
    (
        ["consume-snapshot", *SOURCE, "--state-dir", "{tmp}/s", "--checkpoint-interval-s", "nan"],
        "--checkpoint-interval-s must be 0 or more",
    ),
    (
        ["consume-snapshot", *SOURCE, "--state-dir", "{tmp}/s", "--checkpoint-interval-versions", "-1"],
        "--checkpoint-interval-versions must be 0 or more",
    ),
    (["consume-snapshot", "--topic", "a b", *DEAD], "--topic: invalid Kafka topic name"),
    (["consume-snapshot", *SOURCE, "--commits-topic", "c/d"], "--commits-topic: invalid Kafka topic name"),
    (["consume-snapshot", *SOURCE, "--group-id", " "], "--group-id is empty"),
    (["consume-snapshot", *SOURCE, "--metrics-host", "0.0.0.0"], "--metrics-host goes with --metrics-port"),
    (
        ["consume-snapshot", *SOURCE, "--format", "jsonl", "--max-items", "-1"],
        "--max-items must be 0 or more",
    ),
    # refused records copied back into a topic read loop for ever (F3 of the 2026-11-30 audit)
    (
        ["consume-snapshot", *SOURCE, "--on-bad-record", "dead-letter", "--bad-record-topic", "t.actions"],
        "--bad-record-topic t.actions is a topic this command reads",
    ),
    (
        [
            "consume-snapshot",
            *SOURCE,
            "--commits-topic",
            "t.commits",
            "--on-bad-record",
            "dead-letter",
            "--bad-record-topic",
            "t.commits",
        ],
        "--bad-record-topic t.commits is a topic this command reads",
    ),
    (
        [
            "invalidate",
            "--topic",
            "deltamirror.cdc.actions",
            *DEAD,
            "--commits-topic",
            "--exec",
            "true",
            "--on-bad-record",
            "dead-letter",
            "--bad-record-topic",
            "deltamirror.cdc.commits",
        ],
        "--bad-record-topic deltamirror.cdc.commits is a topic this command reads",
    ),
    # invalidate
    (
        ["invalidate", *SOURCE, "--exec", "true", "--max-attempts", "1", "--backoff", "2"],
        "--backoff goes with a --max-attempts above 1",
    ),
    (
        ["invalidate", *SOURCE, "--exec", "true", "--max-attempts", "1", "--max-backoff", "2"],
        "--max-backoff goes with a --max-attempts above 1",
    ),
    (
        ["invalidate", *SOURCE, "--exec", "true", "--max-backoff", "0.1"],
        "--max-backoff 0.1 is less than --backoff 0.5",
    ),
    (
        ["invalidate", *SOURCE, "--exec", "true", "--backoff", "40"],
        "--max-backoff 30 is less than --backoff 40",
    ),
    (["invalidate", *SOURCE, "--exec", "true", "--backoff", "-1"], "--backoff must be 0 s or more"),
    (
        ["invalidate", *SOURCE, "--exec", "true", "--max-attempts", "-2"],
        "--max-attempts must be 0 (no limit) or more",
    ),
    (
        ["invalidate", *SOURCE, "--exec", "true", "--dead-letter-topic", "dl", "--max-attempts", "0"],
        "--dead-letter-topic goes with a --max-attempts above 0",
    ),
    (
        ["invalidate", *SOURCE, "--exec", "true", "--dead-letter-topic", "t.actions"],
        "--dead-letter-topic t.actions is a topic this command reads",
    ),
    (
        # the commits topic derived (--commits-topic without a name): F4 of the 2026-11-30 audit
        [
            "invalidate",
            "--topic",
            "deltamirror.cdc.actions",
            *DEAD,
            "--commits-topic",
            "--dead-letter-topic",
            "deltamirror.cdc.commits",
            "--exec",
            "true",
        ],
        "--dead-letter-topic deltamirror.cdc.commits is a topic this command reads",
    ),
    (
        ["invalidate", *SOURCE, "--exec", "true", "--commits-topic", "c", "--dead-letter-topic", "c"],
        "--dead-letter-topic c is a topic this command reads",
    ),
    (
        ["invalidate", *SOURCE, "--exec", "true", "--dead-letter-topic", "no good"],
        "--dead-letter-topic: invalid Kafka topic name",
    ),
    (["invalidate", *SOURCE, "--exec", "true", "--timeout", "inf"], "--timeout must be more than 0 s"),
    (["invalidate", *SOURCE, "--exec", "true", "--timeout", "0"], "--timeout must be more than 0 s"),
    (["invalidate", *SOURCE, "--exec", "true", "--header", "X-A: b"], "--header goes with --webhook"),
    (
        ["invalidate", *SOURCE, "--exec", "true", "--checkpoint-interval-s", "1"],
        "--checkpoint-interval-s goes with --state-dir",
    ),
    # the table commands
    (["read", "{table}", "--columns", ""], "--columns is empty"),
    (["read", "{table}", "--columns", "id,,part"], "--columns has an empty name"),
    (["changes", "{table}", "--starting-version", "0", "--columns", "id,"], "--columns has an empty name"),
    # local kafka
    (["local", "kafka", "start", "--secure-port", "9999"], "--secure-port goes with --security scram-tls"),
]


def _argv(argv: list[str], tmp_path: Path) -> list[str]:
    from support.tables import TABLES

    table = str(TABLES / "krs__cdf-table-partitioned")
    return [a.replace("{tmp}", str(tmp_path)).replace("{table}", table) for a in argv]


@pytest.mark.parametrize(("argv", "said"), REFUSED, ids=[" ".join(a[:1] + a[-2:]) for a, _ in REFUSED])
def test_a_flag_that_cannot_take_effect_is_refused_at_start(
    argv: list[str], said: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(_argv(argv, tmp_path)) == 2
    err = capsys.readouterr().err
    assert said in err and len(err.splitlines()) == 1, err


def _checked(argv: list[str]) -> argparse.Namespace:
    from deltamirror.cli.consumer_cmds import _check_flags

    args = build_parser().parse_args(argv)
    _check_flags(args)
    return args


@pytest.mark.parametrize(
    "argv",
    [
        ["consume-snapshot", *SOURCE, "--format", "jsonl", "--max-items", "3"],
        ["consume-snapshot", *SOURCE, "--state-dir", "s", "--checkpoint-interval-versions", "0"],
        [
            "invalidate",
            *SOURCE,
            "--exec",
            "true",
            "--max-attempts",
            "2",
            "--backoff",
            "0",
            "--max-backoff",
            "0",
        ],
        ["invalidate", *SOURCE, "--exec", "true", "--max-attempts", "0"],
        ["invalidate", *SOURCE, "--exec", "true", "--dead-letter-topic", "dl", "--max-backoff", "0.5"],
        ["invalidate", *SOURCE, "--webhook", "http://h/", "--header", "X-A: b", "--max-items", "0"],
    ],
)
def test_the_same_flags_where_they_take_effect_are_accepted(argv: list[str]) -> None:
    _checked(argv)


def test_the_defaults_of_flags_told_apart_from_their_absence_are_still_the_documented_ones() -> None:
    from deltamirror.cli import consumer_cmds

    args = _checked(["invalidate", *SOURCE, "--exec", "true"])
    assert (args.backoff, args.max_backoff, args.max_items) == (None, None, None)  # absent...
    assert (consumer_cmds.BACKOFF_S, consumer_cmds.MAX_BACKOFF_S, consumer_cmds.MAX_ITEMS) == (
        0.5,
        30.0,
        1000,
    )
    from deltamirror.consumer.invalidate import DEFAULT_MAX_ITEMS, RetryPolicy
    from deltamirror.consumer.snapshot import (
        DEFAULT_CHECKPOINT_INTERVAL_S,
        DEFAULT_CHECKPOINT_INTERVAL_VERSIONS,
    )

    policy = RetryPolicy()
    assert (policy.initial_backoff_s, policy.max_backoff_s) == (
        consumer_cmds.BACKOFF_S,
        consumer_cmds.MAX_BACKOFF_S,
    )
    assert DEFAULT_MAX_ITEMS == consumer_cmds.MAX_ITEMS
    from deltamirror.consumer.invalidate import DEFAULT_GROUP_ID as INVALIDATE_GROUP
    from deltamirror.consumer.snapshot import DEFAULT_GROUP_ID as SNAPSHOT_GROUP

    assert consumer_cmds.DEFAULT_GROUPS == {
        "consume-snapshot": SNAPSHOT_GROUP,
        "invalidate": INVALIDATE_GROUP,
    }
    assert (DEFAULT_CHECKPOINT_INTERVAL_VERSIONS, DEFAULT_CHECKPOINT_INTERVAL_S) == (
        consumer_cmds.CHECKPOINT_VERSIONS,
        consumer_cmds.CHECKPOINT_S,
    )


@pytest.mark.parametrize("flag", [["--port", "9999"], ["--keep-broker"]])
def test_demo_flags_for_its_own_broker_are_refused_when_it_uses_another(
    flag: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:1")
    assert main(["demo", *flag]) == 2
    err = capsys.readouterr().err
    assert f"{flag[0]} is for the local broker the demo starts" in err and len(err.splitlines()) == 1


def test_read_selects_columns_as_the_library_does(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """`read --columns ID,id` printed nothing (exit 2, 'no such column') where the library reads id
    (both name one column: refused now, tests/cli/test_table_cmds.py; ``ID`` alone reads id)."""
    import json

    assert main(_argv(["read", "{table}", "--columns", "ID"], tmp_path)) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert rows and all(list(r) == ["id"] for r in rows)


# --- a --state-dir that cannot be used: one line naming it, exit 2, never a traceback (F7 of the
# 2026-11-30 audit: NotADirectoryError, JSONDecodeError, AttributeError, "topic None") -------------------

BAD_STATE_DIRS = [
    # (what is at --state-dir, the contents of its offsets.json if any, what the line says)
    ("file", None, "state directory {dir} cannot be used: {dir} is not a directory"),
    ("under-file", None, "state directory {dir} cannot be used: {tmp}/f is not a directory"),
    ("tables-file", None, "state directory {dir} cannot be used: {dir}/tables is not a directory"),
    ("dir", "{garbage", "{dir}/offsets.json is not the offsets of a deltamirror consumer state (not JSON"),
    ("dir", "[]", "{dir}/offsets.json is not the offsets of a deltamirror consumer state (a JSON list"),
    (
        "dir",
        '{"format": 3}',
        "{dir}/offsets.json is not the offsets of a deltamirror consumer state (no topic)",
    ),
    (
        "dir",
        '{"format": 3, "topic": "t.actions"}',
        "{dir}/offsets.json is not the offsets of a deltamirror consumer state (no partitions)",
    ),
    (
        "dir",
        '{"format": 3, "topic": "t.actions", "partitions": {"0": "x"}}',
        "{dir}/offsets.json is not the offsets of a deltamirror consumer state (partitions",
    ),
    ("offsets-dir", None, "{dir}/offsets.json cannot be read"),
]


@pytest.mark.parametrize("command", ["consume-snapshot", "invalidate"])
@pytest.mark.parametrize(
    ("kind", "offsets", "said"), BAD_STATE_DIRS, ids=[f"{k}-{o}" if o else k for k, o, _ in BAD_STATE_DIRS]
)
def test_a_state_dir_that_cannot_be_used_is_one_line_naming_it(
    command: str,
    kind: str,
    offsets: str | None,
    said: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    state = tmp_path / "s"
    if kind == "file":
        state.write_text("")
    elif kind == "under-file":
        (tmp_path / "f").write_text("")
        state = tmp_path / "f" / "s"
    elif kind == "tables-file":
        state.mkdir()
        (state / "tables").write_text("")
    elif kind == "offsets-dir":
        (state / "offsets.json").mkdir(parents=True)
    else:
        (state / "tables").mkdir(parents=True)
        (state / "offsets.json").write_text(offsets or "")
    target = ["--exec", "true"] if command == "invalidate" else []
    assert main([command, *SOURCE, *target, "--once", "--state-dir", str(state)]) == 2
    err = capsys.readouterr().err
    assert said.format(dir=state, tmp=tmp_path) in err and len(err.splitlines()) == 1, err


@pytest.mark.parametrize("recorded", [True, False], ids=["recorded", "before-commands-were-recorded"])
def test_invalidate_over_the_state_dir_of_consume_snapshot_is_refused(
    recorded: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """F2 of the 2026-11-30 audit: invalidate took over consume-snapshot's group and position, and
    delivered nothing (exit 0); and the other way round."""
    import json

    state = tmp_path / "s"
    (state / "tables").mkdir(parents=True)
    offsets = {
        "format": 3,
        "topic": "t.actions",
        "partitions": {"0": 3},
        "groupId": "deltamirror-snapshot-consumer-b3a3dc77b291",
        "retired": {},
        "tables": {},
    }
    if recorded:
        offsets["command"] = "consume-snapshot"
    (state / "offsets.json").write_text(json.dumps(offsets))
    assert main(["invalidate", *SOURCE, "--exec", "true", "--once", "--state-dir", str(state)]) == 2
    err = capsys.readouterr().err
    assert f"state directory {state} is the state of consume-snapshot, not invalidate" in err, err
    assert len(err.splitlines()) == 1, err

    offsets.update(groupId="deltamirror-invalidate-0123456789ab", command="invalidate")
    (state / "offsets.json").write_text(json.dumps(offsets))
    assert main(["consume-snapshot", *SOURCE, "--once", "--state-dir", str(state)]) == 2
    err = capsys.readouterr().err
    assert f"state directory {state} is the state of invalidate, not consume-snapshot" in err, err
    assert len(err.splitlines()) == 1, err
