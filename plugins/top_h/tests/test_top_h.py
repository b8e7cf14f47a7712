"""top_h.v1 against transformers' TopHLogitsWarper.

Equivalence level: probabilities within 1e-5. The oracle runs on float64 logits. Where logits tie at the cut (or
at the top_n boundary), which of the tied tokens survives is the partial sort's choice in both implementations,
so rows are compared as sorted value lists (the kept multiset of logits), which is tie-order independent.
Kept logits are bitwise the input logits, removed ones -inf.
"""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import TopHLogitsWarper, TopKLogitsWarper

from samplechain import Chain, ConfigError, RequestError
from samplechain.tools.testing import (
    assert_bitwise_no_op,
    assert_kept_logits_bitwise,
    assert_probs_close,
    assert_rows_equal_alone,
    processed_scores,
    random_logits,
    sampler_chain,
)

B = 6
ATOL = 1e-5


def logits_for(seed: int, vocab: int, scale: float = 2.0) -> torch.Tensor:
    return random_logits(seed, B, vocab, scale)


def chain(top_h: float = 0.0, min_keep: int = 1, before: list | None = None, **extra) -> Chain:
    return sampler_chain({"use": "top_h", "top_h": top_h, "min_keep": min_keep, **extra}, before=before)


def reference(logits: torch.Tensor, top_h: float) -> torch.Tensor:
    return TopHLogitsWarper(top_h)(None, logits.double())


def assert_close_to(ours: torch.Tensor, logits: torch.Tensor, ref: torch.Tensor) -> None:
    kept = assert_kept_logits_bitwise(ours, logits)
    assert_probs_close(ours, ref, ATOL, sort_rows=True)
    counts, ref_counts = kept.sum(dim=-1), torch.isfinite(ref).sum(dim=-1)
    assert int((counts - ref_counts).abs().max()) <= 1, f"{counts.tolist()} vs {ref_counts.tolist()}"


@pytest.mark.parametrize("vocab", (50, 1000, 32000))
@pytest.mark.parametrize("seed", (0, 1))
@pytest.mark.parametrize("top_h", (0.05, 0.2, 0.4, 0.7, 0.95, 0.99))
def test_matches_transformers_on_random_logits(vocab, seed, top_h):
    logits = logits_for(seed, vocab)
    assert_close_to(processed_scores(chain(top_h), logits, process=True), logits, reference(logits, top_h))


@pytest.mark.parametrize("scale", (0.3, 5.0))
def test_flat_and_peaked_rows_match_transformers(scale):
    logits = logits_for(8, 5000, scale)
    for top_h in (0.3, 0.8):
        assert_close_to(processed_scores(chain(top_h), logits, process=True), logits, reference(logits, top_h))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("top_h", (0.3, 0.9))
def test_half_precision_input_with_ties_matches_transformers(dtype, top_h):
    logits = logits_for(5, 4000).to(dtype)
    up = logits.double()
    top = up.topk(100, dim=-1).values
    assert bool((top[:, 1:] == top[:, :-1]).any()), "the test needs ties among the top 100"
    assert_close_to(processed_scores(chain(top_h), logits, process=True), up, reference(up, top_h))


def test_minus_inf_entries_are_never_kept():
    logits = logits_for(6, 1000)
    logits[:, 1::3] = float("-inf")
    logits[0, 60:] = float("-inf")  # fewer than top_n finite candidates in row 0
    ours = processed_scores(chain(0.9), logits, process=True)
    assert not bool(torch.isfinite(ours[:, 1::3]).any())
    assert_close_to(ours, logits, reference(logits, 0.9))


def test_after_top_k_matches_transformers_pipeline():
    logits = logits_for(12, 5000)
    ours = processed_scores(chain(0.5, before=[{"use": "top_k", "k": 40}]), logits, process=True)
    after_k = TopKLogitsWarper(40)(None, logits.clone())
    assert_close_to(ours, after_k, reference(after_k, 0.5))


def test_only_top_n_candidates_survive_and_min_keep_holds():
    logits = logits_for(2, 1000, 0.01)  # flat: top_h = 1 keeps the whole top_n (up to the last one's rounding)
    counts = torch.isfinite(processed_scores(chain(1.0, top_n=10), logits, process=True)).sum(dim=-1)
    assert bool(((counts >= 9) & (counts <= 10)).all())
    counts = torch.isfinite(processed_scores(chain(0.01, 7), logits_for(2, 1000), process=True)).sum(dim=-1)
    assert bool((counts >= 7).all())
    counts = torch.isfinite(processed_scores(chain(0.01, 150), logits_for(2, 1000), process=True)).sum(dim=-1)
    assert bool((counts == 150).all()), "min_keep beyond top_n keeps the min_keep most likely"


def test_top_token_always_survives():
    logits = logits_for(4, 1000, 8.0)
    ours = processed_scores(chain(1e-6, 0), logits, process=True)
    assert torch.equal(ours.argmax(dim=-1), logits.argmax(dim=-1))
    assert bool((torch.isfinite(ours).sum(dim=-1) >= 1).all())


def test_per_row_params_equal_rows_alone():
    rows = [
        {"top_h": 0.0},
        {"top_h": 0.3},
        {"top_h": 0.6, "min_keep": 7},
        {"top_h": 1.0},
        {"top_h": 0.0, "min_keep": 9},
    ]
    logits = logits_for(7, 3000)
    c = chain()
    rows.append({"top_h": 0.1, f"{c.layout.entries[0].id}.top_n": 20})  # per-row top_n by its qualified key
    batch = assert_rows_equal_alone(c, logits, rows, process=True)
    for i, params in enumerate(rows):
        if params["top_h"] <= 0.0:
            assert torch.equal(batch[i], logits[i])
        elif i < 5:
            ref = reference(logits[i : i + 1], params["top_h"])
            if "min_keep" not in params:
                assert_close_to(batch[i : i + 1], logits[i : i + 1], ref)
        else:
            assert int(torch.isfinite(batch[i]).sum()) <= 20


@pytest.mark.parametrize("vocab", (50, 32000))
def test_zero_is_a_bitwise_no_op(vocab):
    logits = logits_for(9, vocab)
    assert_bitwise_no_op(chain(0.0, 5), logits, process=True)
    out = chain(0.0).sample(logits, return_scores=True)
    assert torch.equal(out.scores, logits)


@pytest.mark.parametrize(
    ("key", "value"),
    [("top_h", 1.5), ("top_h", -0.1), ("top_h", float("nan")), ("top_n", 0), ("min_keep", -1)],
)
def test_bad_values_are_refused(key, value):
    entry = {"use": "top_h", "top_h": 0.4, key: value}
    with pytest.raises(ConfigError, match=key):
        Chain.load({"samplers": [entry, {"use": "dist"}]})


def test_bad_request_value_is_refused():
    store = chain(0.4).new_store()
    with pytest.raises(RequestError, match="top_h"):
        store.add("r", {"top_h": 2.0})


def test_chain_with_dist_samples_a_kept_token():
    c = Chain.load({"samplers": [{"use": "top_h", "top_h": 0.4}, {"use": "dist"}]})
    out = c.sample(logits_for(0, 1000), return_scores=True)
    assert bool(torch.isfinite(out.scores.gather(1, out.token_ids[:, None])).all())


def test_top_h_one_keeps_the_top_n_up_to_the_last_ones_rounding():
    """top_h = 1 puts tau exactly on the total entropy of the top_n: whether the last of them is kept is float
    rounding (sum vs running sum) in both implementations; everything else of the top_n is kept."""
    logits = logits_for(0, 1000)
    for ours in (processed_scores(chain(1.0), logits, process=True), reference(logits, 1.0)):
        counts = torch.isfinite(ours).sum(dim=-1)
        assert bool(((counts >= 99) & (counts <= 100)).all())
