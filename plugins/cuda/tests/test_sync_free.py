"""A step that never waits for the host (docs/backends.md, "cuda"), checked without a GPU: the cuda
backend's step runs on CPU tensors (`CudaBackend(device="cpu")`) under `samplechain.tools.testing.no_host_sync`, which
fails on every host read (`.item()`, `bool(tensor)`, `nonzero`, `.tolist()`, ...), and draws the cpu backend's
tokens. Checks that need the host are deferred to a device flag (`SampleOutput.check`): the error still names the
request, and a failed step changes no state. With a GPU (marked `gpu`): the same chains under torch's sync debug
mode "error"."""

from __future__ import annotations

import pytest
import torch

import samplechain_cuda as cuda
from samplechain import Chain, SamplingError
from samplechain.tools.testing import HostSyncError, no_host_sync

VOCAB = 20000
SYNC_FREE_CHAINS = {
    "greedy": {"samplers": [{"use": "greedy"}]},
    "dist": {"samplers": [{"use": "dist", "seed": 11}]},
    "temperature": {"samplers": [{"use": "temperature", "t": 0.7}, {"use": "dist", "seed": 12}]},
    "top_k": {"samplers": [{"use": "top_k", "k": 40}, {"use": "dist", "seed": 13}]},
    "top_p": {"samplers": [{"use": "top_p", "p": 0.9}, {"use": "dist", "seed": 14}]},
    "min_p": {"samplers": [{"use": "min_p", "p": 0.05}, {"use": "dist", "seed": 15}]},
    "min_p min_keep": {"samplers": [{"use": "min_p", "p": 0.3, "min_keep": 5}, {"use": "dist", "seed": 15}]},
    "top_k top_p min_p": {
        "samplers": [
            {"use": "temperature", "t": 0.8},
            {"use": "top_k", "k": 40},
            {"use": "top_p", "p": 0.9},
            {"use": "min_p", "p": 0.02},
            {"use": "dist", "seed": 16},
        ]
    },
    "penalties": {
        "samplers": [
            {"use": "penalties", "repeat": 1.3, "frequency": 0.2, "presence": 0.1},
            {"use": "top_k", "k": 50},
            {"use": "dist", "seed": 17},
        ]
    },
    "logit_bias": {"samplers": [{"use": "logit_bias", "bias": {"5": 30.0, "7": -100.0}}, {"use": "greedy"}]},
    "typical": {"samplers": [{"use": "typical", "p": 0.9}, {"use": "dist", "seed": 18}]},
    "top_n_sigma": {"samplers": [{"use": "top_n_sigma", "n": 1.5}, {"use": "dist", "seed": 19}]},
    "top_n_sigma min_keep": {
        "samplers": [{"use": "top_n_sigma", "n": 0.5, "min_keep": 4}, {"use": "dist", "seed": 19}]
    },
    "xtc": {
        "samplers": [
            {"use": "top_k", "k": 60},
            {"use": "xtc", "probability": 0.7, "threshold": 0.02},
            {"use": "dist", "seed": 20},
        ]
    },
    "xtc wide": {"samplers": [{"use": "xtc", "probability": 0.7, "threshold": 0.001}, {"use": "dist", "seed": 20}]},
    "llama.cpp": "preset:llama.cpp",
    "transformers": "preset:transformers",
    "vllm": "preset:vllm",
    "text-generation-webui": "preset:text-generation-webui",
}


def _chain(config, backend=None) -> Chain:
    chain = Chain.load(config)
    if backend is not None:
        chain._backends["cpu"] = backend  # the cuda backend's logic on CPU tensors (no GPU here)
    return chain


def _seeded_rows(store, batch: int) -> list[str]:
    """Adds `batch` requests to the store and returns their ids: seeded where the chain takes a seed (the presets'
    dist is unseeded otherwise, and two stores would draw apart)."""
    ids = [f"r{i}" for i in range(batch)]
    if "seed" in store.layout.aliases:
        for i, rid in enumerate(ids):
            store.add(rid, {"seed": 1000 + i})
    else:
        store.add_many(ids)
    return ids


def _steps(chain: Chain, logits: torch.Tensor, steps: int, guard: bool) -> list[torch.Tensor]:
    batch = logits.shape[0]
    store = chain.new_store(capacity=batch)
    ids = _seeded_rows(store, batch)
    g = torch.Generator().manual_seed(5)
    history = torch.randint(0, VOCAB, (batch, 24), generator=g)
    out = []
    for step in range(steps):
        kwargs = {"history": history} if chain.needs_history else {}
        x = logits + step * 0.01
        if guard and step:  # the first step of a batch may set up on the host (caches, the composition)
            with no_host_sync():
                result = chain.sample(x, store, ids, **kwargs)
            result.check()
        else:
            result = chain.sample(x, store, ids, **kwargs)
        out.append(result.token_ids)
        history = torch.cat([history, result.token_ids[:, None]], dim=1)
    return out


@pytest.mark.parametrize("rounding", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", list(SYNC_FREE_CHAINS))
def test_the_cuda_step_reads_nothing_on_the_host_and_draws_the_cpu_tokens(name, rounding):
    g = torch.Generator().manual_seed(len(name))
    logits = torch.randn(5, VOCAB, generator=g) * 3
    if rounding == "bfloat16":
        logits = logits.bfloat16().float()  # ties at the cut in most rows
    ours = _steps(_chain(SYNC_FREE_CHAINS[name], cuda.CudaBackend(device="cpu")), logits, 4, guard=True)
    ref = _steps(_chain(SYNC_FREE_CHAINS[name]), logits, 4, guard=False)
    for a, b in zip(ours, ref):
        assert torch.equal(a, b)


def test_the_guard_catches_host_reads():
    x = torch.arange(6.0)
    for read in (
        lambda: x.sum().item(),
        lambda: bool(x.any()),
        lambda: int(x.max()),
        lambda: x.nonzero(),
        lambda: x.tolist(),
        lambda: x.numpy(),
        lambda: torch.masked_select(x, x > 2),
    ):
        with pytest.raises(HostSyncError), no_host_sync():
            read()
    assert x.tolist() == [0, 1, 2, 3, 4, 5]  # restored on the way out


def test_a_deferred_failure_names_the_request_and_changes_no_state():
    chain = _chain(
        {"samplers": [{"use": "penalties", "repeat": 1.3}, {"use": "dist", "seed": 3}]}, cuda.CudaBackend(device="cpu")
    )
    store = chain.new_store(capacity=3)
    store.add_many(["a", "b", "c"])
    logits = torch.randn(3, 1000)
    history = torch.randint(0, 1000, (3, 8))
    chain.sample(logits, store, ["a", "b", "c"], history=history).check()
    before = store.snapshot()
    logits[1, 17] = float("nan")
    store.batch(["a", "b", "c"])
    with no_host_sync():  # the step itself does not look: the flag is read by check()
        out = chain.sample(logits, store, ["a", "b", "c"], history=history)
    with pytest.raises(SamplingError, match=r"'b'.*NaN"):
        out.check()
    assert store.snapshot() == before  # no position moved, in any row


def test_the_deferred_check_of_a_good_step_passes():
    chain = _chain({"samplers": [{"use": "dist", "seed": 1}]}, cuda.CudaBackend(device="cpu"))
    out = chain.sample(torch.randn(2, 100))
    assert out.check() is out


HAS_CUDA = torch.cuda.is_available()


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("name", list(SYNC_FREE_CHAINS))
def test_on_a_gpu_no_step_synchronises(name):
    chain = Chain.load(SYNC_FREE_CHAINS[name])
    logits = (torch.randn(8, VOCAB) * 3).cuda()
    store = chain.new_store(device="cuda", capacity=8)
    ids = _seeded_rows(store, 8)
    kwargs = {"history": torch.randint(0, VOCAB, (8, 24), device="cuda")} if chain.needs_history else {}
    chain.sample(logits, store, ids, **kwargs).check()  # warm-up: lazy initialisation may synchronise
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = chain.sample(logits, store, ids, **kwargs)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    ref = Chain.load(SYNC_FREE_CHAINS[name])
    ref_store = ref.new_store(capacity=8)
    _seeded_rows(ref_store, 8)
    ref_kwargs = {k: v.cpu() for k, v in kwargs.items()}
    ref.sample(logits.cpu(), ref_store, ids, **ref_kwargs)
    assert torch.equal(out.check().token_ids.cpu(), ref.sample(logits.cpu(), ref_store, ids, **ref_kwargs).token_ids)
