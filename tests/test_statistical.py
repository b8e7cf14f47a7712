"""Every filter chain draws from its exact post-chain distribution: chi-square goodness of fit on 200,000 draws.

For `dist` alone and for each chain below, 200,000 seeded draws (2,000 requests with fixed distinct seeds x 100
accepted positions each; counter-based noise makes them independent and the test deterministic) over a known
V = 16 distribution are compared with `scipy.stats.chisquare` against the exact distribution after the chain.
That distribution is computed here, independently of the plugins, from each sampler's documented semantics
(docs/semantics.md, docs/samplers/) in float64 on the same float32 logits the chain sees; the oracles for the
samplers transformers also has are checked against transformers' own warpers. XTC's coin flip is part of the
distribution: its oracle is the exact mixture of "acts" and "does not act".

Pass: p-value > ALPHA (1e-3) on the kept tokens (cells expecting fewer than 5 draws pooled into one), and a
removed token is never drawn. The probabilities are chosen so no kept/removed boundary is ambiguous: every oracle
refuses a cut that lies within MARGIN of its threshold.

Power: a planted bias of 1% — one token's probability moved by 0.01 *absolute* (e.g. 0.30 -> 0.31), the other
kept tokens rescaled to keep the sum 1 — must be rejected (p-value < ALPHA) by the same test on the same draws.
With N = 200,000 the chi-square noncentrality of such a shift is N * 0.01**2 * (1/p + 1/(1 - p)) >= 80 (at
p = 0.5, its minimum), against a 1e-3 critical value below 40 for up to 15 degrees of freedom, so every kept token
of every chain, moved either way, is checked. The same bias planted in the sampler (a logit_bias before `dist`)
is rejected too. (A 1% *relative* shift, 0.300 -> 0.303, has noncentrality ~9: no sample of this size could
detect it reliably.)
"""

from __future__ import annotations

import functools
import math
import warnings
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch
from scipy.stats import chisquare
from transformers.generation.logits_process import (
    EpsilonLogitsWarper,
    EtaLogitsWarper,
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
    TypicalLogitsWarper,
)

from samplechain import Chain, ChainWarning

# Sorted probabilities (they sum to 1), placed at token ids by PERM so the most likely token is not id 0.
PROBS = [0.225, 0.16, 0.13, 0.105, 0.085, 0.07, 0.055, 0.045, 0.035, 0.027, 0.02, 0.015, 0.011, 0.008, 0.005, 0.004]
PERM = [5, 12, 0, 9, 3, 14, 7, 1, 10, 15, 6, 2, 13, 8, 11, 4]  # PROBS[i] is the probability of token PERM[i]
V = len(PROBS)
SEEDS_PER_CASE, STEPS = 2_000, 100  # 200,000 draws per chain
ALPHA = 1e-3
BIAS = 0.01  # the planted bias: one token's probability moved by 0.01 absolute
MARGIN = 1e-4  # an oracle cut closer than this to its threshold is ambiguous (float32 rounding): refused
NEG_INF = -math.inf


def base_logits() -> torch.Tensor:
    """(1, V) float32: log PROBS at the PERM ids — exactly what every chain is given."""
    x = torch.empty(V, dtype=torch.float64)
    x[PERM] = torch.log(torch.tensor(PROBS, dtype=torch.float64))
    return x.float()[None, :]


# ---------------------------------------------------------------- oracles: float64 logits (V,), -inf = removed
Logits = np.ndarray
Branches = list[tuple[float, Logits]]  # a distribution over processed logits: (weight, logits) pairs


def softmax(x: Logits) -> np.ndarray:
    e = np.exp(x - x.max())  # exp(-inf) = 0 for removed tokens
    return e / e.sum()


def removed(x: Logits, keep: np.ndarray) -> Logits:
    return np.where(keep, x, NEG_INF)


def clear_of(values: np.ndarray, threshold: float, what: str) -> None:
    """Refuse a test case whose cut is decided by rounding: every live value must be MARGIN away from the cut."""
    live = values[np.isfinite(values)]
    gap = float(np.min(np.abs(live - threshold))) if live.size else math.inf
    if gap <= MARGIN:
        raise AssertionError(f"{what}: a value lies {gap:.2e} from the threshold {threshold}; choose other PROBS")


def entropy(p: np.ndarray) -> float:
    q = p[p > 0]
    return float(-(q * np.log(q)).sum())


def temperature(t: float) -> Callable[[Logits], Logits]:
    return lambda x: x / t


def top_k(k: int) -> Callable[[Logits], Logits]:
    def apply(x: Logits) -> Logits:
        s = np.sort(x)[::-1]
        if k < np.isfinite(x).sum():
            assert s[k - 1] - s[k] > MARGIN, "top_k: tie at the k-th place"
            return removed(x, x >= s[k - 1])
        return x

    return apply


def top_p(p: float) -> Callable[[Logits], Logits]:
    """Keep a token iff the mass strictly above it (descending order) is < p."""

    def apply(x: Logits) -> Logits:
        probs = softmax(x)
        order = np.argsort(-x, kind="stable")
        above = np.empty(V)
        above[order] = np.cumsum(probs[order]) - probs[order]
        above[~np.isfinite(x)] = NEG_INF  # not live: ignored by clear_of, removed below anyway
        clear_of(above, p, "top_p")
        return removed(x, np.isfinite(x) & (above < p))

    return apply


def min_p(p: float) -> Callable[[Logits], Logits]:
    def apply(x: Logits) -> Logits:
        probs = softmax(x)
        clear_of(np.where(np.isfinite(x), probs, NEG_INF), p * probs.max(), "min_p")
        return removed(x, probs >= p * probs.max())

    return apply


def typical(p: float) -> Callable[[Logits], Logits]:
    """llama.cpp: rank by |-log p - H|; the first ranked token whose running mass is > p is the last kept."""

    def apply(x: Logits) -> Logits:
        probs = softmax(x)
        live = np.flatnonzero(np.isfinite(x))
        h = entropy(probs)
        distance = np.abs(-np.log(probs[live]) - h)
        order = live[np.argsort(distance, kind="stable")]
        cum = np.cumsum(probs[order])
        clear_of(cum, p, "typical")
        last = int(np.argmax(cum > p)) if (cum > p).any() else len(order) - 1
        gaps = np.diff(np.sort(distance))
        assert gaps.size == 0 or gaps.min() > MARGIN, "typical: tied distances"
        keep = np.zeros(V, dtype=bool)
        keep[order[: last + 1]] = True
        return removed(x, keep)

    return apply


def epsilon(eps: float) -> Callable[[Logits], Logits]:
    def apply(x: Logits) -> Logits:
        probs = softmax(x)
        clear_of(np.where(np.isfinite(x), probs, NEG_INF), eps, "epsilon")
        return removed(x, (probs >= eps) | (x == x.max()))

    return apply


def eta(eps: float) -> Callable[[Logits], Logits]:
    """Hewitt et al. as transformers' code: eta = min(eps, sqrt(eps) * exp(-H))."""

    def apply(x: Logits) -> Logits:
        probs = softmax(x)
        cut = min(eps, math.sqrt(eps) * math.exp(-entropy(probs)))
        clear_of(np.where(np.isfinite(x), probs, NEG_INF), cut, "eta")
        return removed(x, (probs >= cut) | (x == x.max()))

    return apply


def tfs(z: float) -> Callable[[Logits], Logits]:
    """llama.cpp's llama_sampler_tail_free_apply (min_keep 1): keep the first i sorted tokens, i the first index
    >= 1 at which the cumulative normalised |second difference| of the sorted probabilities exceeds z."""

    def apply(x: Logits) -> Logits:
        order = np.argsort(-x, kind="stable")[: int(np.isfinite(x).sum())]
        p = softmax(x)[order]
        if p.size <= 2:
            return x
        d2 = np.abs(np.diff(p, n=2))
        d2 = d2 / d2.sum() if d2.sum() > 1e-6 else np.full(d2.size, 1.0 / d2.size)
        cdf = np.cumsum(d2)
        clear_of(cdf, z, "tfs")
        hits = [i for i in range(cdf.size) if cdf[i] > z and i >= 1]
        kept = hits[0] if hits else p.size
        keep = np.zeros(V, dtype=bool)
        keep[order[:kept]] = True
        return removed(x, keep)

    return apply


def top_a(a: float) -> Callable[[Logits], Logits]:
    def apply(x: Logits) -> Logits:
        probs = softmax(x)
        cut = a * probs.max() ** 2
        clear_of(np.where(np.isfinite(x), probs, NEG_INF), cut, "top_a")
        return removed(x, probs >= cut)

    return apply


def top_n_sigma(n: float) -> Callable[[Logits], Logits]:
    """llama.cpp: remove logit < max - n * std, std the population std of the live logits."""

    def apply(x: Logits) -> Logits:
        live = x[np.isfinite(x)]
        cut = live.max() - n * live.std()
        clear_of(x, cut, "top_n_sigma")
        return removed(x, x >= cut)

    return apply


def quadratic(factor: float, curve: float = 1.0) -> Callable[[Logits], Logits]:
    """text-generation-webui's smoothing: logit' = -(k f d^2) + s f d^3 + m, d = logit - max."""

    def apply(x: Logits) -> Logits:
        m = x.max()
        d = x - m
        k, s = (3 - curve) / 2, (curve - 1) / 2
        return np.where(np.isfinite(x), -(k * factor * d**2) + s * factor * d**3 + m, NEG_INF)

    return apply


def xtc(probability: float, threshold: float) -> Callable[[Logits], Branches]:
    """With `probability`, every token with p >= threshold but the least likely of them is removed (when >= 2
    qualify): the exact post-XTC distribution is the mixture of the two outcomes."""

    def apply(x: Logits) -> Branches:
        probs = softmax(x)
        clear_of(np.where(np.isfinite(x), probs, NEG_INF), threshold, "xtc")
        qualify = np.isfinite(x) & (probs >= threshold)
        if qualify.sum() < 2:
            return [(1.0, x)]
        least = np.where(qualify, x, math.inf).argmin()
        drop = qualify.copy()
        drop[least] = False
        return [(1.0 - probability, x), (probability, removed(x, ~drop))]

    return apply


def exact(stages: Sequence[Callable], logits: torch.Tensor) -> np.ndarray:
    """The post-chain distribution over the V token ids: every stage in order, XTC branching into a mixture."""
    branches: Branches = [(1.0, logits[0].double().numpy())]
    for stage in stages:
        out: Branches = []
        for w, x in branches:
            y = stage(x)
            out.extend([(w * v, z) for v, z in y] if isinstance(y, list) else [(w, y)])
        branches = out
    return sum(w * softmax(x) for w, x in branches)


# ---------------------------------------------------------------- the chains
@dataclass(frozen=True)
class Case:
    name: str
    chain: dict | str  # Chain.load source
    stages: tuple = ()  # the oracle, in chain order
    request: dict = field(default_factory=dict)  # per-request parameters (preset chains)
    truncates: bool = True  # some token must be removed (a filter that keeps all would test nothing)


def samplers(*entries: dict) -> dict:
    return {"samplers": [*entries, {"use": "dist"}]}


CASES = [
    Case("dist", samplers(), (), truncates=False),
    Case("temperature", samplers({"use": "temperature", "t": 0.7}), (temperature(0.7),), truncates=False),
    Case("top_k", samplers({"use": "top_k", "k": 5}), (top_k(5),)),
    Case("top_p", samplers({"use": "top_p", "p": 0.8}), (top_p(0.8),)),
    Case("min_p", samplers({"use": "min_p", "p": 0.1}), (min_p(0.1),)),
    Case("typical", samplers({"use": "typical", "p": 0.6}), (typical(0.6),)),
    Case(
        "top_k+top_p+min_p+temperature",  # llama.cpp's default order, without penalties
        samplers(
            {"use": "top_k", "k": 10},
            {"use": "top_p", "p": 0.9},
            {"use": "min_p", "p": 0.12},
            {"use": "temperature", "t": 0.8},
        ),
        (top_k(10), top_p(0.9), min_p(0.12), temperature(0.8)),
    ),
    Case("epsilon", samplers({"use": "epsilon", "epsilon": 0.03}), (epsilon(0.03),)),
    Case("eta", samplers({"use": "eta", "epsilon": 0.2}), (eta(0.2),)),
    Case("tfs", samplers({"use": "tfs", "z": 0.8}), (tfs(0.8),)),
    Case("top_a", samplers({"use": "top_a", "a": 0.5}), (top_a(0.5),)),
    Case("xtc", samplers({"use": "xtc", "probability": 0.5, "threshold": 0.1}), (xtc(0.5, 0.1),), truncates=False),
    Case("top_n_sigma", samplers({"use": "top_n_sigma", "n": 1.0}), (top_n_sigma(1.0),)),
    Case("quadratic", samplers({"use": "quadratic", "factor": 0.5}), (quadratic(0.5),), truncates=False),
    Case(
        "quadratic curve 2",
        samplers({"use": "quadratic", "factor": 0.4, "curve": 2.0}),
        (quadratic(0.4, 2.0),),
        truncates=False,
    ),
    Case(
        "top_k+xtc+temperature",
        samplers(
            {"use": "top_k", "k": 8},
            {"use": "xtc", "probability": 0.3, "threshold": 0.11},
            {"use": "temperature", "t": 1.3},
        ),
        (top_k(8), xtc(0.3, 0.11), temperature(1.3)),
    ),
    Case("preset:llama.cpp", "preset:llama.cpp", (top_p(0.95), min_p(0.05), temperature(0.8))),
    Case(
        "preset:llama.cpp +xtc,top_n_sigma",
        "preset:llama.cpp",
        (top_n_sigma(2.0), top_k(12), top_p(0.95), min_p(0.05), xtc(0.4, 0.12), temperature(0.8)),
        {"top_n_sigma": 2.0, "top_k": 12, "xtc_probability": 0.4, "xtc_threshold": 0.12},
    ),
    Case(
        "preset:vllm",
        "preset:vllm",
        (temperature(0.7), min_p(0.1), top_k(8), top_p(0.9)),
        {"temperature": 0.7, "min_p": 0.1, "top_k": 8, "top_p": 0.9},
    ),
    Case(
        "preset:transformers",
        "preset:transformers",
        (temperature(1.3), top_k(12), top_p(0.95), typical(0.9), epsilon(0.02)),
        {"temperature": 1.3, "top_k": 12, "top_p": 0.95, "typical_p": 0.9, "epsilon_cutoff": 0.02},
    ),
    Case(
        "preset:text-generation-webui",
        "preset:text-generation-webui",
        (temperature(1.2), quadratic(0.4), top_a(0.2), xtc(0.3, 0.1)),
        {"temperature": 1.2, "smoothing_factor": 0.4, "top_a": 0.2, "xtc_probability": 0.3, "xtc_threshold": 0.1},
    ),
]
IDS = [c.name for c in CASES]
BY_NAME = {c.name: c for c in CASES}


@functools.cache
def expected(name: str) -> np.ndarray:
    return exact(BY_NAME[name].stages, base_logits())


@functools.cache
def counts(name: str, plant: tuple[int, float] | None = None) -> np.ndarray:
    """Token counts of 200,000 draws: SEEDS_PER_CASE requests (a seed block of their own per case) x STEPS.
    plant = (token, shift): a logit_bias right before `dist` moves that token's post-chain probability by shift."""
    case = BY_NAME[name]
    source = case.chain
    if plant is not None:
        token, shift = plant
        p = float(expected(name)[token])
        bias = math.log((p + shift) / (1 - p - shift)) - math.log(p / (1 - p))  # exactly planted(probs, token, shift)
        entries = case.chain["samplers"]
        source = {"samplers": [*entries[:-1], {"use": "logit_bias", "bias": {str(token): bias}}, entries[-1]]}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ChainWarning)  # the bias after the truncations is the point here
        chain = Chain.load(source)
    first = zlib.crc32(case.name.encode()) * SEEDS_PER_CASE
    seeds = range(first, first + SEEDS_PER_CASE)
    store = chain.new_store(capacity=SEEDS_PER_CASE)
    ids = [f"s{s}" for s in seeds]
    for rid, s in zip(ids, seeds):
        store.add(rid, {**case.request, "seed": s})
    batch = base_logits().expand(SEEDS_PER_CASE, -1).contiguous()
    # one thread: on (2000, 16) tensors a thread pool only adds synchronisation, which on a loaded CI machine costs
    # ~30x; counter-based noise makes the draws independent of the thread count
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        tokens = torch.cat([chain.sample(batch, store, ids).token_ids for _ in range(STEPS)])
    finally:
        torch.set_num_threads(threads)
    return np.bincount(tokens.numpy(), minlength=V)


def fit(observed: np.ndarray, probs: np.ndarray) -> float:
    """Chi-square p-value of the counts on the cells of positive probability; cells expecting fewer than 5 draws
    are pooled into one (the chi-square approximation needs it: one draw of a token expecting 0.02 adds 50)."""
    kept = probs > 0
    o, e = observed[kept], probs[kept] * observed.sum()
    small = e < 5
    if small.any():
        o = np.append(o[~small], o[small].sum())
        e = np.append(e[~small], e[small].sum())
    return float(chisquare(o, e).pvalue)


def planted(probs: np.ndarray, token: int, shift: float) -> np.ndarray:
    """probs with `token` moved by `shift` (absolute) and the other kept tokens rescaled to sum 1."""
    q = probs * (1.0 - (probs[token] + shift)) / (1.0 - probs[token])
    q[token] = probs[token] + shift
    return q


# ---------------------------------------------------------------- the tests
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_draws_fit_the_exact_post_chain_distribution(case):
    observed, probs = counts(case.name), expected(case.name)
    assert observed.sum() == SEEDS_PER_CASE * STEPS == 200_000
    pvalue = fit(observed, probs)
    assert pvalue > ALPHA, (case.name, observed.tolist(), (probs * observed.sum()).round(1).tolist(), pvalue)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_removed_tokens_are_never_drawn(case):
    observed, probs = counts(case.name), expected(case.name)
    assert (probs == 0).any() == case.truncates, "the case should (not) remove tokens: choose other parameters"
    assert observed[probs == 0].tolist() == [0] * int((probs == 0).sum())


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_a_planted_one_percent_bias_is_rejected(case):
    """Every kept token moved by +0.01 and by -0.01 (where it has that much): the fit must fail."""
    observed, probs = counts(case.name), expected(case.name)
    accepted = [
        (token, shift, pvalue)
        for token in np.flatnonzero(probs > 0)
        for shift in (BIAS, -BIAS)
        if 0 < probs[token] + shift < 1 and (pvalue := fit(observed, planted(probs, int(token), shift))) >= ALPHA
    ]
    assert not accepted, f"{case.name}: biased expectations the test did not reject: {accepted}"


@pytest.mark.parametrize("name", ["dist", "top_k+top_p+min_p+temperature"])
@pytest.mark.parametrize("shift", [BIAS, -BIAS])
def test_a_one_percent_bias_planted_in_the_sampler_is_detected(name, shift):
    """The bias planted in the draws instead: the most likely token's probability moved by 0.01 through a
    logit_bias before `dist`. The draws fit the biased distribution and the test rejects the true one."""
    probs = expected(name)
    token = int(probs.argmax())
    observed = counts(name, (token, shift))
    assert fit(observed, planted(probs, token, shift)) > ALPHA
    assert fit(observed, probs) < ALPHA


@pytest.mark.parametrize(
    ("stage", "warper"),
    [
        (temperature(0.7), TemperatureLogitsWarper(0.7)),
        (top_k(5), TopKLogitsWarper(5)),
        (top_p(0.8), TopPLogitsWarper(0.8)),
        (min_p(0.1), MinPLogitsWarper(0.1)),
        (typical(0.6), TypicalLogitsWarper(0.6)),
        (epsilon(0.03), EpsilonLogitsWarper(0.03)),
        (eta(0.2), EtaLogitsWarper(0.2, device="cpu")),
    ],
    ids=["temperature", "top_k", "top_p", "min_p", "typical", "epsilon", "eta"],
)
def test_oracle_agrees_with_transformers(stage, warper):
    """The hand-written oracles are themselves checked: transformers' warper on the same float32 logits gives the
    same distribution (its float32 arithmetic: within 1e-6)."""
    logits = base_logits()
    theirs = torch.softmax(warper(torch.zeros(1, 1, dtype=torch.long), logits.clone()).double(), dim=-1)[0]
    ours = softmax(stage(logits[0].double().numpy()))
    np.testing.assert_allclose(ours, theirs.numpy(), atol=1e-6)
    assert ((ours == 0) == (theirs.numpy() == 0)).all()


def test_xtc_oracle_is_the_mixture_of_its_two_outcomes():
    """Hand-checked on PROBS: 0.225, 0.16, 0.13 and 0.105 reach 0.1; when XTC acts only 0.105 of them stays."""
    x = base_logits()[0].double().numpy()
    mixture = exact((xtc(0.5, 0.1),), base_logits())
    acted = np.array(PROBS)
    acted[:3] = 0
    acted /= acted.sum()
    np.testing.assert_allclose(mixture[PERM], 0.5 * np.array(PROBS) + 0.5 * acted, atol=1e-7)
    assert exact((xtc(0.5, 0.3),), base_logits()).tolist() == softmax(x).tolist()  # one qualifies: no-op
