"""sequence_bias.v1 against transformers' SequenceBiasLogitsProcessor on random logits and histories built to
end in the biased prefixes (allclose 1e-6, -inf exactly); empty = no-op; compacted candidates."""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import SequenceBiasLogitsProcessor

from samplechain import Chain, ConfigError

NEG = float("-inf")
BIAS = [
    [[7], 2.0],
    [[3, 9], -4.0],
    [[1, 2, 9], 1.5],
    [[4, 4, 4, 11], NEG],
    [[5, 12], 3.0],
    [[6, 12], -1.0],
    [[8, 13], NEG],
]


def run(bias, logits, history, before=()):
    c = Chain.load({"samplers": [*before, {"use": "sequence_bias", "bias": bias}, {"use": "greedy"}]})
    return c.sample(logits, history=history, return_scores=True).scores


def case(seed, B=8, V=200, L=12):
    g = torch.Generator().manual_seed(seed)
    logits, history = torch.randn(B, V, generator=g), torch.randint(0, 16, (B, L), generator=g)
    tails = [[3], [1, 2], [4, 4, 4], [5], [6], [8], [2, 3], [4, 4]]  # rows end in (parts of) the prefixes
    for b, t in enumerate(tails[:B]):
        history[b, L - len(t) :] = torch.tensor(t)
    return logits, history


@pytest.mark.parametrize("seed", range(4))
def test_matches_transformers(seed):
    logits, history = case(seed)
    ref = SequenceBiasLogitsProcessor(BIAS)(history, logits.clone())
    ours = run(BIAS, logits, history)
    assert torch.equal(torch.isinf(ours), torch.isinf(ref))
    torch.testing.assert_close(ours, ref, rtol=1e-6, atol=1e-6)


def test_compacted_candidates_see_the_same_bias():
    logits, history = case(1)
    logits[:, [7, 9, 11, 12, 13]] += 10.0  # keep the biased tokens among the top 30
    ref = SequenceBiasLogitsProcessor(BIAS)(history, logits.clone())
    top = logits.topk(30, dim=-1).indices
    want = torch.full_like(logits, NEG).scatter_(1, top, ref.gather(1, top))
    torch.testing.assert_close(run(BIAS, logits, history, before=[{"use": "top_k", "k": 30}]), want)


def test_left_padding_never_matches():
    logits, history = case(2, B=1, L=3)
    history[0] = torch.tensor([-1, -1, 3])
    ours = run([[[3, 9], -4.0], [[0, 3, 9], 5.0], [[0, 0, 3, 9], 5.0]], logits, history)
    want = logits.clone()
    want[0, 9] -= 4.0
    assert torch.equal(ours, want)


def test_empty_is_a_no_op():
    logits, history = case(3)
    assert torch.equal(run([], logits, history), logits)


@pytest.mark.parametrize("bad", ([[[], 1.0]], [[[1, -2], 1.0]], [[[1], float("nan")]], [[1, 2]], {"1": 2.0}))
def test_malformed_is_a_configuration_error(bad):
    with pytest.raises(ConfigError, match="bias"):
        Chain.load({"samplers": [{"use": "sequence_bias", "bias": bad}, {"use": "greedy"}]})
