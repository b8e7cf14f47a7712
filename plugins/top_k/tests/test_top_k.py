"""top_k.v1 against transformers' TopKLogitsWarper and llama.cpp's edge semantics.

Equivalence level: bitwise. The kept set (finite mask of the (B, V) scores) is compared exactly and the kept
logits bit for bit; top-k never changes a logit. transformers keeps every token tied with the k-th value, top_k.v1
keeps exactly k: the test data is checked to have no tie at the k-th place, so the two must agree exactly.
"""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import TopKLogitsWarper

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


def logits_for(seed: int, vocab: int, scale: float = 2.0) -> torch.Tensor:
    return random_logits(seed, B, vocab, scale)


def chain(k: int = 0, min_keep: int = 1, before: list | None = None) -> Chain:
    return sampler_chain({"use": "top_k", "k": k, "min_keep": min_keep}, before=before)


def assert_no_tie_at(logits: torch.Tensor, k: int) -> None:
    if k < logits.shape[1]:
        values = logits.topk(k + 1, dim=-1).values
        assert bool((values[:, k - 1] != values[:, k]).all()), "test data has a tie at the k-th place"


def assert_same(ours: torch.Tensor, ref: torch.Tensor) -> None:
    """Kept set exactly, kept logits bitwise (and -inf everywhere else)."""
    assert torch.equal(torch.isfinite(ours), torch.isfinite(ref)), "kept sets differ"
    assert torch.equal(ours, ref)


@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("k", (1, 2, 5, 40, 49, 500))
def test_shared_k_bitwise_equals_transformers(seed, vocab, k):
    logits = logits_for(seed, vocab)
    assert_no_tie_at(logits, min(k, vocab))
    ours = processed_scores(chain(k), logits)
    ref = TopKLogitsWarper(k)(None, logits.clone())
    assert_same(ours, ref)
    assert torch.equal(torch.isfinite(ours).sum(dim=-1), torch.full((B,), min(k, vocab)))


@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize(("k", "min_keep"), [(1, 3), (2, 5), (10, 4), (3, 3), (5, 0)])
def test_min_keep_bitwise_equals_transformers(vocab, k, min_keep):
    """transformers keeps max(top_k, min_tokens_to_keep); so does top_k.v1 (min_keep 0 is llama.cpp's default)."""
    logits = logits_for(5, vocab)
    assert_no_tie_at(logits, max(k, min_keep))
    ours = processed_scores(chain(k, min_keep), logits)
    ref = TopKLogitsWarper(k, min_tokens_to_keep=max(min_keep, 1))(None, logits.clone())
    assert_same(ours, ref)


@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("k", (0, -1, -100))
def test_k_not_positive_is_a_no_op(vocab, k):
    """llama.cpp: k <= 0 disables top-k (transformers rejects it)."""
    logits = logits_for(9, vocab)
    assert_bitwise_no_op(chain(k), logits)


@pytest.mark.parametrize("vocab", VOCABS)
def test_k_at_least_vocab_is_a_no_op(vocab):
    logits = logits_for(9, vocab)
    for k in (vocab, vocab + 1, 10 * vocab):
        assert_bitwise_no_op(chain(k), logits)


@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("seed", SEEDS)
def test_per_row_k_equals_transformers_and_rows_alone(seed, vocab):
    """Heterogeneous rows (own k and min_keep, incl. disabled rows) equal transformers per row and each row run
    alone, bitwise."""
    rows = [
        {"top_k": 1},
        {"top_k": 0},
        {"top_k": 40},
        {"top_k": 3, "min_keep": 7},
        {"top_k": -1},
        {"top_k": vocab},
        {"top_k": 17},
        {"top_k": min(1000, vocab - 1)},
    ]
    logits = logits_for(seed, vocab)
    c = chain(0)
    batch = assert_rows_equal_alone(c, logits, rows)
    for i, params in enumerate(rows):
        k, keep = params["top_k"], params.get("min_keep", 1)
        if k <= 0:
            assert torch.equal(batch[i], logits[i])
            continue
        assert_no_tie_at(logits[i : i + 1], min(max(k, keep), vocab))
        ref = TopKLogitsWarper(k, min_tokens_to_keep=keep)(None, logits[i : i + 1].clone())[0]
        assert_same(batch[i], ref)


@pytest.mark.parametrize("vocab", (1000, 32000))
def test_after_a_filter_bitwise_equals_transformers_pipeline(vocab):
    """Second top-k on already compacted, sorted candidates (the keep_first path) still scatters back exactly."""
    logits = logits_for(4, vocab)
    ours = processed_scores(chain(7, before=[{"use": "top_k", "k": 100, "id": "coarse"}]), logits)
    ref = TopKLogitsWarper(7)(None, TopKLogitsWarper(100)(None, logits.clone()))
    assert_same(ours, ref)


def test_existing_minus_inf_entries_stay_masked():
    logits = logits_for(6, 50)
    logits[:, ::2] = float("-inf")  # 25 finite candidates per row
    ours = processed_scores(chain(10), logits)
    ref = TopKLogitsWarper(10)(None, logits.clone())
    assert_same(ours, ref)
    assert torch.equal(torch.isfinite(ours).sum(dim=-1), torch.full((B,), 10))


def test_greedy_after_top_k_returns_token_ids():
    logits = logits_for(8, 1000)
    out = chain(5).sample(logits)
    assert torch.equal(out.token_ids, logits.argmax(dim=-1))
