# The two commands of the README: `make demo` (a real sweep on the embedded defaults) and
# `make test`. Each creates or reuses .venv and installs what changed; a no-op takes seconds.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# CPU build by default (it lies on the CI machine's disk). GPU users: see README "GPU install".
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX ?=
# pip installs torch (it finds the CPU build on this disk, or TORCH_INDEX's build) and uv; uv
# installs the rest from requirements.lock: the versions constraints.txt pins, each file checked
# against its hash, from the index pip is set to (deploy/uv_pip.py hands pip's index settings to
# uv), in a tenth of pip's time. INSTALLER=pip installs the rest with pip, from the same lock.
# Nothing is byte-compiled at install: see PYTHONDONTWRITEBYTECODE below.
INSTALLER ?= uv
PIP_INSTALL := $(BIN)/python -m pip -q --disable-pip-version-check install --no-compile
REST_INSTALL := $(if $(filter uv,$(INSTALLER)),$(BIN)/python deploy/uv_pip.py install -q --python $(BIN)/python,$(PIP_INSTALL))
# Left out of the lock: torch and the CUDA stack its GPU builds bring, which the torch step installs
# (the CPU build on this disk is a local wheel, whose hash no index lists).
TORCH_STACK := torch triton cuda-bindings cuda-pathfinder cuda-toolkit nvidia-cublas nvidia-cuda-cupti \
	nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand \
	nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-nccl-cu13 nvidia-nvjitlink \
	nvidia-nvshmem-cu13 nvidia-nvtx
# make test runs whole test files on this many processes (pytest-xdist); 0 runs them in one.
# Files go out in collection order (the integration files, minutes each, first; the many short
# unit files last, to even out the processes' ends), not xdist's most-tests-first.
TEST_WORKERS ?= 2

# Python writes each module's bytecode on its first import, for every later process; a shell
# with PYTHONDONTWRITEBYTECODE set would have every process (each trial, each Ray worker)
# compile its imports again: about 30 CPU-seconds for a trial's instead of 12.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: demo test setup test-services clean lock

$(STAMP): pyproject.toml constraints.txt requirements.lock
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP_INSTALL) $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) "$(TORCH_SPEC)"
	$(if $(filter uv,$(INSTALLER)),$(PIP_INSTALL) -c constraints.txt uv)
	$(REST_INSTALL) --require-hashes --no-deps -r requirements.lock
	$(REST_INSTALL) --no-deps -e .
	touch $(STAMP)

# requirements.lock from constraints.txt (after changing a pin): every file's hash, for every
# platform and Python the pins allow, without the torch stack.
lock:
	$(BIN)/uv pip compile -q pyproject.toml --extra dev --extra hf -c constraints.txt --universal \
		--python-version 3.11 --generate-hashes --custom-compile-command "make lock" \
		$(addprefix --no-emit-package ,$(TORCH_STACK)) -o requirements.lock

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
