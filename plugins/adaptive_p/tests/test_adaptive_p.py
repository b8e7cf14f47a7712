"""adaptive_p.v1 against llama.cpp's `llama_sampler_adaptive_p_apply` / `_accept` (src/llama-sampler.cpp, PR
#17927), written out below in plain Python float math, and its invariants.

- Reference: for a scripted sequence of logits, the EMA (weighted_sum, total_weight) after every step equals the
  hand computation given the drawn token (1e-5 relative: float32 vs float64); draws fit the transformed
  distribution (chi-square, 40,000 fixed seeds, p > 0.001).
- A negative target is a plain draw: the same tokens as `dist` with the same seed, and the EMA never moves.
- Randomness and state (samplechain.tools.state_testing.StatefulSamplerTests): a seeded request draws the same
  tokens alone, in a batch, at any row; its EMA survives snapshot()/restore() (through JSON); requests join and
  leave without disturbing others.
- An accepted token other than the selected one leaves the EMA unchanged (as llama.cpp's accept).
"""

from __future__ import annotations

import math

import pytest
import torch

from samplechain import Chain
from samplechain.tools.state_testing import StatefulSamplerTests

NEG_INF = float("-inf")
WIDTH, PEAK, SHARPNESS = 0.3, 5.0, 10.0  # llama.cpp's DISTRIBUTION_WIDTH, PEAK_LOGIT_VALUE, SHARPNESS


# ----------------------------------------------------------------- llama.cpp, in plain Python
def softmax(logits: list[float]) -> list[float]:
    top = max(logits)
    e = [math.exp(x - top) if x != NEG_INF else 0.0 for x in logits]
    total = sum(e)
    return [x / total for x in e]


def initial_ema(target: float, decay: float) -> tuple[float, float]:
    return target / (1.0 - decay), 1.0 / (1.0 - decay)


def transformed(logits: list[float], target: float, weighted_sum: float, total_weight: float) -> list[float]:
    """llama_sampler_adaptive_p_apply's transformed logits (target >= 0)."""
    p = softmax(logits)
    goal = min(max(target, 0.0), 1.0)
    adapted = goal if total_weight == 0.0 else 2.0 * goal - weighted_sum / total_weight
    adapted = min(max(adapted, 0.0), 1.0)
    out = []
    for x, q in zip(logits, p):
        if x == NEG_INF:
            out.append(NEG_INF)
            continue
        d = abs((q - adapted) / WIDTH)
        out.append(PEAK - SHARPNESS * d * d / (1.0 + d))
    return out


def accept(logits: list[float], token: int, decay: float, weighted_sum: float, total_weight: float):
    """llama_sampler_adaptive_p_accept for the selected token: the EMA of its *original* probability."""
    return softmax(logits)[token] + decay * weighted_sum, 1.0 + decay * total_weight


def scripted_logits(steps: int, vocab: int) -> list[list[float]]:
    g = torch.Generator().manual_seed(4321)
    rows = []
    for t in range(steps):
        row = torch.randn(vocab, generator=g) * (0.5 + 0.3 * (t % 5))
        row[torch.randperm(vocab, generator=g)[:2]] = NEG_INF
        rows.append(row.tolist())
    return rows


def ema_of(store, rid: str) -> tuple[float, float, bool]:
    state = store.snapshot([rid])[rid]["state"]
    get = {k.rsplit(".", 1)[1]: v for k, v in state.items()}
    return get["weighted_sum"], get["total_weight"], get["started"]


# ----------------------------------------------------------------- reference
def test_ema_follows_llama_cpp_step_by_step():
    target, decay = 0.3, 0.8
    chain = Chain.load({"samplers": [{"use": "adaptive_p", "target": target, "decay": decay}]})
    store = chain.new_store()
    store.add("a", {"seed": 31})
    ws, tw = initial_ema(target, decay)
    for row in scripted_logits(15, 30):
        token = int(chain.sample(torch.tensor([row]), store, ["a"]).token_ids[0])
        assert row[token] != NEG_INF
        ws, tw = accept(row, token, decay, ws, tw)
        got_ws, got_tw, started = ema_of(store, "a")
        assert started
        assert got_ws == pytest.approx(ws, rel=1e-5) and got_tw == pytest.approx(tw, rel=1e-5)


@pytest.mark.parametrize("history", [0, 6])
def test_draws_follow_the_transformed_distribution(history):
    """40,000 seeds draw one step (after `history` steps that moved the EMA): frequencies fit
    softmax(transformed logits) of the hand computation."""
    from scipy.stats import chisquare

    target, decay = 0.25, 0.7
    logits = torch.log(torch.tensor([0.45, 0.2, 0.12, 0.1, 0.06, 0.04, 0.02, 0.01]))
    chain = Chain.load({"samplers": [{"use": "adaptive_p", "target": target, "decay": decay}]})
    n = 40_000
    store = chain.new_store(capacity=n)
    ids = [f"r{i}" for i in range(n)]
    for i, rid in enumerate(ids):
        store.add(rid, {"seed": 200_000 + i})
    for _ in range(history):  # a row with one candidate: every request selects token 0 with original p = 1
        peaked = torch.full((n, 8), NEG_INF)
        peaked[:, 0] = 0.0
        chain.sample(peaked, store, ids)
    ws, tw = initial_ema(target, decay)
    for _ in range(history):
        ws, tw = ws * decay + 1.0, tw * decay + 1.0  # original p of the only candidate is 1
    tokens = chain.sample(logits.expand(n, -1).contiguous(), store, ids).token_ids
    q = softmax(transformed(logits.tolist(), target, ws, tw))
    observed = torch.bincount(tokens, minlength=8).double()
    expected = torch.tensor(q, dtype=torch.float64) * n
    assert chisquare(observed.numpy(), expected.numpy()).pvalue > 1e-3


def test_negative_target_is_a_plain_draw():
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(6, 10, 100, generator=g) * 2

    def run(sampler: dict) -> list[list[int]]:
        chain = Chain.load({"samplers": [sampler]})
        store = chain.new_store()
        ids = [f"r{i}" for i in range(6)]
        for i, rid in enumerate(ids):
            store.add(rid, {"seed": 50 + i})
        tokens = [chain.sample(logits[:, s], store, ids).token_ids.tolist() for s in range(10)]
        if sampler["use"] == "adaptive_p":
            assert all(not ema_of(store, rid)[2] for rid in ids)  # the EMA never moved
        return tokens

    assert run({"use": "adaptive_p", "target": -1.0}) == run({"use": "dist"})


# ----------------------------------------------------------------- randomness and state
class TestAdaptivePState(StatefulSamplerTests):
    sampler = {"use": "adaptive_p", "target": 0.3}
    request_params = [{"adaptive_target": 0.1 + 0.2 * i, "adaptive_decay": 0.5 + 0.1 * i} for i in range(5)]
    scale = 2.0


def test_accepting_another_token_leaves_the_ema_unchanged():
    """llama.cpp updates the EMA only when the accepted token is the one adaptive-p selected."""
    chain = Chain.load({"samplers": [{"use": "adaptive_p", "target": 0.3, "decay": 0.5}]})
    store = chain.new_store()
    store.add("a", {"seed": 9})
    x = torch.randn(1, 50, generator=torch.Generator().manual_seed(4)) * 2
    chain.sample(x, store, ["a"])
    before = ema_of(store, "a")
    peek = chain.sample(x, store, ["a"], accept=False)
    other = (int(peek.token_ids[0]) + 1) % 50
    chain.accept(store, ["a"], torch.tensor([other]))
    assert ema_of(store, "a") == before
    chain.sample(x, store, ["a"])
    assert ema_of(store, "a") != before


def test_parameters_are_validated():
    from samplechain import ConfigError

    with pytest.raises(ConfigError, match="decay"):
        Chain.load({"samplers": [{"use": "adaptive_p", "target": 0.3, "decay": 1.0}]})
    with pytest.raises(ConfigError, match="target"):
        Chain.load({"samplers": [{"use": "adaptive_p", "target": 1.5}]})
