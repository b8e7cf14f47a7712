"""inf_nan_remove.v1 equals transformers' InfNanRemoveLogitsProcessor bitwise on NaN and +inf, and in distribution on
-inf (kept masked here, the smallest float32 there); finite logits pass unchanged."""

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
    masked = logits == float("-inf")
    assert torch.equal(out.scores[~masked], ref[~masked])  # NaN -> 0, +inf -> the largest float32: bitwise
    assert bool((out.scores[masked] == float("-inf")).all())  # -inf stays removed (transformers: the smallest float)
    assert bool((ref[masked] == torch.finfo(torch.float32).min).all())
    assert torch.equal(torch.softmax(out.scores.double(), -1), torch.softmax(ref.double(), -1))  # same distribution
    assert out.token_ids[1] == 7  # +inf became the largest float: still the argmax


def test_a_token_removed_by_an_earlier_filter_stays_removed_in_any_batch():
    """Removed means removed: whether top_k compacts a row (alone) or masks it (beside a row with top_k off), the
    tokens it removed do not come back as the smallest float."""
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0], [0.0, 1.0, 2.0, 3.0]])
    c = Chain.load({"samplers": [{"use": "top_k", "k": 2}, {"use": "inf_nan_remove"}, {"use": "greedy"}]})
    store = c.new_store()
    store.add("a", {})
    store.add("b", {"top_k": 0})
    batch = c.process(logits, store, ["a", "b"])
    alone = c.process(logits[:1], store, ["a"])
    assert torch.equal(batch[0], alone[0])
    assert torch.equal(torch.isfinite(alone[0]), torch.tensor([True, True, False, False]))


def test_finite_logits_are_untouched():
    logits = torch.randn(2, 30)
    c = Chain.load({"samplers": [{"use": "inf_nan_remove"}, {"use": "greedy"}]})
    assert torch.equal(c.sample(logits, return_scores=True).scores, logits)
