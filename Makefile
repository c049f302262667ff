# Two commands for a fresh machine:  `make demo` (runs a small model selection)  and  `make test` (the test suite).
# TORCH_SPEC picks the torch build. The default takes torch==2.13.0 from pip's configured index: on a stock Linux
# pip that is PyPI's CUDA build (several GB; it runs on a CPU too). A CPU-only build, or another CUDA one:
#   make demo TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
#   make demo TORCH_SPEC="torch==2.5.1 --index-url https://download.pytorch.org/whl/cu121"
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin

.PHONY: install demo test test-slow test-min test-cluster soak bench lint clean mutate fuzz docs

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet $(TORCH_SPEC)
	$(BIN)/pip install --quiet -e ".[dev,bench,integrations]"
	touch $@

install: $(VENV)/.installed

demo: install
	$(BIN)/python -m framework demo

# TEST_JOBS pytest-xdist processes, each with its own local Ray cluster (tests/conftest.py); a test file stays on one
# (its module fixtures are shared). TEST_JOBS=0 runs the suite in this process alone.
# The tests run in a random order (pytest-randomly: the files, and the tests within each file), drawn from TEST_SEED,
# which is printed first: `make test TEST_SEED=N` repeats an order.
TEST_JOBS ?= 2
ifndef TEST_SEED
TEST_SEED := $(shell od -An -N4 -tu4 /dev/urandom | tr -d ' ')
endif
PYTEST_ORDER = -p randomly --randomly-seed=$(TEST_SEED)
test: install
	@echo "make test: tests in random order, seed $(TEST_SEED) (repeat this order: make test TEST_SEED=$(TEST_SEED))"
	$(BIN)/python -m pytest -q -n $(TEST_JOBS) --dist loadfile $(PYTEST_ORDER) tests

# The dependency floors (not part of `make test`; CI runs it after): a venv of its own, $(VENV_MIN), with the oldest
# releases pyproject.toml admits (tools/constraints-min.txt pins them; tests/test_dependencies.py keeps the two in
# step), then ruff and a subset of the tests that touches every dependency (about 3 minutes on 2 cores; the first
# install takes about 4 more, from PyPI, and 2.2 GB). torch: TORCH_MIN_SPEC, by default the build `make test` uses;
# PyPI has the floor only as a CUDA build (about 3 GB with its nvidia-* wheels; it runs on the CPU):
#   make test-min TORCH_MIN_SPEC=torch==2.3.0
VENV_MIN ?= .venv-min
TORCH_MIN_SPEC ?= $(TORCH_SPEC)
MIN_CONSTRAINTS := tools/constraints-min.txt
MIN_TESTS ?= tests/test_dependencies.py tests/test_imports.py \
	tests/automl tests/framework/scheduling tests/framework/planner tests/framework/engine tests/framework/store \
	tests/framework/cluster tests/framework/freezing \
	tests/framework/test_trainable.py tests/framework/test_result_ranking.py tests/framework/test_result_pareto.py \
	tests/framework/test_storage.py tests/simulators/test_simulators.py \
	tests/integration/test_security.py tests/integration/test_optuna_search_on_engine.py \
	tests/integration/test_trackers.py \
	tests/integration/test_model_selection.py::test_mop_grid_search_obeys_invariants_and_writes_results \
	tests/integration/test_model_selection.py::test_lr_schedule_and_grad_scaler_hop_checkpoint_and_replay_bit_identically

$(VENV_MIN)/.installed: pyproject.toml Makefile $(MIN_CONSTRAINTS)
	$(PYTHON) -m venv $(VENV_MIN)
	echo '*' > $(VENV_MIN)/.gitignore
	$(VENV_MIN)/bin/pip install --quiet --upgrade pip
	grep -v '^torch==' $(MIN_CONSTRAINTS) > $(VENV_MIN)/constraints.txt
	$(VENV_MIN)/bin/pip install --quiet -c $(VENV_MIN)/constraints.txt $(TORCH_MIN_SPEC)
	$(VENV_MIN)/bin/pip install --quiet -c $(VENV_MIN)/constraints.txt -e ".[dev]"
	touch $@

test-min: $(VENV_MIN)/.installed
	$(VENV_MIN)/bin/pip install --quiet -c $(VENV_MIN)/constraints.txt $(TORCH_MIN_SPEC)
	$(VENV_MIN)/bin/python tools/check_min_versions.py $(MIN_CONSTRAINTS)
	$(VENV_MIN)/bin/ruff check framework automl simulators experiments tests benchmarks examples
	@echo "make test-min: tests in random order, seed $(TEST_SEED) (repeat this order: make test-min TEST_SEED=$(TEST_SEED))"
	$(VENV_MIN)/bin/python -m pytest -q -p no:cacheprovider $(PYTEST_ORDER) $(MIN_TESTS)

# a user's cluster workflow end to end (ray start, ray job submit, a node joining); about a minute, not in `test`
# the slow tests (marked `slow`: Ray clusters and drivers of their own, whole benchmark scripts); CI runs them after
# `make test`, in the same random order scheme
test-slow: install
	@echo "make test-slow: tests in random order, seed $(TEST_SEED) (repeat this order: make test-slow TEST_SEED=$(TEST_SEED))"
	$(BIN)/python -m pytest -q -n $(TEST_JOBS) --dist loadfile $(PYTEST_ORDER) -m slow tests

test-cluster: install
	$(BIN)/python -m pytest -q -m cluster tests/cluster

# A chaos soak (experiments/soak.py; not part of `make test`): one ASHA run of at least 20 minutes on a Ray head and a
# second node of its own, a worker SIGKILLed every 2 s on average, the driver SIGKILLed and resumed 5 times, the node
# joining and leaving, commands throughout; it fails when a unit is lost or counted twice or the run does not verify.
# SOAK_ARGS passes its options: make soak SOAK_ARGS="--minutes 60"  (--help lists them)
SOAK_ARGS ?=
soak: install
	$(BIN)/python experiments/soak.py $(SOAK_ARGS)

# the run-directory fuzz test (edited rows and files of a finished and a crashed run) with FUZZ_EXAMPLES random cases
# per run instead of the 100 fixed ones each of `make test` runs
FUZZ_EXAMPLES ?= 2000
fuzz: install
	MODELHOPPER_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(BIN)/python -m pytest -q tests/integration/test_run_integrity.py -k fuzz

# the docs site (docs/, Sphinx with MyST Markdown and the PyData theme) into docs/_build/html; offline once the
# `docs` extra is installed; a warning (a broken link, a docstring Sphinx cannot read) fails the build. It runs every
# program in examples/ for the gallery (about 2 minutes in all on 2 cores; MODELHOPPER_DOCS_RUN_EXAMPLES=0 leaves
# them out) and writes the API's object pages and the gallery into docs/api/generated/ and docs/examples/ (ignored)
$(VENV)/.docs-installed: $(VENV)/.installed
	$(BIN)/pip install --quiet -e ".[docs]"
	touch $@

docs: $(VENV)/.docs-installed
	$(BIN)/sphinx-build -E -W --keep-going -q -b html docs docs/_build/html
	@echo "docs: open docs/_build/html/index.html"

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
	$(BIN)/ruff check framework automl simulators experiments tests benchmarks examples

clean:
	rm -rf $(VENV) $(VENV_MIN) runs results .pytest_cache .benchmarks docs/_build docs/api/generated docs/examples docs/sg_execution_times.rst
