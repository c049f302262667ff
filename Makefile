# Two commands for a fresh machine:  `make demo` (runs a small model selection)  and  `make test` (the test suite).
# TORCH_SPEC picks the torch build: the default is the CPU build; GPU users run e.g.
#   make demo TORCH_SPEC="torch==2.5.1 --index-url https://download.pytorch.org/whl/cu121"
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin

.PHONY: install demo test test-cluster bench lint clean mutate fuzz

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet $(TORCH_SPEC)
	$(BIN)/pip install --quiet -e ".[dev,bench]"
	touch $@

install: $(VENV)/.installed

demo: install
	$(BIN)/python -m framework demo

test: install
	$(BIN)/python -m pytest -q tests

# a user's cluster workflow end to end (ray start, ray job submit, a node joining); about a minute, not in `test`
test-cluster: install
	$(BIN)/python -m pytest -q -m cluster tests/cluster

# the run-directory fuzz test (edited rows and files of a finished and a crashed run) with FUZZ_EXAMPLES random cases
# per run instead of the 100 fixed ones each of `make test` runs
FUZZ_EXAMPLES ?= 2000
fuzz: install
	MODELHOPPER_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(BIN)/python -m pytest -q tests/integration/test_run_integrity.py -k fuzz

bench: install
	$(BIN)/python -m pytest -q benchmarks --benchmark-only

# Mutation testing of the pure packages (not part of `make test`): a score per package at the end; the scope and
# the tests that may kill a mutant are [tool.mutmut] in pyproject.toml. `make mutate PKG=automl` runs one package.
PKG ?=
MUTATE_JOBS ?= 2
$(VENV)/.mutate-installed: $(VENV)/.installed
	$(BIN)/pip install --quiet -e ".[dev,bench,mutate]"
	touch $@

mutate: $(VENV)/.mutate-installed
	$(BIN)/python tools/mutation_score.py --jobs $(MUTATE_JOBS) $(if $(PKG),--pkg "$(PKG)")

lint: install
	$(BIN)/ruff check framework automl simulators experiments tests benchmarks

clean:
	rm -rf $(VENV) runs results .pytest_cache .benchmarks
