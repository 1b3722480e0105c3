"""The generator itself: seeded, fixed classes, expectations that follow the rules, detectors that fire."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from mutation import logs as ml
from mutation.cases import CLASSES, CLI_COMMANDS, TABLE_SPECS, check_expectations, generate
from mutation.runner import Normaliser, OpenWatch, Outcome, Result, Runner, normaliser_for


def test_same_seed_same_cases_other_seed_other_values() -> None:
    a, b, c = generate(11, "full"), generate(11, "full"), generate(12, "full")
    assert [x.id for x in a] == [x.id for x in b]
    assert {x.cls for x in a} == {x.cls for x in c}  # the classes are fixed
    other = {x.id for x in a} ^ {x.id for x in c}
    assert len(other) > len(a) // 2  # another seed: other lines, fields, numbers within the classes


def test_every_class_runs_in_the_ci_subset_and_the_full_run() -> None:
    ci, full = generate(11, "ci"), generate(11, "full")
    assert {c.cls for c in ci} == set(CLASSES) == {c.cls for c in full}
    assert len(full) > 900 and 120 <= len(ci) < 250


def test_expectations_follow_the_rules() -> None:
    """Structural classes never say 'open'; faithful has a marker; every case judges some command."""
    cases = generate(11, "full") + generate(3, "full")
    assert check_expectations(cases) == []
    assert all(c.expect for c in cases)
    structural = {c.cls for c in cases if c.structural}
    for needed in ("field-missing", "field-wrong-type", "action-null", "number-nonfinite", "add-path-escape"):
        assert needed in structural


def test_classes_say_why() -> None:
    assert all(cls.about for cls in CLASSES.values())


def test_reach_follows_the_checkpoint() -> None:
    """A commit a checkpoint covers is read by history/events/changes, not by snapshot/read."""
    f = ml.facts("gen__long-log-cdf")
    assert f.cp == 99 and f.latest == 130 and f.cdf_start == 0
    assert f.reaches_commit(50) == {
        "snapshot": False,
        "read": False,
        "history": True,
        "events": True,
        "changes": True,
    }
    assert f.reaches_commit(100)["snapshot"] is True
    g = ml.facts("krs__cdf-column-mapping-name-mode-3-7")
    assert g.cdf_start == 1 and g.reaches_commit(0, "add")["changes"] is None
    # commit 1 re-states the protocol and metadata: commit 0 is not the change feed's to judge
    assert g.last_metadata_version == 1 and g.reaches_commit(0, "syntax")["changes"] is None
    assert g.reaches_commit(1, "add")["changes"] is True


def test_facts_are_read_from_the_log_not_the_code() -> None:
    f = ml.facts("golden__snapshot-data2-deleted")
    assert f.latest == 4 and f.cp == -1 and not f.has_cdf
    assert all((f.src / ml.decode_path(k[0])).exists() for k in f.active)
    assert all(ml.facts(s.id).latest >= 0 for s in TABLE_SPECS)


def test_open_watch_sees_an_open_through_a_symlink(tmp_path: Path) -> None:
    outside = tmp_path / "outside.parquet"
    outside.write_bytes(b"x")
    root = tmp_path / "root"
    root.mkdir()
    (root / "inside.parquet").symlink_to(outside)
    watch = OpenWatch([tmp_path, outside])
    try:
        os.stat(root / "inside.parquet")  # resolving is not reading
        assert watch.drain() == []
        (root / "inside.parquet").read_bytes()
        assert str(outside) in watch.drain()
    finally:
        watch.close()


def test_classification_flags_reads_and_secrets(tmp_path: Path) -> None:
    case = next(c for c in generate(11, "ci") if c.cls == "add-path-escape")
    runner = Runner(tmp_path)
    env, _ = runner.prepare(case)
    norm = normaliser_for(env.case_dir, env.root, str(env.root))
    r = Result(
        "read",
        2,
        stderr="deltamirror: error: outside the root: ../canary.parquet\n",
        opened_outside=["/x/canary"],
    )
    o: Outcome = runner.classify(case, "read", "refused", r, r, norm, norm, env)
    assert o.category == "read-outside-root"
    case.secret = "s3cr3t42"
    r = Result("read", 2, stderr="deltamirror: error: ../canary.parquet s3cr3t42\n")
    assert "secret-printed" in {
        x.split(":")[0] for x in runner.classify(case, "read", "refused", r, r, norm, norm, env).failures
    }


@pytest.mark.parametrize("command", CLI_COMMANDS)
def test_every_command_is_judged_somewhere(command: str) -> None:
    assert any(command in c.expect for c in generate(11, "ci"))


def test_consistency_check_catches_two_answers_for_one_version(tmp_path: Path) -> None:
    case = next(c for c in generate(11, "ci") if c.cls == "mtime-skew")
    runner = Runner(tmp_path)
    outcomes = runner.run_case(case)
    snap = next(o for o in outcomes if o.command == "snapshot")
    if any(o.result.exit != 0 for o in outcomes if o.command in ("snapshot", "history")):
        pytest.skip("snapshot or history fails on this table: covered by the mutation cases")
    header, rest = snap.result.stdout.split(b"\n", 1)
    changed = json.loads(header) | {"timestamp": "1999-01-01T00:00:00.000Z"}
    snap.result.stdout = json.dumps(changed).encode() + b"\n" + rest
    for o in outcomes:
        o.failures.clear()
    runner._check_consistency(case, outcomes, Normaliser([]))
    assert any("snapshot says 1999" in x for x in snap.failures)
