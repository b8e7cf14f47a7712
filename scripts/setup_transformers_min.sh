#!/usr/bin/env bash
# A second, small virtual environment (.venv-tf-min) with the LOWEST transformers samplechain supports: the lower
# bound of `transformers>=` in pyproject.toml, exactly. Otherwise what scripts/setup.sh installs (it does the work:
# the pinned CPU torch, the core and every plugin, editable). `make test-transformers-min` (part of `make test`)
# runs the transformers parity tests (marker transformers_parity, see conftest.py) in it, so both ends of the
# supported range are tested. It also pins the lowest triton of the cuda plugin's `triton` extra
# (plugins/cuda/pyproject.toml), under which the Triton kernel tests run there too. Idempotent: a second run only
# re-checks. Needs nothing but the package registries.
#
#   scripts/setup_transformers_min.sh            set up (or re-check) the environment
#   scripts/setup_transformers_min.sh --version  print the transformers version it installs, and stop
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${TF_MIN_VENV:-.venv-tf-min}
tf_min=$(sed -n 's/^ *"transformers>=\([0-9][0-9.]*\)[,"].*/\1/p' pyproject.toml)
if [ -z "$tf_min" ]; then
  echo "setup_transformers_min.sh: no \"transformers>=X\" dependency in pyproject.toml" >&2
  exit 1
fi
triton_min=$(sed -n 's/^triton = \["triton>=\([0-9][0-9.]*\)".*/\1/p' plugins/cuda/pyproject.toml)
if [ -z "$triton_min" ]; then
  echo "setup_transformers_min.sh: no triton = [\"triton>=X\"] extra in plugins/cuda/pyproject.toml" >&2
  exit 1
fi
if [ "${1:-}" = "--version" ]; then
  echo "$tf_min"
  exit 0
fi
VENV="$VENV" PINS="transformers==$tf_min triton==$triton_min" ./scripts/setup.sh
"$VENV/bin/python" -c "
import torch, transformers, triton
assert transformers.__version__ == '$tf_min', transformers.__version__
assert triton.__version__ == '$triton_min', triton.__version__
assert torch.__version__.startswith('2.13.0'), torch.__version__"
