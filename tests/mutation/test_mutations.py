"""The mutation suite's bounded subset: every class on two or three real tables, every command.

Each case copies a table, mutates it and runs it through the library and the CLI; a failure names
the case (class/table/what was mutated) and says, per command, what was expected and what came out.
``make fuzz`` runs the full campaign; DELTAMIRROR_MUTATION_SEED picks other concrete mutations.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mutation.cases import Case, generate
from mutation.runner import Runner

SEED = int(os.environ.get("DELTAMIRROR_MUTATION_SEED", "11"))
CASES = generate(SEED, "ci")


@pytest.fixture(scope="module")
def runner(tmp_path_factory: pytest.TempPathFactory) -> Runner:
    return Runner(Path(tmp_path_factory.mktemp("mutation")), timeout_s=60.0)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_mutation(case: Case, runner: Runner) -> None:
    outcomes = runner.run_case(case)
    failures = [f"{o.command} (expected {o.expected}): {x}" for o in outcomes for x in o.failures]
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("table", sorted({c.table for c in CASES}))
def test_unmutated_table_works(table: str, runner: Runner) -> None:
    """Every command succeeds on the unmutated tables (the reference for `unchanged`)."""
    runner.baseline(table)
    assert not runner.baseline_failures.get(table), runner.baseline_failures[table]


def test_in_process_results_hold_in_a_process(runner: Runner) -> None:
    """The CLI run in-process gives the exit codes and outputs a real process gives."""
    picks = [c for c in CASES if c.cls in ("line-truncated", "blank-lines", "add-path-escape")][:3]
    problems = [p for case in picks for p in runner.subprocess_mismatches(case)]
    assert not problems, "\n".join(problems)
