"""temperature.v1 against transformers' TemperatureLogitsWarper (bitwise) and llama.cpp's edge semantics.

Equivalence level: bitwise. Dividing float32 logits by t is one IEEE operation per element, so the processed
scores must equal transformers' `scores / temperature` bit for bit, for a shared t and for per-row t alike.
"""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import TemperatureLogitsWarper

from samplechain import Chain
from samplechain.tools.testing import assert_bitwise_no_op, assert_rows_equal_alone, random_logits, sampler_chain

SEEDS = (0, 1, 2)
VOCABS = (50, 1000, 32000)
B = 8


def logits_for(seed: int, vocab: int, scale: float = 3.0) -> torch.Tensor:
    return random_logits(seed, B, vocab, scale)


def chain(t: float = 1.0) -> Chain:
    return sampler_chain({"use": "temperature", "t": t})


def scores_per_row(logits: torch.Tensor, ts: list[float]) -> torch.Tensor:
    """Processed scores of a batch whose row i has its own temperature ts[i] (a request per row), checked to equal
    each row run alone, bitwise."""
    return assert_rows_equal_alone(chain(), logits, [{"temperature": t} for t in ts])


@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("t", (0.05, 0.5, 0.7, 1.0, 1.5, 2.0, 10.0))
def test_shared_t_bitwise_equals_transformers(seed, vocab, t):
    logits = logits_for(seed, vocab)
    original = logits.clone()
    ours = chain(t).sample(logits, return_scores=True).scores
    ref = TemperatureLogitsWarper(t)(None, logits.clone())
    assert torch.equal(ours, ref)  # bitwise
    assert torch.equal(logits, original), "the caller's logits must not be modified in place"


@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("seed", SEEDS)
def test_per_row_t_bitwise_equals_transformers_and_rows_alone(seed, vocab):
    """Heterogeneous rows (each its own t, incl. the t = 1 no-op) equal transformers per row and each row alone,
    bitwise."""
    ts = [0.3, 0.7, 1.0, 1.3, 2.0, 0.05, 5.0, 0.9]
    logits = logits_for(seed, vocab)
    batch = scores_per_row(logits, ts)
    for i, t in enumerate(ts):
        ref = TemperatureLogitsWarper(float(t))(None, logits[i : i + 1].clone())[0]
        assert torch.equal(batch[i], ref), f"row {i} (t={t}) differs from transformers"


@pytest.mark.parametrize("vocab", VOCABS)
def test_t_one_is_a_bitwise_no_op(vocab):
    logits = logits_for(7, vocab)
    assert_bitwise_no_op(chain(1.0), logits)


@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("seed", SEEDS)
def test_t_zero_keeps_only_the_argmax(seed, vocab):
    """llama.cpp: temp <= 0 keeps only the most likely token (transformers rejects t = 0). The kept logit is
    unchanged."""
    logits = logits_for(seed, vocab)
    out = chain(0.0).sample(logits, return_scores=True)
    top = logits.argmax(dim=-1)
    expected_mask = torch.zeros_like(logits, dtype=torch.bool).scatter_(1, top[:, None], True)
    assert torch.equal(torch.isfinite(out.scores), expected_mask)
    assert torch.equal(out.scores.gather(1, top[:, None]), logits.gather(1, top[:, None]))
    assert torch.equal(out.token_ids, top)
    assert torch.all(out.logprobs == 0.0)


def test_t_zero_ties_keep_the_first_maximum():
    """llama.cpp's temp_impl keeps the first of equal maxima (strict `>` while scanning)."""
    logits = torch.tensor([[1.0, 3.0, 3.0, 2.0], [5.0, 5.0, 5.0, 5.0]])
    scores = chain(0.0).sample(logits, return_scores=True).scores
    assert torch.isfinite(scores).tolist() == [[False, True, False, False], [True, False, False, False]]


def test_mixed_zero_and_positive_rows_equal_rows_alone():
    logits = logits_for(3, 1000)
    ts = [0.0, 0.8, 0.0, 1.0, 2.5, 0.0, 0.4, 1.0]
    batch = scores_per_row(logits, ts)
    for i, t in enumerate(ts):
        if t == 0.0:
            assert int(torch.isfinite(batch[i]).sum()) == 1
        else:
            assert torch.equal(batch[i], logits[i] / t)


@pytest.mark.parametrize("t", (0.0, 0.3, 1.0, 4.0))
def test_argmax_invariant(t):
    logits = logits_for(11, 1000)
    assert torch.equal(chain(t).sample(logits).token_ids, logits.argmax(dim=-1))
    assert Chain.load({"samplers": [{"use": "temperature", "t": t}, {"use": "greedy"}]}).describe()[0][
        "argmax_invariant"
    ]


def test_half_precision_input_is_processed_in_float32():
    logits = logits_for(5, 1000).to(torch.bfloat16)
    ours = chain(0.7).sample(logits, return_scores=True).scores
    assert ours.dtype == torch.float32
    assert torch.equal(ours, TemperatureLogitsWarper(0.7)(None, logits.float()))
