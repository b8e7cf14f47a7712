"""The executor's dispatch of a chain's tail to the cuda backend's fused truncate-and-draw kernel (FUSED_SAMPLE,
samplechain_cuda_kernels.sample): which tails go to it (`FusedPart`s in chain order), and that a fused step draws the
cpu backend's tokens, bit for bit, with its logprobs. Without a GPU the kernel runs on CPU tensors under triton's
interpreter (conftest.py sets TRITON_INTERPRET=1; `CudaBackend(device="cpu", triton=True)`); with one, on CUDA."""

from __future__ import annotations

import importlib.util

import pytest
import torch

import samplechain_cuda as cuda
from samplechain import FUSED_SAMPLE, Chain, FusedPart
from samplechain.tools.testing import cut_logits, no_host_sync

HAS_TRITON = importlib.util.find_spec("triton") is not None
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
VOCAB = 3000
BATCH = 8

# name -> (chain, per-request parameters of its 6 rows or None, the kinds the kernel gets, or None: not fused)
FUSED = {
    "vllm order": (
        {
            "samplers": [
                {"use": "temperature", "t": 0.7},
                {"use": "top_k", "k": 40},
                {"use": "top_p", "p": 0.9},
                {"use": "dist", "seed": 3},
            ]
        },
        None,
        ["temperature", "top_k", "top_p"],
    ),
    "llama.cpp order": (
        {
            "samplers": [
                {"use": "top_k", "k": 40},
                {"use": "top_p", "p": 0.95},
                {"use": "min_p", "p": 0.05},
                {"use": "temperature", "t": 0.8},
                {"use": "dist", "seed": 4},
            ]
        },
        None,
        ["top_k", "top_p", "min_p", "temperature"],
    ),
    "per-row": (
        {
            "samplers": [
                {"use": "temperature", "t": 1.0},
                {"use": "top_k", "k": 0},
                {"use": "top_p", "p": 1.0},
                {"use": "min_p", "p": 0.0},
                {"use": "dist"},
            ]
        },
        [
            {"temperature": t, "top_k": k, "top_p": p, "min_p": m, "seed": 50 + i}
            for i, (t, k, p, m) in enumerate(
                [
                    (0.7, 40, 0.9, 0.0),
                    (1.0, 0, 0.5, 0.1),
                    (0.0, 20, 1.0, 0.0),
                    (1.3, 5, 0.95, 0.02),
                    (0.9, 0, 1.0, 0.3),
                    (1.0, 100, 0.8, 0.0),
                    (0.6, 3, 0.99, 0.05),
                    (2.0, 0, 0.7, 0.0),
                ]
            )
        ],
        ["temperature", "top_k", "top_p", "min_p"],
    ),
    "temperature last, per row, some 0": (
        {"samplers": [{"use": "top_k", "k": 30}, {"use": "temp_ext", "t": 1.0}, {"use": "dist"}]},
        [{"temperature": t, "seed": 70 + i} for i, t in enumerate([0.5, 0.0, 1.5, 1.0, 0.0, 2.0, 0.7, 0.0])],
        ["top_k", "temperature"],
    ),
    "min_keep": (
        {
            "samplers": [
                {"use": "top_p", "p": 0.3, "min_keep": 8},
                {"use": "min_p", "p": 0.4, "min_keep": 5},
                {"use": "dist", "seed": 5},
            ]
        },
        None,
        ["top_p", "min_p"],
    ),
    "penalties in front": (
        {
            "samplers": [
                {"use": "penalties", "repeat": 1.3, "presence": 0.2},
                {"use": "top_k", "k": 50},
                {"use": "top_p", "p": 0.9},
                {"use": "dist", "seed": 6},
            ]
        },
        None,
        ["top_k", "top_p"],
    ),
    "a truncation in front (masked, not compacted)": (
        {"samplers": [{"use": "typical", "p": 0.9}, {"use": "top_k", "k": 40}, {"use": "dist", "seed": 11}]},
        None,
        ["top_k"],
    ),
    "transformers preset": ("preset:transformers", None, ["top_k"]),
    "llama.cpp preset": ("preset:llama.cpp", None, ["top_k", "top_p", "min_p", "temperature"]),
}
NOT_FUSED = {
    "min_p before top_k": (
        {
            "samplers": [
                {"use": "temperature", "t": 0.8},
                {"use": "min_p", "p": 0.05},
                {"use": "top_k", "k": 40},
                {"use": "dist", "seed": 7},
            ]
        },
        None,
    ),
    "temperature between cuts": (
        {
            "samplers": [
                {"use": "top_k", "k": 40},
                {"use": "temperature", "t": 0.8},
                {"use": "top_p", "p": 0.9},
                {"use": "dist", "seed": 8},
            ]
        },
        None,
    ),
    "typical in the tail": (
        {"samplers": [{"use": "top_k", "k": 40}, {"use": "typical", "p": 0.9}, {"use": "dist", "seed": 9}]},
        None,
    ),
    "compacted in front": (
        {
            "samplers": [
                {"use": "top_k", "k": 60},
                {"use": "typical", "p": 0.95},
                {"use": "top_p", "p": 0.9},
                {"use": "dist", "seed": 11},
            ]
        },
        None,
    ),
    "temperature only": ({"samplers": [{"use": "temperature", "t": 0.8}, {"use": "dist", "seed": 10}]}, None),
    "greedy": ({"samplers": [{"use": "top_k", "k": 5}, {"use": "greedy"}]}, None),
}


def _store(chain: Chain, rows: list[dict] | None, batch: int):
    store = chain.new_store(device=DEVICE, capacity=batch)
    ids = [f"r{i}" for i in range(batch)]
    for i, rid in enumerate(ids):
        params = rows[i] if rows else {}
        if "seed" in store.layout.aliases and "seed" not in params:
            params = {**params, "seed": 900 + i}  # the presets' dist is unseeded: the same seeds on both sides
        store.add(rid, params)
    return store, ids


def _run(config, rows, backend, steps: int = 2):
    """Tokens and logprobs of `steps` steps of the chain on `cut_logits`, and per call of the fused kernel the kinds
    of the parts it was given and whether it ran them."""
    chain = Chain.load(config)
    calls = []
    if backend is not None:
        kernel = backend.kernel(FUSED_SAMPLE)
        if kernel is not None:

            def spy(*args):
                result = kernel(*args)
                calls.append(([part.kind for part in args[1]], result is not None))
                return result

            backend._kernels[FUSED_SAMPLE] = spy
        chain._backends[DEVICE] = backend
    store, ids = _store(chain, rows, BATCH)
    logits = cut_logits(VOCAB, 3).to(DEVICE)
    batch = BATCH
    history = torch.randint(0, VOCAB, (batch, 16), generator=torch.Generator().manual_seed(1)).to(DEVICE)
    out = []
    for step in range(steps):
        kwargs = {"history": history} if chain.needs_history else {}
        result = chain.sample(logits + 0.01 * step, store, ids, **kwargs).check()
        out.append((result.token_ids.cpu(), result.logprobs.cpu()))
        history = torch.cat([history, result.token_ids[:, None]], dim=1)
    return out, calls


@pytest.fixture(scope="module")
def fused_backend():
    if not HAS_TRITON:
        pytest.skip("triton is not installed: pip install 'samplechain-cuda[triton]' (scripts/setup.sh does)")
    import samplechain_cuda_triton

    if DEVICE == "cpu" and not samplechain_cuda_triton.interpreted():
        pytest.skip("TRITON_INTERPRET is not 1 in this session: the kernels cannot run on CPU tensors")
    return lambda: cuda.CudaBackend(device=DEVICE, triton=True)


@pytest.mark.parametrize("name", list(FUSED))
def test_a_fused_tail_draws_the_cpu_backends_tokens(fused_backend, name):
    config, rows, kinds = FUSED[name]
    want, _ = _run(config, rows, cuda.CudaBackend(device="cpu") if DEVICE == "cpu" else None)
    got, calls = _run(config, rows, fused_backend())
    assert calls == [(kinds, True)] * len(got)
    for (tokens, logprobs), (ref_tokens, ref_logprobs) in zip(got, want):
        assert torch.equal(tokens, ref_tokens), (name, tokens, ref_tokens)
        # the last row's logits are ~5e7: the executor rounds its log-sum-exp to float32 (spacing 4 there) before
        # subtracting, the kernel subtracts in float64, so only the others compare
        torch.testing.assert_close(logprobs[:-1], ref_logprobs[:-1], rtol=1e-5, atol=1e-5)
        assert bool((logprobs <= 0).all())


@pytest.mark.parametrize("name", list(NOT_FUSED))
def test_other_tails_run_sampler_by_sampler(fused_backend, name):
    config, rows = NOT_FUSED[name]
    want, _ = _run(config, rows, cuda.CudaBackend(device="cpu") if DEVICE == "cpu" else None, steps=1)
    got, calls = _run(config, rows, fused_backend(), steps=1)
    assert torch.equal(got[0][0], want[0][0])
    assert not any(ran for _, ran in calls)  # never called, or called and declined (None)


def test_the_plan_reads_nothing_on_the_device():
    """The executor builds the kernel's parts from the samplers' host-known values (scalars, per-request tensors
    as they are), without a host read: here with a kernel that records what it is given."""
    seen = []

    def kernel(logits, parts, select, positions, stream):
        seen.append((parts, select, stream))
        zeros = torch.zeros(logits.shape[0], device=logits.device)
        return zeros.long(), zeros

    backend = cuda.CudaBackend(device="cpu")
    backend._kernels[FUSED_SAMPLE] = kernel
    chain = Chain.load(
        {
            "samplers": [
                {"use": "penalties", "repeat": 1.2},
                {"use": "temperature", "t": 0.7},
                {"use": "top_k", "k": 40},
                {"use": "top_p", "p": 0.9},
                {"use": "min_p", "p": 0.0},
                {"use": "dist"},
            ]
        }
    )
    chain._backends["cpu"] = backend
    store = chain.new_store()
    ids = ["a", "b"]
    store.add("a", {"seed": 1, "top_p": 0.5})
    store.add("b", {"seed": 2})
    logits = torch.randn(2, 500)
    history = torch.randint(0, 500, (2, 8))
    chain.sample(logits, store, ids, history=history)  # the composition's first step may set up on the host
    with no_host_sync():
        out = chain.sample(logits, store, ids, history=history)
    parts, select, stream = seen[-1]
    assert [p.kind for p in parts] == ["temperature", "top_k", "top_p"]  # min_p 0: a no-op, left out
    assert parts[0].value == pytest.approx(0.7) and not isinstance(parts[0].value, torch.Tensor)  # ranks top_k by x
    assert parts[1] == FusedPart("top_k", 40, 1)
    assert torch.equal(parts[2].value, torch.tensor([0.5, 0.9])) and parts[2].min_keep == 1
    assert select.kind == "dist" and torch.equal(select.value, torch.tensor([1, 2])) and stream == 5
    assert torch.equal(out.token_ids, torch.zeros(2, dtype=torch.int64))


def test_a_shared_temperature_not_before_top_k_is_given_per_row():
    """The executor runs top_k before a shared temperature only where it follows it directly; elsewhere top_k
    ranks the divided logits, which the kernel does for a per-row temperature."""
    seen = []
    backend = cuda.CudaBackend(device="cpu")
    backend._kernels[FUSED_SAMPLE] = lambda logits, parts, *rest: seen.append(parts)
    chain = Chain.load(
        {
            "samplers": [
                {"use": "temperature", "t": 0.7},
                {"use": "top_p", "p": 1.0},
                {"use": "top_k", "k": 40},
                {"use": "dist", "seed": 1},
            ]
        }
    )
    chain._backends["cpu"] = backend
    out = chain.sample(torch.randn(3, 500))  # the kernel declined (None): the samplers ran
    assert out.token_ids.shape == (3,)
    temperature = seen[0][0]
    assert isinstance(temperature.value, torch.Tensor) and temperature.value.shape == (3,)
    assert torch.equal(temperature.value, torch.full((3,), 0.7))


def test_scores_asked_for_take_the_samplers():
    backend = cuda.CudaBackend(device="cpu")
    backend._kernels[FUSED_SAMPLE] = lambda *a: pytest.fail("the fused kernel returns no scores")
    chain = Chain.load({"samplers": [{"use": "top_k", "k": 4}, {"use": "dist", "seed": 1}]})
    chain._backends["cpu"] = backend
    out = chain.sample(torch.randn(2, 50), return_scores=True)
    assert (out.scores > -float("inf")).sum(dim=1).tolist() == [4, 4]


NOOPS = [
    {"use": "typical", "p": 1.0},
    {"use": "xtc", "probability": 0.0},
    {"use": "epsilon", "epsilon": 0.0},
    {"use": "top_n_sigma", "n": -1.0},
]


def _random_chain(rnd) -> tuple[dict, list[dict] | None]:
    """Cuts in a random order (the kernel's or not), a temperature anywhere, no-ops between, shared or per-row
    parameters."""
    cuts = rnd.sample(
        [
            {"use": "top_k", "k": rnd.choice([1, 5, 40, 0])},
            {"use": "top_p", "p": rnd.choice([0.3, 0.9, 1.0]), "min_keep": rnd.choice([1, 3])},
            {"use": "min_p", "p": rnd.choice([0.02, 0.2]), "min_keep": rnd.choice([1, 4])},
        ],
        rnd.randint(1, 3),
    )
    if rnd.random() < 0.5:
        cuts.sort(key=lambda entry: ["top_k", "top_p", "min_p"].index(entry["use"]))
    entries = list(cuts)
    temperature = {"use": rnd.choice(["temperature", "temp_ext"]), "t": rnd.choice([0.0, 0.6, 1.0, 1.7])}
    entries.insert(rnd.choice([0, len(entries), rnd.randint(0, len(entries))]), temperature)
    for noop in rnd.sample(NOOPS, rnd.randint(0, 2)):
        entries.insert(rnd.randint(0, len(entries)), dict(noop))
    rows = None
    if rnd.random() < 0.5:  # per-request temperature and top_p (the chain's per-row paths)
        rows = [
            {"temperature": rnd.choice([0.0, 0.5, 1.0, 1.4]), "top_p": rnd.choice([0.5, 0.95, 1.0]), "seed": 300 + i}
            for i in range(BATCH)
        ]
        for entry in entries:
            if entry["use"] == "top_p":
                entry["p"] = 1.0
    return {"samplers": [*entries, {"use": "dist", "seed": rnd.randint(0, 10**6)}]}, rows


@pytest.mark.parametrize("case", range(12))
def test_random_tails_draw_the_cpu_backends_tokens(fused_backend, case):
    import random

    rnd = random.Random(case)
    config, rows = _random_chain(rnd)
    if rows is not None and not any(e["use"] == "top_p" for e in config["samplers"]):
        rows = [{k: v for k, v in r.items() if k != "top_p"} for r in rows]
    want, _ = _run(config, rows, cuda.CudaBackend(device="cpu") if DEVICE == "cpu" else None, steps=1)
    got, calls = _run(config, rows, fused_backend(), steps=1)
    assert torch.equal(got[0][0], want[0][0]), (config, rows, calls)
    torch.testing.assert_close(got[0][1][:-1], want[0][1][:-1], rtol=1e-5, atol=1e-5)
