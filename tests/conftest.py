from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _fixed_threads():
    torch.set_num_threads(2)
    yield


@pytest.fixture
def clean_env(monkeypatch):
    """No plugin-selection variables leak in from the caller's shell."""
    for var in ("SAMPLECHAIN_PLUGINS", "SAMPLECHAIN_BLOCK_PLUGINS", "SAMPLECHAIN_STRICT", "SAMPLECHAIN_REGISTRY"):
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


@pytest.fixture(scope="module")
def bench(request):
    """The benchmark script that the test module names in `BENCH` (benchmarks/<BENCH>.py), loaded as a module (the
    benchmarks are scripts, not a package); it and the benchmarks it imports are forgotten after the module."""
    import importlib.util

    name = request.module.BENCH
    before = set(sys.modules)
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses resolve the module's annotations through it
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        for other in {name, *(set(sys.modules) - before)} & {p.stem for p in (ROOT / "benchmarks").glob("*.py")}:
            sys.modules.pop(other, None)


def venv_python() -> str:
    return sys.executable


__all__ = ["ROOT", "venv_python", "os"]
