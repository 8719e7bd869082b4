# tether developer tasks. Only python3 (>= 3.11) is needed: every target that runs
# code first creates .venv and installs the package with its dev extras.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

# Lint targets: only the folders that exist (bench/ may still be empty).
LINT_PATHS := $(wildcard src tests bench)

FIXTURES := tests/conformance/fixtures
PLANNER := tests/conformance/planner-fixtures
DEMO_DIR := build/demo
TETHER := $(BIN)/tether

.PHONY: help .venv test lint demo bench clean distclean

help:
	@echo "make demo       inspect bundled sample sessions and plan their recovery"
	@echo "make test       ruff, mypy (strict) and the pytest suite"
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

test: .venv
	$(BIN)/ruff check $(LINT_PATHS)
	$(BIN)/mypy
	$(BIN)/pytest -q

lint: .venv
	$(BIN)/ruff check $(LINT_PATHS)
	$(BIN)/ruff format --check $(LINT_PATHS)

# --------------------------------------------------------------------------- demo
# Until the crash lab exists, the demo walks through bundled conformance sessions.

demo: .venv
	@mkdir -p $(DEMO_DIR)
	@echo "== a finished run: prompt, one tool call, answer"
	@echo "$$ tether inspect $(FIXTURES)/completed-tool-run.jsonl"
	@$(TETHER) inspect $(FIXTURES)/completed-tool-run.jsonl
	@echo
	@echo "== a crash while a replay-safe tool was running"
	@echo "$$ tether inspect $(FIXTURES)/pending-safe-tool.jsonl"
	@$(TETHER) inspect $(FIXTURES)/pending-safe-tool.jsonl
	@echo
	@echo "== a torn tail: the last append never finished"
	@echo "$$ tether inspect $(FIXTURES)/torn-tail.jsonl"
	@$(TETHER) inspect $(FIXTURES)/torn-tail.jsonl
	@echo
	@echo "== a corrupt log is refused with one line and exit status 1"
	@echo "$$ tether inspect $(FIXTURES)/overlapping-step.jsonl"
	@$(TETHER) inspect $(FIXTURES)/overlapping-step.jsonl || echo "(exit status $$?)"
	@echo
	@echo "== recovery plans: what a writer would do next"
	@for case in retry-attempt replay-safe-tool configuration-changed; do \
		$(BIN)/python -c 'import json, sys; case = json.load(open(sys.argv[1])); \
			json.dump(case["current"], open(sys.argv[2], "w")); print(case["sessionFile"])' \
			$(PLANNER)/$$case.json $(DEMO_DIR)/$$case.current.json > $(DEMO_DIR)/$$case.session \
			|| exit 1; \
		session=$$(cat $(DEMO_DIR)/$$case.session); \
		echo "$$ tether plan $(FIXTURES)/$$session --current $(DEMO_DIR)/$$case.current.json"; \
		$(TETHER) plan $(FIXTURES)/$$session --current $(DEMO_DIR)/$$case.current.json || exit 1; \
	done

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
