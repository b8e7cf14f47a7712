"""renormalize.v1 against transformers' LogitNormalization, on the full vocabulary and after top-k / top-p (the
same scores, allclose 1e-6; -inf exactly)."""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import LogitNormalization, TopKLogitsWarper

from samplechain import Chain


@pytest.mark.parametrize("seed", range(3))
def test_matches_transformers(seed):
    logits = torch.randn(4, 500, generator=torch.Generator().manual_seed(seed)) * 3
    logits[0, :100] = float("-inf")
    ref = LogitNormalization()(None, logits.clone())
    c = Chain.load({"samplers": [{"use": "renormalize"}, {"use": "greedy"}]})
    out = c.sample(logits, return_scores=True).scores
    assert torch.equal(torch.isinf(out), torch.isinf(ref))
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)


def test_after_top_k_matches_transformers_pipeline():
    logits = torch.randn(4, 500, generator=torch.Generator().manual_seed(9))
    ref = LogitNormalization()(None, TopKLogitsWarper(20)(None, logits.clone()))
    c = Chain.load({"samplers": [{"use": "top_k", "k": 20}, {"use": "renormalize"}, {"use": "greedy"}]})
    out = c.sample(logits, return_scores=True).scores
    assert torch.equal(torch.isinf(out), torch.isinf(ref))
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)
    assert torch.allclose(out.exp().sum(-1), torch.ones(4))
