#!/usr/bin/env bash
# Wheels of every distribution in this checkout into dist/ (DIST=DIR, relative to the checkout, picks another
# folder): the core, each plugins/*/, integrations/llama_cpp and integrations/vllm. Offline and quick: one pip run,
# --no-build-isolation builds with the environment's hatchling (scripts/setup.sh installs it) instead of fetching
# one per wheel, --no-deps builds nothing but ours. The folder's earlier samplechain wheels go first, so it holds
# this checkout's set and no wheel of a plugin since removed. Then `pip install --find-links DIST "samplechain[all]"`
# installs the core with every built-in plugin (docs/plugins.md).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
DIST=${DIST:-dist}
mkdir -p "$DIST"
rm -f "$DIST"/samplechain-*.whl "$DIST"/samplechain_*.whl
"$PY" -m pip wheel -q --disable-pip-version-check --no-deps --no-build-isolation --no-index -w "$DIST" \
  . plugins/*/ integrations/llama_cpp integrations/vllm
echo "$(find "$DIST" -maxdepth 1 -name 'samplechain*.whl' | wc -l) wheels in $DIST"
