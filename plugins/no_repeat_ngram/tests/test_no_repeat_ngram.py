"""no_repeat_ngram.v1 against transformers' NoRepeatNGramLogitsProcessor: the same -inf mask exactly, the other
logits bitwise, on random logits and real (repetitive) histories; per-row n equals rows alone; n = 0 a no-op."""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import NoRepeatNGramLogitsProcessor

from samplechain import Chain
from samplechain.tools.testing import assert_bitwise_no_op, assert_rows_equal_alone, processed_scores, sampler_chain


def chain(**params) -> Chain:
    return sampler_chain({"use": "no_repeat_ngram", **params})


def run(c, logits, history, per_row=None):
    return processed_scores(c, logits, per_row, history=history)


def case(seed, B=5, V=300, L=50, span=8):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, V, generator=g), torch.randint(0, span, (B, L), generator=g)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("n", (1, 2, 3, 4, 7))
def test_matches_transformers(seed, n):
    logits, history = case(seed)
    ref = NoRepeatNGramLogitsProcessor(n)(history, logits.clone())
    ours = run(chain(n=n), logits, history)
    assert torch.equal(torch.isinf(ours), torch.isinf(ref))
    assert torch.equal(ours, ref)


@pytest.mark.parametrize("n", (2, 3))
def test_left_padded_rows_equal_transformers_on_unpadded_rows(n):
    logits, history = case(9, B=3)
    history[1, :20] = -1
    history[2, :49] = -1  # one real token: no (n-1)-prefix yet for n >= 3
    ours = run(chain(n=n), logits, history)
    for b in range(3):
        row = history[b][history[b] >= 0][None, :]
        ref = NoRepeatNGramLogitsProcessor(n)(row, logits[b : b + 1].clone())
        assert torch.equal(ours[b : b + 1], ref)


def test_per_row_n_equals_rows_alone_and_zero_is_a_no_op():
    logits, history = case(3)
    rows = [{"no_repeat_ngram_size": k} for k in (0, 2, 3, 2, 5)]
    c = chain()
    batch = assert_rows_equal_alone(c, logits, rows, history=history)
    assert torch.equal(batch[0], logits[0])
    assert_bitwise_no_op(chain(n=0), logits, history=history)


def test_after_top_k_masks_the_same_tokens():
    logits, history = case(4)
    c = sampler_chain({"use": "no_repeat_ngram", "n": 2}, before=[{"use": "top_k", "k": 40}])
    ref = NoRepeatNGramLogitsProcessor(2)(history, logits.clone())
    keep = torch.zeros_like(logits, dtype=torch.bool).scatter_(1, logits.topk(40, dim=-1).indices, True)
    assert torch.equal(run(c, logits, history), ref.masked_fill(~keep, float("-inf")))
