"""forced_bos.v1 against transformers' ForcedBOSTokenLogitsProcessor (bitwise: -inf everywhere but 0 at bos)."""

from __future__ import annotations

import torch
from transformers.generation.logits_process import ForcedBOSTokenLogitsProcessor

from samplechain import Chain


def chain(**params):
    return Chain.load({"samplers": [{"use": "forced_bos", **params}, {"use": "greedy"}]})


def test_matches_transformers_at_the_first_step_and_after():
    logits = torch.randn(3, 60, generator=torch.Generator().manual_seed(0))
    c = chain(bos_id=11)
    for length in (1, 2, 5):  # the decoder start, then generated tokens
        history = torch.zeros(3, length, dtype=torch.long)
        ref = ForcedBOSTokenLogitsProcessor(11)(history, logits.clone())
        out = c.sample(logits, history=history, prompt_lengths=torch.ones(3, dtype=torch.long), return_scores=True)
        assert torch.equal(out.scores, ref), length
    assert out.token_ids.tolist() == logits.argmax(-1).tolist()


def test_per_row_ids_and_disabled_rows():
    logits = torch.randn(3, 60)
    c = chain()
    store = c.new_store()
    for i, bos in enumerate((-1, 4, 9)):
        store.add(f"r{i}", {"forced_bos_token_id": bos})
    out = c.sample(
        logits,
        store,
        ["r0", "r1", "r2"],
        history=torch.zeros(3, 2, dtype=torch.long),
        prompt_lengths=torch.full((3,), 2),
        return_scores=True,
    )
    assert out.token_ids.tolist() == [int(logits[0].argmax()), 4, 9]
    assert torch.equal(out.scores[0], logits[0])
    assert torch.equal(out.scores[1], ForcedBOSTokenLogitsProcessor(4)(torch.zeros(1, 1), logits[1:2].clone())[0])
