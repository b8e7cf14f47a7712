"""The kept set of every filter does not depend on the row's width.

Filters switch to fast paths on wide rows (`filters.WIDE` and the cpu backend's `MIN_VOCAB`, both 16384 entries:
float32 bounds on float64 thresholds, chunked reads, partial top-k). Here each filter sees the same handful of
finite logits placed in rows of widths on both sides of that switch (the rest -inf; the last logit in the last
column, so the chunked reads' tail is exercised), in a batch of many rows and a row alone, on the cpu backend with
and without its compiled kernels and on the cuda backend's logic (on CPU tensors), and must keep the same logits at
every width, and the same as a float64 reference written out below from the filter's definition (sums with
math.fsum; the parameters as the chain holds them, float32).

Cases: random logits with random parameters, and crafted ones whose cut lands on a logit or within ~1e-10
relative of one: top_n_sigma's n = 2 over two candidates puts its threshold exactly on the lower logit; the others
get a parameter solved from the float64 statistic of a chosen logit (then rounded to float32, which leaves the cut
within float32 rounding of that logit, far outside float64's).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
import torch

from samplechain.tools.testing import processed_scores, sampler_chain

NEG_INF = float("-inf")
WIDTHS = (64, 16383, 16384, 40000)
NUDGE = 1e-10
Case = tuple[np.ndarray, dict]


# ----------------------------------------------------------------------------- float64 references
def softmax64(v: np.ndarray) -> np.ndarray:
    top = v.max()
    e = np.exp(v - top)
    return e / math.fsum(e)


def lse64(v: np.ndarray) -> float:
    top = float(v.max())
    return top + math.log(math.fsum(np.exp(v - top)))


def order64(v: np.ndarray) -> np.ndarray:
    """Descending, equal logits lowest slot first (the filters' order)."""
    return np.lexsort((np.arange(len(v)), -v))


def prefix(v: np.ndarray, count: int) -> np.ndarray:
    keep = np.zeros(len(v), dtype=bool)
    keep[order64(v)[: max(count, 1)]] = True
    return keep


def at_least_top(v: np.ndarray, keep: np.ndarray) -> np.ndarray:
    return keep | (v == v.max())


def ref_top_n_sigma(v: np.ndarray, n: float, **_: object) -> np.ndarray:
    mean = math.fsum(v) / len(v)
    std = math.sqrt(math.fsum((v - mean) ** 2) / len(v))
    return at_least_top(v, v >= float(v.max()) - n * std)


def ref_epsilon(v: np.ndarray, epsilon: float, **_: object) -> np.ndarray:
    return at_least_top(v, softmax64(v) >= epsilon)


def entropy64(p: np.ndarray) -> float:
    return -math.fsum(p[p > 0] * np.log(p[p > 0]))


def ref_eta(v: np.ndarray, epsilon: float, **_: object) -> np.ndarray:
    p = softmax64(v)
    eta = min(epsilon, math.sqrt(epsilon) * math.exp(-entropy64(p)))
    return at_least_top(v, p >= eta)


def ref_top_a(v: np.ndarray, a: float, **_: object) -> np.ndarray:
    return at_least_top(v, v >= math.log(a) + 2.0 * float(v.max()) - lse64(v))


def ref_p_less(v: np.ndarray, tolerance: float, **_: object) -> np.ndarray:
    p = softmax64(v)
    return at_least_top(v, p >= math.fsum(p * p) - tolerance)


def ref_min_p(v: np.ndarray, p: float, **_: object) -> np.ndarray:
    return at_least_top(v, v >= float(np.float32(v.max()) + np.float32(math.log(p))))


def ref_top_k(v: np.ndarray, k: int, **_: object) -> np.ndarray:
    return prefix(v, k)


def ref_top_p(v: np.ndarray, p: float, **_: object) -> np.ndarray:
    probs = softmax64(v)[order64(v)]
    before = [math.fsum(probs[:i]) for i in range(len(v))]
    return prefix(v, sum(1 for b in before if b < p))


def ref_typical(v: np.ndarray, p: float, **_: object) -> np.ndarray:
    """llama.cpp's cut: rank by |-log p - H| (stable), keep through the first running mass > p."""
    probs = softmax64(v)
    h = entropy64(probs)
    ranked = np.argsort(np.abs(-np.log(probs) - h), kind="stable")
    keep = np.zeros(len(v), dtype=bool)
    for i, j in enumerate(ranked):
        keep[j] = True
        if math.fsum(probs[ranked[: i + 1]]) > p:
            break
    return keep


def ref_xtc(v: np.ndarray, threshold: float, **_: object) -> np.ndarray:
    """probability 1: of the m >= 2 logits with p >= threshold, the m - 1 most likely are removed."""
    probs = softmax64(v)
    m = int((probs >= threshold).sum())
    keep = np.ones(len(v), dtype=bool)
    if m >= 2:
        keep[order64(v)[: m - 1]] = False
    return keep


def ref_tfs(v: np.ndarray, z: float, **_: object) -> np.ndarray:
    """llama.cpp's tail-free cut over the descending probabilities."""
    n = len(v)
    if n <= 2:
        return np.ones(n, dtype=bool)
    p = softmax64(v)[order64(v)]
    d2 = np.abs(p[:-2] - 2.0 * p[1:-1] + p[2:])
    total = math.fsum(d2)
    weights = np.full(n - 2, 1.0 / (n - 2)) if total <= 1e-6 else d2 / total
    count = n
    for i in range(n - 2):
        if math.fsum(weights[: i + 1]) > z and i >= 1:
            count = i
            break
    return prefix(v, count)


def ref_top_h(v: np.ndarray, top_h: float, **_: object) -> np.ndarray:
    q = softmax64(v)[order64(v)][:100]
    q = q / math.fsum(q)
    terms = -q * np.log(q)
    tau = top_h * math.fsum(terms)
    count = sum(1 for i in range(len(q)) if math.fsum(terms[: i + 1]) <= tau)
    return prefix(v, count)


# ----------------------------------------------------------------------------- cases
def random_values(rng: np.random.Generator, size: int | None = None) -> np.ndarray:
    count = size or int(rng.integers(2, 9))
    return (rng.standard_normal(count) * rng.uniform(0.5, 6.0) + rng.uniform(-20, 20)).astype(np.float32)


def nudged(value: float, rng: np.random.Generator) -> float:
    return value * (1.0 + NUDGE * float(rng.choice([-1.0, 1.0])))


def pick(v: np.ndarray, rng: np.random.Generator) -> int:
    return int(rng.integers(0, len(v)))


def crafted_top_n_sigma(rng: np.random.Generator, i: int) -> Case:
    """n = 2 over two candidates (the threshold is the lower logit itself), or n solved so that max - n * std lands
    on a chosen logit of two or more."""
    v = random_values(rng, 2)
    if i % 3 == 0:
        return v, {"n": 2.0}
    w = np.concatenate([v, random_values(rng)]) if i % 3 == 1 else v
    x = w.astype(np.float64)
    mean = math.fsum(x) / len(x)
    std = math.sqrt(math.fsum((x - mean) ** 2) / len(x))
    n = (float(x.max()) - float(x[pick(w, rng)])) / std if std > 0 else 0.0
    return w, {"n": nudged(n, rng) if n > 0 else 1.0}


def crafted_probability(
    key: str, stat: Callable[[np.ndarray, int], float]
) -> Callable[[np.random.Generator, int], Case]:
    def craft(rng: np.random.Generator, i: int) -> Case:
        v = random_values(rng)
        value = stat(v.astype(np.float64), pick(v, rng))
        return v, {key: min(max(nudged(value, rng), 1e-9), 0.999999)}

    return craft


def stat_eta(v: np.ndarray, j: int) -> float:
    """The epsilon whose eta lands on p_j: p_j itself, or (p_j e^H)^2 where the sqrt branch is the smaller."""
    p = softmax64(v)
    squared = (float(p[j]) * math.exp(entropy64(p))) ** 2
    return squared if math.sqrt(squared) * math.exp(-entropy64(p)) < squared else float(p[j])


def stat_top_p(v: np.ndarray, j: int) -> float:
    probs = softmax64(v)[order64(v)]
    return math.fsum(probs[: max(list(order64(v)).index(j), 1)])


def stat_typical(v: np.ndarray, j: int) -> float:
    probs = softmax64(v)
    ranked = np.argsort(np.abs(-np.log(probs) - entropy64(probs)), kind="stable")
    return math.fsum(probs[ranked[: list(ranked).index(j) + 1]])


def stat_p_less(v: np.ndarray, j: int) -> float:
    p = softmax64(v)
    return max(math.fsum(p * p) - float(p[j]), 1e-9)


CRAFT: dict[str, Callable[[np.random.Generator, int], Case]] = {
    "top_n_sigma": crafted_top_n_sigma,
    "epsilon": crafted_probability("epsilon", lambda v, j: float(softmax64(v)[j])),
    "eta": crafted_probability("epsilon", stat_eta),
    "top_a": crafted_probability("a", lambda v, j: float(softmax64(v)[j] / softmax64(v).max() ** 2)),
    "p_less": crafted_probability("tolerance", stat_p_less),
    "top_p": crafted_probability("p", stat_top_p),
    "typical": crafted_probability("p", stat_typical),
    "xtc": crafted_probability("threshold", lambda v, j: min(float(softmax64(v)[j]), 0.5)),
}


def random_params(name: str, rng: np.random.Generator) -> dict:
    u = float(rng.uniform(0.05, 0.95))
    return {
        "top_n_sigma": {"n": float(rng.uniform(0.1, 3.0))},
        "epsilon": {"epsilon": u / 4},
        "eta": {"epsilon": u / 4},
        "top_a": {"a": u},
        "p_less": {"tolerance": float(rng.uniform(0.0, 0.1))},
        "min_p": {"p": u},
        "top_k": {"k": int(rng.integers(1, 6))},
        "top_p": {"p": u},
        "typical": {"p": u},
        "xtc": {"threshold": u / 2},
        "tfs": {"z": u},
        "top_h": {"top_h": u},
    }[name]


FILTERS: dict[str, tuple[dict, Callable[..., np.ndarray]]] = {
    "top_n_sigma": ({"n": 1.0}, ref_top_n_sigma),
    "epsilon": ({"epsilon": 1e-3}, ref_epsilon),
    "eta": ({"epsilon": 1e-3}, ref_eta),
    "top_a": ({"a": 0.2}, ref_top_a),
    "p_less": ({}, ref_p_less),
    "min_p": ({"p": 0.1}, ref_min_p),
    "top_k": ({"k": 2}, ref_top_k),
    "top_p": ({"p": 0.9}, ref_top_p),
    "typical": ({"p": 0.9}, ref_typical),
    "xtc": ({"probability": 1.0, "threshold": 0.1, "seed": 1}, ref_xtc),
    "tfs": ({"z": 0.9}, ref_tfs),
    "top_h": ({"top_h": 0.5}, ref_top_h),
}


def cases(name: str, count: int, seed: int) -> list[Case]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        if name in CRAFT and i % 2 == 0:
            out.append(CRAFT[name](rng, i))
        else:
            out.append((random_values(rng), random_params(name, rng)))
    return out


# ----------------------------------------------------------------------------- rows of each width
def slots(count: int, width: int) -> list[int]:
    """Positions of `count` logits in a row of `width`: spread over the first 64 columns, the last at the end."""
    return [*(int(round(s)) for s in np.linspace(0, 60, count - 1)), width - 1]


def kept_slots(name: str, batch: list[Case], width: int, backend: str = "cpu") -> list[np.ndarray]:
    entry, _ = FILTERS[name]
    chain = sampler_chain({"use": name, **entry})
    if backend == "cuda":  # the cuda backend's logic, on CPU tensors
        chain._backends["cpu"] = pytest.importorskip("samplechain_cuda").CudaBackend(device="cpu")
    logits = torch.full((len(batch), width), NEG_INF)
    for b, (v, _) in enumerate(batch):
        logits[b, slots(len(v), width)] = torch.from_numpy(v)
    per_row = [{f"{name}.{field}": value for field, value in params.items()} for _, params in batch]
    scores = processed_scores(chain, logits, per_row, process=True)
    return [torch.isfinite(scores[b, slots(len(v), width)]).numpy() for b, (v, _) in enumerate(batch)]


def expected(name: str, case: Case) -> np.ndarray:
    v, params = case
    entry, ref = FILTERS[name]
    full = {k: float(np.float32(x)) if isinstance(x, float) else x for k, x in {**entry, **params}.items()}
    return ref(v.astype(np.float64), **full)  # float parameters are float32 per-row columns


COUNTS = {"top_n_sigma": 300}


@pytest.mark.parametrize("backend", ["cpu", "cpu-torch", "cuda"])
@pytest.mark.parametrize("name", list(FILTERS))
def test_kept_set_is_the_same_at_every_width(name: str, backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if backend == "cpu-torch":  # the cpu backend without its compiled kernels
        monkeypatch.setenv("SAMPLECHAIN_CPU_NUMBA", "0")
    batch = cases(name, COUNTS.get(name, 120), seed=sum(map(ord, name)))
    want = [expected(name, case) for case in batch]
    for width in WIDTHS:
        got = kept_slots(name, batch, width, backend)
        bad = [b for b in range(len(batch)) if not np.array_equal(got[b], want[b])]
        assert not bad, (
            f"{name} on the {backend} backend at width {width}: {len(bad)} of {len(batch)} rows differ from the "
            f"float64 reference, e.g. "
            f"logits {batch[bad[0]][0].tolist()} {batch[bad[0]][1]}: kept {got[bad[0]].tolist()}, "
            f"reference {want[bad[0]].tolist()}"
        )


@pytest.mark.parametrize("name", list(FILTERS))
def test_a_row_alone_keeps_what_it_keeps_in_the_batch(name: str) -> None:
    batch = cases(name, 6, seed=7 + sum(map(ord, name)))
    for width in (16383, 16384):
        together = kept_slots(name, batch, width)
        for b, case in enumerate(batch):
            assert np.array_equal(kept_slots(name, [case], width)[0], together[b]), f"{name} row {b} at {width}"


def test_top_n_sigma_two_candidates_keep_both_at_every_width() -> None:
    """n = 2 over two finite logits: max - 2 std is the lower logit, which the comparison keeps."""
    rng = np.random.default_rng(0)
    pairs = [(random_values(rng, 2), {"n": 2.0}) for _ in range(300)]
    for width in WIDTHS:
        assert all(kept.all() for kept in kept_slots("top_n_sigma", pairs, width)), width
