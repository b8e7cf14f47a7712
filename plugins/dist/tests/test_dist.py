"""dist.v1: seeded draws from softmax(processed logits), checked statistically (statistical equivalence).

Chi-square goodness of fit (scipy.stats.chisquare) on 200,000 draws over a known V = 8 distribution, drawn as
2,000 requests with distinct fixed seeds x 100 positions each, so the test is deterministic. Pass: p-value > 0.001.
The same draws also test independence across positions (consecutive tokens of a request) and across neighbouring
seeds (requests whose seeds differ by 1), against the product distribution on 64 cells.
"""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare

from samplechain import Chain

PROBS = [0.30, 0.20, 0.15, 0.12, 0.10, 0.07, 0.04, 0.02]
V = len(PROBS)
ALPHA = 1e-3


def dist_chain(*before: dict) -> Chain:
    # a pass-through temperature keeps dist at chain index 1, so its noise stream matches chains with a filter
    head = list(before) or [{"use": "temperature", "t": 1.0}]
    return Chain.load({"samplers": [*head, {"use": "dist"}]})


def draw(chain: Chain, logits: torch.Tensor, seeds: list[int], steps: int) -> torch.Tensor:
    """(len(seeds), steps) tokens: one request per seed, `steps` accepted positions each."""
    store = chain.new_store(capacity=len(seeds))
    ids = [f"s{s}" for s in seeds]
    for rid, s in zip(ids, seeds):
        store.add(rid, {"seed": s})
    batch = logits.expand(len(seeds), -1).contiguous()
    return torch.stack([chain.sample(batch, store, ids).token_ids for _ in range(steps)], dim=1)


@pytest.fixture(scope="module")
def logits() -> torch.Tensor:
    return torch.log(torch.tensor(PROBS, dtype=torch.float32))[None, :]


@pytest.fixture(scope="module")
def tokens(logits) -> torch.Tensor:
    return draw(dist_chain(), logits, list(range(10_000, 12_000)), 100)  # 200,000 draws


def target(logits: torch.Tensor) -> torch.Tensor:
    return torch.softmax(logits[0].double(), dim=-1)


def test_chi_square_goodness_of_fit_200k_draws(tokens, logits):
    assert tokens.numel() == 200_000
    observed = torch.bincount(tokens.flatten(), minlength=V).double()
    expected = target(logits) * tokens.numel()
    result = chisquare(observed.numpy(), expected.numpy())
    assert result.pvalue > ALPHA, (observed.tolist(), expected.tolist(), result)


def test_consecutive_positions_are_independent(tokens, logits):
    pairs = (tokens[:, :-1] * V + tokens[:, 1:]).flatten()
    observed = torch.bincount(pairs, minlength=V * V).double()
    p = target(logits)
    expected = torch.outer(p, p).flatten() * pairs.numel()
    assert chisquare(observed.numpy(), expected.numpy()).pvalue > ALPHA


def test_neighbouring_seeds_are_independent(tokens, logits):
    pairs = (tokens[0::2, :] * V + tokens[1::2, :]).flatten()  # seeds 2i and 2i + 1 at the same position
    observed = torch.bincount(pairs, minlength=V * V).double()
    p = target(logits)
    expected = torch.outer(p, p).flatten() * pairs.numel()
    assert chisquare(observed.numpy(), expected.numpy()).pvalue > ALPHA


def test_draws_from_the_processed_distribution(logits):
    """After temperature 0.5 and top_k 3: 60,000 draws fit softmax(top-3 logits / 0.5); nothing else is drawn."""
    chain = Chain.load({"samplers": [{"use": "temperature", "t": 0.5}, {"use": "top_k", "k": 3}, {"use": "dist"}]})
    tokens = draw(chain, logits, list(range(600)), 100)
    assert int(tokens.max()) <= 2
    observed = torch.bincount(tokens.flatten(), minlength=3).double()
    expected = torch.softmax(logits[0, :3].double() / 0.5, dim=-1) * tokens.numel()
    assert chisquare(observed.numpy(), expected.numpy()).pvalue > ALPHA


def test_masked_candidates_are_never_drawn():
    logits = torch.zeros(1, 16)
    logits[0, ::2] = float("-inf")
    tokens = draw(dist_chain(), logits, list(range(200)), 20)
    assert bool((tokens % 2 == 1).all())
    assert set(tokens.flatten().tolist()) == set(range(1, 16, 2))


def test_same_seed_and_position_give_the_same_token_in_any_batch(logits):
    """Counter-based noise: a request's draw depends on neither its neighbours nor its row."""
    chain = dist_chain()
    g = torch.Generator().manual_seed(0)
    batch_logits = torch.randn(6, 1000, generator=g)
    seeds = [3, 1, 4, 1_000_000_007, 5, 2**62 + 9]

    def run(order: list[int]) -> dict[int, list[int]]:
        store = chain.new_store()
        ids = [f"r{i}" for i in order]
        for i in order:
            store.add(f"r{i}", {"seed": seeds[i]})
        x = batch_logits[order]
        steps = [chain.sample(x, store, ids).token_ids.tolist() for _ in range(5)]
        return {i: [step[row] for step in steps] for row, i in enumerate(order)}

    together = run([0, 1, 2, 3, 4, 5])
    assert run([5, 3, 1, 0, 4, 2]) == together
    for i in range(6):
        assert run([i]) == {i: together[i]}


def test_noise_is_keyed_by_token_id_not_by_position():
    """A filter that keeps the unfiltered choice cannot change it (Gumbel-max over a subset holding the argmax)."""
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(256, 1000, generator=g) * 3.0
    seeds = list(range(256))

    def first_step(chain: Chain) -> torch.Tensor:
        store = chain.new_store(capacity=256)
        ids = [f"s{s}" for s in seeds]
        for rid, s in zip(ids, seeds):
            store.add(rid, {"seed": s})
        return chain.sample(logits, store, ids).token_ids

    unfiltered = first_step(dist_chain())
    filtered = first_step(dist_chain({"use": "top_k", "k": 50}))
    top50 = logits.topk(50, dim=-1).indices
    inside = (top50 == unfiltered[:, None]).any(dim=-1)
    assert int(inside.sum()) > 200  # the comparison covers most rows
    assert torch.equal(filtered[inside], unfiltered[inside])
    assert bool((top50 == filtered[:, None]).any(dim=-1).all())


def test_logprob_is_that_of_the_chosen_token(logits):
    chain = dist_chain()
    store = chain.new_store()
    store.add("a", {"seed": 7})
    out = chain.sample(logits, store, ["a"])
    expected = torch.log_softmax(logits[0].double(), dim=-1)[out.token_ids[0]]
    assert abs(float(out.logprobs[0]) - float(expected)) < 1e-6


def test_positions_advance_only_when_accepted(logits):
    chain = dist_chain()
    store = chain.new_store()
    store.add("a", {"seed": 99})
    x = logits.expand(1, -1).contiguous()
    peeked = [int(chain.sample(x, store, ["a"], accept=False).token_ids) for _ in range(3)]
    assert len(set(peeked)) == 1  # same position every time
    taken = [int(chain.sample(x, store, ["a"]).token_ids) for _ in range(40)]
    assert taken[0] == peeked[0]
    assert len(set(taken)) > 1  # the position moved on
