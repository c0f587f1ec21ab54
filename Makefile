# pdwarden — the two commands a newcomer needs are `make demo` and `make test`.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
PDW := $(VENV)/bin/pdwarden
# Caches outside the checkout (Go binaries, tool downloads), keyed by pinned versions.
export PDWARDEN_CACHE ?= $(HOME)/.cache/pdwarden
export PIP_CACHE_DIR ?= $(HOME)/.cache/pip
# The environment is installed by uv (pinned below, pip's interface): it keeps every wheel
# unpacked in its cache and links it into .venv, so a fresh checkout's install takes well under
# a minute, where pip unpacked each wheel again for about four. uv reads its own variables, not
# pip's: a machine's index, local wheels and CA certificates set for pip carry over.
export UV_CACHE_DIR ?= $(HOME)/.cache/uv
export UV_SYSTEM_CERTS ?= 1
ifneq ($(PIP_INDEX_URL),)
export UV_DEFAULT_INDEX ?= $(PIP_INDEX_URL)
endif
ifneq ($(PIP_FIND_LINKS),)
export UV_FIND_LINKS ?= $(PIP_FIND_LINKS)
endif
UV_VERSION := 0.13.9
# mypy's own cache (it checks each module's hash and its version): a fresh checkout's type
# check takes seconds instead of most of a minute.
export MYPY_CACHE_DIR ?= $(PDWARDEN_CACHE)/mypy
ARGS ?=

.PHONY: setup tools binaries test test-fast test-durations test-unit test-integration test-e2e lint demo clean crds

# The four distributions, editable: core (the command and the contract), the operator, the
# runtime with its engines, and the development tools with the test tools (pyproject.toml).
DISTRIBUTIONS := -e ./core -e ./operator -e './runtime[engines]' -e '.[test]'

$(VENV)/.installed: pyproject.toml core/pyproject.toml operator/pyproject.toml runtime/pyproject.toml constraints.txt
	@test -x $(VENV)/bin/python || $(PY) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip==26.3 setuptools==84.2.1 wheel==0.48.0 uv==$(UV_VERSION)
	@# the one distribution of earlier checkouts (its packages now live in the four)
	@$(VENV)/bin/pip uninstall -q -y pdwarden >/dev/null 2>&1 || true
	@# bytecode compiled now: the pods' processes run from .venv and cannot write it
	$(VENV)/bin/uv pip install -q --python $(VENV)/bin/python --compile-bytecode -c constraints.txt $(DISTRIBUTIONS)
	@touch $@

setup: $(VENV)/.installed tools

tools: $(VENV)/.installed
	$(VENV)/bin/python -m pdwarden_localcluster.tools install

# The local cluster's components and its monitoring stack, built from Go modules into the cache
# (keyed by their sources and pins; a hit costs a stat). A cold build takes minutes on every
# core: done here, before pytest, so that no test's time limit is spent on it.
binaries: setup
	$(VENV)/bin/python -m pdwarden_localcluster.build

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# Test processes side by side (pytest-xdist; a module's tests stay on one worker, and the
# `exclusive` ones run alone, `cluster_exclusive` ones beside no other e2e module: tests/conftest.py).
# TEST_WORKERS=0 runs everything in one process.
TEST_WORKERS ?= 2
PYTEST_PARALLEL := $(if $(filter 0,$(TEST_WORKERS)),-p no:xdist,-n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder)

# Every test, the multi-minute safety scenarios (marked `slow`) included, in a random order
# (pytest-randomly prints its seed; ARGS=--randomly-seed=N repeats an order).
test: setup binaries
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/python -m pytest -p no:cacheprovider -p randomly $(PYTEST_PARALLEL) --durations=25 $(ARGS)

# The inner loop: everything but the `slow` scenarios.
test-fast: setup binaries
	$(VENV)/bin/python -m pytest -p no:cacheprovider -p randomly $(PYTEST_PARALLEL) -m "not slow" $(ARGS)

# Refresh tests/support/module_durations.json (the queue's order: docs/development.md) from whole
# runs' reports, the least of them: make test-durations JUNIT="run1.xml run2.xml", each written by
# make test ARGS=--junitxml=run1.xml.
test-durations: setup
	@test -n "$(JUNIT)" || { echo 'make test-durations: JUNIT="run1.xml ...", the --junitxml of whole runs (make test ARGS=--junitxml=run1.xml)' >&2; exit 2; }
	$(VENV)/bin/python -m tests.support.module_durations $(JUNIT)

test-unit: setup
	$(VENV)/bin/python -m pytest -m unit

test-integration: setup
	$(VENV)/bin/python -m pytest -m integration

test-e2e: setup binaries
	$(VENV)/bin/python -m pytest -m e2e

crds: $(VENV)/.installed
	$(PDW) crd --write

demo: setup
	$(PDW) demo $(ARGS)

clean:
	-$(PDW) cluster down
	rm -rf $(VENV) build *.egg-info
