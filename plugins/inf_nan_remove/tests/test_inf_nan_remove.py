"""inf_nan_remove.v1 equals transformers' InfNanRemoveLogitsProcessor bitwise; finite logits pass unchanged."""

from __future__ import annotations

import torch
from transformers.generation.logits_process import InfNanRemoveLogitsProcessor

from samplechain import Chain


def test_matches_transformers_bitwise():
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(0))
    logits[0, 3] = float("nan")
    logits[1, 7] = float("inf")
    logits[2, :10] = float("-inf")
    logits[3, 1] = float("nan")
    logits[3, 2] = float("-inf")
    ref = InfNanRemoveLogitsProcessor()(None, logits.clone())
    c = Chain.load({"samplers": [{"use": "inf_nan_remove"}, {"use": "greedy"}]})
    out = c.sample(logits, return_scores=True)
    assert torch.equal(out.scores, ref)
    assert out.token_ids[1] == 7  # +inf became the largest float: still the argmax


def test_finite_logits_are_untouched():
    logits = torch.randn(2, 30)
    c = Chain.load({"samplers": [{"use": "inf_nan_remove"}, {"use": "greedy"}]})
    assert torch.equal(c.sample(logits, return_scores=True).scores, logits)
