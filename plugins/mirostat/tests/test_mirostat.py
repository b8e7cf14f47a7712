"""mirostat.v1 against llama.cpp's `llama_sampler_mirostat_apply` (src/llama-sampler.cpp), written out below in
plain Python float math, and its invariants.

- Reference: for a scripted sequence of logits (masked candidates included), s_hat, k, the kept set and mu after
  every step equal the hand computation, given the token the plugin drew (mu to 1e-4: float32 vs float64).
- Control: on a Zipf-like stream mu stays bounded and the second half's mean surprise is near tau.
- Randomness and state (samplechain.tools.state_testing.StatefulSamplerTests): a seeded request draws the same
  tokens alone, in a batch, at any row; its mu survives snapshot()/restore() (through JSON); requests join and
  leave without disturbing others.
"""

from __future__ import annotations

import math

import pytest
import torch

from samplechain import Chain
from samplechain.tools.state_testing import StatefulSamplerTests

NEG_INF = float("-inf")


# ----------------------------------------------------------------- llama.cpp, in plain Python
def softmax(logits: list[float]) -> list[float]:
    top = max(logits)
    e = [math.exp(x - top) for x in logits]
    total = sum(e)
    return [x / total for x in e]


def llama_mirostat_k(logits: list[float], mu: float, m: int, n_vocab: int) -> tuple[list[int], int]:
    """The candidates (ids, descending) and llama.cpp's k; -inf candidates are not candidates."""
    order = sorted((i for i, x in enumerate(logits) if x != NEG_INF), key=lambda i: -logits[i])
    p = softmax([logits[i] for i in order])
    sum_ti_bi = sum_ti_sq = 0.0
    for i in range(min(m - 1, len(order) - 1)):  # the most probable m tokens
        t_i = math.log((i + 2) / (i + 1))
        b_i = math.log(p[i] / p[i + 1])
        sum_ti_bi += t_i * b_i
        sum_ti_sq += t_i * t_i
    s_hat = sum_ti_bi / sum_ti_sq
    epsilon_hat = s_hat - 1
    k = ((epsilon_hat * 2**mu) / (1 - n_vocab ** (-epsilon_hat))) ** (1 / s_hat)
    return order, min(max(int(k), 1), len(order))


def llama_mirostat(logits, mu, tau, eta, m, n_vocab, token) -> tuple[list[int], float]:
    """llama_sampler_mirostat_apply given the drawn token: (kept token ids, the updated mu)."""
    order, k = llama_mirostat_k(logits, mu, m, n_vocab)
    kept = order[:k]
    p_kept = softmax([logits[i] for i in kept])
    surprise = -math.log2(p_kept[kept.index(token)])
    return kept, mu - eta * (surprise - tau)


def scripted_logits(steps: int, vocab: int, seed: int = 1234) -> list[list[float]]:
    """Zipf-like rows with varying exponents, shuffled order, and a few masked (-inf) candidates."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for t in range(steps):
        s = 0.8 + 0.1 * (t % 7)
        row = -s * torch.log(torch.arange(1, vocab + 1, dtype=torch.float64)) + 0.05 * torch.randn(
            vocab, generator=g, dtype=torch.float64
        )
        row = row[torch.randperm(vocab, generator=g)].float()
        row[torch.randperm(vocab, generator=g)[:3]] = NEG_INF
        rows.append(row.tolist())
    return rows


def mu_of(store, rid: str) -> float:
    state = store.snapshot([rid])[rid]["state"]
    (key,) = [k for k in state if k.endswith(".mu")]
    return state[key]


# ----------------------------------------------------------------- reference
@pytest.mark.parametrize("m", [100, 5])
def test_mu_follows_llama_cpp_step_by_step(m):
    tau, eta, vocab = 3.0, 0.2, 64
    chain = Chain.load({"samplers": [{"use": "mirostat", "tau": tau, "eta": eta, "m": m}]})
    store = chain.new_store()
    store.add("a", {"seed": 21})
    mu, sizes = 2.0 * tau, set()
    for row in scripted_logits(14, vocab):
        out = chain.sample(torch.tensor([row]), store, ["a"])
        token = int(out.token_ids[0])
        kept, mu = llama_mirostat(row, mu, tau, eta, m, vocab, token)
        sizes.add(len(kept))
        assert token in kept
        assert mu_of(store, "a") == pytest.approx(mu, abs=1e-4)
    assert len(sizes) > 3 and max(sizes) < vocab - 3  # k really varied and really truncated


def test_k_matches_llama_cpp():
    """The plugin's k (kept-set size) for many rows and mu values equals the hand computation."""
    from samplechain_mirostat import mirostat_k

    rows = scripted_logits(30, 500, seed=7)
    logits = torch.tensor(rows)
    mu = torch.linspace(1.0, 12.0, len(rows))
    got = mirostat_k(logits, mu, torch.full((len(rows),), 100), 500).tolist()
    want = [llama_mirostat_k(r, float(u), 100, 500)[1] for r, u in zip(rows, mu.tolist())]
    assert got == want
    assert len(set(want)) > 10


def test_one_candidate_and_m_1_keep_one_token():
    """s_hat = 0/0 there: llama.cpp's int(NaN) keeps one candidate (max(int(k), 1) on x86)."""
    chain = Chain.load({"samplers": [{"use": "mirostat", "tau": 3.0, "eta": 0.1, "m": 1}]})
    out = chain.sample(torch.tensor([[0.0, 3.0, 1.0, 2.0]] * 50))
    assert out.token_ids.tolist() == [1] * 50
    chain = Chain.load({"samplers": [{"use": "top_k", "k": 1}, {"use": "mirostat", "tau": 3.0, "eta": 0.1}]})
    assert chain.sample(torch.tensor([[0.0, 3.0, 1.0, 2.0]])).token_ids.tolist() == [1]


def test_surprise_converges_to_tau():
    """On 300 scripted Zipf rows mu stays bounded and the second half's mean surprise is within 0.5 bits of tau
    (mean - tau = (mu_150 - mu_300) / (eta * 150) exactly, so this says mu moved less than 7.5 bits)."""
    tau, eta, vocab = 4.0, 0.1, 1000
    chain = Chain.load({"samplers": [{"use": "mirostat", "tau": tau, "eta": eta}]})
    store = chain.new_store()
    store.add("a", {"seed": 8})
    rows = scripted_logits(300, vocab, seed=99)
    mu, surprises = 2 * tau, []
    for row in rows:
        token = int(chain.sample(torch.tensor([row]), store, ["a"]).token_ids[0])
        _, new_mu = llama_mirostat(row, mu, tau, eta, 100, vocab, token)
        surprises.append((mu - new_mu) / eta + tau)
        mu = new_mu
    second = surprises[150:]
    assert abs(sum(second) / len(second) - tau) < 0.5
    assert mu_of(store, "a") == pytest.approx(mu, abs=1e-2)


# ----------------------------------------------------------------- randomness and state
class TestMirostatState(StatefulSamplerTests):
    sampler = {"use": "mirostat", "tau": 2.0, "eta": 0.2}
    request_params = [{"mirostat_tau": 1.0 + i, "mirostat_m": 20 * (i + 1)} for i in range(5)]


def test_reset_restarts_mu_at_two_tau():
    chain = Chain.load({"samplers": [{"use": "mirostat", "tau": 2.0, "eta": 0.3}]})
    store = chain.new_store()
    store.add("a", {"seed": 1})
    x = torch.randn(1, 100, generator=torch.Generator().manual_seed(4)) * 3
    first = [int(chain.sample(x, store, ["a"]).token_ids[0]) for _ in range(4)]
    store.reset("a")
    assert [int(chain.sample(x, store, ["a"]).token_ids[0]) for _ in range(4)] == first
