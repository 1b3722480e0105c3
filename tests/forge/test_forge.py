"""The forged-record suite's quick subset: every class of hostile record, a few cases each, through
consume-snapshot, invalidate and the change feed read from the mirror, on a real broker; three of
them through the Spark source too. ``make forge`` runs the whole campaign (floods measured).

A failure names the case (class/name), the consumer, what was expected and what came out.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from support.forge import Base, mirror_base
from support.forge_cases import Case, check_expectations, generate
from support.forge_runner import Runner
from support.spark import spark  # noqa: F401  # the session's SparkSession fixture

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(300)]

SEED = int(os.environ.get("DELTAMIRROR_FORGE_SEED", "11"))
CASES = generate("ci", SEED)
TABLE_ID = "krs__cdf-table-with-dv"


@pytest.fixture(scope="module")
def base(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Base:
    return mirror_base(kafka_bootstrap, TABLE_ID, tmp_path_factory.mktemp("forge-table"))


@pytest.fixture(scope="module")
def runner(kafka_bootstrap: str, base: Base, tmp_path_factory: pytest.TempPathFactory) -> Runner:
    return Runner(kafka_bootstrap, base, Path(tmp_path_factory.mktemp("forge")), timeout_s=120.0)


def test_the_cases_are_consistent() -> None:
    assert not check_expectations(generate("full", SEED))
    assert {c.cls for c in CASES} == {c.cls for c in generate("full", SEED) if c.size == "ci"}


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_forged_records(case: Case, runner: Runner) -> None:
    outcomes = runner.run_case(case, consumers=("consume-snapshot", "invalidate", "mirror-feed"))
    failures = [f"{o.consumer}: {f}" for o in outcomes for f in o.failures]
    assert not failures, "\n".join(failures)


SPARK_CASES = [c for c in CASES if "spark" in c.tags]


@pytest.mark.spark
@pytest.mark.timeout(600)
@pytest.mark.parametrize("case", SPARK_CASES, ids=[c.id for c in SPARK_CASES])
def test_forged_records_through_the_spark_source(case: Case, runner: Runner, spark: Any) -> None:  # noqa: F811
    from deltamirror.consumer.spark_source import register

    register(spark)
    runner.spark = spark
    outcomes = runner.run_case(case, consumers=("spark",))
    assert outcomes, "the case did not run through Spark"
    failures = [f"{o.consumer}: {f}" for o in outcomes for f in o.failures]
    assert not failures, "\n".join(failures)
