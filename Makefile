# Two commands for a fresh machine:
#   make run    set up, then run the default simulation (fedveil simulate)
#   make test   set up, then run the test suite
#   make test-fast  the tests that start no process (the inner loop; docs/development.md)
# Setup is idempotent: a virtualenv in .venv, the CPU build of torch pinned
# first (an unpinned torch pulls several GB of CUDA wheels), then fedveil.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH ?= torch==2.13.0
# Where the CPU build of torch comes from when no local wheel (pip's find-links) has it:
# PyPI's Linux torch is the CUDA build (several GB). TORCH_INDEX=https://pypi.org/simple
# for CUDA. torch alone comes from there (--no-deps); its dependencies then from PyPI.
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
STAMP := $(VENV)/.fedveil-installed
FMNIST := /usr/share/datasets/fashion-mnist

.PHONY: run test test-fast setup data browser lint docs bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q --no-index --no-deps "$(TORCH)" 2>/dev/null || \
	  $(PY) -m pip install -q --no-deps "$(TORCH)" --index-url "$(TORCH_INDEX)"
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

# Fashion-MNIST from Debian's package (offline-friendly); elsewhere, an explicit download.
data: $(STAMP)
	@if [ -f "$(FMNIST)/train-images-idx3-ubyte.gz" ] || [ -n "$$FEDVEIL_DATA" ]; then :; \
	elif command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
	  apt-get install -y -qq dataset-fashion-mnist >/dev/null || \
	  (apt-get update -qq && apt-get install -y -qq dataset-fashion-mnist >/dev/null); \
	else $(VENV)/bin/fedveil data download fashion-mnist; fi

# Headless Chromium for the dashboard and privacy-report browser tests (they skip without it).
browser:
	@if command -v chromium >/dev/null || command -v chromium-browser >/dev/null; then :; \
	elif command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
	  (apt-get install -y -qq chromium >/dev/null 2>&1 || \
	   (apt-get update -qq && apt-get install -y -qq chromium >/dev/null 2>&1)) || \
	  echo "chromium could not be installed: browser tests will be skipped"; \
	else echo "no chromium: browser tests will be skipped (apt-get install chromium)"; fi

run: data
	$(VENV)/bin/fedveil simulate

# Three pytest sessions side by side (scripts/test_tiers.sh): the process-starting tests,
# split by directory into two sessions (deployments; the rest, Ray's tests among them),
# wait on processes, and the in-process tier's CPU work fills those waits. --procs-guard:
# a test not marked procs/flower fails if it starts a process (tests/procguard.py).
test: data browser
	scripts/test_tiers.sh $(PY)

# Tests marked neither `procs` nor `flower`: --procs-guard (tests/procguard.py) fails any
# of them that starts a process, so nothing slow hides here.
test-fast: data
	$(PY) -m pytest -q -m "not procs and not flower" --procs-guard --durations=10

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	LINT_IMPORTS=$(abspath $(VENV))/bin/lint-imports .ci/lint-imports

# The documentation site (docs/, mkdocs.yml) into site/; --strict fails on any warning
# (a broken link, a page missing from the nav, an API object that cannot be found).
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 DISABLE_MKDOCS_2_WARNING=true $(VENV)/bin/mkdocs build --strict --quiet

clean:
	rm -rf $(VENV) runs site .pytest_cache
