"""greedy.v1: the chosen token is torch.argmax of the processed logits (bitwise token ids), the first of equal
maxima as llama.cpp's greedy sampler; the logprob is log_softmax of the processed logits at it (allclose)."""

from __future__ import annotations

import pytest
import torch

from samplechain import Chain
from samplechain.tools.testing import top_k_only

SEEDS = (0, 1, 2)
VOCABS = (50, 1000, 32000)
B = 8


def logits_for(seed: int, vocab: int, scale: float = 2.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, vocab, generator=g) * scale


def greedy(*before: dict) -> Chain:
    return Chain.load({"samplers": [*before, {"use": "greedy"}]})


@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("seed", SEEDS)
def test_equals_argmax(seed, vocab):
    logits = logits_for(seed, vocab)
    out = greedy().sample(logits)
    assert out.token_ids.dtype == torch.int64
    assert torch.equal(out.token_ids, logits.argmax(dim=-1))
    expected = torch.log_softmax(logits.double(), dim=-1).gather(1, out.token_ids[:, None]).squeeze(1)
    torch.testing.assert_close(out.logprobs.double(), expected, rtol=1e-5, atol=1e-5)


def test_ties_pick_the_first_maximum():
    logits = torch.tensor([[0.0, 2.0, 2.0, 1.0], [3.0, 3.0, 3.0, 3.0], [-1.0, -2.0, -1.0, -3.0]])
    assert greedy().sample(logits).token_ids.tolist() == [1, 0, 0]


@pytest.mark.parametrize("vocab", VOCABS)
def test_half_precision_inputs(vocab):
    for dtype in (torch.float16, torch.bfloat16):
        logits = logits_for(4, vocab).to(dtype)
        assert torch.equal(greedy().sample(logits).token_ids, logits.float().argmax(dim=-1))


def test_masked_candidates_are_never_chosen():
    logits = logits_for(5, 1000)
    top = logits.argmax(dim=-1)
    logits.scatter_(1, top[:, None], float("-inf"))  # mask each row's best token
    assert torch.equal(greedy().sample(logits).token_ids, logits.argmax(dim=-1))
    assert not bool((greedy().sample(logits).token_ids == top).any())


@pytest.mark.parametrize("vocab", (1000, 32000))
def test_after_compaction_returns_token_ids_not_positions(vocab):
    """After top_k the candidate axis is compacted (K = 5); the selector's position must map back to the id."""
    logits = logits_for(6, vocab)
    out = greedy({"use": "top_k", "k": 5}).sample(logits, return_scores=True)
    assert torch.equal(out.token_ids, logits.argmax(dim=-1))
    expected_scores = top_k_only(logits, 5)
    assert torch.equal(out.scores, expected_scores)
    # logprob under the processed (top-5) distribution
    expected = torch.log_softmax(logits.topk(5, dim=-1).values.double(), dim=-1)[:, 0]
    torch.testing.assert_close(out.logprobs.double(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("vocab", VOCABS)
def test_batch_rows_equal_rows_alone(vocab):
    logits = logits_for(7, vocab)
    batch = greedy().sample(logits)
    for i in range(B):
        alone = greedy().sample(logits[i : i + 1])
        assert int(alone.token_ids[0]) == int(batch.token_ids[i])
        assert torch.equal(alone.logprobs[0], batch.logprobs[i])


def test_single_token_vocabulary():
    out = greedy().sample(torch.tensor([[1.5], [-3.0]]))
    assert out.token_ids.tolist() == [0, 0]
    assert out.logprobs.tolist() == [0.0, 0.0]


def test_is_argmax_invariant_and_stateless():
    (entry,) = greedy().describe()
    assert entry["argmax_invariant"] and not entry["stateful"]
