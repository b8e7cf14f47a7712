"""allowed_tokens.v1: the same scores as transformers' SuppressTokensLogitsProcessor over the complement of the
allowed ids (bitwise), compacted to the allowed ids; after top-k the intersection; empty = no-op."""

from __future__ import annotations

import torch
from transformers.generation.logits_process import SuppressTokensLogitsProcessor

from samplechain import Chain

ALLOWED = [3, 10, 11, 50, 99, 5000]  # 5000: outside the vocabulary, ignored


def chain(before=(), **params):
    return Chain.load({"samplers": [*before, {"use": "allowed_tokens", **params}, {"use": "greedy"}]})


def test_matches_suppressing_the_complement_and_compacts():
    logits = torch.randn(4, 100, generator=torch.Generator().manual_seed(0))
    ref = SuppressTokensLogitsProcessor([t for t in range(100) if t not in ALLOWED])(None, logits.clone())
    out = chain(ids=ALLOWED).sample(logits, return_scores=True)
    assert torch.equal(out.scores, ref)
    assert set(out.token_ids.tolist()) <= set(ALLOWED)


def test_after_top_k_keeps_the_intersection():
    logits = torch.randn(4, 100, generator=torch.Generator().manual_seed(1))
    logits[:, [10, 50]] += 10
    top = logits.topk(10, dim=-1).indices
    keep = torch.zeros_like(logits, dtype=torch.bool).scatter_(1, top, True)
    keep[:, [t for t in range(100) if t not in ALLOWED]] = False
    out = chain(before=[{"use": "top_k", "k": 10}], ids=ALLOWED).sample(logits, return_scores=True)
    assert torch.equal(out.scores, logits.masked_fill(~keep, float("-inf")))


def test_empty_is_a_no_op():
    logits = torch.randn(2, 30)
    assert torch.equal(chain().sample(logits, return_scores=True).scores, logits)
