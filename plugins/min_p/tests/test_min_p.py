"""min_p.v1 against transformers' MinPLogitsWarper and llama.cpp's edge semantics.

Equivalence level: allclose at the boundary, exact elsewhere.
- Kept logits: bitwise the input logits, -inf everywhere else.
- Kept set: exactly transformers' set, except for tokens whose logit lies within EPS of the threshold
  max_logit + log(p). min_p.v1 compares in float32 logit space as llama.cpp does (logit >= max + logf(p));
  transformers compares probabilities (prob < p * max_prob is removed). Both are the same set in exact arithmetic;
  at the threshold float32 rounding decides. The oracle runs MinPLogitsWarper on the float64 logits, and the test
  asserts the band holds at most a few tokens per row.

Semantics (llama.cpp): p <= 0 is a no-op; at least min_keep candidates (the most likely) survive.
"""

from __future__ import annotations

import math

import pytest
import torch
from transformers.generation.logits_process import MinPLogitsWarper, TopKLogitsWarper

from samplechain import Chain
from samplechain.tools.testing import (
    assert_bitwise_no_op,
    assert_rows_equal_alone,
    processed_scores,
    random_logits,
    sampler_chain,
)

SEEDS = (0, 1, 2)
VOCABS = (50, 1000, 32000)
B = 8
EPS = 1e-5  # width of the rounding band around the threshold, in logit units (float32 ulp at |x| ~ 16 is 2e-6)
MAX_AMBIGUOUS = 4


def logits_for(seed: int, vocab: int, scale: float = 2.0) -> torch.Tensor:
    return random_logits(seed, B, vocab, scale)


def chain(p: float = 0.0, min_keep: int = 1, before: list | None = None) -> Chain:
    return sampler_chain({"use": "min_p", "p": p, "min_keep": min_keep}, before=before)


def assert_matches(ours: torch.Tensor, logits: torch.Tensor, p: float, min_keep: int = 1) -> None:
    ref = MinPLogitsWarper(p, min_tokens_to_keep=max(min_keep, 1))(None, logits.double())
    kept, want = torch.isfinite(ours), torch.isfinite(ref)
    x = logits.double()
    threshold = x.amax(dim=-1, keepdim=True) + math.log(p)
    band = ((x - threshold).abs() <= EPS) & torch.isfinite(x)
    assert int(band.sum(dim=-1).max()) <= MAX_AMBIGUOUS, "the rounding band holds too many tokens"
    bad = (kept != want) & ~band
    assert not bool(bad.any()), f"p={p}: kept sets differ at (row, token) {bad.nonzero()[:8].tolist()}"
    assert torch.equal(ours[kept], logits[kept]), "kept logits must be the input logits, bitwise"
    assert not bool(torch.isfinite(ours[~kept]).any())
    assert bool((kept.sum(dim=-1) >= min(max(min_keep, 1), logits.shape[1])).all())


@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("p", (0.01, 0.05, 0.1, 0.3, 0.9, 1.0))
def test_shared_p_matches_transformers_allclose(seed, vocab, p):
    logits = logits_for(seed, vocab)
    assert_matches(processed_scores(chain(p), logits), logits, p)


@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize(("p", "min_keep"), [(0.9, 5), (1.0, 3), (0.5, 2), (0.05, 4)])
def test_min_keep_matches_transformers_allclose(vocab, p, min_keep):
    logits = logits_for(3, vocab)
    assert_matches(processed_scores(chain(p, min_keep), logits), logits, p, min_keep)


@pytest.mark.parametrize("vocab", VOCABS)
def test_p_one_with_min_keep_three_keeps_exactly_three(vocab):
    logits = logits_for(4, vocab)
    ours = processed_scores(chain(1.0, 3), logits)
    expected = torch.zeros_like(logits, dtype=torch.bool).scatter_(1, logits.topk(3, dim=-1).indices, True)
    assert torch.equal(torch.isfinite(ours), expected)


@pytest.mark.parametrize("vocab", VOCABS)
def test_p_zero_is_a_bitwise_no_op(vocab):
    logits = logits_for(9, vocab)
    assert_bitwise_no_op(chain(0.0), logits)
    assert_bitwise_no_op(chain(0.0, 5), logits)


@pytest.mark.parametrize("vocab", VOCABS)
def test_p_one_keeps_only_the_maxima(vocab):
    logits = logits_for(10, vocab)
    logits[0, :3] = logits[0].max() + 1.0  # a three-way tie at the top: all three have max probability
    ours = processed_scores(chain(1.0, 0), logits)
    assert torch.equal(torch.isfinite(ours), logits == logits.amax(dim=-1, keepdim=True))


@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("seed", SEEDS)
def test_per_row_p_equals_rows_alone_and_transformers(seed, vocab):
    """Heterogeneous rows (own p and min_keep, incl. disabled p = 0) equal each row run alone bitwise, and
    transformers per row (allclose band as above)."""
    rows = [
        {"min_p": 0.0},
        {"min_p": 0.1},
        {"min_p": 0.5, "min_keep": 6},
        {"min_p": 1.0},
        {"min_p": 0.02},
        {"min_p": 0.3},
        {"min_p": 0.0, "min_keep": 9},
        {"min_p": 0.9, "min_keep": 2},
    ]
    logits = logits_for(seed, vocab)
    batch = assert_rows_equal_alone(chain(), logits, rows)
    for i, params in enumerate(rows):
        p, keep = params["min_p"], params.get("min_keep", 1)
        if p <= 0.0:
            assert torch.equal(batch[i], logits[i])
        else:
            assert_matches(batch[i : i + 1], logits[i : i + 1], p, keep)


@pytest.mark.parametrize("vocab", (1000, 32000))
@pytest.mark.parametrize("p", (0.05, 0.3))
def test_after_top_k_matches_transformers_pipeline(vocab, p):
    """On sorted, compacted candidates (after top_k): same set as transformers' TopK -> MinP pipeline."""
    logits = logits_for(12, vocab)
    ours = processed_scores(chain(p, before=[{"use": "top_k", "k": 40}]), logits)
    after_k = TopKLogitsWarper(40)(None, logits.clone())
    assert_matches(ours, after_k, p)


def test_existing_minus_inf_entries_stay_masked():
    logits = logits_for(6, 1000)
    logits[:, 1::3] = float("-inf")
    ours = processed_scores(chain(0.05), logits)
    assert not bool(torch.isfinite(ours[:, 1::3]).any())
    assert_matches(ours, logits, 0.05)


def test_wide_vocab_mixed_rows_through_the_chunked_path():
    """Vocabularies wide enough for the backend's chunked at-least path: peaked and flat rows, masked entries,
    per-row p including off rows and a min_keep above the survivor count; each row matches transformers."""
    logits = random_logits(9, 6, 128256, 2.0)
    logits[1] = random_logits(10, 1, 128256, 25.0)[0]  # a handful of survivors
    logits[3, ::3] = float("-inf")
    per_row = [
        {"min_p": 0.05},
        {"min_p": 0.1},
        {"min_p": 0.0},
        {"min_p": 0.3},
        {"min_p": 0.9, "min_keep": 50},
        {"min_p": 0.001},
    ]
    ours = processed_scores(chain(0.05), logits, per_row)
    for row, params in enumerate(per_row):
        if params["min_p"] == 0.0:
            assert torch.equal(ours[row], logits[row])
        else:
            assert_matches(ours[row : row + 1], logits[row : row + 1], params["min_p"], params.get("min_keep", 1))
    assert int(torch.isfinite(ours[4]).sum()) == 50
