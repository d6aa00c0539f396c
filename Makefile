# `make demo` and `make test` do all the set-up on a fresh machine (Python 3.11).
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test
BENCH_STAMP := $(VENV)/.installed-bench

.PHONY: demo test lint typecheck warm bench install clean

$(BIN)/python:
	$(PY) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml constraints.txt
	$(BIN)/python -m pip install --quiet -c constraints.txt -e ".[dev]"
	touch $(STAMP)

# The tests also cover the optional PyTorch adapter: the CPU build (constraints.txt pins it).
$(TEST_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet -c constraints.txt -e ".[dev,torch]"
	touch $(TEST_STAMP)

# The benchmarks also compare with FAISS (benchmarks/bench_peers.py; constraints.txt pins it).
$(BENCH_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet -c constraints.txt -e ".[dev,bench]"
	touch $(BENCH_STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/fairpipe demo

lint: $(STAMP)
	$(BIN)/ruff check fairpipe storage flows tests benchmarks
	$(BIN)/ruff format --check fairpipe storage flows tests benchmarks
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy

# Every kernel compiled into numba's cache once, so that no test process compiles it again.
warm: $(STAMP)
	$(BIN)/python -m fairpipe.warm

# The kernels compiled into numba's cache (fairpipe.warm) while the linters run, then two tiers,
# each on two test processes (pytest-xdist; a test file stays on one process): the fast tier
# (units and the commands), then the scenario tier (deployments, the second host, signals,
# hostile campaigns, the documents' examples: tests/conftest.py).
test: $(TEST_STAMP)
	$(MAKE) --no-print-directory -j3 -Otarget warm lint typecheck
	$(BIN)/python -m pytest -q -n 2 --dist loadfile -m "not scenario"
	$(BIN)/python -m pytest -q -n 2 --dist loadfile -m scenario

bench: $(BENCH_STAMP)
	$(BIN)/python benchmarks/bench_lsh.py
	$(BIN)/python benchmarks/bench_peers.py
	$(BIN)/python benchmarks/bench_kmeans.py
	$(BIN)/python benchmarks/bench_summary.py
	$(BIN)/python benchmarks/bench_rerank.py
	$(BIN)/python benchmarks/bench_adf.py
	$(BIN)/python benchmarks/bench_lifecycle.py
	$(BIN)/python benchmarks/bench_flow_overhead.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
