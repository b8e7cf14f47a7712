#!/usr/bin/env bash
# Set-up for a fresh clone: a virtual environment in .venv with the pinned CPU torch, the core and every plugin
# in plugins/ (editable). Idempotent: a second run only re-checks. Needs nothing but the package registries.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${VENV:-.venv}
stamp="$VENV/.samplechain-setup"
want=$(cat pyproject.toml plugins/*/pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check -q "$@"; }
# torch first, pinned: any other torch requirement resolved first would download a multi-GB CUDA build
pip install "torch==2.13.0"
pip install "hatchling>=1.21" editables
args=(-e ".[test]")
for p in plugins/*/; do args+=(-e "$p"); done
pip install --no-build-isolation "${args[@]}"
echo "$want" > "$stamp"
