"""llama.cpp's published sampler test vectors (tests/test-sampling.cpp), converted to samplechain chains.

Source: ggml-org/llama.cpp tests/test-sampling.cpp (read at commit 07e4038f07a83cd729bbac700e6681757b313b73),
semantics from src/llama-sampling.cpp.

1. Expected probabilities. The C++ test builds candidates with logit = logf(p) for the input probabilities,
   applies one sampler and then `dist` (which only computes the softmax over the surviving candidates), and checks
   size == len(expected) and |p_i - expected_i| < 1e-5 in the array's order. Here: logits = torch.log(float32
   probs), the chain is [sampler, greedy], and the survivors are the finite entries of the (B, V) scores. The
   array order is reproduced: samplers that sort in llama.cpp (top_k with k > 0, top_p with p < 1) are compared
   in descending probability, samplers that do not sort (temperature, min_p's unsorted path, the no-op cases)
   in token id order. Temperature 0 keeps all four candidates in llama.cpp (three at -inf, p = 0), so its
   vectors are compared over the whole row.

2. The sampler queue. test_sampler_queue(n_vocab, "kpm"..., top_k, top_p, min_p) builds logit = logf(token_id)
   for 10,000 tokens (token 0 is -inf: p = 0) and applies top_k(k), top_p(p, min_keep=1) and min_p(p,
   min_keep=1) in the given order, checking the survivors after every step. Here every call of the C++ test is
   converted verbatim, and additionally every 1-, 2- and 3-permutation of k, p, m is run with every parameter
   set those calls use. The expected survivors come from an analytic model in exact rational arithmetic (the
   probability of token i is i / sum of the surviving ids); the model is itself checked against the C++ test's
   own assertions. In samplechain token 0 (logit -inf) is masked from the start, so it is never a survivor,
   while llama.cpp counts it as a candidate of probability 0 where no filter removed it; the survivor sets are
   compared with that one difference made explicit.
"""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest
import torch

from samplechain import Chain, ConfigError

TOL = 1e-5  # as test-sampling.cpp's check()
PROBS = [0.1, 0.2, 0.3, 0.4]


def f32(x: float) -> float:
    """The value of a C float literal / float expression, as a Python float."""
    return float(np.float32(x))


# ------------------------------------------------------------------------------------------------ expected probs
# (id, samplechain sampler entry, input probs, expected probs, order of llama.cpp's array after the sampler)
TEMP = [
    ("temp-1.0", {"use": "temperature", "t": 1.0}, PROBS, [0.1, 0.2, 0.3, 0.4], "ids"),
    ("temp-0.0", {"use": "temperature", "t": 0.0}, PROBS, [0.0, 0.0, 0.0, 1.0], "whole-row"),
]
TOP_K = [  # llama_sampler_init_top_k(k) has no min_keep: min_keep 0 here
    ("top_k-1", {"use": "top_k", "k": 1, "min_keep": 0}, PROBS, [1.0], "sorted"),
    ("top_k-3", {"use": "top_k", "k": 3, "min_keep": 0}, PROBS, [0.44444, 0.33333, 0.22222], "sorted"),
    ("top_k-4", {"use": "top_k", "k": 4, "min_keep": 0}, PROBS, [0.4, 0.3, 0.2, 0.1], "sorted"),
    ("top_k-0", {"use": "top_k", "k": 0, "min_keep": 0}, PROBS, [0.1, 0.2, 0.3, 0.4], "ids"),
]
TOP_P = [  # llama_sampler_init_top_p(p, 0): min_keep 0
    ("top_p-0.0", {"use": "top_p", "p": 0.0, "min_keep": 0}, PROBS, [1.0], "sorted"),
    ("top_p-0.7", {"use": "top_p", "p": 0.7, "min_keep": 0}, PROBS, [0.571429, 0.428571], "sorted"),
    ("top_p-0.8", {"use": "top_p", "p": 0.8, "min_keep": 0}, PROBS, [0.44444, 0.33333, 0.22222], "sorted"),
    ("top_p-1.0", {"use": "top_p", "p": 1.0, "min_keep": 0}, PROBS, [0.1, 0.2, 0.3, 0.4], "ids"),
]


def _min_p(p: float, expected: list[float]) -> tuple:  # llama_sampler_init_min_p(p, 0): min_keep 0
    return (f"min_p-{p:.2f}", {"use": "min_p", "p": p, "min_keep": 0}, PROBS, expected, "ids")


MIN_P = [
    _min_p(0.00, [0.1 / 1.0, 0.2 / 1.0, 0.3 / 1.0, 0.4 / 1.0]),
    _min_p(0.24, [0.1 / 1.0, 0.2 / 1.0, 0.3 / 1.0, 0.4 / 1.0]),
    _min_p(0.26, [0.2 / 0.9, 0.3 / 0.9, 0.4 / 0.9]),
    _min_p(0.49, [0.2 / 0.9, 0.3 / 0.9, 0.4 / 0.9]),
    _min_p(0.51, [0.3 / 0.7, 0.4 / 0.7]),
    _min_p(0.74, [0.3 / 0.7, 0.4 / 0.7]),
    _min_p(0.76, [0.4 / 0.4]),
    _min_p(1.00, [0.4 / 0.4]),
    _min_p(1.05, [0.4 / 0.4]),  # out of min_p.v1's domain: see test_probability_vector
]


def _ids(cases: list) -> list:
    return [c if isinstance(c, type(pytest.param(0))) else pytest.param(*c, id=c[0]) for c in cases]


def llama_array(scores: torch.Tensor, order: str) -> list[float]:
    """The probabilities llama.cpp's array would hold after `dist`, in its order, from (V,) processed scores."""
    if order == "whole-row":
        return torch.softmax(scores.double(), dim=-1).tolist()
    kept = scores[torch.isfinite(scores)].double()  # token id order
    probs = torch.softmax(kept, dim=-1)
    if order == "sorted":
        probs = probs.sort(descending=True).values
    return probs.tolist()


@pytest.mark.parametrize(("name", "entry", "probs", "expected", "order"), _ids(TEMP + TOP_K + TOP_P + MIN_P))
def test_probability_vector(name, entry, probs, expected, order):
    """test_temp / test_top_k / test_top_p / test_min_p: softmax over the survivors within 1e-5."""
    logits = torch.log(torch.tensor([probs], dtype=torch.float32))  # logf(p), as sampler_tester does
    if entry["use"] == "min_p" and entry["p"] > 1.0:
        # llama.cpp accepts min_p > 1 (it then keeps only the top token, as p = 1 does); min_p.v1 validates
        # p in [0, 1] like transformers' MinPLogitsWarper, so the request is refused with a clear error and the
        # vector is checked at the boundary value instead.
        with pytest.raises(ConfigError, match=r"must be in \[0, 1\]"):
            Chain.load({"samplers": [entry, {"use": "greedy"}]})
        entry = {**entry, "p": 1.0}
    chain = Chain.load({"samplers": [entry, {"use": "greedy"}]})
    scores = chain.sample(logits, return_scores=True).scores[0]
    got = llama_array(scores, order)
    assert len(got) == len(expected), f"{name}: {len(got)} candidates survive, llama.cpp keeps {len(expected)}"
    for i, (g, e) in enumerate(zip(got, expected)):
        assert abs(g - e) < TOL, f"{name}: p[{i}] = {g:.6f}, llama.cpp expects {e:.6f}"


# ------------------------------------------------------------------------------------------------ sampler queue
N_VOCAB = 10_000
MIN_P_NEAR_ONE = float(np.float32(9997.9) / np.float32(9999.0))  # 9997.9f/9999.0f, computed in float

# every test_sampler_queue(...) call of test-sampling.cpp: (n_vocab, sequence, top_k, top_p, min_p)
LLAMA_QUEUE_CALLS = [
    (10000, "k", 10000, 1.0, 1.0),
    (10000, "k", 1, 1.0, 1.0),
    (10000, "p", 10000, 1.0, 1.0),
    (10000, "p", 10000, 0.0, 1.0),
    (10000, "m", 10000, 1.0, 1.0),
    (10000, "m", 10000, 1.0, 1e-12),
    (10000, "k", 100, 1.0000, 1.0),
    (10000, "p", 10000, 0.0003, 1.0),
    (10000, "p", 10000, 0.8000, 1.0),
    (10000, "m", 10000, 1.0000, MIN_P_NEAR_ONE),
    (10000, "m", 10000, 1.0000, 0.1),
    (10000, "kp", 100, 0.8, 0.1),
    (10000, "km", 100, 0.8, 0.1),
    (10000, "pk", 100, 0.8, 0.1),
    (10000, "pm", 100, 0.8, 0.1),
    (10000, "mk", 100, 0.8, 0.1),
    (10000, "mp", 100, 0.8, MIN_P_NEAR_ONE),
    (10000, "mp", 100, 0.8, 0.1),
    (10000, "kpm", 100, 0.8, 0.1),
    (10000, "kmp", 100, 0.8, 0.1),
    (10000, "pkm", 100, 0.8, 0.1),
    (10000, "pmk", 100, 0.8, 0.1),
    (10000, "mkp", 100, 0.8, 0.1),
    (10000, "mpk", 100, 0.8, 0.1),
]
PERMUTATIONS = ["".join(q) for r in (1, 2, 3) for q in itertools.permutations("kpm", r)]
PARAMETER_SETS = sorted({(k, p, m) for (_, _, k, p, m) in LLAMA_QUEUE_CALLS})


def queue_id(n: int, seq: str, k: int, p: float, m: float) -> str:
    m_text = "9997.9_over_9999" if m == MIN_P_NEAR_ONE else f"{m:g}"
    return f"{seq}-n{n}-k{k}-p{p:g}-m{m_text}"


def llama_survivors(n: int, seq: str, k: int, p: float, m: float) -> list[tuple[int, bool]]:
    """Analytic model of llama.cpp on logit_i = log(i): after each step, (lowest surviving id, array sorted).

    Survivors are always the ids lo..n-1. Exact arithmetic with p and m as the float32 values of the C floats.
    Token 0 (p = 0) stays a candidate in llama.cpp until a filter cuts it: top-k can keep it, min-p never does
    (-inf < any threshold), and top-p keeps it only when its walk reaches token 1 (the running float sum then
    never reaches p, so nothing is cut).
    """
    p, m = f32(p), f32(m)
    lo, is_sorted, out = 0, False, []
    for s in seq:
        if s == "k":
            if k > 0:
                lo, is_sorted = max(lo, n - k), True
        elif s == "p":
            if p < 1.0:
                total = (n * (n - 1) - lo * (lo - 1)) // 2  # sum of the surviving ids
                target, cum, i = Fraction(p) * total, 0, n
                while True:  # keep from the top down to the token at which the mass first reaches p
                    i -= 1
                    cum += i
                    if cum >= target:
                        break
                lo, is_sorted = (0 if i == 1 else i), True
        elif s == "m":
            if m > 0.0:  # keep i / (n - 1) >= m, at least one (min_keep = 1), never token 0
                lo = min(max(lo, math.ceil(Fraction(m) * (n - 1)), 1), n - 1)
        out.append((lo, is_sorted))
    return out


def check_llama_assertions(n: int, seq: str, k: int, p: float, m: float) -> None:
    """Replay test_sampler_queue's own GGML_ASSERTs (float32 arithmetic where the C++ uses float) on the model."""
    f = np.float32
    steps = llama_survivors(n, seq, k, p, m)
    min_token_id = 0
    for s, (lo, is_sorted) in zip(seq, steps):
        size = n - lo  # the model's array: ids lo..n-1, the first is max_token_id when sorted
        if s == "k":
            expected_size = min(size, k)
            min_token_id = max(min_token_id, n - k)
            assert size == expected_size and lo == min_token_id
        elif s == "p":
            divisor = n * (n - 1) // 2 - int(min_token_id * (min_token_id - 1) / 2)
            target = int(np.ceil(f(p) * f(divisor)))
            min_token_id, expected_size, cumsum = n, 0, 0
            while True:
                min_token_id -= 1
                expected_size += 1
                cumsum += min_token_id
                if not cumsum < target:
                    break
            if min_token_id == 1:
                min_token_id -= 1
                expected_size += 1
            assert size == expected_size
            assert not is_sorted or lo == min_token_id
        elif s == "m":
            expected_size = int(np.ceil((f(1.0) - f(m)) * f(n)))
            expected_size = min(max(expected_size, 1), size)
            min_token_id = int(np.floor(f(m) * f(n)))
            min_token_id = min(max(min_token_id, 1, n - size), n - 1)
            assert size == expected_size
            assert not is_sorted or lo == min_token_id


ENTRIES = {
    "k": lambda k, p, m: {"use": "top_k", "k": k},
    "p": lambda k, p, m: {"use": "top_p", "p": f32(p), "min_keep": 1},
    "m": lambda k, p, m: {"use": "min_p", "p": f32(m), "min_keep": 1},
}


def run_queue(n: int, seq: str, k: int, p: float, m: float) -> None:
    logits = torch.log(torch.arange(n, dtype=torch.float32))[None, :]  # logf(token_id): token 0 is -inf
    ids = torch.arange(n)
    for step, (lo, _) in enumerate(llama_survivors(n, seq, k, p, m), start=1):
        entries = [ENTRIES[s](k, p, m) for s in seq[:step]]
        chain = Chain.load({"samplers": [*entries, {"use": "greedy"}]})
        out = chain.sample(logits, return_scores=True)
        survivors = torch.isfinite(out.scores[0])
        expected = ids >= max(lo, 1)  # token 0 is masked (-inf) in samplechain from the start
        if not torch.equal(survivors, expected):
            got = survivors.nonzero().flatten()
            pytest.fail(
                f"after {seq[:step]!r}: {int(survivors.sum())} survivors (ids {int(got.min())}..{int(got.max())}), "
                f"expected ids {max(lo, 1)}..{n - 1} ({n - max(lo, 1)})"
            )
        assert torch.equal(out.scores[0][survivors], logits[0][survivors])
        assert int(out.token_ids[0]) == n - 1


@pytest.mark.parametrize(("n", "seq", "k", "p", "m"), [pytest.param(*c, id=queue_id(*c)) for c in LLAMA_QUEUE_CALLS])
def test_sampler_queue_llamacpp_calls(n, seq, k, p, m):
    """Every test_sampler_queue call of test-sampling.cpp, checked after every step of the sequence. The analytic
    model must first pass the C++ test's own assertions for the call (they hold in llama.cpp's CI)."""
    check_llama_assertions(n, seq, k, p, m)
    run_queue(n, seq, k, p, m)


@pytest.mark.parametrize(
    ("n", "seq", "k", "p", "m"),
    [
        pytest.param(N_VOCAB, seq, k, p, m, id=queue_id(N_VOCAB, seq, k, p, m))
        for (k, p, m) in PARAMETER_SETS
        for seq in PERMUTATIONS
        if (N_VOCAB, seq, k, p, m) not in LLAMA_QUEUE_CALLS
    ],
)
def test_sampler_queue_every_permutation(n, seq, k, p, m):
    """Every 1-, 2- and 3-permutation of k, p, m with every parameter set of the C++ calls (those not already
    among the calls), against the same analytic model. (The C++ assertions are not replayed here: their top-p
    formula assumes token 0 is still a candidate, which is false after a min-p step, e.g. "mp" with
    min_p = 1e-12, top_p = 1 — a combination llama.cpp never runs.)"""
    run_queue(n, seq, k, p, m)


def test_queue_cases_cover_every_permutation():
    assert len(PERMUTATIONS) == 15
    assert {c[1] for c in LLAMA_QUEUE_CALLS} == set(PERMUTATIONS)
