# The two commands of the README: `make run` (the main job) and `make test` (the test suite).
# Both do the whole set-up first (scripts/setup.sh: .venv with the pinned CPU torch, the core, every plugin).
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup run test test-fast bench
setup:
	./scripts/setup.sh

PROMPT ?= In Python, a list is

run: setup
	$(VENV)/bin/samplechain generate "$(PROMPT)" --seed 7

test: setup
	SAMPLECHAIN_STRICT=1 $(PY) -m pytest -q

test-fast: setup
	SAMPLECHAIN_STRICT=1 $(PY) -m pytest -q -m "not slow"

bench: setup
	$(PY) benchmarks/bench_chain.py
	$(PY) benchmarks/bench_generate.py --markdown
	$(PY) benchmarks/bench_presets.py --markdown
	$(PY) benchmarks/bench_targets.py --markdown
	$(PY) benchmarks/bench_samplers.py --markdown
