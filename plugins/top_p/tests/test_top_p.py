"""top_p.v1 against transformers' TopPLogitsWarper and llama.cpp's edge semantics.

Equivalence level: allclose at the boundary, exact elsewhere.
- Kept logits: bitwise the input logits (a filter never changes a logit), -inf everywhere else.
- Kept set: exactly transformers' set, except for tokens whose probability mass above them lies within EPS of p
  (or that tie in logit with such a token). There float32 rounding legitimately decides: top_p.v1 normalises
  with a float32 logsumexp (relative error ~5e-7), transformers with a float32 softmax and cumsum. The oracle is
  TopPLogitsWarper run on the float64 copy of the logits, so it is itself exact to ~1e-15. The test asserts the
  band holds at most a few tokens per row, so the comparison never becomes vacuous.

Semantics (llama.cpp): a candidate is kept iff the mass strictly above it is < p (the token at which the running
sum first reaches p is the last one kept), which is transformers' "remove where the ascending cumsum <= 1 - p";
p >= 1 is a no-op; at least min_keep candidates survive.
"""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

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
EPS = 2e-6  # width of the rounding band around p, in probability mass
MAX_AMBIGUOUS = 4  # per row: the band must stay narrow for the comparison to mean something


def logits_for(seed: int, vocab: int, scale: float = 2.0) -> torch.Tensor:
    return random_logits(seed, B, vocab, scale)


def chain(p: float = 1.0, min_keep: int = 1, before: list | None = None) -> Chain:
    return sampler_chain({"use": "top_p", "p": p, "min_keep": min_keep}, before=before)


def ambiguous(logits: torch.Tensor, p: float, min_keep: int) -> torch.Tensor:
    """(B, V) bool: tokens whose fate depends on rounding (mass above within EPS of p, ties included)."""
    x = logits.double()
    values, order = x.sort(dim=-1, descending=True)
    sp = torch.softmax(values, dim=-1)
    above = torch.cumsum(sp, -1) - sp  # mass strictly above each sorted position
    pos = torch.arange(x.shape[1]).expand_as(x)
    starts = torch.ones_like(x, dtype=torch.bool)
    starts[:, 1:] = values[:, 1:] != values[:, :-1]
    first = torch.where(starts, pos, 0).cummax(dim=-1).values  # first sorted position of each tie group
    ends = torch.ones_like(starts)
    ends[:, :-1] = starts[:, 1:]
    last = torch.where(ends, pos, x.shape[1]).flip(-1).cummin(dim=-1).values.flip(-1)  # and its last one
    lo_above, hi_above = above.gather(1, first), above.gather(1, last)
    surely_kept = (hi_above < p - EPS) | (last < min_keep)
    surely_removed = (lo_above >= p + EPS) & (first >= min_keep)
    band = ~(surely_kept | surely_removed) & torch.isfinite(values)
    return torch.zeros_like(band).scatter_(1, order, band)


def assert_matches(ours: torch.Tensor, logits: torch.Tensor, p: float, min_keep: int = 1) -> None:
    """ours (B, V) against TopPLogitsWarper(p, min_keep) on float64 logits, row by row."""
    ref = TopPLogitsWarper(p, min_tokens_to_keep=max(min_keep, 1))(None, logits.double())
    kept, want = torch.isfinite(ours), torch.isfinite(ref)
    band = ambiguous(logits, p, min_keep)
    assert int(band.sum(dim=-1).max()) <= MAX_AMBIGUOUS, "the rounding band holds too many tokens"
    bad = (kept != want) & ~band
    assert not bool(bad.any()), f"p={p}: kept sets differ at (row, token) {bad.nonzero()[:8].tolist()}"
    assert torch.equal(ours[kept], logits[kept]), "kept logits must be the input logits, bitwise"
    assert not bool(torch.isfinite(ours[~kept]).any())
    # a top set: in every row no removed finite token beats a kept one
    lowest_kept = torch.where(kept, logits, float("inf")).amin(dim=-1)
    best_removed = torch.where(~kept & torch.isfinite(logits), logits, float("-inf")).amax(dim=-1)
    assert bool((lowest_kept >= best_removed).all())


@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("p", (0.1, 0.5, 0.9, 0.99))
def test_shared_p_matches_transformers_allclose(seed, vocab, p):
    logits = logits_for(seed, vocab)
    assert_matches(processed_scores(chain(p), logits), logits, p)


@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("scale", (0.5, 1.0, 4.0))
def test_flat_and_peaked_rows_match_transformers_allclose(vocab, scale):
    """Flat rows (scale 0.5) push the cut deep into the vocabulary: the partial top-k must grow past its first
    guess; peaked rows (scale 4) keep a handful."""
    logits = logits_for(21, vocab, scale)
    for p in (0.3, 0.8, 0.97):
        assert_matches(processed_scores(chain(p), logits), logits, p)


@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize(("p", "min_keep"), [(0.1, 5), (0.5, 3), (0.01, 2), (0.9, 1)])
def test_min_keep_matches_transformers_allclose(vocab, p, min_keep):
    logits = logits_for(3, vocab)
    ours = processed_scores(chain(p, min_keep), logits)
    assert_matches(ours, logits, p, min_keep)
    assert bool((torch.isfinite(ours).sum(dim=-1) >= min_keep).all())


@pytest.mark.parametrize("vocab", VOCABS)
def test_p_one_is_a_bitwise_no_op(vocab):
    logits = logits_for(9, vocab)
    assert_bitwise_no_op(chain(1.0), logits)


@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize(("min_keep", "kept"), [(1, 1), (3, 3), (7, 7)])
def test_p_zero_keeps_exactly_min_keep(vocab, min_keep, kept):
    """llama.cpp: p = 0 stops at the first token unless min_keep asks for more (top_p(0.0, min_keep=3) keeps 3)."""
    logits = logits_for(4, vocab)
    ours = processed_scores(chain(0.0, min_keep), logits)
    top = logits.topk(kept, dim=-1).indices
    expected = torch.zeros_like(logits, dtype=torch.bool).scatter_(1, top, True)
    assert torch.equal(torch.isfinite(ours), expected)


def test_p_zero_with_min_keep_zero_keeps_the_top_token():
    logits = logits_for(4, 50)
    out = chain(0.0, 0).sample(logits, return_scores=True)
    assert torch.equal(out.token_ids, logits.argmax(dim=-1))
    assert torch.equal(torch.isfinite(out.scores).sum(dim=-1), torch.ones(B, dtype=torch.int64))


@pytest.mark.parametrize("vocab", VOCABS)
def test_tiny_p_keeps_the_top_token(vocab):
    logits = logits_for(8, vocab)
    ours = processed_scores(chain(1e-9), logits)
    assert torch.equal(torch.isfinite(ours).sum(dim=-1), torch.ones(B, dtype=torch.int64))
    assert torch.equal(ours.argmax(dim=-1), logits.argmax(dim=-1))


@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("seed", SEEDS)
def test_per_row_p_equals_rows_alone_and_transformers(seed, vocab):
    """Heterogeneous rows (own p and min_keep, incl. disabled p = 1) equal each row run alone bitwise, and
    transformers per row (allclose band as above)."""
    rows = [
        {"top_p": 1.0},
        {"top_p": 0.9},
        {"top_p": 0.5, "min_keep": 4},
        {"top_p": 0.0, "min_keep": 3},
        {"top_p": 0.99},
        {"top_p": 0.3},
        {"top_p": 1.0, "min_keep": 9},
        {"top_p": 0.95},
    ]
    logits = logits_for(seed, vocab)
    batch = assert_rows_equal_alone(chain(), logits, rows)
    for i, params in enumerate(rows):
        p, keep = params["top_p"], params.get("min_keep", 1)
        if p >= 1.0:
            assert torch.equal(batch[i], logits[i])
        else:
            assert_matches(batch[i : i + 1], logits[i : i + 1], p, keep)


@pytest.mark.parametrize("vocab", (1000, 32000))
@pytest.mark.parametrize("p", (0.2, 0.8, 0.95))
def test_after_top_k_matches_transformers_pipeline(vocab, p):
    """On sorted, compacted candidates (after top_k) the mass is renormalised over the survivors, as in
    llama.cpp and in transformers' TopK -> TopP pipeline."""
    logits = logits_for(12, vocab)
    ours = processed_scores(chain(p, before=[{"use": "top_k", "k": 40}]), logits)
    after_k = TopKLogitsWarper(40)(None, logits.clone())
    assert_matches(ours, after_k, p)


def test_existing_minus_inf_entries_stay_masked():
    logits = logits_for(6, 1000)
    logits[:, 1::3] = float("-inf")
    ours = processed_scores(chain(0.9), logits)
    assert not bool(torch.isfinite(ours[:, 1::3]).any())
    assert_matches(ours, logits, 0.9)


def test_mass_exactly_at_p_from_float32_logits():
    """llama.cpp's test_top_p({0.1, 0.2, 0.3, 0.4}, p = 0.7) on logits logf(p): 0.4 + 0.3 reaches p, the 0.2 goes."""
    logits = torch.log(torch.tensor([[0.1, 0.2, 0.3, 0.4]]))
    ours = processed_scores(chain(0.7), logits)
    ref = TopPLogitsWarper(0.7)(None, logits.clone())
    assert torch.isfinite(ref).tolist() == [[False, False, True, True]]
    assert torch.equal(torch.isfinite(ours), torch.isfinite(ref))


def test_wide_vocab_mixed_rows_find_the_width_in_one_estimate():
    """Rows that need thousands of candidates next to rows that need a handful and rows with top_p off: the
    width estimate covers the flat rows only, and every row still matches transformers."""
    logits = random_logits(5, 6, 128256, 3.0)
    logits[1] = random_logits(6, 1, 128256, 30.0)[0]  # peaked: a few tokens reach p
    logits[4, ::2] = float("-inf")
    per_row = [{"top_p": 0.9}, {"top_p": 0.9}, {"top_p": 1.0}, {"top_p": 0.5}, {"top_p": 0.99}, {"top_p": 0.9}]
    ours = processed_scores(chain(0.9), logits, per_row)
    for row, params in enumerate(per_row):
        if params["top_p"] == 1.0:
            assert torch.equal(ours[row], logits[row])  # off: the row passes through
        else:
            assert_matches(ours[row : row + 1], logits[row : row + 1], params["top_p"])
    assert int(torch.isfinite(ours[0]).sum()) > 1000 and int(torch.isfinite(ours[1]).sum()) < 64
