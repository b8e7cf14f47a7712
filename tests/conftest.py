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


def venv_python() -> str:
    return sys.executable


__all__ = ["ROOT", "venv_python", "os"]
