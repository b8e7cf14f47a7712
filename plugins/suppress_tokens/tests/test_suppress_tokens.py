"""suppress_tokens.v1 / begin_suppress_tokens.v1 against transformers' SuppressTokensLogitsProcessor and
SuppressTokensAtBeginLogitsProcessor: the same -inf mask exactly, other logits bitwise."""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import (
    SuppressTokensAtBeginLogitsProcessor,
    SuppressTokensLogitsProcessor,
)

from samplechain import Chain, ConfigError

IDS = [0, 5, 17, 199, 4000]  # 4000: outside the vocabulary, ignored as transformers does


def chain(use, before=(), **params):
    return Chain.load({"samplers": [*before, {"use": use, **params}, {"use": "greedy"}]})


def logits_for(seed, B=4, V=200):
    return torch.randn(B, V, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("seed", range(3))
def test_suppress_matches_transformers(seed):
    logits = logits_for(seed)
    ref = SuppressTokensLogitsProcessor(IDS)(torch.zeros(4, 3, dtype=torch.long), logits.clone())
    assert torch.equal(chain("suppress_tokens", ids=IDS).sample(logits, return_scores=True).scores, ref)


def test_suppress_after_top_k_and_empty_is_a_no_op():
    logits = logits_for(4)
    logits[:, [5, 17]] += 10
    ref = SuppressTokensLogitsProcessor(IDS)(None, logits.clone())
    top = logits.topk(20, dim=-1).indices
    want = torch.full_like(logits, float("-inf")).scatter_(1, top, ref.gather(1, top))
    got = chain("suppress_tokens", before=[{"use": "top_k", "k": 20}], ids=IDS).sample(logits, return_scores=True)
    assert torch.equal(got.scores, want)
    assert torch.equal(chain("suppress_tokens").sample(logits, return_scores=True).scores, logits)


@pytest.mark.parametrize("generated", (0, 1, 3))
@pytest.mark.parametrize("at", (0, 1, 3))
def test_begin_suppress_matches_transformers(generated, at):
    logits = logits_for(generated + 7 * at)
    prompt = 6
    history = torch.randint(0, 200, (4, prompt + generated), generator=torch.Generator().manual_seed(1))
    ref = SuppressTokensAtBeginLogitsProcessor(IDS, begin_index=prompt + at)(history, logits.clone())
    c = chain("begin_suppress_tokens", ids=IDS, at=at)
    ours = c.sample(logits, history=history, prompt_lengths=torch.full((4,), prompt), return_scores=True).scores
    assert torch.equal(ours, ref)


def test_begin_suppress_per_row_with_padded_prompts():
    """Rows of different prompt lengths (left padding) and per-row `at`: each row equals transformers alone."""
    logits = logits_for(9)
    history = torch.randint(0, 200, (4, 8), generator=torch.Generator().manual_seed(2))
    history[1, :3] = -1
    history[3, :5] = -1
    prompt_lengths = torch.tensor([8, 4, 6, 2])  # generated: 0, 1, 2, 1
    ats = [0, 1, 0, 2]
    c = chain("begin_suppress_tokens", ids=IDS)
    store = c.new_store()
    for i, a in enumerate(ats):
        store.add(f"r{i}", {"begin_suppress_at": a})
    ours = c.sample(
        logits, store, [f"r{i}" for i in range(4)], history=history, prompt_lengths=prompt_lengths, return_scores=True
    ).scores
    for b in range(4):
        row = history[b][history[b] >= 0][None, :]
        ref = SuppressTokensAtBeginLogitsProcessor(IDS, begin_index=int(prompt_lengths[b]) + ats[b])(
            row, logits[b : b + 1].clone()
        )
        assert torch.equal(ours[b : b + 1], ref), b


def test_negative_ids_are_configuration_errors():
    with pytest.raises(ConfigError, match="ids"):
        chain("suppress_tokens", ids=[-1])
