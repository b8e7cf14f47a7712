#!/usr/bin/env bash
# llama-cpp-python in the main virtual environment (.venv), for the llama.cpp runner, the llama.cpp sampler adapter
# and their tests (marker llama_cpp). It has no wheels on the registry: pip builds it from its sdist (about 7 minutes
# on 2 cores) and keeps the built wheel in its cache, so a later set-up on the same machine installs in seconds.
# Idempotent: a second run only re-checks. Runs after scripts/setup.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
VERSION=0.3.36
if ! "$VENV/bin/python" -c "import llama_cpp, sys; sys.exit(llama_cpp.__version__ != '$VERSION')" 2>/dev/null; then
  echo "building llama-cpp-python $VERSION from its sdist (once per machine; pip caches the wheel)" >&2
  # the CPU build: no examples, tools or tests, every core for the compiler
  CMAKE_ARGS="${CMAKE_ARGS:-} -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=OFF" \
    CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)} \
    "$VENV/bin/python" -m pip --disable-pip-version-check -q install "llama-cpp-python==$VERSION"
fi
