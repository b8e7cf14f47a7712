"""top_n_sigma.v1 against llama.cpp's `llama_sampler_top_n_sigma` (src/llama-sampler.cpp).

- Vectors: `test_top_n_sigma` of llama.cpp's tests/test-sampling.cpp, verbatim (probabilities after dist's softmax,
  in token order, 0 for a removed token), to 1e-5.
- Oracle: llama.cpp's apply written out below in plain Python (float64), on random logits with -inf entries and
  ties: the same kept set except for tokens within EPS of the threshold; kept logits bitwise.
- Per-row parameters equal each row alone; n <= 0 and single-candidate rows are bitwise no-ops; bad values refused.
"""

from __future__ import annotations

import math

import pytest
import torch

from samplechain import Chain, ConfigError, RequestError
from samplechain.tools.testing import (
    assert_bitwise_no_op,
    assert_rows_equal_alone,
    processed_scores,
    random_logits,
    sampler_chain,
    top_k_only,
)

NEG_INF = float("-inf")
EPS = 1e-5


def chain(n: float = 0.0, min_keep: int = 1, before: list | None = None) -> Chain:
    return sampler_chain({"use": "top_n_sigma", "n": n, "min_keep": min_keep}, before=before)


def llama_top_n_sigma(row: list[float], n: float) -> tuple[list[bool], float]:
    """llama_sampler_top_n_sigma_apply on one row: (kept flags, the threshold max - n * std)."""
    if n <= 0.0 or len(row) <= 1:
        return [True] * len(row), NEG_INF
    valid = [x for x in row if x != NEG_INF]
    top = max(valid)
    mean = sum(valid) / len(valid)
    std = math.sqrt(sum((x - mean) ** 2 for x in valid) / len(valid))
    threshold = top - n * std
    return [not (x < threshold) for x in row], threshold


def logits_for(seed: int, B: int = 6, V: int = 300) -> torch.Tensor:
    x = random_logits(seed, B, V, 2.0)
    x[0, 5:40] = NEG_INF  # masked candidates are skipped in mean and std
    x[1, :] = torch.round(x[1, :])  # many ties, some on the threshold's side
    x[2, 1::2] = NEG_INF
    return x


def assert_matches_llama(ours: torch.Tensor, logits: torch.Tensor, ns: list[float], min_keep: int = 1) -> None:
    for b in range(logits.shape[0]):
        row = logits[b].double().tolist()
        flags, threshold = llama_top_n_sigma(row, ns[b])
        want = torch.tensor(flags) & torch.isfinite(logits[b])
        kept = torch.isfinite(ours[b])
        band = ((logits[b].double() - threshold).abs() <= EPS) & torch.isfinite(logits[b])
        if min_keep > 1 and int(want.sum()) < min_keep:
            best = top_k_only(logits[b : b + 1], min_keep)[0]  # of ties at the min_keep-th place the lowest ids
            want = torch.isfinite(best)
        bad = (kept != want) & ~band
        assert not bool(bad.any()), f"row {b} n={ns[b]}: kept sets differ at {bad.nonzero().flatten()[:8].tolist()}"
        assert torch.equal(ours[b][kept], logits[b][kept]), "kept logits must be the input logits, bitwise"


# ----------------------------------------------------------------- llama.cpp's vectors, verbatim
@pytest.mark.parametrize(
    ("probs", "expected", "n"),
    [
        ([0.1, 0.2, 0.3, 0.4], [0.0, 0.0, 0.428571, 0.571429], 1.00),
        ([0.1, 0.2, 0.3, 0.4], [0.1, 0.2, 0.3, 0.4], 0.00),  # n == 0 is a no-op (PR #13345)
        ([0.1, 0.2, 0.3, 0.4], [0.1, 0.2, 0.3, 0.4], 3.00),
    ],
)
def test_llama_cpp_vectors(probs, expected, n):
    logits = torch.tensor(probs, dtype=torch.float32).log()[None, :]  # logf(p), as the tester
    out = processed_scores(chain(n, min_keep=0), logits)
    got = torch.softmax(out, dim=-1)[0]  # dist's softmax, in token order
    assert torch.allclose(got, torch.tensor(expected), atol=1e-5, rtol=0), got.tolist()


# ----------------------------------------------------------------- the llama.cpp formula as oracle
@pytest.mark.parametrize("seed", (0, 1, 2))
@pytest.mark.parametrize("n", (0.3, 1.0, 2.0, 3.5))
def test_matches_llama_cpp_formula(seed, n):
    logits = logits_for(seed)
    assert_matches_llama(processed_scores(chain(n), logits), logits, [n] * logits.shape[0])


@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16))
def test_half_precision_input(dtype):
    logits = logits_for(3).to(dtype)
    as_float = logits.float()
    assert_matches_llama(processed_scores(chain(1.0), logits), as_float, [1.0] * logits.shape[0])


def test_min_keep_keeps_the_most_likely():
    logits = logits_for(4)
    ours = processed_scores(chain(0.05, min_keep=7), logits)
    assert bool((torch.isfinite(ours).sum(dim=-1) >= 7).all())
    assert_matches_llama(ours, logits, [0.05] * logits.shape[0], min_keep=7)


def test_after_top_k_sorted_candidates_match_unsorted_llama():
    logits = logits_for(5)
    ours = processed_scores(chain(1.0, before=[{"use": "top_k", "k": 40}]), logits)
    after_k = top_k_only(logits, 40)
    assert_matches_llama(ours, after_k, [1.0] * logits.shape[0])


# ----------------------------------------------------------------- no-ops, per-row parameters
@pytest.mark.parametrize("n", (0.0, -1.0))
def test_n_le_zero_is_a_bitwise_no_op(n):
    logits = logits_for(6)
    assert_bitwise_no_op(chain(n), logits)
    assert_bitwise_no_op(chain(n, min_keep=9), logits)


def test_single_candidate_rows_pass_through():
    logits = torch.full((2, 10), NEG_INF)
    logits[0, 3] = 1.5
    logits[1, 7] = -2.0
    assert_bitwise_no_op(chain(1.0), logits)


@pytest.mark.parametrize("seed", (0, 1))
def test_per_row_parameters_equal_rows_alone(seed):
    rows = [
        {"top_n_sigma": 1.0},
        {"top_n_sigma": 0.0},
        {"top_n_sigma": 0.5, "min_keep": 20},
        {"top_n_sigma": -1.0},
        {"top_n_sigma": 2.5},
        {"top_n_sigma": 0.01, "min_keep": 3},
    ]
    logits = logits_for(seed)
    batch = assert_rows_equal_alone(chain(), logits, rows)
    for i, params in enumerate(rows):
        if params["top_n_sigma"] <= 0:
            assert torch.equal(batch[i], logits[i])
        else:
            assert_matches_llama(
                batch[i : i + 1], logits[i : i + 1], [params["top_n_sigma"]], params.get("min_keep", 1)
            )


# ----------------------------------------------------------------- validation
@pytest.mark.parametrize(
    ("entry", "key"),
    [
        ({"n": float("nan")}, "n"),
        ({"n": float("inf")}, "n"),
        ({"n": 1.0, "min_keep": -1}, "min_keep"),
        ({}, "n"),
    ],
)
def test_bad_values_are_refused(entry, key):
    with pytest.raises(ConfigError, match=key):
        Chain.load({"samplers": [{"use": "top_n_sigma", **entry}, {"use": "greedy"}]})


def test_bad_request_value_is_refused():
    store = chain(1.0).new_store()
    with pytest.raises(RequestError, match="min_keep"):
        store.add("a", {"min_keep": -3})


@pytest.mark.parametrize("scale", [1.0, 3.0, 20.0])
def test_wide_rows_keep_what_the_float64_path_keeps(scale, monkeypatch):
    """Rows of >= 16384 candidates bound the threshold by one float64 pass of sums and read it with at_least: the
    same kept sets and logits as the float64 path, with per-row n (off rows included), min_keep and -inf entries."""
    from samplechain.tools.testing import processed_scores, random_logits, sampler_chain

    logits = random_logits(8, 5, 40000, scale)
    logits[1, ::3] = float("-inf")
    logits[4, 2:] = float("-inf")  # two finite candidates
    per_row = [
        {"top_n_sigma": 1.0},
        {"top_n_sigma": 0.5},
        {"top_n_sigma": -1.0},
        {"top_n_sigma": 2.0, "min_keep": 40},
        {"top_n_sigma": 1.0},
    ]
    chain = sampler_chain({"use": "top_n_sigma", "n": 1.0})
    fast = processed_scores(chain, logits, per_row)
    monkeypatch.setattr("samplechain.filters.WIDE", 10**9)
    assert torch.equal(fast, processed_scores(chain, logits, per_row))
