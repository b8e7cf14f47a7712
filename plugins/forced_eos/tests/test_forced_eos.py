"""forced_eos.v1 against transformers' ForcedEOSTokenLogitsProcessor (bitwise: -inf everywhere but 0 at eos)."""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import ForcedEOSTokenLogitsProcessor

from samplechain import Chain
from samplechain.tools.testing import check_eos_ids_from_setup

EOS = [2, 7]


def chain(**params):
    return Chain.load({"samplers": [{"use": "forced_eos", "eos_ids": EOS, **params}, {"use": "greedy"}]})


@pytest.mark.parametrize("length", (3, 8, 9, 10))
def test_matches_transformers(length):
    logits = torch.randn(3, 60, generator=torch.Generator().manual_seed(length))
    history = torch.randint(0, 60, (3, length))
    ref = ForcedEOSTokenLogitsProcessor(10, EOS)(history, logits.clone())
    out = chain(max_length=10).sample(logits, history=history, prompt_lengths=torch.full((3,), 2), return_scores=True)
    assert torch.equal(out.scores, ref)


def test_per_row_max_length_with_left_padding():
    logits = torch.randn(3, 60)
    history = torch.randint(0, 60, (3, 6))
    history[1, :2] = -1  # 4 real tokens
    c = chain()
    store = c.new_store()
    for i, m in enumerate((0, 5, 8)):
        store.add(f"r{i}", {"forced_eos_max_length": m})
    out = c.sample(logits, store, ["r0", "r1", "r2"], history=history, return_scores=True)
    assert torch.equal(out.scores[0], logits[0]) and torch.equal(out.scores[2], logits[2])
    assert torch.equal(out.scores[1], ForcedEOSTokenLogitsProcessor(5, EOS)(torch.zeros(1, 4), logits[1:2].clone())[0])


def test_eos_ids_default_to_the_generations():
    logits = torch.randn(3, 60, generator=torch.Generator().manual_seed(5))
    check_eos_ids_from_setup(
        {"use": "forced_eos", "max_length": 5},
        logits,
        EOS,
        history=torch.zeros(3, 4, dtype=torch.long),
        prompt_lengths=torch.full((3,), 2),
    )
