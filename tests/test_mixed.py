"""Mixed chains in one batch: rows on different chains (other samplers, other order) give exactly what their chain
gives them alone; a failure in any group changes no request; generate() takes one chain per prompt."""

from __future__ import annotations

import pytest
import torch

from samplechain import Chain, ConfigError, MixedChains, RequestError, SamplingError
from samplechain.generation import generate
from samplechain.tools.testing import byte_bpe_tokenizer, tiny_gpt2

A = {"samplers": [{"use": "top_k", "k": 20}, {"use": "temperature", "t": 0.7}, {"use": "dist"}]}
B = {
    "samplers": [
        {"use": "temperature", "t": 1.3},
        {"use": "top_p", "p": 0.8},
        {"use": "min_p", "p": 0.05},
        {"use": "dist"},
    ]
}
C = {"samplers": [{"use": "temperature", "t": 1.0}, {"use": "mirostat_v2", "tau": 3.0, "eta": 0.2}]}
G = {"samplers": [{"use": "greedy"}]}


def logits_for(step: int, batch: int = 6, vocab: int = 200) -> torch.Tensor:
    return torch.randn(batch, vocab, generator=torch.Generator().manual_seed(step)) * 2


def test_rows_on_different_chains_equal_their_chain_alone_over_several_steps():
    chains = {"a": Chain.load(A), "b": Chain.load(B), "c": Chain.load(C), "g": Chain.load(G)}
    mixed = MixedChains(chains)
    store = mixed.new_store()
    rows = [("r0", "a", 1), ("r1", "c", 2), ("r2", "b", 3), ("r3", "a", 4), ("r4", "g", None), ("r5", "c", 6)]
    for rid, key, seed in rows:
        store.add(rid, {"seed": seed} if seed is not None else None, chain=key)
    alone = {}
    for rid, key, seed in rows:
        c = Chain.load({"a": A, "b": B, "c": C, "g": G}[key])
        s = c.new_store()
        s.add(rid, {"seed": seed} if seed is not None else None)
        alone[rid] = (c, s)
    ids = [r[0] for r in rows]
    for step in range(5):
        logits = logits_for(step)
        out = mixed.sample(logits, store, ids, return_scores=True)
        for b, rid in enumerate(ids):
            c, s = alone[rid]
            ref = c.sample(logits[b : b + 1], s, [rid], return_scores=True)
            assert int(out.token_ids[b]) == int(ref.token_ids[0]), (step, rid)
            assert torch.equal(out.logprobs[b], ref.logprobs[0])
            assert torch.equal(out.scores[b], ref.scores[0])
    # the per-request state (mirostat mu) advanced in the mixed store exactly as alone
    assert store.stores["c"].snapshot(["r1"])["r1"] == alone["r1"][1].snapshot(["r1"])["r1"]


def test_teacher_forcing_a_mixed_batch_gives_each_row_what_its_chain_gives_it_alone():
    """accept=token_ids on a mixed batch: each row's given token's logprob and rank under its own chain, and its
    chain's state (mirostat's mu) moved by the given token, as Chain.sample(accept=...) alone."""
    chains = {"a": Chain.load(A), "c": Chain.load(C)}
    mixed = MixedChains(chains)
    store = mixed.new_store()
    rows = [("r0", "a", 1), ("r1", "c", 2), ("r2", "a", 3)]
    alone = {}
    for rid, key, seed in rows:
        store.add(rid, {"seed": seed}, chain=key)
        c = Chain.load({"a": A, "c": C}[key])
        alone[rid] = (c, c.new_store())
        alone[rid][1].add(rid, {"seed": seed})
    ids = [r[0] for r in rows]
    for step in range(4):
        logits = logits_for(step, batch=3)
        given = logits.topk(3, dim=-1).indices[:, step % 3]  # likely tokens, not always the draw
        out = mixed.sample(logits, store, ids, accept=given, logprobs_at="raw")
        for b, rid in enumerate(ids):
            c, s = alone[rid]
            ref = c.sample(logits[b : b + 1], s, [rid], accept=given[b : b + 1], logprobs_at="raw")
            assert int(out.token_ids[b]) == int(ref.token_ids[0]), (step, rid)
            assert torch.equal(out.logprobs[b], ref.logprobs[0]) and int(out.ranks[b]) == int(ref.ranks[0])
    assert store.stores["c"].snapshot(["r1"])["r1"] == alone["r1"][1].snapshot(["r1"])["r1"]
    with pytest.raises(SamplingError, match=r"accept= token ids must be a \(B=3,\)"):
        mixed.sample(logits_for(9, batch=3), store, ids, accept=torch.tensor([1, 2]))


def test_a_failing_group_changes_no_request_of_any_group():
    mixed = MixedChains({"a": Chain.load(A), "bad": Chain.load(G), "c": Chain.load(C)})
    store = mixed.new_store()
    for rid, key in (("x", "a"), ("y", "c"), ("z", "bad")):
        store.add(rid, {"seed": 1} if key != "bad" else None, chain=key)
    before = store.snapshot()
    logits = logits_for(0, 3)
    logits[2, 7] = float("nan")  # the last group (row z) fails after the other two computed their updates
    with pytest.raises(SamplingError, match="NaN"):
        mixed.sample(logits, store, ["x", "y", "z"])
    assert store.snapshot() == before


def test_unknown_chain_or_request_is_a_clear_error():
    mixed = MixedChains([Chain.load(A), Chain.load(G)])
    store = mixed.new_store()
    with pytest.raises(ConfigError, match="not one of"):
        store.add("q", chain="zz")
    store.add("q", chain="0")
    with pytest.raises(RequestError, match="unknown request 'nope'"):
        mixed.sample(logits_for(0, 2), store, ["q", "nope"])
    with pytest.raises(RequestError, match=r"request_ids = 'q': a list of ids, one per row \(e.g. \['q'\]\)"):
        mixed.sample(logits_for(0, 1), store, "q")
    with pytest.raises(ConfigError, match=r"logprobs_at = 5: one stage for the batch"):
        mixed.sample(logits_for(0, 1), store, ["q"], logprobs_at=5)


def test_a_mixed_restore_is_all_or_nothing():
    mixed = MixedChains([Chain.load(A), Chain.load(G)])
    store = mixed.new_store()
    store.add("a", {"seed": 1}, chain="0")
    store.add("b", chain="1")
    saved = store.snapshot()
    other = mixed.new_store()
    other.add("b", chain="1")
    before = other.snapshot()
    with pytest.raises(RequestError, match=r"request id\(s\) \['b'\] already in the store"):
        other.restore(saved)  # 'a' (chain 0) restores before 'b' (chain 1) clashes: it is taken out again
    assert other.snapshot() == before
    with pytest.raises(RequestError, match=r"expected a snapshot\(\) of a store of these chains \(\['0', '1'\]\)"):
        other.restore({"stores": {"9": {}}, "route": {}})
    fresh = mixed.new_store()
    fresh.restore(saved)
    assert fresh.snapshot() == saved


@pytest.fixture(scope="module")
def lm():
    tok = byte_bpe_tokenizer()
    return tiny_gpt2(vocab_size=len(tok)), tok


def test_generate_with_one_chain_per_prompt_equals_each_prompt_alone(lm):
    model, tok = lm
    prompts = ["abc", "hello there", "x"]
    chains = [Chain.load(A), Chain.load(C), Chain.load(A)]
    both = generate(model, tok, prompts, chain=chains, max_new_tokens=6, seed=11, ignore_eos=True)
    for i, (p, c) in enumerate(zip(prompts, [A, C, A])):
        alone = generate(model, tok, p, chain=Chain.load(c), max_new_tokens=6, seed=11, ignore_eos=True)
        assert both.texts[i] == alone.texts[0]
    with pytest.raises(ConfigError, match="one chain per prompt"):
        generate(model, tok, prompts, chain=chains[:2], max_new_tokens=2)
    with pytest.raises(ConfigError, match="one chain, not one per prompt"):
        generate(model, tok, prompts, chain=[Chain.load(G)] * 3, max_new_tokens=2, num_beams=2)


def test_chains_with_different_stop_criteria_are_refused(lm):
    model, tok = lm
    stop_a = {**A, "stop": [{"use": "max_new_tokens", "n": 3}]}
    with pytest.raises(ConfigError, match="different \\[stop\\] criteria"):
        generate(model, tok, ["a", "b"], chain=[Chain.load(stop_a), Chain.load(A)], max_new_tokens=2)
