# One entry point for people and CI. `make demo` and `make test` are the README's two commands.
# `make help` lists the targets.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip
STAMP  := $(VENV)/.installed

.PHONY: help install demo test test-fast test-kafka test-spark e2e coverage test-pythons scale-test bench-scale lint format fuzz chaos forge bench bench-rows bench-quick bench-compare ci clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "}; {printf "  make %-11s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "Installing deltamirror with Spark, S3 and the test tools into $(VENV): about 670 MB to download"
	@echo "on a first run (pyspark's 450 MB source archive is most of it), about 1.2 GB on disk. Progress follows."
	$(PIP) install --progress-bar on --upgrade pip setuptools wheel
	$(PIP) install --progress-bar on -e ".[spark,dev,bench,s3,avro,protobuf]" --config-settings editable_mode=strict
	touch $(STAMP)
	@echo "Installed: the command is $(BIN)/deltamirror (or run: source $(BIN)/activate, then deltamirror)"

install: $(STAMP) ## create .venv and install deltamirror with its Spark and test dependencies
	@# strict editable installs link files: pick up modules added since the last install
	$(PIP) install -q --no-deps -e . --config-settings editable_mode=strict

demo: install ## start a local Kafka broker, mirror a demo table, commit, print the events
	$(BIN)/deltamirror demo

#: pytest-xdist workers of `make test`: the tests that use the broker, Spark, s3proxy or the registry
#: run on one of them (one of each service per run), the others beside them
TEST_WORKERS ?= 2

test: install ## the whole suite: real Kafka, real delta-spark (about 40 minutes on 2 cores; TEST_WORKERS=)
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup

test-fast: install ## the suite without Kafka, Spark and S3 (no Java needed)
	$(BIN)/python -m pytest -m "not kafka and not spark and not s3"

test-kafka: install ## only the tests that need a Kafka broker
	$(BIN)/python -m pytest -m "kafka and not e2e"

test-spark: install ## only the tests that need Spark
	$(BIN)/python -m pytest -m spark

e2e: install ## the whole scenario matrix on a real broker (tests/e2e); its table in build/e2e-matrix.md
	mkdir -p build
	DELTAMIRROR_MATRIX_REPORT=build/e2e-matrix.md $(BIN)/python -m pytest tests/e2e -m "" -p no:cacheprovider

coverage: install ## the suite with line and branch coverage of deltamirror (MARK= narrows it, e.g. MARK="not spark"); build/coverage/index.html
	$(BIN)/python -m pytest $(if $(MARK),-m "$(MARK)") --cov=deltamirror --cov-branch \
		--cov-report=term:skip-covered --cov-report=html:build/coverage

#: the Python versions test-pythons runs the fast suite on, each one that is installed (requires-python >= 3.11)
PYTHONS ?= 3.11 3.12 3.13

test-pythons: ## the fast suite on every supported Python installed here (PYTHONS=), one venv each (.venv-3.X)
	@ran=""; for v in $(PYTHONS); do \
		if ! command -v python$$v >/dev/null 2>&1; then echo "test-pythons: python$$v is not installed: not tested"; continue; fi; \
		test -x .venv-$$v/bin/python || python$$v -m venv .venv-$$v || exit 1; \
		.venv-$$v/bin/python -m pip install -q -e ".[dev]" --config-settings editable_mode=strict || exit 1; \
		echo "test-pythons: python$$v"; \
		.venv-$$v/bin/python -m pytest -q -m "not kafka and not spark and not s3" || exit 1; \
		ran="$$ran $$v"; \
	done; test -n "$$ran" || { echo "test-pythons: none of $(PYTHONS) is installed" >&2; exit 1; }; \
	echo "test-pythons: passed on$$ran"

scale-test: install ## a group of 3 watchers over 200 tables: kill, stop, pause, join; prints resume times
	DELTAMIRROR_GROUP_TABLES=$(or $(TABLES),200) DELTAMIRROR_GROUP_SESSION_MS=$(or $(SESSION_MS),10000) \
		$(BIN)/python -m pytest tests/producer/test_group.py -k moves -s -p no:cacheprovider

lint: install ## ruff and mypy, as CI runs them
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy -p deltamirror

format: install ## apply ruff's fixes and formatting
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

fuzz: install ## the full mutation campaign over real tables (SEED=11; failures by class in build/fuzz-report.md)
	$(BIN)/python tests/mutation --size full --seed $(or $(SEED),11) --report build/fuzz-report.md
	DELTAMIRROR_MUTATION_SIZE=full DELTAMIRROR_MUTATION_SEED=$(or $(SEED),11) $(BIN)/python -m pytest tests/core/test_boundary_agreement.py -q -k mutation

chaos: install ## the seeded fault campaign on a local broker (SEED=7, DURATION= s of faults per class); build/chaos-report.md
	$(BIN)/python tests/chaos --seed $(or $(SEED),7) $(if $(DURATION),--duration $(DURATION)) --report build/chaos-report.md

forge: install ## the forged-record campaign: hostile records on a real broker through every consumer (SEED=11; SPARK=1 adds the Spark source; build/forge-report.md)
	$(BIN)/python tests/forge --size full --seed $(or $(SEED),11) $(if $(SPARK),--spark) --report build/forge-report.md

bench: install ## every performance goal beside its peers, 7 rounds (ROUNDS=, ONLY=group); bench/results (about an hour)
	$(BIN)/python bench/run.py $(if $(ROUNDS),--rounds $(ROUNDS)) $(foreach g,$(ONLY),--only $(g))

bench-scale: install ## one group member with 100/1,000 tables idle (CPU, threads, pickup p50/p99; SIZES=100,1000; LAYOUT=shared: one discover prefix with topics: shared; POLL=30: the tables' poll_interval_s) and tables moving after SIGKILL/SIGTERM; bench/results/scale.*
	$(BIN)/python bench/bench_scale.py $(if $(SIZES),--tables $(SIZES)) --rounds $(or $(ROUNDS),1) $(if $(MOVE_TABLES),--move-tables $(MOVE_TABLES)) $(if $(LAYOUT),--layout $(LAYOUT)) $(if $(POLL),--poll-interval $(POLL))

bench-rows: install ## row changes end to end beside the change feed, raw confluent-kafka and (SPARK=1) the Spark job a user would write; memory at 5M rows (ROWS=, MEM_ROWS=, ROUNDS=, SPARK=1)
	$(BIN)/python bench/bench_row_changes.py --rows $(or $(ROWS),1000000) --mem-rows $(or $(MEM_ROWS),5000000) --rounds $(or $(ROUNDS),5) $(if $(SPARK),--spark)

bench-quick: install ## the benchmark harness on tiny inputs, 1 round: a smoke check, never judged by time
	$(BIN)/python bench/run.py --quick

bench-compare: install ## is the working tree slower than BASE (default HEAD)? median of per-round ratios
	$(BIN)/python bench/compare_revisions.py --base $(or $(BASE),HEAD) --rounds $(or $(ROUNDS),7) $(if $(WORKLOAD),--workload $(WORKLOAD))

ci: ## what CI runs: a clean environment, install, lint, the README's commands
	bash .ci/run

clean: ## remove the venv and caches
	rm -rf $(VENV) .venv-3.* build *.egg-info .pytest_cache .mypy_cache .ruff_cache .coverage
