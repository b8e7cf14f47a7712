"""mirostat_v2.v1 against llama.cpp's `llama_sampler_mirostat_v2_apply` (src/llama-sampler.cpp), written out below
in plain Python float math, and its invariants.

- Reference: for a scripted sequence of logits, the kept set and mu after every step equal the hand computation
  (tolerance 1e-4 bits: float32 in the plugin, float64 here), given the token the plugin drew.
- Control: with the embedded model, tau = 3 and eta = 0.1, mu stays bounded and the mean surprise of the second
  half of 150 tokens is within 0.75 bits of tau (see test_surprise_converges_to_tau_with_the_embedded_model).
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
    e = [math.exp(x - top) if x != NEG_INF else 0.0 for x in logits]
    total = sum(e)
    return [x / total for x in e]


def llama_mirostat_v2(logits: list[float], mu: float, tau: float, eta: float, token: int) -> tuple[list[int], float]:
    """llama_sampler_mirostat_v2_apply given the drawn token: (kept token ids, the updated mu)."""
    p = softmax(logits)
    order = sorted(range(len(logits)), key=lambda i: -logits[i])  # llama_sampler_softmax_impl(cur_p, true)
    kept = []
    for i in order:  # truncate at the first candidate with surprise > mu
        if p[i] == 0.0 or -math.log2(p[i]) > mu:
            break
        kept.append(i)
    kept = kept or order[:1]  # if (cur_p->size == 0) cur_p->size = 1
    p_kept = softmax([logits[i] for i in kept])  # renormalise the kept candidates
    surprise = -math.log2(p_kept[kept.index(token)])
    return kept, mu - eta * (surprise - tau)


def scripted_logits(steps: int, vocab: int) -> list[list[float]]:
    """Zipf-like rows with varying exponents, shuffled order, and a few masked (-inf) candidates."""
    g = torch.Generator().manual_seed(1234)
    rows = []
    for t in range(steps):
        s = 0.6 + 0.15 * t
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
@pytest.mark.parametrize("head", [[], [{"use": "top_k", "k": 12}]], ids=["all", "after_top_k"])
def test_mu_follows_llama_cpp_step_by_step(head):
    """Each step's kept set and mu equal llama.cpp's, over the candidates the chain passes in."""
    tau, eta = 2.0, 0.3
    chain = Chain.load({"samplers": [*head, {"use": "mirostat_v2", "tau": tau, "eta": eta}]})
    store = chain.new_store()
    store.add("a", {"seed": 11})
    mu = 2.0 * tau
    for row in scripted_logits(12, 40):
        out = chain.sample(torch.tensor([row]), store, ["a"])
        token = int(out.token_ids[0])
        seen = row
        if head:  # the reference runs on what top_k hands on, as llama.cpp's chain does
            top = sorted(range(len(row)), key=lambda i: -row[i])[:12]
            seen = [row[i] if i in top else NEG_INF for i in range(len(row))]
        kept, mu = llama_mirostat_v2(seen, mu, tau, eta, token)
        assert token in kept
        assert mu_of(store, "a") == pytest.approx(mu, abs=1e-4)


def test_first_step_starts_from_two_tau_and_keeps_at_least_one_token():
    """mu = 2 tau; with tau = 0 a peaked row keeps only its top token (llama.cpp keeps at least one)."""
    chain = Chain.load({"samplers": [{"use": "mirostat_v2", "tau": 0.0, "eta": 0.5}]})
    store = chain.new_store()
    store.add("a", {"seed": 3})
    row = [0.0, 5.0, 1.0, 2.0]
    for _ in range(10):
        assert int(chain.sample(torch.tensor([row]), store, ["a"]).token_ids[0]) == 1
    # surprise of the only kept token is 0: mu - 0.5 * (0 - 0) stays 0
    assert mu_of(store, "a") == 0.0


def test_draws_follow_the_truncated_distribution():
    """One step, 40,000 seeds: frequencies fit llama.cpp's renormalised kept set (chi-square p > 0.001)."""
    from scipy.stats import chisquare

    logits = torch.log(torch.tensor([[0.4, 0.25, 0.15, 0.1, 0.06, 0.04]]))
    tau = 1.75  # mu = 3.5 bits keeps p >= 2**-3.5 = 0.088: the first four
    chain = Chain.load({"samplers": [{"use": "mirostat_v2", "tau": tau, "eta": 0.1}]})
    store = chain.new_store(capacity=40_000)
    ids = [f"r{i}" for i in range(40_000)]
    for i, rid in enumerate(ids):
        store.add(rid, {"seed": 100_000 + i})
    tokens = chain.sample(logits.expand(len(ids), -1).contiguous(), store, ids).token_ids
    kept, _ = llama_mirostat_v2(logits[0].tolist(), 2 * tau, tau, 0.1, 0)
    assert sorted(kept) == [0, 1, 2, 3] and int(tokens.max()) <= 3
    observed = torch.bincount(tokens, minlength=4).double()
    expected = torch.tensor(softmax(logits[0, :4].tolist()), dtype=torch.float64) * len(ids)
    assert chisquare(observed.numpy(), expected.numpy()).pvalue > 1e-3


# ----------------------------------------------------------------- control, with a real model
@pytest.fixture(scope="module")
def model_and_tokenizer():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from samplechain.models import tiny_model_path

    path = tiny_model_path()
    return AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


def test_surprise_converges_to_tau_with_the_embedded_model(model_and_tokenizer):
    """Replaying llama.cpp's mu updates on the model's logits: every drawn token was in the kept set, mu stays
    bounded, and the second half's mean surprise is near tau.

    Tolerance: summing the update over the second half gives mean(surprise) - tau = (mu_75 - mu_150) / (eta * 75)
    exactly, so |mean - tau| <= 0.75 bits says mu moved by less than 5.6 bits over 75 steps, i.e. the controller
    holds mu in a band (it starts at 6; unconstrained sampling from this model averages well above 3 bits)."""
    from samplechain.generation import generate

    model, tok = model_and_tokenizer
    tau, eta, n = 3.0, 0.1, 150
    out = generate(
        model,
        tok,
        "The list type in Python",
        chain={"samplers": [{"use": "mirostat_v2", "tau": tau, "eta": eta}]},
        max_new_tokens=n,
        seed=5,
        ignore_eos=True,
        output_logits=True,
    )
    tokens = out.sequences[0, -n:].tolist()
    mu, surprises, mus = 2 * tau, [], []
    for step, token in enumerate(tokens):
        logits = out.logits[step][0].double().tolist()
        kept, new_mu = llama_mirostat_v2(logits, mu, tau, eta, token)
        assert token in kept, f"step {step}: token {token} is outside the kept set"
        surprises.append((mu - new_mu) / eta + tau)
        mu = new_mu
        mus.append(mu)
    second = surprises[n // 2 :]
    assert abs(sum(second) / len(second) - tau) < 0.75, (sum(second) / len(second), mus[::10])
    assert max(mus) < 12 and min(mus) > 0
    plain = generate(
        model,
        tok,
        "The list type in Python",
        chain={"samplers": [{"use": "dist"}]},
        max_new_tokens=n,
        seed=5,
        ignore_eos=True,
    )
    plain_surprise = float(-plain.logprobs[0, n // 2 :].mean()) / math.log(2)
    assert plain_surprise > tau + 1.5  # without the controller the same model is far above tau


# ----------------------------------------------------------------- randomness and state
class TestMirostatV2State(StatefulSamplerTests):
    sampler = {"use": "mirostat_v2", "tau": 2.0, "eta": 0.2}
    request_params = [{"mirostat_tau": 1.0 + i} for i in range(5)]


def test_forced_tokens_and_peeks_leave_mu_unchanged():
    """accept=False moves nothing; accepting a token no select() drew at that step (a forced token) keeps mu,
    as llama.cpp's mirostat, whose accept is empty."""
    chain = Chain.load({"samplers": [{"use": "mirostat_v2", "tau": 2.0, "eta": 0.3}]})
    store = chain.new_store()
    store.add("a", {"seed": 9})
    x = torch.randn(1, 100, generator=torch.Generator().manual_seed(4)) * 3
    chain.sample(x, store, ["a"])
    mu = mu_of(store, "a")
    peek = chain.sample(x, store, ["a"], accept=False)
    assert mu_of(store, "a") == mu
    chain.accept(store, ["a"], peek.token_ids)  # the peeked step, accepted late: mu moves as in sample()
    moved = mu_of(store, "a")
    assert moved != mu
    chain.accept(store, ["a"], torch.tensor([42]))  # forced, no select() for this step
    assert mu_of(store, "a") == moved
