"""Executor fast paths keep results: an order-preserving temperature before a rank-only top_k runs after it (on the
k survivors), with the same processed scores and the same tokens as the two samplers in the written order."""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper

from samplechain import Chain
from samplechain.tools.testing import random_logits, request_store


def _chain(*entries) -> Chain:
    return Chain.load({"chain": {"samplers": [*entries, {"use": "dist", "seed": 3}]}})


def _widths(chain: Chain, monkeypatch) -> list[tuple[str, int]]:
    seen: list[tuple[str, int]] = []
    for sampler in chain.samplers[:-1]:
        apply = sampler.apply

        def spy(cand, ctx, _apply=apply, _name=sampler.name):
            seen.append((_name, cand.width))
            return _apply(cand, ctx)

        monkeypatch.setattr(sampler, "apply", spy)
    return seen


def test_temperature_runs_after_top_k_with_identical_scores_and_tokens(monkeypatch):
    logits = random_logits(0, 6, 50257, scale=3.0)
    swapped = _chain({"use": "temperature", "t": 0.7}, {"use": "top_k", "k": 40})
    seen = _widths(swapped, monkeypatch)
    scores = swapped.process(logits)
    assert seen == [("top_k", 50257), ("temperature", 40)]
    ref = TopKLogitsWarper(40)(None, TemperatureLogitsWarper(0.7)(None, logits.clone()))
    assert torch.equal(scores, ref)  # x / t then top-k == top-k then x / t, bitwise
    # the written order, forced: the same tokens from the same seeds
    written = _chain({"use": "temperature", "t": 0.7}, {"use": "top_k", "k": 40})
    monkeypatch.setattr(written.samplers[0], "preserves_order", lambda ctx: False)
    for step in range(3):
        a = swapped.sample(logits, accept=False).token_ids
        b = written.sample(logits, accept=False).token_ids
        assert torch.equal(a, b), step


def test_no_swap_for_per_row_temperatures_or_zero(monkeypatch):
    logits = random_logits(1, 3, 4096)
    chain = _chain({"use": "temperature", "t": 0.7}, {"use": "top_k", "k": 40})
    seen = _widths(chain, monkeypatch)
    store, ids = request_store(chain, [{"temperature": 0.5}, {"temperature": 0.0}, {}])
    chain.sample(logits, store, ids)
    assert seen == [("temperature", 4096), ("top_k", 4096)]  # t = 0 keeps the first argmax of the full row


def test_no_swap_before_filters_that_read_probabilities(monkeypatch):
    chain = _chain({"use": "temperature", "t": 0.7}, {"use": "top_p", "p": 0.9})
    seen = _widths(chain, monkeypatch)
    chain.process(random_logits(2, 2, 4096))
    assert [name for name, _ in seen] == ["temperature", "top_p"]


# ---------------------------------------------------------------- the cpu backend against the plain reference
CHAINS = {
    "llama.cpp": [
        {"use": "penalties", "repeat": 1.1, "presence": 0.2, "last_n": 64},
        {"use": "top_k", "k": 40},
        {"use": "top_p", "p": 0.95},
        {"use": "min_p", "p": 0.05},
        {"use": "temperature", "t": 0.8},
    ],
    "top_p": [{"use": "top_p", "p": 0.9}],
    "min_p": [{"use": "min_p", "p": 0.05}, {"use": "temperature", "t": 0.8}],
    "temperature_first": [{"use": "temperature", "t": 0.7}, {"use": "top_k", "k": 50}, {"use": "top_p", "p": 0.9}],
}
PER_ROW = [
    {},
    {"top_p": 0.5, "min_p": 0.2, "seed": 11},
    {"top_k": 5, "temperature": 1.3},
    {"top_p": 1.0, "min_p": 0.0},
    {"min_keep": 60, "seed": 5},
    {"top_k": 0, "top_p": 0.99},
]


def _wide_logits(kind: str) -> torch.Tensor:
    x = random_logits(7, len(PER_ROW), 50257, scale=3.0)
    if kind == "ties":
        x = torch.round(x)
    elif kind == "masked":
        x[:, 1::2] = float("-inf")
    elif kind == "extreme":
        x[:, ::101] += 80.0  # a wide band of huge logits (distinct: ties are the "ties" case)
        x[:, 3::97] = -1e30
    return x


@pytest.mark.parametrize("kind", ["randn", "ties", "masked", "extreme"])
@pytest.mark.parametrize("name", list(CHAINS))
def test_cpu_fast_paths_give_the_reference_tokens(name, kind):
    """The cpu backend (chunked top-k and at-least) against the plain reference primitives (torch.topk, count then
    top-k): the same seeded tokens, the same kept sets, per-row parameters differing across rows."""
    from samplechain.tools.testing import host_with

    logits = _wide_logits(kind)
    history = torch.randint(0, 50257, (len(PER_ROW), 96), generator=torch.Generator().manual_seed(3))
    config = {"samplers": [*CHAINS[name], {"use": "dist", "seed": 42}]}
    results = []
    for backend in ("cpu", "recording"):
        chain = Chain.load({**config, "backend": backend}, host=host_with())
        names = {alias for sampler in chain.samplers for alias in sampler.request_aliases}
        store, ids = request_store(chain, [{k: v for k, v in row.items() if k in names} for row in PER_ROW])
        steps = [chain.sample(logits, store, ids, history=history, return_scores=True) for _ in range(3)]
        results.append(steps)
    for fast, ref in zip(*results):
        kept_fast, kept_ref = torch.isfinite(fast.scores), torch.isfinite(ref.scores)
        if kind != "ties":  # tied logits at the k-th place may resolve to other tokens (torch.topk's is unspecified)
            assert torch.equal(fast.token_ids, ref.token_ids)
            assert torch.equal(kept_fast, kept_ref)
        assert torch.equal(kept_fast.sum(dim=-1), kept_ref.sum(dim=-1))
        assert torch.equal(fast.scores[kept_fast].sort().values, ref.scores[kept_ref].sort().values)


# ---------------------------------------------------------------- penalties -> top_k without the (B, V) copy
def _fusion_case(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(6, 50257, generator=g) * 3
    history = torch.randint(0, 50257, (6, 80), generator=g)
    # row 1: its history holds the 60 largest logits (more changed tokens than the first guess of 16 extra)
    top60 = logits[1].topk(60).indices
    history[1, -60:] = top60
    logits[4, 40:] = float("-inf")  # row 4: fewer finite tokens than some rows keep
    history[4, -3:] = torch.tensor([3, 7, 11])
    return logits, history


FUSED_CHAIN = [
    {"use": "penalties", "repeat": 1.3, "frequency": 0.2, "presence": -0.5, "last_n": 64},
    {"use": "dry", "multiplier": 0.0, "breakers": []},
    {"use": "top_n_sigma", "n": -1.0},
    {"use": "top_k", "k": 40},
    {"use": "dist", "seed": 9},
]


@pytest.mark.parametrize("seed", [0, 1])
def test_penalties_then_top_k_fused_equals_the_two_in_turn(seed, monkeypatch):
    monkeypatch.setattr("samplechain.engine.stages._FUSE_MIN", 0)  # fuse at this small size too
    logits, history = _fusion_case(seed)
    per_row = [
        {},
        {"top_k": 50},
        {"repeat_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0},
        {"top_k": 3, "penalty_last_n": -1},
        {},
        {"min_keep": 45},
    ]
    results = []
    for fused in (True, False):
        chain = Chain.load({"samplers": FUSED_CHAIN})
        calls = []
        original = chain.samplers[0].apply
        monkeypatch.setattr(
            chain.samplers[0], "apply", lambda c, x, _o=original, _calls=calls: _calls.append(1) or _o(c, x)
        )
        if not fused:
            monkeypatch.setattr(chain.samplers[0], "sparse_changes", lambda c, x: None)
        store, ids = request_store(chain, per_row)
        out = chain.sample(logits, store, ids, history=history, return_scores=True)
        results.append((out, len(calls)))
    (fast, fast_calls), (ref, ref_calls) = results
    assert ref_calls == 1 and fast_calls <= 1  # row 4 sends the batch to the usual path (fewer finite than kept)
    assert torch.equal(fast.scores, ref.scores)
    assert torch.equal(fast.token_ids, ref.token_ids)


def test_the_fusion_runs_when_every_row_has_enough_candidates(monkeypatch):
    monkeypatch.setattr("samplechain.engine.stages._FUSE_MIN", 0)  # fuse at this small size too
    logits, history = _fusion_case(0)
    logits, history = logits[:4], history[:4]
    chain = Chain.load({"samplers": FUSED_CHAIN})
    monkeypatch.setattr(chain.samplers[0], "apply", lambda c, x: pytest.fail("penalties copied the logits"))
    out = chain.process(logits, history=history)
    plain = Chain.load({"samplers": FUSED_CHAIN})
    monkeypatch.setattr(plain.samplers[0], "sparse_changes", lambda c, x: None)
    assert torch.equal(out, plain.process(logits, history=history))


# ---------------------------------------------------------------- full-vocabulary masks compact when they keep few
def test_a_wide_mask_that_keeps_few_compacts_in_token_order():
    from samplechain import Candidates

    logits = random_logits(4, 3, 50257, scale=3.0)
    keep = logits > 7.0
    keep[2] = False
    keep[2, [5, 70000 % 50257, 50256]] = True  # a row with 3 survivors among longer rows
    cand = Candidates(logits, None, 50257, False, False).masked(keep)
    assert cand.ids is not None and cand.width == int(keep.sum(dim=-1).max())
    assert torch.equal(cand.scores(), torch.where(keep, logits, float("-inf")))
    for row in range(3):
        kept = cand.ids[row][torch.isfinite(cand.logits[row])]
        assert torch.equal(kept, keep[row].nonzero().flatten())  # ascending ids: argmax ties resolve as before
        assert cand.ids[row].unique().numel() == cand.width
    # keeping much of the row masks in place, as before
    wide = Candidates(logits, None, 50257, False, False).masked(logits > -1.0)
    assert wide.ids is None and wide.width == 50257


@pytest.mark.parametrize("name", ["epsilon", "eta", "typical", "p_less"])
def test_mask_filters_give_the_same_tokens_compacted_or_not(name, monkeypatch):
    import samplechain.candidates as contracts

    params = {"epsilon": {"epsilon": 3e-4}, "eta": {"epsilon": 3e-4}, "typical": {"p": 0.5}, "p_less": {}}[name]
    logits = random_logits(6, 4, 32768, scale=4.0)
    outs = []
    for width in (contracts._COMPACT_WIDTH, 10**9):
        monkeypatch.setattr(contracts, "_COMPACT_WIDTH", width)
        chain = Chain.load({"samplers": [{"use": name, **params}, {"use": "dist", "seed": 2}]})
        outs.append([chain.sample(logits, return_scores=True, accept=False) for _ in range(2)])
    for compact, full in zip(*outs):
        assert torch.equal(compact.scores, full.scores)
        assert torch.equal(compact.token_ids, full.token_ids)
        assert torch.allclose(compact.logprobs, full.logprobs)


def test_small_batches_are_not_fused(monkeypatch):
    """Below ~1 M logits the (B, V) copy is cheaper than the fusion's extra calls: penalties apply as written."""
    logits, history = _fusion_case(0)
    chain = Chain.load({"samplers": FUSED_CHAIN})
    calls = []
    original = chain.samplers[0].apply
    monkeypatch.setattr(chain.samplers[0], "apply", lambda c, x: calls.append(1) or original(c, x))
    chain.process(logits[:4], history=history[:4])
    assert calls == [1]
