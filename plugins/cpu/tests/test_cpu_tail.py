"""The cpu backend's compiled top-k-led tails (samplechain_cpu_tail) against the samplers: `top_k -> [top_p | min_p |
temperature]* -> dist | greedy`, drawn at random (order, shared and per-request values, min_keep, rows where a
part is off), on peaked, flat, bfloat16-tied and masked rows, give the samplers' tokens over several steps and
their logprobs to float32 rounding; greedy alone on the whole vocabulary gives the sampler's token and logprob bit
for bit; a row alone and in a batch draw the same; rows the kernel cannot take go to the samplers."""

from __future__ import annotations

import random

import pytest
import torch

import samplechain_cpu as cpu
from samplechain import Chain, SamplechainError
from samplechain.tools.bench import make_logits
from samplechain.tools.testing import sample_steps

INF = float("inf")
WIDTH = 20000


@pytest.fixture(scope="module")
def tail():
    """The compiled tails' module."""
    if not cpu.numba_enabled():
        pytest.skip("numba is not installed (or SAMPLECHAIN_CPU_NUMBA=0)")
    import samplechain_cpu_tail

    return samplechain_cpu_tail


def _rows(seed: int) -> torch.Tensor:
    """Eight rows: peaked, flat, bfloat16-rounded (ties at every cut), half masked, a row of few distinct values."""
    g = torch.Generator().manual_seed(seed)
    x = torch.cat(
        [
            make_logits("peaked", 2, WIDTH, seed=seed),
            torch.randn(2, WIDTH, generator=g) * 3,
            make_logits("peaked", 2, WIDTH, seed=seed + 1).bfloat16().float(),
            make_logits("peaked", 1, WIDTH, seed=seed + 2),
            torch.randint(0, 4, (1, WIDTH), generator=g).float(),
        ]
    )
    x[6, torch.rand(WIDTH, generator=g) < 0.5] = -INF
    return x


def _chain(seed: int, greedy: bool) -> tuple[dict, list[dict]]:
    """A random top-k-led tail and per-row requests (some rows with their own values, some with a part off)."""
    r = random.Random(seed)
    parts = r.sample(["top_p", "min_p", "temperature"], r.randint(0, 3))
    if r.random() < 0.3 and parts:
        parts.append(r.choice(parts))  # a part twice
    entries = [{"use": "top_k", "k": r.choice([1, 2, 5, 40, 100]), "min_keep": r.choice([1, 1, 3])}]
    for i, kind in enumerate(parts):
        if kind == "temperature":
            entries.append({"use": "temperature", "t": r.choice([0.3, 0.8, 1.7]), "id": f"t{i}"})
        else:
            value = r.choice([0.05, 0.5, 0.95]) if kind == "top_p" else r.choice([0.01, 0.1, 0.4])
            entries.append({"use": kind, "p": value, "min_keep": r.choice([1, 1, 2, 6]), "id": f"{kind}{i}"})
    entries.append({"use": "greedy"} if greedy else {"use": "dist"})
    requests = [{"seed": 100 * seed + i} if not greedy else {} for i in range(8)]
    if r.random() < 0.5 and len(set(parts)) == len(parts):  # per-request values: a part off in some rows
        for req in requests:
            if "top_p" in parts:
                req["top_p"] = r.choice([0.3, 0.9, 1.0])
            if "min_p" in parts:
                req["min_p"] = r.choice([0.0, 0.05, 0.3])
            if "temperature" in parts:
                req["temperature"] = r.choice([0.5, 1.0, 1.3])
            req["top_k"] = r.choice([3, 40, 64])
    return {"samplers": entries, "backend": "cpu"}, requests


def _against_samplers(tail, monkeypatch, spec: dict, x: torch.Tensor, requests: list[dict]):
    """Three steps through the compiled tail, then with SAMPLECHAIN_CPU_NUMBA=0 (the samplers): the calls made, and
    both runs' tokens and logprobs."""
    calls = []
    real = tail.ranked_tail
    monkeypatch.setattr(tail, "ranked_tail", lambda *a: calls.append(a) or real(*a))
    got = sample_steps(Chain.load(spec), x, requests, 3)
    with monkeypatch.context() as m:
        m.setenv("SAMPLECHAIN_CPU_NUMBA", "0")
        want = sample_steps(Chain.load(spec), x, requests, 3)
    return calls, got, want


@pytest.mark.parametrize("greedy", [False, True], ids=["dist", "greedy"])
@pytest.mark.parametrize("trial", range(12))
def test_random_tails_give_the_samplers_tokens(tail, monkeypatch, trial, greedy):
    spec, requests = _chain(trial, greedy)
    calls, (tokens, logprobs), (want_tokens, want_logprobs) = _against_samplers(
        tail, monkeypatch, spec, _rows(trial), requests
    )
    assert len(calls) == 3, spec  # every step ran the compiled tail
    assert torch.equal(tokens, want_tokens), spec
    torch.testing.assert_close(logprobs, want_logprobs, rtol=2e-7, atol=2e-6)


def test_llama_cpp_default_chain_runs_compiled(tail, monkeypatch):
    """preset:llama.cpp after a logit bias (the tail behind the no-op penalties, DRY, top-n-sigma, typical and xtc):
    the compiled tail on every step, the samplers' tokens."""
    import tomllib

    from samplechain.engine.registry import registry_path

    preset = tomllib.loads(registry_path().read_text())["presets"]["llama.cpp"]["samplers"]
    spec = {"samplers": [{"use": "logit_bias", "bias": {"7": -INF}}, *preset], "backend": "cpu"}
    x = make_logits("peaked", 3, WIDTH, seed=9)
    requests = [{"seed": 5 + i} for i in range(3)]
    calls, (tokens, logprobs), (want_tokens, want_logprobs) = _against_samplers(tail, monkeypatch, spec, x, requests)
    assert len(calls) == 3 and torch.equal(tokens, want_tokens)
    torch.testing.assert_close(logprobs, want_logprobs, rtol=2e-7, atol=2e-6)


def test_a_row_draws_the_same_alone_and_in_a_batch(tail):
    spec, _ = _chain(3, False)
    x = _rows(4)
    requests = [{"seed": 40 + i} for i in range(8)]
    tokens, logprobs = sample_steps(Chain.load(spec), x, requests, 2)
    for b in (0, 3, 5):
        alone = sample_steps(Chain.load(spec), x[b : b + 1], requests[b : b + 1], 2)
        assert torch.equal(alone[0][:, 0], tokens[:, b]) and torch.equal(alone[1][:, 0], logprobs[:, b])


@pytest.mark.parametrize("width", [WIDTH, 128256])
def test_greedy_alone_is_the_samplers_to_the_bit(tail, monkeypatch, width):
    """greedy on the whole vocabulary: the compiled argmax (equal maxima: the lowest id) and the executor's own
    normaliser up to LSE64_WIDTH; wider rows go to the sampler."""
    x = make_logits("peaked", 4, width, seed=2).bfloat16().float()
    x[1, 5:9] = x[1].max()  # equal maxima
    calls = []
    real = tail.greedy
    monkeypatch.setattr(tail, "greedy", lambda a: calls.append(a) or real(a))
    spec = {"samplers": [{"use": "greedy"}], "backend": "cpu"}
    got = sample_steps(Chain.load(spec), x, [{}] * 4, 1)
    with monkeypatch.context() as m:
        m.setenv("SAMPLECHAIN_CPU_NUMBA", "0")
        want = sample_steps(Chain.load(spec), x, [{}] * 4, 1)
    assert bool(calls) == (width <= 65536)
    assert got[0][0, 1] == 5 and torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("case", ["nan", "+inf", "few finite", "k off in a row", "cold row"])
def test_rows_the_kernel_cannot_take_go_to_the_samplers(tail, monkeypatch, case):
    """A NaN or +inf in a row, fewer finite logits than the top-k keeps, a row without a top-k, a temperature of
    0: the kernel declines and the samplers run (a NaN or +inf is their error, naming the request)."""
    x = make_logits("peaked", 2, WIDTH, seed=3)
    requests = [{"seed": 1}, {"seed": 2}]
    entries = [{"use": "top_k", "k": 40}, {"use": "temperature", "t": 0.7}, {"use": "dist"}]
    if case == "nan":
        x[1, 17] = float("nan")
    elif case == "+inf":
        x[0, 3] = INF
    elif case == "few finite":
        x[1, 10:] = -INF
    elif case == "k off in a row":
        requests[1]["top_k"] = 0
    else:
        requests[0]["temperature"] = 0.0
    spec = {"samplers": entries, "backend": "cpu"}
    seen = []
    real = tail.ranked_tail
    monkeypatch.setattr(tail, "ranked_tail", lambda *a: seen.append(real(*a)) or seen[-1])
    if case in ("nan", "+inf"):
        with pytest.raises(SamplechainError, match=r"NaN or \+inf for request\(s\) \['r[01]'\]"):
            sample_steps(Chain.load(spec), x, requests, 1)
        return
    got = sample_steps(Chain.load(spec), x, requests, 2)
    assert all(s is None for s in seen)
    with monkeypatch.context() as m:
        m.setenv("SAMPLECHAIN_CPU_NUMBA", "0")
        want = sample_steps(Chain.load(spec), x, requests, 2)
    assert torch.equal(got[0], want[0])
