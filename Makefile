# One entry point for people and CI. `make demo` and `make test` are the README's two commands.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip
STAMP  := $(VENV)/.installed

.PHONY: install demo test test-fast test-kafka test-spark lint format bench ci clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip setuptools wheel
	$(PIP) install -q -e ".[spark,dev]" --config-settings editable_mode=strict
	touch $(STAMP)

install: $(STAMP)
	@# strict editable installs link files: pick up modules added since the last install
	$(PIP) install -q --no-deps -e . --config-settings editable_mode=strict

demo: install
	$(BIN)/deltamirror demo

test: install
	$(BIN)/python -m pytest

test-fast: install
	$(BIN)/python -m pytest -m "not kafka and not spark"

test-kafka: install
	$(BIN)/python -m pytest -m kafka

test-spark: install
	$(BIN)/python -m pytest -m spark

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy -p deltamirror.core -p deltamirror.producer -p deltamirror.consumer -p deltamirror.cli

format: install
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

bench: install
	$(BIN)/python bench/bench_snapshot.py
	$(BIN)/python bench/bench_changes.py
	$(BIN)/python bench/bench_producer.py

ci: install lint test

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
