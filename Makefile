# tether developer tasks. Only python3 (>= 3.11) is needed: every target that runs
# code first creates .venv and installs the package with its dev extras.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

# Lint targets: only the folders that exist (bench/ may still be empty).
LINT_PATHS := $(wildcard src tests bench)

.PHONY: help .venv test lint demo crashlab bench clean distclean

help:
	@echo "make demo       one agent crashed and recovered, then a sample of the crash lab (< 2 min)"
	@echo "make crashlab   the whole crash lab: every scenario at every boundary and hit (minutes)"
	@echo "make test       ruff, mypy (strict) and the pytest suite (on every core)"
	@echo "make lint       ruff check + ruff format --check"
	@echo "make bench      run bench/bench_*.py"
	@echo "make clean      remove caches and build output (keeps .venv)"
	@echo "make distclean  clean, and remove .venv"

# --------------------------------------------------------------------------- venv

.venv: $(STAMP)

# Re-installs whenever pyproject.toml changes (the stamp is older than it).
$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { \
		echo "error: tether needs Python >= 3.11; '$(PYTHON)' is $$($(PYTHON) -V 2>&1)." >&2; \
		echo "       Run e.g. 'make PYTHON=python3.11 $(MAKECMDGOALS)'." >&2; \
		exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# --------------------------------------------------------------------------- checks

# The suite on every core, then the tests marked serial alone: they stop a service that the
# others share (the PostgreSQL restart test). Not xdist_group/--dist loadgroup: with pytest 9
# pytest-xdist 3.8's group suffix never reaches the node ids, so groups are split anyway.
test: .venv
	$(BIN)/ruff check $(LINT_PATHS)
	$(BIN)/mypy
	$(BIN)/pytest -q -n auto -m 'not serial'
	$(BIN)/pytest -q -m serial

lint: .venv
	$(BIN)/ruff check $(LINT_PATHS)
	$(BIN)/ruff format --check $(LINT_PATHS)

# --------------------------------------------------------------------------- demo
# The story, then the proof (src/tether/testing/demo.py): one agent killed at after_effect
# and recovered from the ledger (timeline, one ledger row); then a representative sample of
# the crash lab (every boundary at least once, before/after an effect in every scenario; about
# 40 s on 2 cores) kills scripted agent runs, recovers, counts effects (docs/crashlab.md),
# with its columns explained. The last line is PASS duplicate_effects=0 scenarios=S … runs=R.
# `make crashlab` runs the whole matrix: every scenario at every boundary and every hit.

demo: .venv
	$(BIN)/python -m tether.testing.demo

crashlab: .venv
	$(BIN)/python -m tether crashlab

# --------------------------------------------------------------------------- bench

bench: .venv
	@for f in bench/bench_*.py; do \
		[ -e "$$f" ] || { echo "no bench/bench_*.py scripts yet"; break; }; \
		echo "== $$f"; \
		$(BIN)/python $$f || exit 1; \
	done

# --------------------------------------------------------------------------- cleanup

clean:
	rm -rf build dist .pytest_cache .mypy_cache .ruff_cache .hypothesis src/*.egg-info
	find . -path ./$(VENV) -prune -o -type d -name __pycache__ -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
