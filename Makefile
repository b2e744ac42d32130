# The two commands of the README: `make demo` (a real sweep on the embedded defaults) and
# `make test`. Each creates or reuses .venv and installs what changed; a no-op takes seconds.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# CPU build by default (it lies on the CI machine's disk). GPU users: see README "GPU install".
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX ?=
# pip installs without byte-compiling (it would compile one file after another), then compileall
# compiles the environment on every core; a file it cannot compile (a test module of torch's in
# newer syntax) is compiled by nothing and never imported, as under pip.
PIP_INSTALL := $(BIN)/python -m pip -q --disable-pip-version-check install --no-compile
COMPILE := $(BIN)/python -m compileall -qq -j 0 $(VENV)/lib
# make test runs whole test files on this many processes (pytest-xdist); 0 runs them in one.
# Files go out in collection order (the integration files, minutes each, first; the many short
# unit files last, to even out the processes' ends), not xdist's most-tests-first.
TEST_WORKERS ?= 2

.PHONY: demo test setup test-services clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP_INSTALL) $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) "$(TORCH_SPEC)"
	$(PIP_INSTALL) -c constraints.txt -e ".[dev,hf]"
	$(COMPILE) || true
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/orchestrator sweep conf/sweep/demo.yaml

# System services the integration tests use (PostgreSQL for the MLflow server test, Chromium
# for the UI check); Debian packages, installed once.
test-services:
	@bash tests/setup_services.sh

# Formatting and lint first (pyproject.toml [tool.ruff]): a failing check fails the run.
test: $(STAMP) test-services
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

clean:
	rm -rf $(VENV) .cache runs mlflow.db mlartifacts reports
