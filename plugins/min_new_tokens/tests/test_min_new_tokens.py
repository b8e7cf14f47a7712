"""min_new_tokens.v1 against transformers' MinNewTokensLengthLogitsProcessor: the same -inf mask exactly,
other logits bitwise; per-row n (and padded prompts) equal each row alone; n = 0 a no-op."""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import MinNewTokensLengthLogitsProcessor

from samplechain import Chain
from samplechain.tools.testing import check_eos_ids_from_setup

EOS = [2, 50]


def chain(**params):
    return Chain.load({"samplers": [{"use": "min_new_tokens", "eos_ids": EOS, **params}, {"use": "greedy"}]})


def logits_for(seed, B=3, V=100):
    return torch.randn(B, V, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("generated", (0, 2, 4, 5, 9))
@pytest.mark.parametrize("n", (1, 5))
def test_matches_transformers(generated, n):
    prompt = 7
    history = torch.randint(0, 100, (3, prompt + generated), generator=torch.Generator().manual_seed(generated))
    logits = logits_for(generated)
    ref = MinNewTokensLengthLogitsProcessor(prompt, n, EOS)(history, logits.clone())
    ours = chain(n=n).sample(logits, history=history, prompt_lengths=torch.full((3,), prompt), return_scores=True)
    assert torch.equal(ours.scores, ref)


def test_per_row_n_with_padded_prompts_equals_transformers_per_row():
    logits = logits_for(3, B=4)
    history = torch.randint(0, 100, (4, 9), generator=torch.Generator().manual_seed(5))
    history[0, :4] = -1
    history[2, :2] = -1
    prompt_lengths = torch.tensor([3, 6, 7, 9])  # generated: 2, 3, 0, 0
    ns = [3, 3, 0, 1]
    c = chain()
    store = c.new_store()
    for i, n in enumerate(ns):
        store.add(f"r{i}", {"min_tokens": n})
    ours = c.sample(
        logits, store, [f"r{i}" for i in range(4)], history=history, prompt_lengths=prompt_lengths, return_scores=True
    ).scores
    for b in range(4):
        row = history[b][history[b] >= 0][None, :]
        ref = MinNewTokensLengthLogitsProcessor(int(prompt_lengths[b]), ns[b], EOS)(row, logits[b : b + 1].clone())
        assert torch.equal(ours[b : b + 1], ref), b
    assert torch.equal(ours[2], logits[2])


def test_after_top_k():
    logits = logits_for(4)
    logits[:, EOS] += 10
    c = Chain.load(
        {"samplers": [{"use": "top_k", "k": 5}, {"use": "min_new_tokens", "eos_ids": EOS, "n": 3}, {"use": "greedy"}]}
    )
    out = c.sample(
        logits, history=torch.zeros(3, 4, dtype=torch.long), prompt_lengths=torch.full((3,), 4), return_scores=True
    ).scores
    assert not bool(torch.isfinite(out[:, EOS]).any())
    assert int(torch.isfinite(out).sum()) == 3 * 3


def test_eos_ids_default_to_the_generations():
    logits = torch.randn(3, 60, generator=torch.Generator().manual_seed(5))
    check_eos_ids_from_setup(
        {"use": "min_new_tokens", "n": 3},
        logits,
        EOS,
        history=torch.zeros(3, 4, dtype=torch.long),
        prompt_lengths=torch.full((3,), 4),
    )
